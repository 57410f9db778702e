"""Helpers for the slow end-to-end tests (the tests marked ``slow``).

Everything here serves three goals:

- **isolation**: every Flower process a test starts gets a private ``FLWR_HOME``,
  private free ports chosen at run time, no runtime dependency installation, no
  update check, and the ``bin/`` folder of this interpreter's venv first on
  ``PATH`` (Flower starts its helper processes by name);
- **bounded time**: every subprocess call has a timeout, and run status is polled
  with a deadline (``flwr run`` exits 0 even when the run fails);
- **clean-up by process id**: :class:`ProcessTracker` ends the processes a test
  started, their descendants, the detached local SuperLink that ``flwr run . local``
  spawns (found by its ``--port``), and any other process that inherited the test's
  private marker environment variable (Ray workers, ``flower-superexec``, ...).
  Nothing is ever matched by a broad process name.

Process discovery reads ``/proc``, so these helpers are Linux-only (as is CI).
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

#: The repository root, a Flower App (``[tool.flwr.app]`` in pyproject.toml).
REPO_ROOT = Path(__file__).resolve().parents[1]

#: The ``bin/`` folder of the venv running the tests (``flwr``, ``flower-superlink``...).
VENV_BIN = Path(sys.executable).parent

#: Name of the environment variable that marks every process a test starts.
MARKER_VAR = "MMFL_E2E_MARKER"

#: Flower's FAB size limit (``flwr.common.constant.FAB_MAX_SIZE``).
FAB_MAX_BYTES = 10 * 1024 * 1024


# ----------------------------------------------------------------------------- tools
def flower_exe(name: str) -> str:
    """Absolute path of a Flower console script of this venv (``flwr``, ...)."""
    path = VENV_BIN / name
    if not path.exists():
        raise FileNotFoundError(
            f"{name} not found next to {sys.executable}; install flwr[simulation] "
            "into the venv that runs the tests"
        )
    return str(path)


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now.

    All sockets stay open until every port is chosen, so the ports are distinct.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def new_marker() -> str:
    """A fresh value for :data:`MARKER_VAR`."""
    return uuid.uuid4().hex


def flower_env(
    flwr_home: Path, marker: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """An isolated environment for a Flower process (or the ``mmfl`` CLI).

    Inherited ``FLWR_*`` variables and ``RAY_ADDRESS`` are dropped (they could point
    the process at someone else's SuperLink, Flower home or Ray cluster); then
    ``FLWR_HOME``, the offline switches, the marker, ``PATH`` and ``PYTHONPATH`` are
    set.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FLWR_") and k not in ("RAY_ADDRESS", MARKER_VAR)
    }
    flwr_home.mkdir(parents=True, exist_ok=True)
    env["FLWR_HOME"] = str(flwr_home)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    env[MARKER_VAR] = marker
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    # The package is installed (editable) in CI; this also covers a plain checkout.
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO_ROOT), env.get("PYTHONPATH", "")] if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["MPLBACKEND"] = "Agg"
    if extra:
        env.update(extra)
    return env


def tail(path: Path, n_chars: int = 4000) -> str:
    """The last ``n_chars`` characters of a text file (or a note that it is missing)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        return f"<{path}: {err}>"
    return text[-n_chars:]


# ------------------------------------------------------------------------------ /proc
def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, ppid)`` of a process, or None if it is gone."""
    raw = _read_bytes(f"/proc/{pid}/stat")
    if raw is None:
        return None
    # The command name is in parentheses and may itself contain spaces or ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[1])
    except (IndexError, ValueError):
        return None


def cmdline(pid: int) -> list[str]:
    """The command line of a process ([] if gone or a zombie)."""
    raw = _read_bytes(f"/proc/{pid}/cmdline") or b""
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def descendants(roots: Iterable[int]) -> set[int]:
    """All live descendants of ``roots`` (not the roots themselves)."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        st = _stat(pid)
        if st is not None:
            children.setdefault(st[1], []).append(pid)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def pids_with_marker(marker: str) -> set[int]:
    """Processes whose environment holds ``MARKER_VAR=marker`` (they descend from a
    process a test started, even if they were re-parented or detached)."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = set()
    for pid in _pids():
        env = _read_bytes(f"/proc/{pid}/environ")
        if env and needle in env.split(b"\0"):
            found.add(pid)
    return found


def superlink_pids_on_port(port: int) -> set[int]:
    """``flower-superlink`` processes started with ``--port <port>``."""
    found = set()
    for pid in _pids():
        args = cmdline(pid)
        if not any(Path(a).name == "flower-superlink" for a in args[:2]):
            continue
        for i, a in enumerate(args):
            if (a == "--port" and i + 1 < len(args) and args[i + 1] == str(port)) or (
                a == f"--port={port}"
            ):
                found.add(pid)
                break
    return found


def terminate_pids(pids: Iterable[int], grace: float = 10.0) -> set[int]:
    """SIGTERM ``pids``, wait up to ``grace`` seconds, SIGKILL what is left.

    Returns the pids still alive afterwards (should be empty).
    """
    me = os.getpid()
    targets = {p for p in pids if p not in (me, 1)}
    for pid in targets:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(is_alive(p) for p in targets):
        time.sleep(0.2)
    for pid in targets:
        if is_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(is_alive(p) for p in targets):
        time.sleep(0.1)
    return {p for p in targets if is_alive(p)}


# --------------------------------------------------------------------------- tracker
class ProcessTracker:
    """Start processes for one test and end all of them (by pid) in ``cleanup``.

    Use as a context manager; ``cleanup`` runs even when the test fails::

        with ProcessTracker(marker) as procs:
            link = procs.popen([...], env=env, log_path=tmp / "link.log")
            procs.watch_superlink_port(port)   # a detached SuperLink started by flwr
    """

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        self._ports: list[int] = []
        self.leftovers: set[int] = set()

    def __enter__(self) -> ProcessTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def popen(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path | str | None = None,
        log_path: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``cmd`` in its own session, output to ``log_path`` (or discarded)."""
        out: IO[bytes] | int = subprocess.DEVNULL
        if log_path is not None:
            f = open(log_path, "wb")  # noqa: SIM115 - closed in cleanup()
            self._logs.append(f)
            out = f
        proc = subprocess.Popen(
            list(cmd),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def watch_superlink_port(self, port: int) -> None:
        """Also end any ``flower-superlink --port <port>`` in ``cleanup``."""
        self._ports.append(port)

    def _targets(self) -> set[int]:
        roots = {p.pid for p in self.procs if p.poll() is None}
        for port in self._ports:
            roots |= superlink_pids_on_port(port)
        roots |= pids_with_marker(self.marker)
        return roots | descendants(roots)

    def cleanup(self) -> None:
        """End every process of this test, by pid; never raises."""
        try:
            # Two passes: a dying parent may spawn or orphan a child in between.
            for _ in range(2):
                targets = self._targets()
                if not targets:
                    break
                self.leftovers = terminate_pids(targets)
        except Exception as err:  # pragma: no cover - best effort
            print(f"[e2e] clean-up error: {err!r}", file=sys.stderr)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for f in self._logs:
            f.close()
        if self.leftovers:
            print(f"[e2e] processes still alive after clean-up: {self.leftovers}", file=sys.stderr)


# ------------------------------------------------------------------------ CLI calls
def run_cmd(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path | str | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run a short command to completion (with a timeout), capturing its output."""
    return subprocess.run(
        list(cmd),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def describe(res: subprocess.CompletedProcess[str], n_chars: int = 4000) -> str:
    """Exit code, stdout and stderr of a finished command, for assertion messages."""
    return (
        f"$ {' '.join(map(str, res.args))}\nexit code {res.returncode}\n"
        f"--- stdout ---\n{res.stdout[-n_chars:]}\n--- stderr ---\n{res.stderr[-n_chars:]}"
    )


def parse_json_output(text: str) -> dict[str, Any]:
    """The JSON object printed by ``flwr ... --format json`` (ignoring other lines)."""
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            return obj
    except json.JSONDecodeError:
        pass
    start = text.find("{")
    end = text.rfind("}")
    if start >= 0 and end > start:
        obj = json.loads(text[start : end + 1])
        if isinstance(obj, dict):
            return obj
    raise ValueError(f"no JSON object in output: {text[-2000:]!r}")


def flwr_run(
    app: Path | str,
    connection: str,
    *,
    env: Mapping[str, str],
    cwd: Path | str,
    run_config: str,
    federation_config: str | None = None,
    timeout: float = 120.0,
) -> str:
    """Submit a run with ``flwr run ... --format json``; return its run id."""
    cmd = [
        flower_exe("flwr"),
        "run",
        str(app),
        connection,
        "--format",
        "json",
        "--run-config",
        run_config,
    ]
    if federation_config is not None:
        cmd += ["--federation-config", federation_config]
    res = run_cmd(cmd, env=env, cwd=cwd, timeout=timeout)
    assert res.returncode == 0, f"flwr run failed:\n{describe(res)}"
    try:
        payload = parse_json_output(res.stdout)
    except ValueError as err:
        raise AssertionError(f"flwr run printed no JSON:\n{describe(res)}") from err
    assert payload.get("success") and payload.get("run-id"), (
        f"flwr run did not start a run:\n{describe(res)}"
    )
    return str(payload["run-id"])


def run_status(
    run_id: str, connection: str, *, env: Mapping[str, str], cwd: Path | str
) -> tuple[str | None, str]:
    """``(status, details)`` of a run from ``flwr ls --run-id``; status None if unknown."""
    res = run_cmd(
        [flower_exe("flwr"), "ls", connection, "--run-id", run_id, "--format", "json"],
        env=env,
        cwd=cwd,
        timeout=60,
    )
    try:
        runs = parse_json_output(res.stdout).get("runs") or []
    except ValueError:
        return None, describe(res, 1000)
    for run in runs:
        if str(run.get("run-id")) == run_id or len(runs) == 1:
            return str(run.get("status")), str(run.get("status-details", ""))
    return None, describe(res, 1000)


def wait_for_run(
    run_id: str,
    connection: str,
    *,
    env: Mapping[str, str],
    cwd: Path | str,
    timeout: float,
    interval: float = 2.0,
    done_file: Path | None = None,
    check_every: float = 30.0,
) -> tuple[str | None, str, list[tuple[float, str | None]]]:
    """Poll until the run's status is ``finished:*`` or ``timeout`` seconds passed.

    Every poll is a ``flwr ls`` process (a second of CPU on a small machine, taken
    from the run it waits for). With ``done_file`` (a file the run writes last, such
    as its ``summary.json``), the status is asked only every ``check_every`` seconds
    (so a failed run is still seen) until the file exists, then every ``interval``.

    Returns ``(last status, last details, [(elapsed s, status) at every change])``.
    """
    t0 = time.monotonic()
    history: list[tuple[float, str | None]] = []
    status: str | None = None
    details = ""
    last_poll = -math.inf
    while True:
        now = time.monotonic()
        waiting = done_file is not None and not done_file.exists()
        if not waiting or now - last_poll >= check_every:
            last_poll = now
            try:
                status, details = run_status(run_id, connection, env=env, cwd=cwd)
            except subprocess.TimeoutExpired:
                status, details = None, "flwr ls timed out"
            if not history or history[-1][1] != status:
                history.append((round(time.monotonic() - t0, 1), status))
            if status is not None and status.startswith("finished"):
                return status, details, history
        if time.monotonic() - t0 > timeout:
            return status, details, history
        time.sleep(0.5 if waiting else interval)


def run_logs(run_id: str, connection: str, *, env: Mapping[str, str], cwd: Path | str) -> str:
    """The ServerApp's logs of a run (``flwr log RUN_ID CONN --show``), best effort."""
    try:
        res = run_cmd(
            [flower_exe("flwr"), "log", run_id, connection, "--show"],
            env=env,
            cwd=cwd,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        return "<flwr log timed out>"
    return (res.stdout + res.stderr)[-8000:]


def wait_for_http_health(
    port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Wait until ``http://127.0.0.1:<port>/health`` answers 2xx (or fail)."""
    url = f"http://127.0.0.1:{port}/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before {url} was up")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if 200 <= resp.status < 300:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not come up within {timeout:.0f} s")


def wait_for_online_nodes(
    n: int, connection: str, *, env: Mapping[str, str], cwd: Path | str, timeout: float
) -> list[dict[str, Any]]:
    """Wait until ``flwr supernode list`` shows at least ``n`` online SuperNodes."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        res = run_cmd(
            [flower_exe("flwr"), "supernode", "list", connection, "--format", "json"],
            env=env,
            cwd=cwd,
            timeout=60,
        )
        try:
            nodes = parse_json_output(res.stdout).get("nodes") or []
        except ValueError:
            nodes, last = [], describe(res, 1000)
        online = [nd for nd in nodes if nd.get("status") == "online"]
        if len(online) >= n:
            return online
        if time.monotonic() > deadline:
            raise AssertionError(
                f"only {len(online)} of {n} SuperNodes online after {timeout:.0f} s: "
                f"{nodes}\n{last}"
            )
        time.sleep(1.0)


# ------------------------------------------------------------------ a deployment
class Deployment:
    """A SuperLink and SuperNodes on 127.0.0.1, as plain processes of ``procs``.

    :meth:`start_insecure` starts an insecure SuperLink (in-memory state) and one
    insecure SuperNode per node config and waits until all are online; a secured
    deployment (``tests/deploy/test_deploy_tls.py``) starts its own processes and
    builds this object with their connection and logs. :meth:`run` submits a run
    with ``flwr run`` and waits for it to finish; a failure shows the run's and
    every process's logs.
    """

    def __init__(
        self,
        tmp_path: Path,
        conn: str,
        cli_env: dict[str, str],
        link_log: Path,
        node_logs: Sequence[Path],
    ) -> None:
        self.tmp_path = tmp_path
        self.conn = conn
        self.cli_env = cli_env
        self.link_log = link_log
        self.node_logs = list(node_logs)

    @classmethod
    def start_insecure(
        cls,
        procs: ProcessTracker,
        tmp_path: Path,
        marker: str,
        node_configs: Sequence[str],
        conn: str = "e2e",
        nodes_timeout: float = 90.0,
    ) -> Deployment:
        link_port, *node_ports = free_ports(1 + len(node_configs))
        cli_home = tmp_path / "cli-home"
        cli_env = flower_env(cli_home, marker)
        (cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{conn}"\n\n'
            f'[superlink.{conn}]\naddress = "127.0.0.1:{link_port}"\ninsecure = true\n'
        )
        dep = cls(
            tmp_path,
            conn,
            cli_env,
            tmp_path / "superlink.log",
            [tmp_path / f"supernode-{i}.log" for i in range(len(node_configs))],
        )
        link = procs.popen(
            [
                flower_exe("flower-superlink"),
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
                "--database",
                ":flwr-in-memory:",
            ],
            env=flower_env(tmp_path / "link-home", marker),
            cwd=tmp_path,
            log_path=dep.link_log,
        )
        procs.watch_superlink_port(link_port)
        try:
            wait_for_http_health(link_port, timeout=60, proc=link)
        except AssertionError as err:
            raise AssertionError(f"{err}{dep.logs()}") from None
        for i, (port, cfg) in enumerate(zip(node_ports, node_configs)):
            procs.popen(
                [
                    flower_exe("flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{link_port}",
                    "--port",
                    str(port),
                    "--node-config",
                    cfg,
                ],
                env=flower_env(tmp_path / f"node{i}-home", marker),
                cwd=tmp_path,
                log_path=dep.node_logs[i],
            )
        # Submit only when every node is online: the ServerApp starts training
        # with the nodes it finds.
        dep.wait_online(len(node_configs), nodes_timeout)
        return dep

    def logs(self, *paths: Path) -> str:
        """The tails of the given logs (default: the SuperLink's and every SuperNode's)."""
        return "".join(
            f"\n--- {p.name} ---\n{tail(p)}" for p in (paths or (self.link_log, *self.node_logs))
        )

    def wait_online(self, n: int, timeout: float) -> list[dict[str, Any]]:
        try:
            return wait_for_online_nodes(
                n, self.conn, env=self.cli_env, cwd=self.tmp_path, timeout=timeout
            )
        except AssertionError as err:
            raise AssertionError(f"{err}{self.logs()}") from None

    def run(
        self, app: Path, run_config: str, out: Path, timeout: float = 360.0
    ) -> tuple[str, str, list[tuple[float, str | None]]]:
        """Submit ``app`` with ``run_config`` (whose output-dir is ``out``) and wait
        until it finishes; fails with every log unless it completed. Returns the
        run id, the ServerApp's log and the status history."""
        run_id = flwr_run(
            app, self.conn, env=self.cli_env, cwd=self.tmp_path, run_config=run_config
        )
        status, details, history = wait_for_run(
            run_id,
            self.conn,
            env=self.cli_env,
            cwd=self.tmp_path,
            timeout=timeout,
            interval=1.0,
            done_file=out / "summary.json",
        )
        server_log = run_logs(run_id, self.conn, env=self.cli_env, cwd=self.tmp_path)
        if status != "finished:completed":
            raise AssertionError(
                f"run {run_id} ended as {status!r} ({details}); statuses {history}\n"
                f"--- flwr log ---\n{server_log}{self.logs()}"
            )
        return run_id, server_log, history


# ---------------------------------------------------------------------- the outputs
OUTPUT_FILES = (
    "metrics.csv",
    "summary.json",
    "assignments.csv",
    "accuracy.png",
    "assignments.png",
    "training.png",
)


def read_csv(path: Path) -> list[dict[str, str]]:
    """All rows of a CSV file as dicts of strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def check_outputs(out: Path, models: Sequence[str], num_rounds: int) -> dict[str, Any]:
    """Assert the output files of a run are there and sane; return their data.

    metrics.csv must have exactly one row per (round 0..num_rounds, model) with a
    finite accuracy in [0, 1] and a finite loss.
    """
    for name in OUTPUT_FILES:
        f = out / name
        assert f.is_file() and f.stat().st_size > 0, f"missing or empty output {f}"
    for png in ("accuracy.png", "assignments.png", "training.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
    metrics = read_csv(out / "metrics.csv")
    keys = sorted((int(r["round"]), r["task"]) for r in metrics)
    expected = sorted((r, m) for r in range(num_rounds + 1) for m in models)
    assert keys == expected, f"metrics.csv rows (round, task): {keys} != {expected}"
    for r in metrics:
        acc, loss = float(r["accuracy"]), float(r["loss"])
        assert math.isfinite(acc) and 0.0 <= acc <= 1.0, f"bad accuracy in row {r}"
        assert math.isfinite(loss), f"bad loss in row {r}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == num_rounds, summary
    assert set(summary["final_accuracy"]) == set(models), summary
    assignments = read_csv(out / "assignments.csv")
    assert assignments, "assignments.csv has no rows"
    for a in assignments:
        assert 1 <= int(a["round"]) <= num_rounds and a["task"] in models, a
    return {"metrics": metrics, "summary": summary, "assignments": assignments}


def default_model_names() -> list[str]:
    """The model names of the app's default ``tasks`` (pyproject.toml)."""
    import tomllib

    from mmfl_flwr.tasks.federation import task_names

    cfg = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    tasks = cfg["tool"]["flwr"]["app"]["config"]["tasks"]
    return task_names([t.strip() for t in tasks.split(",") if t.strip()])


def check_app_pyproject(app: Path) -> None:
    """Fail early if ``flwr run`` would rewrite the app's pyproject.toml.

    ``flwr run`` migrates a legacy ``[tool.flwr.federations]`` table into
    ``$FLWR_HOME/config.toml`` and comments it out *in place*, which would modify the
    repository under test.
    """
    import tomllib

    cfg = tomllib.loads((app / "pyproject.toml").read_text())
    flwr_cfg = cfg.get("tool", {}).get("flwr", {})
    assert "federations" not in flwr_cfg, (
        "pyproject.toml has [tool.flwr.federations]; `flwr run` would rewrite the file. "
        "Move federations to $FLWR_HOME/config.toml / --federation-config."
    )
    assert "app" in flwr_cfg and "components" in flwr_cfg["app"], (
        "pyproject.toml is not a Flower App ([tool.flwr.app.components] missing)"
    )


def _built_fab(app: Path) -> bytes:
    """The FAB ``flwr run`` would build from ``app``."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # typer/click and pathspec deprecations
        from flwr.cli.build import build_fab_from_disk

        return build_fab_from_disk(app)


def fab_size_report(app: Path) -> tuple[int, list[tuple[int, str]]]:
    """Size of the FAB ``flwr run`` would build from ``app`` and its 10 largest files."""
    import io
    import zipfile

    fab = _built_fab(app)
    with zipfile.ZipFile(io.BytesIO(fab)) as z:
        largest = sorted(((i.file_size, i.filename) for i in z.infolist()), reverse=True)
    return len(fab), largest[:10]


def fab_file_names(app: Path) -> list[str]:
    """Names of the files in the FAB ``flwr run`` would build from ``app``."""
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(_built_fab(app))) as z:
        return [i.filename for i in z.infolist()]


def run_isolated(
    cmd: Sequence[str],
    tmp_path: Path,
    *,
    cwd: Path,
    timeout: float,
    local_superlink: bool = True,
    keep_runtime_install: bool = False,
) -> tuple[int, str]:
    """Run ``cmd`` with an isolated Flower environment (:func:`flower_env`; with
    ``local_superlink``, private ports for the local SuperLink that ``flwr run``
    starts, ended afterwards); return its exit code and output. With
    ``keep_runtime_install`` the environment does not set
    ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION`` (the command must)."""
    marker = new_marker()
    extra: dict[str, str] = {}
    if local_superlink:
        http_port, control_port = free_ports(2)
        extra = {
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
            "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        }
    env = flower_env(tmp_path / "home", marker, extra)
    if keep_runtime_install:
        env.pop("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION")
    log = tmp_path / "command.log"
    with ProcessTracker(marker) as procs:
        if local_superlink:
            procs.watch_superlink_port(int(extra["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]))
        proc = procs.popen(list(cmd), env=env, cwd=cwd, log_path=log)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            procs.cleanup()
            raise AssertionError(
                f"{' '.join(cmd)[:200]} did not finish in {timeout:.0f} s:\n{tail(log)}"
            ) from None
    return rc, log.read_text(errors="replace")
