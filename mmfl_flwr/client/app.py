"""The MMFL ClientApp: one local trainer per task, handlers for every message.

This module is framework-agnostic: a *trainer* is any object with the methods of
:class:`LocalTrainer` (the torch implementation is
:class:`mmfl_flwr.client.trainer.TorchTrainer`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from mmfl_flwr import protocol as P
from mmfl_flwr.records import DecodeCache, arrays_to_numpy, numpy_to_arrays
from mmfl_flwr.seeding import training_seed

Weights = dict[str, np.ndarray]


class LocalTrainer(Protocol):
    """What the ClientApp needs for one task on one client."""

    @property
    def num_examples(self) -> int:
        """Training examples on this client."""

    def train(
        self, weights: Weights, epochs: int, lr: float, seed: int, batch_size: int | None = None
    ) -> tuple[Weights, int, float]:
        """Local training; returns (new weights, examples, mean training loss)."""

    def loss(self, weights: Weights) -> float:
        """Mean loss on the local training data, forward pass only."""

    def evaluate(self, weights: Weights) -> tuple[float, float, int]:
        """(loss, accuracy, examples) on the local test data."""

    # Optional: ``trainable_keys`` (a list of str), the weights' keys that are
    # trainable parameters. The other keys (batch-norm running statistics, step
    # counters) are model state: the server averages them instead of treating
    # them as part of the update. Without it, floating-point entries count as
    # trainable and integer entries as state.


@dataclass
class ClientSpec:
    """One client: its stable id, processors and one trainer per eligible task."""

    client_id: str
    trainers: dict[str, LocalTrainer]
    processors: int = 1
    #: a secret proving ``client_id`` (sent in the info reply; the server checks
    #: it against its pin of the id), or None
    client_token: str | None = None


SpecFn = Callable[[Context], ClientSpec]


def _tasks_in(msg: Message) -> dict[str, ArrayRecord]:
    out = {}
    for key, rec in msg.content.array_records.items():
        task = P.task_of(key, P.ARRAYS_PREFIX)
        if task is not None:
            out[task] = rec
    return out


def _scaffold_train(
    tr: LocalTrainer,
    weights: Weights,
    c_server: Weights,
    context: Context,
    task: str,
    epochs: int,
    lr: float,
    seed: int,
    batch: int,
) -> tuple[Weights, int, float, Weights]:
    """SCAFFOLD local training for one task.

    Steps ``w <- w - lr (grad + c - c_i)``; afterwards
    ``c_i <- c_i - c + (w_global - w_local) / (K lr)`` with ``K`` the number of
    local steps. ``c_i`` persists in ``context.state`` under ``scaffold.<task>``.
    """
    key = "scaffold." + task
    stored = context.state.array_records.get(key)
    c_client = (
        arrays_to_numpy(stored)
        if stored is not None
        else {k: np.zeros_like(v) for k, v in c_server.items()}
    )
    correction = {k: c_server[k] - c_client[k] for k in c_server}
    new, n, loss = tr.train(weights, epochs, lr, seed, batch, correction=correction)  # type: ignore[call-arg]
    steps = epochs * -(-int(n) // int(batch))
    c_new = {
        k: (
            c_client[k].astype(np.float64)
            - c_server[k]
            + (weights[k].astype(np.float64) - new[k]) / (steps * lr)
        ).astype(c_server[k].dtype)
        for k in c_server
    }
    context.state[key] = numpy_to_arrays(c_new)
    return new, n, loss, c_new


def cache_specs(
    spec_fn: SpecFn, cache_key: Callable[[Context], Hashable] | None = None
) -> SpecFn:
    """``spec_fn`` with its specs built once per process and key (default: the
    node config and run config), since building data loaders on every message is
    wasteful. Pass the result to :func:`make_client_app` with ``cached=True`` to
    share the specs with another consumer (the vectorised engine)."""
    cache: dict[Hashable, ClientSpec] = {}

    def default_key(ctx: Context) -> Hashable:
        return (
            tuple(sorted(ctx.node_config.items())),
            tuple(sorted(ctx.run_config.items())),
        )

    key_fn = cache_key or default_key

    def spec(ctx: Context) -> ClientSpec:
        k = key_fn(ctx)
        if k not in cache:
            cache[k] = spec_fn(ctx)
        return cache[k]

    return spec


def make_client_app(
    spec_fn: SpecFn,
    cache_key: Callable[[Context], Hashable] | None = None,
    *,
    cached: bool = False,
) -> ClientApp:
    """Build the MMFL ClientApp.

    Parameters
    ----------
    spec_fn : callable
        ``spec_fn(context) -> ClientSpec``: this node's stable id, processors and
        trainers (read ``context.node_config`` / ``context.run_config``).
    cache_key : callable, optional
        Specs are built once per process and key (default: the node config and
        run config), since building data loaders on every message is wasteful.
    cached : bool, default False
        ``spec_fn`` already caches (:func:`cache_specs`); use it as it is.
    """
    app = ClientApp()
    spec = spec_fn if cached else cache_specs(spec_fn, cache_key)
    decode = DecodeCache().decode  # the round's weights are the same for every client

    def trainer(s: ClientSpec, task: str) -> LocalTrainer:
        if task not in s.trainers:
            raise KeyError(f"client {s.client_id} holds no data for task {task!r}")
        return s.trainers[task]

    @app.query("info")
    def info(msg: Message, context: Context) -> Message:
        s = spec(context)
        tasks = list(s.trainers)
        rec = ConfigRecord(
            {
                P.CLIENT_ID: s.client_id,
                P.TASKS: tasks,
                P.NUM_EXAMPLES: [int(s.trainers[t].num_examples) for t in tasks],
                P.PROCESSORS: int(s.processors),
            }
        )
        if s.client_token:
            rec[P.CLIENT_TOKEN] = str(s.client_token)
        for t in tasks:
            keys = getattr(s.trainers[t], "trainable_keys", None)
            if keys:
                rec[P.trainable_key(t)] = [str(k) for k in keys]
        return Message(RecordDict({P.INFO_KEY: rec}), reply_to=msg)

    @app.query("losses")
    def losses(msg: Message, context: Context) -> Message:
        s = spec(context)
        out = MetricRecord()
        for task, rec in _tasks_in(msg).items():
            out[task] = float(trainer(s, task).loss(decode(rec)))
        return Message(RecordDict({P.LOSSES_KEY: out}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        s = spec(context)
        cfg = msg.content.config_records.get(P.CONFIG_KEY, ConfigRecord())
        epochs = int(cfg.get(P.CFG_EPOCHS, 1))  # type: ignore[arg-type]
        lr = float(cfg.get(P.CFG_LR, 0.05))  # type: ignore[arg-type]
        batch = int(cfg.get(P.CFG_BATCH_SIZE, 32))  # type: ignore[arg-type]
        seed = int(cfg.get(P.CFG_SEED, 0))  # type: ignore[arg-type]
        rnd = int(cfg.get(P.CFG_ROUND, 0))  # type: ignore[arg-type]
        content = RecordDict()
        for task, rec in _tasks_in(msg).items():
            weights = decode(rec)
            tseed = training_seed(seed, rnd, s.client_id, task)
            tr = trainer(s, task)
            if P.control_key(task) in msg.content.array_records:
                new, n, loss, c_new = _scaffold_train(
                    tr, weights, arrays_to_numpy(msg.content[P.control_key(task)]),
                    context, task, epochs, lr, tseed, batch,
                )
                content[P.control_key(task)] = numpy_to_arrays(c_new)
            else:
                new, n, loss = tr.train(weights, epochs, lr, tseed, batch)
            content[P.arrays_key(task)] = numpy_to_arrays(new)
            content[P.metrics_key(task)] = MetricRecord(
                {P.NUM_EXAMPLES: int(n), P.TRAIN_LOSS: float(loss)}
            )
        return Message(content, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        s = spec(context)
        content = RecordDict()
        for task, rec in _tasks_in(msg).items():
            loss, acc, n = trainer(s, task).evaluate(decode(rec))
            content[P.metrics_key(task)] = MetricRecord(
                {P.NUM_EXAMPLES: int(n), P.LOSS: float(loss), P.ACCURACY: float(acc)}
            )
        return Message(content, reply_to=msg)

    return app
