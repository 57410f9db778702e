"""The callback interface of a run's loggers, and what the server hands them.

A logger is a :class:`RunLogger`: the ServerApp (on every engine) calls
:meth:`~RunLogger.start` once before round 0, :meth:`~RunLogger.log_round`
after every round (round 0 is the evaluation of the initial weights),
:meth:`~RunLogger.log_clients` with the clients' training counts (at the end,
or every ``log-clients-every`` rounds) and :meth:`~RunLogger.finish` once at
the end, also when the run is interrupted (``status`` says how it ended).
Subclass it and override what you need; every method does nothing by default.

Example
-------
>>> from mmfl_flwr.tracking import RunLogger
>>> class PrintBest(RunLogger):
...     name = "print-best"
...     def log_round(self, rnd, metrics, rows):
...         best = max(r["accuracy"] for r in rows)
...         print(f"round {rnd}: best model accuracy {best:.3f}")
>>> # mmfl_flwr.runner.run(settings, engine="inprocess", loggers=[PrintBest()])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The per-round columns of a history row (``metrics.csv``) that the loggers
#: receive per model, as ``<model>/<column>``.
ROUND_COLUMNS = (
    "accuracy",
    "loss",
    "uploads",
    "assigned",
    "rejected",
    "train_loss",
    "step_l1",
    "coef_sum",
    "client_accuracy",
    "client_loss",
)


@dataclass
class RunInfo:
    """What a logger learns when the run starts.

    Attributes
    ----------
    name : str
        A name for the run (the output folder's name, or strategy and seed).
    params : dict[str, Any]
        The effective configuration as flat hyperparameters: every run-config
        key as typed, ``effective.<key>`` for the values used for the automatic
        settings, ``engine``, and the preset's card (``card.title``,
        ``card.paper``, ``card.section``).
    models : list[str]
        The model names, in order.
    num_rounds : int
        The rounds the run goes to.
    start_round : int
        The last round already done (a resumed run; 0 for a fresh one).
    output_dir : Path or None
        The run's output folder (None when nothing is written).
    settings : Any
        The run's :class:`~mmfl_flwr.config.Settings`.
    """

    name: str
    params: dict[str, Any]
    models: list[str]
    num_rounds: int
    start_round: int = 0
    output_dir: Path | None = None
    settings: Any = None
    tags: dict[str, str] = field(default_factory=dict)


class RunLogger:
    """Base class of a run's loggers (TensorBoard, MLflow, W&B, your own).

    Every method does nothing; override those you need. A method that raises
    makes the server log one warning and drop this logger; the run goes on.
    """

    #: The name used in warnings (``--log-to`` name for the built-in ones).
    name: str = "custom"

    def start(self, run: RunInfo) -> None:
        """Called once before round 0 (or the first resumed round)."""

    def log_round(
        self, rnd: int, metrics: Mapping[str, float], rows: Sequence[dict[str, Any]]
    ) -> None:
        """Called after round ``rnd`` (0: the initial weights' evaluation).

        ``metrics`` are the round's finite values, flat (:func:`round_metrics`):
        ``<model>/<column>`` for the columns of :data:`ROUND_COLUMNS`,
        ``<model>/defence/<kind>`` for the defence actions counted by kind,
        ``round/seconds`` and ``round/mean_accuracy``; ``rows`` are the round's
        history rows as ``metrics.csv`` holds them."""

    def log_clients(self, rnd: int, counts: Mapping[str, Mapping[str, int]]) -> None:
        """The clients' training so far, after round ``rnd``: client id -> model
        -> the rounds it trained that model (clients that never trained are
        absent)."""

    def finish(self, status: str, summary: Mapping[str, Any] | None, files: Sequence[Path]) -> None:
        """Called once at the end: ``status`` is ``"finished"``, ``"interrupted"``
        or ``"failed"``; ``summary`` is ``summary.json`` (None when not written)
        and ``files`` the run's result files (empty without an output folder)."""


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def round_metrics(
    rows: Sequence[dict[str, Any]], defence: Mapping[str, Mapping[str, int]] | None = None
) -> dict[str, float]:
    """The flat metrics of one round's history ``rows`` that the loggers get:
    ``<model>/<column>`` for every finite cell of :data:`ROUND_COLUMNS`,
    ``<model>/defence/<kind>`` for ``defence`` (model -> kind -> count),
    ``round/seconds`` (the round's seconds, without round 0) and
    ``round/mean_accuracy`` (the mean server-side accuracy over the models)."""
    out: dict[str, float] = {}
    accs = []
    seconds = None
    for row in rows:
        task = row["task"]
        for col in ROUND_COLUMNS:
            v = _finite(row.get(col))
            if v is not None:
                out[f"{task}/{col}"] = v
        a = _finite(row.get("accuracy"))
        if a is not None:
            accs.append(a)
        s = _finite(row.get("seconds"))
        if s is not None:
            seconds = s
    for task, kinds in (defence or {}).items():
        for kind, n in kinds.items():
            out[f"{task}/defence/{kind}"] = float(n)
    if seconds is not None:
        out["round/seconds"] = seconds
    if accs:
        out["round/mean_accuracy"] = sum(accs) / len(accs)
    return out


def client_counts(
    assignments: Mapping[int, Sequence[tuple[str, str, int]]], upto: int | None = None
) -> dict[str, dict[str, int]]:
    """Client id -> model -> the rounds (up to ``upto``) in which the policy
    assigned that model to the client (``assignments.csv``)."""
    out: dict[str, dict[str, int]] = {}
    for rnd, picks in assignments.items():
        if upto is not None and rnd > upto:
            continue
        seen = set()
        for cid, task, _ in picks:
            if (cid, task) in seen:
                continue
            seen.add((cid, task))
            per = out.setdefault(cid, {})
            per[task] = per.get(task, 0) + 1
    return out
