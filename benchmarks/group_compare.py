"""Papers 000/001's experiments: MMFL-Group Sampling against its two baselines.

Baselines (same participation rate, 1/6): *random allocation* (each round 1/6 of
the clients online in that round, a random model each) and *round-robin
with random groups* (MMFL-Group's T-step over 5 random groups, no clustering).
Data: ``digits`` models with 5 ground-truth label clusters per model (20% of the
labels each), 30 clients.

Scenarios:
  consistent    3 models, one client->cluster map for all models, C-step
  inconsistent  3 models, an independent map per model, modified C-step
  clients       consistent data, 24 static clients + 36 arriving (exponential
                inter-arrival times, rate 0.1 per round, as in the papers)
  tasks         consistent data, 3 models at round 0, one more at round 30 and
                one at round 60

    python benchmarks/group_compare.py --seeds 0,1,2

Prints the final mean accuracy over the models (mean +- sd over seeds).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
from typing import Any

from _evidence import Parser, at_least_one, int_list, mean_sd, run_jobs, write_outputs

SCENARIOS: dict[str, dict[str, Any]] = {
    "consistent": {
        "tasks": "digits,digits,digits",
        "profile": "clusters-consistent",
        "num_clients": 30,
        "variant": "consistent",
    },
    "inconsistent": {
        "tasks": "digits,digits,digits",
        "profile": "clusters-inconsistent",
        "num_clients": 30,
        "variant": "modified",
    },
    "clients": {
        "tasks": "digits,digits,digits",
        "profile": "clusters-consistent",
        "num_clients": 60,
        "variant": "consistent",
        "client_arrivals": "exponential:static=24,rate=0.1",
    },
    "tasks": {
        "tasks": "digits,digits,digits,digits,digits",
        "profile": "clusters-consistent",
        "num_clients": 30,
        "variant": "consistent",
        "task_arrivals": "digits_4:30,digits_5:60",
    },
}
METHODS = ("group", "rr-random-groups", "random")


def random_allocation(fraction: float) -> Any:
    """The papers' random allocation: each round ``fraction`` of the clients online
    *then* (at least one), each with a uniformly random model (Multi-FedAvg with a
    per-round count, so that late arrivals do not hand it more trainers than the
    grouping policies get before they arrive)."""
    from mmfl_flwr.core import MultiFedAvg

    class RandomAllocation(MultiFedAvg):
        name = "random-allocation"

        def assign(self, table, tasks, server_round, rng):  # type: ignore[no-untyped-def]
            self.clients_per_round = max(1, round(fraction * len(table.ids())))
            return super().assign(table, tasks, server_round, rng)

    return RandomAllocation(None)


def _one(args: tuple[str, str, int, dict[str, Any]]) -> dict[str, Any]:
    scenario, method, seed, base = args
    from mmfl_flwr.config import Settings
    from mmfl_flwr.core.aggregators import MeanAggregator
    from mmfl_flwr.core.group import GroupSampling
    from mmfl_flwr.runner import run_inprocess
    from mmfl_flwr.strategy import MultiModelStrategy

    sc = dict(SCENARIOS[scenario])
    variant = sc.pop("variant")
    s = Settings(
        strategy="group",
        seed=seed,
        output_dir="",
        num_rounds=base["num_rounds"],
        local_epochs=base["local_epochs"],
        lr=base["lr"],
        batch_size=base["batch_size"],
        **sc,
    )
    kw: dict[str, Any] = dict(
        local_epochs=s.local_epochs, lr=s.lr, batch_size=s.batch_size, seed=seed
    )
    if s.client_arrivals:
        kw["client_arrivals"] = s.client_arrival_rounds()
    if s.task_arrivals:
        kw["task_arrivals"] = s.task_arrival_rounds()
    if method == "group":
        policy = GroupSampling(1 / 6, variant, seed=seed)
    elif method == "rr-random-groups":
        policy = GroupSampling(1 / 6, "consistent", seed=seed, grouping="random", random_groups=5)
    else:
        policy = random_allocation(1 / 6)
    strategy = MultiModelStrategy(policy, MeanAggregator(), **kw)
    t0 = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        result = run_inprocess(s, strategy)
    final = {t: float(r["accuracy"]) for t, r in result.final().items()}
    return {
        "scenario": scenario,
        "method": method,
        "seed": seed,
        "final_accuracy": final,
        "mean_final_accuracy": statistics.fmean(final.values()),
        "seconds": time.monotonic() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--num-rounds", type=int, default=90)
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", default="")
    p.add_argument("--markdown", default="")
    a = p.parse_args(argv)
    scenarios = [x for x in a.scenarios.split(",") if x]
    methods = [x for x in a.methods.split(",") if x]
    seeds = int_list(p, "--seeds", a.seeds, low=0)
    at_least_one(p, a, "num_rounds", "local_epochs", "batch_size", "workers")
    base = {
        "num_rounds": a.num_rounds,
        "local_epochs": a.local_epochs,
        "lr": a.lr,
        "batch_size": a.batch_size,
    }
    jobs = [(sc, m, sd, base) for sc in scenarios for sd in seeds for m in methods]
    print(f"{len(jobs)} runs: {base}", flush=True)
    t0 = time.monotonic()
    runs = run_jobs(
        _one,
        jobs,
        a.workers,
        lambda r: (
            f"{r['scenario']:<13} {r['method']:<17} seed {r['seed']}: "
            f"{r['mean_final_accuracy']:.4f} {r['seconds']:.0f}s"
        ),
    )
    lines = ["| scenario | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    summary = []
    for sc in scenarios:
        cells = []
        for m in methods:
            v = [r["mean_final_accuracy"] for r in runs if r["scenario"] == sc and r["method"] == m]
            mean, sd = mean_sd(v)
            summary.append({"scenario": sc, "method": m, "mean": mean, "sd": sd})
            cells.append(f"{mean:.3f} ± {sd:.3f}")
        lines.append(f"| {sc} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print("\n" + table + f"\n\n{len(runs)} runs in {time.monotonic() - t0:.0f}s")
    write_outputs(a.json, a.markdown, {"settings": base, "runs": runs, "summary": summary}, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
