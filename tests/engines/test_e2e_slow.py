"""Slow end-to-end tests: the real engines, the real Flower CLI, real processes.

1. ``mmfl run`` on Flower's simulation engine (Ray) and on the in-process engine:
   the same seed gives the same assignments and the same metrics.
2. ``flwr run . local``: the repository as a Flower App on the local SuperLink
   (simulation), with a private FLWR_HOME and private ports.

Deployments on loopback (``flower-superlink`` and ``flower-supernode`` processes, runs
submitted with ``flwr run <app> <connection>``) are in ``tests/deploy/``: the insecure
one with a hostile SuperNode, the secured one of docs/deploy.md with this app.

Run them with ``pytest -m slow tests/engines/test_e2e_slow.py``. Each test ends every
process it started (by pid, see ``e2e_utils.ProcessTracker``), also on failure, and
prints how long it took.
"""

from __future__ import annotations

import csv
import json

import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_utils import (
    FAB_MAX_BYTES,
    REPO_ROOT,
    ProcessTracker,
    check_app_pyproject,
    check_outputs,
    default_model_names,
    fab_size_report,
    flower_env,
    flwr_run,
    free_ports,
    new_marker,
    run_logs,
    superlink_pids_on_port,
    tail,
    wait_for_run,
)

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process clean-up reads /proc"),
]

#: Upper bounds (seconds). Measured on 2 cores: ~20 s and ~30 s of work.
CLI_TIMEOUT = 300.0
LOCAL_RUN_TIMEOUT = 300.0


@pytest.fixture
def timer(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Print the wall time of the test (visible with ``-s``)."""
    t0 = time.monotonic()
    yield
    print(f"\n[e2e] {request.node.name} took {time.monotonic() - t0:.1f} s", flush=True)


def _mmfl_run(
    procs: ProcessTracker, env: dict[str, str], cwd: Path, args: list[str]
) -> tuple[int, str]:
    """Run ``python -m mmfl_flwr.cli run ARGS`` with a timeout; return (rc, output)."""
    log = cwd / f"mmfl-{len(procs.procs)}.log"
    proc = procs.popen(
        [sys.executable, "-m", "mmfl_flwr.cli", "run", *args], env=env, cwd=cwd, log_path=log
    )
    try:
        rc = proc.wait(timeout=CLI_TIMEOUT)
    except subprocess.TimeoutExpired:
        procs.cleanup()
        raise AssertionError(
            f"mmfl run {' '.join(args)} did not finish within {CLI_TIMEOUT:.0f} s:\n"
            f"{tail(log)}"
        ) from None
    return rc, log.read_text(errors="replace")


# ---------------------------------------------------------------------------- 1
@pytest.mark.slow
def test_mmfl_run_simulation_engine_matches_inprocess(tmp_path: Path, timer: None) -> None:
    """``mmfl run`` on Ray writes its 4 outputs; the in-process engine agrees."""
    models = default_model_names()
    marker = new_marker()
    env = flower_env(tmp_path / "flwr-home", marker)
    common = ["--num-rounds", "2", "--num-clients", "6"]
    sim_out, inp_out = tmp_path / "sim", tmp_path / "inprocess"
    with ProcessTracker(marker) as procs:
        t0 = time.monotonic()
        rc, out = _mmfl_run(procs, env, tmp_path, [*common, "--output-dir", str(sim_out)])
        t_sim = time.monotonic() - t0
        assert rc == 0, f"mmfl run (simulation) exited with {rc}:\n{out[-6000:]}"
        t0 = time.monotonic()
        rc2, out2 = _mmfl_run(
            procs, env, tmp_path,
            [*common, "--engine", "inprocess", "--output-dir", str(inp_out)],
        )
        t_inp = time.monotonic() - t0
        assert rc2 == 0, f"mmfl run (inprocess) exited with {rc2}:\n{out2[-6000:]}"
    print(f"\n[e2e] mmfl run: simulation engine {t_sim:.1f} s, in-process {t_inp:.1f} s")

    # The simulation engine's outputs and progress lines.
    check_outputs(sim_out, models, num_rounds=2)
    progress = [ln for ln in out.splitlines() if ln.startswith("[mmfl] round")]
    rounds = {int(ln.split()[2].split("/")[0]) for ln in progress}
    assert {1, 2} <= rounds <= {0, 1, 2}, f"progress lines per round:\n{out[-4000:]}"
    # written to a file, not a terminal: no ANSI colour codes (issue 25)
    for text in (out, out2):
        assert "\x1b[" not in text, [ln for ln in text.splitlines() if "\x1b[" in ln][:5]

    # Same seed, same settings: the engines agree on who trained what, and on
    # every number (metrics.csv leaves timings out so that it can be compared).
    check_outputs(inp_out, models, num_rounds=2)
    sim_assign = (sim_out / "assignments.csv").read_text()
    inp_assign = (inp_out / "assignments.csv").read_text()
    assert sim_assign == inp_assign, (
        f"assignments differ between engines:\n--- simulation\n{sim_assign}\n"
        f"--- inprocess\n{inp_assign}"
    )
    # each run records the engine that ran it (mmfl compare lists it when it differs)
    for folder, engine in ((sim_out, "simulation"), (inp_out, "inprocess")):
        assert json.loads((folder / "summary.json").read_text())["engine"] == engine
        assert json.loads((folder / "config.json").read_text())["engine"] == engine
    # `mmfl run` hosts the clients on shard nodes (clients-per-node auto: 3 per node
    # on 2 CPUs) that train them batched, the in-process engine one client per
    # node: the counts agree exactly, the numbers to float32 rounding
    config = json.loads((sim_out / "config.json").read_text())
    assert int(config["clients-per-node"]) > 1, config["clients-per-node"]
    sim_rows = list(csv.DictReader((sim_out / "metrics.csv").open()))
    inp_rows = list(csv.DictReader((inp_out / "metrics.csv").open()))
    assert len(sim_rows) == len(inp_rows) == 3 * len(models)
    for a, b in zip(sim_rows, inp_rows):
        for key in ("round", "task", "uploads", "assigned", "rejected"):
            assert a[key] == b[key], (key, a, b)
        assert abs(float(a["accuracy"]) - float(b["accuracy"])) <= 0.01, (a, b)
        for key in ("loss", "train_loss", "step_l1", "round_step_l1", "coef_sum"):
            if a[key] or b[key]:
                assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-4, abs=1e-6), \
                    (key, a, b)


# ---------------------------------------------------------------------------- 2
@pytest.mark.slow
def test_flwr_run_local_simulation(tmp_path: Path, timer: None) -> None:
    """``flwr run . local`` runs the repository's Flower App to ``finished:completed``."""
    models = default_model_names()
    check_app_pyproject(REPO_ROOT)
    size, largest = fab_size_report(REPO_ROOT)
    assert size < FAB_MAX_BYTES, f"the FAB would be {size} bytes; largest files {largest}"

    http_port, control_port = free_ports(2)
    home = tmp_path / "flwr-home"
    marker = new_marker()
    env = flower_env(
        home,
        marker,
        {
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
            "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        },
    )
    out = tmp_path / "out"
    superlink_log = home / "local-superlink" / "superlink.log"
    with ProcessTracker(marker) as procs:
        procs.watch_superlink_port(http_port)  # the detached local SuperLink
        run_id = flwr_run(
            ".", "local", env=env, cwd=REPO_ROOT,
            run_config=f"num-rounds=2 num-clients=4 output-dir='{out.as_posix()}'",
            federation_config="num-supernodes=4 client-resources-num-cpus=1",
        )
        assert superlink_pids_on_port(http_port), (
            f"no local SuperLink on the private port {http_port}"
        )
        status, details, history = wait_for_run(
            run_id, "local", env=env, cwd=REPO_ROOT, timeout=LOCAL_RUN_TIMEOUT,
            interval=1.0, done_file=out / "summary.json",
        )
        print(f"\n[e2e] flwr run . local: run {run_id} statuses {history}")
        if status != "finished:completed":
            logs = run_logs(run_id, "local", env=env, cwd=REPO_ROOT)
            pytest.fail(
                f"run {run_id} ended as {status!r} ({details}); statuses {history}\n"
                f"--- flwr log ---\n{logs}\n--- superlink.log ---\n{tail(superlink_log)}"
            )
    assert not procs.leftovers, f"processes survived clean-up: {procs.leftovers}"

    data = check_outputs(out, models, num_rounds=2)
    config = data["summary"]["config"]
    assert (config["num-rounds"], config["num-clients"]) == (2, 4), config
    clients = {a["client"] for a in data["assignments"]}
    assert clients <= {"0", "1", "2", "3"}, clients
