"""Memory of the stale-update store, measured: 120 clients x 5 tasks x a model of
1,000,000 parameters (float32), in each storage option.

    python benchmarks/bench_stale_memory.py [--clients 120 --tasks 5 --params 1000000]

For each option it fills a fresh StaleStore with one update per (client, task)
pair and reports ``StaleStore.nbytes()`` (the arrays it holds), the growth of the
process's resident memory (RSS), and for ``disk`` the bytes written to its folder.
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
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=120)
    p.add_argument("--tasks", type=int, default=5)
    p.add_argument("--params", type=int, default=1_000_000)
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    # a model of `params` parameters in two tensors, like a small network
    shapes = [(a.params // 2,), (a.params - a.params // 2,)]
    update = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    pairs = a.clients * a.tasks
    print(f"{a.clients} clients x {a.tasks} tasks x {a.params:,} parameters "
          f"= {pairs} stored updates")
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
            print(f"{storage:<8} {store.nbytes() / 2**30:>10.2f} GiB {grown / 2**30:>10.2f} GiB "
                  f"{disk / 2**30:>10.2f} GiB {seconds:>8.1f}")
            del store
            gc.collect()
    print("('disk' keeps one float32 .npy file per tensor and only file names in "
          "memory; nbytes is then the bytes on disk)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
