"""Phase 5 of a round: each (client, task) part of a train reply is checked on
its own and becomes an :class:`~mmfl_flwr.core.aggregators.Update`, or is
rejected with the reason, logged with the client id (:func:`collect_updates`,
:func:`validate_train_part`).

The bounds on what the accepted parts report live in :mod:`.bounds` (norms,
counts, losses, and :class:`Limits`, which holds them all), :mod:`.directions`
and :mod:`.influence`; they are importable from here too. A reply that fails
a check (malformed, failed, missing) is logged at WARNING and recorded as a
defence event (:mod:`.events`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import WARNING

import numpy as np
from flwr.app import Message, RecordDict
from flwr.common.logger import log

from mmfl_flwr import protocol as P
from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.core.clients import MAX_NUM_EXAMPLES, ClientInfo
from mmfl_flwr.core.policy import Pick
from mmfl_flwr.records import InvalidReply, NumpyWeights, check_count, check_loss, check_weights
from mmfl_flwr.strategy.bounds import (
    BOUND_OBSERVERS,
    COLLUSION_FACTOR,
    DIRECTION_FACTOR,
    INFLUENCE_CLIP_FACTOR,
    MIN_ROUND_NORMS,
    NORM_HISTORY,
    REVERSED_INFLUENCE_FACTOR,
    UPDATE_CLIP_FACTOR,
    Limits,
    apply_count_cap,
    bound_update_norms,
    cap_train_losses,
    l2_norm,
    loss_cap,
)
from mmfl_flwr.strategy.collusion import COLLUSION_MIN_UPDATES, check_collusion
from mmfl_flwr.strategy.directions import (
    DIRECTION_AGREEMENT,
    DIRECTION_HISTORY,
    DIRECTION_LEAVE_ONE_OUT,
    DIRECTION_MIN_CLIENTS,
    DIRECTION_MIN_ROUNDS,
    MEDIAN_BLOCK,
    check_directions,
)
from mmfl_flwr.strategy.events import DefenceLog
from mmfl_flwr.strategy.influence import (
    REVERSED_MIN_COSINE,
    REVERSED_PULL_SHARE,
    InfluenceBound,
    bound_expected_influence,
    bound_fresh_influence,
    bound_influence,
    bound_reversed_pull,
)
from mmfl_flwr.strategy.replies import client_replies
from mmfl_flwr.strategy.state import RoundPlan, RunState, TrainOutcome

#: What this module defines, and the bounds it re-exports from where they live.
__all__ = [
    "BOUND_OBSERVERS",
    "DIRECTION_AGREEMENT",
    "DIRECTION_FACTOR",
    "DIRECTION_HISTORY",
    "DIRECTION_LEAVE_ONE_OUT",
    "DIRECTION_MIN_CLIENTS",
    "DIRECTION_MIN_ROUNDS",
    "INFLUENCE_CLIP_FACTOR",
    "MEDIAN_BLOCK",
    "MIN_ROUND_NORMS",
    "NORM_HISTORY",
    "REVERSED_INFLUENCE_FACTOR",
    "COLLUSION_FACTOR",
    "COLLUSION_MIN_UPDATES",
    "check_collusion",
    "REVERSED_MIN_COSINE",
    "REVERSED_PULL_SHARE",
    "UPDATE_CLIP_FACTOR",
    "Limits",
    "InfluenceBound",
    "TrainOutcome",
    "apply_count_cap",
    "bound_expected_influence",
    "bound_fresh_influence",
    "bound_influence",
    "bound_reversed_pull",
    "bound_update_norms",
    "cap_train_losses",
    "check_directions",
    "collect_updates",
    "l2_norm",
    "loss_cap",
    "validate_train_part",
]


def validate_train_part(
    content: RecordDict,
    task: str,
    pick: Pick,
    info: ClientInfo,
    glob: NumpyWeights,
    keys: tuple[list[str], list[str]],
    data_share: float,
    limits: Limits,
    needs_control: bool,
) -> tuple[Update, float | None]:
    """Check one trained model of a reply against the global weights ``glob``.

    ``keys`` is the model's ``(trainable, state)`` split. Returns the update
    (``G = w_global - w_local`` over the trainable entries; the state entries
    as received) and the reported training loss (None if absent); raises
    :class:`~mmfl_flwr.records.InvalidReply` saying what is wrong.
    """
    train_keys, state_keys = keys
    if P.arrays_key(task) not in content.array_records:
        raise InvalidReply("no weights returned")
    local = check_weights(content[P.arrays_key(task)], glob)
    if limits.max_update_norm is not None:
        norm = l2_norm(glob[k].astype(np.float64) - local[k] for k in train_keys)
        if not norm <= limits.max_update_norm:
            raise InvalidReply(
                f"update norm {norm:.4g} exceeds max_update_norm {limits.max_update_norm:g}"
            )
    metrics = content.metric_records.get(P.metrics_key(task))
    if metrics is None:
        raise InvalidReply(f"no '{P.metrics_key(task)}' MetricRecord")
    n = check_count(metrics.get(P.NUM_EXAMPLES), P.NUM_EXAMPLES, MAX_NUM_EXAMPLES)
    if n > info.declared.get(task, n):
        raise InvalidReply(
            f"num-examples {n} exceeds the {info.declared[task]} it registered for this task"
        )
    control = None
    if needs_control:
        if P.control_key(task) not in content.array_records:
            raise InvalidReply("no SCAFFOLD control variate returned")
        c = check_weights(content[P.control_key(task)], {k: glob[k] for k in train_keys})
        control = [c[k] for k in train_keys]
    tl = metrics.get(P.TRAIN_LOSS)
    train_loss = None if tl is None else check_loss(tl, P.TRAIN_LOSS, limits.max_loss)
    update = Update(
        cid=info.cid,
        delta=[glob[k].astype(np.float64) - local[k] for k in train_keys],
        num_examples=info.num_examples[task],
        data_share=data_share,
        processors=info.processors,
        prob=pick.prob,
        count=pick.count,
        control=control,
        state=[local[k] for k in state_keys],
    )
    return update, train_loss


def collect_updates(
    run_state: RunState,
    plan: RoundPlan,
    replies: Iterable[Message],
    shares: dict[str, dict[str, float]],
    limits: Limits,
    needs_control: bool,
) -> TrainOutcome:
    """Validate every (client, task) part of every reply on its own; each
    rejection is logged with the client id and the rest becomes updates."""
    expected = plan.expected()
    out = TrainOutcome(
        updates={t: [] for t in plan.tasks},
        train_losses={t: [] for t in plan.tasks},
        rejected={t: 0 for t in plan.tasks},
    )
    split = {t: run_state.split_keys(t) for t in plan.tasks}
    answered: set[str] = set()
    events = run_state.defence

    def failed(cid: str, reply: Message) -> None:
        answered.add(cid)
        log(
            WARNING,
            "Client %s failed to train %s (error %s: %s); its updates are missing "
            "from the aggregate",
            cid,
            sorted(expected[cid]),
            reply.error.code,
            reply.error.reason,
        )
        for t in expected[cid]:
            events.record(
                "missing",
                cid,
                t,
                f"failed to train (error {reply.error.code}: {reply.error.reason})",
            )
            out.reject(cid, t)

    for cid, reply in client_replies(
        run_state.node_to_cid,
        replies,
        "train",
        expected,
        failed,
        plan.server_round,
        lacking=run_state.lacking,
        shards=run_state.shards,
        shard_asked=set(expected),
    ):
        answered.add(cid)
        _ignore_unassigned(events, cid, reply.content, expected[cid], needs_control)
        info = run_state.table[cid]
        for task, pick in expected[cid].items():
            part = _Part(cid, task, pick, info, split[task], shares[task].get(cid, 0.0))
            _validate_part(run_state, out, reply.content, part, limits, needs_control)
    for cid, asked in expected.items():
        if cid not in answered:
            log(
                WARNING,
                "Client %s sent no train reply this round (tasks %s); its updates "
                "are missing from the aggregate",
                cid,
                sorted(asked),
            )
            for t in asked:
                events.record("missing", cid, t, "sent no train reply this round")
                out.reject(cid, t)
    return out


def _ignore_unassigned(
    events: DefenceLog,
    cid: str,
    content: RecordDict,
    asked: Mapping[str, Pick],
    needs_control: bool,
) -> None:
    """Record (and log) every array record of a reply for a task not assigned to ``cid``."""
    for key in content.array_records:
        task = P.task_of(key, P.ARRAYS_PREFIX)
        if task is None and needs_control:
            task = P.task_of(key, P.CONTROL_PREFIX)
        if task not in asked:
            events.act(
                "ignored",
                cid,
                task or key,
                math.nan,
                math.nan,
                "Client %s: rejected arrays under %r (task not assigned to it this round)",
                cid,
                key,
                level=WARNING,
            )


@dataclass(frozen=True)
class _Part:
    """One assigned (client, task) part of a round: the pick, the client's
    registration, the model's ``(trainable, state)`` keys and the client's data share."""

    cid: str
    task: str
    pick: Pick
    info: ClientInfo
    keys: tuple[list[str], list[str]]
    data_share: float


def _validate_part(
    run_state: RunState,
    out: TrainOutcome,
    content: RecordDict,
    part: _Part,
    limits: Limits,
    needs_control: bool,
) -> None:
    """Validate one part of a reply: its update (and training loss) joins ``out``,
    or it is rejected, logged with the client id."""
    cid, task = part.cid, part.task
    run_state.defence.receive(cid, task)
    try:
        update, train_loss = validate_train_part(
            content,
            task,
            part.pick,
            part.info,
            run_state.weights[task],
            part.keys,
            part.data_share,
            limits,
            needs_control,
        )
    except InvalidReply as err:
        run_state.defence.act(
            "rejected",
            cid,
            task,
            math.nan,
            math.nan,
            "Client %s: rejected update for task %r: %s",
            cid,
            task,
            err,
            level=WARNING,
        )
        out.reject(cid, task)
        return
    out.updates[task].append(update)
    if train_loss is not None:
        out.train_losses[task].append((train_loss, update.num_examples, cid))
        out.observed[(cid, task)] = train_loss
