"""The replies of a multi-client node, computed per model for all its clients at once.

A node hosting a shard of clients (docs/protocol.md, multi-client nodes) gets one
message per round trip: the shared records (``arrays.<task>``, ``control.<task>``)
once and one ``config@<id>`` per client it addresses. :class:`ShardComputer`
answers it the way one GPU (or one process) answers best: per model, one batched
computation for every addressed client that holds it
(:mod:`mmfl_flwr.client.vectorized`):

* ``query.losses``: one no-grad forward over the clients' data, per-client means;
* ``train``: ``torch.func`` training of the stacked weights of all clients that
  train the model, each with its own mini-batch order from the run's seed;
* ``evaluate``: one forward over the clients' local test data.

A client whose part cannot be vectorised takes the per-client path on the same
node, in the same reply, with one log line per reason and process: a task whose
trainer does not implement
:class:`~mmfl_flwr.client.contract.VectorizableTrainer` (its own training
loop), SCAFFOLD's corrected steps (``control.<task>``), a model the batched
kernels do not support, and every other message type. A client whose part
fails answers ``error@<id>``; the node's other clients still count.

This is the one client-side implementation of the fast path: the ClientApp of
:func:`~mmfl_flwr.client.app.make_client_app` uses it on a shard node under
Flower's simulation engine and on a SuperNode, and ``--engine vectorized`` is
the same ClientApp on one in-process node that hosts every client.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from mmfl_flwr import protocol as P
from mmfl_flwr.client.contract import (
    VectorizableTrainer,
    put_evaluation,
    put_loss,
    put_train_reply,
    train_settings,
)
from mmfl_flwr.client.weights import clip_to_norm
from mmfl_flwr.core.clipping import clipping_norm_for
from mmfl_flwr.records import arrays_to_numpy
from mmfl_flwr.seeding import training_seed

__all__ = ["ShardComputer", "VECTOR_TYPES"]

log = logging.getLogger("mmfl_flwr")

#: The message types served in batches.
VECTOR_TYPES = (P.QUERY_LOSSES, MessageType.TRAIN, MessageType.EVALUATE)

#: ``one(spec, part, context, state_key) -> RecordDict``: one client's reply
OneClient = Callable[[Any, Any, Context, str], RecordDict]


class _Fallback(Exception):
    """This client's part goes through the per-client path; the message says why."""


def error_record(err: BaseException) -> ConfigRecord:
    """The ``error@<id>`` record of a client whose part failed."""
    return ConfigRecord({"code": 1, "reason": f"{type(err).__name__}: {err}"[:2000]})


@dataclass
class _Sorted:
    """A message's client parts as :meth:`ShardComputer.reply` sorts them."""

    #: the client ids in the message's order
    order: list[str] = field(default_factory=list)
    #: client id -> its records (plain dicts: one RecordDict insertion each, at the end)
    contents: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: client id -> (its spec, its config record, its tasks)
    parts: dict[str, tuple[Any, Any, list[str]]] = field(default_factory=dict)
    #: (task, training settings, clipping norm) -> [(client id, trainer, seed)]
    groups: dict[tuple[Any, ...], list[tuple[str, Any, int]]] = field(default_factory=dict)
    #: the clients for the per-client path, in the message's order
    fallback: list[str] = field(default_factory=list)


def _answer_one(
    part: tuple[Any, Any, list[str]], cid: str, arrays: Any, context: Context, one: OneClient
) -> dict[str, Any]:
    """Client ``cid``'s records from the per-client path (its error record where it fails)."""
    s, cfg, tasks = part
    content = RecordDict({P.CONFIG_KEY: cfg})
    for task in tasks:
        for shared in (P.arrays_key(task), P.control_key(task)):
            if shared in arrays:
                content[shared] = arrays[shared]
    try:
        return dict(
            one(s, SimpleNamespace(content=content), context, P.client_key("", cid)).items()
        )
    except Exception as err:  # noqa: BLE001 - one client's failure is its own
        return {P.ERROR_KEY: error_record(err)}


def check_options(chunk: int | None, threads: str | int | None) -> None:
    """ValueError (one line) for a ``chunk`` below 1 or ``threads`` that are
    neither None, ``"auto"`` nor a whole number >= 1."""
    from mmfl_flwr.client.threads import parse_threads
    from mmfl_flwr.engine_options import check_chunk

    check_chunk(chunk)
    if threads is not None:
        parse_threads(threads)


class ShardComputer:
    """Answers a multi-client node's messages, batching its clients per model.

    Parameters
    ----------
    chunk : int, optional
        Clients per batched training call (default: sized from free memory on a
        GPU, 64 on the CPU).
    vectorize : bool, default True
        False: every client takes the per-client path (one after another), as a
        node without the fast path would.
    threads : "auto", int or None
        Torch threads, set before every reply: ``"auto"`` the cores other
        processes leave free (:class:`~mmfl_flwr.client.threads.CoreWatch`), at
        most torch's threads when this object is made (a Flower worker's CPUs);
        a number that many; None (default) leaves them as they are.
    """

    def __init__(
        self, chunk: int | None = None, vectorize: bool = True, threads: str | int | None = None
    ) -> None:
        from mmfl_flwr.client.threads import ThreadChooser, parse_threads

        check_options(chunk, threads)
        self.chunk = None if chunk is None else int(chunk)
        self.vectorize = bool(vectorize)
        self._threads = None if threads is None else ThreadChooser(parse_threads(threads))
        self._models: dict[tuple[Any, ...], Any] = {}
        #: trainer -> why it cannot take the batched path ("" if it can), with
        #: ``{task}`` for the task's name: checked once per trainer (the
        #: contract is a runtime Protocol whose check, with the override check,
        #: would otherwise run for every client part of every message)
        self._contract: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._said: set[str] = set()
        #: client parts served in batches and on the per-client path
        self.counts: dict[str, int] = {"vectorized": 0, "per-client": 0}

    # -- helpers ---------------------------------------------------------------
    def _say_once(self, reason: str) -> None:
        if reason not in self._said:
            self._said.add(reason)
            log.info("shard node: %s; those clients run on the per-client path", reason)

    def _vector_model(self, task: str, trainer: Any) -> Any:
        from mmfl_flwr.client.vectorized import VectorModel

        key = (task, trainer.model_fn, str(trainer.device))
        vm = self._models.get(key)
        if vm is None:
            vm = VectorModel(trainer.model_fn, trainer.device)
            self._models[key] = vm
        return vm

    def _plan(self, spec: Any, tasks: list[str], control: bool, mtype: str) -> dict[str, Any]:
        """Task -> trainer of the ``tasks`` a client's part carries weights for,
        or :class:`_Fallback`."""
        if mtype not in VECTOR_TYPES:
            raise _Fallback(f"{mtype} messages are not batched")
        if control:
            raise _Fallback("SCAFFOLD's corrected local steps are not vectorised")
        if not tasks:
            raise _Fallback("a client part without a model is answered on its own")
        plan: dict[str, Any] = {}
        for task in tasks:
            tr = spec.trainers.get(task)
            if tr is None:
                raise _Fallback("a message names a task the client does not hold")
            why = self._why_not_batched(tr)
            if why:
                raise _Fallback(why.format(task=repr(task)))
            if mtype == MessageType.TRAIN:  # (forward passes take every model)
                reason = self._vector_model(task, tr).unsupported
                if reason is not None:
                    raise _Fallback(f"task {task!r}: {reason}")
            plan[task] = tr
        return plan

    def _why_not_batched(self, tr: Any) -> str:
        """Why trainer ``tr`` cannot take the batched path ("" if it can), with
        ``{task}`` for the task; computed once per trainer object (a trainer
        that cannot be weakly referenced is checked every time)."""
        try:
            return self._contract[tr]
        except (KeyError, TypeError):
            pass
        why = ""
        if not isinstance(tr, VectorizableTrainer):
            why = (
                f"task {{task}} has a trainer without the vectorizable contract "
                f"({type(tr).__name__})"
            )
        else:
            from mmfl_flwr.client import trainer as T  # (torch: imported when needed)

            overridden = T.torch_trainer_override(tr)
            if overridden:
                why = (
                    f"task {{task}}: {type(tr).__name__} overrides TorchTrainer."
                    f"{overridden} (its own loop runs, not the batched SGD)"
                )
        try:
            self._contract[tr] = why
        except TypeError:
            pass
        return why

    # -- the reply -------------------------------------------------------------
    def reply(
        self, specs: Sequence[Any], msg: Message, context: Context, one: OneClient
    ) -> RecordDict:
        """The reply of a multi-client node to ``msg``: for each client it
        addresses (``config@<id>``), that client's records re-keyed with
        ``@<id>``, or ``error@<id>`` for a client whose part failed."""
        if self._threads is not None:
            self._threads.apply()
        arrays = msg.content.array_records  # one view: it is rebuilt on each access
        mtype = msg.metadata.message_type
        sorted_ = self._sort(specs, msg, arrays, mtype)
        failed = self._run_groups(mtype, sorted_, arrays)
        position = {c: i for i, c in enumerate(sorted_.order)}
        fallback = sorted_.fallback + sorted(failed, key=position.__getitem__)
        done = set(fallback)
        self.counts["vectorized"] += sum(1 for c in sorted_.parts if c not in done)
        for cid in fallback:
            sorted_.contents[cid] = _answer_one(sorted_.parts[cid], cid, arrays, context, one)
            self.counts["per-client"] += 1
        reply = RecordDict()
        for cid in sorted_.order:
            for k, record in sorted_.contents[cid].items():
                reply[P.client_key(k, cid)] = record
        return reply

    def _sort(self, specs: Sequence[Any], msg: Message, arrays: Any, mtype: str) -> _Sorted:
        """The client parts of ``msg``, sorted into batched groups and the
        per-client path (an unknown client or unreadable part: its error)."""
        by_id = {s.client_id: s for s in specs}
        out = _Sorted()
        for record_key, cfg in msg.content.config_records.items():
            base, cid = P.split_client_key(record_key)
            if base != P.CONFIG_KEY or cid is None or cid in out.parts or cid in out.contents:
                continue
            out.order.append(cid)
            s = by_id.get(cid)
            if s is None:
                out.contents[cid] = {
                    P.ERROR_KEY: error_record(KeyError(f"this node does not host client {cid!r}"))
                }
                continue
            try:
                tasks = [str(t) for t in cfg.get(P.CFG_TASKS, [])]  # type: ignore[union-attr]
            except TypeError as err:
                out.contents[cid] = {P.ERROR_KEY: error_record(err)}
                continue
            out.parts[cid] = (s, cfg, tasks)
            mine = self._batched_part(s, cfg, tasks, arrays, mtype) if self.vectorize else None
            if mine is None:
                out.fallback.append(cid)
                continue
            out.contents[cid] = {}
            for key, tr, tseed in mine:
                out.groups.setdefault(key, []).append((cid, tr, tseed))
        return out

    def _batched_part(
        self, s: Any, cfg: Any, tasks: list[str], arrays: Any, mtype: str
    ) -> list[tuple[tuple[Any, ...], Any, int]] | None:
        """A client part's ``(group key, trainer, training seed)`` per task it
        carries weights for, or None where it takes the per-client path."""
        try:
            plan = self._plan(
                s,
                [t for t in tasks if P.arrays_key(t) in arrays],
                any(P.control_key(t) in arrays for t in tasks),
                mtype,
            )
        except _Fallback as why:
            self._say_once(str(why))
            return None
        except Exception:  # noqa: BLE001 - the per-client path produces the error
            return None
        try:  # a config that does not parse fails this client alone (per-client path)
            settings: tuple[Any, ...] = ()
            seed = rnd = 0
            train = mtype == MessageType.TRAIN
            if train:
                ts = train_settings(
                    SimpleNamespace(  # type: ignore[arg-type]
                        content=SimpleNamespace(config_records={P.CONFIG_KEY: cfg})
                    )
                )
                seed, rnd = ts.seed, ts.server_round
                settings = (ts.epochs, ts.lr, ts.batch_size)
            return [
                (
                    (task, settings, clipping_norm_for(cfg, task) if train else None),
                    tr,
                    training_seed(seed, rnd, s.client_id, task) if train else 0,
                )
                for task, tr in plan.items()
            ]
        except Exception:  # noqa: BLE001
            return None

    def _run_groups(self, mtype: str, sorted_: _Sorted, arrays: Any) -> set[str]:
        """Compute every batched group into its clients' contents; the clients
        of a group that failed (e.g. out of memory: the per-client path decides)."""
        failed: set[str] = set()
        for key, items in sorted_.groups.items():
            try:
                self._run_group(mtype, key, arrays[P.arrays_key(key[0])], items, sorted_.contents)
            except Exception as err:
                log.warning(
                    "shard node: %s for %d clients of task %r failed (%s: %s); "
                    "running them on the per-client path",
                    mtype,
                    len(items),
                    key[0],
                    type(err).__name__,
                    err,
                )
                failed.update(cid for cid, *_ in items)
        return failed

    def _run_group(
        self,
        mtype: str,
        key: tuple[Any, ...],
        record: Any,
        items: list[tuple[str, Any, int]],
        contents: dict[str, dict[str, Any]],
    ) -> None:
        from mmfl_flwr.client import vectorized as V

        task, settings, clip = key
        weights = arrays_to_numpy(record)
        vm = self._vector_model(task, items[0][1])
        if mtype == MessageType.TRAIN:
            epochs, lr, batch = settings
            jobs = [V.TrainJob(V.ClientData(*tr.train_tensors()), tseed) for _, tr, tseed in items]
            t0 = time.monotonic()
            results = V.batched_train(vm, weights, jobs, epochs, lr, batch, chunk=self.chunk)
            log.debug(
                "shard node: batched training of %d clients of %r: %.3f s",
                len(jobs),
                task,
                time.monotonic() - t0,
            )
            received = arrays_to_numpy(record) if clip is not None else {}
            for (cid, tr, _), (new, n, loss) in zip(items, results):
                if clip is not None:  # client-side differential privacy
                    new = clip_to_norm(new, received, tr, clip)
                put_train_reply(contents[cid], task, new, n, loss)
        elif mtype == P.QUERY_LOSSES:
            for (cid, *_), value in zip(
                items, V.batched_losses(vm, weights, _data(items, "train"))
            ):
                put_loss(contents[cid], task, value)
        else:  # evaluate
            for (cid, *_), (loss, acc, n) in zip(
                items, V.batched_evaluate(vm, weights, _data(items, "eval"))
            ):
                put_evaluation(contents[cid], task, loss, acc, n)


def _data(items: list[tuple[str, Any, int]], side: str) -> Any:
    """The clients' data of a forward pass: their packed rows where they lie one
    after another in one shared tensor (a shard's clients, in order: no copy and
    no tensor per client), otherwise each client's tensors."""
    from mmfl_flwr.client import vectorized as V
    from mmfl_flwr.client.trainer import packed_rows

    trainers = [tr for _, tr, _ in items]
    packed = packed_rows(trainers, side)
    if packed is not None:
        return V.PackedData(*packed)
    return [
        V.ClientData(*(tr.train_tensors() if side == "train" else tr.eval_tensors()))
        for tr in trainers
    ]
