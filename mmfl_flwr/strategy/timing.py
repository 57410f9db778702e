"""Where a round's seconds go: a measurement hook for benchmarks and profilers.

:meth:`MultiModelStrategy.start <mmfl_flwr.strategy.MultiModelStrategy.start>`
times each phase of a round and every Grid round trip, and hands each time to
the callables in :data:`PHASE_OBSERVERS` as a :class:`PhaseTime`. Nothing is
measured while the list is empty (the default), and observers cannot change
the run: they get numbers, not the run's state.

Phases of round ``r`` (in order): ``registration`` (new nodes' info query,
offline nodes), ``loss_query`` (policies that need losses), ``plan`` (the
policy's picks and the train messages), ``train`` (the train round trip),
``aggregate`` (validation and aggregation), ``client_eval`` (client-side
evaluation round trip, also when nothing is sent), ``server_eval`` (the
server-side ``evaluate_fn`` of every task and the history rows), and ``round``
(the whole round, from the start of its registration to the end of its server
evaluation). Round trips are also reported on their own as ``rt:<message
type>`` (``rt:query.info``, ``rt:query.losses``, ``rt:train``,
``rt:evaluate``), inside the phase that sends them, with the Grid that carried
them.

Example (``benchmarks/bench_engines.py`` does this)::

    from mmfl_flwr.strategy.timing import PHASE_OBSERVERS

    seconds = {}
    def observe(t):
        seconds.setdefault(t.round, {})[t.phase] = t.seconds
    PHASE_OBSERVERS.append(observe)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from flwr.app import Message


@dataclass(frozen=True)
class PhaseTime:
    """One measured span: ``seconds`` of ``phase`` in round ``round``; ``grid``
    is the Grid that carried a round trip (``rt:...``), None for phases."""

    round: int
    phase: str
    seconds: float
    grid: Any = None


#: Callables given every :class:`PhaseTime` of a run; none by default.
PHASE_OBSERVERS: list[Callable[[PhaseTime], None]] = []


@contextmanager
def timed(server_round: int, phase: str, grid: Any = None) -> Iterator[None]:
    """Time the body as ``phase`` of ``server_round`` (free without observers)."""
    if not PHASE_OBSERVERS:
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        report(server_round, phase, time.perf_counter() - t0, grid)


def report(server_round: int, phase: str, seconds: float, grid: Any = None) -> None:
    """Hand one time to every observer."""
    event = PhaseTime(server_round, phase, seconds, grid)
    for observer in list(PHASE_OBSERVERS):
        observer(event)


#: First and longest pause between two pulls of a round trip's replies (seconds).
PULL_FIRST, PULL_MOST = 0.002, 0.2


def send_and_receive(grid: Any, messages: list[Message], timeout: float | None) -> list[Message]:
    """What Flower's ``Grid.send_and_receive`` does (push the messages, pull the
    replies until every one has arrived or ``timeout`` has passed, late replies
    dropped), polling sooner: Flower's grids sleep a fixed 0.1 s (simulation)
    or 3 s (deployment) between pulls, which with one message per shard node
    is most of a fast round. Here the pause starts at 2 ms, grows by half per
    empty pull up to 0.2 s and halves after a pull that brought replies. The grids of this package
    (:class:`~mmfl_flwr.grid.InProcessGrid`), which answer during the push,
    keep their own ``send_and_receive``."""
    from mmfl_flwr.grid import InProcessGrid

    if isinstance(grid, InProcessGrid) or not (
        hasattr(grid, "push_messages") and hasattr(grid, "pull_messages")
    ):
        return list(grid.send_and_receive(messages, timeout=timeout))
    end = None if timeout is None else time.time() + timeout
    pending = set(grid.push_messages(messages))
    replies: list[Message] = []
    pause = PULL_FIRST
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if not pending:
            break
        now = time.time()
        if end is not None and now >= end:
            break
        pause = max(PULL_FIRST, pause / 2) if got else min(PULL_MOST, pause * 1.5)
        time.sleep(pause if end is None else max(0.0, min(pause, end - now)))
    return replies


def round_trip(
    grid: Any, messages: Iterable[Message], timeout: float, server_round: int
) -> list[Message]:
    """:func:`send_and_receive` of ``messages``, timed as ``rt:<message type>``."""
    msgs = list(messages)
    if not PHASE_OBSERVERS:
        return send_and_receive(grid, msgs, timeout)
    kind = str(msgs[0].metadata.message_type) if msgs else "none"
    with timed(server_round, "rt:" + kind, grid):
        return send_and_receive(grid, msgs, timeout)
