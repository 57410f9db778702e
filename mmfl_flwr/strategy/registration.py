"""Phase 1 of a round: which nodes are online, and who they are.

New nodes get a ``query.info`` message and answer with their stable client id,
eligible tasks with sample counts, processors and trainable keys per model. All
per-client state is keyed on the stable id (Flower's node ids change every run,
and every time a SuperNode restarts without SuperNode authentication).

Who a node is (the ids it claims, the pins that prove them) is decided in
:mod:`.identity`, whose names are importable from here too.
"""

from __future__ import annotations

import re
import time
from logging import INFO, WARNING

from flwr.app import RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from mmfl_flwr import protocol as P
from mmfl_flwr.strategy.identity import (
    ANY_ID,
    CLIENT_TOKEN,
    FIRST_USE,
    KEY_PIN,
    TOKEN_PIN,
    check_pins,
    evict_unproven,
    forget_shard,
    id_range,
    key_pin,
    note_trainable,
    public_keys,
    register,
    token_pin,
)
from mmfl_flwr.strategy.state import RunState, instruction
from mmfl_flwr.strategy.timing import round_trip

#: What this module defines, and the identity names it re-exports from :mod:`.identity`.
__all__ = [
    "ANY_ID",
    "CLIENT_TOKEN",
    "FIRST_USE",
    "KEY_PIN",
    "TOKEN_PIN",
    "NoClientCanServe",
    "NoClientRegistered",
    "check_pins",
    "evict_unproven",
    "key_pin",
    "leave_out_lacking",
    "note_trainable",
    "refresh_clients",
    "register",
    "stop_unless_a_client_can_serve",
    "token_pin",
    "wait_for_clients",
    "wait_for_nodes",
    "warn_unheld_models",
]


def wait_for_nodes(
    run_state: RunState, grid: Grid, min_nodes: int, wait_timeout: float
) -> list[int]:
    """The online node ids. Before the first round, wait (at most
    ``wait_timeout`` seconds) for ``min_nodes``; afterwards a round goes ahead
    with whoever is online (late nodes join when they come)."""
    if run_state.waited:
        return sorted(grid.get_node_ids())
    run_state.waited = True
    deadline = time.monotonic() + wait_timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= min_nodes or time.monotonic() >= deadline:
            if len(nodes) < min_nodes:
                log(
                    WARNING,
                    "Only %d of the %d requested nodes are online after %.0f s; "
                    "continuing with them",
                    len(nodes),
                    min_nodes,
                    wait_timeout,
                )
            return nodes
        time.sleep(1.0)


def _register_new(
    run_state: RunState,
    grid: Grid,
    nodes: list[int],
    server_round: int,
    timeout: float,
    asked: set[int] | None = None,
    errors: list[str] | None = None,
) -> int:
    """Ask the nodes not registered yet for their clients (``query.info``);
    returns how many clients the nodes that answered declared (registered or
    refused; a node that answered with an error counts one). Nodes in ``asked``
    are not asked again; the ones asked now are added to it. With ``errors`` (a
    list, during the first round's wait) error replies are collected there
    instead of stopping the run when no client has registered yet."""
    # a multi-client node with refused clients is asked again, as a refused
    # single-client node is: its clients may register once the holder is gone
    new = [
        n
        for n in nodes
        if n not in run_state.node_to_cid
        and (n not in run_state.shards or _free_refused(run_state, n))
        and (asked is None or n not in asked)
    ]
    if asked is not None:
        asked.update(new)
    if not new:
        return 0
    keys = (
        public_keys(grid)
        if any(p.startswith(KEY_PIN) for p in run_state.client_pins.values())
        else {}
    )
    msgs = [instruction(n, RecordDict(), P.QUERY_INFO, server_round) for n in new]
    answered = set()
    failed: list[str] = []
    declared = 0
    for reply in round_trip(grid, msgs, timeout, server_round):
        answered.add(reply.metadata.src_node_id)
        if reply.has_error():
            failed.append(str(reply.error.reason))
        else:
            declared += max(
                1,
                sum(
                    1
                    for k in reply.content.config_records
                    if P.split_client_key(k)[0] == P.INFO_KEY
                    and P.split_client_key(k)[1] is not None
                ),
            )
        register(run_state, reply, keys)
    if errors is not None:
        errors.extend(failed)
    elif failed and len(failed) == len(answered) and not run_state.table.ids():
        raise NoClientRegistered(_no_client_message(len(failed), failed[0]))
    for n in new:
        if n not in answered:
            log(
                WARNING,
                "Node %d did not answer the info query within %g s; it is asked again next round",
                n,
                timeout,
            )
    return declared + len(failed)


def _free_refused(run_state: RunState, node: int) -> bool:
    """Whether a registered multi-client node has a refused client whose id no other
    node holds now (its holder left, or it was refused for another reason): asked
    again then, as a refused single-client node is; ids another live node holds are
    not asked for every round (overlapping shards would repeat every refusal)."""
    refused = run_state.shard_refused.get(node)
    if not refused:
        return False
    held = set(run_state.node_to_cid.values()) | {
        c for c, n in run_state.shard_of.items() if n != node
    }
    return any(cid not in held for cid in refused)


def _hosted(run_state: RunState) -> int:
    """Clients registered on the nodes known in this run (not those a resumed
    run's checkpoint remembers)."""
    return len(run_state.node_to_cid) + sum(len(c) for c in run_state.shards.values())


def wait_for_clients(
    run_state: RunState,
    grid: Grid,
    min_clients: int,
    deadline: float,
    server_round: int,
    timeout: float,
) -> set[int]:
    """Before the first round, register nodes as they come until their nodes
    have declared ``min_clients`` clients (a node may host many:
    docs/protocol.md; a refused client counts, it answered), at most until
    ``deadline`` (``time.monotonic()``). Returns the nodes it asked (each once).
    When no client registered and every node that answered failed, the run
    stops with :class:`NoClientRegistered` (after the wait, not at the first
    failing node)."""
    declared = 0
    asked: set[int] = set()
    errors: list[str] = []
    while True:
        declared += _register_new(
            run_state, grid, sorted(grid.get_node_ids()), server_round, timeout, asked, errors
        )
        have = _hosted(run_state)
        if max(have, declared) >= min_clients:
            break
        if time.monotonic() >= deadline:
            log(
                WARNING,
                "Only %d of the %d requested clients registered after the wait; "
                "continuing with them",
                have,
                min_clients,
            )
            break
        time.sleep(1.0)
    if errors and not run_state.table.ids(online_only=False):
        raise NoClientRegistered(_no_client_message(len(errors), errors[0]))
    return asked


def refresh_clients(
    run_state: RunState,
    grid: Grid,
    server_round: int,
    timeout: float,
    min_nodes: int,
    wait_timeout: float,
    min_clients: int = 0,
) -> None:
    """Register new nodes and mark which clients are online. Before the first
    round, wait for ``min_nodes`` nodes and ``min_clients`` registered clients
    (at most ``wait_timeout`` seconds)."""
    run_state.client_pins = check_pins(run_state.client_pins)
    first = not run_state.waited
    deadline = time.monotonic() + wait_timeout  # one wait for nodes and clients
    nodes = wait_for_nodes(run_state, grid, min_nodes, wait_timeout)
    asked: set[int] = set()
    if first and min_clients > 0:
        asked = wait_for_clients(run_state, grid, min_clients, deadline, server_round, timeout)
        nodes = sorted(grid.get_node_ids())
    # Forget nodes that are gone: a client that reconnects comes back with a
    # new node id and registers again under its stable id.
    present = set(nodes)
    for nid in list(run_state.node_to_cid):
        if nid not in present:
            gone = run_state.node_to_cid.pop(nid)
            log(INFO, "Client %s (node %d) went offline; left out until it reconnects", gone, nid)
    for nid in list(run_state.shard_refused):
        if nid not in present:
            del run_state.shard_refused[nid]
    for nid in list(run_state.shards):
        if nid not in present:
            gone_ids = run_state.shards.pop(nid)
            forget_shard(run_state, nid, gone_ids)
            log(
                INFO,
                "Node %d went offline with its %d clients (%s); left out until it reconnects",
                nid,
                len(gone_ids),
                id_range(gone_ids),
            )
    evict_unproven(run_state)
    _register_new(run_state, grid, nodes, server_round, timeout, asked)
    stop_unless_a_client_can_serve(run_state)
    hosted = {
        cid: n for n in nodes if n in run_state.node_to_cid for cid in (run_state.node_to_cid[n],)
    }
    hosted.update({cid: n for n in nodes for cid in run_state.shards.get(n, ())})
    online = {
        cid
        for cid in hosted
        if run_state.client_arrivals.get(cid, 0) <= server_round and cid not in run_state.lacking
    }
    run_state.cid_to_node = {cid: nid for cid, nid in hosted.items() if cid in online}
    run_state.table.set_online(online)


def stop_unless_a_client_can_serve(run_state: RunState) -> None:
    """Raise :class:`NoClientCanServe` when every registered client's ClientApp
    lacks a handler the strategy sends messages to (declared at registration,
    or found by a round trip's error replies)."""
    registered = set(run_state.table.ids(online_only=False))
    if run_state.lacking and registered and registered <= set(run_state.lacking):
        raise NoClientCanServe(_cannot_serve_message(run_state.lacking))


def leave_out_lacking(run_state: RunState) -> None:
    """After a round trip: stop the run when no client can serve it
    (:func:`stop_unless_a_client_can_serve`), else take the clients found
    lacking a handler offline at once, so the rest of the round (its
    assignment, its train messages) leaves them out."""
    stop_unless_a_client_can_serve(run_state)
    if not run_state.lacking:
        return
    online = [c for c in run_state.table.ids() if c not in run_state.lacking]
    run_state.table.set_online(online)
    run_state.cid_to_node = {
        c: n for c, n in run_state.cid_to_node.items() if c not in run_state.lacking
    }


class NoClientRegistered(RuntimeError):
    """Every node answered the registration query with an error and no client
    has ever registered: the nodes run a ClientApp that does not serve the
    MMFL message protocol (``docs/protocol.md``)."""


class NoClientCanServe(NoClientRegistered):
    """Every registered client's ClientApp lacks a handler the strategy sends
    messages to (``query.losses``, ``train`` or ``evaluate``): the run cannot
    go on."""


def _cannot_serve_message(lacking: dict[str, str]) -> str:
    handlers = sorted(set(lacking.values()))
    example = ", ".join(f"client {c}: '{h}'" for c, h in sorted(lacking.items())[:3])
    return (
        f"No client can serve this run: the ClientApp of every registered client "
        f"({len(lacking)}) has no handler for {' / '.join(repr(h) for h in handlers)} "
        f"messages, which the strategy sends ({example}{', ...' if len(lacking) > 3 else ''}). "
        "MultiModelStrategy needs ClientApps that answer query.info, query.losses, "
        "train and evaluate as docs/protocol.md describes; build one with "
        "mmfl_flwr.make_client_app."
    )


def warn_unheld_models(run_state: RunState, warned: set[str]) -> None:
    """One warning per active model that no registered client holds (a model name
    with a typo trains nothing otherwise silently), naming the models the clients
    do hold; ``warned`` keeps the ones already named."""
    if not run_state.table.ids(online_only=False):
        return
    held = {t for c in run_state.table.clients(online_only=False) for t in c.num_examples}
    for task in run_state.tasks:
        if task not in held and task not in warned:
            warned.add(task)
            log(
                WARNING,
                "Model %r: no registered client holds it, so no client can train "
                "it (the clients hold %s); check the model names of the strategy and the "
                "ClientApp",
                task,
                ", ".join(repr(t) for t in sorted(held)) or "no model",
            )


def _no_client_message(nodes: int, reason: str) -> str:
    missing = re.search(r"No (\w+) function registered with name '(\w+)'", reason)
    what = (
        f'their ClientApp has no @app.{missing.group(1)}("{missing.group(2)}") handler'
        if missing
        else f"the first error was: {reason.strip().splitlines()[-1][:300]}"
    )
    return (
        f"No client registered: all {nodes} node(s) answered the '{P.QUERY_INFO}' "
        f"registration message with an error ({what}). MultiModelStrategy needs "
        "ClientApps that answer query.info, query.losses, train and evaluate as "
        "docs/protocol.md describes; build one with mmfl_flwr.make_client_app."
    )
