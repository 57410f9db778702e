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

``--defences off`` (the default) runs MMFL-Group as the papers state it, every bound off
(the reproduction mode); ``--defences default`` runs it with the project's defences on, a
sensitivity run. Each CSV row records its run's mode as the paper scripts' run rows do
(the ``defences`` switch and the value of every bound, with the run's ``method`` and the
models' mean ``accuracy`` at the C-step), so ``benchmarks/check_reproduction.py`` reads
the file; the printed header names the mode. A ``--cache`` keys its runs by mode (as
``paper001_group.py``'s), so runs of the other mode are not taken from it.
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


def jobs_for(
    scenarios: list[str], seeds: list[int], num_rounds: int, defences: str
) -> list[tuple[Any, ...]]:
    """The jobs (and cache keys) of a run, seed by seed: (scenario, seed, rounds), plus
    ``{"defences": "off"}`` for the reproduction mode (the project's defaults keep the
    keys of earlier runs, as ``paper001_group.jobs_for`` does)."""
    extra: tuple[Any, ...] = ({"defences": defences},) if defences != "default" else ()
    return [(sc, sd, num_rounds, *extra) for sd in seeds for sc in scenarios]


def mean_accuracy(history: list[dict[str, Any]]) -> dict[int, float]:
    """Round -> the mean accuracy over the models evaluated in that round."""
    per: dict[int, list[float]] = {}
    for r in history:
        if r.get("accuracy") not in ("", None):
            per.setdefault(int(r["round"]), []).append(float(r["accuracy"]))
    return {rd: statistics.fmean(v) for rd, v in per.items()}


def one(job: tuple[Any, ...]) -> list[dict[str, Any]]:
    """One MMFL-Group run (:func:`jobs_for`); a row per C-step, with the run's recorded
    settings (``_evidence.applied_settings``: its mode and the bounds it applied) and
    ``accuracy``: the models' mean accuracy in the round before the C-step's (the models
    whose updates it clustered)."""
    opts = job[-1] if isinstance(job[-1], dict) else {}
    scenario, seed, num_rounds = job[:3]
    defences = opts.get("defences", "default")
    from sklearn.metrics import adjusted_rand_score

    limits = E.bound_kwargs(defences) if defences != "default" else None
    s, strategy, policy = P.build(scenario, "group", seed, num_rounds, limits=limits)
    applied = E.applied_settings(strategy, defences)
    result = P.quiet_run(s, strategy, "inprocess")
    accuracy = mean_accuracy(list(result.history))
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
                "method": "group",
                "seed": seed,
                "round": c["round"],
                "clients": len(c["clients"]),
                "k": c["k"],
                "ari": float(adjusted_rand_score(truth, c["labels"])),
                "largest_group": max(c["labels"].count(g) for g in set(c["labels"])),
                "accuracy": accuracy.get(c["round"] - 1, ""),
                **applied,
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
    E.defences_arg(p)
    a = p.parse_args(argv)
    scenarios = E.name_list(p, "--scenarios", a.scenarios, P.LABELS)
    seeds = E.int_list(p, "--seeds", a.seeds, low=0)
    if a.num_rounds < 1:
        p.error("--num-rounds must be >= 1")
    if a.workers < 1:
        p.error("--workers must be >= 1")
    jobs = jobs_for(scenarios, seeds, a.num_rounds, a.defences)
    E.check_cache(a.cache, jobs)
    results = E.map_cached(one, jobs, a.workers, a.cache, label=lambda j: f"{j[0]} seed {j[1]}")
    rows = [r for rs in results for r in rs]
    status = E.defences_of(rows)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "group_cstep_quality.csv", "w", newline="") as f:
        # every row's columns: rows of a cache made before runs recorded their mode lack some
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    third = max(a.num_rounds // 3, 1)
    print(f"MMFL-Group's C-steps{E.defences_heading(status)}. {E.defences_text(status)}")
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
