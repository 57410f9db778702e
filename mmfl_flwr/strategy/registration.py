"""Phase 1 of a round: which nodes are online, and who they are.

New nodes get a ``query.info`` message and answer with their stable client id,
eligible tasks with sample counts, processors and trainable keys per model. All
per-client state is keyed on the stable id (Flower's node ids change every run).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from mmfl_flwr import protocol as P
from mmfl_flwr.core.clients import ClientInfo, InvalidClientInfo, validate_client_info
from mmfl_flwr.strategy.run import RunState, instruction


def wait_for_nodes(run: RunState, grid: Grid, min_nodes: int, wait_timeout: float) -> list[int]:
    """The online node ids. Before the first round, wait (at most
    ``wait_timeout`` seconds) for ``min_nodes``; afterwards a round goes ahead
    with whoever is online (late nodes join when they come)."""
    if run.waited:
        return sorted(grid.get_node_ids())
    run.waited = True
    deadline = time.monotonic() + wait_timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= min_nodes or time.monotonic() >= deadline:
            if len(nodes) < min_nodes:
                log(WARNING, "Only %d of the %d requested nodes are online after %.0f s; "
                    "continuing with them", len(nodes), min_nodes, wait_timeout)
            return nodes
        time.sleep(1.0)


def refresh_clients(
    run: RunState,
    grid: Grid,
    server_round: int,
    timeout: float,
    min_nodes: int,
    wait_timeout: float,
) -> None:
    """Register new nodes and mark which clients are online."""
    nodes = wait_for_nodes(run, grid, min_nodes, wait_timeout)
    # Forget nodes that are gone: a client that reconnects comes back with a
    # new node id and registers again under its stable id.
    for nid in list(run.node_to_cid):
        if nid not in nodes:
            gone = run.node_to_cid.pop(nid)
            log(INFO, "Client %s (node %d) went offline; left out until it reconnects",
                gone, nid)
    new = [n for n in nodes if n not in run.node_to_cid]
    if new:
        msgs = [instruction(n, RecordDict(), P.QUERY_INFO, server_round) for n in new]
        answered = set()
        for reply in grid.send_and_receive(msgs, timeout=timeout):
            answered.add(reply.metadata.src_node_id)
            register(run, reply)
        for n in new:
            if n not in answered:
                log(WARNING, "Node %d did not answer the info query within %g s; it is "
                    "asked again next round", n, timeout)
    online = {
        run.node_to_cid[n]
        for n in nodes
        if n in run.node_to_cid and run.client_arrivals.get(run.node_to_cid[n], 0) <= server_round
    }
    run.cid_to_node = {cid: nid for nid, cid in run.node_to_cid.items() if cid in online}
    run.table.set_online(online)


def register(run: RunState, reply: Message) -> None:
    """Register the client that answered a ``query.info`` (or log why not)."""
    node = reply.metadata.src_node_id
    if reply.has_error():
        log(WARNING, "Node %d could not describe itself (error %s: %s); "
            "it is left out this round", node, reply.error.code, reply.error.reason)
        return
    try:
        info = reply.content.config_records[P.INFO_KEY]
        cid, usable, unknown, procs = _describe(info, run.all_tasks)
    except (KeyError, TypeError, ValueError) as err:
        log(WARNING, "Node %d sent an invalid self-description, left out: %s", node, err)
        return
    if unknown:
        log(WARNING, "Client %s declared unknown tasks %s; ignoring them", cid, unknown)
    # Nodes that went away were already forgotten, so another live node with
    # this id is a duplicate claim: keep the first one.
    other = next((n for n, c in run.node_to_cid.items() if c == cid and n != node), None)
    if other is not None:
        log(WARNING, "Client id %s is claimed by nodes %d and %d; keeping %d",
            cid, other, node, other)
        return
    note_trainable(run, cid, info, usable)
    log(INFO, "Client %s %s as node %d (tasks %s)", cid,
        "re-registered" if cid in run.table else "registered", node, sorted(usable))
    run.node_to_cid[node] = cid
    run.table.upsert(ClientInfo(cid=cid, num_examples=usable, processors=procs))


def _describe(info: ConfigRecord, known: list[str]) -> tuple[str, dict[str, int], list[str], int]:
    """``(client id, usable task -> count, unknown tasks, processors)`` of an info
    record; raises KeyError, TypeError or ValueError on a malformed one."""
    cid = str(info[P.CLIENT_ID])
    tasks = list(info[P.TASKS])  # type: ignore[arg-type]
    counts = list(info[P.NUM_EXAMPLES])  # type: ignore[arg-type]
    procs = info.get(P.PROCESSORS, 1)
    if len(tasks) != len(counts):
        raise InvalidClientInfo(f"{len(tasks)} tasks but {len(counts)} sample counts")
    if len(set(tasks)) != len(tasks):
        raise InvalidClientInfo(f"duplicated tasks in {tasks}")
    usable, unknown = validate_client_info(
        cid, dict(zip(tasks, counts)), procs, known  # type: ignore[arg-type]
    )
    return cid, usable, unknown, int(procs)  # type: ignore[arg-type]


def note_trainable(run: RunState, cid: str, info: ConfigRecord, tasks: Iterable[str]) -> None:
    """Take a client's ``trainable.<task>`` declarations: the first valid one of a
    task sets its trainable keys (unless pinned); a different one is logged and
    ignored."""
    for task in tasks:
        raw = info.get(P.trainable_key(task))
        if raw is None:
            continue
        keys = [str(k) for k in raw] if isinstance(raw, list) else []
        problem = run.trainable_problem(task, keys)
        if problem:
            log(WARNING, "Client %s declared invalid trainable keys for %r (%s); ignored",
                cid, task, problem)
            continue
        known = run.trainable.get(task)
        if known is None:
            run.trainable[task] = keys
            train, state = run.split_keys(task)
            log(INFO, "Task %r: %d trainable entries, %d state entries (averaged, not part "
                "of the update), as declared by client %s", task, len(train), len(state), cid)
        elif set(known) != set(keys):
            log(WARNING, "Client %s declared other trainable keys for %r than those in "
                "force; ignored", cid, task)
