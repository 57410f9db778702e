"""The insecure deployment, with a hostile SuperNode (issue 12): one
``flower-superlink`` and three ``flower-supernode`` processes on 127.0.0.1
(``e2e_utils.Deployment``) run ``mfa-rr`` to completion with the test app in
``tests/hostile_app`` (mmfl-flwr's ServerApp and ClientApp; the SuperNode whose
node config says ``hostile="huge-weights"`` returns 1e30 in every weight it
trains). The default update-norm bound rejects each of its updates, the
ServerApp's log names the client, and the models stay finite and learn from
the two honest clients. (The secured deployment of docs/deploy.md, with this
repository's own app, is ``test_deploy_tls.py``.)"""

from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path

import pytest
from e2e_utils import REPO_ROOT, Deployment, ProcessTracker, check_outputs, new_marker

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process clean-up reads /proc"
)

APP = REPO_ROOT / "tests" / "hostile_app"
HOSTILE = 1
NUM_NODES = 3
ROUNDS = 1
TASKS = "digits,synthetic"


@pytest.mark.slow
def test_hostile_supernode_is_rejected_on_a_loopback_deployment(tmp_path: Path) -> None:
    from mmfl_flwr.tasks.federation import task_names

    models = task_names(TASKS.split(","))
    marker = new_marker()
    out = tmp_path / "out"
    configs = [
        f"partition-id={i} num-partitions={NUM_NODES} processors=1"
        + (' hostile="huge-weights"' if i == HOSTILE else "")
        for i in range(NUM_NODES)
    ]
    with ProcessTracker(marker) as procs:
        t0 = time.monotonic()
        dep = Deployment.start_insecure(procs, tmp_path, marker, configs, conn="hostile")
        t_up = time.monotonic() - t0
        run_id, server_log, history = dep.run(
            APP,
            out=out,
            run_config=(
                f"num-rounds={ROUNDS} num-clients={NUM_NODES} strategy='mfa-rr' "
                f"tasks='{TASKS}' local-epochs=1 output-dir='{out.as_posix()}'"
            ),
        )
        print(
            f"\n[e2e] hostile deployment: federation up in {t_up:.1f} s; run {run_id} "
            f"statuses {history}"
        )
    assert not procs.leftovers, f"processes survived clean-up: {procs.leftovers}"

    data = check_outputs(out, models, num_rounds=ROUNDS)  # finite accuracy and loss
    config = data["summary"]["config"]
    assert (config["strategy"], config["num-clients"]) == ("mfa-rr", NUM_NODES), config
    # MFA-RR with K = all clients: every client trains in every round
    for rnd in range(1, ROUNDS + 1):
        got = {a["client"] for a in data["assignments"] if int(a["round"]) == rnd}
        assert got == {str(i) for i in range(NUM_NODES)}, f"round {rnd}: clients {got}"
    # MFA-RR with K = all clients: the hostile client trains one model per round,
    # and exactly that update is rejected
    for rnd in range(1, ROUNDS + 1):
        rows = [r for r in data["metrics"] if int(r["round"]) == rnd]
        assert sum(int(r["rejected"]) for r in rows) == 1, rows
        assert sum(int(r["uploads"]) for r in rows) == NUM_NODES - 1, rows
    trained = {(a["round"], a["client"]) for a in data["assignments"]}
    assert {(str(r), str(HOSTILE)) for r in range(1, ROUNDS + 1)} <= trained
    # each rejection is a defence event (its line is at DEBUG since issue 57): named
    # with the client and its update norm in events.csv
    with open(out / "events.csv", newline="") as f:
        named = [
            r
            for r in csv.DictReader(f)
            if r["client"] == str(HOSTILE)
            and r["kind"] == "rejected"
            and r["reason"].startswith("rejected update")
            and "update norm" in r["reason"]
        ]
    assert len(named) == ROUNDS, named
    final = data["summary"]["final_accuracy"]
    assert all(math.isfinite(float(v)) for v in final.values()), final
