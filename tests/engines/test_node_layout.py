"""NodeLayout: how N clients are divided among Flower nodes, worked out in one place."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app.client_app import clients_per_node
from mmfl_flwr.flower_app.launch import RayPlan, resolve_clients_per_node
from mmfl_flwr.nodes import NodeLayout, ceil_div
from mmfl_flwr.runner import node_configs

PACKAGE = Path(__file__).resolve().parents[2] / "mmfl_flwr"


@pytest.mark.parametrize(
    ("n", "k", "nodes", "last"),
    [(10, 1, 10, range(9, 10)), (10, 3, 4, range(9, 10)), (10, 4, 3, range(8, 10)),
     (10, 10, 1, range(0, 10)), (10, 25, 1, range(0, 10)), (7, 2, 4, range(6, 7))],
)  # fmt: skip
def test_nodes_and_their_clients_by_hand(n, k, nodes, last):
    layout = NodeLayout(n, k)
    assert layout.num_nodes == nodes
    assert layout.clients_of(nodes - 1) == last
    hosted = [c for p in range(nodes) for c in layout.clients_of(p)]
    assert hosted == list(range(n))  # every client once, in partition order
    assert layout.node_configs() == [
        {"partition-id": p, "num-partitions": nodes} for p in range(nodes)
    ]


def test_a_partition_outside_the_layout_names_the_ids_it_needs():
    with pytest.raises(ValueError, match=r"partition ids 0 to 3 \(num-supernodes=4\)"):
        NodeLayout(10, 3).clients_of(4)
    with pytest.raises(ValueError):
        NodeLayout(10, 3).clients_of(-1)


@pytest.mark.parametrize(
    ("engine", "slots", "gpus", "k"),
    [("inprocess", None, False, 1), ("vectorized", None, False, 20), ("simulation", 2, False, 10),
     ("simulation", 3, False, 7), ("simulation", 64, False, 1), ("simulation", 2, True, 1)],
)  # fmt: skip
def test_auto_means_one_thing_per_engine(engine, slots, gpus, k):
    layout = NodeLayout.for_engine(20, None, engine, slots=slots, per_client_gpus=gpus)
    assert layout.per_node == k
    assert layout.why.startswith("auto") or "gpus-per-client" in layout.why


def test_simulation_auto_spreads_the_clients_evenly_over_its_nodes():
    # 10 clients, 4 slots: K = ceil(10 / 4) = 3 gives ceil(10 / 3) = 4 nodes; a node
    # whose run config says auto computes ceil(10 / 4) = 3 from num-partitions = 4
    layout = NodeLayout.for_engine(10, None, "simulation", slots=4)
    assert (layout.per_node, layout.num_nodes) == (3, 4)
    assert layout.spread_evenly().per_node == 3
    # 9 clients on 4 slots: K = 3, 3 nodes; spread evenly still 3
    assert NodeLayout.for_engine(9, None, "simulation", slots=4).spread_evenly().per_node == 3
    # 7 clients on 3 slots: K = 3, 3 nodes; evenly ceil(7 / 3) = 3
    assert NodeLayout.for_engine(7, None, "simulation", slots=3).num_nodes == 3


def test_an_explicit_value_is_kept_and_gpus_per_client_refuse_a_shard():
    assert NodeLayout.for_engine(10, 4, "inprocess").per_node == 4
    assert NodeLayout.for_engine(10, 40, "simulation", slots=2).per_node == 10
    with pytest.raises(ValueError, match="--num-gpus-per-node"):
        NodeLayout.for_engine(10, 4, "simulation", slots=2, per_client_gpus=True)
    with pytest.raises(ValueError, match="unknown engine"):
        NodeLayout.for_engine(10, None, "ray")


def test_a_deployed_node_reads_its_share_from_its_node_config():
    assert NodeLayout.for_node(10, None, {"num-partitions": 4}).per_node == 3
    assert NodeLayout.for_node(10, None, {}).per_node == 1
    assert NodeLayout.for_node(10, 6, {"num-partitions": 4}).per_node == 6
    with pytest.raises(ValueError, match="not a whole number"):
        NodeLayout.for_node(10, None, {"num-partitions": "four"})


def test_engines_and_apps_read_the_layout():
    s = Settings(num_clients=20)
    assert len(node_configs(s, "inprocess")) == 20
    assert len(node_configs(s, "vectorized")) == 1
    assert clients_per_node(s, {"num-partitions": 6}) == 4
    plan = RayPlan(
        address=None, nodes=[(2.0, 0.0)], num_gpus_per_client=0.0, slots=2, unit="client"
    )
    assert resolve_clients_per_node(s, plan) == (10, "auto: one node per CPU Ray sees (2)")


def _ceil_divisions(path: Path) -> list[str]:
    """The source of every ``-(-a // b)`` and ``ceil(...)`` call in a module's code."""
    src = path.read_text()
    found = []
    for node in ast.walk(ast.parse(src)):
        func = node.func if isinstance(node, ast.Call) else None
        if (
            (isinstance(func, ast.Name) and func.id == "ceil")
            or (isinstance(func, ast.Attribute) and func.attr == "ceil")
            or (
                isinstance(node, ast.UnaryOp)
                and isinstance(node.op, ast.USub)
                and isinstance(node.operand, ast.BinOp)
                and isinstance(node.operand.op, ast.FloorDiv)
                and isinstance(node.operand.left, ast.UnaryOp)
            )
        ):
            found.append(ast.get_source_segment(src, node) or "")
    return found


def test_clients_are_divided_among_nodes_in_one_place_only():
    """A ceiling division over clients and nodes (``-(-N // K)``, ``ceil(N / K)``)
    appears in mmfl_flwr/nodes.py alone; the others divide samples by batch sizes."""
    words = ("client", "node", "partition", "workers", "slots", "// k")
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "nodes.py":
            continue
        hits = [c for c in _ceil_divisions(path) if any(w in c for w in words)]
        if hits:
            offenders[str(path.relative_to(PACKAGE))] = hits
    assert not offenders, offenders
    assert ceil_div(10, 3) == 4 and ceil_div(9, 3) == 3 and ceil_div(0, 3) == 0
