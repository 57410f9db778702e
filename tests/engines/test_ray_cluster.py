"""``mmfl run --ray-address``: the simulation engine on an existing Ray cluster of
two nodes (issue #14, item 3).

The test starts the cluster itself on this machine, the way a user starts one
on several: ``ray start --head`` and ``ray start --address=HEAD`` (a second node,
as Ray's own multi-node-on-one-machine tests do), each with one CPU. Then
``mmfl run --engine simulation --ray-address 127.0.0.1:PORT`` runs 4 clients for
2 rounds; Flower's Ray backend must place its two ClientApp actors (one CPU
each) on both nodes, which the test reads back from Ray's actor table.
``--ray-address auto`` must find the same cluster.

Isolation: the cluster has its own Ray temp dir (``RAY_TMPDIR``, so ``auto`` and
``ray_current_cluster`` see this cluster only) and free ports chosen at run time
for every Ray service; every process it starts carries the test's marker and is
ended by process id (``e2e_utils.ProcessTracker``), never by ``ray stop``, which
would stop every Ray instance of the machine. Ray maps 127.0.0.1 to the
machine's own address (``resolve_ip_for_localhost``), so nothing leaves it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from e2e_utils import (
    VENV_BIN,
    ProcessTracker,
    check_outputs,
    describe,
    flower_env,
    free_ports,
    new_marker,
    run_cmd,
    tail,
)

from mmfl_flwr.flower_app.launch import plan_ray
from mmfl_flwr.tasks.federation import task_names

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="clean-up reads /proc"),
    pytest.mark.skipif(not (VENV_BIN / "ray").exists(), reason="needs ray (flwr[simulation])"),
]

#: Upper bounds (seconds). Measured on 2 cores: ~10 s per `ray start`, ~50 s for the run.
RAY_START_TIMEOUT = 180.0
RUN_TIMEOUT = 420.0
TASKS = "digits,synthetic"

#: A driver that prints, per ClientApp actor class, the ids of the nodes its
#: actors ran on (Ray keeps dead actors in its table).
ACTOR_NODES = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import ray
from ray._private import state
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
nodes = sorted({a["Address"]["NodeID"] for a in state.actors().values()
                if a.get("ActorClassName", "").endswith("ClientAppActor")})
print("NODES " + json.dumps(nodes), flush=True)
ray.shutdown()
"""


def _ray_start(env: dict[str, str], args: list[str]) -> None:
    """``ray start ARGS`` with its own free ports for every service of the node."""
    ports = free_ports(5)
    cmd = [
        str(VENV_BIN / "ray"),
        "start",
        *args,
        "--node-ip-address=127.0.0.1",
        "--num-cpus=1",
        "--num-gpus=0",
        "--object-store-memory=100000000",
        "--disable-usage-stats",
        f"--node-manager-port={ports[0]}",
        f"--object-manager-port={ports[1]}",
        f"--dashboard-agent-listen-port={ports[2]}",
        f"--dashboard-agent-grpc-port={ports[3]}",
        f"--metrics-export-port={ports[4]}",
    ]
    res = run_cmd(cmd, env=env, timeout=RAY_START_TIMEOUT)
    assert res.returncode == 0, f"ray start failed:\n{describe(res)}"


def test_mmfl_run_on_a_two_node_ray_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0 = time.monotonic()
    marker = new_marker()
    # Short: Ray's socket paths live below it (a Unix socket path has <= 107 bytes).
    ray_tmp = Path(tempfile.mkdtemp(prefix="mmfl-ray-", dir="/tmp"))
    env = flower_env(
        tmp_path / "home",
        marker,
        {
            "RAY_TMPDIR": str(ray_tmp),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        },
    )
    gcs_port, client_port, dashboard_port = free_ports(3)
    address = f"127.0.0.1:{gcs_port}"
    out = tmp_path / "out"
    try:
        with ProcessTracker(marker) as procs:
            _ray_start(
                env,
                [
                    "--head",
                    f"--port={gcs_port}",
                    "--include-dashboard=false",
                    f"--ray-client-server-port={client_port}",
                    f"--dashboard-port={dashboard_port}",
                ],
            )
            _ray_start(env, [f"--address={address}"])
            t_cluster = time.monotonic() - t0

            # The check mmfl run makes first sees both nodes; auto finds this cluster.
            plan = plan_ray(0.0, address)
            assert len(plan.nodes) == 2 and plan.slots == 2, plan
            monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp))
            assert plan_ray(0.0, "auto").address == plan.address

            t1 = time.monotonic()
            log = tmp_path / "mmfl.log"
            proc = procs.popen(
                [
                    sys.executable,
                    "-m",
                    "mmfl_flwr.cli",
                    "run",
                    "--engine",
                    "simulation",
                    "--ray-address",
                    address,
                    "--num-clients",
                    "4",
                    "--num-rounds",
                    "2",
                    "--local-epochs",
                    "1",
                    "--tasks",
                    TASKS,
                    "--output-dir",
                    str(out),
                ],
                env=env,
                cwd=tmp_path,
                log_path=log,
            )
            try:
                rc = proc.wait(timeout=RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"mmfl run did not finish in {RUN_TIMEOUT:.0f} s:\n{tail(log)}"
                ) from None
            t_run = time.monotonic() - t1
            text = log.read_text(errors="replace")
            assert rc == 0, f"mmfl run --ray-address exited with {rc}:\n{text[-6000:]}"
            assert f"[mmfl] Ray cluster at {plan.address}: 2 nodes, 2 CPUs" in text, text[-4000:]
            assert "up to 2 clients at a time" in text, text[-4000:]

            # Flower's actor pool ran on the cluster: its actors on both nodes.
            res = run_cmd([sys.executable, "-c", ACTOR_NODES, address], env=env, timeout=120)
            found = [ln[6:] for ln in res.stdout.splitlines() if ln.startswith("NODES ")]
            assert found, f"reading Ray's actor table failed:\n{describe(res)}"
            assert len(json.loads(found[-1])) == 2, (
                f"ClientApp actors did not run on both nodes: {found[-1]}\n{text[-3000:]}"
            )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    check_outputs(out, task_names(TASKS.split(",")), num_rounds=2)
    print(
        f"\n[ray-cluster] cluster up {t_cluster:.1f} s, mmfl run {t_run:.1f} s, "
        f"test {time.monotonic() - t0:.1f} s"
    )
