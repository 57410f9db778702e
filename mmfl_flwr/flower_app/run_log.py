"""The log of a run on Flower's simulation runtime, as ``flwr run --stream``
prints it (:func:`mmfl_flwr.flower_app.launch.run_on_superlink`): Flower's own
lines until it names the run it started, then the run's log, shown on this
terminal as the in-process engines show theirs (progress on stdout, warnings
and errors on stderr, Flower's chatter left out unless ``verbose``).

:mod:`mmfl_flwr.flower_app.launch` re-exports the public names.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from mmfl_flwr.flower_app.app_folder import CONNECTION

#: how ``flwr run`` names the run it started (its default output format)
_STARTED = re.compile(r"Successfully started run (\d+)")
#: the ServerApp's last line, printed once its results are written
#: (:func:`mmfl_flwr.flower_app.server_app.server_main`)
RESULTS_LINE = "[mmfl] results written to "
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class SimulationError(RuntimeError):
    """The run did not finish on Flower's simulation runtime (one-line reason)."""


def _last_line(path: Path) -> str:
    """The last non-empty line of log ``path``, without colour codes."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return _ANSI.sub("", lines[-1]) if lines else "(empty log)"


def _json_out(text: str) -> dict[str, Any]:
    """The JSON object a Flower CLI command printed (``{}`` if there is none)."""
    start = text.find("{")
    try:
        return dict(json.loads(text[start:])) if start >= 0 else {}
    except json.JSONDecodeError:
        return {}


#: Lines of Flower's own chatter that say nothing about this run: the
#: connection ``flwr run`` uses, the app install into the private Flower home,
#: and a notice about the default number of SuperNodes (we always set it).
_CHATTER = ("Using SuperLink:", "Successfully installed ", "default simulated SuperNodes")


def _echo(line: str) -> None:
    """Print a line of the run's log as the in-process engines would: warnings,
    errors and tracebacks on stderr, the rest (progress) on stdout; without ANSI
    colour codes unless that stream is a terminal."""
    plain = _ANSI.sub("", line).rstrip("\n")
    problem = plain.lstrip().startswith(("WARNING", "ERROR", "CRITICAL", "Traceback"))
    stream = sys.stderr if problem else sys.stdout
    isatty = getattr(stream, "isatty", None)
    colour = bool(isatty and isatty()) and not os.environ.get("NO_COLOR")
    print(line.rstrip("\n") if colour else plain, file=stream, flush=True)


def _show(line: str, verbose: bool) -> bool:
    """Whether a line of the run's log goes to the terminal: the progress lines
    and anything above INFO, without Flower's chatter; everything with
    ``verbose``."""
    plain = _ANSI.sub("", line).lstrip()
    if verbose:
        return True
    return not (plain.startswith(("INFO ", "DEBUG ")) or any(c in plain for c in _CHATTER))


def flwr_reason(before: list[str]) -> str:
    """Flower's error from what ``flwr run`` printed before a run id: the text of
    its last boxed panel (rich wraps it at 80 columns on a pipe) joined into one
    line, else its last line."""
    tops = [i for i, line in enumerate(before) if line.startswith("╭")]
    if tops:
        return " ".join(line for line in before[tops[-1] + 1 :] if line)
    return before[-1] if before else ""


def follow_run_log(
    lines: Iterable[str],
    verbose: bool,
    timeout: float | None,
    on_started: Callable[[], None] | None = None,
) -> tuple[str, bool, list[str]]:
    """Read what ``flwr run ... --stream`` prints: until it names the run it
    started, Flower's own lines (kept, without box drawing, for an error
    message); then the run's log, shown as :func:`_show` / :func:`_echo` say.

    Returns ``(run_id, finished, before)``: the run id ("" if none was started),
    whether the ServerApp's last line (:data:`RESULTS_LINE`) came, and the
    non-empty lines before the run id; ``on_started()`` is called once the run id
    came. Raises :class:`SimulationError` after
    ``timeout`` seconds.
    """
    started = time.monotonic()
    run_id, finished, before = "", False, []
    for line in lines:
        plain = _ANSI.sub("", line)
        if not run_id:
            found = _STARTED.search(plain)
            if found:
                run_id = found.group(1)
                if on_started is not None:
                    on_started()
            elif plain.strip(" \n─│╭╮╰╯"):
                before.append(plain.strip(" \n│"))
            continue
        finished = finished or plain.startswith(RESULTS_LINE)
        if _show(line, verbose):
            _echo(line)
        if timeout is not None and time.monotonic() - started > timeout:
            raise SimulationError(f"the run did not finish within {timeout:.0f} s")
    return run_id, finished, before


def _status(flwr: str, run_id: str, env: dict[str, str], cwd: Path) -> tuple[str, str]:
    """``(status, details)`` of a run; waits up to 60 s for it to be finished."""
    deadline = time.monotonic() + 60
    status, details = "unknown", ""
    while time.monotonic() < deadline:
        res = subprocess.run(
            [flwr, "ls", CONNECTION, "--run-id", run_id, "--format", "json"],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        for run in _json_out(res.stdout).get("runs") or []:
            status = str(run.get("status"))
            details = str(run.get("status-details", ""))
        if status.startswith("finished"):
            break
        time.sleep(1.0)
    return status, details
