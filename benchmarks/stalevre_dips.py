#!/usr/bin/env python
"""What StaleVRE's step is made of in the rounds where its accuracy dips (paper 003,
Eq. 18 with Eq. 21's beta; the Table 1 investigation).

Runs ``stalevre`` on the Table 1 configuration of ``paper003_table1.py --full`` (digits x
3, 120 clients, profile paper003, E = 5, lr 0.1, budget 0.1 V) and records, in every
round and for every model, the two parts of Eq. 18's step
``Delta = sum_{N_s} d beta h  +  sum_{A_s} c (G - beta h)`` with ``c = d / (B p)``:

* ``stale``: the norm of the first sum (every eligible pair's stale update);
* ``correction``: the norm of the second (the sampled pairs);
* ``top``: the sampled pair with the largest ``||c (G - beta h)||``: its ``c``, the
  ``beta`` it was given, the optimum ``beta* = <G, h> / ||h||^2`` of Eq. 20 measured on
  its fresh ``G`` this round, ``k``, the rounds since its ``h`` was stored, and "one
  upload" where its ``beta`` is ``b0`` because it had uploaded only once;
* ``b0 pairs``: pairs whose ``beta`` is still ``b0`` because they have uploaded once
  (Eq. 21 has no ``beta*`` for them yet), and their share of the data.

A dip is a round whose mean accuracy over the models lies at least ``--dip`` below the
best round so far, and starts in the round after one that did not. For each dip's first
round the script prints those numbers for the round whose step made it (the
aggregation of round r is evaluated as round r), next to their medians over all rounds
after round 40; how many rounds hold a model whose step has one pair's term at least
``--big`` times that median, and whether they start a dip, fall in one or not; and, over
all sampled pairs of the run, how far the ``beta`` applied was from the optimum (mean
``|beta - beta*|`` by ``k``). Nothing is written.

``--defences off`` (the default) runs StaleVRE as paper 003 states it, every bound off
(the reproduction mode); ``--defences default`` runs it with the project's defences on, a
sensitivity run. The header lines printed before the runs name the mode.

    python benchmarks/stalevre_dips.py --seeds 1 --num-rounds 150
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import _evidence as E
import numpy as np


def norm(arrays: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(float(np.square(np.asarray(a, np.float64)).sum()) for a in arrays)))


Pair = tuple[int, float, float, bool]  # (k, beta applied, beta*, uploaded once)


def settings(seed: int, num_rounds: int, b0: float = 1.0, defences: str = "off") -> Any:
    """The ``Settings`` of one run: Table 1's StaleVRE at ``num_rounds`` rounds with
    ``b0``, in mode ``defences`` (``off``: every bound off, the reproduction mode)."""
    import paper003_table1 as T

    from mmfl_flwr.config import Settings

    sc = dict(T.SCALES["full"], num_rounds=num_rounds)
    kw = {**T.settings_for("stalevre", sc, "digits,digits,digits"), "stalevre_b0": b0}
    return Settings(**E.with_defences({**kw, "seed": seed, "output_dir": ""}, defences))


def run(
    seed: int, num_rounds: int, b0: float = 1.0, defences: str = "off"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Pair]]:
    """One StaleVRE run (:func:`settings`): (history rows, per (round, model) records,
    per sampled pair with a stored h: (k, beta applied, beta*, whether it had uploaded
    only once))."""
    from mmfl_flwr.core.stalevr import StaleVREAggregator, optimal_stale_beta
    from mmfl_flwr.runner import run as run_settings

    s = settings(seed, num_rounds, b0, defences)
    records: list[dict[str, Any]] = []
    pairs: list[Pair] = []
    original = StaleVREAggregator.aggregate

    def aggregate(self, task, weights, updates, server_round, *, shares=None, fresh=None):
        sh = shares if shares is not None else {u.cid: u.data_share for u in updates}
        stale_sum: list[np.ndarray] | None = None
        b0_pairs, b0_share = 0, 0.0
        for cid, d in sh.items():
            h = self.store.get(cid, task)
            if h is None or not d > 0:
                continue
            beta = self.beta(cid, task, server_round)
            entry = self.schedule.get((cid, task))
            if entry is not None and entry[1] is None:
                b0_pairs += 1
                b0_share += d
            part = [d * beta * np.asarray(a, np.float64) for a in h]
            stale_sum = part if stale_sum is None else [x + y for x, y in zip(stale_sum, part)]
        corr: list[np.ndarray] | None = None
        top: dict[str, Any] = {}
        for u in updates:
            c = self._fresh_coefficient(u)
            h = self.store.get(u.cid, task)
            beta = self.beta(u.cid, task, server_round) if h is not None else 0.0
            g = [np.asarray(a, np.float64) for a in u.delta]
            term = (
                [c * (x - beta * np.asarray(y, np.float64)) for x, y in zip(g, h)]
                if h is not None
                else [c * x for x in g]
            )
            size = norm(term)
            entry = self.schedule.get((u.cid, task))
            k = server_round - entry[0] if entry is not None else 0
            star = optimal_stale_beta(u.delta, h) if h is not None else float("nan")
            if h is not None:
                pairs.append((k, beta, star, entry is not None and entry[1] is None))
            if size > top.get("size", -1.0):
                once = entry is not None and entry[1] is None  # beta = b0: no beta* yet
                top = dict(size=size, c=c, beta=beta, star=star, k=k, once=once)
            corr = term if corr is None else [x + y for x, y in zip(corr, term)]
        new = original(self, task, weights, updates, server_round, shares=shares, fresh=fresh)
        # the two parts add up to the step the aggregator applied (checked by the tests)
        step = [np.asarray(w, np.float64) - np.asarray(n, np.float64) for w, n in zip(weights, new)]
        parts = [np.zeros_like(x) for x in step]
        for part in (stale_sum, corr):
            if part is not None:
                parts = [x + y for x, y in zip(parts, part)]
        records.append(
            dict(
                round=server_round,
                task=task,
                stale=norm(stale_sum) if stale_sum else 0.0,
                correction=norm(corr) if corr else 0.0,
                uploads=len(updates),
                b0_pairs=b0_pairs,
                b0_share=b0_share,
                step=norm(step),
                unexplained=norm([x - y for x, y in zip(step, parts)]),
                **{f"top_{k}": v for k, v in top.items()},
            )
        )
        return new

    StaleVREAggregator.aggregate = aggregate  # type: ignore[method-assign]
    try:
        result = run_settings(s, engine="vectorized")
    finally:
        StaleVREAggregator.aggregate = original  # type: ignore[method-assign]
    return list(result.history), records, pairs


def _job(job: tuple[int, int, float, str]) -> tuple[Any, Any, Any, float]:
    """One run in a worker process (the patch lives in that process)."""
    t0 = time.monotonic()
    history, records, pairs = run(*job)
    return history, records, pairs, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    p = E.Parser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1", help="seeds of the runs (default 1)")
    p.add_argument("--num-rounds", type=int, default=150, help="rounds (default 150)")
    p.add_argument(
        "--dip",
        type=float,
        default=0.1,
        help="a dip round lies at least this far below the best so far (default 0.1)",
    )
    p.add_argument(
        "--b0",
        type=float,
        default=1.0,
        help="StaleVRE's starting beta b0 (Eq. 21; default 1.0, the paper's ~1)",
    )
    p.add_argument(
        "--big",
        type=float,
        default=5.0,
        help="a dip's step counts as made by one pair when that pair's term is "
        "at least this many times the median top-pair term (default 5)",
    )
    p.add_argument("--workers", type=int, default=1, help="runs in parallel (processes; default 1)")
    p.add_argument(
        "--after",
        type=int,
        default=40,
        help="dips and medians are read after this round (default 40)",
    )
    E.defences_arg(p)
    a = p.parse_args(argv)
    seeds = E.int_list(p, "--seeds", a.seeds, low=0)
    if a.num_rounds < 2:
        p.error(f"--num-rounds must be at least 2, got {a.num_rounds}")
    if not 0 <= a.after < a.num_rounds:
        p.error(f"--after must be in [0, {a.num_rounds - 1}], got {a.after}")
    if not 0 < a.dip < 1:
        p.error(f"--dip must be in (0, 1), got {a.dip}")
    if not 0 < a.b0 <= 10:
        p.error(f"--b0 must be in (0, 10], got {a.b0}")
    if not a.big >= 1:
        p.error(f"--big must be at least 1, got {a.big}")
    if a.workers < 1:
        p.error(f"--workers must be >= 1, got {a.workers}")
    print(E.machine(), flush=True)
    s = settings(seeds[0], a.num_rounds, a.b0, a.defences)
    print(E.defences_text(E.run_status(E.recorded_settings(s.defences, s.bounds()))), flush=True)
    gaps: dict[tuple[int, bool], list[float]] = defaultdict(list)
    totals: dict[str, int] = defaultdict(int)
    finals: list[float] = []
    results = E.map_cached(
        _job,
        [(seed, a.num_rounds, a.b0, a.defences) for seed in seeds],
        a.workers,
        label=lambda j: f"seed {j[0]}",
    )
    for seed, (history, records, pairs, seconds) in zip(seeds, results):
        acc: dict[int, list[float]] = defaultdict(list)
        for r in history:
            acc[int(r["round"])].append(float(r["accuracy"]))
        mean = {rd: statistics.fmean(v) for rd, v in acc.items()}
        by_round: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for rec in records:
            by_round[rec["round"]].append(rec)
        print(
            f"\nseed {seed} (b0 {a.b0:g}): {a.num_rounds} rounds in "
            f"{seconds:.0f} s; mean accuracy at the last round "
            f"{mean[a.num_rounds]:.3f}"
        )
        late = [rec for rec in records if rec["round"] > a.after]

        def med(key: str, late: list = late) -> float:
            vals = [float(r[key]) for r in late if key in r]
            return statistics.median(vals) if vals else float("nan")

        print(
            f"  medians over the (round, model) pairs after round {a.after}: stale "
            f"{med('stale'):.3f}, correction {med('correction'):.3f}, top pair "
            f"||c (G - beta h)|| {med('top_size'):.3f} (c {med('top_c'):.2f}, k "
            f"{med('top_k'):.0f}), b0 pairs {med('b0_pairs'):.0f} holding "
            f"{med('b0_share'):.2f} of the data"
        )
        best = max(mean[rd] for rd in range(0, a.after + 1))
        in_dip = False
        onsets: list[tuple[int, dict[str, Any]]] = []
        dipping: set[int] = set()
        for rd in range(a.after + 1, a.num_rounds + 1):
            best = max(best, mean[rd])
            dip = best - mean[rd] >= a.dip * (1 - 1e-9)
            if dip:
                dipping.add(rd)
            if dip and not in_dip:
                onsets.append((rd, max(by_round[rd], key=lambda r: r.get("top_size", 0.0))))
                print(
                    f"  dip from round {rd}: mean accuracy {mean[rd - 1]:.3f} -> "
                    f"{mean[rd]:.3f} (best so far {best:.3f}); its step, per model:"
                )
                for rec in sorted(by_round[rd], key=lambda r: r["task"]):
                    print(
                        f"    {rec['task']:9s} stale {rec['stale']:.3f}  correction "
                        f"{rec['correction']:.3f}  uploads {rec['uploads']}  top pair "
                        f"{rec.get('top_size', 0):.3f} (c {rec.get('top_c', 0):.2f}, "
                        f"beta {rec.get('top_beta', 0):.2f}, beta* "
                        f"{rec.get('top_star', float('nan')):+.2f}, k "
                        f"{rec.get('top_k', 0)}{', one upload' if rec.get('top_once') else ''})"
                        f"  b0 pairs {rec['b0_pairs']} "
                        f"({rec['b0_share']:.2f} of the data)"
                    )
            in_dip = dip
        large = a.big * med("top_size")
        big = [(rd, r) for rd, r in onsets if r.get("top_size", 0.0) >= large]
        rounds_big = {r["round"] for r in late if r.get("top_size", 0.0) >= large}
        starts = {rd for rd, _ in onsets}
        print(
            f"  {len(rounds_big)} of the {a.num_rounds - a.after} rounds after round "
            f"{a.after} have a model whose step holds one pair's term at least {a.big:g} x "
            f"the median: {len(rounds_big & starts)} start a dip, "
            f"{len((rounds_big & dipping) - starts)} fall in one, "
            f"{len(rounds_big - dipping)} are not dip rounds"
        )
        print(
            f"  {len(onsets)} dips; in {len(big)} of them one pair's term "
            f"||c (G - beta h)|| is at least {a.big:g} x the median"
            + (
                ": beta "
                + ", ".join(f"{r['top_beta']:.2f}" for _, r in big)
                + " applied where beta* was "
                + ", ".join(f"{r['top_star']:+.2f}" for _, r in big)
                + f"; {sum(bool(r.get('top_once')) for _, r in big)} of those pairs had "
                "uploaded once"
                if big
                else ""
            )
        )
        for k, beta, star, once in pairs:
            gaps[(min(k, 20), once)].append(abs(beta - star))
        totals["dips"] += len(onsets)
        totals["big"] += len(big)
        totals["once"] += sum(bool(r.get("top_once")) for _, r in big)
        finals.append(mean[a.num_rounds])
    print(
        f"\nall {len(seeds)} seeds (b0 {a.b0:g}): {totals['dips']} dips, {totals['big']} of "
        f"them starting with one pair's term at least {a.big:g} x the median "
        f"({totals['once']} of those pairs had uploaded once); mean accuracy at the last "
        f"round {statistics.fmean(finals):.3f} (per seed "
        + ", ".join(f"{v:.3f}" for v in finals)
        + ")"
    )
    print(
        "\nmean |beta applied - beta* (Eq. 20, on the fresh G)| over the sampled pairs "
        "with a stored h, by k (rounds since h was stored; 20 = 20 or more), for pairs "
        "on Eq. 21's line and for pairs that had uploaded once (beta = b0):"
    )
    for k in sorted({k for k, _ in gaps}):
        cells = []
        for once, what in ((False, "line"), (True, "uploaded once")):
            v = gaps.get((k, once))
            cells.append(f"{what} {statistics.fmean(v):.3f} over {len(v)}" if v else f"{what} -")
        print(f"  k {k:2d}: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
