"""``mmfl run``'s path onto Flower's simulation runtime (flower_app/launch.py):
the Flower App it writes carries every setting, and the log filter keeps the
progress lines. The whole path runs in the slow tests (``mmfl run`` in
test_readme_main_job.py and test_sim_strategies_slow.py, the user-task example in
test_sim_strategies_slow.py)."""

from __future__ import annotations

import math
import os
import tomllib

import pytest

from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app.launch import _show, app_pyproject


def test_the_app_pyproject_holds_every_setting_exactly():
    s = Settings(
        strategy="lvr",
        num_clients=7,
        lr=0.0125,
        output_dir='/tmp/a "quoted" dir',
        tasks="digits,synthetic",
        budget_fraction=0.35,
        overwrite=True,
    )
    config = s.to_run_config()
    config["odd"] = math.inf
    doc = tomllib.loads(app_pyproject(config))
    assert doc["tool"]["flwr"]["app"]["config"] == config
    components = doc["tool"]["flwr"]["app"]["components"]
    assert components == {
        "serverapp": "mmfl_flwr.flower_app.server_app:app",
        "clientapp": "mmfl_flwr.flower_app.client_app:app",
    }
    back = Settings.from_run_config({k: v for k, v in config.items() if k != "odd"})
    assert back == s


def test_the_log_filter_keeps_progress_warnings_and_errors_only():
    progress = "[mmfl] round   1/2 | acc digits=0.300 | uploads 4 | elapsed   30.7s"
    assert _show(progress, verbose=False)
    assert _show("\x1b[93mWARNING \x1b[0m:   Client 3: rejected update", verbose=False)
    assert _show("\x1b[91mERROR \x1b[0m:     boom", verbose=False)
    assert _show("Traceback (most recent call last):", verbose=False)
    assert not _show("\x1b[92mINFO \x1b[0m:      [ROUND 1/2]", verbose=False)
    assert not _show("Using SuperLink: mmfl (127.0.0.1:40843)", verbose=False)
    assert not _show(
        "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes "
        "changed from 10 to 2.",
        verbose=False,
    )
    assert _show("\x1b[92mINFO \x1b[0m:      [ROUND 1/2]", verbose=True)


def test_streamed_log_lines_go_where_the_in_process_engines_put_them(capsys):
    """On the simulation engine the run's log is streamed back: warnings and
    errors go to stderr, progress to stdout (as on the in-process engines), and
    without colour codes when the stream is not a terminal (issue 25)."""
    from mmfl_flwr.flower_app.launch import _echo

    _echo("\x1b[93mWARNING \x1b[0m:   strategy lvr: budget-fraction=0.1 gives m = 2\n")
    _echo("[mmfl] round   1/2 | acc digits=0.300 | uploads 4 | elapsed   30.7s\n")
    _echo("\x1b[91mERROR \x1b[0m:     boom\n")
    out, err = capsys.readouterr()
    assert out == "[mmfl] round   1/2 | acc digits=0.300 | uploads 4 | elapsed   30.7s\n"
    assert err == ("WARNING :   strategy lvr: budget-fraction=0.1 gives m = 2\nERROR :     boom\n")


def test_the_run_log_names_the_run_shows_progress_and_sees_the_results_line(capsys):
    """``mmfl run`` reads one ``flwr run --stream`` process: the run id from
    Flower's own line, then the run's log, filtered as above, and whether the
    ServerApp's last line (results written) came."""
    from mmfl_flwr.flower_app.launch import RESULTS_LINE, follow_run_log

    lines = [
        "Loading project configuration... \n",
        "\x1b[32mSuccessfully started run 8052306127553436162\x1b[0m\n",
        "\x1b[92mINFO \x1b[0m:      Starting logstream for run_id `8052306127553436162`\n",
        "\x1b[92mINFO \x1b[0m:      [ROUND 1/1]\n",
        "[mmfl] round   1/1 | acc digits=0.300 | uploads 4 | elapsed   30.7s\n",
        "\x1b[93mWARNING \x1b[0m:   Client 3: rejected update\n",
        f"{RESULTS_LINE}/tmp/out\n",
    ]
    assert follow_run_log(iter(lines), verbose=False, timeout=None) == (
        "8052306127553436162",
        True,
        ["Loading project configuration..."],
    )
    out, err = capsys.readouterr()
    assert out == (
        "[mmfl] round   1/1 | acc digits=0.300 | uploads 4 | elapsed   30.7s\n"
        f"{RESULTS_LINE}/tmp/out\n"
    )
    assert err == "WARNING :   Client 3: rejected update\n"
    # a log that ends without the results line: the run did not finish its work
    run_id, finished, _ = follow_run_log(iter(lines[:-1]), verbose=False, timeout=None)
    assert run_id == "8052306127553436162" and not finished
    # the results line printed by something else than the ServerApp's last print
    run_id, finished, _ = follow_run_log(
        iter(lines[:1] + [f"x {RESULTS_LINE}\n"]), verbose=False, timeout=None
    )
    assert (run_id, finished) == ("", False)


def test_a_run_that_was_not_started_keeps_flowers_whole_reason():
    """rich wraps Flower's error panel at 80 columns on a pipe: the reason is
    the panel's text joined into one line."""
    from mmfl_flwr.flower_app.launch import flwr_reason, follow_run_log

    lines = [
        "Loading project configuration...\n",
        "╭─ Error ──────────────────────────────────────────────────────────────╮\n",
        "│ Connection to the SuperLink is unavailable. Please check your         │\n",
        "│ connection and 'address' in the SuperLink connection configuration.   │\n",
        "╰───────────────────────────────────────────────────────────────────────╯\n",
        "\n",
    ]
    run_id, finished, before = follow_run_log(iter(lines), verbose=False, timeout=None)
    assert (run_id, finished) == ("", False)
    assert flwr_reason(before) == (
        "Connection to the SuperLink is unavailable. Please check your connection and "
        "'address' in the SuperLink connection configuration."
    )
    assert flwr_reason(["Loading project configuration...", "Error: no such app"]) == (
        "Error: no such app"
    )
    assert flwr_reason([]) == ""


def test_the_run_id_line_is_reported_once():
    from mmfl_flwr.flower_app.launch import follow_run_log

    seen = []
    lines = ["Successfully started run 7\n", "[mmfl] round   1/1\n", "Successfully started run 7\n"]
    assert follow_run_log(iter(lines), False, None, on_started=lambda: seen.append(1))[0] == "7"
    assert seen == [1]


def test_the_servers_last_line_is_the_one_mmfl_run_waits_for():
    """launch.RESULTS_LINE is what server_main prints after writing the results (its
    body is _run_server, run with numpy's BLAS capped)."""
    import inspect

    from mmfl_flwr.flower_app import launch, server_app

    assert "_run_server(" in inspect.getsource(server_app.server_main)
    src = inspect.getsource(server_app._run_server)
    assert 'print(f"' + launch.RESULTS_LINE + "{" in src


@pytest.mark.parametrize("exported", [False, True])
def test_a_local_simulation_shares_its_nodes_data_through_a_directory_removed_after(
    tmp_path, monkeypatch, exported
):
    """`mmfl run --engine simulation` on this machine gives the SuperLink's tree
    (and so the Ray workers) MMFL_SHARED_DATA, a directory of its own that is gone
    once the run ends, however it ends; a directory the user exported is used as
    it is and kept."""
    from mmfl_flwr.config import Settings
    from mmfl_flwr.flower_app import launch as L
    from mmfl_flwr.tasks.federation import SHARED_DATA_ENV

    if exported:
        monkeypatch.setenv(SHARED_DATA_ENV, str(tmp_path))
    else:
        monkeypatch.delenv(SHARED_DATA_ENV, raising=False)
    seen: dict[str, object] = {}

    class FakeProc:
        returncode = 0

        def poll(self):
            return 0

    def popen(cmd, env=None, **kw):
        where = env.get(SHARED_DATA_ENV)
        seen["dir"] = where
        seen["existed"] = where is not None and os.path.isdir(where)
        return FakeProc()

    def not_healthy(*a, **k):
        raise L.SimulationError("stopped by the test")

    monkeypatch.setattr(L.subprocess, "Popen", popen)
    monkeypatch.setattr(L, "_wait_healthy", not_healthy)
    monkeypatch.setattr(L, "_stop", lambda proc: None)
    monkeypatch.setattr(L.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(L.SimulationError, match="stopped by the test"):
        L.run_on_superlink(Settings(num_clients=4), num_cpus=1)
    assert seen["existed"]
    if exported:
        assert seen["dir"] == str(tmp_path) and tmp_path.is_dir()
    else:
        assert str(tmp_path / "tmp") in str(seen["dir"])
        assert not os.path.exists(str(seen["dir"]))


def test_a_cluster_run_gets_no_shared_data_folder(tmp_path, monkeypatch):
    """On a Ray cluster the nodes' workers are on other machines: no folder is
    made and none named to them."""
    from mmfl_flwr.config import Settings
    from mmfl_flwr.flower_app import launch as L
    from mmfl_flwr.tasks.federation import SHARED_DATA_ENV

    monkeypatch.delenv(SHARED_DATA_ENV, raising=False)
    seen: dict[str, object] = {}
    cluster = L.RayPlan(
        address="10.0.0.1:6379", nodes=((4.0, 0.0), (4.0, 0.0)), num_gpus_per_client=0.0, slots=8
    )
    monkeypatch.setattr(L, "plan_ray", lambda *a, **k: cluster)

    def popen(cmd, env=None, **kw):
        seen["env"] = env
        raise L.SimulationError("stopped by the test")

    monkeypatch.setattr(L.subprocess, "Popen", popen)
    monkeypatch.setattr(L.tempfile, "tempdir", str(tmp_path))
    with pytest.raises(L.SimulationError, match="stopped by the test"):
        L.run_on_superlink(Settings(num_clients=4))
    assert SHARED_DATA_ENV not in seen["env"]  # type: ignore[operator]
    assert not list(tmp_path.glob("mmfl-run-*/shared-data"))


def test_a_later_run_removes_the_shared_data_a_killed_run_left(tmp_path):
    """A run killed before its `finally` (SIGKILL, the out-of-memory killer)
    leaves its shared data; the next run removes it where the run's process is
    gone, and leaves a running one's alone."""
    import subprocess
    import sys

    from mmfl_flwr.flower_app.launch import remove_stale_shared_data

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    gone, alive = tmp_path / "mmfl-run-gone", tmp_path / "mmfl-run-alive"
    for run, pid in ((gone, int(dead.stdout)), (alive, os.getpid())):
        (run / "shared-data").mkdir(parents=True)
        (run / "shared-data" / "x.npy").write_bytes(b"0" * 10)
        (run / "owner.pid").write_text(str(pid))
    (tmp_path / "mmfl-run-odd").mkdir()
    (tmp_path / "mmfl-run-odd" / "owner.pid").write_text("not a pid")
    assert remove_stale_shared_data(tmp_path) == [gone / "shared-data"]
    assert not (gone / "shared-data").exists() and not (gone / "owner.pid").exists()
    assert (alive / "shared-data" / "x.npy").exists()
    assert (tmp_path / "mmfl-run-odd" / "owner.pid").exists()
