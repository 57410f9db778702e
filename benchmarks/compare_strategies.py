"""Compare MMFL strategies over several seeds, relative to full participation.

Runs every (strategy, seed) on the in-process engine (the same Strategy and
ClientApp code as Flower's simulation engine, which gives identical metrics for
the same seed; see bench_engines.py), in parallel worker processes, and prints
the final mean accuracy over the models per strategy: mean +- standard deviation
across seeds, and relative to full participation (per seed, then averaged).

Paper 003's setting at a size that runs here (issue 3):

    python benchmarks/compare_strategies.py --strategies random,gvr,lvr,full \\
        --profile paper003 --num-clients 120 --seeds 0,1,2 --num-rounds 40

Writes ``--json`` (all numbers) and ``--markdown`` (the table) when given.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

from _evidence import Parser, at_least_one, int_list, mean_sd, run_jobs, write_outputs


def _one(args: tuple[str, int, dict[str, Any]]) -> dict[str, Any]:
    strategy, seed, base = args
    from mmfl_flwr.config import Settings
    from mmfl_flwr.presets import presets_taking
    from mmfl_flwr.runner import run

    # the budget applies to the budgeted presets only (others refuse the setting)
    mine = {
        k: v for k, v in base.items() if k != "budget_fraction" or strategy in presets_taking(k)
    }
    s = Settings(**{**mine, "strategy": strategy, "seed": seed, "output_dir": ""})
    t0 = time.monotonic()
    result = run(s, engine="inprocess")
    final = result.final()
    accs = {t: float(r["accuracy"]) for t, r in final.items()}
    last = max(r["round"] for r in result.history)
    tail = [r for r in result.history if r["round"] > last - 5]
    tail_mean = statistics.fmean(float(r["accuracy"]) for r in tail)
    uploads = [int(r["uploads"]) for r in result.history if r["round"] > 0]
    return {
        "strategy": strategy,
        "seed": seed,
        "final_accuracy": accs,
        "mean_final_accuracy": statistics.fmean(accs.values()),
        "mean_accuracy_last5": tail_mean,
        "uploads_per_round": sum(uploads) / max(1, last),
        "seconds": time.monotonic() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategies", default="random,gvr,lvr,full")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--tasks", default="digits,synthetic,digits")
    p.add_argument("--profile", default="paper003")
    p.add_argument("--num-clients", type=int, default=120)
    p.add_argument("--num-rounds", type=int, default=40)
    p.add_argument("--budget-fraction", type=float, default=0.1)
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", default="")
    p.add_argument("--markdown", default="")
    a = p.parse_args(argv)

    strategies = [s.strip() for s in a.strategies.split(",") if s.strip()]
    seeds = int_list(p, "--seeds", a.seeds, low=0)
    at_least_one(p, a, "num_clients", "num_rounds", "local_epochs", "batch_size", "workers")
    base = {
        "tasks": a.tasks,
        "profile": a.profile,
        "num_clients": a.num_clients,
        "num_rounds": a.num_rounds,
        "budget_fraction": a.budget_fraction,
        "local_epochs": a.local_epochs,
        "lr": a.lr,
        "batch_size": a.batch_size,
    }
    jobs = [(st, sd, base) for sd in seeds for st in strategies]
    print(
        f"{len(jobs)} runs ({', '.join(strategies)} x seeds {seeds}) on {a.workers} "
        f"worker(s): {base}",
        flush=True,
    )
    t0 = time.monotonic()
    runs = run_jobs(
        _one,
        jobs,
        a.workers,
        lambda r: (
            f"{r['strategy']:<12} seed {r['seed']}: mean final acc "
            f"{r['mean_final_accuracy']:.4f} "
            f"({', '.join(f'{k}={v:.3f}' for k, v in r['final_accuracy'].items())}) "
            f"uploads/round {r['uploads_per_round']:.1f}  {r['seconds']:.0f}s"
        ),
    )

    by = {(r["strategy"], r["seed"]): r for r in runs}
    ref = "full" if "full" in strategies else None
    rows = []
    for st in strategies:
        vals = [by[(st, sd)]["mean_final_accuracy"] for sd in seeds]
        rel = (
            [
                by[(st, sd)]["mean_final_accuracy"] / by[(ref, sd)]["mean_final_accuracy"]
                for sd in seeds
            ]
            if ref
            else []
        )
        mean, std = mean_sd(vals)
        rel_mean, rel_std = mean_sd(rel) if rel else (None, 0.0)
        rows.append(
            {
                "strategy": st,
                "mean": mean,
                "std": std,
                "relative": rel_mean,
                "relative_std": rel_std,
                "uploads_per_round": statistics.fmean(
                    by[(st, sd)]["uploads_per_round"] for sd in seeds
                ),
                "last5": statistics.fmean(by[(st, sd)]["mean_accuracy_last5"] for sd in seeds),
            }
        )
    lines = [
        "| strategy | final mean accuracy (± sd over seeds) | relative to full "
        "| mean acc., last 5 rounds | uploads / round |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        rel = f"{r['relative']:.3f} ± {r['relative_std']:.3f}" if r["relative"] is not None else "–"
        lines.append(
            f"| {r['strategy']} | {r['mean']:.3f} ± {r['std']:.3f} | {rel} | "
            f"{r['last5']:.3f} | {r['uploads_per_round']:.1f} |"
        )
    table = "\n".join(lines)
    print()
    print(table)
    print(f"\n{len(runs)} runs in {time.monotonic() - t0:.0f}s")
    write_outputs(
        a.json, a.markdown, {"settings": base, "seeds": seeds, "runs": runs, "summary": rows}, table
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
