"""How many torch threads a process that computes many clients should use.

Torch's CPU kernels split each operation over their threads and wait for the
slowest: when another process keeps one of two cores busy, two threads are much
slower than one (``benchmarks/bench_contention.py`` measures it). :class:`CoreWatch`
measures how busy the process's cores are with *other* work (``/proc/stat`` of
its cores, less its own CPU time over the same span) and gives the number of
cores left free; the vectorized engine sets torch's threads to it before every
round trip (``--threads auto``, the default) or to a fixed number
(``--threads K``).

Torch's threads are set in one place, :func:`set_torch_threads`: the in-process
engines through :func:`apply_engine_threads` when a run starts, and a shard
node's :class:`ThreadChooser` before every reply (on every engine).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator

__all__ = [
    "CoreWatch",
    "apply_engine_threads",
    "limit_blas_threads",
    "parse_threads",
    "set_torch_threads",
]

log = logging.getLogger("mmfl_flwr")


def parse_threads(value: object) -> int | None:
    """``"auto"`` (None) or a whole number >= 1 of threads; a ValueError naming
    the value otherwise."""
    text = str(value).strip().lower()
    if text == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1 or str(n) != text:
        raise ValueError(f"--threads {value!r}: must be auto or a whole number >= 1")
    return n


def set_torch_threads(n: int) -> int:
    """Set torch's (intra-op) threads of this process to ``n`` and return it: the
    one place the package sets them."""
    import torch

    torch.set_num_threads(int(n))
    return int(n)


def apply_engine_threads(engine: str, threads: object = None) -> int:
    """Set torch's threads for a run of an in-process engine and return them:
    ``inprocess`` 1 (small models train fastest on one thread, and one thread per
    client is what the simulation engine gives each ClientApp, ``num_cpus=1``);
    ``vectorized`` the fixed number of ``threads`` (:func:`parse_threads`), or
    with ``"auto"`` or None every core this process may use
    (:func:`cpu_budget`; ``--threads auto`` then takes the free ones of them on
    shard nodes), also for single-client nodes."""
    if engine == "inprocess":
        return set_torch_threads(1)
    fixed = None if threads is None else parse_threads(threads)
    return set_torch_threads(fixed or cpu_budget())


#: Environment variables through which a user sets the BLAS libraries' threads
#: (OpenBLAS, MKL, BLIS); where one holds a whole number >= 1,
#: :func:`limit_blas_threads` keeps the count it gave. ``OMP_NUM_THREADS`` is not
#: one of them: it caps torch's threads (``--threads``), and one BLAS thread is
#: within any cap it sets.
BLAS_THREAD_VARS = (
    "OPENBLAS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
)


@contextlib.contextmanager
def limit_blas_threads(n: int = 1) -> Iterator[bool]:
    """While the block runs, cap the BLAS libraries loaded in this process
    (numpy's OpenBLAS) at ``n`` threads, unless :data:`BLAS_THREAD_VARS` sets their
    count (kept); the previous counts come back when the block ends. Yields
    whether it capped. A run's server (:func:`mmfl_flwr.flower_app.server_app.server_main`)
    runs inside it; a ServerApp of your own can too::

        with limit_blas_threads():
            strategy.start(grid, ...)

    numpy's OpenBLAS starts one thread per core, and its threads spin between
    calls: beside one other CPU-bound process on 2 cores they made the engines'
    rounds up to 2x slower (``benchmarks/bench_contention.py``: in-process 1.76-2.00x,
    vectorized 2.07-2.20x; with one BLAS thread 1.01-1.31x and 1.06-1.22x). The
    server's numpy work (norms, cosines, aggregation of a round's updates) is small;
    torch's threads are set apart (:class:`ThreadChooser`) and not touched. Only
    the libraries loaded when the block starts are capped (one that a later import
    loads, such as scipy's own OpenBLAS, keeps its count). Needs ``threadpoolctl``
    (installed with scikit-learn); without it nothing is changed."""

    def given(v: str) -> bool:
        text = os.environ.get(v, "").strip()
        return text.isdigit() and int(text) >= 1

    kept = [v for v in BLAS_THREAD_VARS if given(v)]
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - installed with scikit-learn
        kept = kept or ["threadpoolctl missing"]
    if kept:
        log.debug("BLAS threads left as set (%s)", ", ".join(kept))
        yield False
        return
    with threadpool_limits(limits=n, user_api="blas"):
        log.debug("BLAS threads capped at %d for the run", n)
        yield True


def cpu_budget() -> int:
    """The CPU threads this process may use: the cores it may run on, at most
    ``OMP_NUM_THREADS`` where that is set to a whole number >= 1 (the variable
    torch, OpenMP and Ray use to cap a process's threads; anything else in it is
    ignored, as torch ignores it)."""
    n = len(_cores())
    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    if text.isdigit() and int(text) >= 1:
        n = min(n, int(text))
    return max(1, n)


def _cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


class CoreWatch:
    """The cores of this process that other processes leave free.

    :meth:`free` compares the busy time of the process's cores (``/proc/stat``)
    with the process's own CPU time since the previous measurement (made when
    at least ``min_span`` seconds have passed; before that the previous answer
    stands). Only the first answer may wait, to complete one span of
    ``min_span`` (a fresh process: a SuperNode runs each message in one). Where
    ``/proc`` is not there, every core counts as free.
    """

    def __init__(self, min_span: float = 0.1) -> None:
        self.cores = _cores()
        self.min_span = float(min_span)
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._read()
        self._free = len(self.cores)
        self._measured = False

    def _read(self) -> tuple[float, float, float] | None:
        """(wall seconds, busy seconds of our cores, our CPU seconds), or None."""
        try:
            with open("/proc/stat") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        want = {f"cpu{c}" for c in self.cores}
        busy = 0
        for line in lines:
            fields = line.split()
            if fields and fields[0] in want:
                v = [int(x) for x in fields[1:]]
                # user nice system idle iowait irq softirq steal ...
                busy += sum(v[:3]) + sum(v[5:8])
        t = os.times()
        return time.monotonic(), busy / self._tick, t.user + t.system

    def free(self) -> int:
        """Cores not kept busy by other processes (at least 1)."""
        if self._last is None:
            return len(self.cores)
        now = self._read()
        if now is None:
            return self._free
        span = now[0] - self._last[0]
        if span < self.min_span:
            if self._measured:
                return self._free
            time.sleep(self.min_span - span)  # the first answer: one short sample
            now = self._read() or now
            span = now[0] - self._last[0]
        self._measured = True
        others = ((now[1] - self._last[1]) - (now[2] - self._last[2])) / max(span, 1e-9)
        self._last = now
        self._free = max(1, min(len(self.cores), round(len(self.cores) - max(0.0, others))))
        return self._free


class ThreadChooser:
    """Sets torch's threads before a batched computation: a fixed number, or
    (``auto``) the cores :class:`CoreWatch` finds free, at most ``cap`` (default:
    torch's threads when the chooser is made, i.e. the CPUs a Flower worker was
    given, ``OMP_NUM_THREADS``), logged when it changes."""

    def __init__(self, threads: int | None, cap: int | None = None) -> None:
        import torch

        self.fixed = threads
        self.watch = CoreWatch() if threads is None else None
        self.cap = max(1, int(cap if cap is not None else torch.get_num_threads()))
        self.current: int | None = None

    def apply(self) -> int:
        """Set torch's threads for the next computation; returns them."""
        if self.fixed is not None:
            n = self.fixed
        elif self.cap == 1:
            n = 1  # nothing to choose
        else:
            n = min(self.cap, self.watch.free())  # type: ignore[union-attr]
        if n != self.current:
            if self.current is not None or (self.watch and n < self.cap):
                log.info(
                    "torch threads: %d (%s)",
                    n,
                    "--threads"
                    if self.fixed
                    else f"{self.cap - n} of the {self.cap} cores it may use are busy "
                    "with other processes",
                )
            set_torch_threads(n)
            self.current = n
        return n
