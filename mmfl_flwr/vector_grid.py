"""VectorizedGrid: the in-process Grid that serves a round trip's messages together.

The strategy and the message protocol are unchanged: the server sends one
message per client, as it does to Flower's engines, and gets one reply per
client. What changes is how the replies are computed. ``send_and_receive``
takes all messages of the round trip, and per model runs one batched
computation for every client that holds it
(:mod:`mmfl_flwr.client.vectorized`):

* ``query.losses``: one no-grad forward over the clients' data, per-client means;
* ``train``: ``torch.func`` training of the stacked weights of all clients that
  train the model, each with its own mini-batch order from the run's seed;
* ``evaluate``: one forward over the clients' local test data.

Messages that cannot be vectorised go through the ClientApp as on the
in-process engine, in the same round: a task whose trainer does not implement
:class:`~mmfl_flwr.client.contract.VectorizableTrainer` (a user task with its
own training loop), SCAFFOLD's corrected training (control variates) and every
other message type (``query.info``). Each reason is logged once per run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any
from uuid import uuid4

from flwr.app import Message, MessageType, RecordDict

from mmfl_flwr import protocol as P
from mmfl_flwr.client.app import ClientSpec, SpecFn
from mmfl_flwr.client.contract import (
    VectorizableTrainer,
    put_evaluation,
    put_loss,
    put_train_reply,
    train_settings,
    trainable_keys,
)
from mmfl_flwr.core.clipping import clip_update, clipping_norm_for
from mmfl_flwr.grid import ClientAppLike, InProcessGrid
from mmfl_flwr.records import arrays_to_numpy
from mmfl_flwr.seeding import training_seed

log = logging.getLogger("mmfl_flwr")

#: The message types served in batches.
VECTOR_TYPES = (P.QUERY_LOSSES, MessageType.TRAIN, MessageType.EVALUATE)


class _Fallback(Exception):
    """This message goes through the ClientApp; the message says why."""


class VectorizedGrid(InProcessGrid):
    """An :class:`~mmfl_flwr.grid.InProcessGrid` that computes the replies of a
    round trip per model, for all its clients at once.

    Parameters
    ----------
    client_app : callable
        The ClientApp, for the messages that are not vectorised.
    spec_fn : callable
        ``spec_fn(context) -> ClientSpec``, the same (cached) specs the
        ClientApp uses (:func:`mmfl_flwr.client.app.cache_specs`).
    node_configs, run_config, seed, run_id
        As :class:`~mmfl_flwr.grid.InProcessGrid`.
    chunk : int, optional
        Clients per batched training call (default: sized from free memory on a
        GPU, 64 on the CPU).
    """

    def __init__(
        self,
        client_app: ClientAppLike,
        spec_fn: SpecFn,
        node_configs: Iterable[Mapping[str, Any]],
        run_config: Mapping[str, Any] | None = None,
        seed: int = 0,
        run_id: int = 1,
        chunk: int | None = None,
    ) -> None:
        super().__init__(client_app, node_configs, run_config, seed=seed, run_id=run_id)
        if chunk is not None and int(chunk) < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.spec_fn = spec_fn
        self.chunk = None if chunk is None else int(chunk)
        self._models: dict[str, Any] = {}
        self._said: set[str] = set()
        #: messages served in batches and through the ClientApp, by type
        self.counts: dict[str, int] = {"vectorized": 0, "per-client": 0}

    # -- helpers ---------------------------------------------------------------
    def _say_once(self, reason: str) -> None:
        if reason not in self._said:
            self._said.add(reason)
            log.info("vectorized engine: %s; those messages run on the per-client path",
                     reason)

    def _vector_model(self, task: str, trainer: Any) -> Any:
        from mmfl_flwr.client.vectorized import VectorModel

        vm = self._models.get(task)
        if vm is None:
            vm = VectorModel(trainer.model_fn, trainer.device)
            self._models[task] = vm
        return vm

    def _plan(self, msg: Message, spec: ClientSpec) -> dict[str, Any]:
        """What ``msg`` asks of this client, or :class:`_Fallback`."""
        tasks = {}
        for key, rec in msg.content.array_records.items():
            task = P.task_of(key, P.ARRAYS_PREFIX)
            if task is not None:
                tasks[task] = rec
            elif P.task_of(key, P.CONTROL_PREFIX) is not None:
                raise _Fallback("SCAFFOLD's corrected local steps are not vectorised")
        for task in tasks:
            tr = spec.trainers.get(task)
            if tr is None:
                raise _Fallback("a message names a task the client does not hold")
            if not isinstance(tr, VectorizableTrainer):
                raise _Fallback(f"task {task!r} has a trainer without the vectorizable "
                                f"contract ({type(tr).__name__})")
            reason = self._vector_model(task, tr).unsupported
            if reason is not None and msg.metadata.message_type == MessageType.TRAIN:
                raise _Fallback(f"task {task!r}: {reason}")
        return tasks

    # -- Grid API --------------------------------------------------------------
    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        msgs = list(messages)
        replies: dict[int, Message] = {}
        contents: dict[int, RecordDict] = {}
        # (message type, task, id of the weights record, training settings) -> items
        groups: dict[tuple[Any, ...], list[tuple[int, Any, str, int]]] = {}
        records: dict[tuple[Any, ...], Any] = {}
        fallback: list[int] = []
        for i, msg in enumerate(msgs):
            ctx = self._contexts.get(msg.metadata.dst_node_id)
            if ctx is None:
                continue  # unknown destination: dropped, as Flower does
            mtype = msg.metadata.message_type
            if mtype not in VECTOR_TYPES:
                fallback.append(i)
                continue
            try:
                spec = self.spec_fn(ctx)
                if not isinstance(spec, ClientSpec):
                    raise _Fallback("a node hosting a shard of clients is served on the "
                                    "per-client path (its vectorisation is not there yet)")
                tasks = self._plan(msg, spec)
            except _Fallback as why:
                self._say_once(str(why))
                fallback.append(i)
                continue
            except Exception:  # the ClientApp will produce the error reply
                fallback.append(i)
                continue
            settings: tuple[Any, ...] = ()
            seed = rnd = 0
            if mtype == MessageType.TRAIN:
                cfg = train_settings(msg)
                seed, rnd = cfg.seed, cfg.server_round
                settings = (cfg.epochs, cfg.lr, cfg.batch_size)
            msg.metadata.__dict__["_message_id"] = uuid4().hex
            contents[i] = RecordDict()
            for task, rec in tasks.items():
                clip = (clipping_norm_for(msg.content.config_records.get(P.CONFIG_KEY, {}), task)
                        if mtype == MessageType.TRAIN else None)
                key = (mtype, task, id(rec), settings, clip)
                records[key] = rec
                tseed = training_seed(seed, rnd, spec.client_id, task)
                groups.setdefault(key, []).append((i, spec.trainers[task], task, tseed))
        failed: set[int] = set()
        for key, items in groups.items():
            try:
                self._run_group(key, records[key], items, contents)
            except Exception as err:  # e.g. out of memory: the per-client path decides
                log.warning("vectorized engine: %s for %s of task %r failed (%s: %s); "
                            "running it on the per-client path", key[0], len(items),
                            key[1], type(err).__name__, err)
                failed.update(i for i, *_ in items)
        for i, content in contents.items():
            if i in failed:
                fallback.append(i)
                continue
            replies[i] = Message(content, reply_to=msgs[i])
            self.counts["vectorized"] += 1
        for i in sorted(fallback):
            reply = self._deliver(msgs[i])
            self.counts["per-client"] += 1
            if reply is not None:
                replies[i] = reply
        return [replies[i] for i in sorted(replies)]

    def _run_group(
        self,
        key: tuple[Any, ...],
        record: Any,
        items: list[tuple[int, Any, str, int]],
        contents: dict[int, RecordDict],
    ) -> None:
        from mmfl_flwr.client import vectorized as V

        mtype, task, _, settings, clip = key
        weights = arrays_to_numpy(record)
        vm = self._vector_model(task, items[0][1])
        if mtype == MessageType.TRAIN:
            epochs, lr, batch = settings
            jobs = [V.TrainJob(V.ClientData(*tr.train_tensors()), tseed)
                    for _, tr, _, tseed in items]
            t0 = time.monotonic()
            results = V.batched_train(vm, weights, jobs, epochs, lr, batch, chunk=self.chunk)
            log.debug("vectorized train of %d clients of %r: %.3f s", len(jobs), task,
                      time.monotonic() - t0)
            received = arrays_to_numpy(record) if clip is not None else {}
            for (i, tr, *_), (new, n, loss) in zip(items, results):
                if clip is not None:  # client-side differential privacy
                    keys = trainable_keys(tr) or [k for k, v in new.items()
                                                  if v.dtype.kind == "f"]
                    new = clip_update(dict(new), received, keys, clip)[0]
                put_train_reply(contents[i], task, new, n, loss)
        elif mtype == P.QUERY_LOSSES:
            data = [V.ClientData(*tr.train_tensors()) for _, tr, _, _ in items]
            for (i, *_), value in zip(items, V.batched_losses(vm, weights, data)):
                put_loss(contents[i], task, value)
        else:  # evaluate
            data = [V.ClientData(*tr.eval_tensors()) for _, tr, _, _ in items]
            for (i, *_), (loss, acc, n) in zip(items, V.batched_evaluate(vm, weights, data)):
                put_evaluation(contents[i], task, loss, acc, n)
