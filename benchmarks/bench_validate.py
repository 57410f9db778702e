"""How long ``Settings(strategy=NAME).validate()`` takes, for every algorithm card.

Validation checks the settings' ranges and the strategy's pairing on its card (policy
and aggregator objects only): it builds no strategy and loads no data. Prints, per
preset, the median and the largest of ``--reps`` calls in this process after one
warm-up call, and the first call of the process (which pays for the imports once).

    python benchmarks/bench_validate.py [--reps 200] [--limit-ms 50]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200, help="timed calls per preset")
    parser.add_argument(
        "--limit-ms", type=float, default=50.0, help="the target per call (issue 23: 50 ms)"
    )
    a = parser.parse_args(argv)
    if a.reps < 1:
        parser.error("--reps must be >= 1")
    t0 = time.perf_counter()
    from mmfl_flwr.config import Settings
    from mmfl_flwr.core.card import cards

    Settings(strategy=cards()[0].name).validate()
    first = time.perf_counter() - t0
    print(f"machine: {platform.processor() or platform.machine()}, Python {sys.version.split()[0]}")
    print(f"first call of the process, imports included: {first * 1e3:.0f} ms")
    print(f"{'preset':<18} {'median ms':>10} {'max ms':>8}")
    worst = 0.0
    for card in cards():
        s = Settings(strategy=card.name)
        s.validate()  # warm-up
        times = []
        for _ in range(a.reps):
            t = time.perf_counter()
            s.validate()
            times.append(time.perf_counter() - t)
        worst = max(worst, max(times))
        print(f"{card.name:<18} {statistics.median(times) * 1e3:>10.3f} {max(times) * 1e3:>8.3f}")
    verdict = "under" if worst * 1e3 < a.limit_ms else "OVER"
    print(f"largest call {worst * 1e3:.3f} ms: {verdict} the {a.limit_ms:g} ms target")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
