"""The one preamble every reply goes through: node -> client, unexpected
senders, duplicates and error replies, each logged with the client id."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Iterator
from logging import ERROR, WARNING

from flwr.app import Message
from flwr.common.logger import log


_NO_HANDLER = re.compile(r"No (\w+) function registered with name '(\w+)'")


def missing_handler(reason: str) -> str | None:
    """The message type (``query.losses``) an error reply says its ClientApp has
    no handler for (Flower's ClientApp words it so), else None."""
    found = _NO_HANDLER.search(reason)
    if not found:
        return None
    category, action = found.groups()
    return category if action == "default" else f"{category}.{action}"


def client_replies(
    node_to_cid: dict[int, str],
    replies: Iterable[Message],
    kind: str,
    asked: Collection[str] | None = None,
    on_error: Callable[[str, Message], None] | None = None,
    server_round: int | None = None,
    lacking: dict[str, str] | None = None,
) -> Iterator[tuple[str, Message]]:
    """Yield ``(client id, reply)`` for the usable replies of one round trip.

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
    for reply in replies:
        node = reply.metadata.src_node_id
        cid = node_to_cid.get(node)
        if cid is None or (asked is not None and cid not in asked):
            log(WARNING, "Ignoring a %s reply from node %d, which was not asked", kind, node)
            continue
        if server_round is not None and reply.metadata.group_id != str(server_round):
            log(WARNING, "Client %s: %s reply answers round %r, not round %d; ignored",
                cid, kind, reply.metadata.group_id, server_round)
            continue
        if cid in seen:
            log(WARNING, "Client %s: duplicated %s reply ignored", cid, kind)
            continue
        seen.add(cid)
        if reply.has_error():
            handler = missing_handler(str(reply.error.reason))
            if lacking is not None and handler is not None:
                if cid not in lacking:
                    log(ERROR, "Client %s: its ClientApp has no handler for '%s' messages, "
                        "which this strategy sends (docs/protocol.md); the client is left "
                        "out of the run", cid, handler)
                lacking[cid] = handler
                if on_error is not None:  # its parts are counted as rejected
                    on_error(cid, reply)
                continue
            if on_error is not None:
                on_error(cid, reply)
            else:
                log(WARNING, "Client %s failed the %s request (error %s: %s)",
                    cid, kind, reply.error.code, reply.error.reason)
            continue
        yield cid, reply
