"""Multi-client nodes (issue 24, item 1): one Flower node may host a shard of
clients. It registers them all from one info reply (``info@<id>``), gets one
message per round trip with the work of all its clients (``config@<id>``), and
replies per client (``arrays.<task>@<id>``, ...). The server treats each as one
client: assignment, validation, rejection and identity stay per client, so a
federation gives the same run however its clients are spread over nodes.

Fake clients: conftest.StepTrainer (``train`` returns ``w - step``)."""

from __future__ import annotations

import numpy as np
import pytest
from harness import ClientDef, run_federation, zero_models

from mmfl_flwr import make_strategy
from mmfl_flwr.client.app import ClientSpec, make_client_app
from mmfl_flwr.core.random_allocation import FullParticipation
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.strategy import MultiModelStrategy

TASKS = ("a", "b")
CLIENTS = {
    f"c{i}": ClientDef(
        {"a": (10 + 5 * i, 0.5 + i), "b": (20 - 3 * i, 1.0 + 0.25 * i)},
        losses={"a": 1.0 + i, "b": 2.0 - 0.3 * i},
    )
    for i in range(5)
}


def shard_app(clients=CLIENTS):
    """Node config ``cid`` names one client, or ``shard`` (comma-separated) several."""

    def spec_fn(ctx):
        shard = ctx.node_config.get("shard")
        labels = str(shard).split(",") if shard is not None else [str(ctx.node_config["cid"])]
        specs = [ClientSpec(client_id=c, trainers=clients[c].trainers()) for c in labels if c]
        return specs if shard is not None else specs[0]

    return make_client_app(spec_fn)


SINGLE = {c: {"cid": c} for c in CLIENTS}
SHARDED = {"A": {"cid": "A", "shard": "c0,c1,c2"}, "c3": {"cid": "c3"}, "c4": {"cid": "c4"}}
ONE_NODE = {"all": {"cid": "all", "shard": ",".join(CLIENTS)}}


def run(strategy, nodes, rounds=3, clients=CLIENTS, **kw):
    return run_federation(
        strategy,
        shard_app(clients),
        nodes,
        zero_models(TASKS),
        rounds,
        grid_factory=lambda rec, cfgs: InProcessGrid(rec, cfgs, seed=0),
        **kw,
    )


@pytest.mark.parametrize("preset", ["full", "mfa-rand", "lvr"])
def test_the_run_does_not_depend_on_how_clients_are_spread_over_nodes(preset):
    def make():
        return make_strategy(
            preset, seed=4, **({"budget_fraction": 0.5} if preset == "lvr" else {})
        )

    single, sharded, one = run(make(), SINGLE), run(make(), SHARDED), run(make(), ONE_NODE)
    for other in (sharded, one):
        assert other.result.assignments == single.result.assignments
        for rnd in range(4):
            for task in TASKS:
                for k, v in single.snapshots[rnd][task].items():
                    np.testing.assert_allclose(other.snapshots[rnd][task][k], v, rtol=1e-6)
    assert any(single.result.assignments.values())


def test_one_message_per_node_per_round_trip():
    out = run(make_strategy("lvr", seed=1, budget_fraction=1.0), SHARDED, rounds=2)
    for mtype in ("query.info", "query.losses", "train"):
        per_node = [r.cid for r in out.rec.of_type(mtype)]
        assert per_node.count("A") == (1 if mtype == "query.info" else 2), (mtype, per_node)
    train = [r for r in out.rec.of_type("train") if r.cid == "A"][0]
    # the weights travel once per model, each client has its own config
    assert sorted(train.arrays) == ["arrays.a", "arrays.b"]
    assert {k for k in train.config} == set()  # no node-wide config: one per client
    assert {c for c, _, _ in out.result.assignments[1]} >= {"c0", "c1", "c2"}


def test_a_malformed_part_of_one_client_is_rejected_alone():
    clients = dict(CLIENTS)
    clients["c1"] = ClientDef({"a": (15, float("nan")), "b": (17, 1.25)})
    out = run(MultiModelStrategy(FullParticipation(), seed=0), SHARDED, rounds=1, clients=clients)
    assert sorted(out.result.rejections[1]) == [("c1", "a")]
    assert out.rows(1)["a"]["uploads"] == 4 and out.rows(1)["b"]["uploads"] == 5
    assert [w for w in out.warnings(1) if w.startswith("Client c1: rejected update for task 'a'")]


def test_a_client_failing_in_a_shard_fails_alone():
    clients = dict(CLIENTS)
    clients["c2"] = ClientDef({"a": (20, 2.5), "b": (14, 1.5)}, fail_train=True)
    out = run(MultiModelStrategy(FullParticipation(), seed=0), SHARDED, rounds=1, clients=clients)
    assert sorted(out.result.rejections[1]) == [("c2", "a"), ("c2", "b")]
    assert out.rows(1)["a"]["uploads"] == 4
    assert [
        w for w in out.warnings(1) if "Client c2 failed to train" in w and "simulated crash" in w
    ]


def test_an_id_another_node_holds_is_refused_and_the_shards_others_register():
    nodes = {"c3": {"cid": "c3"}, "A": {"cid": "A", "shard": "c0,c3,c1"}}
    out = run(MultiModelStrategy(FullParticipation(), seed=0), nodes, rounds=1)
    claims = [w for w in out.warnings(1) if "Client id c3 is claimed by nodes" in w]
    assert len(claims) == 1
    assert sorted(out.strategy.table.ids()) == ["c0", "c1", "c3"]
    assert {c for c, _, _ in out.result.assignments[1]} == {"c0", "c1", "c3"}
    assert out.rows(1)["a"]["uploads"] == 3


def test_a_refused_client_of_a_shard_is_asked_again_and_registers_when_free():
    """The log said "node A is refused and asked again next round", but a shard that
    had registered any client was never asked again: its refused client stayed out
    after the holder went away. Now it registers through the shard, and a shard with
    nothing refused is not asked again."""
    nodes = {"c3": {"cid": "c3"}, "A": {"cid": "A", "shard": "c0,c3,c1"}}
    out = run(
        MultiModelStrategy(FullParticipation(), seed=0),
        nodes,
        rounds=3,
        events={1: [("remove", "c3")]},
    )
    assert {c for c, _, _ in out.result.assignments[1]} == {"c0", "c1", "c3"}
    assert {c for c, _, _ in out.result.assignments[2]} == {"c0", "c1", "c3"}
    assert out.strategy.run_state.shard_of["c3"] == out.nodes["A"]
    asked = [r for r in out.rec.of_type("query.info") if r.cid == "A"]
    assert len(asked) == 2  # round 1, and round 2 for c3; not round 3
    # c3 is logged as it joins A; A's other clients are not logged again
    said = [m for m in out.infos(2) if "re-registered" in m]
    assert len(said) == 1 and said[0].startswith("Client c3 re-registered as node")


def test_overlapping_shards_are_not_asked_again_while_the_holder_stays():
    """Two shards declaring overlapping ids: the second's refused ids are held by a live
    node, so it is not asked again (and its refusals not logged again) every round."""
    nodes = {"A": {"cid": "A", "shard": "c0,c1,c2"}, "B": {"cid": "B", "shard": "c2,c3,c4"}}
    out = run(MultiModelStrategy(FullParticipation(), seed=0), nodes, rounds=3)
    asked = [r for r in out.rec.of_type("query.info") if r.cid == "B"]
    assert len(asked) == 1
    assert (
        sum("Client id c2 is claimed by nodes" in w for r in (1, 2, 3) for w in out.warnings(r))
        == 1
    )
    assert {c for c, _, _ in out.result.assignments[3]} == {"c0", "c1", "c2", "c3", "c4"}


def test_an_empty_shard_is_one_line_and_the_run_goes_on():
    nodes = {"E": {"cid": "E", "shard": ""}, "c0": {"cid": "c0"}}
    out = run(MultiModelStrategy(FullParticipation(), seed=0), nodes, rounds=1)
    said = [w for w in out.warnings(1) if "shard is empty" in w]
    assert len(said) == 1 and "could not describe itself" in said[0]
    assert out.strategy.table.ids() == ["c0"]


def test_a_part_for_a_client_the_node_does_not_host_is_ignored():
    from mmfl_flwr import protocol as P

    def add_stranger(app):
        def wrapped(msg, ctx):
            reply = app(msg, ctx)
            if msg.metadata.message_type == "train" and ctx.node_config["cid"] == "A":
                reply.content[P.client_key("arrays.a", "c4")] = reply.content[
                    P.client_key("arrays.a", "c0")
                ]
            return reply

        return wrapped

    nodes = {"A": {"cid": "A", "shard": "c0,c1"}, "c4": {"cid": "c4"}}
    out = run(MultiModelStrategy(FullParticipation(), seed=0), nodes, rounds=1, wrap=add_stranger)
    assert [w for w in out.warnings(1) if "was not asked" in w]
    assert out.rows(1)["a"]["uploads"] == 3  # c0, c1 and c4's own


def test_a_node_going_offline_takes_its_clients_and_they_come_back_with_it():
    out = run(
        MultiModelStrategy(FullParticipation(), seed=0),
        SHARDED,
        rounds=3,
        events={1: [("remove", "A")], 2: [("add", "A2", {"cid": "A2", "shard": "c0,c1,c2"})]},
    )
    assert {c for c, _, _ in out.result.assignments[2]} == {"c3", "c4"}
    assert {c for c, _, _ in out.result.assignments[3]} == set(CLIENTS)


# ------------------------------------------------- review findings (issue 24)
def test_first_use_binds_every_client_of_a_shard_to_its_node_key():
    """``"*": key:first-use`` with a shard: all its clients register and are bound
    to the node's key; another key cannot take one of them, and the shard's key
    cannot later claim an id it did not declare first."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.proto.node_pb2 import NodeInfo

    from mmfl_flwr.strategy.registration import FIRST_USE, key_pin

    def pem():
        return (
            ec.generate_private_key(ec.SECP256R1())
            .public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    class AuthGrid(InProcessGrid):
        def get_nodes(self):
            return [
                NodeInfo(node_id=n, public_key=self.context(n).node_config.get("pubkey", b""))
                for n in self.get_node_ids()
            ]

    shard_key, other_key, third_key = pem(), pem(), pem()
    nodes = {
        "A": {"cid": "A", "shard": "c0,c1,c2", "pubkey": shard_key},
        "c3": {"cid": "c3", "pubkey": other_key},
    }
    events = {
        1: [
            ("remove", "A"),
            ("add", "B", {"cid": "B", "shard": "c0,c1,c2,c4", "pubkey": shard_key}),
            ("add", "M", {"cid": "M", "shard": "c9,c1", "pubkey": third_key}),
            # the shard's key on a single-client node, claiming an id it never held
            ("add", "S", {"cid": "c5", "pubkey": shard_key}),
        ]
    }
    clients = {**CLIENTS, "c9": CLIENTS["c4"], "c5": CLIENTS["c4"]}
    strategy = MultiModelStrategy(FullParticipation(), seed=0, client_pins={"*": FIRST_USE})
    out = run_federation(
        strategy,
        shard_app(clients),
        nodes,
        zero_models(TASKS),
        2,
        events=events,
        grid_factory=lambda rec, cfgs: AuthGrid(rec, cfgs, seed=0),
    )
    assert {c for c, _, _ in out.result.assignments[1]} == {"c0", "c1", "c2", "c3"}
    pins = strategy.run_state.client_pins
    assert pins["c0"] == pins["c1"] == pins["c2"] == key_pin(shard_key)
    # round 2: the shard's key takes its ids back but not c4; M (another key) gets no c1
    assert {c for c, _, _ in out.result.assignments[2]} == {"c0", "c1", "c2", "c3", "c9"}
    assert [w for w in out.warnings(2) if "claims client id c4" in w and "bound at first use" in w]
    assert [w for w in out.warnings(2) if "claims client id c1" in w and "another node key" in w]
    assert [w for w in out.warnings(2) if "claims client id c5" in w and "bound at first use" in w]
    assert "c5" not in pins


def test_client_side_dp_clipping_reaches_the_clients_of_a_shard():
    from mmfl_flwr.privacy import DifferentialPrivacyClientSideFixedClipping

    w = DifferentialPrivacyClientSideFixedClipping(
        MultiModelStrategy(FullParticipation(), seed=0), 0.0, 0.1, 2
    )
    out = run(w, SHARDED, rounds=1)
    train = [r for r in out.rec.of_type("train") if r.cid == "A"][0]
    assert not [m for m in out.warnings(1) if "client-side clipping not applied" in m]
    assert train.config == {}  # the norms went into config@<id> (checked by the silence)


@pytest.mark.parametrize("code", ["x", [1], True])
def test_a_malformed_error_record_fails_only_its_client(code):
    from flwr.app import ConfigRecord

    from mmfl_flwr import protocol as P

    def bad_error(app):
        def wrapped(msg, ctx):
            reply = app(msg, ctx)
            if msg.metadata.message_type == "train" and ctx.node_config["cid"] == "A":
                for key in [k for k in reply.content if k.endswith("@c1")]:
                    del reply.content[key]
                reply.content[P.client_key(P.ERROR_KEY, "c1")] = ConfigRecord(
                    {"code": code, "reason": "bad"}
                )
            return reply

        return wrapped

    out = run(MultiModelStrategy(FullParticipation(), seed=0), SHARDED, rounds=1, wrap=bad_error)
    assert sorted(out.result.rejections[1]) == [("c1", "a"), ("c1", "b")]
    assert out.rows(1)["a"]["uploads"] == 4


def test_a_shards_parts_of_clients_not_asked_are_ignored():
    """The evaluation asks a sample of clients; a shard node's part for a client
    it hosts but that was not asked does not count."""
    from flwr.app import MetricRecord

    from mmfl_flwr import protocol as P

    def extra_eval(app):
        def wrapped(msg, ctx):
            reply = app(msg, ctx)
            if msg.metadata.message_type == "evaluate" and ctx.node_config["cid"] == "all":
                for cid in CLIENTS:
                    key = P.client_key("metrics.a", cid)
                    if key not in reply.content:
                        reply.content[key] = MetricRecord(
                            {"num-examples": 1000, "loss": 9.0, "accuracy": 0.0}
                        )
            return reply

        return wrapped

    plain = run(
        MultiModelStrategy(FullParticipation(), seed=0, fraction_evaluate=0.4), ONE_NODE, rounds=1
    )
    forged = run(
        MultiModelStrategy(FullParticipation(), seed=0, fraction_evaluate=0.4),
        ONE_NODE,
        rounds=1,
        wrap=extra_eval,
    )
    assert forged.rows(1)["a"]["client_accuracy"] == plain.rows(1)["a"]["client_accuracy"]
    assert [w for w in forged.warnings(1) if "was not asked" in w]


def test_shard_ids_with_the_separator_or_twice_are_refused_by_the_client_app():
    clients = {**CLIENTS, "c@5": CLIENTS["c4"]}
    out = run(
        MultiModelStrategy(FullParticipation(), seed=0),
        {"A": {"cid": "A", "shard": "c0,c@5"}, "c3": {"cid": "c3"}},
        rounds=1,
        clients=clients,
    )
    assert [w for w in out.warnings(1) if "free of '@'" in w]
    assert out.strategy.table.ids() == ["c3"]


class _LateGrid(InProcessGrid):
    """A node that connects while the server waits (after two looks at the nodes)."""

    def __init__(self, app, configs, late):
        super().__init__(app, configs, seed=0)
        self._late, self._looks = late, 0

    def get_node_ids(self):
        self._looks += 1
        if self._looks == 3 and self._late is not None:
            self.add_node(self._late)
            self._late = None
        return super().get_node_ids()


def test_the_first_round_waits_for_clients_not_nodes():
    """min_available_clients counts the clients a node hosts: two nodes of the
    five clients are enough, and a shard connecting during the wait is in round 1."""

    def make():
        return make_strategy("full", seed=4, min_available_clients=5, node_wait_timeout=30)

    early = [{"cid": "c3"}, {"cid": "c4"}]
    res = run_federation(
        make(),
        shard_app(),
        {"c3": early[0], "c4": early[1]},
        zero_models(TASKS),
        1,
        grid_factory=lambda rec, cfgs: _LateGrid(rec, cfgs, SHARDED["A"]),
    )
    trained = {cid for picks in res.result.assignments.values() for cid, *_ in picks}
    assert trained == set(CLIENTS)


def test_the_wait_for_clients_ends_at_its_timeout_with_a_warning(caplog):
    import logging
    import time

    strategy = make_strategy("full", seed=4, min_available_clients=9, node_wait_timeout=1.5)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING):
        res = run(strategy, SHARDED, rounds=1)
    assert time.monotonic() - t0 >= 1.5
    said = [r.getMessage() for r in caplog.records if "requested clients" in r.getMessage()]
    assert said == [
        "Only 5 of the 9 requested clients registered after the wait; continuing with them"
    ]
    trained = {cid for picks in res.result.assignments.values() for cid, *_ in picks}
    assert trained == set(CLIENTS)


def test_an_absurd_sample_count_of_one_shard_client_is_capped_alone():
    """One client of a shard declares 1e8 examples: the count cap names it and
    uses its count up to 200 x the median; its shard mates register and train
    with their own counts, and every model stays finite."""
    clients = dict(CLIENTS)
    clients["c1"] = ClientDef({"a": (10**8, 1.5), "b": (17, 1.25)})
    out = run(
        MultiModelStrategy(FullParticipation(), seed=0, count_cap=200.0),
        SHARDED,
        rounds=1,
        clients=clients,
    )
    capped = [w for w in out.actions(1) if "declared 100000000 examples" in w]
    assert len(capped) == 1 and "c1" in capped[0], out.actions(1)
    table = out.strategy.table
    assert sorted(table.ids()) == sorted(CLIENTS)
    assert table["c0"].num_examples["a"] == 10 and table["c2"].num_examples["a"] == 20
    assert out.rows(1)["a"]["uploads"] == 5


def test_a_failing_first_node_does_not_stop_the_wait_for_the_others():
    """The first node to connect answers the info query with an error; the run
    waits for the clients of the nodes that come later instead of stopping."""

    def make():
        return make_strategy("full", seed=4, min_available_clients=4, node_wait_timeout=30)

    nodes = {"E": {"cid": "E", "shard": ""}}  # an empty shard: an error reply
    res = run_federation(
        make(),
        shard_app(),
        nodes,
        zero_models(TASKS),
        1,
        grid_factory=lambda rec, cfgs: _LateGrid(rec, cfgs, SHARDED["A"]),
    )
    trained = {cid for picks in res.result.assignments.values() for cid, *_ in picks}
    assert trained == {"c0", "c1", "c2"}
