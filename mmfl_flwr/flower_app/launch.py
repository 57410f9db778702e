"""``mmfl run`` on Flower's supported simulation path: a private SuperLink with
the simulation runtime, and ``flwr run``.

What :func:`run_on_superlink` does, step by step (each a plain Flower command):

1. writes a Flower App folder in a temporary directory: a ``pyproject.toml``
   whose ``[tool.flwr.app.config]`` holds every setting of the run and whose
   components are this package's ServerApp and ClientApp;
2. starts ``flower-superlink --simulation`` on a free port of 127.0.0.1, with a
   private ``FLWR_HOME`` (nothing of the user's Flower configuration is read
   or changed) and the app's dependencies taken from this environment;
3. submits the app with ``flwr run APP mmfl --federation-config
   "num-supernodes=N client-resources-num-cpus=1 ..."`` (one virtual SuperNode
   per client on Ray, as ``flwr run`` does for a local simulation);
4. streams the run's log with ``flwr log RUN --stream`` (the ``[mmfl]``
   progress lines, warnings and errors; everything with ``verbose``);
5. checks the run's final status with ``flwr ls``, stops the SuperLink and
   its children, and reads the result back from the run's output folder.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app.supervise import end_tree
from mmfl_flwr.tasks.registry import TASK_SNAPSHOT_KEY, registered_tasks, save_snapshot

#: Name of the SuperLink connection in the private Flower configuration.
CONNECTION = "mmfl"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class SimulationError(RuntimeError):
    """The run did not finish on Flower's simulation runtime (one-line reason)."""


def _exe(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise SimulationError(f"'{name}' not found; install flwr[simulation] in this environment")
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


def app_pyproject(run_config: dict[str, Any]) -> str:
    """The ``pyproject.toml`` of the Flower App that runs ``run_config``."""
    lines = [
        '[build-system]', 'requires = ["setuptools>=68"]',
        'build-backend = "setuptools.build_meta"', '',
        '[project]', 'name = "mmfl-run"', 'version = "1.0.0"',
        'description = "An mmfl run (written by mmfl run)"', 'license = "Apache-2.0"',
        'dependencies = []', '',
        '[tool.flwr.app]', 'publisher = "mmfl-flwr"', '',
        '[tool.flwr.app.components]',
        'serverapp = "mmfl_flwr.flower_app.server_app:app"',
        'clientapp = "mmfl_flwr.flower_app.client_app:app"', '',
        '[tool.flwr.app.config]',
    ]
    lines += [f"{key} = {_toml_value(value)}" for key, value in sorted(run_config.items())]
    return "\n".join(lines) + "\n"


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    url = f"http://127.0.0.1:{port}/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SimulationError(f"flower-superlink exited with {proc.returncode}: "
                                  f"{_last_line(log)}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if 200 <= resp.status < 300:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise SimulationError(f"flower-superlink did not come up on port {port} in {timeout:.0f} s")


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return _ANSI.sub("", lines[-1]) if lines else "(empty log)"


def _json_out(text: str) -> dict[str, Any]:
    start = text.find("{")
    try:
        return dict(json.loads(text[start:])) if start >= 0 else {}
    except json.JSONDecodeError:
        return {}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the SuperLink and everything it started: its supervisor
    (:mod:`.supervise`) ends the whole process tree."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            end_tree(proc.pid)


#: Lines of Flower's own chatter that say nothing about this run: the
#: connection ``flwr log`` uses, the app install into the private Flower home,
#: and a notice about the default number of SuperNodes (we always set it).
_CHATTER = ("Using SuperLink:", "Successfully installed ", "default simulated SuperNodes")


def _show(line: str, verbose: bool) -> bool:
    """Whether a line of the run's log goes to the terminal: the progress lines
    and anything above INFO, without Flower's chatter; everything with
    ``verbose``."""
    plain = _ANSI.sub("", line).lstrip()
    if verbose:
        return True
    return not (plain.startswith(("INFO ", "DEBUG ")) or any(c in plain for c in _CHATTER))


def run_on_superlink(
    settings: Settings,
    num_cpus: int | None = None,
    verbose: bool = False,
    timeout: float | None = None,
) -> Path:
    """Run ``settings`` on Flower's simulation runtime through a private
    SuperLink (see the module docstring); returns the run's output folder.

    Raises :class:`SimulationError` with a one-line reason when the run does not
    finish as ``finished:completed``.
    """
    work = Path(tempfile.mkdtemp(prefix="mmfl-run-"))
    out = Path(settings.output_dir or work / "outputs").resolve()
    config = settings.to_run_config()
    config["output-dir"] = str(out)
    if settings.resume_from:
        config["resume-from"] = str(Path(settings.resume_from).resolve())
    if settings.data_root:
        config["data-root"] = str(Path(settings.data_root).resolve())
    if registered_tasks():  # user tasks of this process travel as a pickled snapshot
        save_snapshot(str(work / "tasks.pkl"))
        config[TASK_SNAPSHOT_KEY] = str(work / "tasks.pkl")
    app = work / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text(app_pyproject(config))
    home = work / "flwr-home"
    home.mkdir()
    port = _free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
    env.update(FLWR_HOME=str(home), FLWR_DISABLE_UPDATE_CHECK="1",
               # the app's code is this environment's mmfl_flwr: nothing to install
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
               RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0", RAY_DEDUP_LOGS="0")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    federation = [f"num-supernodes={settings.num_clients}", "client-resources-num-cpus=1",
                  "init-args-logging-level='ERROR'",
                  f"init-args-log-to-driver={'true' if verbose else 'false'}"]
    if env.get("RAY_ADDRESS"):
        print(f"[mmfl] RAY_ADDRESS={env['RAY_ADDRESS']}: Ray joins that cluster "
              "(its CPUs, not --num-cpus)", flush=True)
    else:
        federation.append(f"init-args-num-cpus={int(num_cpus or os.cpu_count() or 1)}")
    link_log = work / "superlink.log"
    with open(link_log, "wb") as log_f:
        # in a session of its own: a Ctrl-C or kill of this process group does not
        # reach the supervisor, which then ends the SuperLink's whole tree
        link = subprocess.Popen(
            [sys.executable, "-m", "mmfl_flwr.flower_app.supervise", "--",
             _exe("flower-superlink"), "--insecure", "--simulation", "--host", "127.0.0.1",
             "--port", str(port), "--database", ":flwr-in-memory:"],
            env=env, cwd=work, stdout=log_f, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        _wait_healthy(port, link, link_log, timeout=60)
        flwr = _exe("flwr")
        sub = subprocess.run(
            [flwr, "run", str(app), CONNECTION, "--format", "json",
             "--federation-config", " ".join(federation)],
            env=env, cwd=work, capture_output=True, text=True, timeout=300, check=False,
        )
        payload = _json_out(sub.stdout)
        run_id = str(payload.get("run-id", ""))
        if not payload.get("success") or not run_id:
            reason = payload.get("error-message") or (sub.stderr or sub.stdout).strip()
            raise SimulationError(f"flwr run did not start the run: {str(reason).splitlines()[-1:]}")
        stream = subprocess.Popen(
            [flwr, "log", run_id, CONNECTION, "--stream"], env=env, cwd=work,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        )
        assert stream.stdout is not None
        started = time.monotonic()
        for line in stream.stdout:
            if _show(line, verbose):
                print(line.rstrip("\n"), flush=True)
            if timeout is not None and time.monotonic() - started > timeout:
                stream.kill()
                raise SimulationError(f"the run did not finish within {timeout:.0f} s")
        stream.wait(timeout=60)
        status, details = _status(flwr, run_id, env, work)
        if status != "finished:completed":
            raise SimulationError(
                f"the run ended as {status!r} ({details}); run with --verbose to see "
                f"Flower's and Ray's logs (SuperLink: {_last_line(link_log)})"
            )
    finally:
        _stop(link)
        if not verbose:  # keep the app, Flower home and logs for inspection
            for leftover in ("app", "flwr-home", "tasks.pkl", "superlink.log"):
                path = work / leftover
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(
                    missing_ok=True)
            if not any(work.iterdir()):
                work.rmdir()
    return out


def _status(flwr: str, run_id: str, env: dict[str, str], cwd: Path) -> tuple[str, str]:
    """``(status, details)`` of a run; waits up to 60 s for it to be finished."""
    deadline = time.monotonic() + 60
    status, details = "unknown", ""
    while time.monotonic() < deadline:
        res = subprocess.run([flwr, "ls", CONNECTION, "--run-id", run_id, "--format", "json"],
                             env=env, cwd=cwd, capture_output=True, text=True, timeout=60,
                             check=False)
        for run in _json_out(res.stdout).get("runs") or []:
            status = str(run.get("status"))
            details = str(run.get("status-details", ""))
        if status.startswith("finished"):
            break
        time.sleep(1.0)
    return status, details
