"""A hostile SuperNode on a real deployment (issue 12): one ``flower-superlink``
and three ``flower-supernode`` processes on 127.0.0.1 run the test app in
``tests/hostile_app`` (mmfl-flwr's ServerApp and ClientApp; the SuperNode whose
node config says ``hostile="huge-weights"`` returns 1e30 in every weight it
trains). The default update-norm bound rejects each of its updates, the
ServerApp's log names the client, and the models stay finite and learn from
the two honest clients."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest
from e2e_utils import (
    REPO_ROOT,
    ProcessTracker,
    check_outputs,
    flower_env,
    flower_exe,
    flwr_run,
    free_ports,
    new_marker,
    run_logs,
    tail,
    wait_for_http_health,
    wait_for_online_nodes,
    wait_for_run,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process clean-up reads /proc"
)

APP = REPO_ROOT / "tests" / "hostile_app"
HOSTILE = 1
NUM_NODES = 3
ROUNDS = 2
TASKS = "digits,synthetic"


@pytest.mark.slow
def test_hostile_supernode_is_rejected_on_a_loopback_deployment(tmp_path: Path) -> None:
    from mmfl_flwr.tasks.federation import task_names

    models = task_names(TASKS.split(","))
    link_port, *node_ports = free_ports(1 + NUM_NODES)
    marker = new_marker()
    cli_env = flower_env(tmp_path / "cli-home", marker)
    conn = "hostile"
    (tmp_path / "cli-home" / "config.toml").write_text(
        f'[superlink]\ndefault = "{conn}"\n\n'
        f'[superlink.{conn}]\naddress = "127.0.0.1:{link_port}"\ninsecure = true\n'
    )
    out = tmp_path / "out"
    link_log = tmp_path / "superlink.log"
    node_logs = [tmp_path / f"supernode-{i}.log" for i in range(NUM_NODES)]

    def logs() -> str:
        return f"--- superlink ---\n{tail(link_log)}" + "".join(
            f"\n--- {p.name} ---\n{tail(p)}" for p in node_logs)

    with ProcessTracker(marker) as procs:
        link = procs.popen(
            [flower_exe("flower-superlink"), "--insecure", "--host", "127.0.0.1",
             "--port", str(link_port), "--database", ":flwr-in-memory:"],
            env=flower_env(tmp_path / "link-home", marker), cwd=tmp_path, log_path=link_log,
        )
        procs.watch_superlink_port(link_port)
        try:
            wait_for_http_health(link_port, timeout=60, proc=link)
        except AssertionError as err:
            pytest.fail(f"{err}\n{logs()}")
        for i, (port, log) in enumerate(zip(node_ports, node_logs)):
            cfg = f"partition-id={i} num-partitions={NUM_NODES} processors=1"
            if i == HOSTILE:
                cfg += ' hostile="huge-weights"'
            procs.popen(
                [flower_exe("flower-supernode"), "--insecure",
                 "--superlink", f"127.0.0.1:{link_port}", "--port", str(port),
                 "--node-config", cfg],
                env=flower_env(tmp_path / f"node{i}-home", marker), cwd=tmp_path, log_path=log,
            )
        try:
            wait_for_online_nodes(NUM_NODES, conn, env=cli_env, cwd=tmp_path, timeout=90)
        except AssertionError as err:
            pytest.fail(f"{err}\n{logs()}")
        run_id = flwr_run(
            APP, conn, env=cli_env, cwd=tmp_path,
            run_config=(f"num-rounds={ROUNDS} num-clients={NUM_NODES} strategy='mfa-rr' "
                        f"tasks='{TASKS}' local-epochs=1 output-dir='{out.as_posix()}'"),
        )
        t0 = time.monotonic()
        status, details, history = wait_for_run(run_id, conn, env=cli_env, cwd=tmp_path,
                                                timeout=360.0, interval=3.0)
        server_log = run_logs(run_id, conn, env=cli_env, cwd=tmp_path)
        print(f"\n[e2e] hostile deployment: run {run_id} {status} after "
              f"{time.monotonic() - t0:.0f} s")
        if status != "finished:completed":
            pytest.fail(f"run {run_id} ended as {status!r} ({details}); statuses {history}\n"
                        f"--- flwr log ---\n{server_log}\n{logs()}")
    assert not procs.leftovers, f"processes survived clean-up: {procs.leftovers}"

    data = check_outputs(out, models, num_rounds=ROUNDS)  # finite accuracy and loss
    # MFA-RR with K = all clients: the hostile client trains one model per round,
    # and exactly that update is rejected
    for rnd in range(1, ROUNDS + 1):
        rows = [r for r in data["metrics"] if int(r["round"]) == rnd]
        assert sum(int(r["rejected"]) for r in rows) == 1, rows
        assert sum(int(r["uploads"]) for r in rows) == NUM_NODES - 1, rows
    trained = {(a["round"], a["client"]) for a in data["assignments"]}
    assert {(str(r), str(HOSTILE)) for r in range(1, ROUNDS + 1)} <= trained
    named = [line for line in server_log.splitlines()
             if f"Client {HOSTILE}: rejected update" in line and "update norm" in line]
    assert len(named) == ROUNDS, server_log
    final = data["summary"]["final_accuracy"]
    assert all(math.isfinite(float(v)) for v in final.values()), final
