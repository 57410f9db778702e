"""A run on Flower's simulation engine (Ray) through ``mmfl run``, interrupted,
killed mid-way and resumed, makes the uninterrupted in-process run's
assignments; the user-task example runs there as its README says.

Every kind of client work a strategy asks of Ray's ClientApp actors, and every
signal an assignment can depend on, runs on Ray somewhere in the suite, at the
smallest size that can fail:

- here: a loss query every round with the selection on the losses and stale
  updates (stalevre), interrupted, killed and resumed, and still making the
  uninterrupted in-process run's assignments;
- tests/engines/test_parity_matrix.py (Ray, shard nodes of K clients, the
  models equal to the in-process reference's, not only the assignments): a loss
  query every round with paper 003's multi-processor clients training several
  models in one round (lvr), SCAFFOLD's control variates kept in the nodes'
  ``context.state`` (scaffold), and the C-step on label clusters with one client
  per node (group);
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
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_utils import describe, flower_env, new_marker, pids_with_marker, run_cmd

from mmfl_flwr import cli

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _kill_marked(marker: str) -> None:
    """SIGKILL every process a test's command left (its environment's marker)."""
    for pid in pids_with_marker(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


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
    resumes again to the end, with the assignments of the same command run
    without interruption on the in-process engine (stalevre: a loss query every
    round, the selection on the losses, stale updates kept across the restarts)."""
    from mmfl_flwr.checkpoint import load_checkpoint

    marker = new_marker()
    env = flower_env(tmp_path / "home", marker)
    out = tmp_path / "run"
    args = [
        "--num-clients",
        "4",
        "--num-rounds",
        "5",
        "--local-epochs",
        "1",
        "--strategy",
        "stalevre",
        "--budget-fraction",
        "0.5",
    ]
    cmd = [sys.executable, "-m", "mmfl_flwr.cli", "run", *args, "--output-dir", str(out)]
    try:
        # 1. Ctrl-C after round 1's checkpoint
        # SIGINT handled as a terminal's Ctrl-C is (pytest-xdist's workers ignore it,
        # and a child would inherit that)
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
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
        # the folder it names holds the finished rounds, as an in-process run's does
        assert sorted({int(r["round"]) for r in _rows(out / "metrics.csv")}) == list(
            range(done + 1)
        )
        assert "report.html" in lines[0] and (out / "report.html").is_file()
        assert not list(out.glob("*.tmp"))
        # 2. the printed command, killed hard after a later round
        proc = subprocess.Popen(
            ["bash", "-c", resume],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        _wait_for_round(proc, out, done + 1)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        # the tree it started ends without it (its supervisor), and without
        # checkpointing a round its clients were ended in
        deadline = time.monotonic() + 60
        while pids_with_marker(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        killed = load_checkpoint(out)
        done2 = killed["round"]
        assert done < done2 <= 5
        # 3. and once more to the end
        res = run_cmd(["bash", "-c", resume], env=env, timeout=300)
        assert res.returncode == 0, describe(res)
    finally:
        _kill_marked(marker)
    rows = _rows(out / "metrics.csv")
    assert sorted({int(r["round"]) for r in rows}) == [0, 1, 2, 3, 4, 5]
    assert all(math.isfinite(float(r["accuracy"])) for r in rows)
    # the uninterrupted reference, in this process
    assert (
        cli.main(["run", *args, "--output-dir", str(tmp_path / "inp"), "--engine", "inprocess"])
        == 0
    )
    assert (out / "assignments.csv").read_text() == (
        tmp_path / "inp" / "assignments.csv"
    ).read_text()
    # what the kill left was the uninterrupted run's rounds, rejections included
    reference = load_checkpoint(tmp_path / "inp")
    assert killed["rejections"] == {r: reference["rejections"][r] for r in range(1, done2 + 1)}
    assert [(r["round"], r["task"], r["uploads"]) for r in rows] == [
        (r["round"], r["task"], r["uploads"]) for r in _rows(tmp_path / "inp" / "metrics.csv")
    ]


def test_an_in_process_run_resumes_on_the_simulation_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started on the in-process engine with its data folder relative (the
    default ``data``) continues on the simulation engine (``--resume`` without
    ``--engine``) from the folder it was started in, with the assignments of the
    run made in one go: the ServerApp runs in another working folder and resolves
    the stored relative folder from the one ``mmfl run`` was started in."""
    monkeypatch.chdir(tmp_path)
    args = ["--num-clients", "4", "--local-epochs", "1", "--strategy", "stalevre"]
    assert (
        cli.main(
            ["run", *args, "--num-rounds", "1", "--output-dir", "run", "--engine", "inprocess"]
        )
        == 0
    )
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data-root"] == "data"
    marker = new_marker()
    env = flower_env(tmp_path / "home", marker)
    try:
        res = run_cmd(
            [sys.executable, "-m", "mmfl_flwr.cli", "run", "--resume", "run", "--num-rounds", "3"],
            env=env,
            cwd=tmp_path,
            timeout=300,
        )
    finally:
        _kill_marked(marker)
    assert res.returncode == 0, describe(res)
    assert (
        cli.main(
            ["run", *args, "--num-rounds", "3", "--output-dir", "ref", "--engine", "inprocess"]
        )
        == 0
    )
    assert (tmp_path / "run" / "assignments.csv").read_text() == (
        tmp_path / "ref" / "assignments.csv"
    ).read_text()


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
        res = run_cmd(
            ["bash", "-c", "python examples/user_task/run.py"], env=env, cwd=tmp_path, timeout=900
        )
    finally:
        _kill_marked(marker)
    assert res.returncode == 0, describe(res)
    rows = _rows(tmp_path / "results" / "user_task" / "metrics.csv")
    assert {r["task"] for r in rows} == {"digits", "blobs"}
    final = [r for r in rows if int(r["round"]) == 5 and r["task"] == "blobs"]
    assert final and float(final[0]["accuracy"]) > 0.34  # better than chance on 3 classes
    assert re.search(r"^blobs: accuracy \d\.\d{3}$", res.stdout, re.M), res.stdout[-2000:]
