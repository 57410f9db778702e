"""Unit tests of the strategy's phase modules (``mmfl_flwr.strategy.*``) and of
the declared policy/aggregator contracts, each phase on its own: the pairing
check, the reply preamble, reply validation, state averaging, selection after
training, client-side evaluation, checkpoints, re-entrant ``start()`` and the
summary. Expected numbers are computed by hand in each test."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from conftest import LogTap, StepTrainer
from flwr.app import Error, Message, MetricRecord, RecordDict

from mmfl_flwr import protocol as P
from mmfl_flwr.client.app import ClientSpec, make_client_app
from mmfl_flwr.core import (
    ClientInfo,
    FedAvgAggregator,
    FullParticipation,
    Pick,
    Policy,
    RandomAllocation,
    UnbiasedAggregator,
    Update,
)
from mmfl_flwr.core.lvr import GVR
from mmfl_flwr.core.pairing import check_pairing
from mmfl_flwr.core.stale import FedVARPAggregator, MIFAAggregator
from mmfl_flwr.core.stalevr import StaleVRAggregator, StaleVRSampling
from mmfl_flwr.core.ucb import ParetoMultiUCB, RanklistMultiUCB
from mmfl_flwr.grid import InProcessGrid, ensure_task_identity
from mmfl_flwr.records import InvalidReply, numpy_to_arrays
from mmfl_flwr.strategy import Limits, MultiModelStrategy, average_state
from mmfl_flwr.strategy.aggregate import select_after_training
from mmfl_flwr.strategy.evaluate import client_metrics
from mmfl_flwr.strategy.persist import identity, load_resumable, restore, run_state_dict
from mmfl_flwr.strategy.replies import client_replies
from mmfl_flwr.strategy.result import MultiModelResult
from mmfl_flwr.strategy.state import RunState
from mmfl_flwr.strategy.validation import validate_train_part

ensure_task_identity(1)


# ------------------------------------------------------------------ pairing
@pytest.mark.parametrize(
    "policy, aggregator, words",
    [
        (RanklistMultiUCB(2), UnbiasedAggregator(), "inclusion probabilities"),
        (ParetoMultiUCB(2), FedVARPAggregator(), "inclusion probabilities"),
        (RandomAllocation(), StaleVRAggregator(), "fresh update"),
        (StaleVRSampling(signal="stale-residual"), FedVARPAggregator(), "stale residual"),
        (StaleVRSampling(signal="stale-residual"), UnbiasedAggregator(), "stale residual"),
    ],
)
def test_mismatched_pairs_are_refused(policy, aggregator, words):
    with pytest.raises(ValueError, match=words):
        check_pairing(policy, aggregator)
    with pytest.raises(ValueError, match=words):
        MultiModelStrategy(policy, aggregator)


@pytest.mark.parametrize(
    "policy, aggregator",
    [
        (StaleVRSampling(), StaleVRAggregator()),
        (StaleVRSampling(signal="stale-residual"), StaleVRAggregator()),
        (FullParticipation(), StaleVRAggregator()),
        (GVR(), UnbiasedAggregator()),
        (RanklistMultiUCB(2), FedAvgAggregator()),
        (ParetoMultiUCB(2), MIFAAggregator()),
        (RandomAllocation(), FedVARPAggregator()),
    ],
)
def test_matching_pairs_are_accepted(policy, aggregator):
    check_pairing(policy, aggregator)


def test_policy_contract_defaults():
    class Minimal(Policy):
        name = "minimal"

        def assign(self, table, tasks, server_round, rng):
            return []

    p = Minimal()
    assert (p.needs_losses, p.trains_every_pair, p.selects_after_training) == (False,) * 3
    assert p.selection_signal == "update-norm" and p.inclusion_probabilities
    assert p.loss_query_clients(None, []) is None and p.cluster_steps() == []
    p.observe(1, {}, [])  # no-op
    with pytest.raises(NotImplementedError):
        p.select(None, [], {}, 1, np.random.default_rng(0))
    assert repr(p) == "Minimal()"


# --------------------------------------------------------------- replies
def _reply(node: int, error: bool = False) -> Message:
    instruction = Message(RecordDict(), dst_node_id=node, message_type="train", group_id="1")
    content = Error(code=1, reason="boom") if error else RecordDict()
    return Message(content, reply_to=instruction)


def test_reply_preamble_maps_nodes_and_drops_strangers_duplicates_and_errors():
    tap = LogTap()
    logging.getLogger("flwr").addHandler(tap)
    errors: list[str] = []
    try:
        got = list(
            client_replies(
                {1: "alice", 2: "bob", 3: "carol"},
                [_reply(1), _reply(9), _reply(1), _reply(2, error=True), _reply(3)],
                "train",
                asked={"alice", "bob"},
                on_error=lambda cid, r: errors.append(cid),
            )
        )
    finally:
        logging.getLogger("flwr").removeHandler(tap)
    assert [cid for cid, _ in got] == ["alice"]
    assert errors == ["bob"]
    text = "\n".join(m for _, m in tap.records)
    assert "node 9, which was not asked" in text  # unknown node
    assert "node 3, which was not asked" in text  # registered, but not asked
    assert "Client alice: duplicated train reply ignored" in text


# ------------------------------------------------------------ validation
GLOB = {"w": np.array([1.0, 2.0], np.float32), "rv": np.array([1.0], np.float32)}
KEYS = (["w"], ["rv"])
INFO = ClientInfo(cid="c", num_examples={"t": 20}, processors=2)
PICK = Pick("c", "t", 2, 0.25)


def _content(local=None, n=20, loss=0.5, control=None, metrics=True) -> RecordDict:
    rd = RecordDict()
    if local is not None:
        rd[P.arrays_key("t")] = numpy_to_arrays(local)
    if metrics:
        rd[P.metrics_key("t")] = MetricRecord({P.NUM_EXAMPLES: n, P.TRAIN_LOSS: loss})
    if control is not None:
        rd[P.control_key("t")] = numpy_to_arrays(control)
    return rd


def test_validate_train_part_builds_the_update_over_trainable_entries():
    local = {"w": np.array([0.5, 3.0], np.float32), "rv": np.array([4.0], np.float32)}
    update, loss = validate_train_part(
        _content(local), "t", PICK, INFO, GLOB, KEYS, 0.4, Limits(), False
    )
    np.testing.assert_allclose(update.delta[0], [0.5, -1.0])  # G = w_global - w_local
    assert len(update.delta) == 1 and update.state[0].tolist() == [4.0]
    assert (update.num_examples, update.data_share, update.processors) == (20, 0.4, 2)
    assert (update.prob, update.count, loss) == (0.25, 2, 0.5)


@pytest.mark.parametrize(
    "content, limits, needs_control, words",
    [
        (_content(None), Limits(), False, "no weights"),
        (_content({"w": GLOB["w"]}), Limits(), False, "keys differ"),
        (_content({**GLOB, "w": np.array([1.0, np.nan], np.float32)}), Limits(), False, "NaN"),
        (
            _content({**GLOB, "w": np.array([4.0, 6.0], np.float32)}),
            Limits(max_update_norm=4.9),
            False,
            "update norm 5 exceeds",
        ),
        (_content(GLOB, metrics=False), Limits(), False, "MetricRecord"),
        (_content(GLOB, n=0), Limits(), False, "num-examples"),
        (_content(GLOB, loss=-1.0), Limits(), False, "train-loss"),
        (_content(GLOB), Limits(), True, "control variate"),
    ],
)
def test_validate_train_part_rejects_with_the_reason(content, limits, needs_control, words):
    with pytest.raises(InvalidReply, match=words):
        validate_train_part(content, "t", PICK, INFO, GLOB, KEYS, 0.4, limits, needs_control)


def test_update_norm_is_over_trainable_entries_only():
    """A huge running-variance change must not count towards the norm bound."""
    local = {"w": np.array([1.0, 2.0], np.float32), "rv": np.array([1e6], np.float32)}
    validate_train_part(
        _content(local), "t", PICK, INFO, GLOB, KEYS, 0.4, Limits(max_update_norm=1e-3), False
    )


# ----------------------------------------------------------- aggregation
def _update(cid, n, state, delta=(0.0,)):
    return Update(cid=cid, delta=[np.array(delta)], num_examples=n, data_share=0.5, state=state)


def test_average_state_is_the_sample_weighted_mean_and_rounds_counters():
    old = [np.array([1.0, 1.0], np.float32), np.array(3, np.int64)]
    ups = [
        _update("a", 10, [np.array([2.0, 4.0], np.float32), np.array(13, np.int64)]),
        _update("b", 30, [np.array([6.0, 0.0], np.float32), np.array(20, np.int64)]),
    ]
    new = average_state(old, ups)
    np.testing.assert_allclose(new[0], [5.0, 1.0])  # (10*2 + 30*6)/40, (10*4 + 0)/40
    assert new[1].dtype == np.int64 and new[1].shape == () and int(new[1]) == 18  # 18.25
    assert [a.tolist() for a in average_state(old, [])] == [[1.0, 1.0], 3]


def test_select_after_training_passes_norms_and_keeps_chosen_probabilities():
    seen = {}

    class PickA(Policy):
        name = "pick-a"
        selects_after_training = property(lambda self: True)

        def assign(self, table, tasks, server_round, rng):
            return []

        def select(self, table, tasks, signal, server_round, rng):
            seen.update(signal)
            return [Pick("a", "t", 3, 0.125)]

    run = RunState(0)
    run.set_models({"t": numpy_to_arrays({"w": np.zeros(2, np.float32)})})
    updates = {"t": [_update("a", 1, [], (3.0, 4.0)), _update("b", 1, [], (1.0, 0.0))]}
    out = select_after_training(run, PickA(), FedAvgAggregator(), 1, updates)
    assert seen == {("a", "t"): 5.0, ("b", "t"): 1.0}  # ||G||
    assert [(u.cid, u.prob, u.count) for u in out["t"]] == [("a", 0.125, 3)]


# ------------------------------------------------------------ evaluation
def test_client_metrics_weighted_by_examples_and_rejects_bad_parts():
    run = RunState(0)
    run.set_models({t: numpy_to_arrays({"w": np.zeros(1, np.float32)}) for t in ("t", "u")})
    for i, cid in enumerate(("a", "b")):
        run.table.upsert(ClientInfo(cid=cid, num_examples={"t": 5, "u": 5}))
        run.node_to_cid[i + 1] = cid
    ev = MetricRecord({P.NUM_EXAMPLES: 10, P.LOSS: 1.0, P.ACCURACY: 0.5})
    replies = []
    for node, rec in (
        (1, {"t": ev, "u": MetricRecord({P.NUM_EXAMPLES: 10, P.LOSS: 1.0, P.ACCURACY: 7.0})}),
        (2, {"t": MetricRecord({P.NUM_EXAMPLES: 30, P.LOSS: 3.0, P.ACCURACY: 0.9})}),
    ):
        msg = Message(RecordDict(), dst_node_id=node, message_type="evaluate", group_id="1")
        replies.append(
            Message(RecordDict({P.metrics_key(t): m for t, m in rec.items()}), reply_to=msg)
        )
    out = client_metrics(run, replies, max_loss=1e6)
    assert out["t.loss"] == pytest.approx((10 * 1.0 + 30 * 3.0) / 40)
    assert out["t.accuracy"] == pytest.approx((10 * 0.5 + 30 * 0.9) / 40)
    assert "u.loss" not in out  # accuracy 7 is rejected


# ----------------------------------------------------------- checkpoints
def test_run_state_round_trip_and_identity(tmp_path):
    from mmfl_flwr.checkpoint import save_checkpoint

    run = RunState(5, pinned_trainable={})
    run.set_models({"t": numpy_to_arrays({"w": np.arange(3, dtype=np.float32)})})
    run.table.upsert(ClientInfo(cid="a", num_examples={"t": 4}))
    run.trainable["t"] = ["w"]
    run.rng.random(7)
    run.norm_history["t"] = [1.5, 2.0]
    run.direction_history["t"] = {"a": [0.25, -0.5]}
    result = MultiModelResult(history=[{"round": 1, "task": "t"}], assignments={1: []})
    pol, agg = RandomAllocation(0.3), FedAvgAggregator()
    save_checkpoint(tmp_path, run_state_dict(run, pol, agg, 1, result))

    fresh, back = RunState(5), MultiModelResult()
    state = load_resumable(str(tmp_path), identity(pol, agg, 5))
    assert restore(fresh, RandomAllocation(0.3), FedAvgAggregator(), state, back) == 1
    assert fresh.weights["t"]["w"].tolist() == [0.0, 1.0, 2.0]
    assert fresh.table.ids() == ["a"] and fresh.trainable == {"t": ["w"]}
    assert fresh.norm_history == {"t": [1.5, 2.0]}
    assert fresh.direction_history == {"t": {"a": [0.25, -0.5]}}
    assert fresh.rng.random() == run.rng.random()
    assert back.history == result.history
    with pytest.raises(ValueError, match="seed"):
        load_resumable(str(tmp_path), identity(pol, agg, 6))
    with pytest.raises(ValueError, match="policy_config"):
        load_resumable(str(tmp_path), identity(RandomAllocation(0.4), agg, 5))


# ----------------------------------------------------- start() and summary
CLIENTS = {"a": (10, 0.5), "b": (30, -1.0), "c": (20, 2.0)}


def _grid() -> InProcessGrid:
    app = make_client_app(
        lambda ctx: ClientSpec(
            str(ctx.node_config["cid"]), {"t": StepTrainer(*CLIENTS[str(ctx.node_config["cid"])])}
        )
    )
    return InProcessGrid(app, [{"cid": c} for c in CLIENTS], seed=0)


def _init():
    return {"t": numpy_to_arrays({"w": np.zeros(2, np.float32)})}


def test_start_twice_is_two_fresh_identical_runs():
    """start() is re-entrant: the second call starts from scratch (new RNG from
    the seed, empty client table, fresh copies of policy and aggregator)."""
    pol = RanklistMultiUCB(1)
    strategy = MultiModelStrategy(pol, FedAvgAggregator(), seed=4, node_wait_timeout=0.0)
    first = strategy.start(_grid(), _init(), num_rounds=3, timeout=30)
    assert strategy.policy is pol and pol.N  # the first run uses the given objects
    second = strategy.start(_grid(), _init(), num_rounds=3, timeout=30)
    assert strategy.policy is not pol
    assert second.assignments == first.assignments
    assert [r["step_l1"] for r in second.history] == [r["step_l1"] for r in first.history]
    np.testing.assert_array_equal(second.arrays["t"]["w"].numpy(), first.arrays["t"]["w"].numpy())


def test_summary_logs_every_constructor_argument():
    tap = LogTap()
    logging.getLogger("flwr").addHandler(tap)
    try:
        MultiModelStrategy(
            RandomAllocation(0.25),
            FedAvgAggregator(),
            local_epochs=3,
            lr=0.2,
            batch_size=7,
            seed=11,
            fraction_evaluate=0.5,
            evaluate_every=2,
            min_available_nodes=4,
            min_available_clients=5,
            node_wait_timeout=9.0,
            max_loss=123.0,
            loss_cap=50.0,
            max_update_norm=8.0,
            client_arrivals={"a": 2},
            task_arrivals={"t": 1},
            trainable_keys={"t": ["w"]},
            checkpoint_path="/tmp/ck",
        ).summary()
    finally:
        logging.getLogger("flwr").removeHandler(tap)
    text = "\n".join(m for _, m in tap.records)
    for piece in (
        "RandomAllocation(budget=0.25",
        "FedAvgAggregator()",
        "local_epochs=3",
        "lr=0.2",
        "batch_size=7",
        "fraction 0.5, every 2",
        "wait for 4 nodes and 5 clients at most 9 s",
        "max_loss=123.0",
        "loss_cap=50.0",
        "max_update_norm=8.0",
        "{'a': 2}",
        "{'t': 1}",
        "{'t': ['w']}",
        "/tmp/ck",
        "Seed: 11",
    ):
        assert piece in text, piece


def test_phase_observers_time_every_phase_and_round_trip_of_every_round():
    """The timing hook (benchmarks/bench_engines.py reads it): each round reports
    its phases in order, the round trips inside them with the grid that carried
    them (reported as they end), and a whole-round span at least as long as its phases; none is
    registered by default, and the run is the same with an observer."""
    from mmfl_flwr.config import Settings
    from mmfl_flwr.grid import InProcessGrid
    from mmfl_flwr.runner import run
    from mmfl_flwr.strategy.timing import PHASE_OBSERVERS

    settings = Settings(
        strategy="lvr",
        num_clients=4,
        num_rounds=2,
        local_epochs=1,
        fraction_evaluate=0.5,
        output_dir="",
    )
    assert PHASE_OBSERVERS == []
    plain = run(settings, engine="inprocess")
    seen = []
    PHASE_OBSERVERS.append(seen.append)
    try:
        timed = run(settings, engine="inprocess")
    finally:
        PHASE_OBSERVERS.clear()
    assert timed.assignments == plain.assignments
    for task, rec in plain.arrays.items():
        for key, arr in rec.items():
            np.testing.assert_array_equal(arr.numpy(), timed.arrays[task][key].numpy())
    # in the order they end: a round trip before the phase that holds it
    phases = [
        "rt:query.info",
        "registration",
        "rt:query.losses",
        "loss_query",
        "plan",
        "rt:train",
        "train",
        "aggregate",
        "rt:evaluate",
        "client_eval",
        "server_eval",
        "round",
    ]
    for rnd in (1, 2):
        events = [t for t in seen if t.round == rnd]
        names = [t.phase for t in events]
        # new nodes are asked for their info in round 1 only
        assert names == [p for p in phases if rnd == 1 or p != "rt:query.info"], names
        assert all(t.seconds >= 0 for t in events)
        assert all(isinstance(t.grid, InProcessGrid) for t in events if t.phase.startswith("rt:"))
        assert all(t.grid is None for t in events if not t.phase.startswith("rt:"))
        whole = next(t.seconds for t in events if t.phase == "round")
        assert whole >= sum(
            t.seconds for t in events if t.phase != "round" and not t.phase.startswith("rt:")
        )
