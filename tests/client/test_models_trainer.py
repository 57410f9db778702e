"""Tests of the torch models and the local trainer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmfl_flwr.client.trainer import TorchTrainer, evaluate_arrays, initial_weights
from mmfl_flwr.tasks.data import Dataset, load_digits_data, synthetic_users
from mmfl_flwr.tasks.models import DigitsCNN, LogisticRegression, make_model


def _digits_small() -> tuple[Dataset, Dataset]:
    train, test = load_digits_data(0)
    return Dataset(train.x[:800], train.y[:800]), Dataset(test.x[:200], test.y[:200])


def _synthetic_user() -> tuple[Dataset, Dataset]:
    # Synthetic(1, 1) users are often single-class; the IID variant gives a user
    # with several classes, which makes the accuracy check meaningful.
    train, test = synthetic_users(1.0, 1.0, 1, seed=3, iid=True, max_samples=400)[0]
    assert len(np.unique(train.y)) >= 3
    return train, test


CASES = {
    "digits": (lambda: make_model("digits"), _digits_small),
    "synthetic": (lambda: make_model("synthetic"), _synthetic_user),
}


def test_make_model_types_and_shapes() -> None:
    cnn = make_model("digits")
    lr = make_model("synthetic")
    assert isinstance(cnn, DigitsCNN) and isinstance(lr, LogisticRegression)
    assert cnn(torch.zeros(4, 1, 8, 8)).shape == (4, 10)
    assert lr(torch.zeros(4, 60)).shape == (4, 5)
    convs = [m for m in cnn.modules() if isinstance(m, torch.nn.Conv2d)]
    pools = [m for m in cnn.modules() if isinstance(m, torch.nn.MaxPool2d)]
    linears = [m for m in cnn.modules() if isinstance(m, torch.nn.Linear)]
    assert len(convs) == 2 and len(linears) == 2 and len(pools) >= 1
    assert len([m for m in lr.modules() if isinstance(m, torch.nn.Linear)]) == 1
    with pytest.raises(ValueError):
        make_model("no-such-kind")


@pytest.mark.parametrize("kind", sorted(CASES))
def test_training_reduces_loss(kind: str) -> None:
    model_fn, data_fn = CASES[kind]
    train, test = data_fn()
    trainer = TorchTrainer(model_fn, train, test, batch_size=32)
    w0 = initial_weights(model_fn, seed=0)
    before = trainer.loss(w0)
    w1, n, train_loss = trainer.train(w0, epochs=8, lr=0.1, seed=1)
    after = trainer.loss(w1)
    assert n == len(train)
    assert math.isfinite(train_loss) and train_loss >= 0.0
    assert after < 0.8 * before
    loss_t, acc_t, n_t = trainer.evaluate(w1)
    _, acc0, _ = trainer.evaluate(w0)
    assert n_t == len(test)
    assert acc_t > acc0
    assert 0.0 <= acc_t <= 1.0 and math.isfinite(loss_t)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_train_is_deterministic_and_keeps_layout(kind: str) -> None:
    model_fn, data_fn = CASES[kind]
    train, test = data_fn()
    trainer = TorchTrainer(model_fn, train, test)
    w0 = initial_weights(model_fn, seed=4)
    w0_again = initial_weights(model_fn, seed=4)
    assert all(np.array_equal(w0[k], w0_again[k]) for k in w0)
    a, _, la = trainer.train(w0, epochs=2, lr=0.05, seed=9)
    # Disturb the global RNG in between; results must not depend on it.
    torch.manual_seed(12345)
    torch.rand(10)
    b, _, lb = TorchTrainer(model_fn, train, test).train(w0, epochs=2, lr=0.05, seed=9)
    c, _, _ = trainer.train(w0, epochs=2, lr=0.05, seed=10)
    state = model_fn().state_dict()
    for w in (a, b, c):
        assert list(w) == list(state)
        for k, v in w.items():
            assert isinstance(v, np.ndarray)
            assert v.dtype == np.float32 and v.shape == tuple(state[k].shape)
    assert la == lb
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a)  # other seed, other order


def test_initial_weights_depend_on_seed_and_keep_global_rng() -> None:
    fn = CASES["digits"][0]
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    w1 = initial_weights(fn, seed=1)
    assert torch.equal(torch.rand(3), expected)
    w2 = initial_weights(fn, seed=2)
    assert any(not np.array_equal(w1[k], w2[k]) for k in w1)


def test_loss_and_evaluate_do_not_change_weights() -> None:
    model_fn, data_fn = CASES["synthetic"]
    train, test = data_fn()
    trainer = TorchTrainer(model_fn, train, test)
    w = initial_weights(model_fn, seed=0)
    copy = {k: v.copy() for k, v in w.items()}
    l1 = trainer.loss(w)
    trainer.evaluate(w)
    trainer.train(w, epochs=1, lr=0.1, seed=0)
    l2 = trainer.loss(w)
    assert l1 == l2
    assert all(np.array_equal(w[k], copy[k]) for k in w)
    # loss() is the mean cross-entropy over the TRAIN data.
    logits = torch.tensor(train.x) @ torch.tensor(w["linear.weight"]).T + torch.tensor(
        w["linear.bias"]
    )
    ref = float(torch.nn.functional.cross_entropy(logits, torch.tensor(train.y)))
    assert l1 == pytest.approx(ref, rel=1e-5)


def test_evaluate_falls_back_to_train_when_test_empty() -> None:
    model_fn, data_fn = CASES["synthetic"]
    train, _ = data_fn()
    empty = Dataset(np.zeros((0, 60), np.float32), np.zeros(0, np.int64))
    trainer = TorchTrainer(model_fn, train, empty)
    w = initial_weights(model_fn, seed=0)
    loss, acc, n = trainer.evaluate(w)
    assert n == len(train)
    assert math.isfinite(loss) and 0.0 <= acc <= 1.0
    assert loss == pytest.approx(trainer.loss(w), rel=1e-6)


def test_evaluate_arrays_matches_trainer() -> None:
    model_fn, data_fn = CASES["digits"]
    train, test = data_fn()
    trainer = TorchTrainer(model_fn, train, test)
    w, _, _ = trainer.train(initial_weights(model_fn, 0), epochs=1, lr=0.1, seed=0)
    loss, acc = evaluate_arrays(model_fn, w, test)
    loss_t, acc_t, _ = trainer.evaluate(w)
    assert loss == pytest.approx(loss_t, rel=1e-5)
    assert acc == pytest.approx(acc_t)
    with pytest.raises(KeyError):
        evaluate_arrays(model_fn, {"bogus": np.zeros(1)}, test)


def test_trainers_of_one_model_share_one_network_and_keep_no_gradients() -> None:
    """Each (client, task) trainer used to keep its own network and its last
    gradients between rounds: 348 trainers of the 28x28 CNN held 4.4 GB in the
    in-process engine (the paper-003 mnist-5k federation, 120 clients), and two
    such runs did not fit a 23 GB machine. The trainers of one ``model_fn`` now
    share one network per thread (each call overwrites its whole state), with
    the same results as separate trainers."""
    built = []

    def model_fn() -> torch.nn.Module:
        built.append(1)
        return make_model("digits")

    train, _ = load_digits_data(0)
    x, y = train.x, train.y
    parts = [Dataset(x[k * 40 : (k + 1) * 40], y[k * 40 : (k + 1) * 40]) for k in range(4)]
    empty = Dataset(x[:0], y[:0])
    shared = [TorchTrainer(model_fn, p, empty, batch_size=16) for p in parts]
    w0 = initial_weights(model_fn, 0)
    built.clear()
    outs = [t.train(w0, epochs=1, lr=0.1, seed=3) for t in shared]
    losses = [t.loss(w0) for t in shared]
    assert len(built) == 1  # one network, not one per trainer
    net = shared[0]._model(w0)
    assert all(p.grad is None for p in net.parameters())  # no gradients kept
    # the same numbers as a trainer with a network of its own
    for p, (w, n, loss), l0 in zip(parts, outs, losses):
        alone = TorchTrainer(lambda: make_model("digits"), p, empty, batch_size=16)
        w2, n2, loss2 = alone.train(w0, epochs=1, lr=0.1, seed=3)
        assert n == n2 and loss == loss2 and alone.loss(w0) == l0
        for k in w:
            np.testing.assert_array_equal(w[k], w2[k])


def test_a_trainer_subclass_keeps_a_network_of_its_own() -> None:
    """A subclass may change its network beyond the state_dict (hooks, pruning, frozen
    layers): sharing would carry that to every other client of the model."""

    class Hooked(TorchTrainer):
        pass

    train, _ = load_digits_data(0)
    part = Dataset(train.x[:40], train.y[:40])
    fn = lambda: make_model("digits")  # noqa: E731
    w0 = initial_weights(fn, 0)
    a, b = Hooked(fn, part, part, batch_size=16), Hooked(fn, part, part, batch_size=16)
    plain = TorchTrainer(fn, part, part, batch_size=16)
    assert a._model(w0) is not b._model(w0) and a._model(w0) is not plain._model(w0)
