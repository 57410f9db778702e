"""Phase 2 of a round (policies that need it): every client's loss on each
model it holds, from a forward pass (``query.losses``); absurd losses are
capped (:func:`~mmfl_flwr.strategy.validation.loss_cap`: a multiple of the
task's reference loss, the largest 90th percentile reported so far) so one
client cannot steer the sampling."""

from __future__ import annotations

import math
from collections.abc import Iterable
from logging import WARNING

from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.logger import log

from mmfl_flwr import protocol as P
from mmfl_flwr.records import InvalidReply, check_loss
from mmfl_flwr.strategy.replies import client_replies
from mmfl_flwr.strategy.state import HookError, RunState
from mmfl_flwr.strategy.validation import Limits, loss_cap


def loss_query_messages(
    run_state: RunState, server_round: int, only: set[str] | None = None
) -> list[Message]:
    """A ``query.losses`` message to every online client (or the ones in
    ``only``) with each active model it holds."""
    active = set(run_state.tasks)
    parts = []
    for cid in run_state.table.ids():
        if only is not None and cid not in only:
            continue
        tasks, content = run_state.models_for(cid, active)
        if tasks:
            parts.append((cid, content))
    return run_state.messages(parts, P.QUERY_LOSSES, server_round)


def accepted_losses(
    run_state: RunState, replies: Iterable[Message], server_round: int, limits: Limits
) -> RecordDict:
    """The losses of the replies that pass validation, capped: one MetricRecord
    per task (its key), client id -> loss. Nothing is stored here
    (:func:`install_losses` does that)."""
    received: dict[str, list[tuple[str, float]]] = {}
    for cid, reply in client_replies(
        run_state.node_to_cid,
        replies,
        "loss",
        server_round=server_round,
        lacking=run_state.lacking,
        shards=run_state.shards,
        shard_asked=run_state.addressed.get(P.QUERY_LOSSES),
    ):
        losses = reply.content.metric_records.get(P.LOSSES_KEY)
        if losses is None:
            log(WARNING, "Client %s: loss reply has no '%s' record; ignored", cid, P.LOSSES_KEY)
            continue
        for task, value in losses.items():
            if task not in run_state.table[cid].num_examples:
                log(
                    WARNING,
                    "Client %s reported a loss for task %r it was not asked about; ignored",
                    cid,
                    task,
                )
                continue
            try:
                loss = check_loss(value, f"loss of task {task!r}", limits.max_loss)
            except InvalidReply as err:
                run_state.defence.act(
                    "ignored",
                    cid,
                    task,
                    math.nan,
                    math.nan,
                    "Client %s: rejected loss: %s",
                    cid,
                    err,
                    level=WARNING,
                )
                continue
            received.setdefault(task, []).append((cid, loss))
    out = RecordDict()
    for task, pairs in received.items():
        cap = loss_cap(run_state, task, [v for _, v in pairs], limits.loss_cap)
        rec = MetricRecord()
        for cid, loss in pairs:
            if loss > cap:
                run_state.defence.act(
                    "loss",
                    cid,
                    task,
                    loss,
                    cap,
                    "Client %s: loss %.4g on task %r capped at %.4g (%g x the reference loss)",
                    cid,
                    loss,
                    task,
                    cap,
                    limits.loss_cap,
                )
                loss = cap
            rec[cid] = loss
        out[task] = rec
    return out


def install_losses(
    run_state: RunState, losses: RecordDict, server_round: int, max_loss: float, hook: str
) -> int:
    """Store ``losses`` (task -> MetricRecord of client id -> loss, as
    :func:`accepted_losses` returns them) in the client table; returns how many.
    Anything that is not a loss of a registered client on an active model it
    holds is refused with one error naming ``hook``, before anything is stored."""
    active = set(run_state.tasks)
    checked: list[tuple[str, str, float]] = []
    for task, rec in losses.items():
        if task not in active or not isinstance(rec, MetricRecord):
            raise HookError(
                f"{hook} returned {type(rec).__name__} {task!r}: expected one "
                f"MetricRecord per active model {sorted(active)}"
            )
        for cid, value in rec.items():
            if cid not in run_state.table or task not in run_state.table[cid].num_examples:
                raise HookError(
                    f"{hook} returned a loss of client {cid!r} on {task!r}: "
                    "no such registered client holds that model"
                )
            try:
                loss = check_loss(value, f"loss of client {cid!r} on {task!r}", max_loss)
            except InvalidReply as err:
                raise HookError(f"{hook} returned {err}") from None
            checked.append((cid, task, loss))
    for cid, task, loss in checked:
        run_state.table.set_loss(cid, task, loss, server_round)
    return len(checked)
