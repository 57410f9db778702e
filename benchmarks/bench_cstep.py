"""Speed of the MMFL-Group C-step (papers 000/001) at scale.

Times :func:`mmfl_flwr.core.group.c_step` on 10,000 clients x 5 models whose
loss vectors are drawn from 6 planted clusters, with ``min_clusters = 5``
(``S``), the default ``max_clusters`` (``S + 4``), the default
``silhouette_sample`` and ``n_init``, exactly as :class:`GroupSampling` calls it.
One warm-up call (imports), then ``--reps`` timed runs; prints the median, the
chosen ``k`` and the adjusted Rand index against the planted labels.

When the median is over the target (or with ``--breakdown``) it also times the
parts of the C-step separately (K-means per candidate ``k`` vs the silhouette
score per ``k``) and a few parameter choices of ``c_step`` that would be
faster, so the slow part can be named. Nothing in the package is changed.

    python benchmarks/bench_cstep.py [--clients 10000] [--models 5] [--planted 6]
                                     [--reps 3] [--target 2.0] [--breakdown]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

import numpy as np
from sklearn.metrics import adjusted_rand_score

from mmfl_flwr.core.group import c_step


def make_losses(clients: int, models: int, planted: int, seed: int = 0):
    """Loss vectors of ``clients`` clients from ``planted`` Gaussian clusters in
    ``models`` dimensions (positive, loss-like; centres at least 1 apart, spread 0.2)."""
    rng = np.random.default_rng(seed)
    while True:
        centers = rng.uniform(0.5, 5.0, size=(planted, models))
        d = np.linalg.norm(centers[:, None] - centers[None], axis=-1)
        if d[np.triu_indices(planted, 1)].min() >= 1.0:
            break
    labels = rng.integers(planted, size=clients)
    x = centers[labels] + rng.normal(0.0, 0.2, size=(clients, models))
    return np.abs(x), labels


def timed(fn, reps: int, cpu: list[float] | None = None) -> tuple[list[float], object]:
    """Wall times of ``reps`` calls (and, into ``cpu``, their process CPU times)."""
    out, res = [], None
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        res = fn()
        out.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append(time.process_time() - c0)
    return out, res


def breakdown(x: np.ndarray, s: int, reps: int) -> None:
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    n = x.shape[0]
    print("\nWhere the time goes (median of", reps, "runs per part):")
    print(f"{'k':>3} {'KMeans n_init=3':>16} {'KMeans n_init=1':>16} {'silhouette(2000)':>17}")
    tot_km3 = tot_km1 = tot_sil = 0.0
    for k in range(s, s + 5):
        t3, km = timed(lambda k=k: KMeans(n_clusters=k, n_init=3, random_state=0).fit(x), reps)
        t1, _ = timed(lambda k=k: KMeans(n_clusters=k, n_init=1, random_state=0).fit(x), reps)
        ts, _ = timed(
            lambda km=km: silhouette_score(x, km.labels_, sample_size=min(2000, n), random_state=0),
            reps,
        )
        m3, m1, ms = (statistics.median(t) for t in (t3, t1, ts))
        tot_km3, tot_km1, tot_sil = tot_km3 + m3, tot_km1 + m1, tot_sil + ms
        print(f"{k:>3} {m3:>15.3f}s {m1:>15.3f}s {ms:>16.3f}s")
    print(f"sum {tot_km3:>15.3f}s {tot_km1:>15.3f}s {tot_sil:>16.3f}s")
    print(
        f"K-means restarts are {tot_km3 / (tot_km3 + tot_sil):.0%} of the C-step; "
        f"the silhouette {tot_sil / (tot_km3 + tot_sil):.0%}."
    )

    print("\nc_step with other parameters (median of", reps, "runs):")
    variants = [
        ("n_init=1", {"n_init": 1}),
        ("max_clusters=S+2", {"max_clusters": s + 2}),
        ("silhouette_sample=1000", {"silhouette_sample": 1000}),
        ("n_init=1, silhouette_sample=1000", {"n_init": 1, "silhouette_sample": 1000}),
        ("n_init=1, max_clusters=S+2", {"n_init": 1, "max_clusters": s + 2}),
    ]
    for name, kw in variants:
        t, cl = timed(lambda kw=kw: c_step(x, min_clusters=s, **kw), reps)
        print(f"  {name:<34} {statistics.median(t):6.3f} s   k = {cl.k}")  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--models", type=int, default=5)
    ap.add_argument("--planted", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--target", type=float, default=2.0, help="seconds")
    ap.add_argument("--breakdown", action="store_true", help="always time the parts")
    args = ap.parse_args()

    x, truth = make_losses(args.clients, args.models, args.planted)
    s = args.models
    c_step(x[:200], min_clusters=s)  # warm-up: imports, thread pools
    cpu: list[float] = []
    times, cl = timed(lambda: c_step(x, min_clusters=s), args.reps, cpu)
    med = statistics.median(times)
    ari = adjusted_rand_score(truth, cl.labels)  # type: ignore[attr-defined]
    print(
        f"N = {args.clients} clients, S = {s} models, {args.planted} planted clusters; "
        f"min_clusters = {s}, max_clusters = {s + 4} (default), silhouette_sample = 2000, "
        f"n_init = {inspect.signature(c_step).parameters['n_init'].default} (defaults)"
    )
    print(
        "runs (wall):",
        ", ".join(f"{t:.3f} s" for t in times),
        "| CPU (all threads):",
        ", ".join(f"{t:.3f} s" for t in cpu),
    )
    try:
        import os

        print(
            f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
            "(wall times grow with other load)"
        )
    except OSError:  # pragma: no cover
        pass
    print(f"C-step {args.clients}x{s}: {med:.3f} s (target < {args.target:g} s)")
    print(f"chosen k = {cl.k} (planted {args.planted}), ARI vs planted labels = {ari:.4f}")  # type: ignore[attr-defined]
    print("silhouette per k:", {k: round(v, 4) for k, v in cl.scores.items()})  # type: ignore[attr-defined]
    if med > args.target or args.breakdown:
        if med > args.target:
            print(f"\nOVER TARGET by {med - args.target:.3f} s")
        breakdown(x, s, args.reps)


if __name__ == "__main__":
    main()
