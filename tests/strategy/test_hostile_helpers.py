"""The update-rewriting attacks of :mod:`mmfl_flwr.testing.hostile`, on a fake
ClientApp whose honest update is known: what each one sends, by hand."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict

from mmfl_flwr import protocol as P
from mmfl_flwr.grid import ensure_task_identity
from mmfl_flwr.testing import hostile as H

ensure_task_identity()  # Messages built outside a Flower runtime

GLOBAL = np.array([1.0, 2.0, 2.0], np.float32)


def honest(step: dict[str, np.ndarray]):
    """A ClientApp that returns ``global + step[cid]`` for every task it is sent."""

    def app(msg: Message, ctx: Context) -> Message:
        out = RecordDict()
        for key, rec in msg.content.array_records.items():
            w = rec["w"].numpy()
            out[key] = ArrayRecord(
                {
                    "w": Array(w + step[str(ctx.node_config["cid"])]),
                    "n": Array(np.array([7], np.int64)),
                }
            )
        return Message(out, dst_node_id=0, message_type="train")

    return app


def train(app, cid: str, rnd: int = 1, tasks=("a", "b")) -> dict[str, np.ndarray]:
    content = RecordDict(
        {
            P.arrays_key(t): ArrayRecord(
                {"w": Array(GLOBAL.copy()), "n": Array(np.array([7], np.int64))}
            )
            for t in tasks
        }
    )
    msg = Message(content, dst_node_id=1, message_type="train", group_id=str(rnd))
    ctx = Context(run_id=1, node_id=1, node_config={"cid": cid}, state=RecordDict(), run_config={})
    reply = app(msg, ctx)
    for t in tasks:
        assert reply.content[P.arrays_key(t)]["n"].numpy()[0] == 7  # non-floats untouched
    return {t: reply.content[P.arrays_key(t)]["w"].numpy() - GLOBAL for t in tasks}


STEPS = {
    "3": np.array([0.3, 0.0, 0.4], np.float32),
    "7": np.array([0.1, 0.2, 0.0], np.float32),
    "1": np.array([1.0, 1.0, 1.0], np.float32),
}


def test_scaled_update_aimed_at_one_model():
    app = H.scaled_update("3", -10.0, {"a"})(honest(STEPS))
    got = train(app, "3")
    np.testing.assert_allclose(got["a"], -10 * STEPS["3"], rtol=1e-5)
    np.testing.assert_allclose(got["b"], STEPS["3"], rtol=1e-6)
    np.testing.assert_allclose(train(app, "1")["a"], STEPS["1"])  # others are honest


def test_gaussian_update_has_ten_times_the_honest_norm():
    got = train(H.gaussian_update("3", 10.0, seed=4)(honest(STEPS)), "3")
    for t in ("a", "b"):
        assert np.linalg.norm(got[t]) == pytest.approx(10 * 0.5, rel=1e-5)  # |(.3,0,.4)| = .5
        assert not np.allclose(got[t] / np.linalg.norm(got[t]), STEPS["3"] / 0.5)


def test_ipm_sends_minus_eps_times_the_colluders_mean_this_round():
    app = H.ipm(["3", "7"], 2.0)(honest(STEPS))
    np.testing.assert_allclose(train(app, "3")["a"], -2 * STEPS["3"], rtol=1e-5)
    np.testing.assert_allclose(train(app, "7")["a"], -(STEPS["3"] + STEPS["7"]), rtol=1e-5)
    # a new round forgets the last one
    np.testing.assert_allclose(train(app, "7", rnd=2)["a"], -2 * STEPS["7"], rtol=1e-5)


def test_alie_sends_mean_minus_z_std_of_what_the_colluders_know():
    """Colluder 3 first knows only itself (std 0): its own update. Colluder 7 then
    knows both: mean (0.2, 0.1, 0.2), std |d| / 2 = (0.1, 0.1, 0.2), z = 1.5."""
    app = H.alie(["3", "7"], 1.5)(honest(STEPS))
    np.testing.assert_allclose(train(app, "3")["a"], STEPS["3"], rtol=1e-5)
    np.testing.assert_allclose(
        train(app, "7")["a"],
        np.array([0.2, 0.1, 0.2]) - 1.5 * np.array([0.1, 0.1, 0.2]),
        rtol=1e-5,
        atol=1e-7,
    )


def test_label_flipping_by_hand():
    """The hook gives client 3 the labels C - 1 - y on the tasks named (C from the
    model's outputs: 10 for digits, 5 for synthetic), leaves another client and
    the other task as they were, and does not touch the federation's arrays."""
    from flwr.app import Context, RecordDict

    from mmfl_flwr.config import Settings
    from mmfl_flwr.flower_app.client_app import client_spec

    s = Settings(tasks="digits,synthetic", num_clients=6, seed=1)

    def spec(pid: int):
        return client_spec(
            Context(
                run_id=1,
                node_id=pid,
                node_config={"partition-id": pid},
                state=RecordDict(),
                run_config={},
            ),
            s,
        )

    before = {
        pid: {t: tr.train_tensors()[1].clone() for t, tr in spec(pid).trainers.items()}
        for pid in (3, 4)
    }
    hook = H.label_flipping("3", tasks={"digits"})
    flipped, other = hook(spec(3)), hook(spec(4))
    assert "digits" in flipped.trainers and "synthetic" in flipped.trainers
    y0 = before[3]["digits"]
    assert (flipped.trainers["digits"].train_tensors()[1] == 9 - y0).all()
    assert (flipped.trainers["synthetic"].train_tensors()[1] == before[3]["synthetic"]).all()
    for t, tr in other.trainers.items():
        assert (tr.train_tensors()[1] == before[4][t]).all()
    # a new spec of client 3 (the federation's arrays) still has the true labels
    assert (spec(3).trainers["digits"].train_tensors()[1] == y0).all()
    both = H.label_flipping(["3"])(spec(3))
    assert (both.trainers["synthetic"].train_tensors()[1] == 4 - before[3]["synthetic"]).all()
