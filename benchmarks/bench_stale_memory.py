"""Memory of the stale-update store, measured: 120 clients x 5 tasks x a model of
1,000,000 parameters (float32), in each storage option; then one aggregation round
of the stale rules over it.

    python benchmarks/bench_stale_memory.py [--clients 120 --tasks 5 --params 1000000]
        [--round-clients 100 --round-params 200000 --round-sampled 10]

For each option it fills a fresh StaleStore with one update per (client, task)
pair and reports ``StaleStore.nbytes()`` (the arrays it holds), the growth of the
process's resident memory (RSS), and for ``disk`` the bytes written to its folder.
The round table: one task, ``--round-clients`` clients with a stored update each,
``--round-sampled`` of them sampled (probability 0.1), every client's fresh update
given (StaleVR's Eq. 20 needs them); per rule and storage, the seconds of a round
(best of 3) and how many times it read a stored update (each read is a float64
copy: a half-precision decode with ``float16``, a file read with ``disk``).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

import numpy as np

from mmfl_flwr.core.stale import StaleStore


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--clients", type=int, default=120)
    p.add_argument("--tasks", type=int, default=5)
    p.add_argument("--params", type=int, default=1_000_000)
    p.add_argument("--round-clients", type=int, default=100)
    p.add_argument("--round-params", type=int, default=200_000)
    p.add_argument("--round-sampled", type=int, default=10)
    a = p.parse_args(argv)
    for flag in ("clients", "tasks", "params", "round_clients", "round_params"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    if not 0 <= a.round_sampled <= a.round_clients:
        p.error("--round-sampled must be between 0 and --round-clients")
    rng = np.random.default_rng(0)
    # a model of `params` parameters in two tensors, like a small network
    shapes = [(a.params // 2,), (a.params - a.params // 2,)]
    update = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    pairs = a.clients * a.tasks
    print(
        f"{a.clients} clients x {a.tasks} tasks x {a.params:,} parameters = {pairs} stored updates"
    )
    print(f"{'storage':<8} {'nbytes':>12} {'RSS growth':>12} {'on disk':>12} {'seconds':>8}")
    for storage in ("float32", "float16", "disk"):
        gc.collect()
        with tempfile.TemporaryDirectory(prefix="mmfl-stale-bench-") as tmp:
            before = rss_bytes()
            t0 = time.perf_counter()
            store = StaleStore(storage, directory=tmp if storage == "disk" else None)
            for c in range(a.clients):
                for t in range(a.tasks):
                    store.set(str(c), f"task{t}", update)
            seconds = time.perf_counter() - t0
            grown = rss_bytes() - before
            disk = dir_bytes(tmp) if storage == "disk" else 0
            print(
                f"{storage:<8} {store.nbytes() / 2**30:>10.2f} GiB {grown / 2**30:>10.2f} GiB "
                f"{disk / 2**30:>10.2f} GiB {seconds:>8.1f}"
            )
            del store
            gc.collect()
    print(
        "('disk' keeps one float32 .npy file per tensor and only file names in "
        "memory; nbytes is then the bytes on disk)"
    )
    round_table(a.round_clients, a.round_params, a.round_sampled)
    return 0


def round_table(clients: int, params: int, sampled: int) -> None:
    """Seconds and stored-update reads of one aggregation round per rule and storage."""
    from mmfl_flwr.core import Update
    from mmfl_flwr.core.stale import FedVARPAggregator
    from mmfl_flwr.core.stalevr import StaleVRAggregator, StaleVREAggregator

    rng = np.random.default_rng(1)
    cids = [f"c{k}" for k in range(clients)]
    shares = {c: 1 / clients for c in cids}

    def update(cid: str, prob: float) -> Update:
        return Update(
            cid=cid,
            delta=[rng.standard_normal(params)],
            num_examples=1,
            data_share=1 / clients,
            processors=1,
            prob=prob,
            count=1,
        )

    first = [update(c, 1.0) for c in cids]
    fresh = {c: [rng.standard_normal(params)] for c in cids}
    picked = [update(c, 0.1) for c in cids[:sampled]]
    weights = [np.zeros(params, dtype=np.float32)]
    print(
        f"\none round: {clients} clients with a stored update of {params:,} parameters, "
        f"{sampled} sampled"
    )
    print(f"{'rule':<9} {'storage':<8} {'seconds':>8} {'reads':>6}")
    for name, make in (
        ("fedvarp", FedVARPAggregator),
        ("stalevr", StaleVRAggregator),
        ("stalevre", StaleVREAggregator),
    ):
        for storage in ("float32", "float16", "disk"):
            with tempfile.TemporaryDirectory(prefix="mmfl-stale-bench-") as tmp:
                agg = make(storage=storage, directory=tmp if storage == "disk" else None)
                agg.aggregate("t", weights, first, 1, shares=shares, fresh=fresh)
                reads = [0]
                real = agg.store.get

                def counted(cid: str, task: str, real=real, reads=reads):
                    reads[0] += 1
                    return real(cid, task)

                agg.store.get = counted  # type: ignore[method-assign]
                times = []
                for r in range(3):
                    reads[0] = 0
                    t0 = time.perf_counter()
                    agg.aggregate("t", weights, picked, 2 + r, shares=shares, fresh=fresh)
                    times.append(time.perf_counter() - t0)
                print(f"{name:<9} {storage:<8} {min(times):>8.3f} {reads[0]:>6}")


if __name__ == "__main__":
    sys.exit(main())
