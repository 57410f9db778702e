"""The shared harness of the strategy tests: fake clients on the in-process Grid.

A federation is a mapping from a node label to a :class:`ClientDef` (numpy
fake clients whose every number follows from :class:`conftest.StepTrainer`'s
rule: ``train`` returns ``w - step``). :func:`fake_client_app` serves them,
:func:`zero_models` are the initial weights, and :func:`run_federation` runs a
strategy over them on :class:`~mmfl_flwr.grid.InProcessGrid` and returns a
:class:`FedRun`: the result, every round's global models and log records, and
every message the clients received. After every round it asserts that every
global weight is finite.

Test modules import it with ``from harness import ...`` (pytest puts this folder
on ``sys.path`` for ``conftest.py``).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from conftest import LogTap, Recorder, StepTrainer
from flwr.app import ArrayRecord, Context

from mmfl_flwr.client.app import ClientSpec, make_client_app
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.records import numpy_to_arrays
from mmfl_flwr.strategy import MultiModelResult, MultiModelStrategy

#: the fake model: two entries, every task alike
SHAPES = {"w": (2, 3), "b": (3,)}


@dataclass
class ClientDef:
    """A fake client: ``tasks = {task: (num_examples, step)}``; its loss-query
    answers, evaluations (loss, accuracy, examples), training loss and whether
    training fails."""

    tasks: dict[str, tuple[int, float]]
    processors: int = 1
    losses: dict[str, float] = field(default_factory=dict)
    evals: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    train_loss: float = 0.5
    fail_train: bool = False

    def trainers(self) -> dict[str, StepTrainer]:
        return {
            t: StepTrainer(
                n,
                s,
                self.losses.get(t, 1.0),
                self.evals.get(t, (1.0, 0.5, 10)),
                self.train_loss,
                self.fail_train,
            )
            for t, (n, s) in self.tasks.items()
        }


def fake_client_app(
    clients: Mapping[str, ClientDef],
    client_id: Callable[[Context], str] | None = None,
    client_token: Callable[[Context], str | None] | None = None,
) -> Any:
    """The ClientApp of a fake federation: the node config's ``cid`` names the
    client; ``client_id`` / ``client_token`` (of the context) give the id it
    reports and its secret (default: the label, none)."""

    def spec_fn(ctx: Context) -> ClientSpec:
        label = str(ctx.node_config["cid"])
        d = clients[label]
        return ClientSpec(
            client_id=client_id(ctx) if client_id else label,
            trainers=d.trainers(),
            processors=d.processors,
            client_token=client_token(ctx) if client_token else None,
        )

    return make_client_app(spec_fn)


def zero_models(
    tasks: Sequence[str], shapes: Mapping[str, tuple[int, ...]] = SHAPES
) -> dict[str, ArrayRecord]:
    """Initial weights: zeros of ``shapes`` for every task."""
    return {
        t: numpy_to_arrays({k: np.zeros(s, np.float32) for k, s in shapes.items()}) for t in tasks
    }


@dataclass
class FedRun:
    """What :func:`run_federation` returns."""

    result: MultiModelResult
    strategy: MultiModelStrategy
    grid: InProcessGrid
    rec: Recorder
    #: round -> task -> the global weights after it
    snapshots: dict[int, dict[str, dict[str, np.ndarray]]]
    #: round -> the (level, message) records of Flower's logger during it
    logs: dict[int, list[tuple[int, str]]]
    #: node label -> node id (the initial nodes and those added by events)
    nodes: dict[str, int]
    seconds: float = 0.0

    def warnings(self, rnd: int) -> list[str]:
        return [m for lvl, m in self.logs[rnd] if lvl >= logging.WARNING]

    def actions(self, rnd: int) -> list[str]:
        """The lines naming what the server did to a client's reply: its
        WARNINGs, and each bound's action (DEBUG since issue 57)."""
        return [m for lvl, m in self.logs[rnd] if lvl == logging.DEBUG or lvl >= logging.WARNING]

    def errors(self, rnd: int) -> list[str]:
        return [m for lvl, m in self.logs[rnd] if lvl >= logging.ERROR]

    def infos(self, rnd: int) -> list[str]:
        return [m for _, m in self.logs[rnd]]

    def rows(self, rnd: int) -> dict[str, dict[str, Any]]:
        return {r["task"]: r for r in self.result.history if r["round"] == rnd}

    def picked(self, rnd: int) -> set[str]:
        return {c for c, _, _ in self.result.assignments[rnd]}

    def trained(self, label: str) -> list[tuple[int, int]]:
        """``(round, node)`` of every train message the node(s) of ``label`` got."""
        return self.rec.nodes(label, "train")


#: round -> [("add", label, node config) | ("remove", label)], applied after that round
Events = Mapping[int, Iterable[tuple[Any, ...]]]


def run_federation(
    strategy: MultiModelStrategy,
    app: Any,
    nodes: Mapping[str, Mapping[str, Any]],
    initial_arrays: Mapping[str, ArrayRecord],
    rounds: int,
    *,
    wrap: Callable[[Any], Any] | None = None,
    grid_factory: Callable[..., InProcessGrid] = InProcessGrid,
    events: Events | None = None,
    hook: Callable[[int, FedRun], None] | None = None,
    check_round: Callable[[int, list[dict[str, Any]]], None] | None = None,
    timeout: float = 60.0,
    **start: Any,
) -> FedRun:
    """Run ``strategy`` for ``rounds`` rounds over the ``nodes`` (label -> node
    config) served by ``app`` (wrapped by ``wrap``, recorded), on a grid made by
    ``grid_factory(recorder, [])``. After each round: every global weight must
    be finite, ``check_round(round, rows)`` runs, the round's global models and
    log records are kept, ``events[round]`` add or remove nodes and
    ``hook(round, run)`` runs. ``start`` goes to ``strategy.start``."""
    if wrap is not None:
        app = wrap(app)
    rec = Recorder(app)
    grid = grid_factory(rec, [])
    node_ids = {label: grid.add_node(dict(cfg)) for label, cfg in nodes.items()}
    run = FedRun(MultiModelResult(), strategy, grid, rec, {}, {}, node_ids)
    tap = LogTap()
    mark = [0]
    user_callback = strategy.on_round_end

    def on_round_end(rnd: int, rows: list[dict[str, Any]]) -> None:
        for task, w in strategy.weights.items():
            for k, v in w.items():
                assert np.isfinite(v).all(), f"round {rnd}: global {task}/{k} is not finite"
        if check_round is not None:
            check_round(rnd, rows)
        run.snapshots[rnd] = copy.deepcopy(strategy.weights)
        run.logs[rnd] = tap.records[mark[0] :]
        mark[0] = len(tap.records)
        for event in (events or {}).get(rnd, ()):
            if event[0] == "add":
                node_ids[event[1]] = grid.add_node(event[2])
            else:
                grid.remove_node(node_ids[event[1]])
        if user_callback is not None:
            user_callback(rnd, rows)
        if hook is not None:
            hook(rnd, run)

    strategy.on_round_end = on_round_end
    logger = logging.getLogger("flwr")
    logger.addHandler(tap)
    try:
        t0 = time.monotonic()
        run.result = strategy.start(
            grid, dict(initial_arrays), num_rounds=rounds, timeout=timeout, **start
        )
        run.seconds = time.monotonic() - t0
    finally:
        logger.removeHandler(tap)
    assert sorted(run.snapshots) == list(range(rounds + 1)), "the run did not complete"
    return run
