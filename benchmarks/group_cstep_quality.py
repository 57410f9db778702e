"""How well MMFL-Group's C-step recovers the planted label clusters (papers 000/001).

Runs MMFL-Group Sampling on scenarios of ``paper001_group.py`` and, at every C-step,
compares the clustering with the planted one: the number of clusters ``k`` the
silhouette chose (5 planted) and the adjusted Rand index (scikit-learn's
``adjusted_rand_score``; 1 = the planted clusters exactly, about 0 = chance). The
planted cluster of a client is read from its data (the set of labels it holds for the
model the C-step clusters on), not from the generator, so a wrong map would show.

    python benchmarks/group_cstep_quality.py                       # (a) and (c'), 3 seeds
    python benchmarks/group_cstep_quality.py --scenarios consistent,clients --seeds 0,1

Writes ``group_cstep_quality.csv`` (one row per C-step) into ``--out`` and prints, per
scenario and phase of training, the mean ``k``, the share of C-steps with ``k = 5`` and
the mean adjusted Rand index.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import _evidence as E
import paper001_group as P


def planted_clusters(settings: Any, task: str) -> dict[str, int]:
    """Client id -> index of the label set it holds for ``task`` (its planted cluster)."""
    from mmfl_flwr.flower_app.data import federation_for

    fed = federation_for(settings)
    sets: dict[tuple[int, ...], int] = {}
    out = {}
    for i, (train, _) in enumerate(fed.data[task]):
        labels = tuple(sorted({int(y) for y in train.y}))
        out[str(i)] = sets.setdefault(labels, len(sets))
    return out


def one(job: tuple[str, int, int]) -> list[dict[str, Any]]:
    """One MMFL-Group run; a row per C-step."""
    scenario, seed, num_rounds = job
    from sklearn.metrics import adjusted_rand_score

    s, strategy, policy = P.build(scenario, "group", seed, num_rounds)
    P.quiet_run(s, strategy, "inprocess")
    planted: dict[str, dict[str, int]] = {}  # per clustered task
    rows = []
    for c in policy.cluster_steps():
        task = c["cluster_task"] or c["tasks"][0]
        if task not in planted:
            planted[task] = planted_clusters(s, task)
        truth = [planted[task][cid] for cid in c["clients"]]
        rows.append(
            {
                "scenario": scenario,
                "seed": seed,
                "round": c["round"],
                "clients": len(c["clients"]),
                "k": c["k"],
                "ari": float(adjusted_rand_score(truth, c["labels"])),
                "largest_group": max(c["labels"].count(g) for g in set(c["labels"])),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = E.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", default="consistent,clients-static")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--num-rounds", type=int, default=90)
    p.add_argument("--out", default=str(E.REPO / "docs" / "results"))
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--cache", default="", help="JSON-lines file of finished runs (resume)")
    a = p.parse_args(argv)
    scenarios = E.name_list(p, "--scenarios", a.scenarios, P.LABELS)
    seeds = E.int_list(p, "--seeds", a.seeds, low=0)
    if a.num_rounds < 1:
        p.error("--num-rounds must be >= 1")
    if a.workers < 1:
        p.error("--workers must be >= 1")
    jobs = [(sc, sd, a.num_rounds) for sd in seeds for sc in scenarios]
    E.check_cache(a.cache, jobs)
    results = E.map_cached(one, jobs, a.workers, a.cache, label=lambda j: f"{j[0]} seed {j[1]}")
    rows = [r for rs in results for r in rs]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "group_cstep_quality.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    third = max(a.num_rounds // 3, 1)
    print(
        f"{'scenario':<20} {'rounds':<9} {'C-steps':>7} {'mean k':>7} {'k = 5':>6} {'mean ARI':>9}"
    )
    for sc in scenarios:
        for lo, hi in ((1, third), (third + 1, a.num_rounds)):
            sub = [r for r in rows if r["scenario"] == sc and lo <= r["round"] <= hi]
            if not sub:
                continue
            print(
                f"{sc:<20} {lo:>3}-{hi:<5} {len(sub):>7} "
                f"{statistics.fmean(r['k'] for r in sub):>7.2f} "
                f"{sum(r['k'] == 5 for r in sub) / len(sub):>6.0%} "
                f"{statistics.fmean(r['ari'] for r in sub):>9.3f}"
            )
    print(f"\nwrote {out / 'group_cstep_quality.csv'} ({len(rows)} C-steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
