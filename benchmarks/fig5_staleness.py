"""Paper 003, Fig. 5: dynamic (StaleVR) vs static (FedStale, FedVARP) staleness
weights under a fixed client sampling distribution.

One task (the embedded digits CNN), clients split into two groups with
participation rates 4% and 16%, the same fixed sampling for every method:

- StaleVR: every client trains every round (the optimal beta of Eq. 20 needs
  the fresh update), the fixed rates decide which updates are aggregated, stale
  updates weighted by the per-pair optimal beta;
- FedStale with beta in {0.6, 0.7, 0.8, 0.9} and FedVARP (beta = 1): only the
  sampled clients train, Eq. 17.

    python benchmarks/fig5_staleness.py --seeds 0,1,2 --num-rounds 100

Prints the final accuracy per method (mean +- sd over seeds) and the mean over
the last 10 rounds; ``--json`` / ``--markdown`` write them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

from _evidence import Parser, at_least_one, int_list, mean_sd, run_jobs, write_outputs

GROUPS = ((0.5, 0.04), (0.5, 0.16))


def method_strategy(method: str, seed: int, base: dict[str, Any]):  # type: ignore[no-untyped-def]
    from mmfl_flwr.core import FixedRates
    from mmfl_flwr.core.stale import FedStaleAggregator, FedVARPAggregator
    from mmfl_flwr.core.stalevr import StaleVRAggregator
    from mmfl_flwr.strategy import MultiModelStrategy

    kw = dict(
        local_epochs=base["local_epochs"], lr=base["lr"], batch_size=base["batch_size"], seed=seed
    )
    if method == "stalevr":
        return MultiModelStrategy(FixedRates(GROUPS, train_all=True), StaleVRAggregator(), **kw)
    if method == "fedvarp":
        return MultiModelStrategy(FixedRates(GROUPS), FedVARPAggregator(), **kw)
    if method.startswith("fedstale-"):
        beta = float(method.split("-", 1)[1])
        return MultiModelStrategy(FixedRates(GROUPS), FedStaleAggregator(beta), **kw)
    raise ValueError(method)


def _one(args: tuple[str, int, dict[str, Any]]) -> dict[str, Any]:
    method, seed, base = args
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run_inprocess

    s = Settings(
        tasks="digits",
        strategy="random",
        seed=seed,
        output_dir="",
        num_clients=base["num_clients"],
        num_rounds=base["num_rounds"],
        local_epochs=base["local_epochs"],
        lr=base["lr"],
        batch_size=base["batch_size"],
    )
    t0 = time.monotonic()
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        result = run_inprocess(s, method_strategy(method, seed, base))
    hist = [r for r in result.history if r["round"] > 0]
    last = max(r["round"] for r in hist)
    return {
        "method": method,
        "seed": seed,
        "final_accuracy": float(hist[-1]["accuracy"]),
        "last10": statistics.fmean(float(r["accuracy"]) for r in hist if r["round"] > last - 10),
        "uploads_per_round": statistics.fmean(int(r["uploads"]) for r in hist),
        "seconds": time.monotonic() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--methods", default="stalevr,fedstale-0.6,fedstale-0.7,fedstale-0.8,fedstale-0.9,fedvarp"
    )
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--num-clients", type=int, default=120)
    p.add_argument("--num-rounds", type=int, default=100)
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", default="")
    p.add_argument("--markdown", default="")
    a = p.parse_args(argv)
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    seeds = int_list(p, "--seeds", a.seeds, low=0)
    at_least_one(p, a, "num_clients", "num_rounds", "local_epochs", "batch_size", "workers")
    base = {
        "num_clients": a.num_clients,
        "num_rounds": a.num_rounds,
        "local_epochs": a.local_epochs,
        "lr": a.lr,
        "batch_size": a.batch_size,
    }
    jobs = [(m, sd, base) for sd in seeds for m in methods]
    print(f"{len(jobs)} runs, groups {GROUPS}, {base}", flush=True)
    t0 = time.monotonic()
    runs = run_jobs(
        _one,
        jobs,
        a.workers,
        lambda r: (
            f"{r['method']:<14} seed {r['seed']}: final {r['final_accuracy']:.4f} "
            f"last-10 mean {r['last10']:.4f} uploads/round {r['uploads_per_round']:.1f} "
            f"{r['seconds']:.0f}s"
        ),
    )
    lines = [
        "| method | final accuracy (± sd over seeds) | mean accuracy, last 10 rounds |",
        "|---|---|---|",
    ]
    summary = []
    for m in methods:
        fin = [r["final_accuracy"] for r in runs if r["method"] == m]
        l10 = [r["last10"] for r in runs if r["method"] == m]
        final, sd = mean_sd(fin)
        summary.append({"method": m, "final": final, "sd": sd, "last10": statistics.fmean(l10)})
        lines.append(f"| {m} | {final:.3f} ± {sd:.3f} | {statistics.fmean(l10):.3f} |")
    table = "\n".join(lines)
    print("\n" + table + f"\n\n{len(runs)} runs in {time.monotonic() - t0:.0f}s")
    write_outputs(
        a.json,
        a.markdown,
        {"settings": base, "groups": GROUPS, "runs": runs, "summary": summary},
        table,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
