"""The client side's contract: what a trainer offers, and the one encoding of
the replies.

- :class:`LocalTrainer`: everything the ClientApp may call on a trainer (one
  trainer per task and client), including the trainable keys it declares and
  SCAFFOLD's ``correction``.
- :class:`VectorizableTrainer`: the opt-in for the fast path. A trainer that
  implements it (a functional model and the client's tensors) is trained,
  scored and evaluated in batches with the other clients of its model
  (:mod:`mmfl_flwr.client.vectorized`); one that does not is served per client.
- The decoding of a train message's settings (:func:`train_settings`) and the
  encoding of every reply part (:func:`put_train_reply`, :func:`put_loss`,
  :func:`put_evaluation`), shared by the ClientApp and the vectorized engine.

Torch-free and numpy-only here (the torch trainers live in
:mod:`mmfl_flwr.client.trainer` and :mod:`mmfl_flwr.client.functions`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord

from mmfl_flwr import protocol as P
from mmfl_flwr.client.weights import Weights, clip_to_norm, trainable_keys
from mmfl_flwr.core.clipping import clipping_norm_for
from mmfl_flwr.records import numpy_to_arrays

__all__ = [
    "LocalTrainer",
    "TrainSettings",
    "VectorizableTrainer",
    "Weights",
    "clip_for_config",
    "put_evaluation",
    "put_loss",
    "put_train_reply",
    "takes_correction",
    "tasks_in",
    "train_settings",
    "trainable_keys",
]


@runtime_checkable
class LocalTrainer(Protocol):
    """What the ClientApp calls on the trainer of one task on one client.

    ``trainable_keys`` may be empty (or absent on older trainers): then the
    server counts floating-point entries as trainable and integer ones as
    state. ``correction`` is given only by SCAFFOLD: a trainer that does not
    take it (or raises NotImplementedError for it) cannot serve ``scaffold``,
    and the ClientApp says so in its error reply.
    """

    @property
    def num_examples(self) -> int:
        """Training examples on this client (its ``n_{i,s}``)."""

    @property
    def trainable_keys(self) -> list[str]:
        """The weights' keys that are trainable parameters; the others (batch-norm
        running statistics, step counters) are model state, averaged by the server
        rather than part of the update."""

    def train(
        self,
        weights: Weights,
        epochs: int,
        lr: float,
        seed: int,
        batch_size: int | None = None,
        correction: Weights | None = None,
    ) -> tuple[Weights, int, float]:
        """Local training from ``weights``; returns (new weights, examples, mean
        training loss). ``seed`` fixes the batch order. ``correction``
        (SCAFFOLD, ``c - c_i`` per trainable key) is added to every gradient."""

    def loss(self, weights: Weights) -> float:
        """Mean loss on the local training data, forward pass only."""

    def evaluate(self, weights: Weights) -> tuple[float, float, int]:
        """(loss, accuracy, examples) on the local test data."""


@runtime_checkable
class VectorizableTrainer(Protocol):
    """The opt-in of a trainer to the batched fast path.

    Implementing it states that the trainer's ``train``, ``loss`` and
    ``evaluate`` are plain mini-batch SGD, mean cross-entropy and accuracy of the
    model that ``model_fn`` builds, on the tensors below (as
    :class:`~mmfl_flwr.client.trainer.TorchTrainer` does): the vectorized engine
    then computes them for all clients of a model at once with ``torch.func``,
    with each client's batch order from its seed. Anything else (its own
    optimiser or loss) must not implement it, and is served per client.
    """

    model_fn: Callable[[], Any]
    device: Any

    def train_tensors(self) -> tuple[Any, Any]:
        """Training inputs and labels, torch tensors on :attr:`device` (shared:
        not modified)."""

    def eval_tensors(self) -> tuple[Any, Any]:
        """What ``evaluate`` evaluates on, as tensors on :attr:`device`."""


def takes_correction(trainer: Any) -> bool:
    """Whether ``trainer.train`` accepts SCAFFOLD's ``correction`` keyword."""
    try:
        params = inspect.signature(trainer.train).parameters
    except (TypeError, ValueError):
        return True
    return "correction" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


# ------------------------------------------------------------------ messages
@dataclass(frozen=True)
class TrainSettings:
    """A train message's settings (its ConfigRecord ``config``)."""

    epochs: int = 1
    lr: float = 0.05
    batch_size: int = 32
    seed: int = 0
    server_round: int = 0


def train_settings(msg: Message) -> TrainSettings:
    """The settings of a train message; the defaults for missing keys."""
    cfg = msg.content.config_records.get(P.CONFIG_KEY, ConfigRecord())
    d = TrainSettings()
    return TrainSettings(
        epochs=int(cfg.get(P.CFG_EPOCHS, d.epochs)),  # type: ignore[arg-type]
        lr=float(cfg.get(P.CFG_LR, d.lr)),  # type: ignore[arg-type]
        batch_size=int(cfg.get(P.CFG_BATCH_SIZE, d.batch_size)),  # type: ignore[arg-type]
        seed=int(cfg.get(P.CFG_SEED, d.seed)),  # type: ignore[arg-type]
        server_round=int(cfg.get(P.CFG_ROUND, d.server_round)),  # type: ignore[arg-type]
    )


def tasks_in(msg: Message) -> dict[str, ArrayRecord]:
    """Task -> the weights the message carries for it (``arrays.<task>``)."""
    out = {}
    for key, rec in msg.content.array_records.items():
        task = P.task_of(key, P.ARRAYS_PREFIX)
        if task is not None:
            out[task] = rec
    return out


def put_train_reply(
    content: MutableMapping[str, Any], task: str, weights: Weights, n: int, loss: float
) -> None:
    """One task's part of a train reply: the trained weights and their metrics."""
    content[P.arrays_key(task)] = numpy_to_arrays(weights)
    content[P.metrics_key(task)] = MetricRecord({P.NUM_EXAMPLES: int(n), P.TRAIN_LOSS: float(loss)})


def clip_for_config(
    msg: Message, task: str, new: Weights, received: Weights, trainer: Any
) -> Weights:
    """Client-side differential privacy (:mod:`mmfl_flwr.privacy`): ``new`` with its
    update ``new - received`` over the trainer's trainable entries (every
    floating-point entry without a declaration) clipped to the norm the train
    message sets for ``task`` (``clipping_norm.<task>`` or ``clipping_norm``);
    ``new`` itself without one (:func:`~mmfl_flwr.client.weights.clip_to_norm`,
    which the batched path applies too)."""
    cfg = msg.content.config_records.get(P.CONFIG_KEY, ConfigRecord())
    norm = clipping_norm_for(cfg, task)
    if norm is None:
        return new
    return clip_to_norm(new, received, trainer, norm)


def put_loss(content: MutableMapping[str, Any], task: str, loss: float) -> None:
    """One task's loss in a loss-query reply (MetricRecord ``losses``); ``content``
    is the reply's RecordDict, or a dict of its records."""
    losses = content.get(P.LOSSES_KEY)
    if losses is None:
        losses = content[P.LOSSES_KEY] = MetricRecord()
    losses[task] = float(loss)


def put_evaluation(
    content: MutableMapping[str, Any], task: str, loss: float, accuracy: float, n: int
) -> None:
    """One task's part of an evaluate reply."""
    content[P.metrics_key(task)] = MetricRecord(
        {P.NUM_EXAMPLES: int(n), P.LOSS: float(loss), P.ACCURACY: float(accuracy)}
    )
