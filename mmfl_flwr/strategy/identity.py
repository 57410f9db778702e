"""Who a node is: the client ids it claims in its ``query.info`` reply, and the
pins that prove them (:func:`register`, :func:`check_pins`).

Client identity
---------------
A client names itself (``client-id`` in its info reply); the node id is only
the address it is reached at. The rule:

1. The first node to claim an id holds it while it stays online. Another live
   node claiming it is refused (logged with the client id and both node ids)
   and asked again each round, so it gets the id once the holder has gone
   offline (e.g. a restarted client whose old node id has not yet timed out).
2. A node that goes offline releases its id at the start of the next round.
3. Without a pin that is all the server can check: whoever claims an offline
   client's id first ("squats" it) keeps it while it stays online, and the
   real client is refused meanwhile. Only a pin prevents it.
4. ``RunState.client_pins`` maps a client id to the credential its claims must
   carry (:func:`check_pins` lists the forms; :func:`token_pin` and
   :func:`key_pin` make them):

   - ``token:<sha256 hex>``: the SHA-256 of the secret the ClientApp sends as
     ``client-token`` in its info reply (node config ``client-token``). Works
     with any SuperLink; the secret travels in the reply, so use TLS;
   - ``key:<sha256 hex>``: the fingerprint of the SuperNode's public key as the
     SuperLink reports it (``Grid.get_nodes()`` -> ``NodeInfo.public_key``).
     Only meaningful with ``flower-superlink --enable-supernode-auth``: then
     the key is the one the operator registered and every Fleet request is
     signed with it; without it each SuperNode start makes a fresh key pair.

   - ``key:first-use`` (:data:`FIRST_USE`; as the pin of ``"*"``, for every id
     without a pin of its own): trust on first use. The first node to claim
     the id binds it to that node's public key (logged); from then on it is a
     ``key:`` pin, kept in checkpoints. Only meaningful with SuperNode
     authentication (else a restarted SuperNode has a new key and is refused).

   A claim of a pinned id without that credential is refused (logged with the
   client id and the node id). A pinned id is only ever held by a node that
   proved the pin in force: a holder that did not (the pin was set or changed
   during the run) is evicted at the start of the next round (logged). So the
   pinned client gets its id as soon as it is online, whoever claimed it
   first. Two nodes proving the same pin follow rule 1. Ids without a pin
   follow rules 1-3.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from typing import cast

from flwr.app import ConfigRecord, Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from mmfl_flwr import protocol as P
from mmfl_flwr.core.clients import ClientInfo, InvalidClientInfo, validate_client_info
from mmfl_flwr.strategy.state import RunState

#: Info-record key of the client's secret token.
CLIENT_TOKEN = P.CLIENT_TOKEN
TOKEN_PIN = "token:"
KEY_PIN = "key:"
#: Pin value: bind the id to the public key of the first node that claims it.
FIRST_USE = "key:first-use"
#: Pin key standing for every client id without a pin of its own.
ANY_ID = "*"
_HEX64 = re.compile(r"[0-9a-f]{64}")


# ------------------------------------------------------------------- pins
def token_pin(token: str) -> str:
    """The pin of a client whose node config holds ``client-token=<token>``."""
    return TOKEN_PIN + hashlib.sha256(str(token).encode("utf-8")).hexdigest()


def key_pin(public_key: bytes | str) -> str:
    """The pin of a SuperNode's public key: an SSH public key (the
    ``*.pub`` given to ``flwr supernode register``) or a PEM one."""
    fingerprint = _key_fingerprint(public_key)
    if fingerprint is None:
        raise ValueError("not an SSH or PEM public key")
    return KEY_PIN + fingerprint


def check_pins(pins: Mapping[str, str] | None) -> dict[str, str]:
    """Validate and normalise ``client id -> pin``.

    A pin is ``token:<sha256 hex>`` (a bare 64-digit hex string means the same),
    ``key:<sha256 hex>`` or ``key:first-use``. Raises ValueError on anything else."""
    out: dict[str, str] = {}
    for cid, pin in (pins or {}).items():
        text = str(pin).strip().lower()
        if text == FIRST_USE:
            out[str(cid)] = FIRST_USE
            continue
        kind, _, digest = text.rpartition(":")
        kind = kind + ":" if kind else TOKEN_PIN
        if kind not in (TOKEN_PIN, KEY_PIN) or not _HEX64.fullmatch(digest):
            raise ValueError(
                f"client_pins[{str(cid)!r}]: expected 'token:<sha256 hex>', "
                f"'key:<sha256 hex>' or '{FIRST_USE}', got {str(pin)[:80]!r}"
            )
        out[str(cid)] = kind + digest
    return out


def _key_fingerprint(raw: bytes | str | None) -> str | None:
    """SHA-256 hex of a public key in Flower's form (PEM SubjectPublicKeyInfo),
    or None when ``raw`` is not a public key (e.g. a simulated node's)."""
    if not raw:
        return None
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    data = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = serialization.load_ssh_public_key(data.strip())
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return None
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(pem).hexdigest()


def _pin_problem(pin: str, info: ConfigRecord, node_key: bytes | None) -> str | None:
    """Why a claim does not prove ``pin`` (None if it does)."""
    digest = pin.split(":", 1)[1]
    if pin.startswith(KEY_PIN):
        seen = _key_fingerprint(node_key)
        if seen is None:
            return "no authenticated node key (is SuperNode authentication on?)"
        return None if hmac.compare_digest(seen, digest) else "another node key than its pin"
    token = info.get(CLIENT_TOKEN)
    if not isinstance(token, str) or not token:
        return "no client-token"
    seen = token_pin(token).split(":", 1)[1]
    if hmac.compare_digest(seen, digest):
        return None
    return "a client-token that does not match its pin"


def public_keys(grid: Grid) -> dict[int, bytes]:
    """Node id -> public key, as the SuperLink reports them."""
    return {int(n.node_id): bytes(n.public_key) for n in grid.get_nodes()}


def evict_unproven(run_state: RunState) -> None:
    """Release every pinned id held by a node that did not prove its pin (the
    pin was set or changed after it registered); the node is asked again."""
    for nid, cid in list(run_state.node_to_cid.items()):
        pin = run_state.client_pins.get(cid)
        if pin is not None and run_state.verified_nodes.get(nid) != pin:
            del run_state.node_to_cid[nid]
            if cid in run_state.table:  # the holder's losses are not the pinned client's
                run_state.table[cid].losses.clear()
                run_state.table[cid].loss_round.clear()
            log(
                WARNING,
                "Client id %s is pinned, but node %d holds it without having "
                "proved the pin; evicted (it is asked again)",
                cid,
                nid,
            )
    run_state.verified_nodes = {
        n: p
        for n, p in run_state.verified_nodes.items()
        if run_state.node_to_cid.get(n) is not None
    }
    for nid, cids in list(run_state.shards.items()):
        kept = []
        for cid in cids:
            pin = run_state.client_pins.get(cid)
            if pin is not None and run_state.verified_shard_clients.get((nid, cid)) != pin:
                if cid in run_state.table:
                    run_state.table[cid].losses.clear()
                    run_state.table[cid].loss_round.clear()
                run_state.verified_shard_clients.pop((nid, cid), None)
                log(
                    WARNING,
                    "Client id %s is pinned, but node %d holds it without having "
                    "proved the pin; evicted (it is asked again)",
                    cid,
                    nid,
                )
            else:
                kept.append(cid)
        if len(kept) != len(cids):  # the node is asked again (all its clients)
            forget_shard(run_state, nid, run_state.shards.pop(nid))


def register(
    run_state: RunState, reply: Message, node_keys: Mapping[int, bytes] | None = None
) -> None:
    """Register the client (or, on a multi-client node, every client) that
    answered a ``query.info`` (or log why not); ``node_keys`` (node id ->
    public key) serves ``key:`` pins."""
    node = reply.metadata.src_node_id
    if reply.has_error():
        log(
            WARNING,
            "Node %d (client id unknown) could not describe itself (error %s: %s); "
            "it is left out this round",
            node,
            reply.error.code,
            reply.error.reason,
        )
        return
    records = reply.content.config_records
    shard: dict[str, ConfigRecord] = {}
    for key, rec in records.items():
        base, cid = P.split_client_key(key)
        if base == P.INFO_KEY and cid is not None:
            shard[cid] = rec
        elif key.startswith(P.INFO_KEY + P.CLIENT_SEP):
            log(
                WARNING,
                "Node %d: record %r is no client's info (client ids may not contain %r); ignored",
                node,
                key[:100],
                P.CLIENT_SEP,
            )
    if not shard:
        try:
            info = records[P.INFO_KEY]
        except KeyError:
            log(
                WARNING,
                "Node %d sent no 'info' record (nor 'info@<id>' records of a "
                "multi-client node): it declares no client; left out",
                node,
            )
            return
        if node in run_state.shards:  # a multi-client node that now declares one client
            forget_shard(run_state, node, run_state.shards.pop(node))
            run_state.shard_refused.pop(node, None)
        _register_client(run_state, node, info, node_keys, None, _claimed_id(reply))
        return
    holders = {c: n for n, c in run_state.node_to_cid.items()}
    holders.update(run_state.shard_of)
    bound_before: dict[str, set[str]] = {}  # node key pin -> ids bound before this reply
    for c, p in run_state.bound_at_first_use.items():
        bound_before.setdefault(p, set()).add(c)
    hosted: list[str] = []
    before = run_state.shards.get(node, [])
    logged = [0]
    for cid, info in shard.items():
        if str(info.get(P.CLIENT_ID, cid)) != cid:
            log(
                WARNING,
                "Node %d: record 'info@%s' claims client id %s; that client is left out",
                node,
                cid,
                str(info.get(P.CLIENT_ID))[:100],
            )
            continue
        if _register_client(
            run_state,
            node,
            info,
            node_keys,
            _Shard(len(hosted), holders, bound_before, logged),
            cid,
        ):
            hosted.append(cid)
    kept = set(hosted)  # membership in a set: a list would make this O(N^2) in clients
    refused = [cid for cid in shard if cid not in kept]
    if refused:
        run_state.shard_refused[node] = refused
    else:
        run_state.shard_refused.pop(node, None)
    if hosted:
        forget_shard(run_state, node, [c for c in before if c not in kept])
        run_state.shards[node] = hosted
        for cid in hosted:
            run_state.shard_of[cid] = node
        if hosted != before:
            log(INFO, "Node %d hosts %d clients (%s)", node, len(hosted), id_range(hosted))
    else:
        if node in run_state.shards:  # asked again, and now none registers
            forget_shard(run_state, node, run_state.shards.pop(node))
        log(
            WARNING,
            "Node %d declared %d clients and none could register; left out",
            node,
            len(shard),
        )


def forget_shard(run_state: RunState, node: int, cids: list[str]) -> None:
    """Drop the index entries of a multi-client node that is gone or asked again."""
    for cid in cids:
        if run_state.shard_of.get(cid) == node:
            del run_state.shard_of[cid]
        run_state.verified_shard_clients.pop((node, cid), None)


def id_range(ids: list[str]) -> str:
    """Client ids for a log line: all of up to six, else the first three and the last."""
    return ", ".join(ids) if len(ids) <= 6 else f"{', '.join(ids[:3])}, ..., {ids[-1]}"


@dataclass
class _Shard:
    """What registering one client of a multi-client node needs: how many of its
    clients registered so far, every registered id's node, and the ids each node
    key was bound to at first use before this reply."""

    registered: int
    holders: dict[str, int]
    bound_before: dict[str, set[str]]
    #: how many of this reply's newly hosted clients were logged one by one
    logged: list[int]


def _register_client(
    run_state: RunState,
    node: int,
    info: ConfigRecord,
    node_keys: Mapping[int, bytes] | None,
    shard: _Shard | None,
    claimed: str,
) -> bool:
    """Register one client of ``node`` from its info record; on a multi-client
    node (``shard``: the ids it registered so far and every registered id's
    node) the client is added to the node's list by the caller."""
    try:
        cid, usable, unknown, procs = _describe(info, run_state.all_tasks)
    except (KeyError, TypeError, ValueError) as err:
        log(
            WARNING,
            "Node %d (claiming client id %s) sent an invalid self-description, left out: %s",
            node,
            claimed,
            err,
        )
        return False
    if shard is not None and P.CLIENT_SEP in cid:
        log(
            WARNING,
            "Node %d: client id %r contains %r, which multi-client nodes use to "
            "address their clients; left out",
            node,
            cid[:100],
            P.CLIENT_SEP,
        )
        return False
    if unknown:
        log(WARNING, "Client %s declared unknown tasks %s; ignoring them", cid, unknown)
    proved, pin = _check_pin(run_state, node, cid, info, (node_keys or {}).get(node), shard)
    if not proved:
        return False
    # Nodes that went away were already forgotten, so another live node with
    # this id is a duplicate claim: keep the first one.
    if shard is None:
        other = next((n for n, c in run_state.node_to_cid.items() if c == cid and n != node), None)
        if other is None:
            other = run_state.shard_of.get(cid)
    else:
        other = shard.holders.get(cid)
    if other is not None and other != node:
        log(
            WARNING,
            "Client id %s is claimed by nodes %d and %d; keeping %d (the first "
            "to register; node %d is refused and asked again next round)",
            cid,
            other,
            node,
            other,
            node,
        )
        return False
    _note_handlers(run_state, cid, info)
    if cid not in run_state.lacking and run_state.trust_declared_trainable:
        note_trainable(run_state, cid, info, usable)
    # a shard's first few newly hosted clients, then one summary line (a shard asked
    # again for a refused client re-registers the others silently)
    if shard is None or (shard.holders.get(cid) != node and shard.logged[0] < 5):
        if shard is not None:
            shard.logged[0] += 1
        log(
            INFO,
            "Client %s %s as node %d (tasks %s%s)",
            cid,
            "re-registered" if cid in run_state.table else "registered",
            node,
            sorted(usable),
            "" if pin is None else f"; identity proved by its {pin.split(':')[0]}",
        )
    if shard is None:
        run_state.node_to_cid[node] = cid
        if pin is not None:
            run_state.verified_nodes[node] = pin
    else:
        shard.holders[cid] = node
        if pin is not None:
            run_state.verified_shard_clients[(node, cid)] = pin
    run_state.table.upsert(ClientInfo(cid=cid, num_examples=usable, processors=procs))
    return True


def _check_pin(
    run_state: RunState,
    node: int,
    cid: str,
    info: ConfigRecord,
    node_key: bytes | None,
    shard: _Shard | None,
) -> tuple[bool, str | None]:
    """Whether ``node``'s claim of ``cid`` proves the pin in force (a first-use pin
    is bound to the node's key here), and that pin (None: the id has none)."""
    pin = run_state.client_pins.get(cid, run_state.client_pins.get(ANY_ID))
    if pin == FIRST_USE:
        seen = _key_fingerprint(node_key)
        if seen is None:
            log(
                WARNING,
                "Node %d claims client id %s with no authenticated node key (is "
                "SuperNode authentication on?); refused (the id is bound at first use)",
                node,
                cid,
            )
            return False, pin
        # the ids this key was bound to before (a shard's reply may bind many at once;
        # a single-client node's key holds the one id it claimed first)
        bound = (
            shard.bound_before.get(KEY_PIN + seen, set())
            if shard is not None
            else {c for c, p in run_state.bound_at_first_use.items() if p == KEY_PIN + seen}
        )
        if bound and cid not in bound:
            log(
                WARNING,
                "Node %d claims client id %s, but its node key was bound at first use "
                "to the ids %s only; refused",
                node,
                cid,
                id_range(sorted(bound)),
            )
            return False, pin
        pin = run_state.client_pins[cid] = run_state.bound_at_first_use[cid] = KEY_PIN + seen
        log(INFO, "Client id %s is bound to the public key of node %d (first use)", cid, node)
    if pin is not None:
        problem = _pin_problem(pin, info, node_key)
        if problem is not None:
            log(
                WARNING,
                "Node %d claims client id %s with %s; refused (the id is pinned)",
                node,
                cid,
                problem,
            )
            return False, pin
    return True, pin


def _note_handlers(run_state: RunState, cid: str, info: ConfigRecord) -> None:
    """Leave ``cid`` out of the run (logged once) when its declared handlers lack
    one the strategy sends, or take it back in when they no longer do."""
    declared = info.get(P.HANDLERS)
    if isinstance(declared, list) and run_state.needed_handlers:
        missing = [h for h in run_state.needed_handlers if h not in declared]
        if missing:
            if cid not in run_state.lacking:
                log(
                    ERROR,
                    "Client %s: its ClientApp declares no handler for '%s' messages, "
                    "which this strategy sends (docs/protocol.md); the client is left out "
                    "of the run",
                    cid,
                    missing[0],
                )
            run_state.lacking[cid] = missing[0]
        else:
            run_state.lacking.pop(cid, None)


def _claimed_id(reply: Message) -> str:
    """The client id a malformed info reply claims, for the log ("?" if none)."""
    try:
        return str(reply.content.config_records[P.INFO_KEY][P.CLIENT_ID])[:100]
    except (KeyError, TypeError, ValueError):
        return "?"


def _describe(info: ConfigRecord, known: list[str]) -> tuple[str, dict[str, int], list[str], int]:
    """``(client id, usable task -> count, unknown tasks, processors)`` of an info
    record; raises KeyError, TypeError or ValueError on a malformed one."""
    cid = str(info[P.CLIENT_ID])
    # a malformed record raises TypeError/ValueError here or below (the caller's contract)
    tasks = list(cast(list[str], info[P.TASKS]))
    counts = list(cast(list[int], info[P.NUM_EXAMPLES]))
    procs = cast(int, info.get(P.PROCESSORS, 1))
    if len(tasks) != len(counts):
        raise InvalidClientInfo(f"{len(tasks)} tasks but {len(counts)} sample counts")
    if len(set(tasks)) != len(tasks):
        raise InvalidClientInfo(f"duplicated tasks in {tasks}")
    usable, unknown = validate_client_info(cid, dict(zip(tasks, counts)), procs, known)
    return cid, usable, unknown, int(procs)


def note_trainable(run_state: RunState, cid: str, info: ConfigRecord, tasks: Iterable[str]) -> None:
    """Take a client's ``trainable.<task>`` declarations: the first valid one of a
    task sets its trainable keys (unless pinned); a different one is logged and
    ignored."""
    for task in tasks:
        raw = info.get(P.trainable_key(task))
        if raw is None:
            continue
        keys = [str(k) for k in raw] if isinstance(raw, list) else []
        problem = run_state.trainable_problem(task, keys)
        if problem:
            log(
                WARNING,
                "Client %s declared invalid trainable keys for %r (%s); ignored",
                cid,
                task,
                problem,
            )
            continue
        known = run_state.trainable.get(task)
        if known is None:
            run_state.trainable[task] = keys
            train, state = run_state.split_keys(task)
            log(
                INFO,
                "Task %r: %d trainable entries, %d state entries (averaged, not part "
                "of the update), as declared by client %s",
                task,
                len(train),
                len(state),
                cid,
            )
        elif set(known) != set(keys):
            log(
                WARNING,
                "Client %s declared other trainable keys for %r than those in force; ignored",
                cid,
                task,
            )
