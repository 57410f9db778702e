"""Tests of SCAFFOLD for MMFL (baseline of paper 003).

- client side: ``TorchTrainer(correction=...)`` (zero correction is a no-op, a
  constant correction shifts one SGD step by ``lr c``, checked against a hand
  computed softmax-regression gradient), ``_scaffold_train`` and the ClientApp
  train handler (``c_i`` update with ``K = epochs * ceil(n / batch)`` local steps,
  kept in ``context.state``, returned under ``control.<task>``);
- server side: :class:`ScaffoldAggregator` (``c_s = sum_{i in N_s} d_i c_i``, model
  update by the unbiased rule) on hand examples, and the strategy rejecting a reply
  without its control variate while the others aggregate;
- the ``scaffold`` preset runs on the in-process engine.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from conftest import StepTrainer
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from torch import nn

from mmfl_flwr import protocol as P
from mmfl_flwr.client.app import ClientSpec, _scaffold_train, make_client_app
from mmfl_flwr.client.trainer import TorchTrainer, initial_weights
from mmfl_flwr.core import FullParticipation, Update
from mmfl_flwr.core.scaffold import ScaffoldAggregator
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.records import arrays_to_numpy, numpy_to_arrays
from mmfl_flwr.seeding import training_seed
from mmfl_flwr.strategy import MultiModelStrategy
from mmfl_flwr.tasks.data import Dataset


def _data(n, dim, classes, seed):
    rng = np.random.default_rng(seed)
    return Dataset(rng.normal(size=(n, dim)), rng.integers(0, classes, size=n))


def _mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _ctx():
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


# ============================================================ TorchTrainer


class TestTrainerCorrection:
    def test_zero_correction_is_bitwise_plain_training(self):
        tr = TorchTrainer(_mlp, _data(20, 4, 3, 0), _data(5, 4, 3, 1), batch_size=6)
        w0 = initial_weights(_mlp, 3)
        plain, n1, l1 = tr.train(w0, epochs=2, lr=0.1, seed=7)
        zero = {k: np.zeros_like(v) for k, v in w0.items()}
        corr, n2, l2 = tr.train(w0, epochs=2, lr=0.1, seed=7, correction=zero)
        assert n1 == n2 == 20 and l1 == l2
        for k in plain:
            np.testing.assert_array_equal(plain[k], corr[k])
        # and a non-zero correction does change the result (the argument is used)
        one = {k: np.full_like(v, 0.5) for k, v in w0.items()}
        moved, _, _ = tr.train(w0, epochs=2, lr=0.1, seed=7, correction=one)
        assert any(not np.array_equal(plain[k], moved[k]) for k in plain)

    def test_one_step_with_constant_correction_by_hand(self):
        # Softmax regression, 2 features, 2 classes, W = 0, b = 0, both examples in one batch.
        #   x1 = [1, 2], y1 = 0 ; x2 = [3, -1], y2 = 1 ; logits 0 -> softmax [.5, .5]
        #   p - onehot: x1 [-.5, .5], x2 [.5, -.5]
        #   dW[0] = (-.5*[1,2] + .5*[3,-1]) / 2 = [1, -1.5]/2 = [.5, -.75] ; dW[1] = -dW[0]
        #   db    = ([-.5,.5] + [.5,-.5]) / 2 = [0, 0]
        # c_W = [[.1, .2], [.3, .4]], c_b = [1, -1], lr = .5:
        #   W1 = -.5 * (dW + c_W) = -.5 * [[.6, -.55], [-.2, 1.15]] = [[-.3, .275], [.1, -.575]]
        #   b1 = -.5 * ([0,0] + [1,-1]) = [-.5, .5]
        data = Dataset(np.array([[1.0, 2.0], [3.0, -1.0]]), np.array([0, 1]))
        tr = TorchTrainer(lambda: nn.Linear(2, 2), data, data, batch_size=2)
        w0 = {"weight": np.zeros((2, 2), np.float32), "bias": np.zeros(2, np.float32)}
        corr = {
            "weight": np.array([[0.1, 0.2], [0.3, 0.4]], np.float32),
            "bias": np.array([1.0, -1.0], np.float32),
        }
        new, n, loss = tr.train(w0, epochs=1, lr=0.5, seed=0, correction=corr)
        np.testing.assert_allclose(new["weight"], [[-0.3, 0.275], [0.1, -0.575]], atol=1e-6)
        np.testing.assert_allclose(new["bias"], [-0.5, 0.5], atol=1e-6)
        assert n == 2 and loss == pytest.approx(math.log(2), abs=1e-6)  # CE at uniform softmax
        # without the correction: W1 = -.5 dW = [[-.25, .375], [.25, -.375]], b1 = 0
        plain, _, _ = tr.train(w0, epochs=1, lr=0.5, seed=0)
        np.testing.assert_allclose(plain["weight"], [[-0.25, 0.375], [0.25, -0.375]], atol=1e-6)
        np.testing.assert_allclose(plain["bias"], [0.0, 0.0], atol=1e-6)

    def test_bad_correction_rejected(self):
        data = _data(4, 2, 2, 0)
        tr = TorchTrainer(lambda: nn.Linear(2, 2), data, data)
        w0 = initial_weights(lambda: nn.Linear(2, 2), 0)
        with pytest.raises(KeyError):
            tr.train(w0, 1, 0.1, 0, correction={"weight": np.zeros((2, 2))})
        with pytest.raises(ValueError, match="shape"):
            tr.train(w0, 1, 0.1, 0, correction={"weight": np.zeros((3, 2)), "bias": np.zeros(2)})


# ============================================================ client side


class _CountSteps:
    """Builds the model and counts its gradient steps: one backward pass per
    SGD step reaches the weight's gradient hook."""

    def __init__(self):
        self.n = 0

    def model_fn(self):
        m = _lin()
        m.weight.register_hook(self._count)
        return m

    def _count(self, grad):
        self.n += 1


def _lin():
    return nn.Linear(3, 2)


def test_scaffold_train_control_variate_update():
    counter = _CountSteps()
    tr = TorchTrainer(counter.model_fn, _data(5, 3, 2, 0), _data(2, 3, 2, 1))
    rng = np.random.default_rng(0)
    w1 = initial_weights(_lin, 1)
    c_s1 = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in w1.items()}
    ctx = _ctx()
    epochs, lr, batch = 2, 0.1, 2
    k_steps = 6  # K = epochs * ceil(n / batch) = 2 * ceil(5 / 2) = 2 * 3
    # --- first call: no stored c_i -> c_i = 0, correction = c_s - 0
    new1, n, _, c1 = _scaffold_train(tr, w1, c_s1, ctx, "t", epochs, lr, 11, batch)
    assert counter.n == k_steps  # the K of the formula is the real number of SGD steps
    assert n == 5
    ref1, _, _ = tr.train(w1, epochs, lr, 11, batch, correction=c_s1)
    for k in w1:
        np.testing.assert_array_equal(new1[k], ref1[k])
        # c_i_new = 0 - c_s + (w_global - w_local) / (K lr)
        exp = -c_s1[k].astype(np.float64) + (w1[k].astype(np.float64) - new1[k]) / (k_steps * lr)
        np.testing.assert_allclose(c1[k], exp, rtol=1e-5, atol=1e-5)
        assert c1[k].dtype == np.float32
    stored = arrays_to_numpy(ctx.state.array_records["scaffold.t"])
    for k in w1:
        np.testing.assert_array_equal(stored[k], c1[k])
    # --- second call (next round): c_i = stored c1, correction = c_s2 - c1
    w2 = {k: v + 0.05 for k, v in new1.items()}
    c_s2 = {k: (0.5 * v).astype(np.float32) for k, v in c_s1.items()}
    new2, _, _, c2 = _scaffold_train(tr, w2, c_s2, ctx, "t", epochs, lr, 12, batch)
    ref2, _, _ = tr.train(w2, epochs, lr, 12, batch, correction={k: c_s2[k] - c1[k] for k in c_s2})
    for k in w2:
        np.testing.assert_array_equal(new2[k], ref2[k])
        exp = (
            c1[k].astype(np.float64)
            - c_s2[k]
            + (w2[k].astype(np.float64) - new2[k]) / (k_steps * lr)
        )
        np.testing.assert_allclose(c2[k], exp, rtol=1e-5, atol=1e-5)
    stored = arrays_to_numpy(ctx.state.array_records["scaffold.t"])
    for k in w2:
        np.testing.assert_array_equal(stored[k], c2[k])
    # other tasks have their own c_i
    _scaffold_train(tr, w2, c_s2, ctx, "u", 1, lr, 13, batch)
    assert {"scaffold.t", "scaffold.u"} <= set(ctx.state.array_records)


def _train_msg(nid, weights, control, rnd, epochs=1, lr=0.1, batch=2, seed=0):
    content = RecordDict({P.arrays_key("t"): numpy_to_arrays(weights)})
    if control is not None:
        content[P.control_key("t")] = numpy_to_arrays(control)
    content[P.CONFIG_KEY] = ConfigRecord(
        {
            P.CFG_ROUND: rnd,
            P.CFG_TASKS: ["t"],
            P.CFG_EPOCHS: epochs,
            P.CFG_LR: lr,
            P.CFG_BATCH_SIZE: batch,
            P.CFG_SEED: seed,
        }
    )
    return Message(content, dst_node_id=nid, message_type=MessageType.TRAIN, group_id=str(rnd))


def test_client_app_train_handler_keeps_and_returns_control():
    tr = TorchTrainer(_lin, _data(5, 3, 2, 0), _data(2, 3, 2, 1))
    app = make_client_app(lambda ctx: ClientSpec("x", {"t": tr}))
    grid = InProcessGrid(app, [{"cid": "x"}], seed=0)
    (nid,) = grid.get_node_ids()
    lr, batch, k_steps = 0.1, 2, 3  # K = 1 * ceil(5 / 2) = 3
    w1 = initial_weights(_lin, 4)
    c_s = {k: np.full(v.shape, 0.25, np.float32) for k, v in w1.items()}
    (reply,) = grid.send_and_receive([_train_msg(nid, w1, c_s, 1)])
    assert not reply.has_error()
    got = arrays_to_numpy(reply.content[P.arrays_key("t")])
    c1 = arrays_to_numpy(reply.content[P.control_key("t")])
    ref, _, _ = tr.train(w1, 1, lr, training_seed(0, 1, "x", "t"), batch, correction=c_s)
    for k in w1:
        np.testing.assert_array_equal(got[k], ref[k])
        # first call: c_i = 0 -> c_i_new = -c_s + (w - w_local) / (K lr)
        np.testing.assert_allclose(
            c1[k], -0.25 + (w1[k].astype(np.float64) - got[k]) / (k_steps * lr), atol=1e-5
        )
    state = grid.context(nid).state
    stored = arrays_to_numpy(state.array_records["scaffold.t"])
    for k in w1:
        np.testing.assert_array_equal(stored[k], c1[k])
    # round 2: the stored c_i is used: correction = c_s2 - c1
    c_s2 = {k: np.full(v.shape, -0.5, np.float32) for k, v in w1.items()}
    (reply2,) = grid.send_and_receive([_train_msg(nid, got, c_s2, 2)])
    got2 = arrays_to_numpy(reply2.content[P.arrays_key("t")])
    c2 = arrays_to_numpy(reply2.content[P.control_key("t")])
    ref2, _, _ = tr.train(
        got,
        1,
        lr,
        training_seed(0, 2, "x", "t"),
        batch,
        correction={k: c_s2[k] - c1[k] for k in c1},
    )
    for k in w1:
        np.testing.assert_array_equal(got2[k], ref2[k])
        np.testing.assert_allclose(
            c2[k], c1[k] + 0.5 + (got[k].astype(np.float64) - got2[k]) / (k_steps * lr), atol=1e-5
        )
    # without a control variate in the message: plain training, no control in the reply
    (reply3,) = grid.send_and_receive([_train_msg(nid, w1, None, 3)])
    assert P.control_key("t") not in reply3.content.array_records
    plain, _, _ = tr.train(w1, 1, lr, training_seed(0, 3, "x", "t"), batch)
    got3 = arrays_to_numpy(reply3.content[P.arrays_key("t")])
    for k in w1:
        np.testing.assert_array_equal(got3[k], plain[k])


# ============================================================ server side


def upd(cid, delta, d, b=1, p=1.0, count=1, control=None):
    return Update(
        cid=cid,
        delta=[np.asarray(delta, np.float64)],
        num_examples=1,
        data_share=d,
        processors=b,
        prob=p,
        count=count,
        control=None if control is None else [np.asarray(control, np.float64)],
    )


SHARES = {"a": 0.5, "b": 0.3, "c": 0.2}


def test_scaffold_aggregator_two_rounds_by_hand():
    agg = ScaffoldAggregator()
    w0 = [np.array([10.0, 10.0])]
    np.testing.assert_array_equal(agg.server_control("t", w0)[0], [0, 0])  # before round 1
    # Round 1: a (G=[1,1], B=1, p=.5 -> coefficient .5/.5 = 1, c_a = [1,2])
    #          b (G=[2,0], B=2, p=.25, l=1 -> .3/(2*.25) = .6, c_b = [4,0])
    #   model: Delta = [1,1] + .6[2,0] = [2.2, 1] ; w1 = [7.8, 9]
    #   c_s = .5[1,2] + .3[4,0] + .2*0 (c never trained) = [1.7, 1.0]
    w1 = agg.aggregate(
        "t",
        w0,
        [
            upd("a", [1, 1], 0.5, p=0.5, control=[1, 2]),
            upd("b", [2, 0], 0.3, b=2, p=0.25, control=[4, 0]),
        ],
        1,
        shares=SHARES,
    )
    np.testing.assert_allclose(w1[0], [7.8, 9.0], atol=1e-12)
    np.testing.assert_allclose(agg.server_control("t", w1)[0], [1.7, 1.0], atol=1e-12)
    # Round 2: c (G=[1,-1], B=1, p=.2 -> .2/.2 = 1, c_c = [0,5])
    #   model: w2 = [7.8-1, 9+1] = [6.8, 10]
    #   c_s = .5[1,2] + .3[4,0] + .2[0,5] = [.5+1.2, 1+1] = [1.7, 2.0]
    w2 = agg.aggregate("t", w1, [upd("c", [1, -1], 0.2, p=0.2, control=[0, 5])], 2, shares=SHARES)
    np.testing.assert_allclose(w2[0], [6.8, 10.0], atol=1e-12)
    np.testing.assert_allclose(agg.server_control("t", w2)[0], [1.7, 2.0], atol=1e-12)
    # Round 3: b offline (not in N_s), d renormalised over a, c: a 5/7, c 2/7;
    #   a uploads c_a = [-1, 0] (G = 0)
    #   c_s = 5/7 [-1,0] + 2/7 [0,5] = [-5/7, 10/7]
    sh3 = {"a": 5 / 7, "c": 2 / 7}
    w3 = agg.aggregate("t", w2, [upd("a", [0, 0], 5 / 7, control=[-1, 0])], 3, shares=sh3)
    np.testing.assert_allclose(w3[0], [6.8, 10.0], atol=1e-12)
    np.testing.assert_allclose(agg.server_control("t", w3)[0], [-5 / 7, 10 / 7], atol=1e-12)
    # an empty round keeps the model and recomputes c_s from the stored c_i
    w4 = agg.aggregate("t", w3, [], 4, shares=SHARES)
    np.testing.assert_array_equal(w4[0], w3[0])
    # .5[-1,0] + .3[4,0] + .2[0,5] = [.7, 1]
    np.testing.assert_allclose(agg.server_control("t", w4)[0], [0.7, 1.0], atol=1e-12)
    # state round trip
    again = ScaffoldAggregator()
    again.load_state_dict(agg.state_dict())
    np.testing.assert_allclose(again.server_control("t", w4)[0], [0.7, 1.0], atol=1e-12)
    np.testing.assert_array_equal(again.controls.get("c", "t")[0], [0, 5])
    # server control has the dtype of the weights
    assert agg.server_control("t", [np.zeros(2, np.float32)])[0].dtype == np.float32


def test_scaffold_aggregator_update_without_control_raises():
    agg = ScaffoldAggregator()
    with pytest.raises(ValueError, match="control"):
        agg.aggregate("t", [np.zeros(2)], [upd("a", [1, 1], 1.0)], 1, shares={"a": 1.0})


# ---------------------------------------------- strategy: missing control rejected


CLIENTS = {"alice": (10, 0.5), "bob": (30, 1.0), "mallory": (10, 4.0)}


def test_reply_missing_control_is_rejected_and_others_aggregate(caplog):
    seen = {c: [] for c in CLIENTS}
    app = make_client_app(
        lambda ctx: ClientSpec(
            str(ctx.node_config["cid"]),
            {
                "a": StepTrainer(
                    *CLIENTS[str(ctx.node_config["cid"])], seen=seen[str(ctx.node_config["cid"])]
                )
            },
        )
    )

    def strip_mallory(msg, ctx):
        reply = app(msg, ctx)
        if ctx.node_config["cid"] == "mallory" and msg.metadata.message_type == MessageType.TRAIN:
            content = RecordDict(
                {k: v for k, v in reply.content.items() if not k.startswith(P.CONTROL_PREFIX)}
            )
            return Message(content, reply_to=msg)
        return reply

    grid = InProcessGrid(strip_mallory, [{"cid": c} for c in CLIENTS], seed=0)
    agg = ScaffoldAggregator()
    strategy = MultiModelStrategy(
        FullParticipation(), agg, node_wait_timeout=0.0, lr=0.05, batch_size=32, local_epochs=1
    )
    init = {"a": numpy_to_arrays({"w": np.zeros(2, np.float32)})}
    with caplog.at_level(logging.WARNING):
        result = strategy.start(grid, init, num_rounds=2, timeout=60)
    msgs = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(
        "mallory" in m and "rejected update for task 'a'" in m and "control" in m for m in msgs
    ), msgs
    assert not any("alice" in m or "bob" in m for m in msgs), msgs
    rows = {r["round"]: r for r in result.history}
    assert rows[1]["uploads"] == 2 and rows[1]["rejected"] == 1
    assert rows[2]["uploads"] == 2 and rows[2]["rejected"] == 1
    # d = alice 10/50 = .2, bob .6, mallory .2 ; full participation: p = 1, B = 1
    # Round 1: model Delta = .2*.5 + .6*1 = .7 -> w = -.7 (mallory's G left out)
    #   K = 1 * ceil(10/32) = ceil(30/32) = 1, lr = .05:
    #   c_alice = 0 - 0 + .5/.05 = 10 ; c_bob = 1/.05 = 20
    #   c_s = .2*10 + .6*20 + .2*0 (mallory's c unknown) = 14
    # Round 2: corrections c_s - c_i: alice 14 - 10 = 4, bob 14 - 20 = -6,
    #   mallory 14 - 80 (her own c_i = 4/.05 = 80, kept client-side) = -66
    #   c_alice = 10 - 14 + 10 = 6 ; c_bob = 20 - 14 + 20 = 26 ; c_s = .2*6 + .6*26 = 16.8
    #   model: w = -.7 - .7 = -1.4
    assert [s is not None for s in seen["alice"]] == [True, True]
    np.testing.assert_allclose(seen["alice"][0]["w"], [0, 0])
    np.testing.assert_allclose(seen["alice"][1]["w"], [4, 4], rtol=1e-5)
    np.testing.assert_allclose(seen["bob"][1]["w"], [-6, -6], rtol=1e-5)
    np.testing.assert_allclose(seen["mallory"][1]["w"], [-66, -66], rtol=1e-5)
    np.testing.assert_allclose(agg.controls.get("alice", "a")[0], [6, 6], rtol=1e-5)
    np.testing.assert_allclose(agg.controls.get("bob", "a")[0], [26, 26], rtol=1e-5)
    assert agg.controls.get("mallory", "a") is None
    np.testing.assert_allclose(agg.server_control("a", [np.zeros(2)])[0], [16.8, 16.8], rtol=1e-5)
    final = arrays_to_numpy(result.arrays["a"])["w"]
    np.testing.assert_allclose(final, [-1.4, -1.4], rtol=1e-6)


# ============================================================ preset run


def test_scaffold_preset_runs_inprocess(tmp_path):
    from mmfl_flwr.config import Settings
    from mmfl_flwr.results import read_metrics_csv
    from mmfl_flwr.runner import run

    s = Settings(
        strategy="scaffold",
        num_clients=8,
        num_rounds=3,
        profile="paper003",
        output_dir=str(tmp_path),
        local_epochs=1,
        budget_fraction=0.5,
    )
    result = run(s, engine="inprocess")
    rows = read_metrics_csv(tmp_path / "metrics.csv")
    assert {r["round"] for r in rows} == {0, 1, 2, 3}
    for r in rows:
        assert math.isfinite(r["accuracy"]) and math.isfinite(r["loss"]), r
        assert math.isfinite(r["step_l1"]), r
        assert r["rejected"] == 0, r  # every client returned its control variate
        if r["uploads"] > 0:
            assert math.isfinite(r["train_loss"]), r
    assert sum(r["uploads"] for r in rows) > 0
    for rec in result.arrays.values():
        for arr in rec.values():
            assert np.isfinite(arr.numpy()).all()
