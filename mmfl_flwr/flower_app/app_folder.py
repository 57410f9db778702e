"""What ``mmfl run --engine simulation`` submits to its private SuperLink
(:func:`mmfl_flwr.flower_app.launch.run_on_superlink`): the Flower App folder
whose ``pyproject.toml`` holds the run's settings, the private Flower home that
names the SuperLink connection, and the environment the SuperLink and its
children run in (with the folder through which the nodes on this machine share
their data, removed with the run or by a later one).

:mod:`mmfl_flwr.flower_app.launch` re-exports the public names.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from mmfl_flwr.config import Settings
from mmfl_flwr.tasks.federation import SHARED_DATA_ENV
from mmfl_flwr.tasks.registry import TASK_SNAPSHOT_KEY, registered_tasks, save_snapshot

#: Name of the SuperLink connection in the private Flower configuration.
CONNECTION = "mmfl"


def _toml_value(value: Any) -> str:
    """``value`` as a TOML value (a bool, number or basic string)."""
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
        "[build-system]",
        'requires = ["setuptools>=68"]',
        'build-backend = "setuptools.build_meta"',
        "",
        "[project]",
        'name = "mmfl-run"',
        'version = "1.0.0"',
        'description = "An mmfl run (written by mmfl run)"',
        'license = "Apache-2.0"',
        "dependencies = []",
        "",
        "[tool.flwr.app]",
        'publisher = "mmfl-flwr"',
        "",
        "[tool.flwr.app.components]",
        'serverapp = "mmfl_flwr.flower_app.server_app:app"',
        'clientapp = "mmfl_flwr.flower_app.client_app:app"',
        "",
        "[tool.flwr.app.config]",
    ]
    lines += [f"{key} = {_toml_value(value)}" for key, value in sorted(run_config.items())]
    return "\n".join(lines) + "\n"


#: Run-config key (not a setting) by which mmfl run's simulation engine tells
#: the ServerApp the clients per node it chose for ``clients-per-node`` auto
#: (recorded in config.json's ``effective``).
CLIENTS_PER_NODE_USED_KEY = "mmfl-clients-per-node-used"

#: Run-config key (not a setting) by which a resumed run on mmfl run's simulation
#: engine tells the ServerApp, which runs in another working folder, the folder
#: mmfl run was started in: a relative folder in the resumed run's config.json
#: (``data-root``) names a folder from there.
LAUNCH_DIR_KEY = "mmfl-launch-dir"


def launched_run_config(settings: Settings, out: Path, clients_per_node: int) -> dict[str, Any]:
    """The run config that :func:`run_on_superlink` submits: the settings
    (``clients-per-node`` as typed: config.json, resume and mmfl compare read
    it), absolute output, resume, data and TensorBoard folders, with ``auto`` the
    ``clients_per_node`` chosen (:data:`CLIENTS_PER_NODE_USED_KEY`), and when
    resuming the working folder (:data:`LAUNCH_DIR_KEY`)."""
    config = settings.to_run_config()
    config["output-dir"] = str(out)
    if settings.resume_from:
        config["resume-from"] = str(Path(settings.resume_from).resolve())
        config[LAUNCH_DIR_KEY] = os.getcwd()
    if settings.data_root:
        config["data-root"] = str(Path(settings.data_root).resolve())
    if settings.log_dir:  # TensorBoard's folder, as the user's working folder names it
        config["log-dir"] = str(Path(settings.log_dir).resolve())
    if settings.clients_per_node_count() is None:
        config[CLIENTS_PER_NODE_USED_KEY] = int(clients_per_node)
    return config


def write_app(work: Path, config: dict[str, Any], port: int) -> Path:
    """Write the Flower App of run config ``config`` (``WORK/app``, with the
    process's user tasks as a snapshot beside it) and the private Flower home
    (``WORK/flwr-home``) whose connection :data:`CONNECTION` is the SuperLink
    on ``port``; returns the app folder."""
    config = dict(config)
    if registered_tasks():  # user tasks of this process travel as a pickled snapshot
        save_snapshot(str(work / "tasks.pkl"))
        config[TASK_SNAPSHOT_KEY] = str(work / "tasks.pkl")
    app = work / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text(app_pyproject(config))
    home = work / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    return app


def superlink_env(
    work: Path, ray_env: dict[str, str], verbose: bool, local: bool
) -> dict[str, str]:
    """The environment of the SuperLink and everything it starts: this one
    without the caller's Flower settings and Ray address, the private Flower
    home of ``work``, ``ray_env`` (:func:`~.launch.federation_config`) and,
    for a ``local`` run (no Ray cluster), a shared-data folder ``WORK/shared-data``
    unless the caller exported one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_") and k != "RAY_ADDRESS"}
    env.update(
        FLWR_HOME=str(work / "flwr-home"),
        FLWR_DISABLE_UPDATE_CHECK="1",
        # the app's code is this environment's mmfl_flwr: nothing to install
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0",
        RAY_DEDUP_LOGS="0",
        **ray_env,
    )
    # Ray starts one idle worker process per CPU for the first driver by default; the
    # simulation creates its ClientApp actors in processes of their own, so those
    # workers only cost CPU (seconds per run on a small machine). A value the user
    # exported wins.
    env.setdefault("RAY_prestart_worker_first_driver", "0")
    env["MMFL_ENGINE"] = "simulation"  # recorded in config.json / summary.json
    if verbose:  # the ServerApp logs every defence action at INFO (streamed here)
        env["MMFL_VERBOSE"] = "1"
    if local and SHARED_DATA_ENV not in env:
        # the nodes' workers on this machine map one copy of each shard's data
        # (a worker keeps every node it has served); removed with the run, or
        # by a later run where this one was killed before it could
        remove_stale_shared_data(work.parent)
        (work / "shared-data").mkdir()
        (work / "owner.pid").write_text(str(os.getpid()))
        env[SHARED_DATA_ENV] = str(work / "shared-data")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def remove_run_files(work: Path, verbose: bool) -> None:
    """Remove the shared-data folder of a run that ended and, unless ``verbose``
    (kept for inspection), its app, Flower home and logs; ``work`` itself when
    nothing else is left in it."""
    shutil.rmtree(work / "shared-data", ignore_errors=True)
    if verbose:
        return
    for leftover in ("app", "flwr-home", "tasks.pkl", "superlink.log", "owner.pid"):
        path = work / leftover
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    if not any(work.iterdir()):
        work.rmdir()


def remove_stale_shared_data(root: Path) -> list[Path]:
    """Remove the shared-data folders that runs of ``mmfl run --engine
    simulation`` left in ``root`` (``mmfl-run-*/shared-data``, up to the size of
    their clients' data) when their process is gone: a run killed by SIGKILL or
    the out-of-memory killer cannot remove its own. Returns the folders removed."""
    removed = []
    for owner in sorted(root.glob("mmfl-run-*/owner.pid")):
        try:
            pid = int(owner.read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except OSError:  # another user's process, or not ours to ask: left alone
            continue
        folder = owner.parent / "shared-data"
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        with contextlib.suppress(OSError):
            owner.unlink()
    return removed
