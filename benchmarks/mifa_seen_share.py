#!/usr/bin/env python
"""MIFA's zero start, measured: the share of each model's data (``d``) whose
(client, model) pair has uploaded at least once, per round, on paper 003's Table 1
federation (120 clients, profile paper003, 3 digits models, random allocation with
m = 0.1 V). With ``mifa-start = zero`` the pairs not seen yet count as zero updates,
so this share is the factor by which MIFA's early steps shrink.

    python benchmarks/mifa_seen_share.py            # 8 seeds, 40 rounds, about 1 min

The allocation does not depend on training (random allocation), so one local epoch
gives the same shares as Table 1's five.

``--defences off`` (the default) runs MIFA as paper 003 states it, every bound off (the
reproduction mode); ``--defences default`` runs it with the project's defences on, a
sensitivity run (a bound that rejects an update can leave its pair unseen). The header line
printed above the table names the mode.
"""

from __future__ import annotations

import math
import statistics
import sys

import _evidence as E  # (also puts the repository on sys.path)


def main(argv: list[str] | None = None) -> int:
    p = E.Parser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=8, help="seeds 0..N-1 (default 8)")
    p.add_argument("--rounds", type=int, default=40, help="rounds (default 40)")
    E.defences_arg(p)
    a = p.parse_args(argv)
    if a.seeds < 1 or a.rounds < 1:
        p.error("--seeds and --rounds must be >= 1")
    from mmfl_flwr.config import Settings
    from mmfl_flwr.core import stale
    from mmfl_flwr.runner import run

    seen: dict[int, list[float]] = {}
    plain = stale.MIFAAggregator.aggregate

    def recording(self, task, weights, updates, server_round, *, shares=None, fresh=None):
        sh = stale.default_shares(shares, updates)
        total = math.fsum(d for d in sh.values() if d > 0)
        have = math.fsum(d for d, _ in self._sources(task, updates, sh))
        seen.setdefault(server_round, []).append(have / total if total > 0 else 0.0)
        return plain(self, task, weights, updates, server_round, shares=shares, fresh=fresh)

    kw = E.with_defences(
        dict(E.PAPER003_FEDERATION, strategy="mifa", num_rounds=a.rounds, lr=0.1),
        a.defences,
    )
    first = Settings(**kw, seed=0)
    status = E.run_status(E.recorded_settings(first.defences, first.bounds()))
    print(
        f"MIFA (zero start), {a.seeds} seeds, {a.rounds} rounds, paper-003 federation. "
        f"{E.defences_text(status)}",
        flush=True,
    )
    stale.MIFAAggregator.aggregate = recording
    per_seed: dict[int, dict[int, float]] = {}
    try:
        for seed in range(a.seeds):
            seen.clear()
            run(Settings(**kw, seed=seed), engine="vectorized")
            per_seed[seed] = {r: statistics.fmean(v) for r, v in seen.items()}
    finally:
        stale.MIFAAggregator.aggregate = plain  # type: ignore[method-assign]
    print("| round | share of d with an upload (mean over models and seeds) | min | max |")
    print("|---|---|---|---|")
    for r in sorted({1, 5, 10, 20, 30, 40, a.rounds} & set(range(1, a.rounds + 1))):
        vals = [per_seed[s][r] for s in per_seed]
        print(f"| {r} | {statistics.fmean(vals):.3f} | {min(vals):.3f} | {max(vals):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
