"""Slow end-to-end test of the secured deployment of docs/deploy.md, without Docker.

The topology of ``docker/compose.yaml`` as plain processes on 127.0.0.1:

- certificates and SuperNode keys made by ``docker/gen-certs.sh``;
- one ``flower-superlink`` with TLS and SuperNode authentication;
- three SuperNode public keys registered with ``flwr supernode register`` over a
  connection that trusts the private CA (``root-certificates`` in config.toml);
- three ``flower-supernode`` with their own keys and different node-configs:
  two GPU-server-like SuperNodes hosting a shard of 20 clients each
  (``clients="0-19"``, ``clients="20-39"``; docs/protocol.md, multi-client
  nodes) and one device hosting one client (``partition-id=40``), with
  processors and task subsets; client ids pinned to the node keys on first use
  (``client-pins="*=key:first-use"``);
- ``flwr run <repo> <connection>`` with the ``lvr`` strategy (it needs the loss
  query every round), polled to ``finished:completed``; the per-task results
  and the task subsets are checked in the output files;
- a SuperNode with an unregistered key and one with no key at all are refused:
  both exit by themselves and never join the federation.

Run with ``pytest -m slow tests/deploy/test_deploy_tls.py -s``. Every process is ended
by pid (``e2e_utils.ProcessTracker``), also on failure; FLWR_HOME and ports are
private to the test.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from e2e_utils import (
    REPO_ROOT,
    Deployment,
    ProcessTracker,
    check_app_pyproject,
    check_outputs,
    default_model_names,
    describe,
    flower_env,
    flower_exe,
    free_ports,
    new_marker,
    parse_json_output,
    run_cmd,
    tail,
    wait_for_online_nodes,
)

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process clean-up reads /proc"),
    pytest.mark.skipif(
        shutil.which("openssl") is None or shutil.which("ssh-keygen") is None,
        reason="docker/gen-certs.sh needs openssl and ssh-keygen",
    ),
]

GEN_CERTS = REPO_ROOT / "docker" / "gen-certs.sh"

#: Upper bounds (seconds).
LINK_UP_TIMEOUT = 60.0
NODES_UP_TIMEOUT = 90.0
RUN_TIMEOUT = 360.0
REFUSED_TIMEOUT = 30.0

#: The three SuperNodes: two shards of 20 clients and one single client; node 1
#: and node 2 train subsets.
NUM_CLIENTS = 41
NODE_CONFIGS = (
    "clients='0-19' processors=2",
    "clients='20-39' processors=1 tasks='digits,synthetic'",
    f"partition-id=40 num-partitions={NUM_CLIENTS} processors=1 tasks='digits'",
)
SHARD_OF = {str(c): (0 if c < 20 else 1 if c < 40 else 2) for c in range(NUM_CLIENTS)}


def _wait_for_https_health(
    port: int, cafile: Path, timeout: float, proc: subprocess.Popen[bytes]
) -> None:
    """Wait until ``https://127.0.0.1:<port>/health`` answers 2xx with a certificate
    that the private CA vouches for (also checks the SAN 127.0.0.1)."""
    ctx = ssl.create_default_context(cafile=str(cafile))
    url = f"https://127.0.0.1:{port}/health"
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the SuperLink exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2.0, context=ctx) as resp:
                if 200 <= resp.status < 300:
                    return
        except (urllib.error.URLError, OSError) as err:
            last = err
        time.sleep(0.3)
    raise AssertionError(f"{url} did not come up within {timeout:.0f} s (last: {last!r})")


def _node_list(conn: str, env: dict[str, str], cwd: Path) -> list[dict[str, object]]:
    res = run_cmd(
        [flower_exe("flwr"), "supernode", "list", conn, "--format", "json"],
        env=env,
        cwd=cwd,
        timeout=60,
    )
    try:
        return list(parse_json_output(res.stdout).get("nodes") or [])
    except ValueError as err:
        raise AssertionError(f"flwr supernode list printed no JSON:\n{describe(res)}") from err


@pytest.mark.slow
def test_tls_auth_deployment_two_shards_and_a_device(tmp_path: Path) -> None:
    t_start = time.monotonic()
    phases: dict[str, float] = {}
    models = default_model_names()
    check_app_pyproject(REPO_ROOT)
    assert {"digits", "synthetic", "digits_2"} <= set(models), models

    # 1. Certificates: a CA, the SuperLink's certificate, 4 SuperNode key pairs
    #    (supernode-3 is never registered).
    certs = tmp_path / "certs"
    res = run_cmd(
        ["bash", str(GEN_CERTS), "-o", str(certs), "-n", "4", "-H", "127.0.0.1"],
        env=flower_env(tmp_path / "gen-home", new_marker()),
        cwd=tmp_path,
        timeout=60,
    )
    assert res.returncode == 0, describe(res)
    for name in (
        "ca.crt",
        "server.pem",
        "server.key",
        *(f"supernode-{i}{ext}" for i in range(4) for ext in ("", ".pub")),
    ):
        assert (certs / name).is_file(), f"gen-certs.sh did not write {name}"
    ca, cert, key = certs / "ca.crt", certs / "server.pem", certs / "server.key"

    link_port, *node_ports = free_ports(6)
    marker = new_marker()
    conn = "mmfl-tls"
    cli_home = tmp_path / "cli-home"
    cli_env = flower_env(cli_home, marker)
    (cli_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{conn}"\n\n'
        f'[superlink.{conn}]\naddress = "127.0.0.1:{link_port}"\n'
        f'root-certificates = "{ca.resolve().as_posix()}"\n'
    )
    out = tmp_path / "out"
    state_db = tmp_path / "state" / "state.db"  # as in docs/deploy.md (sqlite)
    state_db.parent.mkdir()
    link_log = tmp_path / "superlink.log"
    node_logs = [tmp_path / f"supernode-{i}.log" for i in range(5)]

    def logs(*paths: Path) -> str:
        return "".join(f"\n--- {p.name} ---\n{tail(p)}" for p in paths)

    with ProcessTracker(marker) as procs:
        # 2. The SuperLink: TLS on its one port, SuperNode authentication on
        #    (docs/deploy.md A3, on 127.0.0.1 instead of 0.0.0.0).
        t0 = time.monotonic()
        link = procs.popen(
            [
                flower_exe("flower-superlink"),
                "--ssl-ca-certfile",
                str(ca),
                "--ssl-certfile",
                str(cert),
                "--ssl-keyfile",
                str(key),
                "--enable-supernode-auth",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
                "--database",
                str(state_db),
            ],
            env=flower_env(tmp_path / "link-home", marker),
            cwd=tmp_path,
            log_path=link_log,
        )
        procs.watch_superlink_port(link_port)
        try:
            _wait_for_https_health(link_port, ca, LINK_UP_TIMEOUT, link)
        except AssertionError as err:
            pytest.fail(f"{err}{logs(link_log)}")
        phases["superlink up"] = time.monotonic() - t0

        # 3. Register the public keys of supernode-0..2 (over TLS, CA from config.toml).
        t0 = time.monotonic()
        registered: dict[str, int] = {}
        for i in range(3):
            res = run_cmd(
                [
                    flower_exe("flwr"),
                    "supernode",
                    "register",
                    str(certs / f"supernode-{i}.pub"),
                    conn,
                    "--name",
                    f"device-{i}",
                    "--format",
                    "json",
                ],
                env=cli_env,
                cwd=tmp_path,
                timeout=60,
            )
            assert res.returncode == 0, f"{describe(res)}{logs(link_log)}"
            payload = parse_json_output(res.stdout)
            assert payload.get("success") and payload.get("node-id"), describe(res)
            registered[str(payload["node-id"])] = i
        nodes = _node_list(conn, cli_env, tmp_path)
        assert {str(n["node-id"]) for n in nodes} == set(registered), nodes
        assert {n["status"] for n in nodes} == {"registered"}, nodes
        phases["registration"] = time.monotonic() - t0

        # 4. Three SuperNodes: TLS to the SuperLink, each with its own private key.
        t0 = time.monotonic()
        for i, node_config in enumerate(NODE_CONFIGS):
            procs.popen(
                [
                    flower_exe("flower-supernode"),
                    "--superlink",
                    f"127.0.0.1:{link_port}",
                    "--root-certificates",
                    str(ca),
                    "--auth-supernode-private-key",
                    str(certs / f"supernode-{i}"),
                    "--port",
                    str(node_ports[i]),
                    "--node-config",
                    node_config,
                ],
                env=flower_env(tmp_path / f"node{i}-home", marker),
                cwd=tmp_path,
                log_path=node_logs[i],
            )
        try:
            online = wait_for_online_nodes(
                3, conn, env=cli_env, cwd=tmp_path, timeout=NODES_UP_TIMEOUT
            )
        except AssertionError as err:
            pytest.fail(f"{err}{logs(link_log, *node_logs[:3])}")
        assert {str(n["node-id"]) for n in online} == set(registered), online
        phases["supernodes online"] = time.monotonic() - t0

        # 5. Intruders: supernode-3's key was never registered; node 4 has no key.
        #    They start now and are checked after the run (they must have exited).
        intruders = []
        for i, key_args in (
            (3, ["--auth-supernode-private-key", str(certs / "supernode-3")]),
            (4, []),
        ):
            intruders.append(
                procs.popen(
                    [
                        flower_exe("flower-supernode"),
                        "--superlink",
                        f"127.0.0.1:{link_port}",
                        "--root-certificates",
                        str(ca),
                        *key_args,
                        "--port",
                        str(node_ports[i]),
                        "--max-retries",
                        "2",
                        "--node-config",
                        "partition-id=2 num-partitions=3",
                    ],
                    env=flower_env(tmp_path / f"node{i}-home", marker),
                    cwd=tmp_path,
                    log_path=node_logs[i],
                )
            )
        t_intruders = time.monotonic()

        # 6. The run: LVR (a loss query before training), 1 round (rounds that follow
        #    each other on a deployment: test_deploy_hostile.py), half the processors.
        t0 = time.monotonic()
        dep = Deployment(tmp_path, conn, cli_env, link_log, node_logs)
        run_id, _, history = dep.run(
            REPO_ROOT,
            out=out,
            timeout=RUN_TIMEOUT,
            run_config=(
                f"num-rounds=1 num-clients={NUM_CLIENTS} strategy='lvr' budget-fraction=0.5 "
                "local-epochs=1 client-pins='*=key:first-use' "
                f"output-dir='{out.resolve().as_posix()}'"
            ),
        )
        phases["run"] = time.monotonic() - t0
        print(f"\n[e2e] TLS deployment: run {run_id} statuses {history}")

        # 7. The intruders were refused: each exited by itself with an error, and
        #    the federation is still exactly the three registered nodes.
        for i, proc in zip((3, 4), intruders):
            remaining = REFUSED_TIMEOUT - (time.monotonic() - t_intruders)
            try:
                rc = proc.wait(timeout=max(remaining, 1.0))
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"supernode-{i} (not registered) still runs after "
                    f"{REFUSED_TIMEOUT:.0f} s{logs(node_logs[i])}"
                )
            assert rc != 0, f"supernode-{i} exited with 0{logs(node_logs[i])}"
            print(
                f"[e2e] supernode-{i} refused: exit code {rc}; "
                + " | ".join(
                    ln.strip()
                    for ln in tail(node_logs[i]).splitlines()
                    if "Exit Code" in ln or "activate" in ln.lower() or "register" in ln.lower()
                )[:300]
            )
        nodes = _node_list(conn, cli_env, tmp_path)
        assert {str(n["node-id"]) for n in nodes} == set(registered), (
            f"an unregistered SuperNode joined: {nodes}"
        )
        assert sum(n["status"] == "online" for n in nodes) == 3, nodes
        link_text = link_log.read_text(errors="replace")
        assert "No SuperNode found with the given public key" in link_text or (
            "activate-node" in link_text and " 412" in link_text
        ), f"the SuperLink did not log the refused activation{logs(link_log)}"
    assert not procs.leftovers, f"processes survived clean-up: {procs.leftovers}"

    # 8. The results: every model evaluated after rounds 0 and 1; task subsets held.
    data = check_outputs(out, models, num_rounds=1)
    config = data["summary"]["config"]
    assert (config["strategy"], config["num-clients"]) == ("lvr", NUM_CLIENTS), config
    assignments = data["assignments"]
    clients = {a["client"] for a in assignments}
    assert clients <= set(SHARD_OF), clients
    # clients of both shards trained (the loss query and the training went
    # through one message per shard node)
    assert {SHARD_OF[c] for c in clients} >= {0, 1}, clients
    by_client = {c: {a["task"] for a in assignments if a["client"] == c} for c in clients}
    for c, tasks in by_client.items():
        allowed = ({"digits", "synthetic", "digits_2"}, {"digits", "synthetic"}, {"digits"})[
            SHARD_OF[c]
        ]
        assert tasks <= allowed, f"client {c} trained {tasks}"
    # processors=2/1/1: a client's processors draw at most that many tasks a round.
    processors = {c: (2, 1, 1)[SHARD_OF[c]] for c in SHARD_OF}
    for rnd in (1,):
        rows = [a for a in assignments if int(a["round"]) == rnd]
        assert rows, f"nobody trained in round {rnd}: {assignments}"
        for c, b in processors.items():
            used = sum(int(a["count"]) for a in rows if a["client"] == c)
            assert used <= b, f"round {rnd}: client {c} used {used} > {b} processors"
    total = time.monotonic() - t_start
    print(f"[e2e] assignments per client: {by_client}")
    print(
        "[e2e] phases: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
        + f"; total {total:.1f} s"
    )
