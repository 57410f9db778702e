"""Phase 2 of a round (policies that need it): every client's loss on each
model it holds, from a forward pass (``query.losses``); absurd losses are
capped (:func:`~mmfl_flwr.strategy.validation.loss_cap`: a multiple of the
task's reference loss, the largest 90th percentile reported so far) so one
client cannot steer the sampling."""

from __future__ import annotations

from logging import WARNING

from flwr.common.logger import log
from flwr.serverapp import Grid

from mmfl_flwr import protocol as P
from mmfl_flwr.records import InvalidReply, check_loss
from mmfl_flwr.strategy.replies import client_replies
from mmfl_flwr.strategy.state import RunState
from mmfl_flwr.strategy.timing import round_trip
from mmfl_flwr.strategy.validation import Limits, loss_cap


def query_losses(
    run_state: RunState,
    grid: Grid,
    server_round: int,
    timeout: float,
    limits: Limits,
    only: set[str] | None = None,
) -> int:
    """Ask every online client (or the ones in ``only``) for its loss on each of
    its active tasks and store the accepted ones in the client table.

    Returns the number of accepted (client, task) losses.
    """
    active = set(run_state.tasks)
    msgs = []
    for cid in run_state.table.ids():
        if only is not None and cid not in only:
            continue
        tasks, content = run_state.models_for(cid, active)
        if tasks:
            msgs.append(run_state.message(cid, content, P.QUERY_LOSSES, server_round))
    accepted = 0
    received: dict[str, list[tuple[str, float]]] = {}
    for cid, reply in client_replies(
        run_state.node_to_cid, round_trip(grid, msgs, timeout, server_round), "loss",
        server_round=server_round, lacking=run_state.lacking,
    ):
        losses = reply.content.metric_records.get(P.LOSSES_KEY)
        if losses is None:
            log(WARNING, "Client %s: loss reply has no '%s' record; ignored", cid, P.LOSSES_KEY)
            continue
        for task, value in losses.items():
            if task not in run_state.table[cid].num_examples:
                log(WARNING, "Client %s reported a loss for task %r it was not asked "
                    "about; ignored", cid, task)
                continue
            try:
                loss = check_loss(value, f"loss of task {task!r}", limits.max_loss)
            except InvalidReply as err:
                log(WARNING, "Client %s: rejected loss: %s", cid, err)
                continue
            received.setdefault(task, []).append((cid, loss))
            accepted += 1
    for task, pairs in received.items():
        cap = loss_cap(run_state, task, [v for _, v in pairs], limits.loss_cap)
        for cid, loss in pairs:
            if loss > cap:
                log(WARNING, "Client %s: loss %.4g on task %r capped at %.4g "
                    "(%g x the reference loss)", cid, loss, task, cap, limits.loss_cap)
                loss = cap
            run_state.table.set_loss(cid, task, loss, server_round)
    return accepted
