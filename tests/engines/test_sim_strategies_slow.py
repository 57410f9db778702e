"""Strategies complete on Flower's simulation engine (Ray) through ``mmfl run`` and
make the same assignments as on the in-process engine for the same seed; a run
killed mid-way resumes on the simulation engine.

Every kind of client work a strategy asks of Ray's ClientApp actors, and every
signal an assignment can depend on, runs on Ray somewhere in the suite, at the
smallest size that can fail:

- here: every pair training on multi-processor clients with the selection on
  the update norms (gvr), and a loss query every round with the selection on the
  losses and stale updates (stalevr); stalevre in the interrupt-and-resume test;
- tests/engines/test_parity_matrix.py (Ray, shard nodes of K clients, the
  models equal to the in-process reference's, not only the assignments): a loss
  query every round (lvr), SCAFFOLD's control variates kept in the nodes'
  ``context.state`` (scaffold), loss queries of a subset and selection on the
  training losses (ranklist-ucb), and the C-step on label clusters (group);
- tests/docs/test_readme_main_job.py: the default job (mfa-rr), ``mmfl run``'s
  own outputs and its shard nodes.

The other presets differ from these only in server code, which is the same on
every engine: every preset runs end to end in-process
(tests/docs/test_protocol_doc.py, tests/strategy/test_hostile_defaults.py) and on
the vectorized engine (tests/engines/test_vectorized.py).

Slow: each Ray run costs ~15-30 s on 2 cores.
"""

from __future__ import annotations

import csv
import math
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmfl_flwr import cli

from e2e_utils import describe, flower_env, new_marker, pids_with_marker, run_cmd

pytestmark = [pytest.mark.slow, pytest.mark.ray]

CASES = {
    "gvr": ["--strategy", "gvr", "--profile", "paper003", "--budget-fraction", "0.3"],
    "stalevr": ["--strategy", "stalevr", "--profile", "paper003", "--budget-fraction", "0.3"],
}


_COMMON = ["--num-clients", "6", "--num-rounds", "3", "--local-epochs", "1"]


def _mmfl(args: list[str], out: Path, env: dict[str, str], timeout: float = 900):
    cmd = [sys.executable, "-m", "mmfl_flwr.cli", "run", *_COMMON, "--output-dir", str(out),
           *args]
    return run_cmd(cmd, env=env, timeout=timeout)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("case", list(CASES))
def test_strategy_completes_on_the_simulation_engine(case: str, tmp_path: Path) -> None:
    marker = new_marker()
    env = flower_env(tmp_path / "home", marker)
    try:
        sim = _mmfl(CASES[case], tmp_path / "sim", env)
        assert sim.returncode == 0, describe(sim)
        # the reference: the same command on the in-process engine, in this process
        # (no second interpreter to start)
        assert cli.main(["run", *_COMMON, "--output-dir", str(tmp_path / "inp"), *CASES[case],
                         "--engine", "inprocess"]) == 0
    finally:
        for pid in pids_with_marker(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    rows = _rows(tmp_path / "sim" / "metrics.csv")
    assert rows and max(int(r["round"]) for r in rows) == 3
    for r in rows:
        if r["accuracy"]:
            assert math.isfinite(float(r["accuracy"])), r
    assert any(int(r["uploads"]) > 0 for r in rows), "nothing was aggregated"
    # same seed, same assignments on both engines
    assert (tmp_path / "sim" / "assignments.csv").read_text() == (
        tmp_path / "inp" / "assignments.csv"
    ).read_text()


def _wait_for_round(proc: subprocess.Popen, out: Path, at_least: int) -> None:
    """Wait until the checkpoint in ``out`` is of round ``at_least`` or later."""
    from mmfl_flwr.checkpoint import load_checkpoint

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if load_checkpoint(out)["round"] >= at_least:
                return
        except Exception:
            pass
        time.sleep(0.2)


def test_interrupted_and_killed_runs_resume_on_the_simulation_engine(tmp_path: Path) -> None:
    """On Flower's simulation engine: Ctrl-C (SIGINT) after round 1 ends the run
    with exit code 130 and one line naming the round and the resume command; that
    command, killed hard (SIGKILL of its process group) after a later round,
    resumes again to the end."""
    from mmfl_flwr.checkpoint import load_checkpoint

    marker = new_marker()
    env = flower_env(tmp_path / "home", marker)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "mmfl_flwr.cli", "run", "--num-clients", "4",
           "--num-rounds", "5", "--local-epochs", "1", "--strategy", "stalevre",
           "--budget-fraction", "0.5", "--output-dir", str(out)]
    try:
        # 1. Ctrl-C after round 1's checkpoint
        # SIGINT handled as a terminal's Ctrl-C is (pytest-xdist's workers ignore it,
        # and a child would inherit that)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        _wait_for_round(proc, out, 1)
        assert proc.poll() is None, "the run finished before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err[-3000:]
        # one line besides the run's warnings (the small budget's), no traceback
        lines = [ln for ln in err.strip().splitlines() if not ln.startswith("WARNING")]
        assert "Traceback" not in err and len(lines) == 1, err[-3000:]
        done = load_checkpoint(out)["round"]
        assert 1 <= done < 5
        assert lines[0].startswith(f"mmfl run: interrupted after round {done} of 5;"), err
        resume = lines[0].split("continue with: ")[1]
        assert resume == f"mmfl run --resume {out}", resume
        # 2. the printed command, killed hard after a later round
        proc = subprocess.Popen(["bash", "-c", resume], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        _wait_for_round(proc, out, done + 1)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        done2 = load_checkpoint(out)["round"]
        assert done < done2 <= 5
        # 3. and once more to the end
        res = run_cmd(["bash", "-c", resume], env=env, timeout=300)
        assert res.returncode == 0, describe(res)
    finally:
        for pid in pids_with_marker(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    rows = _rows(out / "metrics.csv")
    assert sorted({int(r["round"]) for r in rows}) == [0, 1, 2, 3, 4, 5]
    assert all(math.isfinite(float(r["accuracy"])) for r in rows)


def test_user_task_example_runs_on_the_simulation_engine(tmp_path: Path) -> None:
    """examples/user_task/README.md: ``python examples/user_task/run.py``, as written
    (from a folder holding a copy of the example, so the results stay out of the
    checkout), adds a task from user tensors and trains it beside digits on
    Flower's simulation engine."""
    import shutil

    marker = new_marker()
    env = flower_env(tmp_path / "home", marker)
    repo = Path(__file__).resolve().parents[2]
    shutil.copytree(repo / "examples" / "user_task", tmp_path / "examples" / "user_task")
    try:
        res = run_cmd(["bash", "-c", "python examples/user_task/run.py"], env=env,
                      cwd=tmp_path, timeout=900)
    finally:
        for pid in pids_with_marker(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert res.returncode == 0, describe(res)
    rows = _rows(tmp_path / "results" / "user_task" / "metrics.csv")
    assert {r["task"] for r in rows} == {"digits", "blobs"}
    final = [r for r in rows if int(r["round"]) == 5 and r["task"] == "blobs"]
    assert final and float(final[0]["accuracy"]) > 0.34  # better than chance on 3 classes
    assert re.search(r"^blobs: accuracy \d\.\d{3}$", res.stdout, re.M), res.stdout[-2000:]
