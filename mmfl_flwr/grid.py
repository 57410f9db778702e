"""InProcessGrid: a Flower ``Grid`` that calls the ClientApp directly.

Runs the *same* Strategy and ClientApp code as Flower's simulation engine, in one
process and without Ray or a SuperLink: for tests and fast experiments. Each node
has a persistent :class:`flwr.app.Context` (its ``state`` survives across
messages, as in a SuperNode). Nodes can be removed or added between rounds to
emulate drop-outs and late joiners; a ClientApp that raises produces an error
reply (code 2, as Flower's runtime does), never a crash of the server. An
optional latency model delays replies (stragglers): a reply that would arrive
after ``send_and_receive``'s timeout is dropped, as Flower's Grid drops it.
"""

from __future__ import annotations

import copy
import io
import math
import pickle
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple
from uuid import uuid4

import numpy as np
from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid

ClientAppLike = Callable[[Message, Context], Message]
#: ``latency(message, context) -> seconds`` of simulated delay of a node's reply.
LatencyFn = Callable[[Message, Context], float]

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


class _SharingPickler(pickle.Pickler):
    """Pickles byte strings by reference (they are immutable)."""

    def __init__(self, file: io.BytesIO, shared: list[bytes]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.shared = shared

    def persistent_id(self, obj: object) -> int | None:  # noqa: D102
        if type(obj) is bytes:
            self.shared.append(obj)
            return len(self.shared) - 1
        return None


class _SharingUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, shared: list[bytes]) -> None:
        super().__init__(file)
        self.shared = shared

    def persistent_load(self, pid: object) -> bytes:  # noqa: D102
        return self.shared[int(pid)]  # type: ignore[call-overload]


def transport_copy(msg: Message) -> Message:
    """An independent copy of ``msg``, as a transport would deliver it: a pickle
    round trip in which byte strings (the arrays' data) are shared rather
    than copied, since bytes are immutable (no copy of the weights' data, unlike
    ``copy.deepcopy``, and a receiver can recognise weights it has decoded before);
    a deep copy if the message does not pickle."""
    try:
        shared: list[bytes] = []
        buf = io.BytesIO()
        _SharingPickler(buf, shared).dump(msg)
        buf.seek(0)
        return _SharingUnpickler(buf, shared).load()
    except (pickle.PicklingError, TypeError, AttributeError):
        return copy.deepcopy(msg)


class LateReply(NamedTuple):
    """A reply dropped by ``send_and_receive`` because it arrived after the timeout."""

    node_id: int
    message_type: str
    group_id: str
    #: Seconds after the send at which the reply arrived (call duration + latency).
    arrival: float


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
    latency : callable, optional
        ``latency(message, context) -> seconds``: simulated extra time a node
        takes to reply to ``message`` (a slow device or link, a straggler). It
        is virtual (nothing sleeps unless ``wait``). Nodes are treated as
        working in parallel, as in a real federation, so a reply *arrives* at
        ``sent + d + latency``, where ``d`` is the measured duration of that
        node's ClientApp call alone. ``send_and_receive(..., timeout=T)``
        delivers every message, then returns only the replies that arrived by
        ``sent + T`` and drops the others, as Flower's Grid does. The ClientApp
        still ran, so a dropped node keeps its ``context.state`` changes, as a
        real SuperNode would. Every dropped reply is appended to :attr:`late`.
        A reply pushed with ``push_messages`` is returned by ``pull_messages``
        only once its arrival time has passed on the wall clock, so a late
        reply can be collected in a later round. A ClientApp call itself cannot
        be preempted: give a straggler a latency rather than a real ``sleep``.
        Default None: no delay, and the original behaviour (messages are
        handled one after another in order; once ``timeout`` has passed on the
        wall clock the remaining messages are not delivered).
    wait : bool
        With ``latency``: make ``send_and_receive`` block as long as Flower's
        would, i.e. until the last reply has arrived or the timeout has passed,
        whichever is first (default False: return as soon as the calls are done).
    """

    def __init__(
        self,
        client_app: ClientAppLike,
        node_configs: Iterable[Mapping[str, Any]],
        run_config: Mapping[str, Any] | None = None,
        seed: int = 0,
        copy_messages: bool = True,
        run_id: int = 1,
        latency: LatencyFn | None = None,
        wait: bool = False,
    ) -> None:
        ensure_task_identity(run_id)
        self.client_app = client_app
        self.run_config = dict(run_config or {})
        self.copy_messages = copy_messages
        self.latency = latency
        self.wait = bool(wait)
        #: Replies dropped by ``send_and_receive`` for arriving after the timeout.
        self.late: list[LateReply] = []
        self._run = _InProcessRun(run_id)
        self._rng = np.random.default_rng([seed, 7])
        self._contexts: dict[int, Context] = {}
        # message id -> (wall-clock arrival time, reply)
        self._pending: dict[str, tuple[float, Message]] = {}
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
        return Message(
            content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl
        )

    def get_node_ids(self) -> Iterable[int]:  # noqa: D102
        return list(self._contexts)

    def _deliver(self, msg: Message) -> Message | None:
        nid = msg.metadata.dst_node_id
        ctx = self._contexts.get(nid)
        if ctx is None:
            return None  # unknown destination: dropped, as Flower does
        msg.metadata.__dict__["_message_id"] = uuid4().hex
        inbound = transport_copy(msg) if self.copy_messages else msg
        try:
            reply = self.client_app(inbound, ctx)
        except Exception as err:  # the ClientApp raised: error reply, like Flower
            reason = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=5)}"
            return Message(Error(CLIENT_APP_RAISED_EXCEPTION, reason), reply_to=inbound)
        if nid not in self._contexts:
            return None  # the node went away while working
        return transport_copy(reply) if self.copy_messages else reply

    def _delay(self, msg: Message, ctx: Context | None) -> float:
        """Simulated latency of the reply to ``msg`` (0 without a latency model)."""
        if self.latency is None or ctx is None:
            return 0.0
        delay = float(self.latency(msg, ctx))
        if not delay >= 0:  # negative or NaN
            raise ValueError(f"latency must be >= 0 seconds, got {delay!r}")
        return delay

    def _timed_deliver(self, msg: Message) -> tuple[Message | None, float]:
        """Deliver ``msg``; return the reply and its delay after the call began
        (the call's duration plus the simulated latency)."""
        ctx = self._contexts.get(msg.metadata.dst_node_id)
        t0 = time.monotonic()
        reply = self._deliver(msg)
        duration = time.monotonic() - t0
        if reply is None:
            return None, duration
        # the latency model sees the message with its id set, as the client did
        return reply, duration + self._delay(msg, ctx)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:  # noqa: D102
        ids = []
        for msg in messages:
            sent = time.monotonic()
            reply, delay = self._timed_deliver(msg)
            if reply is not None:
                mid = msg.metadata.message_id
                self._pending[mid] = (sent + delay, reply)
                ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # noqa: D102
        now = time.monotonic()
        ready = [m for m in message_ids if m in self._pending and self._pending[m][0] <= now]
        return [self._pending.pop(m)[1] for m in ready]

    def send_and_receive(  # noqa: D102
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        start = time.monotonic()
        replies = []
        if self.latency is None:
            for msg in messages:
                if timeout is not None and time.monotonic() - start > timeout:
                    break  # like Flower: what has not arrived by the timeout is dropped
                reply = self._deliver(msg)
                if reply is not None:
                    replies.append(reply)
            return replies
        # Latency model: nodes work in parallel from ``start``; each reply
        # arrives after its own call duration plus its latency.
        limit = math.inf if timeout is None else float(timeout)
        last = 0.0  # when the last reply that arrives in time arrived
        for msg in messages:
            reply, delay = self._timed_deliver(msg)
            if reply is None:
                continue
            if delay > limit or math.isinf(delay):
                self.late.append(
                    LateReply(
                        node_id=msg.metadata.dst_node_id,
                        message_type=msg.metadata.message_type,
                        group_id=msg.metadata.group_id,
                        arrival=delay,
                    )
                )
                last = limit  # Flower waits for it until the timeout
                continue
            replies.append(reply)
            last = max(last, delay)
        if self.wait and math.isfinite(last):
            remaining = start + last - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)
        return replies
