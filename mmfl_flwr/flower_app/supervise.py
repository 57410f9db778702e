"""Run a command and end it, with every process it started, when told to or when
the process that started this one is gone.

    python -m mmfl_flwr.flower_app.supervise -- flower-superlink --simulation ...

``mmfl run`` starts its private SuperLink through this supervisor, in a session
of its own. Flower's SuperLink starts ``flower-superexec`` in yet another
session, which starts ``flwr-simulation`` and Ray; stopping the SuperLink alone
leaves those running. So the supervisor ends the whole tree (every descendant,
found with ``ps``) on SIGTERM/SIGINT, and also when its parent dies, even by
SIGKILL (it polls its parent id), so a killed ``mmfl run`` leaves no simulation
behind writing into its output folder.

The process running the ServerApp (``flwr-simulation``; ``flwr-serverapp`` on a
SuperLink) is ended first, with SIGKILL, and only then the rest: Flower runs the
ServerApp in a thread that a SIGTERM does not stop, so with Ray's workers ending
under it, the round in progress would get failed replies, and the ServerApp
could still finish that round and checkpoint it. A resumed run then continues
from the last round that finished with its clients, as a run that was never
stopped does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType

#: The commands that run the ServerApp (which writes the checkpoint).
WRITERS = ("flwr-simulation", "flwr-serverapp")


def is_writer(argv: Sequence[str]) -> bool:
    """Whether the command ``argv`` runs a ServerApp: its program, or the script
    its interpreter runs (the first argument that is not an option), is one of
    :data:`WRITERS`."""
    if not argv:
        return False
    script = next((a for a in argv[1:] if not a.startswith("-")), "")
    return os.path.basename(argv[0]) in WRITERS or os.path.basename(script) in WRITERS


def _argv(pid: int, listed: Mapping[int, str]) -> list[str]:
    """The command of ``pid``: its arguments from ``/proc`` (exact, spaces and
    all), else its line in ``listed`` (``ps``'s, split at spaces)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return listed.get(pid, "").split()
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _commands() -> dict[int, str]:
    """The command line of every process, from ``ps``."""
    out = subprocess.run(
        ["ps", "-A", "-ww", "-o", "pid=", "-o", "args="],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    found = {}
    for line in out.splitlines():
        pid, _, command = line.strip().partition(" ")
        if pid.isdigit():
            found[int(pid)] = command.strip()
    return found


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children first by depth), from ``ps``."""
    out = subprocess.run(
        ["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True, text=True, check=False
    ).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            children.setdefault(int(parts[1]), []).append(int(parts[0]))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            found.append(child)
            todo.append(child)
    return found


def end_tree(root: int, grace: float = 10.0) -> None:
    """SIGKILL the ServerApp processes below ``root`` (:func:`is_writer`) and wait
    for them, then SIGTERM ``root`` and all its other descendants, SIGKILL whatever
    is left after ``grace`` seconds. The tree is listed first: a child whose
    parent ends first is re-parented and could not be found afterwards."""
    tree = [root, *descendants(root)]
    listed = {} if os.path.isdir("/proc/self") else _commands()
    writers = [p for p in tree if is_writer(_argv(p, listed))]
    for pid in writers:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in writers):
        time.sleep(0.05)
    for pid in tree:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in tree):
        time.sleep(0.2)
    for pid in tree:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (ended, not yet reaped by its parent) is gone
    if not os.path.isdir("/proc/self"):  # no /proc (macOS): ask ps
        state = subprocess.run(
            ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, check=False
        ).stdout.strip()
        return bool(state) and not state.startswith("Z")
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):  # it ended meanwhile
        return False


def main(argv: list[str]) -> int:
    if "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    if not argv:
        print("usage: python -m mmfl_flwr.flower_app.supervise -- COMMAND...", file=sys.stderr)
        return 2
    parent = os.getppid()
    child = subprocess.Popen(argv)

    def stop(signum: int, frame: FrameType | None) -> None:
        end_tree(child.pid)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while child.poll() is None:
        if os.getppid() != parent:
            stop(signal.SIGTERM, None)
        time.sleep(0.5)
    end_tree(child.pid, grace=2.0)  # what it left behind
    return int(child.returncode or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
