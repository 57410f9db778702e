#!/usr/bin/env python
"""Details of paper 003's Table 1 runs that the investigations quote, read from the long
CSV that ``paper003_table1.py`` wrote (nothing runs):

* uploads: per method, the number of aggregated updates per round (summed over the
  models), its mean and its variance over rounds 1..R (population variance per seed),
  both averaged over the seeds;
* late falls: per method and seed, the mean accuracy over the models at the rounds of
  ``--at``, and the fall from the best of rounds ``--late-from``..end to the last round
  (a run that degrades late shows a large fall);
* dips: per method and seed, the lowest mean accuracy after round ``--rounds`` (and its
  round), and how many of those rounds lie at least ``--dip`` below the best round so far
  (a run that falls and recovers shows dips but no fall).

    python benchmarks/table1_details.py                      # docs/results/paper003_table1.csv
    python benchmarks/table1_details.py --methods stalevre,scaffold --at 100,120,150
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict

import _evidence as E


def main(argv: list[str] | None = None) -> int:
    p = E.Parser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--csv",
        default=str(E.REPO / "docs" / "results" / "paper003_table1.csv"),
        help="the long CSV of paper003_table1.py (default: the published one)",
    )
    p.add_argument("--methods", default="", help="methods to show (default: every one)")
    p.add_argument(
        "--rounds",
        type=int,
        default=40,
        help="uploads over rounds 1..R, and low and dips over rounds R+1 to "
        "the last (default 40; none when R is the last round)",
    )
    p.add_argument("--at", default="40,80,120,150", help="rounds of the accuracy columns")
    p.add_argument(
        "--late-from",
        type=int,
        default=100,
        help="the fall is measured from the best round from here on (default 100)",
    )
    p.add_argument(
        "--dip",
        type=float,
        default=0.1,
        help="a dip is a round at least this far below the best so far (default 0.1)",
    )
    a = p.parse_args(argv)
    try:
        with open(a.csv, newline="") as f:
            rows = list(csv.DictReader(f))
        acc: dict[tuple[str, int], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        ups: dict[tuple[str, int], dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for r in rows:
            key, rd = (r["method"], int(r["seed"])), int(r["round"])
            acc[key][rd].append(float(r["accuracy"]))
            ups[key][rd] += float(r["uploads"] or 0)
    except (OSError, KeyError, ValueError, csv.Error) as err:
        p.error(f"--csv {a.csv}: not a long CSV of paper003_table1.py ({err})")
    if not rows:
        p.error(f"--csv {a.csv}: holds no run")
    gaps = [
        f"{m} seed {sd}" for (m, sd), by in acc.items() if sorted(by) != list(range(max(by) + 1))
    ]
    if gaps:
        p.error(
            f"--csv {a.csv}: rounds missing in {', '.join(sorted(gaps)[:3])}"
            f"{' ...' if len(gaps) > 3 else ''} (every run needs rounds 0 to its last)"
        )
    known = sorted({m for m, _ in acc})
    methods = E.name_list(p, "--methods", a.methods, known) if a.methods else known
    at = E.int_list(p, "--at", a.at, low=1)
    last = min(max(acc[k]) for k in acc)
    if a.rounds < 1 or a.rounds > last:
        p.error(f"--rounds must be in [1, {last}] (the runs' length), got {a.rounds}")
    if max(at) > last or not 0 <= a.late_from <= last:
        p.error(f"--at and --late-from must be rounds of the runs (at most {last})")
    if not 0 < a.dip < 1:
        p.error(f"--dip must be in (0, 1), got {a.dip}")

    def mean_acc(key: tuple[str, int], rd: int) -> float:
        return statistics.fmean(acc[key][rd])

    print(f"{a.csv}: {len(acc)} runs, {last} rounds")
    print(
        f"\nuploads per round (summed over the models), rounds 1-{a.rounds}, "
        "mean over seeds of each seed's mean and population variance:"
    )
    for m in methods:
        seeds = sorted(s for mm, s in acc if mm == m)
        per = [[ups[(m, s)][rd] for rd in range(1, a.rounds + 1)] for s in seeds]
        print(
            f"  {m:14s} mean {statistics.fmean(statistics.fmean(v) for v in per):7.2f}  "
            f"variance {statistics.fmean(statistics.pvariance(v) for v in per):7.2f}  "
            f"({len(seeds)} seeds)"
        )
    print(
        f"\nmean accuracy over the models at rounds {', '.join(map(str, at))}; fall = best "
        f"of rounds {a.late_from}-{last} minus round {last}"
        + (
            f"; low = the lowest of rounds {a.rounds + 1}-{last} (its round); dips = how "
            f"many of those rounds lie at least {a.dip:g} below the best round so far"
            if a.rounds < last
            else ""
        )
        + ":"
    )
    for m in methods:
        for s in sorted(s for mm, s in acc if mm == m):
            key = (m, s)
            best = max(mean_acc(key, rd) for rd in range(a.late_from, last + 1))
            cols = "  ".join(f"{mean_acc(key, rd):.3f}" for rd in at)
            line = f"  {m:14s} seed {s}: {cols}  fall {best - mean_acc(key, last):+.3f}"
            if a.rounds < last:
                so_far = max(mean_acc(key, rd) for rd in range(0, a.rounds + 1))
                low, low_rd, dips = 2.0, 0, 0
                for rd in range(a.rounds + 1, last + 1):
                    v = mean_acc(key, rd)
                    so_far = max(so_far, v)
                    dips += so_far - v >= a.dip * (1 - 1e-9)  # 0.6 - 0.5 is a dip of 0.1
                    if v < low:
                        low, low_rd = v, rd
                line += f"  low {low:.3f} (round {low_rd})  dips {dips}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
