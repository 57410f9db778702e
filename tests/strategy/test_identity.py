"""Client identity (issue 12, item 3): who may hold a client id.

A client names itself in its ``query.info`` reply; Flower's node id changes on
every reconnect. The rule (``mmfl_flwr.strategy.registration``): the first live
node to claim an id holds it; a duplicate claim is refused and logged with the
client id and both node ids. Without a pin a node that claims an offline
client's id first ("squats" it) keeps it while it stays online. With a pin
(``token:<sha256>`` of the ``client-token`` the ClientApp sends, or
``key:<sha256>`` of the SuperNode's authenticated public key) a claim without
the credential is refused, and a holder that never proved the pin is evicted.

The federation is made of numpy fakes (``StepTrainer``: client ``c`` returns
``w - step``), FedAvg with full participation, so the global model is a
deterministic function of which clients trained in which round; the squatter
("mallory") declares a huge sample count and step, so any update of hers shows.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pytest
from conftest import LogTap, Recorder
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import Context, Message, RecordDict
from flwr.proto.node_pb2 import NodeInfo
from harness import ClientDef, Events, FedRun, fake_client_app, run_federation

from mmfl_flwr import protocol as P
from mmfl_flwr.core import FedAvgAggregator, FullParticipation
from mmfl_flwr.flower_app.client_app import CLIENT_TOKEN, client_token
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.records import numpy_to_arrays
from mmfl_flwr.strategy import MultiModelStrategy
from mmfl_flwr.strategy.registration import FIRST_USE, check_pins, key_pin, token_pin

TASKS = ("a", "b")
SHAPES = {"w": (2, 3), "b": (3,)}
SECRET = "alice-secret-7f3a"

# label -> task -> (num_examples, step); "mallory" claims to be "alice"
CLIENTS: dict[str, dict[str, tuple[int, float]]] = {
    "alice": {"a": (10, 0.5), "b": (30, 1.0)},
    "bob": {"a": (30, 1.0), "b": (10, 2.0)},
    "mallory": {"a": (10**6, 50.0), "b": (10**6, -50.0)},
}


def node(
    label: str, claim: str | None = None, token: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A node config: ``cid`` is who the node really is (the fake's data),
    ``claim`` the client id it reports, ``client-token`` its secret."""
    cfg: dict[str, Any] = {"cid": label, "claim": claim or label, **extra}
    if token is not None:
        cfg[CLIENT_TOKEN] = token
    return cfg


ALICE = node("alice", token=SECRET)
BOB = node("bob")
SQUATTER = node("mallory", claim="alice", token="a-guess")


def make_app():
    """Node label ``cid`` -> its fake client; it reports the id ``claim`` and
    the secret of its node config."""
    return fake_client_app(
        {label: ClientDef(dict(tasks)) for label, tasks in CLIENTS.items()},
        client_id=lambda ctx: str(ctx.node_config["claim"]),
        client_token=lambda ctx: client_token(ctx.node_config),
    )


def make_strategy(pins: Mapping[str, str] | None) -> MultiModelStrategy:
    """The strategy, with ``client_pins`` passed as a constructor argument once
    MultiModelStrategy takes one, else set on its (first) run."""
    kwargs: dict[str, Any] = {"seed": 3, "node_wait_timeout": 0.0}
    takes_pins = "client_pins" in inspect.signature(MultiModelStrategy).parameters
    if pins and takes_pins:
        kwargs["client_pins"] = dict(pins)
    strategy = MultiModelStrategy(FullParticipation(), FedAvgAggregator(), **kwargs)
    if pins and not takes_pins:
        strategy.run_state.client_pins = dict(pins)
    return strategy


def run_fed(
    start: Mapping[str, dict[str, Any]],
    rounds: int,
    events: Events | None = None,
    pins: Mapping[str, str] | None = None,
    grid_cls: Callable[..., InProcessGrid] = InProcessGrid,
    hook: Callable[[int, FedRun], None] | None = None,
) -> FedRun:
    """Run FedAvg over the nodes ``start`` (name -> node config); after round
    ``r`` the ``events[r]`` add or remove named nodes."""
    return run_federation(
        make_strategy(pins),
        make_app(),
        start,
        initial(),
        rounds,
        grid_factory=lambda rec, cfgs: grid_cls(rec, cfgs, seed=0),
        events=events,
        hook=hook,
    )


def initial():
    return {
        t: numpy_to_arrays({k: np.zeros(s, np.float32) for k, s in SHAPES.items()}) for t in TASKS
    }


def assert_same_models(run: FedRun, honest: FedRun) -> None:
    """Every round's global models equal those of the run without the squatter."""
    assert sorted(run.snapshots) == sorted(honest.snapshots)
    for rnd, models in honest.snapshots.items():
        for task, w in models.items():
            for k, v in w.items():
                np.testing.assert_array_equal(
                    run.snapshots[rnd][task][k], v, err_msg=f"round {rnd}, {task}/{k}"
                )


def only_info_queries(run: FedRun, label: str) -> bool:
    types = {r.type for r in run.rec.log if r.cid == label}
    return types == {P.QUERY_INFO}


PINS = {"alice": token_pin(SECRET)}

# alice trains in round 1, disconnects; mallory claims "alice" in round 2;
# alice comes back with a new node id for round 3
RECONNECT = {1: [("remove", "alice"), ("add", "mallory", SQUATTER)], 2: [("add", "alice2", ALICE)]}
HONEST_RECONNECT = {1: [("remove", "alice")], 2: [("add", "alice2", ALICE)]}


# ========================================================== without pins
def test_without_pins_a_squatter_keeps_the_id_while_online_then_the_client_gets_it_back():
    """The documented limit: the first live claimant keeps the id; the real
    client is refused (logged with the id and both nodes) and asked again each
    round, and gets its id as soon as the squatter is gone."""
    events = {**RECONNECT, 3: [("remove", "mallory")]}
    run = run_fed({"alice": ALICE, "bob": BOB}, rounds=4, events=events)
    old, new, squatter = run.nodes["alice"], run.nodes["alice2"], run.nodes["mallory"]
    # round 2: the squatter takes the free id and trains as "alice"
    assert run.trained("mallory") == [(2, squatter), (3, squatter)]
    assert run.trained("alice") == [(1, old), (4, new)]
    claims = [m for m in run.warnings(3) if "claimed by" in m]
    assert len(claims) == 1, run.warnings(3)
    assert "alice" in claims[0] and str(squatter) in claims[0] and str(new) in claims[0]
    assert claims[0].split("keeping")[1].split()[0] == str(squatter)
    assert not any("claimed by" in m for m in run.warnings(4))
    assert run.strategy.run_state.node_to_cid.get(new) == "alice"


# ============================================================ token pins
def test_pinned_client_gets_its_id_and_the_squatter_who_came_first_is_refused():
    """Mallory (a wrong token) is online before alice; alice joins in round 2.
    Mallory never trains, every refusal names the client id and her node, and
    the global models are exactly those of a run without her."""
    events = {1: [("add", "alice", ALICE)]}
    run = run_fed({"mallory": SQUATTER, "bob": BOB}, rounds=3, events=events, pins=PINS)
    honest = run_fed({"bob": BOB}, rounds=3, events=events, pins=PINS)
    squatter, alice = run.nodes["mallory"], run.nodes["alice"]
    assert only_info_queries(run, "mallory")
    assert run.trained("alice") == [(2, alice), (3, alice)]
    assert run.strategy.run_state.node_to_cid.get(alice) == "alice"
    assert squatter not in run.strategy.run_state.node_to_cid
    assert run.strategy.table["alice"].num_examples == {"a": 10, "b": 30}
    for rnd in (1, 2, 3):  # asked (and refused) again each round
        refused = [m for m in run.warnings(rnd) if "refused" in m]
        assert len(refused) == 1, run.warnings(rnd)
        assert "client id alice" in refused[0] and str(squatter) in refused[0]
        assert "client-token" in refused[0]
    assert_same_models(run, honest)


def test_pinned_id_without_any_token_is_refused():
    no_token = node("mallory", claim="alice")
    run = run_fed({"mallory": no_token, "bob": BOB}, rounds=1, pins=PINS)
    assert only_info_queries(run, "mallory")
    (refused,) = [m for m in run.warnings(1) if "refused" in m]
    assert "no client-token" in refused and "alice" in refused


def test_pinned_client_reconnecting_with_a_new_node_id_gets_its_id_back():
    """Alice disconnects after round 1; mallory claims "alice" in round 2 and
    is refused; alice comes back as a new node in round 3 and trains."""
    run = run_fed({"alice": ALICE, "bob": BOB}, rounds=3, events=RECONNECT, pins=PINS)
    honest = run_fed({"alice": ALICE, "bob": BOB}, rounds=3, events=HONEST_RECONNECT, pins=PINS)
    old, new, squatter = run.nodes["alice"], run.nodes["alice2"], run.nodes["mallory"]
    assert new != old
    assert run.trained("alice") == [(1, old), (3, new)]
    assert only_info_queries(run, "mallory")
    assert run.strategy.run_state.node_to_cid.get(new) == "alice"
    assert run.strategy.run_state.verified_nodes == {new: PINS["alice"]}
    for rnd in (2, 3):
        assert any(
            "alice" in m and str(squatter) in m and "refused" in m for m in run.warnings(rnd)
        ), run.warnings(rnd)
    assert_same_models(run, honest)


def test_restarted_client_whose_old_node_is_still_listed_takes_over_when_it_leaves():
    """Two nodes proving the same pin: the first keeps the id, the second is
    asked again each round and takes over once the first is gone."""
    events = {1: [("add", "alice2", ALICE)], 2: [("remove", "alice")]}
    run = run_fed({"alice": ALICE, "bob": BOB}, rounds=3, events=events, pins=PINS)
    old, new = run.nodes["alice"], run.nodes["alice2"]
    assert run.trained("alice") == [(1, old), (2, old), (3, new)]
    claims = [m for m in run.warnings(2) if "claimed by" in m]
    assert len(claims) == 1 and "alice" in claims[0] and str(new) in claims[0]


def test_pin_set_during_the_run_evicts_the_squatter():
    """Mallory holds "alice" (no pins yet) and alice is refused as a duplicate;
    once the operator pins the id, mallory is evicted (logged with the client
    id and her node) at the next round and alice trains in that round."""

    def pin_after_round_2(rnd: int, run: FedRun) -> None:
        if rnd == 2:
            run.strategy.run_state.client_pins = dict(PINS)

    events = {1: [("add", "alice", ALICE)]}
    run = run_fed(
        {"mallory": SQUATTER, "bob": BOB}, rounds=3, events=events, hook=pin_after_round_2
    )
    squatter, alice = run.nodes["mallory"], run.nodes["alice"]
    assert run.trained("mallory") == [(1, squatter), (2, squatter)]
    assert run.trained("alice") == [(3, alice)]
    evicted = [m for m in run.warnings(3) if "evicted" in m]
    assert len(evicted) == 1 and "alice" in evicted[0] and str(squatter) in evicted[0]
    assert any("refused" in m and str(squatter) in m for m in run.warnings(3))
    assert run.strategy.table["alice"].num_examples == {"a": 10, "b": 30}
    assert run.strategy.run_state.node_to_cid.get(alice) == "alice"
    assert squatter not in run.strategy.run_state.node_to_cid


# ============================================== SuperNode public-key pins
def ssh_and_pem(key: ec.EllipticCurvePrivateKey) -> tuple[bytes, bytes]:
    pub = key.public_key()
    return (
        pub.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH),
        pub.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )


class AuthGrid(InProcessGrid):
    """Reports each node's public key (node config ``pubkey``, PEM) in
    ``get_nodes()``, as Flower's Grid does with SuperNode authentication."""

    def get_nodes(self) -> Iterable[NodeInfo]:
        return [
            NodeInfo(node_id=n, public_key=self.context(n).node_config.get("pubkey", b""))
            for n in self.get_node_ids()
        ]


def test_key_pin_admits_only_the_node_with_the_registered_key():
    alice_ssh, alice_pem = ssh_and_pem(ec.generate_private_key(ec.SECP256R1()))
    _, other_pem = ssh_and_pem(ec.generate_private_key(ec.SECP256R1()))
    pins = {"alice": key_pin(alice_ssh)}
    assert key_pin(alice_pem) == pins["alice"]
    # mallory even knows alice's token: the key pin does not care
    squatter = node("mallory", claim="alice", token=SECRET, pubkey=other_pem)
    events = {1: [("add", "alice", node("alice", pubkey=alice_pem))]}
    run = run_fed(
        {"mallory": squatter, "bob": BOB}, rounds=2, events=events, pins=pins, grid_cls=AuthGrid
    )
    assert only_info_queries(run, "mallory")
    assert run.trained("alice") == [(2, run.nodes["alice"])]
    assert any("another node key" in m and "alice" in m for m in run.warnings(1))
    # without SuperNode authentication there is no key to check: refused
    plain = run_fed({"alice": node("alice", pubkey=alice_pem), "bob": BOB}, rounds=1, pins=pins)
    assert plain.trained("alice") == []
    assert any("no authenticated node key" in m for m in plain.warnings(1))


def test_first_use_binds_each_id_to_the_key_of_its_first_node():
    """``"*": key:first-use``: alice's first registration binds "alice" to her
    node's key. She leaves after round 1; mallory (another key, even with
    alice's token) claims "alice" in round 2 and is refused although the id is
    free; alice returns with a new node id and the same key and gets it back.
    The models equal those of the run without mallory."""
    _, alice_pem = ssh_and_pem(ec.generate_private_key(ec.SECP256R1()))
    _, other_pem = ssh_and_pem(ec.generate_private_key(ec.SECP256R1()))
    _, bob_pem = ssh_and_pem(ec.generate_private_key(ec.SECP256R1()))
    alice, bob = node("alice", pubkey=alice_pem), node("bob", pubkey=bob_pem)
    squatter = node("mallory", claim="alice", token=SECRET, pubkey=other_pem)
    events = {1: [("remove", "alice"), ("add", "mallory", squatter)], 2: [("add", "alice2", alice)]}
    honest_events = {1: [("remove", "alice")], 2: [("add", "alice2", alice)]}
    pins = {"*": FIRST_USE}
    run = run_fed(
        {"alice": alice, "bob": bob}, rounds=3, events=events, pins=pins, grid_cls=AuthGrid
    )
    honest = run_fed(
        {"alice": alice, "bob": bob}, rounds=3, events=honest_events, pins=pins, grid_cls=AuthGrid
    )
    assert only_info_queries(run, "mallory")
    # (the recorder names nodes by their real client: alice's both nodes)
    assert run.trained("alice") == [(1, run.nodes["alice"]), (3, run.nodes["alice2"])]
    assert any("another node key" in m and "alice" in m for m in run.warnings(2))
    assert run.strategy.run_state.client_pins["alice"] == key_pin(alice_pem)
    assert run.strategy.run_state.client_pins["bob"] == key_pin(bob_pem)
    assert_same_models(run, honest)


def test_first_use_bindings_survive_a_resume(tmp_path):
    """The binding is part of the checkpoint: after a server restart mallory,
    who now registers first, is still refused; alice keeps her id."""
    _, alice_pem = ssh_and_pem(ec.generate_private_key(ec.SECP256R1()))
    _, other_pem = ssh_and_pem(ec.generate_private_key(ec.SECP256R1()))
    alice = node("alice", pubkey=alice_pem)
    ckpt = str(tmp_path / "ckpt.pkl")
    grid = AuthGrid(Recorder(make_app()), [alice, BOB], seed=0)
    first = MultiModelStrategy(
        FullParticipation(),
        FedAvgAggregator(),
        seed=3,
        node_wait_timeout=0.0,
        client_pins={"*": FIRST_USE},
        checkpoint_path=ckpt,
    )
    first.start(grid, initial(), num_rounds=1, timeout=60.0)
    assert first.run_state.bound_at_first_use == {"alice": key_pin(alice_pem)}
    squatter = node("mallory", claim="alice", pubkey=other_pem)
    rec = Recorder(make_app())
    grid2 = AuthGrid(rec, [squatter, alice, BOB], seed=0)
    second = MultiModelStrategy(
        FullParticipation(),
        FedAvgAggregator(),
        seed=3,
        node_wait_timeout=0.0,
        client_pins={"*": FIRST_USE},
        checkpoint_path=ckpt,
    )
    tap = LogTap()
    logging.getLogger("flwr").addHandler(tap)
    try:
        second.start(grid2, initial(), num_rounds=2, timeout=60.0, resume_from=ckpt)
    finally:
        logging.getLogger("flwr").removeHandler(tap)
    assert {r.type for r in rec.log if r.cid == "mallory"} == {P.QUERY_INFO}
    assert [rnd for rnd, _ in rec.nodes("alice", "train")] == [2]
    assert any("another node key" in m for _, m in tap.records)


def test_first_use_without_node_keys_refuses_the_claim():
    """Without SuperNode authentication (no node keys) nothing can be bound:
    a claim of an id bound at first use is refused, with the reason."""
    run = run_fed({"alice": ALICE, "bob": BOB}, rounds=1, pins={"alice": FIRST_USE})
    assert run.trained("alice") == [] and run.trained("bob") == [(1, run.nodes["bob"])]
    assert any("no authenticated node key" in m and "first use" in m for m in run.warnings(1))


# ================================================================= pieces
def test_check_pins_normalises_and_rejects():
    digest = token_pin(SECRET).split(":")[1]
    assert check_pins({"3": digest.upper()}) == {"3": "token:" + digest}
    assert check_pins({3: "key:" + digest}) == {"3": "key:" + digest}  # type: ignore[dict-item]
    assert check_pins(None) == {}
    assert check_pins({"*": "KEY:first-use"}) == {"*": FIRST_USE}
    for bad in (SECRET, "sha1:" + digest, "token:" + digest[:-1], "key:"):
        with pytest.raises(ValueError, match="client_pins"):
            check_pins({"3": bad})


def test_a_malformed_pin_fails_the_run_at_its_first_round():
    with pytest.raises(ValueError, match="client_pins"):
        run_fed({"bob": BOB}, rounds=1, pins={"alice": "not-a-hash"})


def test_client_app_sends_its_token_only_when_configured():
    app = make_app()
    grid = InProcessGrid(app, [])
    with_token, without = grid.add_node(ALICE), grid.add_node(BOB)
    for nid, expected in ((with_token, SECRET), (without, None)):
        msg = Message(RecordDict(), dst_node_id=nid, message_type=P.QUERY_INFO, group_id="1")
        (reply,) = grid.send_and_receive([msg])
        info = reply.content.config_records[P.INFO_KEY]
        assert info.get(CLIENT_TOKEN) == expected
        assert info[P.CLIENT_ID] == grid.context(nid).node_config["claim"]


def test_a_client_app_without_the_mmfl_handlers_stops_the_run_with_one_clear_error():
    """A quickstart-style ClientApp (``@app.train()`` only) under the strategy:
    every node answers ``query.info`` with Flower's "No query function
    registered" error, so no client can ever register; the run stops at once
    with an error naming the missing handler and the protocol doc, instead of
    training nobody and reporting accuracy nan."""
    from flwr.clientapp import ClientApp

    from mmfl_flwr.strategy.registration import NoClientRegistered

    app = ClientApp()

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:  # pragma: no cover - never reached
        return Message(RecordDict(), reply_to=msg)

    grid = InProcessGrid(app, [{"cid": "a"}, {"cid": "b"}], seed=0)
    strategy = MultiModelStrategy(
        FullParticipation(), FedAvgAggregator(), seed=0, node_wait_timeout=0.0
    )
    with pytest.raises(NoClientRegistered) as err:
        strategy.start(grid, initial(), num_rounds=2, timeout=10.0)
    text = str(err.value)
    assert "all 2 node(s)" in text and 'no @app.query("info") handler' in text
    assert "docs/protocol.md" in text and "\n" not in text
