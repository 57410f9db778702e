"""The MMFL ClientApp: one local trainer per task, handlers for every message.

This module is framework-agnostic: a *trainer* is any object with the methods of
:class:`~mmfl_flwr.client.contract.LocalTrainer` (the torch implementations are
:class:`mmfl_flwr.client.trainer.TorchTrainer` and
:class:`mmfl_flwr.client.functions.FunctionTrainer`).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from mmfl_flwr import protocol as P
from mmfl_flwr.client.contract import (
    LocalTrainer,
    Weights,
    clip_for_config,
    put_evaluation,
    put_loss,
    put_train_reply,
    takes_correction,
    tasks_in,
    train_settings,
    trainable_keys,
)
from mmfl_flwr.records import DecodeCache, arrays_to_numpy, numpy_to_arrays
from mmfl_flwr.seeding import training_seed

__all__ = ["ClientSpec", "LocalTrainer", "SpecFn", "cache_specs", "make_client_app"]


@dataclass
class ClientSpec:
    """One client: its stable id, processors and one trainer per eligible task."""

    client_id: str
    trainers: dict[str, LocalTrainer]
    processors: int = 1
    #: a secret proving ``client_id`` (sent in the info reply; the server checks
    #: it against its pin of the id), or None
    client_token: str | None = None


#: ``spec_fn(context)``: the node's client, or the clients of a multi-client node
SpecFn = Callable[[Context], ClientSpec | Sequence[ClientSpec]]


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
    state_key: str = "",
) -> tuple[Weights, int, float, Weights]:
    """SCAFFOLD local training for one task.

    Steps ``w <- w - lr (grad + c - c_i)``; afterwards
    ``c_i <- c_i - c + (w_global - w_local) / (K lr)`` with ``K`` the number of
    local steps. ``c_i`` persists in ``context.state`` under ``scaffold.<task>``
    (``scaffold.<task>@<client id>`` on a multi-client node: ``state_key``).
    """
    key = "scaffold." + task + state_key
    stored = context.state.array_records.get(key)
    c_client = (
        arrays_to_numpy(stored)
        if stored is not None
        else {k: np.zeros_like(v) for k, v in c_server.items()}
    )
    if not takes_correction(tr):
        raise TypeError(
            f"SCAFFOLD needs a trainer whose train() takes correction= (the "
            f"trainer of task {task!r} is a {type(tr).__name__})"
        )
    correction = {k: c_server[k] - c_client[k] for k in c_server}
    new, n, loss = tr.train(weights, epochs, lr, seed, batch, correction=correction)
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


#: Per-process state of the ClientApps built in this or another process, by the
#: app's build token (its specs, its shard computer, its decoded weights).
#: Flower's Ray backend pickles the ClientApp with every message it sends to a
#: worker, so state kept in the app object itself would be a fresh, empty copy
#: each time: a shard node would rebuild its clients' data every message. The
#: token travels with the pickled app and finds the worker's state again. The
#: most recently used apps' states are kept (a process that builds many apps,
#: a test suite, does not keep them all).
_PROCESS_STATE: OrderedDict[str, dict[str, Any]] = OrderedDict()
_PROCESS_STATE_SIZE = 16


def process_state(token: str) -> dict[str, Any]:
    """The state of the app built with ``token`` in this process (created empty)."""
    state = _PROCESS_STATE.get(token)
    if state is None:
        state = _PROCESS_STATE[token] = {}
        while len(_PROCESS_STATE) > _PROCESS_STATE_SIZE:
            _PROCESS_STATE.popitem(last=False)
    else:
        _PROCESS_STATE.move_to_end(token)
    return state


def _state_item(token: str, name: str, make: Callable[[], Any]) -> Any:
    """Item ``name`` of the app's per-process state, made by ``make()`` at first use."""
    state = process_state(token)
    if name not in state:
        state[name] = make()
    return state[name]


def cache_specs(spec_fn: SpecFn, cache_key: Callable[[Context], Hashable] | None = None) -> SpecFn:
    """``spec_fn`` with its specs built once per process and key (default: the
    node config and run config), since building data loaders on every message is
    wasteful. Pass the result to :func:`make_client_app` with ``cached=True`` to
    share the specs with another consumer (the vectorised engine)."""
    token = uuid4().hex

    def default_key(ctx: Context) -> Hashable:
        return (
            tuple(sorted(ctx.node_config.items())),
            tuple(sorted(ctx.run_config.items())),
        )

    key_fn = cache_key or default_key

    def spec(ctx: Context) -> ClientSpec:
        cache = _state_item(token, "specs", dict)
        k = key_fn(ctx)
        if k not in cache:
            cache[k] = spec_fn(ctx)
        return cache[k]

    spec.process_token = token  # type: ignore[attr-defined]
    # the state goes with the function in the process that made it (a copy
    # pickled to another process keeps that process's state: no finalizer there)
    weakref.finalize(spec, _PROCESS_STATE.pop, token, None)
    return spec


def _trainer(s: ClientSpec, task: str) -> LocalTrainer:
    """Client ``s``'s trainer of ``task`` (KeyError naming both where it holds none)."""
    if task not in s.trainers:
        raise KeyError(f"client {s.client_id} holds no data for task {task!r}")
    return s.trainers[task]


def _info_record(s: ClientSpec) -> ConfigRecord:
    """Client ``s``'s info record: its id, tasks, examples, processors, handlers,
    token and declared trainable keys."""
    tasks = list(s.trainers)
    rec = ConfigRecord(
        {
            P.CLIENT_ID: s.client_id,
            P.TASKS: tasks,
            P.NUM_EXAMPLES: [int(s.trainers[t].num_examples) for t in tasks],
            P.PROCESSORS: int(s.processors),
            P.HANDLERS: [P.QUERY_INFO, P.QUERY_LOSSES, "train", "evaluate"],
        }
    )
    if s.client_token:
        rec[P.CLIENT_TOKEN] = str(s.client_token)
    for t in tasks:
        keys = trainable_keys(s.trainers[t])
        if keys:
            rec[P.trainable_key(t)] = keys
    return rec


def _info_content(specs: ClientSpec | Sequence[ClientSpec]) -> RecordDict:
    """The info reply of a node: its client's record, or one per client of its
    shard (``info@<id>``; ValueError for an empty shard or ids that clash)."""
    if isinstance(specs, ClientSpec):
        return RecordDict({P.INFO_KEY: _info_record(specs)})
    specs = list(specs)
    if not specs:
        raise ValueError("this node hosts no client: its shard is empty")
    ids = [s.client_id for s in specs]
    bad = [c for c in ids if P.CLIENT_SEP in c]
    if bad or len(set(ids)) != len(ids):
        raise ValueError(
            f"the client ids of a node's shard must be distinct and free of "
            f"{P.CLIENT_SEP!r} (got {bad[:3] or sorted(ids)[:5]})"
        )
    return RecordDict({P.client_key(P.INFO_KEY, s.client_id): _info_record(s) for s in specs})


class _ClientWork:
    """One client's answers on the per-client path (``one(spec, msg, context,
    state_key) -> RecordDict``), with the app's decoding of the round's weights."""

    def __init__(self, decode: Callable[[Any], Weights]) -> None:
        self.decode = decode

    def losses(self, s: ClientSpec, msg: Any, context: Context, state_key: str) -> RecordDict:
        """The loss-query reply: each task's mean training loss."""
        content = RecordDict({P.LOSSES_KEY: MetricRecord()})
        for task, rec in tasks_in(msg).items():
            put_loss(content, task, _trainer(s, task).loss(self.decode(rec)))
        return content

    def train(self, s: ClientSpec, msg: Any, context: Context, state_key: str) -> RecordDict:
        """The train reply: each task trained (SCAFFOLD's corrected steps where the
        message carries ``control.<task>``), clipped where the config says so."""
        cfg = train_settings(msg)
        content = RecordDict()
        for task, rec in tasks_in(msg).items():
            weights = self.decode(rec)
            tseed = training_seed(cfg.seed, cfg.server_round, s.client_id, task)
            tr = _trainer(s, task)
            if P.control_key(task) in msg.content.array_records:
                new, n, loss, c_new = _scaffold_train(
                    tr,
                    weights,
                    arrays_to_numpy(msg.content[P.control_key(task)]),
                    context,
                    task,
                    cfg.epochs,
                    cfg.lr,
                    tseed,
                    cfg.batch_size,
                    state_key,
                )
                content[P.control_key(task)] = numpy_to_arrays(c_new)
            else:
                new, n, loss = tr.train(weights, cfg.epochs, cfg.lr, tseed, cfg.batch_size)
            new = clip_for_config(msg, task, new, self.decode(rec), tr)
            put_train_reply(content, task, new, n, loss)
        return content

    def evaluation(self, s: ClientSpec, msg: Any, context: Context, state_key: str) -> RecordDict:
        """The evaluate reply: each task's loss, accuracy and examples."""
        content = RecordDict()
        for task, rec in tasks_in(msg).items():
            put_evaluation(content, task, *_trainer(s, task).evaluate(self.decode(rec)))
        return content


def make_client_app(
    spec_fn: SpecFn,
    cache_key: Callable[[Context], Hashable] | None = None,
    *,
    cached: bool = False,
    chunk: int | None = None,
    vectorize: bool = True,
    threads: str | int | None = None,
) -> ClientApp:
    """Build the MMFL ClientApp.

    Parameters
    ----------
    spec_fn : callable
        ``spec_fn(context) -> ClientSpec``: this node's stable id, processors and
        trainers (read ``context.node_config`` / ``context.run_config``); or a
        list of ClientSpecs: the node hosts that shard of clients (one message
        per round carries their work; docs/protocol.md, multi-client nodes).
    cache_key : callable, optional
        Specs are built once per process and key (default: the node config and
        run config), since building data loaders on every message is wasteful.
    cached : bool, default False
        ``spec_fn`` already caches (:func:`cache_specs`); use it as it is.
    chunk : int, optional
        On a multi-client node: clients per batched training call (default:
        sized from free memory on a GPU, 64 on the CPU).
    vectorize : bool, default True
        On a multi-client node: compute the replies per model for all its
        clients at once (:class:`~mmfl_flwr.client.shard.ShardComputer`);
        False answers client after client.
    threads : "auto", int or None
        On a multi-client node: torch's threads before every reply (``"auto"``:
        the cores other processes leave free); None (default) leaves them.
    """
    from mmfl_flwr.client.shard import ShardComputer, check_options

    check_options(chunk, threads)
    app = ClientApp()
    token = uuid4().hex  # finds this app's state in a process that got it pickled

    def shard() -> ShardComputer:
        return _state_item(
            token,
            "shard",
            lambda: ShardComputer(chunk=chunk, vectorize=vectorize, threads=threads),
        )

    app.shard = shard  # type: ignore[attr-defined]  # its counts, for tests and benchmarks
    spec = spec_fn if cached else cache_specs(spec_fn, cache_key)
    weakref.finalize(app, _PROCESS_STATE.pop, token, None)

    def decode(record: Any) -> Any:
        """The round's weights are the same for every client: decoded once."""
        return _state_item(token, "decode", DecodeCache).decode(record)

    work = _ClientWork(decode)

    def serve(msg: Message, context: Context, one: Callable[..., RecordDict]) -> Message:
        """Answer ``msg`` for the node's client, or for every client of a shard
        addressed in it (``config@<id>``), per model for all of them at once where
        the fast path applies (:class:`~mmfl_flwr.client.shard.ShardComputer`)."""
        specs = spec(context)
        if isinstance(specs, ClientSpec):
            return Message(one(specs, msg, context, ""), reply_to=msg)
        return Message(shard().reply(list(specs), msg, context, one), reply_to=msg)

    @app.query("info")
    def info(msg: Message, context: Context) -> Message:
        return Message(_info_content(spec(context)), reply_to=msg)

    @app.query("losses")
    def losses(msg: Message, context: Context) -> Message:
        return serve(msg, context, work.losses)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return serve(msg, context, work.train)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return serve(msg, context, work.evaluation)

    return app
