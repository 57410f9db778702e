"""Tests of MultiModelStrategy on the in-process engine (InProcessGrid).

The clients are tiny numpy-only fakes: a trainer for task ``t`` on client ``c``
returns ``w - step[c, t]`` for every array, so after one round of FedAvg every
entry of the global model of ``t`` equals ``w - sum_c n_c step_c / sum_c n_c``
over the clients whose update was accepted. Every expected number below is
computed by hand from that formula, never by the code under test.

Hostile clients are emulated by wrapping the honest ClientApp callable and
rewriting the reply of one chosen client ("mallory"), or by a Grid subclass
that duplicates replies.
"""

from __future__ import annotations

import copy
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from conftest import node_of
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from harness import ClientDef, FedRun, fake_client_app, run_federation, zero_models

from mmfl_flwr import protocol as P
from mmfl_flwr.core import (
    ClientTable,
    FullParticipation,
    MFARand,
    MFARoundRobin,
    MultiFedAvg,
    Pick,
    Policy,
    RandomAllocation,
)
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.records import arrays_to_numpy, numpy_to_arrays
from mmfl_flwr.strategy import MultiModelResult, MultiModelStrategy

TASKS = ("a", "b")
SHAPES = {"w": (2, 3), "b": (3,)}
HOSTILE = "mallory"


# --------------------------------------------------------------------- fakes
def make_app(clients: dict[str, ClientDef]):
    return fake_client_app(clients)


def initial_arrays(tasks: Sequence[str] = TASKS) -> dict[str, ArrayRecord]:
    return zero_models(tasks, SHAPES)


def run_strategy(
    clients: dict[str, ClientDef],
    policy: Policy | None = None,
    rounds: int = 2,
    wrap: Callable[[Any], Any] | None = None,
    grid_cls: type[InProcessGrid] = InProcessGrid,
    hook: Callable[[int, InProcessGrid, MultiModelStrategy], None] | None = None,
    tasks: Sequence[str] = TASKS,
    **kwargs: Any,
) -> FedRun:
    """Run the strategy; after every round, assert every global model is finite
    and every task has its row."""
    kwargs.setdefault("seed", 0)
    # the fakes' honest steps differ up to 8x, beyond the default update clip
    # (tests/strategy/test_update_clipping.py); these tests check FedAvg by hand
    kwargs.setdefault("update_clip_factor", None)
    strategy = MultiModelStrategy(
        policy if policy is not None else FullParticipation(), node_wait_timeout=0.0, **kwargs
    )

    def check_round(rnd: int, rows: list[dict[str, Any]]) -> None:
        assert {r["task"] for r in rows} == set(tasks)

    def grid_hook(rnd: int, run: FedRun) -> None:
        if hook is not None:
            hook(rnd, run.grid, run.strategy)

    return run_federation(
        strategy,
        make_app(clients),
        {c: {"cid": c} for c in clients},
        initial_arrays(tasks),
        rounds,
        wrap=wrap,
        grid_factory=lambda rec, cfgs: grid_cls(rec, cfgs, seed=0),
        hook=grid_hook,
        check_round=check_round,
    )


def fedavg_step(clients: dict[str, ClientDef], task: str, cids: Sequence[str]) -> float:
    """The FedAvg step of ``task`` over ``cids``, by hand."""
    if not cids:
        return 0.0
    num = sum(clients[c].tasks[task][0] * clients[c].tasks[task][1] for c in cids)
    den = sum(clients[c].tasks[task][0] for c in cids)
    return num / den


def assert_global(run: FedRun, task: str, value: float, rnd: int | None = None) -> None:
    w = run.snapshots[rnd] if rnd is not None else run.strategy.weights
    for k, v in w[task].items():
        assert v.dtype == np.float32 and v.shape == SHAPES[k]
        np.testing.assert_allclose(
            v,
            np.full(SHAPES[k], value),
            rtol=1e-6,
            atol=1e-6,
            err_msg=f"task {task} array {k} round {rnd}",
        )
    if rnd is None:
        final = arrays_to_numpy(run.result.arrays[task])
        for k, v in final.items():
            np.testing.assert_allclose(v, np.full(SHAPES[k], value), rtol=1e-6, atol=1e-6)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("flwr") and r.levelno >= logging.WARNING
    ]


def rows_of(result: MultiModelResult, rnd: int) -> dict[str, dict[str, Any]]:
    return {r["task"]: r for r in result.history if r["round"] == rnd}


class FixedPolicy(Policy):
    """Picks given per round (the same every round if a list)."""

    name = "fixed"

    def __init__(self, picks: list[tuple[str, str]]) -> None:
        self.picks = picks

    def assign(self, table: ClientTable, tasks, server_round, rng):
        online = set(table.ids())
        return [Pick(c, t) for c, t in self.picks if c in online and t in tasks]


# ------------------------------------------------------------ federations
def honest() -> dict[str, ClientDef]:
    return {
        "alice": ClientDef({"a": (10, 0.5), "b": (30, 1.0)}),
        "bob": ClientDef({"a": (30, 1.0), "b": (10, 2.0)}),
        "carol": ClientDef({"a": (20, 2.0)}),
        "dave": ClientDef({"b": (20, 0.25)}),
    }


def with_mallory() -> dict[str, ClientDef]:
    c = honest()
    c[HOSTILE] = ClientDef({"a": (40, 4.0), "b": (40, -1.0)})
    return c


GOOD = ("alice", "bob", "carol", "dave")


def good_for(clients: dict[str, ClientDef], task: str, cids: Sequence[str] = GOOD) -> list[str]:
    return [c for c in cids if task in clients[c].tasks]


# ====================================================== 0. a sanity baseline
def test_honest_run_matches_hand_computed_fedavg(caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    clients = with_mallory()  # mallory is honest here
    run = run_strategy(clients, rounds=2)
    every = list(clients)
    for task in TASKS:
        step = fedavg_step(clients, task, good_for(clients, task, every))
        assert_global(run, task, -step, rnd=1)
        assert_global(run, task, -2 * step)
        row = rows_of(run.result, 2)[task]
        assert row["uploads"] == len(good_for(clients, task, every))
        assert row["assigned"] == row["uploads"] and row["rejected"] == 0
        assert row["train_loss"] == pytest.approx(0.5)
        # step_l1 = |w_old - w_new|_1 = |step| * number of entries
        assert row["step_l1"] == pytest.approx(abs(step) * 9, rel=1e-6)
    # Round 0 is the initial model.
    assert {r["task"] for r in run.result.history if r["round"] == 0} == set(TASKS)
    assert warnings_of(caplog) == []


# ======================================= 1. each node receives only its picks
POLICIES = {
    "full": lambda: FullParticipation(),
    "random": lambda: RandomAllocation(budget_fraction=0.6),
    "multi-fedavg": lambda: MultiFedAvg(3),
    "mfa-rand": lambda: MFARand(4),
    "mfa-rr": lambda: MFARoundRobin(),
}


def assignment_federation() -> dict[str, ClientDef]:
    return {
        "0": ClientDef({"a": (10, 0.1), "b": (10, 0.2), "c": (10, 0.3)}, processors=3),
        "1": ClientDef({"a": (20, 0.1), "b": (20, 0.2)}, processors=2),
        "2": ClientDef({"b": (30, 0.2), "c": (30, 0.3)}, processors=2),
        "3": ClientDef({"a": (15, 0.1)}),
        "4": ClientDef({"c": (25, 0.3)}),
        "5": ClientDef({"a": (5, 0.1), "b": (5, 0.2), "c": (5, 0.3)}, processors=3),
    }


@pytest.mark.parametrize("name", list(POLICIES))
def test_each_node_receives_only_its_assigned_models(name):
    clients = assignment_federation()
    tasks = ("a", "b", "c")
    rounds = 6
    run = run_strategy(clients, POLICIES[name](), rounds=rounds, tasks=tasks, seed=3)
    train = run.rec.of_type("train")
    multi_model_messages = 0
    total_picks = 0
    for rnd in range(1, rounds + 1):
        expected: dict[str, list[str]] = {}
        for cid, task, count in run.result.assignments[rnd]:
            expected.setdefault(cid, []).append(task)
            assert count >= 1
            assert task in clients[cid].tasks, "a client got a task it holds no data for"
        total_picks += len(run.result.assignments[rnd])
        got = [r for r in train if r.round == rnd]
        per_node = Counter(r.node for r in got)
        assert all(v == 1 for v in per_node.values()), f"round {rnd}: {per_node}"
        received = {r.cid: sorted(r.arrays) for r in got}
        assert received == {
            cid: sorted(P.arrays_key(t) for t in ts) for cid, ts in expected.items()
        }, f"round {rnd}"
        for r in got:
            # the node is the one registered for the client
            assert r.node == node_of(run.grid, r.cid)
            assert sorted(r.config[P.CFG_TASKS]) == sorted(expected[r.cid])
            assert r.config[P.CFG_ROUND] == rnd
            # what is sent is the current global model of each task
            for key, arrs in r.arrays.items():
                task = P.task_of(key, P.ARRAYS_PREFIX)
                for k, v in arrs.items():
                    np.testing.assert_array_equal(v, run.snapshots[rnd - 1][task][k])
            multi_model_messages += len(r.arrays) > 1
        # history's "assigned" agrees with the picks
        for task in tasks:
            assigned = sum(1 for _, t, _ in run.result.assignments[rnd] if t == task)
            assert rows_of(run.result, rnd)[task]["assigned"] == assigned
            assert rows_of(run.result, rnd)[task]["uploads"] == assigned
    assert total_picks > 0
    if name in ("full", "random"):
        # these policies give some client several models in one round: the test
        # must actually have seen a multi-model message
        assert multi_model_messages > 0
    # no node ever got a query.losses (no policy here needs losses)
    assert run.rec.of_type(P.QUERY_LOSSES) == []
    # one info query per node, in round 1 only
    info = run.rec.of_type(P.QUERY_INFO)
    assert sorted(r.cid for r in info) == sorted(clients) and {r.round for r in info} == {1}


# ============================================ 2. bad replies, one by one
def _arrays(content: RecordDict, task: str) -> ArrayRecord:
    return content.array_records[P.arrays_key(task)]


def _metrics(content: RecordDict, task: str) -> MetricRecord:
    return content.metric_records[P.metrics_key(task)]


def _set(task: str, key: str, fn: Callable[[np.ndarray], np.ndarray]):
    def mutate(content: RecordDict) -> None:
        rec = _arrays(content, task)
        rec[key] = Array(np.ascontiguousarray(fn(rec[key].numpy())))

    return mutate


def _nan(v):
    v = v.copy()
    v.flat[1] = np.nan
    return v


def _inf(sign):
    def f(v):
        v = v.copy()
        v.flat[0] = sign * np.inf
        return v

    return f


def _drop_task(content):
    del content[P.arrays_key("a")]
    del content[P.metrics_key("a")]


def _drop_arrays_only(content):
    del content[P.arrays_key("a")]


def _extra_unknown_task(content):
    content[P.arrays_key("zzz")] = numpy_to_arrays(arrays_to_numpy(_arrays(content, "a")))
    content[P.metrics_key("zzz")] = MetricRecord({P.NUM_EXAMPLES: 5, P.TRAIN_LOSS: 0.1})


def _drop_key(content):
    del _arrays(content, "a")["b"]


def _extra_key(content):
    _arrays(content, "a")["extra"] = Array(np.zeros(3, np.float32))


def _corrupt_bytes(content):
    _arrays(content, "a")["w"] = Array(
        dtype="float32", shape=(2, 3), stype="numpy.ndarray", data=b"\x00garbage bytes"
    )


def _metric(name, value):
    def mutate(content):
        _metrics(content, "a")[name] = value

    return mutate


def _drop_metric(name):
    def mutate(content):
        del _metrics(content, "a")[name]

    return mutate


def _drop_metrics(content):
    del content[P.metrics_key("a")]


def _metrics_as_config(content):
    # the metrics arrive under the right key, but as a ConfigRecord
    m = dict(_metrics(content, "a"))
    del content[P.metrics_key("a")]
    content[P.metrics_key("a")] = ConfigRecord(m)


# name -> (mutation of mallory's train reply, tasks of mallory expected rejected,
#          substring the warning must contain besides the client id)
BAD_REPLIES: dict[str, tuple[Callable[[RecordDict], None], set[str], str]] = {
    "nan-weights": (_set("a", "w", _nan), {"a"}, "nan"),
    "inf-weights": (_set("a", "b", _inf(1)), {"a"}, "inf"),
    "minus-inf-weights": (_set("a", "w", _inf(-1)), {"a"}, "inf"),
    "missing-task": (_drop_task, {"a"}, "'a'"),
    "missing-task-arrays": (_drop_arrays_only, {"a"}, "'a'"),
    "unknown-task-key": (_extra_unknown_task, set(), "arrays.zzz"),
    "wrong-shape": (_set("a", "w", lambda v: v.reshape(3, 2)), {"a"}, "shape"),
    "wrong-shape-size": (_set("a", "b", lambda v: np.zeros(4, np.float32)), {"a"}, "shape"),
    "wrong-dtype-float64": (_set("a", "w", lambda v: v.astype(np.float64)), {"a"}, "dtype"),
    "wrong-dtype-int": (_set("a", "b", lambda v: v.astype(np.int32)), {"a"}, "dtype"),
    "missing-array-key": (_drop_key, {"a"}, "missing"),
    "unexpected-array-key": (_extra_key, {"a"}, "unexpected"),
    "corrupt-bytes": (_corrupt_bytes, {"a"}, "decode"),
    "num-examples-zero": (_metric(P.NUM_EXAMPLES, 0), {"a"}, P.NUM_EXAMPLES),
    "num-examples-negative": (_metric(P.NUM_EXAMPLES, -5), {"a"}, P.NUM_EXAMPLES),
    "num-examples-absurd-float": (_metric(P.NUM_EXAMPLES, 1e12), {"a"}, P.NUM_EXAMPLES),
    "num-examples-absurd-int": (_metric(P.NUM_EXAMPLES, 10**12), {"a"}, P.NUM_EXAMPLES),
    "num-examples-nan": (_metric(P.NUM_EXAMPLES, math.nan), {"a"}, P.NUM_EXAMPLES),
    "num-examples-fractional": (_metric(P.NUM_EXAMPLES, 2.5), {"a"}, P.NUM_EXAMPLES),
    "num-examples-missing": (_drop_metric(P.NUM_EXAMPLES), {"a"}, P.NUM_EXAMPLES),
    "missing-metrics-record": (_drop_metrics, {"a"}, P.metrics_key("a")),
    "metrics-wrong-record-type": (_metrics_as_config, {"a"}, P.metrics_key("a")),
    "train-loss-absurd": (_metric(P.TRAIN_LOSS, 1e9), {"a"}, P.TRAIN_LOSS),
    "train-loss-nan": (_metric(P.TRAIN_LOSS, math.nan), {"a"}, P.TRAIN_LOSS),
    "train-loss-inf": (_metric(P.TRAIN_LOSS, math.inf), {"a"}, P.TRAIN_LOSS),
    "train-loss-negative": (_metric(P.TRAIN_LOSS, -1.0), {"a"}, P.TRAIN_LOSS),
}


def hostile_train(mutate: Callable[[RecordDict], None], who: str = HOSTILE):
    def wrap(app):
        def call(msg: Message, ctx: Context) -> Message:
            reply = app(msg, ctx)
            if ctx.node_config["cid"] == who and msg.metadata.message_type == "train":
                mutate(reply.content)
            return reply

        return call

    return wrap


@pytest.mark.parametrize("case", list(BAD_REPLIES))
def test_bad_train_reply_is_rejected_logged_and_others_aggregate(case, caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    mutate, rejected, detail = BAD_REPLIES[case]
    clients = with_mallory()
    run = run_strategy(clients, rounds=2, wrap=hostile_train(mutate))
    for task in TASKS:
        accepted = good_for(clients, task) + ([] if task in rejected else [HOSTILE])
        step = fedavg_step(clients, task, accepted)
        assert_global(run, task, -step, rnd=1)
        assert_global(run, task, -2 * step)
        for rnd in (1, 2):
            row = rows_of(run.result, rnd)[task]
            assert row["uploads"] == len(accepted)
            assert row["rejected"] == (1 if task in rejected else 0)
            assert row["assigned"] == len(good_for(clients, task)) + 1
    msgs = warnings_of(caplog)
    mine = [m for m in msgs if HOSTILE in m]
    # one warning per round at least, naming the client and the problem
    assert len(mine) >= 2, msgs
    assert all(detail.lower() in m.lower() for m in mine), mine
    if rejected:
        assert all("'a'" in m for m in mine), mine
    # nobody else is blamed
    assert not [m for m in msgs if any(c in m for c in GOOD)], msgs
    # train losses averaged over the accepted updates only (fake loss is 0.5)
    for task in TASKS:
        assert rows_of(run.result, 2)[task]["train_loss"] == pytest.approx(0.5)


def test_arrays_of_a_known_but_unassigned_task_are_not_aggregated(caplog):
    """Mallory is assigned only "b" but also sends an update for "a"."""
    caplog.set_level(logging.WARNING, logger="flwr")
    clients = with_mallory()
    picks = [(c, t) for c in GOOD for t in clients[c].tasks] + [(HOSTILE, "b")]

    def add_a(content):
        content[P.arrays_key("a")] = numpy_to_arrays(
            {k: np.full(s, 100.0, np.float32) for k, s in SHAPES.items()}
        )
        content[P.metrics_key("a")] = MetricRecord({P.NUM_EXAMPLES: 40, P.TRAIN_LOSS: 0.1})

    run = run_strategy(clients, FixedPolicy(picks), rounds=2, wrap=hostile_train(add_a))
    assert_global(run, "a", -2 * fedavg_step(clients, "a", good_for(clients, "a")))
    assert_global(run, "b", -2 * fedavg_step(clients, "b", good_for(clients, "b") + [HOSTILE]))
    mine = [m for m in warnings_of(caplog) if HOSTILE in m]
    assert len(mine) == 2 and all(P.arrays_key("a") in m for m in mine), mine


class DuplicatingGrid(InProcessGrid):
    """Returns every train reply of the hostile node twice; the copy comes with
    a different (but valid) model, so counting it would change the aggregate."""

    def send_and_receive(self, messages, *, timeout=None):
        replies = list(super().send_and_receive(messages, timeout=timeout))
        out = []
        for r in replies:
            out.append(r)
            node_cid = self.context(r.metadata.src_node_id).node_config["cid"]
            if node_cid == HOSTILE and r.metadata.message_type == "train":
                dup = copy.deepcopy(r)
                for key, rec in list(dup.content.array_records.items()):
                    dup.content[key] = numpy_to_arrays(
                        {k: v + np.float32(7.0) for k, v in arrays_to_numpy(rec).items()}
                    )
                out.append(dup)
                out.append(copy.deepcopy(r))
        return out


def test_duplicated_replies_count_once_and_are_logged(caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    clients = with_mallory()
    run = run_strategy(clients, rounds=2, grid_cls=DuplicatingGrid)
    for task in TASKS:
        accepted = good_for(clients, task) + [HOSTILE]
        assert_global(run, task, -2 * fedavg_step(clients, task, accepted))
        assert rows_of(run.result, 2)[task]["uploads"] == len(accepted)
    mine = [m for m in warnings_of(caplog) if HOSTILE in m]
    assert len(mine) == 4 and all("duplicate" in m.lower() for m in mine), mine


# ======================================= 3. failures, churn, bad self-descriptions
def test_client_raising_in_train_does_not_stop_the_run(caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    clients = with_mallory()
    clients[HOSTILE].fail_train = True
    run = run_strategy(clients, rounds=3)
    for task in TASKS:
        step = fedavg_step(clients, task, good_for(clients, task))
        assert_global(run, task, -3 * step)
        assert rows_of(run.result, 3)[task]["rejected"] == 1
    mine = [m for m in warnings_of(caplog) if HOSTILE in m]
    assert len(mine) == 3 and all("failed to train" in m for m in mine), mine
    assert all("simulated crash" in m for m in mine)
    # mallory stays registered and keeps being asked
    assert all(HOSTILE in {c for c, _, _ in run.result.assignments[r]} for r in (1, 2, 3))


def test_node_removed_between_rounds_does_not_stop_the_run():
    clients = with_mallory()
    removed: dict[str, int] = {}

    def hook(rnd, grid, strategy):
        if rnd == 1:
            removed["carol"] = node_of(grid, "carol")
            grid.remove_node(removed["carol"])

    run = run_strategy(clients, rounds=3, hook=hook)
    everyone = list(clients)
    without = [c for c in everyone if c != "carol"]
    for task in TASKS:
        s1 = fedavg_step(clients, task, good_for(clients, task, everyone))
        s2 = fedavg_step(clients, task, good_for(clients, task, without))
        assert_global(run, task, -s1, rnd=1)
        assert_global(run, task, -s1 - 2 * s2)
    assert "carol" in {c for c, _, _ in run.result.assignments[1]}
    for rnd in (2, 3):
        assert "carol" not in {c for c, _, _ in run.result.assignments[rnd]}
        assert not [r for r in run.rec.log if r.round == rnd and r.cid == "carol"]
    assert run.strategy.table.ids() == sorted(without)
    assert "carol" in run.strategy.table.ids(online_only=False)


def test_node_vanishing_while_training_does_not_stop_the_run(caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    clients = with_mallory()
    holder: dict[str, InProcessGrid] = {}

    def wrap(app):
        def call(msg, ctx):
            reply = app(msg, ctx)
            if (
                ctx.node_config["cid"] == HOSTILE
                and msg.metadata.message_type == "train"
                and msg.metadata.group_id == "2"
            ):
                holder["grid"].remove_node(ctx.node_id)  # gone before replying
            return reply

        return call

    def hook(rnd, grid, strategy):
        holder["grid"] = grid

    run = run_strategy(clients, rounds=3, wrap=wrap, hook=hook)
    everyone = list(clients)
    for task in TASKS:
        s_all = fedavg_step(clients, task, good_for(clients, task, everyone))
        s_good = fedavg_step(clients, task, good_for(clients, task))
        assert_global(run, task, -s_all - 2 * s_good)
        assert rows_of(run.result, 2)[task]["rejected"] == 1
        assert rows_of(run.result, 3)[task]["rejected"] == 0
    mine = [m for m in warnings_of(caplog) if HOSTILE in m]
    assert len(mine) == 1 and "no train reply" in mine[0], mine
    assert HOSTILE not in {c for c, _, _ in run.result.assignments[3]}


def test_node_added_mid_run_registers_and_is_picked_later():
    clients = with_mallory()
    clients["late"] = ClientDef({"a": (50, 8.0), "b": (50, 8.0)})
    start = {c: d for c, d in clients.items() if c != "late"}
    added: dict[str, int] = {}

    def hook(rnd, grid, strategy):
        if rnd == 1:
            assert "late" not in strategy.table
            added["late"] = grid.add_node({"cid": "late"})

    # the ClientApp knows "late", but the grid starts without it
    app_clients = clients

    def wrap(app):
        return make_app(app_clients)

    run = run_strategy(start, rounds=3, hook=hook, wrap=wrap)
    assert "late" not in {c for c, _, _ in run.result.assignments[1]}
    for rnd in (2, 3):
        picked = {c for c, _, _ in run.result.assignments[rnd]}
        assert "late" in picked
        got = [r for r in run.rec.of_type("train") if r.round == rnd and r.cid == "late"]
        assert len(got) == 1 and got[0].node == added["late"]
    info = [r for r in run.rec.of_type(P.QUERY_INFO) if r.cid == "late"]
    assert len(info) == 1 and info[0].round == 2
    everyone = list(start)
    with_late = everyone + ["late"]
    for task in TASKS:
        s1 = fedavg_step(clients, task, good_for(clients, task, everyone))
        s2 = fedavg_step(clients, task, good_for(clients, task, with_late))
        assert_global(run, task, -s1 - 2 * s2)


def test_client_that_reconnects_with_a_new_node_id_is_picked_again():
    clients = with_mallory()
    nodes: dict[int, int] = {}

    def hook(rnd, grid, strategy):
        if rnd == 1:
            nodes[1] = node_of(grid, "carol")
            grid.remove_node(nodes[1])
        if rnd == 2:
            nodes[3] = grid.add_node({"cid": "carol"})

    run = run_strategy(clients, rounds=3, hook=hook)
    assert "carol" not in {c for c, _, _ in run.result.assignments[2]}
    assert "carol" in {c for c, _, _ in run.result.assignments[3]}
    got = [r for r in run.rec.of_type("train") if r.cid == "carol"]
    assert [(r.round, r.node) for r in got] == [(1, nodes[1]), (3, nodes[3])]


def _info(**fields):
    base = {P.CLIENT_ID: HOSTILE, P.TASKS: ["a", "b"], P.NUM_EXAMPLES: [40, 40], P.PROCESSORS: 1}
    base.update(fields)
    return RecordDict({P.INFO_KEY: ConfigRecord({k: v for k, v in base.items() if v is not None})})


def _raise(msg, ctx):
    raise RuntimeError("cannot describe myself")


BAD_INFO: dict[str, Callable[[Message, Context], Message] | RecordDict] = {
    "processors-zero": _info(**{P.PROCESSORS: 0}),
    "processors-negative": _info(**{P.PROCESSORS: -2}),
    "processors-absurd": _info(**{P.PROCESSORS: 10**6}),
    "processors-string": _info(**{P.PROCESSORS: "two"}),
    "processors-float": _info(**{P.PROCESSORS: 1.5}),
    "processors-bool": _info(**{P.PROCESSORS: True}),
    "count-zero": _info(**{P.NUM_EXAMPLES: [0, 40]}),
    "count-negative": _info(**{P.NUM_EXAMPLES: [40, -3]}),
    "count-absurd": _info(**{P.NUM_EXAMPLES: [10**12, 40]}),
    "count-float": _info(**{P.NUM_EXAMPLES: [40.0, 40.0]}),
    "count-not-a-list": _info(**{P.NUM_EXAMPLES: 40}),
    "lists-mismatched-short": _info(**{P.NUM_EXAMPLES: [40]}),
    "lists-mismatched-long": _info(**{P.NUM_EXAMPLES: [40, 40, 40]}),
    "duplicated-tasks": _info(**{P.TASKS: ["a", "a"]}),
    "missing-client-id": _info(**{P.CLIENT_ID: None}),
    "empty-client-id": _info(**{P.CLIENT_ID: ""}),
    "missing-tasks": _info(**{P.TASKS: None}),
    "missing-counts": _info(**{P.NUM_EXAMPLES: None}),
    "no-info-record": RecordDict({"something-else": ConfigRecord({"x": 1})}),
    "info-as-metrics": RecordDict({P.INFO_KEY: MetricRecord({P.PROCESSORS: 1})}),
    "raises": _raise,
}


@pytest.mark.parametrize("case", list(BAD_INFO))
def test_client_with_malformed_info_is_left_out_and_logged(case, caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    bad = BAD_INFO[case]

    def wrap(app):
        def call(msg, ctx):
            if ctx.node_config["cid"] == HOSTILE and msg.metadata.message_type == P.QUERY_INFO:
                if callable(bad):
                    return bad(msg, ctx)
                return Message(copy.deepcopy(bad), reply_to=msg)
            return app(msg, ctx)

        return call

    clients = with_mallory()
    run = run_strategy(clients, rounds=2, wrap=wrap)
    nid = node_of(run.grid, HOSTILE)
    assert HOSTILE not in run.strategy.table
    assert all(HOSTILE not in {c for c, _, _ in a} for a in run.result.assignments.values())
    assert [r.type for r in run.rec.log if r.cid == HOSTILE] == [P.QUERY_INFO, P.QUERY_INFO]
    for task in TASKS:
        assert_global(run, task, -2 * fedavg_step(clients, task, good_for(clients, task)))
    msgs = warnings_of(caplog)
    mine = [m for m in msgs if str(nid) in m]
    assert len(mine) == 2, msgs  # once per round: it is asked again each round
    assert len(msgs) == 2, msgs


def test_client_declaring_only_unknown_tasks_is_never_sent_work(caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    clients = honest()
    clients["zed"] = ClientDef({"zzz": (10, 1.0)})
    run = run_strategy(clients, rounds=2)
    assert all("zed" not in {c for c, _, _ in a} for a in run.result.assignments.values())
    assert [r.type for r in run.rec.log if r.cid == "zed"] == [P.QUERY_INFO]
    assert any("zed" in m and "zzz" in m for m in warnings_of(caplog))


def test_two_new_nodes_claiming_one_client_id_in_the_same_round(caplog):
    """Both nodes are new in round 1; only one may own the id "alice"."""
    caplog.set_level(logging.WARNING, logger="flwr")
    clients = honest()
    clients["impostor"] = ClientDef({"a": (10**6, 100.0)})

    def wrap(app):
        def call(msg, ctx):
            reply = app(msg, ctx)
            if ctx.node_config["cid"] == "impostor" and msg.metadata.message_type == P.QUERY_INFO:
                info = reply.content.config_records[P.INFO_KEY]
                info[P.CLIENT_ID] = "alice"
            return reply

        return call

    run = run_strategy(clients, rounds=2, wrap=wrap)
    msgs = warnings_of(caplog)
    claims = [m for m in msgs if "alice" in m and "claimed" in m]
    assert len(claims) == 2, msgs  # the losing node is asked again each round
    # exactly one node trains as "alice" each round, and the table holds that
    # node's declaration
    for rnd in (1, 2):
        alice_nodes = {
            r.node
            for r in run.rec.of_type("train")
            if r.round == rnd
            and r.node in (node_of(run.grid, "alice"), node_of(run.grid, "impostor"))
        }
        assert len(alice_nodes) == 1
    (kept,) = alice_nodes
    owner = run.grid.context(kept).node_config["cid"]
    declared = {"alice": {"a": 10, "b": 30}, "impostor": {"a": 10**6}}[owner]
    assert run.strategy.table["alice"].num_examples == declared
    assert str(kept) in claims[0].split("keeping")[-1]


# ===================================================== 4. the loss query
class GreedyLoss(Policy):
    """Needs losses; each task goes to the online client with the largest loss."""

    name = "greedy-loss"
    needs_losses = True

    def __init__(self) -> None:
        self.seen: dict[int, dict[tuple[str, str], tuple[float, int]]] = {}

    def assign(self, table, tasks, server_round, rng):
        self.seen[server_round] = {
            (c.cid, t): (c.losses[t], c.loss_round[t]) for c in table.clients() for t in c.losses
        }
        picks = []
        for t in tasks:
            cands = [c for c in table.clients() if t in c.losses]
            if cands:
                best = max(cands, key=lambda c: c.losses[t])
                picks.append(Pick(best.cid, t))
        return picks


def loss_federation() -> dict[str, ClientDef]:
    c = honest()
    c["alice"].losses = {"a": 0.3, "b": 0.9}
    c["bob"].losses = {"a": 0.7, "b": 0.2}
    c["carol"].losses = {"a": 0.1}
    c["dave"].losses = {"b": 0.0}
    # hostile: their (rejected) losses would otherwise win every task
    c["mallory"] = ClientDef({"a": (40, 4.0), "b": (40, -1.0)}, losses={"a": math.nan, "b": -2.0})
    c["trudy"] = ClientDef({"a": (40, 4.0), "b": (40, -1.0)}, losses={"a": 1e9, "b": math.inf})
    c["eve"] = ClientDef({"a": (5, 3.0)}, losses={"a": 0.05})
    return c


def test_loss_query_before_training_fills_the_table_and_rejects_bad_losses(caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    clients = loss_federation()

    def wrap(app):
        def call(msg, ctx):
            reply = app(msg, ctx)
            if ctx.node_config["cid"] == "eve" and msg.metadata.message_type == P.QUERY_LOSSES:
                reply.content.metric_records[P.LOSSES_KEY]["zzz"] = 0.5
            return reply

        return call

    policy = GreedyLoss()
    rounds = 3
    run = run_strategy(clients, policy, rounds=rounds, wrap=wrap)
    good = {
        (c, t): v
        for c in ("alice", "bob", "carol", "dave", "eve")
        for t, v in clients[c].losses.items()
    }
    for rnd in range(1, rounds + 1):
        in_round = [r for r in run.rec.log if r.round == rnd]
        lq = [r for r in in_round if r.type == P.QUERY_LOSSES]
        # one loss query per client per round, carrying every task it holds,
        # each at the current global weights
        assert sorted(r.cid for r in lq) == sorted(clients)
        assert len({r.node for r in lq}) == len(clients)
        for r in lq:
            assert sorted(r.arrays) == sorted(P.arrays_key(t) for t in clients[r.cid].tasks)
            for key, arrs in r.arrays.items():
                task = P.task_of(key, P.ARRAYS_PREFIX)
                for k, v in arrs.items():
                    np.testing.assert_array_equal(v, run.snapshots[rnd - 1][task][k])
        # all loss queries come before any train message of the round
        kinds = [r.type for r in in_round if r.type != P.QUERY_INFO]
        assert kinds == sorted(kinds, key=lambda k: k != P.QUERY_LOSSES)
        # the policy saw exactly the valid losses, reported this round
        assert policy.seen[rnd] == {k: (v, rnd) for k, v in good.items()}
        # the largest valid loss wins
        assert sorted(run.result.assignments[rnd]) == [("alice", "b", 1), ("bob", "a", 1)]
    for (cid, task), v in good.items():
        assert run.strategy.table[cid].losses[task] == v
    for cid in ("mallory", "trudy"):
        assert run.strategy.table[cid].losses == {}
    assert "zzz" not in run.strategy.table["eve"].losses
    msgs = warnings_of(caplog)
    for cid in ("mallory", "trudy"):
        mine = [m for m in msgs if cid in m]
        assert len(mine) == 2 * rounds, mine  # two bad tasks per round
        assert all("loss" in m for m in mine)
    eve = [m for m in msgs if "eve" in m]
    assert len(eve) == rounds and all("zzz" in m for m in eve), eve
    assert not [m for m in msgs if any(c in m for c in GOOD)], msgs


def test_loss_query_error_or_missing_record_is_logged_and_survived(caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    clients = loss_federation()
    del clients["mallory"], clients["trudy"]
    clients["alice"].losses = {"a": 5.0, "b": 5.0}  # alice would win both if heard

    def wrap(app):
        def call(msg, ctx):
            cid = ctx.node_config["cid"]
            if msg.metadata.message_type == P.QUERY_LOSSES:
                if cid == "alice":
                    raise RuntimeError("loss query exploded")
                if cid == "eve":
                    return Message(RecordDict({"nope": MetricRecord({"a": 0.1})}), reply_to=msg)
            return app(msg, ctx)

        return call

    run = run_strategy(clients, GreedyLoss(), rounds=2, wrap=wrap)
    for rnd in (1, 2):
        assert sorted(run.result.assignments[rnd]) == [("bob", "a", 1), ("bob", "b", 1)]
    msgs = warnings_of(caplog)
    assert len([m for m in msgs if "alice" in m and "exploded" in m]) == 2, msgs
    assert len([m for m in msgs if "eve" in m and P.LOSSES_KEY in m]) == 2, msgs


# ======================================= 5. client-side evaluation
def test_client_side_evaluation_gives_client_accuracy_in_history(caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    clients = honest()
    clients["alice"].evals = {"a": (0.4, 0.8, 10), "b": (1.0, 0.25, 30)}
    clients["bob"].evals = {"a": (0.8, 0.6, 30), "b": (2.0, 0.5, 10)}
    clients["carol"].evals = {"a": (0.2, 1.0, 20)}
    clients["dave"].evals = {"b": (0.5, 0.75, 20)}
    # a hostile evaluator whose numbers must not enter the mean
    clients[HOSTILE] = ClientDef(
        {"a": (40, 4.0), "b": (40, -1.0)}, evals={"a": (0.1, 1.5, 1000), "b": (math.nan, 0.9, 1000)}
    )
    run = run_strategy(clients, rounds=2, fraction_evaluate=1.0)
    expected = {}
    for task in TASKS:
        cs = good_for(clients, task)
        n = sum(clients[c].evals[task][2] for c in cs)
        expected[task] = (
            sum(clients[c].evals[task][1] * clients[c].evals[task][2] for c in cs) / n,
            sum(clients[c].evals[task][0] * clients[c].evals[task][2] for c in cs) / n,
        )
    # by hand: a = (0.8*10 + 0.6*30 + 1.0*20) / 60
    assert expected["a"][0] == pytest.approx(46 / 60)
    for rnd in (1, 2):
        rows = rows_of(run.result, rnd)
        for task in TASKS:
            assert rows[task]["client_accuracy"] == pytest.approx(expected[task][0])
            assert rows[task]["client_loss"] == pytest.approx(expected[task][1])
        ev = [r for r in run.rec.of_type("evaluate") if r.round == rnd]
        assert sorted(r.cid for r in ev) == sorted(clients)
        for r in ev:
            assert sorted(r.arrays) == sorted(P.arrays_key(t) for t in clients[r.cid].tasks)
    # server-side evaluation is absent: NaN
    assert math.isnan(rows_of(run.result, 2)["a"]["accuracy"])
    mine = [m for m in warnings_of(caplog) if HOSTILE in m]
    assert len(mine) == 4 and all("evaluation" in m for m in mine), mine


def test_no_client_evaluation_by_default():
    run = run_strategy(honest(), rounds=1)
    assert run.rec.of_type("evaluate") == []
    assert all("client_accuracy" not in r for r in run.result.history)


def test_server_side_evaluate_fn_sees_the_aggregated_model():
    clients = honest()
    seen: list[tuple[int, str, float]] = []

    def evaluate_fn(rnd, task, arrays):
        w = arrays_to_numpy(arrays)["w"]
        seen.append((rnd, task, float(w[0, 0])))
        return {"accuracy": 0.5, "loss": float(-w[0, 0])}

    app = make_app(clients)
    grid = InProcessGrid(app, [{"cid": c} for c in clients], seed=0)
    strategy = MultiModelStrategy(FullParticipation(), node_wait_timeout=0.0)
    result = strategy.start(grid, initial_arrays(), num_rounds=2, evaluate_fn=evaluate_fn)
    for rnd in (0, 1, 2):
        for task in TASKS:
            step = fedavg_step(clients, task, good_for(clients, task))
            row = rows_of(result, rnd)[task]
            assert row["loss"] == pytest.approx(rnd * step, rel=1e-6)
            assert row["accuracy"] == 0.5
    assert [(r, t) for r, t, _ in seen] == [(r, t) for r in (0, 1, 2) for t in TASKS]


def test_client_evaluation_of_a_task_it_was_not_sent_is_rejected(caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    clients = honest()
    for c in clients.values():
        c.evals = {t: (1.0, 0.5, 10) for t in c.tasks}

    def wrap(app):
        def call(msg, ctx):
            reply = app(msg, ctx)
            if ctx.node_config["cid"] == "dave" and msg.metadata.message_type == "evaluate":
                # dave holds only "b" and was sent only "b"
                reply.content[P.metrics_key("a")] = MetricRecord(
                    {P.NUM_EXAMPLES: 10**6, P.LOSS: 0.0, P.ACCURACY: 1.0}
                )
            return reply

        return call

    run = run_strategy(clients, rounds=1, wrap=wrap, fraction_evaluate=1.0)
    assert rows_of(run.result, 1)["a"]["client_accuracy"] == pytest.approx(0.5)
    assert any("dave" in m for m in warnings_of(caplog))


def test_policy_assigning_an_ineligible_task_does_not_crash_the_run():
    clients = honest()  # carol holds only "a"
    picks = [(c, t) for c in GOOD for t in clients[c].tasks] + [("carol", "b")]

    def wrap(app):
        def call(msg, ctx):
            if ctx.node_config["cid"] == "carol" and msg.metadata.message_type == "train":
                # a lenient client trains whatever it is sent
                content = RecordDict()
                for key, rec in msg.content.array_records.items():
                    w = arrays_to_numpy(rec)
                    content[key] = numpy_to_arrays({k: v - np.float32(2.0) for k, v in w.items()})
                    task = P.task_of(key, P.ARRAYS_PREFIX)
                    content[P.metrics_key(task)] = MetricRecord(
                        {P.NUM_EXAMPLES: 20, P.TRAIN_LOSS: 0.5}
                    )
                return Message(content, reply_to=msg)
            return app(msg, ctx)

        return call

    run = run_strategy(clients, FixedPolicy(picks), rounds=1, wrap=wrap)
    assert ("carol", "b", 1) not in run.result.assignments[1]
    assert_global(run, "b", -fedavg_step(clients, "b", good_for(clients, "b")))


def test_a_model_no_client_holds_is_named_once_at_the_start():
    """A model name that no registered client holds (a typo such as 'wines') is one
    warning in the first round, naming it and the names the clients do hold; it
    is not repeated, and a model that a client holds is not named."""
    clients = {"0": ClientDef({"a": (10, 1.0)}), "1": ClientDef({"a": (5, 1.0), "b": (4, 1.0)})}
    run = run_strategy(clients, tasks=("a", "b", "wines"), rounds=2)
    named = [m for m in run.warnings(1) if "no registered client holds" in m]
    assert len(named) == 1, run.warnings(1)
    assert "'wines'" in named[0] and "'a', 'b'" in named[0], named
    assert not [m for m in run.warnings(2) if "no registered client holds" in m]
    assert run.rows(1)["wines"]["uploads"] == 0


def test_one_array_record_given_to_start_is_a_clear_error():
    """FedAvg's habit, ``start(grid, ArrayRecord)``, names what MultiModelStrategy
    expects instead of failing on an array key as if it were a model name."""
    strategy = MultiModelStrategy(FullParticipation(), node_wait_timeout=0.0)
    grid = InProcessGrid(make_app({"0": ClientDef({"a": (10, 1.0)})}), [], seed=0)
    single = initial_arrays(("a",))["a"]
    with pytest.raises(TypeError) as err:
        strategy.start(grid, single, num_rounds=1)
    text = str(err.value)
    assert "one ArrayRecord" in text and "{'model-name': arrays}" in text, text
    assert "'w'" not in text  # not an array key taken for a model name


def _without_handlers(full, lacking_clients, missing=("losses",)):
    """A real flwr ClientApp that serves query.info, train and evaluate through
    ``full`` but, on the nodes of ``lacking_clients``, has no handler for the
    query actions in ``missing`` (Flower answers those with an error reply)."""
    from flwr.clientapp import ClientApp

    partial = ClientApp()

    @partial.query("info")
    def info(msg, ctx):
        return full(msg, ctx)

    if "losses" not in missing:

        @partial.query("losses")
        def losses(msg, ctx):
            return full(msg, ctx)

    @partial.train()
    def train(msg, ctx):
        return full(msg, ctx)

    @partial.evaluate()
    def evaluate(msg, ctx):
        return full(msg, ctx)

    def app(msg, ctx):
        return (partial if ctx.node_config["cid"] in lacking_clients else full)(msg, ctx)

    return app


def test_a_client_without_a_handler_the_strategy_needs_is_named_and_left_out():
    """A ClientApp with no query.losses handler under a loss-based policy: one
    ERROR naming the client and the handler, the client is left out of later
    rounds, and the others train on (issue 25)."""
    from mmfl_flwr.core.lvr import LVR

    clients = {
        c: ClientDef({"a": (10, 1.0), "b": (5, 1.0)}, losses={"a": 1.0, "b": 2.0})
        for c in ("0", "1", "2")
    }
    strategy = MultiModelStrategy(LVR(budget_fraction=1.0), node_wait_timeout=0.0, seed=0)
    app = _without_handlers(make_app(clients), {"1"})
    run = run_federation(
        strategy,
        app,
        {c: {"cid": c} for c in clients},
        initial_arrays(),
        3,
        grid_factory=lambda rec, cfgs: InProcessGrid(rec, cfgs, seed=0),
    )
    errors = [m for r in (1, 2, 3) for m in run.errors(r) if "no handler" in m]
    assert len(errors) == 1, errors
    assert "Client 1" in errors[0] and "'query.losses'" in errors[0], errors
    assert "1" not in run.picked(2) | run.picked(3)
    assert {"0", "2"} & (run.picked(2) | run.picked(3))


def test_no_client_that_can_serve_the_run_stops_it_with_one_error():
    """When every client's ClientApp lacks a handler the strategy needs, the run
    stops with one error naming it, instead of training nothing to the end."""
    from mmfl_flwr.core.lvr import LVR
    from mmfl_flwr.strategy.registration import NoClientCanServe

    clients = {c: ClientDef({"a": (10, 1.0), "b": (5, 1.0)}) for c in ("0", "1")}
    strategy = MultiModelStrategy(LVR(budget_fraction=1.0), node_wait_timeout=0.0, seed=0)
    app = _without_handlers(make_app(clients), {"0", "1"})
    with pytest.raises(NoClientCanServe) as err:
        run_federation(
            strategy,
            app,
            {c: {"cid": c} for c in clients},
            initial_arrays(),
            3,
            grid_factory=lambda rec, cfgs: InProcessGrid(rec, cfgs, seed=0),
        )
    text = str(err.value)
    assert "'query.losses'" in text and "make_client_app" in text and "\n" not in text, text


def test_the_result_records_which_parts_were_rejected_or_missing():
    """result.rejections names the (client, task) parts that did not reach the
    aggregate (assignments.png crosses them out); they add up to the rows'
    rejected counts."""
    clients = {
        "0": ClientDef({"a": (10, 1.0), "b": (5, 1.0)}),
        "1": ClientDef({"a": (5, 1.0), "b": (5, 1.0)}, fail_train=True),
    }
    run = run_strategy(clients, rounds=2)
    for rnd in (1, 2):
        parts = run.result.rejections[rnd]
        assert sorted(parts) == [("1", "a"), ("1", "b")], parts
        assert sum(r["rejected"] for r in run.rows(rnd).values()) == len(parts)


def _declaring(full, handlers, clients_affected):
    """``full``, whose info reply declares only ``handlers`` on the nodes of
    ``clients_affected`` (the optional ``handlers`` field of docs/protocol.md)."""
    from mmfl_flwr import protocol as P

    def app(msg, ctx):
        reply = full(msg, ctx)
        if msg.metadata.message_type == P.QUERY_INFO and ctx.node_config["cid"] in clients_affected:
            reply.content.config_records[P.INFO_KEY][P.HANDLERS] = list(handlers)
        return reply

    return app


@pytest.mark.parametrize(
    "fraction,declared,missing",
    [
        (0.0, ["query.info", "train", "evaluate"], "query.losses"),
        (1.0, ["query.info", "query.losses", "train"], "evaluate"),
    ],
)
def test_a_client_declaring_it_lacks_a_needed_handler_is_refused_at_registration(
    fraction, declared, missing
):
    """A ClientApp whose info reply declares its handlers and lacks one the
    strategy needs is named in one ERROR when it registers and is sent nothing
    else; the others train (issue 25)."""
    from mmfl_flwr.core.lvr import LVR

    clients = {
        c: ClientDef({"a": (10, 1.0), "b": (5, 1.0)}, losses={"a": 1.0, "b": 2.0})
        for c in ("0", "1", "2")
    }
    strategy = MultiModelStrategy(
        LVR(budget_fraction=1.0), node_wait_timeout=0.0, seed=0, fraction_evaluate=fraction
    )
    app = _declaring(make_app(clients), declared, {"1"})
    run = run_federation(
        strategy,
        app,
        {c: {"cid": c} for c in clients},
        initial_arrays(),
        2,
        grid_factory=lambda rec, cfgs: InProcessGrid(rec, cfgs, seed=0),
    )
    errors = [m for m in run.errors(1) if "declares no handler" in m]
    assert len(errors) == 1 and "Client 1" in errors[0] and f"'{missing}'" in errors[0], errors
    assert not [m for r in (1, 2) for m in run.errors(r) if "no handler" in m and m not in errors]
    assert {r.type for r in run.rec.log if r.cid == "1"} == {"query.info"}
    assert "1" not in run.picked(1) | run.picked(2) and run.picked(1)


def test_a_run_no_declared_client_can_serve_stops_at_registration():
    from mmfl_flwr.core.lvr import LVR
    from mmfl_flwr.strategy.registration import NoClientCanServe

    clients = {c: ClientDef({"a": (10, 1.0), "b": (5, 1.0)}) for c in ("0", "1")}
    strategy = MultiModelStrategy(LVR(budget_fraction=1.0), node_wait_timeout=0.0, seed=0)
    app = _declaring(make_app(clients), ["query.info", "train", "evaluate"], {"0", "1"})
    sent = []

    def watch(rec, cfgs):
        def recording(msg, ctx):
            sent.append(msg.metadata.message_type)
            return rec(msg, ctx)

        return InProcessGrid(recording, cfgs, seed=0)

    with pytest.raises(NoClientCanServe, match="'query.losses'"):
        run_federation(
            strategy, app, {c: {"cid": c} for c in clients}, initial_arrays(), 3, grid_factory=watch
        )
    assert set(sent) == {"query.info"}


def _hand_written(full, lacking_clients, missing):
    """A hand-written ClientApp (its info reply declares no handlers) that on the
    nodes of ``lacking_clients`` has no handler for the message types in
    ``missing`` ("train", "query.losses"); the rest is served by ``full``."""
    from flwr.clientapp import ClientApp

    partial = ClientApp()

    @partial.query("info")
    def info(msg, ctx):
        reply = full(msg, ctx)
        del reply.content.config_records[P.INFO_KEY][P.HANDLERS]
        return reply

    if "query.losses" not in missing:

        @partial.query("losses")
        def losses(msg, ctx):
            return full(msg, ctx)

    if "train" not in missing:

        @partial.train()
        def train(msg, ctx):
            return full(msg, ctx)

    @partial.evaluate()
    def evaluate(msg, ctx):
        return full(msg, ctx)

    def app(msg, ctx):
        return (partial if ctx.node_config["cid"] in lacking_clients else full)(msg, ctx)

    return app


def _sent_types(sent):
    def factory(rec, cfgs):
        def recording(msg, ctx):
            sent.append((msg.metadata.message_type, ctx.node_config["cid"]))
            return rec(msg, ctx)

        return InProcessGrid(recording, cfgs, seed=0)

    return factory


@pytest.mark.parametrize("policy", ["mfa-rand", "lvr"])
def test_a_one_round_run_without_a_train_handler_stops_in_that_round(policy):
    """Issue 62: a 1-round run (or the last round) whose ClientApps have no train
    handler returned "successfully" with 0 uploads; NoClientCanServe came only
    at the next round's registration. Now it stops the round that needs it, in
    one line naming the handler and the clients, before it finishes."""
    from mmfl_flwr.core.lvr import LVR
    from mmfl_flwr.strategy.registration import NoClientCanServe

    clients = {c: ClientDef({"a": (10, 1.0), "b": (5, 1.0)}) for c in ("0", "1")}
    pol = LVR(budget_fraction=1.0) if policy == "lvr" else MFARand()
    strategy = MultiModelStrategy(pol, node_wait_timeout=0.0, seed=0)
    ended: list[int] = []
    strategy.on_round_end = lambda rnd, rows: ended.append(rnd)
    app = _hand_written(make_app(clients), {"0", "1"}, ("train",))
    with pytest.raises(NoClientCanServe) as err:
        run_federation(strategy, app, {c: {"cid": c} for c in clients}, initial_arrays(), 1)
    text = str(err.value)
    assert "'train'" in text and "client 0" in text and "client 1" in text, text
    assert "\n" not in text
    assert ended == [0]  # round 1 never finished


def test_a_run_without_a_loss_handler_stops_before_it_trains():
    """Issue 62: under LVR with no query.losses handler anywhere, round 1 trained
    the clients the log had just called "left out of the run". Now the run stops
    after the loss query, before any train message."""
    from mmfl_flwr.core.lvr import LVR
    from mmfl_flwr.strategy.registration import NoClientCanServe

    clients = {c: ClientDef({"a": (10, 1.0), "b": (5, 1.0)}) for c in ("0", "1")}
    strategy = MultiModelStrategy(LVR(budget_fraction=1.0), node_wait_timeout=0.0, seed=0)
    app = _hand_written(make_app(clients), {"0", "1"}, ("query.losses",))
    sent: list[tuple[str, str]] = []
    with pytest.raises(NoClientCanServe, match="'query.losses'"):
        run_federation(
            strategy,
            app,
            {c: {"cid": c} for c in clients},
            initial_arrays(),
            3,
            grid_factory=_sent_types(sent),
        )
    assert {t for t, _ in sent} == {"query.info", "query.losses"}


def test_a_client_without_a_loss_handler_is_left_out_of_the_round_that_found_it():
    """The clients that answered the loss query with "no handler" are not
    assigned in that same round; the others train."""
    from mmfl_flwr.core.lvr import LVR

    clients = {
        c: ClientDef({"a": (10, 1.0), "b": (5, 1.0)}, losses={"a": 1.0, "b": 2.0})
        for c in ("0", "1", "2")
    }
    strategy = MultiModelStrategy(LVR(budget_fraction=1.0), node_wait_timeout=0.0, seed=0)
    app = _hand_written(make_app(clients), {"1"}, ("query.losses",))
    sent: list[tuple[str, str]] = []
    run = run_federation(
        strategy,
        app,
        {c: {"cid": c} for c in clients},
        initial_arrays(),
        1,
        grid_factory=_sent_types(sent),
    )
    assert "1" not in run.picked(1) and run.picked(1)
    assert ("train", "1") not in sent


def test_no_client_can_serve_is_exported_from_the_package():
    import mmfl_flwr
    from mmfl_flwr.strategy.registration import NoClientCanServe

    assert mmfl_flwr.NoClientCanServe is NoClientCanServe
    assert "NoClientCanServe" in mmfl_flwr.__all__
