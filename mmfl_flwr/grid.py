"""InProcessGrid: a Flower ``Grid`` that calls the ClientApp directly.

Runs the *same* Strategy and ClientApp code as Flower's simulation engine, in one
process and without Ray or a SuperLink: for tests and fast experiments. Each node
has a persistent :class:`flwr.app.Context` (its ``state`` survives across
messages, as in a SuperNode). Nodes can be removed or added between rounds to
emulate drop-outs and late joiners; a ClientApp that raises produces an error
reply (code 2, as Flower's runtime does), never a crash of the server.
"""

from __future__ import annotations

import copy
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from uuid import uuid4

import numpy as np
from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid

ClientAppLike = Callable[[Message, Context], Message]

#: Flower's ``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``.
CLIENT_APP_RAISED_EXCEPTION = 2


def ensure_task_identity(run_id: int = 1) -> None:
    """Let ``Message(...)`` be built outside a Flower runtime.

    Flower fills the sender of an instruction message from its internal
    ``TaskIdentity``, which only its runtimes set. Sets it if unset.
    """
    from flwr.supercore.task_identity import TaskIdentity

    try:
        TaskIdentity.run_id  # noqa: B018
    except RuntimeError:
        TaskIdentity.run_id = run_id
        TaskIdentity.node_id = 0
        TaskIdentity.task_id = 1


class _InProcessRun:
    def __init__(self, run_id: int) -> None:
        self.run_id = run_id


class InProcessGrid(Grid):
    """A Grid whose nodes are ClientApp calls in this process.

    Parameters
    ----------
    client_app : callable
        A :class:`flwr.clientapp.ClientApp` (or any ``(Message, Context) -> Message``).
    node_configs : sequence of mappings
        One ``node_config`` per node (e.g. ``{"partition-id": i, "num-partitions": N}``).
    run_config : mapping, optional
        The ``run_config`` every node sees.
    seed : int
        Seeds the (random, 63-bit) node ids, as Flower's are random too.
    copy_messages : bool
        Deep-copy messages in both directions, as a real transport would
        (default True), so a client cannot alias the server's records.
    """

    def __init__(
        self,
        client_app: ClientAppLike,
        node_configs: Iterable[Mapping[str, Any]],
        run_config: Mapping[str, Any] | None = None,
        seed: int = 0,
        copy_messages: bool = True,
        run_id: int = 1,
    ) -> None:
        ensure_task_identity(run_id)
        self.client_app = client_app
        self.run_config = dict(run_config or {})
        self.copy_messages = copy_messages
        self._run = _InProcessRun(run_id)
        self._rng = np.random.default_rng([seed, 7])
        self._contexts: dict[int, Context] = {}
        self._pending: dict[str, Message] = {}
        for cfg in node_configs:
            self.add_node(cfg)

    # -- node management (emulates joins and drop-outs) ----------------------
    def add_node(self, node_config: Mapping[str, Any]) -> int:
        """Add a node; returns its (new, random) node id."""
        while True:
            nid = int(self._rng.integers(1, 2**63 - 1))
            if nid not in self._contexts:
                break
        self._contexts[nid] = Context(
            run_id=self._run.run_id,
            node_id=nid,
            node_config=dict(node_config),
            state=RecordDict(),
            run_config=dict(self.run_config),
        )
        return nid

    def remove_node(self, node_id: int) -> None:
        """Take a node offline; messages to it get no reply."""
        self._contexts.pop(node_id, None)

    def context(self, node_id: int) -> Context:
        """The persistent Context of a node."""
        return self._contexts[node_id]

    # -- Grid API -------------------------------------------------------------
    def set_run(self, run: Any) -> None:  # noqa: D102
        self._run = run

    @property
    def run(self) -> Any:  # noqa: D102
        return self._run

    def create_message(  # noqa: D102
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:  # noqa: D102
        return list(self._contexts)

    def _deliver(self, msg: Message) -> Message | None:
        nid = msg.metadata.dst_node_id
        ctx = self._contexts.get(nid)
        if ctx is None:
            return None  # unknown destination: dropped, as Flower does
        msg.metadata.__dict__["_message_id"] = uuid4().hex
        inbound = copy.deepcopy(msg) if self.copy_messages else msg
        try:
            reply = self.client_app(inbound, ctx)
        except Exception as err:  # the ClientApp raised: error reply, like Flower
            reason = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=5)}"
            return Message(Error(CLIENT_APP_RAISED_EXCEPTION, reason), reply_to=inbound)
        if nid not in self._contexts:
            return None  # the node went away while working
        return copy.deepcopy(reply) if self.copy_messages else reply

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:  # noqa: D102
        ids = []
        for msg in messages:
            reply = self._deliver(msg)
            if reply is not None:
                mid = msg.metadata.message_id
                self._pending[mid] = reply
                ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # noqa: D102
        return [self._pending.pop(m) for m in message_ids if m in self._pending]

    def send_and_receive(  # noqa: D102
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        start = time.monotonic()
        replies = []
        for msg in messages:
            if timeout is not None and time.monotonic() - start > timeout:
                break  # like Flower: what has not arrived by the timeout is dropped
            reply = self._deliver(msg)
            if reply is not None:
                replies.append(reply)
        return replies
