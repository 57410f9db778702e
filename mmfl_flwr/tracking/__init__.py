"""Experiment tracking: stream a run to TensorBoard, MLflow or Weights & Biases.

``mmfl run --log-to tensorboard,mlflow,wandb`` (run-config key ``log-to``,
Python ``mmfl_flwr.runner.run(..., loggers=[...])``). Each backend is its own
module, imported only when used, and its own extra (``pip install
'mmfl-flwr[tensorboard]'``, ``[mlflow]``, ``[wandb]``, or ``[tracking]`` for
all three). Everything is logged from the server side (the ServerApp), the
same on every engine. Your own logger: subclass :class:`RunLogger`
(docs/tracking.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mmfl_flwr.tracking.base import ROUND_COLUMNS, RunInfo, RunLogger, client_counts, round_metrics

__all__ = [
    "BACKENDS",
    "ROUND_COLUMNS",
    "LoggerHub",
    "RunInfo",
    "RunLogger",
    "check_installed",
    "client_counts",
    "make_logger",
    "parse_log_to",
    "round_metrics",
]

#: ``--log-to`` name -> (module, class, the module it needs, the extra that installs it)
BACKENDS: dict[str, tuple[str, str, str, str]] = {
    "tensorboard": (
        "mmfl_flwr.tracking.tensorboard",
        "TensorBoardLogger",
        "tensorboard",
        "tensorboard",
    ),
    "mlflow": ("mmfl_flwr.tracking.mlflow", "MLflowLogger", "mlflow", "mlflow"),
    "wandb": ("mmfl_flwr.tracking.wandb", "WandbLogger", "wandb", "wandb"),
}


def parse_log_to(text: str) -> list[str]:
    """The backend names of a ``log-to`` value (comma-separated; ``""``: none),
    each once, in order; ValueError (one line) for an unknown one."""
    names: list[str] = []
    for item in str(text).split(","):
        name = item.strip().lower()
        if not name:
            continue
        if name not in BACKENDS:
            raise ValueError(
                f"log-to={text!r}: unknown tracker {item.strip()!r}; choose from "
                f"{', '.join(BACKENDS)} (comma-separated)"
            )
        if name not in names:
            names.append(name)
    return names


def check_installed(names: Iterable[str]) -> None:
    """ValueError (one line naming the ``pip install`` to run) when the package
    of a backend in ``names`` is not installed. Imports nothing."""
    for name in names:
        _, _, module, extra = BACKENDS[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError, AttributeError):  # e.g. sys.modules[name] = None
            found = False
        if not found:
            raise ValueError(
                f"--log-to {name} (log-to) needs the {module} package, which is not "
                f"installed: pip install 'mmfl-flwr[{extra}]' (or 'mmfl-flwr[tracking]' "
                f"for all trackers)"
            )


def make_logger(name: str) -> RunLogger:
    """The built-in logger ``name`` (:data:`BACKENDS`); imports its module."""
    module, cls, _, _ = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)()


class LoggerHub:
    """Calls every logger of a run; one that raises is reported in one warning
    and dropped, and the run goes on."""

    def __init__(self, loggers: Sequence[RunLogger], clients_every: int = 0) -> None:
        self.loggers = list(loggers)
        self.clients_every = clients_every
        self.failed: dict[str, str] = {}
        self.started = False
        self.finished = False

    def __bool__(self) -> bool:
        return bool(self.loggers)

    def _call(self, method: str, *args: Any) -> None:
        from flwr.common.logger import log

        for lg in list(self.loggers):
            try:
                getattr(lg, method)(*args)
            except Exception as err:  # noqa: BLE001 - a tracker never stops the run
                self.loggers.remove(lg)
                name = getattr(lg, "name", type(lg).__name__)
                self.failed[name] = f"{type(err).__name__}: {err}"
                text = " ".join(str(err).split())[:300] or type(err).__name__
                log(
                    logging.WARNING,
                    "Logger %s failed in %s (%s); the run goes on without it",
                    name,
                    method,
                    text,
                )

    def start(self, run: RunInfo) -> None:
        self.started = True
        self._call("start", run)

    def round(
        self,
        rnd: int,
        rows: Sequence[dict[str, Any]],
        assignments: Mapping[int, Any],
        defence: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        """Log round ``rnd`` with its defence events counted (model -> kind ->
        count, from the strategy's events: :mod:`mmfl_flwr.strategy.events`)."""
        defence = defence or {}
        if self.loggers:
            self._call("log_round", rnd, round_metrics(rows, defence), list(rows))
            if self.clients_every and rnd > 0 and rnd % self.clients_every == 0:
                self._call("log_clients", rnd, client_counts(assignments, rnd))

    def finish(
        self,
        status: str,
        last_round: int,
        assignments: Mapping[int, Any] | None,
        summary: Mapping[str, Any] | None,
        files: Sequence[Path],
    ) -> None:
        if self.finished:
            return
        self.finished = True
        if not self.started:
            return
        if assignments is not None and not (
            self.clients_every and last_round > 0 and last_round % self.clients_every == 0
        ):
            self._call("log_clients", last_round, client_counts(assignments))
        self._call("finish", status, summary, list(files))


def run_params(
    settings: Any, effective: Mapping[str, Any] | None, engine: str | None
) -> dict[str, Any]:
    """The hyperparameters of a run (:attr:`RunInfo.params`)."""
    params: dict[str, Any] = dict(settings.to_run_config())
    for key, value in (effective or {}).items():
        params[f"effective.{key}"] = value
    params["engine"] = engine or ""
    try:
        from mmfl_flwr.core.card import card

        c = card(settings.strategy)
        params.update({"card.title": c.title, "card.paper": c.paper, "card.section": c.section})
    except (KeyError, ValueError):
        pass
    return {k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in params.items()}
