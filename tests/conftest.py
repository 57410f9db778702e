"""Shared test fakes: a numpy local trainer, a ClientApp message recorder, a
log collector and a node lookup for :class:`~mmfl_flwr.grid.InProcessGrid`.

It also schedules the tests on pytest-xdist's workers (see
:func:`pytest_collection_modifyitems`).

Test modules import them with ``from conftest import ...`` (pytest puts this
folder on ``sys.path``). Every expected number in the tests that use
:class:`StepTrainer` follows from its one rule: ``train`` returns
``w - step`` in every entry, so the update is ``G = step``.
"""

from __future__ import annotations

import contextlib
import logging
import os

# One torch (OpenMP) thread per process, set before anything imports torch: the
# suite already runs one pytest-xdist worker per core, so a second thread per
# process only makes the workers and their Flower/Ray children wait on each other
# (the engines cap their threads at OMP_NUM_THREADS, as Ray's workers do). A
# value the user exported is kept; the thread tests set their own.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The digits splits' cache (mmfl_flwr.tasks.data.cache_dir) of the test processes and
# of the Flower processes they start: kept in the checkout's .pytest_cache, not the
# user's ~/.cache.
os.environ.setdefault(
    "MMFL_CACHE_DIR",
    os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "mmfl-cache"
    ),
)
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message

from mmfl_flwr import protocol as P
from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.records import arrays_to_numpy


class StepTrainer:
    """A numpy LocalTrainer.

    ``train`` returns ``w - step`` in every entry (dtype kept) with ``n``
    examples and the training loss ``train_loss * train_loss_decay ** k`` at
    its ``k``-th training (from 0); ``loss`` and ``evaluate`` return fixed
    answers. With ``fail`` training raises; with ``seen`` (a list) every
    SCAFFOLD ``correction`` it receives is recorded there.
    """

    def __init__(
        self,
        n: int,
        step: float,
        loss: float = 1.0,
        ev: tuple[float, float, int] = (1.0, 0.5, 10),
        train_loss: float = 0.5,
        fail: bool = False,
        seen: list[Any] | None = None,
        train_loss_decay: float = 1.0,
    ) -> None:
        self._n = n
        self.step = step
        self._loss = loss
        self._eval = ev
        self._train_loss = train_loss
        self.fail = fail
        self.seen = seen
        self.decay = train_loss_decay
        self.trained = 0

    @property
    def num_examples(self) -> int:
        return self._n

    def train(self, weights, epochs, lr, seed, batch_size=None, correction=None):
        if self.fail:
            raise RuntimeError("simulated crash in local training")
        if self.seen is not None:
            self.seen.append(
                None if correction is None else {k: np.array(v) for k, v in correction.items()}
            )
        loss = self._train_loss * self.decay**self.trained
        self.trained += 1
        new = {
            k: (v - np.asarray(self.step, dtype=v.dtype)).astype(v.dtype)
            for k, v in weights.items()
        }
        return new, self._n, loss

    def loss(self, weights):
        return self._loss

    def evaluate(self, weights):
        return self._eval


@dataclass
class Received:
    """One message a node received."""

    round: int
    node: int
    cid: str
    type: str
    tasks: tuple[str, ...] = ()
    arrays: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


class Recorder:
    """Wraps a ClientApp callable and records every message each node receives
    (the node config must hold ``cid``)."""

    def __init__(self, app: Callable[[Message, Context], Message]) -> None:
        self.app = app
        self.log: list[Received] = []

    def __call__(self, msg: Message, ctx: Context) -> Message:
        arrays = {k: arrays_to_numpy(v) for k, v in msg.content.array_records.items()}
        cfg = msg.content.config_records.get(P.CONFIG_KEY)
        tasks = sorted(t for t in (P.task_of(k, P.ARRAYS_PREFIX) for k in arrays) if t)
        self.log.append(
            Received(
                round=int(msg.metadata.group_id),
                node=ctx.node_id,
                cid=str(ctx.node_config["cid"]),
                type=msg.metadata.message_type,
                tasks=tuple(tasks),
                arrays=arrays,
                config=dict(cfg) if cfg is not None else {},
            )
        )
        return self.app(msg, ctx)

    def of_type(self, mtype: str) -> list[Received]:
        """The messages of one type, in order."""
        return [r for r in self.log if r.type == mtype]

    def nodes(self, cid: str, mtype: str) -> list[tuple[int, int]]:
        """``(round, node)`` of every ``mtype`` message client ``cid`` received."""
        return [(r.round, r.node) for r in self.log if r.cid == cid and r.type == mtype]


class LogTap(logging.Handler):
    """Collects log records as ``(level, message)``."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))

    def warnings(self) -> list[str]:
        """The messages at WARNING or above."""
        return [m for lvl, m in self.records if lvl >= logging.WARNING]

    @classmethod
    @contextlib.contextmanager
    def on_flwr(cls) -> Iterator[LogTap]:
        """Collect the ``flwr`` logger's records while the block runs."""
        tap = cls()
        logger = logging.getLogger("flwr")
        logger.addHandler(tap)
        try:
            yield tap
        finally:
            logger.removeHandler(tap)


def one_array_update(cid: str, values: list[float], n: int = 10, share: float = 0.25) -> Update:
    """An update of one float64 array from ``n`` examples and data share ``share``
    (the update the bounds' unit tests build by hand)."""
    return Update(
        cid=cid, delta=[np.array(values, dtype=np.float64)], num_examples=n, data_share=share
    )


def node_of(grid: InProcessGrid, cid: str) -> int:
    """The node id of client ``cid`` (node config ``cid``) on ``grid``."""
    (nid,) = [n for n in grid.get_node_ids() if grid.context(n).node_config["cid"] == cid]
    return nid


def pytest_itemcollected(item: pytest.Item) -> None:
    """Scheduling on pytest-xdist's workers (``-n`` in pyproject.toml's addopts,
    ``--dist loadgroup``): the slow end-to-end tests form two groups, each run
    one test after another by one worker: the tests marked ``ray`` (Flower's
    simulation engine, one local Ray instance at a time: a second ``ray.init``
    on the machine could join the first) and the rest (SuperLink deployments,
    in-process and vectorized runs). Each starts its Flower processes on ports
    and in a ``FLWR_HOME`` of its own, so the two chains share only the cores.
    Every other module is a group of its own, so its module- and class-scoped
    fixtures are built once. (The groups are set here, as each test is
    collected: xdist reads them in its own ``pytest_collection_modifyitems``.)
    ``-n 0`` runs everything in one process, in file order."""
    if item.get_closest_marker("slow"):
        group = "slow-ray" if item.get_closest_marker("ray") else "slow"
    else:
        group = item.nodeid.split("::")[0]
    item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On xdist's workers the two slow groups come first (``--no-loadscope-reorder``
    in addopts keeps this order), so the two longest chains start at once, one
    per worker, and the fast modules fill the workers as they free up."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(
            key=lambda item: (
                item.get_closest_marker("slow") is None,
                item.get_closest_marker("ray") is None,
            )
        )
