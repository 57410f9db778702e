"""Speed of the MMFL-LVR closed form (paper 003, Eq. 13) at scale.

Times :func:`mmfl_flwr.core.lvr_probabilities` for 10^5 clients x 10 tasks with
mixed processors ``B_i in 1..5`` and random eligibility (~90% of the pairs),
budget ``m = 0.1 V``, then :func:`mmfl_flwr.core.sample_processors` on the
result. One warm-up call, then ``--reps`` timed repetitions (median and min).

    python benchmarks/bench_lvr_speed.py [--clients 100000] [--tasks 10] [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from mmfl_flwr.core import lvr_probabilities, sample_processors


def make_instance(clients: int, tasks: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    eligible = rng.random((tasks, clients)) < 0.9
    eligible[rng.integers(tasks, size=clients), np.arange(clients)] = True  # >= 1 task
    n = np.where(eligible, rng.integers(1, 500, (tasks, clients)), 0).astype(np.float64)
    d = n / n.sum(axis=1, keepdims=True)
    loss = np.where(eligible, rng.exponential(1.0, (tasks, clients)), np.nan)
    b = rng.integers(1, 6, clients)
    return loss, d, b, 0.1 * float(b.sum())


def timeit(fn, reps: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100_000)
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--target-ms", type=float, default=100.0)
    args = ap.parse_args()

    loss, d, b, m = make_instance(args.clients, args.tasks)
    V = int(b.sum())
    print(
        f"N = {args.clients} clients, S = {args.tasks} tasks, V = {V} processors, "
        f"eligible pairs {int((d > 0).sum())} ({(d > 0).mean():.1%}), m = {m:.1f}"
    )

    p = lvr_probabilities(loss, d, b, m)
    realised = float((b * p.sum(axis=0)).sum())
    capped = int((p.sum(axis=0) >= 1 - 1e-12).sum())
    print(
        f"sum B p = {realised:.6f} (m = {m:.1f}), capped clients: {capped}, "
        f"finite: {bool(np.isfinite(p).all())}"
    )

    t = timeit(lambda: lvr_probabilities(loss, d, b, m), args.reps)
    tag = "OK" if statistics.median(t) < args.target_ms else "SLOW"
    print(
        f"lvr_probabilities {args.clients}x{args.tasks}: median {statistics.median(t):.1f} ms "
        f"(target < {args.target_ms:.0f} ms), min {min(t):.1f} ms [{tag}]"
    )

    rng = np.random.default_rng(1)
    t = timeit(lambda: sample_processors(p, b, rng), args.reps)
    print(
        f"sample_processors {args.clients}x{args.tasks} (V = {V}): median "
        f"{statistics.median(t):.1f} ms, min {min(t):.1f} ms"
    )
    counts = sample_processors(p, b, rng)
    print(
        f"one draw: {int(counts.sum())} (processor, task) updates, "
        f"{int((counts > 0).sum())} (client, task) picks"
    )


if __name__ == "__main__":
    main()
