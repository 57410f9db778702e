"""The files of a run's output folder that the ServerApp
(:mod:`mmfl_flwr.flower_app.server_app`) writes while the run goes on and at its
end: the checks of the folder before anything is written, the preparation of a
fresh run's folder (an older run's files removed, ``config.json``), the round
callbacks that rewrite ``metrics.csv``, ``assignments.csv``, ``events.csv``,
``accuracy.png`` and the clusters after every round, the files of the finished
rounds after an interrupt, and ``report.html``.

:mod:`mmfl_flwr.flower_app.server_app` re-exports the names it used to hold.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from mmfl_flwr.checkpoint import CHECKPOINT_FILE, checkpoint_file
from mmfl_flwr.config import Settings
from mmfl_flwr.strategy import MultiModelStrategy
from mmfl_flwr.tracking import LoggerHub


def check_output_location(output_dir: str) -> None:
    """Refuse an output folder that cannot hold a run's files: a file, a path
    under a file, or a folder that this process cannot write (permissions, a
    read-only file system). Probed by creating and removing a temporary entry
    in the folder (or, where it does not exist yet, in its nearest existing
    parent), so nothing is left behind. Raises ValueError (one line)."""
    if not output_dir:
        return
    path = Path(output_dir)
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise ValueError(
                f"--output-dir {output_dir} (output-dir): {part} is a file, not a folder; "
                "name a folder"
            )
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    try:
        tempfile.TemporaryDirectory(dir=existing, prefix=".mmfl-probe-").cleanup()
    except OSError as err:
        raise ValueError(
            f"--output-dir {output_dir} (output-dir): cannot write into {existing} "
            f"({err.strerror or type(err).__name__}); name a folder you can write"
        ) from None


def check_output_folder(s: Settings) -> None:
    """Refuse to start a new run in an output folder that holds another run's
    checkpoint, unless it resumes that checkpoint or ``s.overwrite``, and an
    output folder that cannot be written (:func:`check_output_location`: a file,
    a folder under one, no write permission, a read-only file system;
    ``overwrite`` replaces run outputs, never a file by a folder)."""
    if not s.output_dir:
        return
    check_output_location(s.output_dir)
    if s.overwrite:
        return
    held = Path(s.output_dir) / CHECKPOINT_FILE
    resumes_it = bool(s.resume_from) and (
        checkpoint_file(s.resume_from).resolve() == held.resolve()
    )
    if held.exists() and not resumes_it:
        raise ValueError(
            f"output folder {s.output_dir} holds a run ({CHECKPOINT_FILE}); resume it "
            f"with --resume {s.output_dir} (resume-from) or pass --overwrite "
            f"(overwrite=true)"
        )


#: Files of a run's output folder that a fresh run removes first (an older run's).
RUN_FILES = (
    "summary.json",
    "metrics.csv",
    "assignments.csv",
    "accuracy.png",
    "assignments.png",
    "training.png",
    "events.csv",
    "defence.csv",
    "report.html",
)


def _with_loggers(
    strategy: MultiModelStrategy, hub: LoggerHub, events_csv: Path | None
) -> Callable[[int, list[dict[str, Any]]], None]:
    """Wrap the round callback: after every round, ``events_csv`` (where given)
    rewritten with the run's defence events so far, and the round to the
    loggers with its events counted by model and kind."""
    from mmfl_flwr.results import write_events_csv
    from mmfl_flwr.strategy.events import by_task_kind

    inner = strategy.on_round_end

    def callback(rnd: int, rows: list[dict[str, Any]]) -> None:
        result = strategy.result
        assignments = result.assignments if result is not None else {}
        events = result.events if result is not None else []
        hub.round(rnd, rows, assignments, by_task_kind(e for e in events if e.round == rnd))
        if events_csv is not None:
            write_events_csv(events, events_csv)
        if inner is not None:
            inner(rnd, rows)

    return callback


def _report(s: Settings, assignments_png: bytes | None = None) -> None:
    """Write ``report.html`` into the output folder (unless ``no_report``); a
    failure is one warning (the run's results are written already)."""
    if not s.output_dir or s.no_report:
        return
    from mmfl_flwr.report import write_report

    try:
        write_report([s.output_dir], assignments_png=assignments_png)
    except Exception as err:  # noqa: BLE001 - the report never loses a run
        log(WARNING, "report.html not written: %s", " ".join(str(err).split()))


def _result_files(output_dir: str) -> list[Path]:
    """The run's result files (artifacts of the trackers)."""
    out = Path(output_dir)
    names = (*RUN_FILES, "config.json", "clusters.csv")
    return [out / n for n in names if (out / n).is_file()]


def prepare_output_folder(
    strategy: MultiModelStrategy,
    s: Settings,
    hub: LoggerHub,
    trackers: list[str],
    effective: dict[str, Any],
    engine: str | None,
    strategy_name: str | None,
) -> None:
    """Chain the round callbacks that write the run's files and stream its rounds
    to ``hub``; with an output folder, clear a fresh run's folder of an older
    run's files, write ``config.json`` and point the strategy's checkpoint there."""
    if hub or s.output_dir:
        events_csv = Path(s.output_dir, "events.csv") if s.output_dir else None
        strategy.on_round_end = _with_loggers(strategy, hub, events_csv)
    if not s.output_dir:
        return
    strategy.on_round_end = _with_round_files(strategy, s, effective, strategy_name)
    strategy.on_round_end = _with_cluster_records(strategy, s.output_dir)
    if not s.resume_from:  # a fresh run: no records of an older run
        for old in Path(s.output_dir).glob("clusters*"):
            if old.name == "clusters.csv" or old.name.startswith("clusters_round_"):
                old.unlink()
        for old_file in RUN_FILES:
            Path(s.output_dir, old_file).unlink(missing_ok=True)
        if "tensorboard" in trackers and not s.log_dir:  # the default, in the folder
            for old in Path(s.output_dir, "tensorboard").glob("events.out.tfevents.*"):
                old.unlink()
    os.makedirs(s.output_dir, exist_ok=True)
    s.save(os.path.join(s.output_dir, "config.json"), effective, engine)
    strategy.checkpoint_path = os.path.join(s.output_dir, CHECKPOINT_FILE)


def _with_cluster_records(
    strategy: MultiModelStrategy, output_dir: str
) -> Callable[[int, list[dict[str, Any]]], None]:
    """Wrap the round callback: after every clustering of the policy (MMFL-Group's
    C-steps, :meth:`~mmfl_flwr.core.policy.Policy.cluster_steps`), write its
    cluster assignment and PCA plot into ``output_dir``."""
    from mmfl_flwr.results import write_cluster_step

    inner = strategy.on_round_end

    def callback(rnd: int, rows: list[dict[str, Any]]) -> None:
        for cstep in strategy.policy.cluster_steps():
            if cstep["round"] == rnd:
                write_cluster_step(cstep, output_dir)
        if inner is not None:
            inner(rnd, rows)

    return callback


#: The per-round plot is redrawn at most this often (seconds); the tables after
#: every round, everything at the end of the run.
PLOT_EVERY_SECONDS = 10.0


def _with_round_files(
    strategy: MultiModelStrategy,
    s: Settings,
    effective: dict[str, Any],
    strategy_name: str | None,
) -> Callable[[int, list[dict[str, Any]]], None]:
    """Wrap the round callback: after every round, write ``metrics.csv`` and
    ``assignments.csv`` of the rounds so far into ``s.output_dir`` and redraw
    ``accuracy.png`` (at most every :data:`PLOT_EVERY_SECONDS`), so an
    interrupted run shows what it did (``summary.json`` comes at the end)."""
    from mmfl_flwr.results import plot_accuracy, write_assignments_csv, write_metrics_csv

    inner = strategy.on_round_end
    out = Path(s.output_dir)
    last_plot = [-math.inf]

    def callback(rnd: int, rows: list[dict[str, Any]]) -> None:
        result = strategy.result
        if result is not None:
            write_metrics_csv(result.history, out / "metrics.csv")
            write_assignments_csv(result.assignments, out / "assignments.csv")
            if time.monotonic() - last_plot[0] >= PLOT_EVERY_SECONDS:
                plot_accuracy(result.history, out / "accuracy.png", s, strategy_name, effective)
                last_plot[0] = time.monotonic()
        if inner is not None:
            inner(rnd, rows)

    return callback


def files_after_a_stop(s: Settings) -> None:
    """After mmfl run ended the simulation engine's processes (Ctrl-C, SIGTERM),
    whose ServerApp never saw the interrupt: what the in-process engine's
    interrupt leaves. No half-written file (``*.tmp`` of the run's files), the
    CSVs holding exactly the checkpoint's rounds, and ``report.html`` of them."""
    if not s.output_dir:
        return
    for name in (*RUN_FILES, CHECKPOINT_FILE, "config.json"):
        Path(s.output_dir, f"{name}.tmp").unlink(missing_ok=True)
    _files_of_finished_rounds(s.output_dir)
    _report(s)


def _files_of_finished_rounds(output_dir: str) -> None:
    """After an interrupt: ``metrics.csv``, ``assignments.csv`` and ``events.csv`` hold exactly the
    rounds of the checkpoint (the interrupt may have come between a round's
    checkpoint and its files)."""
    from mmfl_flwr.checkpoint import load_checkpoint
    from mmfl_flwr.results import write_assignments_csv, write_events_csv, write_metrics_csv
    from mmfl_flwr.strategy.events import DefenceLog

    try:
        state = load_checkpoint(output_dir)
    except Exception:  # noqa: BLE001 - no round finished: nothing to show
        return
    write_metrics_csv(state["history"], Path(output_dir, "metrics.csv"))
    write_assignments_csv(state["assignments"], Path(output_dir, "assignments.csv"))
    defence = DefenceLog()
    defence.load_state_dict(state.get("defence", {}))
    write_events_csv(defence.events, Path(output_dir, "events.csv"))
