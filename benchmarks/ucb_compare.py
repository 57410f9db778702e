"""Paper 004's comparison: Multi-FedAvg, Ranklist-Multi-UCB, Pareto-Multi-UCB and
single-model FedAvg, on Synthetic(1,1) and Synthetic-IID, with few and many
clients per round.

Two models per dataset, as in the paper: logistic regression on 60-dim/5-class
and 30-dim/10-class data (task kinds ``synthetic`` + ``synthetic-b``, and
``synthetic-iid`` + ``synthetic-iid-b``). The multi-model policies select ``K``
clients per round in total; the single-model baseline trains each model in its
own run with ``K / 2`` clients per round (FedAvg = Multi-FedAvg with one model),
from the same data and initial weights.

    python benchmarks/ucb_compare.py --seeds 0,1,2 --ks 2,64 --num-rounds 150

Prints the final mean accuracy over the two models (mean +- sd over seeds) per
dataset, K and policy; ``--json`` / ``--markdown`` write them.
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

DATASETS = {
    "synthetic-1-1": "synthetic,synthetic-b",
    "synthetic-iid": "synthetic-iid,synthetic-iid-b",
}
POLICIES = ("multi-fedavg", "ranklist-ucb", "pareto-ucb", "fedavg-single")


def _run(tasks: str, strategy: str, k: int, seed: int, base: dict[str, Any]) -> dict[str, float]:
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run

    s = Settings(
        tasks=tasks, strategy=strategy, clients_per_round=k, seed=seed, output_dir="", **base
    )
    with contextlib.redirect_stdout(io.StringIO()):
        result = run(s, engine="inprocess")
    return {t: float(r["accuracy"]) for t, r in result.final().items()}


def _one(args: tuple[str, str, int, int, dict[str, Any]]) -> dict[str, Any]:
    dataset, policy, k, seed, base = args
    tasks = DATASETS[dataset]
    t0 = time.monotonic()
    if policy == "fedavg-single":
        accs: dict[str, float] = {}
        for task in tasks.split(","):
            accs.update(_run(task, "multi-fedavg", max(1, k // 2), seed, base))
    else:
        accs = _run(tasks, policy, k, seed, base)
    return {
        "dataset": dataset,
        "policy": policy,
        "k": k,
        "seed": seed,
        "final_accuracy": accs,
        "mean_final_accuracy": statistics.fmean(accs.values()),
        "seconds": time.monotonic() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--ks", default="2,64")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--num-clients", type=int, default=200)
    p.add_argument("--num-rounds", type=int, default=150)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--ucb-gamma", type=float, default=0.9)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", default="")
    p.add_argument("--markdown", default="")
    a = p.parse_args(argv)
    datasets = [d for d in a.datasets.split(",") if d]
    policies = [x for x in a.policies.split(",") if x]
    ks = int_list(p, "--ks", a.ks, low=1)
    seeds = int_list(p, "--seeds", a.seeds, low=0)
    at_least_one(p, a, "num_clients", "num_rounds", "local_epochs", "batch_size", "workers")
    base = {
        "num_clients": a.num_clients,
        "num_rounds": a.num_rounds,
        "local_epochs": a.local_epochs,
        "lr": a.lr,
        "batch_size": a.batch_size,
        "ucb_gamma": a.ucb_gamma,
    }
    jobs = [(d, pol, k, sd, base) for d in datasets for k in ks for sd in seeds for pol in policies]
    print(f"{len(jobs)} runs: {base}", flush=True)
    t0 = time.monotonic()
    runs = run_jobs(
        _one,
        jobs,
        a.workers,
        lambda r: (
            f"{r['dataset']:<15} K={r['k']:<3} {r['policy']:<14} seed {r['seed']}: "
            f"{r['mean_final_accuracy']:.4f} {r['seconds']:.0f}s"
        ),
    )
    lines = ["| dataset | K | " + " | ".join(policies) + " |", "|---|---|" + "---|" * len(policies)]
    summary = []
    for d in datasets:
        for k in ks:
            cells = []
            for pol in policies:
                v = [
                    r["mean_final_accuracy"]
                    for r in runs
                    if r["dataset"] == d and r["k"] == k and r["policy"] == pol
                ]
                m, sd = mean_sd(v)
                summary.append({"dataset": d, "k": k, "policy": pol, "mean": m, "sd": sd})
                cells.append(f"{m:.3f} ± {sd:.3f}")
            lines.append(f"| {d} | {k} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print("\n" + table + f"\n\n{len(runs)} runs in {time.monotonic() - t0:.0f}s")
    write_outputs(a.json, a.markdown, {"settings": base, "runs": runs, "summary": summary}, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
