"""``clients-per-node`` (issue 24, item 4): how many clients a Flower node hosts,
``auto`` resolved from what Ray sees, partition ids mapped to client ranges, and
values that make no sense refused in one line (exit code 2 for the CLI)."""

from __future__ import annotations

import pytest
from flwr.app import Context, RecordDict

from mmfl_flwr.cli import main as cli_main
from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app.client_app import client_spec, clients_per_node
from mmfl_flwr.flower_app.launch import RayPlan, plan_ray, resolve_clients_per_node
from mmfl_flwr.runner import node_configs


def _plan(slots, gpus=0.0):
    return RayPlan(
        address=None, nodes=((float(slots), 0.0),), num_gpus_per_client=gpus, slots=slots
    )


@pytest.mark.parametrize(
    "n,slots,k", [(1000, 2, 500), (1000, 16, 63), (120, 2, 60), (3, 16, 1), (1, 2, 1), (7, 2, 4)]
)
def test_auto_puts_one_node_on_each_worker_ray_sees(n, slots, k):
    got, why = resolve_clients_per_node(Settings(num_clients=n), _plan(slots))
    assert got == k and "auto" in why
    nodes = -(-n // k)
    assert nodes <= slots and (nodes - 1) * k < n <= nodes * k


def test_an_explicit_value_is_kept_and_a_per_client_gpu_share_means_one_client_per_node():
    assert (
        resolve_clients_per_node(Settings(num_clients=10, clients_per_node="4"), _plan(2))[0] == 4
    )
    assert (
        resolve_clients_per_node(Settings(num_clients=10, clients_per_node="40"), _plan(2))[0] == 10
    )
    assert (
        resolve_clients_per_node(Settings(num_clients=10), _plan(2), per_client_gpus=True)[0] == 1
    )
    with pytest.raises(ValueError, match="give each node's share with --num-gpus-per-node"):
        resolve_clients_per_node(
            Settings(num_clients=10, clients_per_node="4"), _plan(2), per_client_gpus=True
        )


def test_the_two_gpu_flags_exclude_each_other():
    with pytest.raises(ValueError, match="exclude each other"):
        plan_ray(0.5, None, None, num_gpus_per_node=1.0)
    with pytest.raises(ValueError, match="--num-gpus-per-node 1.5: must be in"):
        plan_ray(0.0, None, None, num_gpus_per_node=1.5)


def _ctx(**node_config):
    return Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config={})


def test_a_partition_hosts_its_range_of_clients():
    s = Settings(num_clients=10, tasks="synthetic", clients_per_node="4")
    ids = [[c.client_id for c in client_spec(_ctx(**{"partition-id": p}), s)] for p in range(3)]
    assert ids == [["0", "1", "2", "3"], ["4", "5", "6", "7"], ["8", "9"]]
    # auto: from num-partitions, as Flower's simulation engine numbers its nodes
    auto = Settings(num_clients=10, tasks="synthetic")
    assert clients_per_node(auto, {"partition-id": 0, "num-partitions": 3}) == 4
    assert clients_per_node(auto, {"partition-id": 0, "num-partitions": 10}) == 1
    assert clients_per_node(auto, {"partition-id": 0}) == 1
    one = client_spec(_ctx(**{"partition-id": 7, "num-partitions": 10}), auto)
    assert one.client_id == "7"  # one client per node: today's single-client node


def test_the_node_configs_of_the_in_process_engines():
    s = Settings(num_clients=10, clients_per_node="4")
    assert node_configs(s) == [{"partition-id": p, "num-partitions": 3} for p in range(3)]
    assert len(node_configs(Settings(num_clients=10))) == 10
    assert node_configs(Settings(num_clients=10), "vectorized") == [
        {"partition-id": 0, "num-partitions": 1}
    ]


@pytest.mark.parametrize(
    "node_config,words",
    [
        (
            {"partition-id": 3},
            "partition-id=3 hosts no client: with clients-per-node=4 the "
            "federation of num-clients=10 needs partition ids 0 to 2",
        ),
        ({"partition-id": 0, "client-id": "x"}, "has 'client-id', but partition-id=0 hosts 4"),
        ({"partition-id": 0, "num-partitions": "two"}, None),
    ],
)
def test_a_partition_outside_the_shards_is_one_line(node_config, words):
    s = Settings(
        num_clients=10, tasks="synthetic", clients_per_node="auto" if words is None else "4"
    )
    with pytest.raises(ValueError) as err:
        client_spec(_ctx(**node_config), s)
    text = str(err.value)
    assert "\n" not in text and (words is None and "num-partitions='two'" in text or words in text)


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "many", ""])
def test_a_clients_per_node_below_one_or_not_a_number_is_exit_2(value, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as err:
        cli_main(
            ["run", "--engine", "inprocess", "--clients-per-node", value, "--output-dir", str(out)]
        )
    assert err.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "clients-per-node" in lines[0] and "Traceback" not in lines[0]
    assert not out.exists()


def test_the_cli_runs_shard_nodes_in_process(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        cli_main(
            [
                "run",
                "--engine",
                "inprocess",
                "--clients-per-node",
                "3",
                "--num-clients",
                "5",
                "--num-rounds",
                "1",
                "--local-epochs",
                "1",
                "--tasks",
                "synthetic",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    import json

    config = json.loads((out / "config.json").read_text())
    assert config["clients-per-node"] == "3"


@pytest.mark.parametrize("engine, expected", [("inprocess", 1), ("vectorized", 6)])
def test_config_json_records_the_clients_per_node_auto_used(engine, expected, tmp_path):
    """Issue 62: the clients-per-node that auto chose was only on the console;
    config.json's ``effective`` now records it (and summary.json's)."""
    import json

    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run

    s = Settings(tasks="synthetic", num_clients=6, num_rounds=1, local_epochs=1)
    s.output_dir = str(tmp_path)
    run(s, engine=engine)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["clients-per-node"] == "auto"  # as typed
    assert config["effective"]["clients-per-node"] == expected
    assert json.loads((tmp_path / "summary.json").read_text())["effective"] == config["effective"]


def test_the_simulation_launcher_passes_the_clients_per_node_it_chose(tmp_path):
    """mmfl run's simulation engine picks K for auto (one node per CPU Ray
    sees); the ServerApp records what the launcher passes it."""
    from mmfl_flwr.config import Settings
    from mmfl_flwr.flower_app.launch import launched_run_config
    from mmfl_flwr.flower_app.server_app import effective_clients_per_node

    s = Settings(num_clients=20)
    config = launched_run_config(s, tmp_path / "out", clients_per_node=10)
    assert config["clients-per-node"] == "auto"
    again = Settings.from_run_config(config)
    assert effective_clients_per_node(again, "simulation", config) == {"clients-per-node": 10}
    # a number typed is not automatic: nothing to record
    s = Settings(num_clients=20, clients_per_node="4")
    config = launched_run_config(s, tmp_path / "out", clients_per_node=4)
    assert effective_clients_per_node(Settings.from_run_config(config), "simulation", config) == {}
    # flwr run: auto is decided per node from its num-partitions
    assert effective_clients_per_node(Settings(), None, {}) == {
        "clients-per-node": "ceil(num-clients / num-partitions) of each node"
    }
