"""Torch threads of the vectorized engine: the cores other processes leave free
(``--threads auto``), or a fixed number; bad values are one line (exit 2)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from mmfl_flwr.cli import main as cli_main
from mmfl_flwr.client.threads import CoreWatch, ThreadChooser, _cores, cpu_budget, parse_threads


def test_parse_threads():
    assert parse_threads("auto") is None and parse_threads("3") == 3
    for bad in ("0", "-1", "x", "1.5", ""):
        with pytest.raises(ValueError, match="must be auto or a whole number >= 1"):
            parse_threads(bad)


def test_an_idle_machine_leaves_every_core_free():
    watch = CoreWatch()
    assert 1 <= watch.free() <= len(watch.cores)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
def test_a_busy_core_is_not_counted_as_free():
    """One other process spinning on our first core: at most cores - 1 are free
    (on a machine where nothing else runs, exactly that)."""
    watch = CoreWatch(min_span=0.5)
    if len(watch.cores) < 2:
        pytest.skip("needs 2 cores")
    t0 = time.monotonic()
    assert 1 <= watch.free() <= len(watch.cores)  # the first answer samples one span
    assert time.monotonic() - t0 < 0.5 + 0.5  # one span, plus a loaded machine's slack
    t0 = time.monotonic()
    watch.free()  # later answers never wait (a span would be 0.5 s)
    assert time.monotonic() - t0 < 0.25
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import os

        os.sched_setaffinity(spin.pid, {watch.cores[0]})
        time.sleep(0.6)
        watch.free()  # starts a span with the spinner running
        time.sleep(0.6)
        assert watch.free() <= len(watch.cores) - 1
    finally:
        spin.kill()
        spin.wait()


def test_the_cpu_budget_is_the_cores_at_most_omp_num_threads(monkeypatch):
    cores = len(_cores())
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cpu_budget() == cores
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert cpu_budget() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", str(cores + 5))  # never above the cores
    assert cpu_budget() == cores
    for ignored in ("0", "x", "", "-2"):  # not a whole number >= 1: the cores
        monkeypatch.setenv("OMP_NUM_THREADS", ignored)
        assert cpu_budget() == cores


def test_the_vectorized_engine_takes_at_most_omp_num_threads(monkeypatch):
    """A user's OMP_NUM_THREADS caps the vectorized engine's torch threads, as it
    caps torch's own and Ray's."""
    import torch

    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run

    before = torch.get_num_threads()
    seen = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), real(n)))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        run(
            Settings(
                strategy="mfa-rr",
                tasks="synthetic",
                num_clients=3,
                num_rounds=1,
                local_epochs=1,
                output_dir="",
            ),
            engine="vectorized",
        )
    finally:
        real(before)
    assert seen and set(seen) == {1}, seen


def test_a_fixed_thread_count_is_set():
    import torch

    before = torch.get_num_threads()
    try:
        assert ThreadChooser(1).apply() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "args,words",
    [
        (["--engine", "inprocess", "--threads", "2"], "--threads applies to --engine vectorized"),
        (["--engine", "vectorized", "--threads", "0"], "must be auto or a whole number"),
    ],
)
def test_misplaced_or_bad_threads_are_exit_2(args, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        cli_main(["run", *args, "--output-dir", str(tmp_path / "r")])
    assert err.value.code == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


_BLAS_PROBE = """
import threadpoolctl
from mmfl_flwr.config import Settings
from mmfl_flwr.runner import run_inprocess


def blas():
    return max([d["num_threads"] for d in threadpoolctl.threadpool_info()
                if d["user_api"] == "blas"] or [0])


seen = []


def wrap(app):
    def call(msg, ctx):
        seen.append(blas())
        return app(msg, ctx)
    return call


before = blas()
run_inprocess(Settings(strategy="mfa-rr", tasks="synthetic", num_clients=3, num_rounds=1,
                       local_epochs=1, output_dir=""), wrap_client_app=wrap)
print(before, min(seen), max(seen), blas())
"""
_THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def _blas_threads(**env: str) -> list[int]:
    """numpy's BLAS threads before a run, the least and most seen by the clients
    during it (the in-process engine: the server's process), and after it."""
    import os

    clean = {k: v for k, v in os.environ.items() if k not in _THREAD_VARS}
    out = subprocess.run(
        [sys.executable, "-c", _BLAS_PROBE],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [int(x) for x in out.stdout.split()[-4:]]


def test_a_run_caps_numpys_blas_at_one_thread_unless_a_blas_count_is_set():
    """numpy's OpenBLAS starts one thread per core; its idle threads spin, and beside
    one other CPU-bound process they made every engine's round up to 2x slower
    (benchmarks/bench_contention.py). A run caps them at one thread while it runs and
    gives the previous count back; a count set through OPENBLAS_NUM_THREADS (a whole
    number) is kept; OMP_NUM_THREADS (torch's cap) and values that are not counts
    do not keep them."""
    before, low, high, after = _blas_threads()
    if before < 2:
        pytest.skip(f"numpy's BLAS starts with {before} thread(s) here: nothing to cap")
    assert (low, high, after) == (1, 1, before)
    assert _blas_threads(OPENBLAS_NUM_THREADS="2")[1:] == [2, 2, 2]  # the user's count
    assert _blas_threads(OMP_NUM_THREADS="2")[1:] == [1, 1, 2]
    assert _blas_threads(OPENBLAS_NUM_THREADS="abc")[1:3] == [1, 1]
