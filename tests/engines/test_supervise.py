"""The supervisor that ends a simulation's process tree (mmfl_flwr.flower_app.supervise).

Flower's ``flwr-simulation`` runs the ServerApp in a thread that a SIGTERM does not
stop: once the tree is told to end, Ray's workers die under it, the round in
progress gets failed replies instead of the clients' losses and updates, and the
ServerApp could still finish that round and checkpoint it; a resumed run would
then continue from a round that an uninterrupted run never makes. The tree below
stands in for it: a "worker" (Ray) and a "writer" named ``flwr-simulation`` that,
like that thread, runs on after SIGTERM and writes a file as soon as the worker
is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mmfl_flwr.flower_app import supervise

TREE = r"""
import os, subprocess, sys, time
folder = sys.argv[1]
read, write = os.pipe()
worker = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(120)", folder], pass_fds=(write,)
)
writer = subprocess.Popen(
    [sys.executable, os.path.join(folder, "flwr-simulation"), folder, str(read)],
    pass_fds=(read,),
)
os.close(read)
os.close(write)
time.sleep(120)
"""

WRITER = r"""
import os, signal, sys
folder, fd = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as the ServerApp's thread runs on
open(os.path.join(folder, "ready"), "w").close()
os.read(fd, 1)  # returns (end of file) when the worker is gone
with open(os.path.join(folder, "degraded-round"), "w") as f:
    f.write("a round whose clients were gone, checkpointed")
"""


def _start(tmp_path: Path) -> subprocess.Popen[bytes]:
    (tmp_path / "tree.py").write_text(TREE)
    (tmp_path / "flwr-simulation").write_text(WRITER)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mmfl_flwr.flower_app.supervise",
            "--",
            sys.executable,
            str(tmp_path / "tree.py"),
            str(tmp_path),
        ],
        start_new_session=True,
    )


def _tree_pids(tmp_path: Path) -> list[int]:
    """The supervisor and every process of the tree (each names ``tmp_path``)."""
    out = subprocess.run(
        ["ps", "-A", "-ww", "-o", "pid=", "-o", "args="], capture_output=True, text=True
    )
    return [int(line.split()[0]) for line in out.stdout.splitlines() if str(tmp_path) in line]


def test_a_stopped_tree_ends_the_serverapp_process_before_its_clients(tmp_path):
    proc = _start(tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the tree did not start"
            time.sleep(0.05)
        assert len(_tree_pids(tmp_path)) == 4  # supervisor, tree, worker, writer
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        time.sleep(1.0)  # a writer left running would have written by now
        assert not (tmp_path / "degraded-round").exists()
        assert _tree_pids(tmp_path) == []
    finally:
        for pid in _tree_pids(tmp_path):
            os.kill(pid, signal.SIGKILL)


def test_the_serverapp_processes_are_told_by_their_command():
    assert supervise.is_writer(["/venv/bin/python3", "/venv/bin/flwr-simulation", "--token", "x"])
    assert supervise.is_writer(["/venv/bin/flwr-serverapp", "--insecure"])
    assert supervise.is_writer(["/my dir/.venv/bin/python3", "/my dir/.venv/bin/flwr-simulation"])
    assert supervise.is_writer(["python3", "-s", "/venv/bin/flwr-simulation", "--token", "x"])
    assert not supervise.is_writer(
        ["/venv/bin/python3", "/venv/bin/flower-superlink", "--simulation"]
    )
    assert not supervise.is_writer(["ray::ClientAppActor"])
    assert not supervise.is_writer(
        ["/venv/bin/python3", "-m", "mmfl_flwr.cli", "run", "--output-dir", "flwr-simulation"]
    )
    assert not supervise.is_writer([])


def test_a_process_is_told_by_its_exact_arguments():
    """On Linux the arguments come from /proc, spaces included."""
    code = "import time; print('up', flush=True); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code, "a b"], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # it runs
        assert supervise._argv(proc.pid, {})[-2:] == [code, "a b"]
    finally:
        proc.kill()
        proc.wait()
