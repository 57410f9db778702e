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


def round_trip(grid: Any, messages: Iterable[Message], timeout: float,
               server_round: int) -> list[Message]:
    """``grid.send_and_receive(messages)``, timed as ``rt:<message type>``."""
    msgs = list(messages)
    if not PHASE_OBSERVERS:
        return list(grid.send_and_receive(msgs, timeout=timeout))
    kind = str(msgs[0].metadata.message_type) if msgs else "none"
    with timed(server_round, "rt:" + kind, grid):
        return list(grid.send_and_receive(msgs, timeout=timeout))
