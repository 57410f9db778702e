"""Bring your own training code (issue 15, item 3): a Flower quickstart-style
client (``train``/``test`` functions and loaders, ``tests/quickstart_app``)
served to MultiModelStrategy by ``mmfl_flwr.client_app_from_functions`` with
``FunctionTrainer``; real torch training on the in-process engine. The same
app runs on Flower's simulation engine in test_functions_client_sim.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import LogTap
from flwr.app import ArrayRecord

from mmfl_flwr import FunctionTrainer, make_strategy
from mmfl_flwr.grid import InProcessGrid

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quickstart_app"))
from quickstart_app import client_app, task

NODES = [{"partition-id": i} for i in range(6)]


def run(preset: str, rounds: int = 5, **kw):
    torch.manual_seed(0)
    initial = {t: ArrayRecord(task.Net(d, c).state_dict()) for t, (d, c) in task.TASKS.items()}
    strategy = make_strategy(
        preset, local_epochs=2, lr=0.1, seed=0, fraction_evaluate=1.0, node_wait_timeout=0.0, **kw
    )
    with LogTap.on_flwr() as tap:
        result = strategy.start(
            InProcessGrid(client_app.app, NODES, seed=0), initial, num_rounds=rounds, timeout=60
        )
    return result, tap.warnings()


def accuracy(result, name: str) -> float:
    last = max(result.evaluate_metrics_clientapp)
    return result.evaluate_metrics_clientapp[last]["all"][f"{name}.accuracy"]


@pytest.mark.parametrize(
    "preset, kw",
    [
        ("mfa-rr", {}),
        ("lvr", {"budget_fraction": 0.6}),  # loss query: test() on the training loader
        ("ranklist-ucb", {"clients_per_round": 4}),
        ("stalevre", {"budget_fraction": 0.6}),
    ],
)
def test_quickstart_functions_train_both_models(preset, kw):
    result, warnings = run(preset, **kw)
    assert warnings == []
    for name, (_, classes) in task.TASKS.items():
        assert accuracy(result, name) > 1.0 / classes + 0.2, (name, accuracy(result, name))
    for rec in result.arrays.values():
        assert all(np.isfinite(a.numpy()).all() for a in rec.values())


def test_function_trainer_follows_the_local_trainer_contract():
    train, test = task.load_data("blobs", 0)
    tr = FunctionTrainer(lambda: task.Net(2, 3), task.train, task.test, train, test)
    torch.manual_seed(1)
    w = {k: v.numpy().copy() for k, v in task.Net(2, 3).state_dict().items()}
    assert tr.num_examples == 120
    assert tr.trainable_keys == list(w)
    new, n, loss = tr.train(w, epochs=1, lr=0.1, seed=3)
    again, _, loss2 = tr.train(w, epochs=1, lr=0.1, seed=3)
    assert n == 120 and loss == loss2  # the seed fixes the loader's order
    for k in w:
        np.testing.assert_array_equal(new[k], again[k])
        assert new[k].shape == w[k].shape and new[k].dtype == w[k].dtype
    # the loss query is test() on the training data, and changes nothing
    expected = task.test(tr._model(w), train, torch.device("cpu"))[0]
    assert tr.loss(w) == pytest.approx(expected)
    loss, acc, m = tr.evaluate(w)
    assert m == 60 and 0 <= acc <= 1 and loss > 0


def test_scaffold_is_refused_with_the_reason():
    _, warnings = run("scaffold", rounds=1, budget_fraction=1.0)
    assert warnings and all(
        "FunctionTrainer cannot add them" in m for m in warnings if "failed to train" in m
    )
    assert any("failed to train" in m for m in warnings)
