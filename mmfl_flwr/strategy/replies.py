"""The one preamble every reply goes through: node -> client, unexpected
senders, duplicates and error replies, each logged with the client id."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from logging import ERROR, WARNING
from typing import Any

from flwr.app import Message, RecordDict
from flwr.common.logger import log

from mmfl_flwr import protocol as P

_NO_HANDLER = re.compile(r"No (\w+) function registered with name '(\w+)'")


def missing_handler(reason: str) -> str | None:
    """The message type (``query.losses``) an error reply says its ClientApp has
    no handler for (Flower's ClientApp words it so), else None."""
    found = _NO_HANDLER.search(reason)
    if not found:
        return None
    category, action = found.groups()
    return category if action == "default" else f"{category}.{action}"


@dataclass
class ClientPart:
    """One client's part of a multi-client node's reply, read like a reply of its
    own: ``content`` holds its records under their plain keys (``arrays.a``
    for ``arrays.a@7``), ``metadata`` is the node reply's, and ``error`` the
    client's ``error@<id>`` record (code, reason) or the node's error."""

    content: RecordDict
    metadata: Any
    error: Any = None

    def has_error(self) -> bool:
        return self.error is not None


def split_reply(reply: Message) -> dict[str, ClientPart]:
    """Client id -> its part of a multi-client node's reply (an error reply of
    the whole node is not split: see :func:`client_replies`)."""
    from flwr.app import Error

    records: dict[str, RecordDict] = {}
    for key, record in reply.content.items():
        base, cid = P.split_client_key(key)
        if cid is None:
            continue
        records.setdefault(cid, RecordDict())[base] = record
    parts = {}
    for cid, content in records.items():
        err = content.config_records.get(P.ERROR_KEY)
        error = None
        if err is not None:  # read defensively: a node's words, not ours
            code = err.get("code", 0)
            error = Error(
                code=code if isinstance(code, int) and not isinstance(code, bool) else 0,
                reason=str(err.get("reason", ""))[:2000],
            )
        parts[cid] = ClientPart(content, reply.metadata, error)
    return parts


def _per_client(
    replies: Iterable[Message],
    node_to_cid: Mapping[int, str],
    shards: Mapping[int, Sequence[str]],
    asked: Collection[str] | None,
    shard_asked: set[str] | None = None,
) -> Iterator[tuple[int, str | None, Any]]:
    """``(node, client id or None, reply or part)``: a single-client node's reply
    as it is, a multi-client node's split into its clients' parts (a node
    error becomes an error part of each client asked on it; a part of a
    client the node does not host is reported with its id, for the log)."""
    for reply in replies:
        node = reply.metadata.src_node_id
        hosted = shards.get(node)
        if hosted is None:
            yield node, node_to_cid.get(node), reply
            continue
        mine = set(hosted)
        if shard_asked is not None:  # the clients this round trip addressed on it
            mine &= shard_asked
        if reply.has_error():
            for cid in hosted:
                if cid in mine and (asked is None or cid in asked):
                    yield node, cid, ClientPart(RecordDict(), reply.metadata, reply.error)
            continue
        for cid, part in split_reply(reply).items():
            yield node, (cid if cid in mine else None), part


def client_replies(
    node_to_cid: dict[int, str],
    replies: Iterable[Message],
    kind: str,
    asked: Collection[str] | None = None,
    on_error: Callable[[str, Message], None] | None = None,
    server_round: int | None = None,
    lacking: dict[str, str] | None = None,
    shards: Mapping[int, Sequence[str]] | None = None,
    shard_asked: set[str] | None = None,
) -> Iterator[tuple[str, Message]]:
    """Yield ``(client id, reply)`` for the usable replies of one round trip
    (with ``shards``, node -> its clients for multi-client nodes, each client's
    part of such a node's reply is yielded on its own, as a :class:`ClientPart`;
    with ``shard_asked``, only the parts of the clients the round trip addressed
    on such nodes).

    A reply from a node that is not a registered client (or, with ``asked``, not
    one of the clients asked) is ignored; with ``server_round``, a reply that
    answers another round (its group id) is ignored; a client's second reply is ignored;
    an error reply is logged (or handed to ``on_error``, which logs it) and
    not yielded; with ``lacking`` (the run's client id -> missing handler), an
    error reply that says the ClientApp has no handler for the message is one
    ERROR naming the handler, and the client is recorded there (left out of
    the run from then on). ``kind`` names the round trip in the log lines ("train",
    "loss", "evaluation").
    """
    seen: set[str] = set()
    for node, cid, reply in _per_client(replies, node_to_cid, shards or {}, asked, shard_asked):
        if cid is None or (asked is not None and cid not in asked):
            log(WARNING, "Ignoring a %s reply from node %d, which was not asked", kind, node)
            continue
        if server_round is not None and reply.metadata.group_id != str(server_round):
            log(
                WARNING,
                "Client %s: %s reply answers round %r, not round %d; ignored",
                cid,
                kind,
                reply.metadata.group_id,
                server_round,
            )
            continue
        if cid in seen:
            log(WARNING, "Client %s: duplicated %s reply ignored", cid, kind)
            continue
        seen.add(cid)
        if reply.has_error():
            handler = missing_handler(str(reply.error.reason))
            if lacking is not None and handler is not None:
                if cid not in lacking:
                    log(
                        ERROR,
                        "Client %s: its ClientApp has no handler for '%s' messages, "
                        "which this strategy sends (docs/protocol.md); the client is left "
                        "out of the run",
                        cid,
                        handler,
                    )
                lacking[cid] = handler
                if on_error is not None:  # its parts are counted as rejected
                    on_error(cid, reply)
                continue
            if on_error is not None:
                on_error(cid, reply)
            else:
                log(
                    WARNING,
                    "Client %s failed the %s request (error %s: %s)",
                    cid,
                    kind,
                    reply.error.code,
                    reply.error.reason,
                )
            continue
        yield cid, reply
