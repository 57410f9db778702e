"""Batch-norm state is not part of the update G (notes/algorithms.md, "What an
update is"; paper 003, Eq. 3 and Eq. 20 are over the gradient steps of the
trainable parameters).

The clients here are numpy fakes whose model has one trainable vector ``w``, a
float ``bn.running_var`` and an integer ``bn.num_batches_tracked``; they declare
``trainable_keys = ["w"]`` as :class:`~mmfl_flwr.client.trainer.TorchTrainer`
does. Every expected number is computed by hand in the test: the new trainable
weights by the aggregator's formula over ``w`` alone, the new running variance
and counter as the sample-weighted mean of the received values. A last test
trains a real torch MLP with batch norm under random allocation and the
unbiased rule, whose coefficients ``d/(B p)`` can exceed 1: the running
variances must stay positive.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context
from torch import nn

from mmfl_flwr.client.app import ClientSpec, make_client_app
from mmfl_flwr.client.trainer import TorchTrainer, initial_weights
from mmfl_flwr.core import (
    ClientTable,
    FedAvgAggregator,
    FullParticipation,
    Pick,
    Policy,
    RandomAllocation,
    UnbiasedAggregator,
)
from mmfl_flwr.core.aggregators import MeanAggregator
from mmfl_flwr.core.scaffold import ScaffoldAggregator
from mmfl_flwr.core.stale import FedStaleAggregator, FedVARPAggregator, MIFAAggregator
from mmfl_flwr.core.stalevr import StaleVRAggregator, StaleVREAggregator, optimal_stale_beta
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.records import numpy_to_arrays
from mmfl_flwr.strategy import MultiModelStrategy
from mmfl_flwr.tasks.data import Dataset

TASK = "t"
# client -> (num_examples, trainable step per call, running variance it reports)
CLIENTS = {"c0": (10, 0.5, 0.2), "c1": (30, -1.0, 0.1), "c2": (60, 2.0, 0.4)}
PROB = 0.25  # inclusion probability the fixed policy claims (coefficients d/p > 1)


class BNFake:
    """LocalTrainer of a model ``{w, bn.running_var, bn.num_batches_tracked}``.

    The k-th call of ``train`` returns ``w - k * step``, running variance
    ``var * k`` and the counter plus ``n`` steps.
    """

    trainable_keys = ["w"]

    def __init__(self, n: int, step: float, var: float) -> None:
        self.n, self.step, self.var = n, step, var
        self.calls = 0

    @property
    def num_examples(self) -> int:
        return self.n

    def train(self, weights, epochs, lr, seed, batch_size=None, correction=None):
        self.calls += 1
        k = self.calls
        return (
            {
                "w": (weights["w"] - k * self.step).astype(np.float32),
                "bn.running_var": np.full(3, self.var * k, np.float32),
                "bn.num_batches_tracked": np.asarray(
                    weights["bn.num_batches_tracked"] + self.n, np.int64
                ),
            },
            self.n,
            0.5,
        )

    def loss(self, weights):
        return 1.0

    def evaluate(self, weights):
        return 1.0, 0.5, 10


class FixedPicks(Policy):
    """Every client trains the task, each pick claiming probability ``PROB``."""

    name = "fixed-picks"

    def assign(self, table: ClientTable, tasks, server_round, rng):
        return [Pick(cid, TASK, 1, PROB) for cid in table.ids()]


def init_model() -> dict[str, ArrayRecord]:
    return {
        TASK: numpy_to_arrays(
            {
                "w": np.zeros(3, np.float32),
                "bn.running_var": np.ones(3, np.float32),
                "bn.num_batches_tracked": np.asarray(0, np.int64),
            }
        )
    }


def run(policy, aggregator, rounds, trainable=None, **limits):
    trainers = {cid: BNFake(*v) for cid, v in CLIENTS.items()}

    def spec(ctx: Context) -> ClientSpec:
        cid = str(ctx.node_config["cid"])
        return ClientSpec(cid, {TASK: trainers[cid]})

    grid = InProcessGrid(make_client_app(spec), [{"cid": c} for c in CLIENTS], seed=0)
    extra = dict(limits) if trainable is None else {"trainable_keys": trainable, **limits}
    strategy = MultiModelStrategy(policy, aggregator, node_wait_timeout=0.0, seed=0, **extra)
    snaps = []
    strategy.on_round_end = lambda rnd, rows: (
        rnd > 0 and snaps.append({k: v.copy() for k, v in strategy.weights[TASK].items()})
    )
    strategy.start(grid, init_model(), num_rounds=rounds, timeout=30)
    return strategy, snaps


def weighted_state(k: int) -> tuple[np.ndarray, int, int]:
    """Expected running variance and counter after round k when every client
    trained in every round so far: sample-weighted means of the reports."""
    total = sum(n for n, _, _ in CLIENTS.values())
    var = sum(n * v * k for n, _, v in CLIENTS.values()) / total
    counter = 0
    for _ in range(k):
        counter = int(np.rint(sum(n * (counter + n) for n, _, _ in CLIENTS.values()) / total))
    return np.full(3, var, np.float32), counter, total


def test_unbiased_rule_scales_only_trainable_entries_eq3():
    """Eq. 3 on ``w``: ``w - sum d/(B p) G``; with d/p > 1 the old code pushed the
    running variance below zero. Now it is the sample-weighted mean."""
    strategy, snaps = run(FixedPicks(), UnbiasedAggregator(), rounds=1)
    total = sum(n for n, _, _ in CLIENTS.values())
    expected_w = -sum((n / total) / PROB * s for n, s, _ in CLIENTS.values())
    np.testing.assert_allclose(snaps[0]["w"], np.full(3, expected_w), rtol=1e-6)
    var, counter, _ = weighted_state(1)
    np.testing.assert_allclose(snaps[0]["bn.running_var"], var, rtol=1e-6)
    assert int(snaps[0]["bn.num_batches_tracked"]) == counter == 46
    assert strategy.split_keys(TASK) == (["w"], ["bn.running_var", "bn.num_batches_tracked"])


AGGREGATORS = {
    "fedavg": FedAvgAggregator,
    "mean": MeanAggregator,
    "unbiased": UnbiasedAggregator,
    "fedstale": lambda: FedStaleAggregator(0.7),
    "fedvarp": FedVARPAggregator,
    "mifa": MIFAAggregator,
    "stalevr": StaleVRAggregator,
    "stalevre": StaleVREAggregator,
    "scaffold": ScaffoldAggregator,
}


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_every_aggregator_averages_state_and_keeps_variance_positive(name):
    policy = FullParticipation() if name == "stalevr" else FixedPicks()
    strategy, snaps = run(policy, AGGREGATORS[name](), rounds=3)
    for k, snap in enumerate(snaps, start=1):
        var, counter, _ = weighted_state(k)
        assert (snap["bn.running_var"] > 0).all()
        np.testing.assert_allclose(snap["bn.running_var"], var, rtol=1e-6)
        assert int(snap["bn.num_batches_tracked"]) == counter
        assert snap["bn.num_batches_tracked"].dtype == np.int64
        assert snap["bn.num_batches_tracked"].shape == ()
    # the stale store and SCAFFOLD's variates hold trainable entries only
    if hasattr(strategy.aggregator, "store"):
        h = strategy.aggregator.store.get("c0", TASK)
        assert h is not None and [a.shape for a in h] == [(3,)]
    if name == "scaffold":
        assert [a.shape for a in strategy.aggregator.server[TASK]] == [(3,)]


def test_stalevr_beta_is_over_trainable_parameters_eq20():
    """Eq. 20: ``beta = <G, h> / ||h||^2`` over the trainable parameters. Client c's
    k-th update is ``G_k = k * step_c * 1`` on ``w``, so in round 2 the optimal
    beta is ``<2s, s> / ||s||^2 = 2`` for every client; over the full state
    (running variance and counter deltas included) it would be something else.
    The norm clip is off here: a round of fewer than 6 updates measures its updates
    against the lower median of its norms pooled with the model's earlier ones
    (sqrt 3 x {0.5, 1, 2, 1, 2, 4}: sqrt 3), so c2's second update (4 sqrt 3) would be
    clipped to 3 sqrt 3 and its beta read 1.5; Eq. 20 is about the update as sent."""
    strategy, _ = run(FullParticipation(), StaleVRAggregator(), rounds=2, update_clip_factor=None)
    for cid, (n, step, var) in CLIENTS.items():
        assert strategy.aggregator.last_betas[(cid, TASK)] == pytest.approx(2.0, rel=1e-6)
        # what the old full-state computation would have given (must differ)
        g = [np.full(3, 2 * step), np.full(3, 1 - 2 * var), np.asarray(-float(n))]
        h = [np.full(3, step), np.full(3, 1 - var), np.asarray(-float(n))]
        assert optimal_stale_beta(g, h) != pytest.approx(2.0, rel=1e-3)


def test_pinned_trainable_keys_win_and_are_checked():
    strategy, snaps = run(FixedPicks(), FedAvgAggregator(), rounds=1, trainable={TASK: ["w"]})
    assert strategy.trainable[TASK] == ["w"]
    with pytest.raises(ValueError, match="not in the model"):
        run(FixedPicks(), FedAvgAggregator(), rounds=1, trainable={TASK: ["nope"]})
    with pytest.raises(ValueError, match="not floating-point"):
        run(
            FixedPicks(),
            FedAvgAggregator(),
            rounds=1,
            trainable={TASK: ["w", "bn.num_batches_tracked"]},
        )


def test_default_without_declaration_treats_integer_entries_as_state():
    strategy = MultiModelStrategy(FixedPicks(), FedAvgAggregator())
    strategy.set_models(init_model())
    assert strategy.split_keys(TASK) == (["w", "bn.running_var"], ["bn.num_batches_tracked"])


# ------------------------------------------------------------ real torch model
class BNMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def _data(seed: int, n: int) -> Dataset:
    rng = np.random.default_rng(seed)
    x = (0.05 * rng.normal(size=(n, 4))).astype(np.float32)  # small variance
    y = rng.integers(0, 3, size=n).astype(np.int64)
    return Dataset(x, y)


def test_torch_bn_model_under_random_allocation_keeps_positive_variance():
    """Two BN-MLP models, 8 clients, random allocation with the unbiased rule
    (coefficients d/(B p) up to ~4): the running variances used to go negative
    because they were scaled like updates."""
    tasks = ("m1", "m2")
    clients = {
        str(i): {
            t: TorchTrainer(BNMLP, _data(10 * i + j, 16), _data(99, 4), batch_size=4)
            for j, t in enumerate(tasks)
        }
        for i in range(8)
    }
    grid = InProcessGrid(
        make_client_app(
            lambda ctx: ClientSpec(
                str(ctx.node_config["cid"]), clients[str(ctx.node_config["cid"])]
            )
        ),
        [{"cid": c} for c in clients],
        seed=0,
    )
    strategy = MultiModelStrategy(
        RandomAllocation(budget=2),
        UnbiasedAggregator(),
        node_wait_timeout=0.0,
        seed=0,
        lr=0.5,
        local_epochs=2,
        batch_size=4,
    )
    lowest: list[float] = []
    strategy.on_round_end = lambda rnd, rows: lowest.append(
        min(float(strategy.weights[t]["bn.running_var"].min()) for t in tasks)
    )
    init = {t: numpy_to_arrays(initial_weights(BNMLP, seed=k)) for k, t in enumerate(tasks)}
    strategy.start(grid, init, num_rounds=6, timeout=30)
    assert min(lowest) > 0, f"lowest running variance per round: {lowest}"
    for t in tasks:
        assert int(strategy.weights[t]["bn.num_batches_tracked"]) >= 0
        assert strategy.trainable[t] == [
            "fc1.weight",
            "fc1.bias",
            "bn.weight",
            "bn.bias",
            "fc2.weight",
            "fc2.bias",
        ]
