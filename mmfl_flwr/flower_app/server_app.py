"""ServerApp of the Flower App: an MMFL run on the embedded default tasks.

Reads :class:`~mmfl_flwr.config.Settings` from ``context.run_config``, runs the
chosen preset strategy over all models, evaluates every model on its server-side
test set each round, and writes ``metrics.csv``, ``summary.json`` and
``accuracy.png`` into ``output-dir``. Nothing is written before the settings, the
checkpoint to resume (if any) and the data have been checked. The strategy is
torch-free; torch is only imported here to make initial weights and evaluate.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from mmfl_flwr.checkpoint import CHECKPOINT_FILE, checkpoint_file
from mmfl_flwr.config import Settings
from mmfl_flwr.core.card import card, check_unused_settings
from mmfl_flwr.core.scaffold import ScaffoldAggregator
from mmfl_flwr.flower_app.data import effective_settings, resolved_budget, warn_if_few_uploads
from mmfl_flwr.presets import build
from mmfl_flwr.records import arrays_to_numpy, numpy_to_arrays
from mmfl_flwr.strategy import MultiModelResult, MultiModelStrategy
from mmfl_flwr.tasks.registry import load_snapshot
from mmfl_flwr.tracking import LoggerHub, RunLogger


def strategy_from_settings(
    s: Settings, on_round_end: Callable[[int, list[dict[str, Any]]], None] | None = None
) -> MultiModelStrategy:
    """The preset strategy that ``s`` names, built by its algorithm card with
    its parameters (``budget-fraction`` 0 resolved from the federation,
    :func:`~mmfl_flwr.flower_app.data.resolved_budget`)."""
    s = resolved_budget(s)
    kwargs: dict[str, Any] = {
        "local_epochs": s.local_epochs,
        "lr": s.lr,
        "batch_size": s.batch_size,
        "seed": s.seed,
        "fraction_evaluate": s.fraction_evaluate,
        "min_available_clients": s.num_clients,
        "on_round_end": on_round_end,
        **{name: value or None for name, value in s.bounds().items()},
    }
    if s.client_arrivals:
        kwargs["client_arrivals"] = s.client_arrival_rounds()
    if s.task_arrivals:
        kwargs["task_arrivals"] = s.task_arrival_rounds()
    if s.client_pins:
        kwargs["client_pins"] = s.client_pin_map()
    algorithm = card(s.strategy)
    values = dataclasses.asdict(s)
    check_unused_settings(algorithm, values, dataclasses.asdict(Settings()))
    kwargs.update(algorithm.settings_values(values))
    if s.aggregator:
        kwargs["aggregator"] = s.aggregator
    return build(algorithm, **kwargs)


#: the environment variable naming the engine to server_main (set by mmfl run)
ENGINE_ENV = "MMFL_ENGINE"


def private(strategy: MultiModelStrategy, s: Settings) -> Any:
    """``strategy`` in the per-model differential-privacy wrapper that ``s.dp``
    names (:mod:`mmfl_flwr.privacy`), or ``strategy`` itself without one."""
    if not s.dp:
        return strategy
    from mmfl_flwr import privacy as dp

    noise_seed = None if s.dp_noise_seed < 0 else s.dp_noise_seed
    if s.dp.endswith("fixed"):
        fixed = {
            "server-fixed": dp.DifferentialPrivacyServerSideFixedClipping,
            "client-fixed": dp.DifferentialPrivacyClientSideFixedClipping,
        }[s.dp]
        return fixed(
            strategy,
            s.dp_noise_multiplier,
            s.dp_clipping_norm,
            s.dp_sampled_clients,
            delta=s.dp_delta,
            noise_seed=noise_seed,
        )
    adaptive = {
        "server-adaptive": dp.DifferentialPrivacyServerSideAdaptiveClipping,
        "client-adaptive": dp.DifferentialPrivacyClientSideAdaptiveClipping,
    }[s.dp]
    return adaptive(
        strategy,
        s.dp_noise_multiplier,
        s.dp_sampled_clients,
        initial_clipping_norm=s.dp_clipping_norm,
        delta=s.dp_delta,
        noise_seed=noise_seed,
    )


def check_resume(s: Settings, strategy: Any) -> int:
    """Check that ``strategy``, set up from ``s``, may continue the checkpoint
    ``s.resume_from``; returns the last round the checkpoint finished.

    Raises ValueError (one line) when the checkpoint is unreadable, when the
    ``config.json`` beside it differs from ``s`` in a setting that a resumed run
    may not change (see :meth:`Settings.check_resumes`), when the checkpoint was
    written by another strategy or seed, or when ``num_rounds`` is below its
    round; FileNotFoundError when there is no checkpoint.
    """
    target = checkpoint_file(s.resume_from)
    stored = target.parent / "config.json"
    if stored.is_file():
        s.check_resumes(Settings.load(str(stored)), str(target.parent))
    done = int(strategy.check_resumable(s.resume_from)["round"])
    if s.num_rounds < done:
        raise ValueError(
            f"num-rounds={s.num_rounds} is below the {done} rounds that checkpoint "
            f"{target} has finished"
        )
    return done


def initial_arrays(s: Settings) -> dict[str, ArrayRecord]:
    """Seeded initial weights of every model.

    A model's initial weights depend only on the seed (``model_seed`` when it is set)
    and the model's name, so a model starts from the same weights whatever else is
    trained beside it (the single-model baselines compare like with like).
    """
    from mmfl_flwr.client.trainer import initial_weights
    from mmfl_flwr.flower_app.data import federation_for
    from mmfl_flwr.seeding import task_seed
    from mmfl_flwr.tasks.models import make_model

    fed = federation_for(s, clients=(), server_tests=True)  # the server holds no client's data
    seed = s.model_seed_used
    out = {}
    for task in fed.tasks:
        kind = fed.kinds[task]

        def model_fn(k: str = kind) -> Any:
            return make_model(k)

        out[task] = numpy_to_arrays(initial_weights(model_fn, task_seed(seed, task)))
    return out


def central_evaluator(s: Settings) -> Callable[[int, str, ArrayRecord], MetricRecord]:
    """Server-side evaluation of each model on its task's held-out test set."""
    from mmfl_flwr.client.trainer import evaluate_arrays
    from mmfl_flwr.flower_app.data import federation_for
    from mmfl_flwr.tasks.models import make_model

    fed = federation_for(s, clients=(), server_tests=True)  # the server holds no client's data

    def evaluate(server_round: int, task: str, arrays: ArrayRecord) -> MetricRecord:
        kind = fed.kinds[task]
        loss, acc = evaluate_arrays(
            lambda: make_model(kind), arrays_to_numpy(arrays), fed.server_test(task)
        )
        return MetricRecord({"loss": float(loss), "accuracy": float(acc)})

    return evaluate


def progress_printer(
    num_rounds: int, defence: Callable[[int], dict[str, int]] | None = None
) -> Callable[[int, list[dict[str, Any]]], None]:
    """A per-round progress line on stdout (where no progress bar is drawn:
    :mod:`mmfl_flwr.tracking.progress`); ``defence(round)``: the round's
    defence events counted by kind, shown on the line."""
    from mmfl_flwr.tracking.progress import line_printer

    return line_printer(num_rounds, defence)


def defence_counter(strategy: MultiModelStrategy) -> Callable[[int], dict[str, int]]:
    """``f(round)``: the round's defence events of ``strategy`` counted by kind
    (the progress line's ``clipped 2, rejected 0``)."""
    from mmfl_flwr.strategy.events import round_counts

    def counts(rnd: int) -> dict[str, int]:
        result = strategy.result
        return round_counts(e for e in (result.events if result else []) if e.round == rnd)

    return counts


#: Set (to 1) by ``mmfl run --verbose``: every defence action's line at INFO.
VERBOSE_ENV = "MMFL_VERBOSE"


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


def effective_clients_per_node(s: Settings, engine: str | None, run_config: Any) -> dict[str, Any]:
    """``{"clients-per-node": K}``, the clients per node that ``auto`` means on
    this run's engine (config.json's ``effective``; ``{}`` for a number typed):
    1 on the in-process engine, every client on the vectorized one, what mmfl
    run's simulation launcher chose (passed in the run config), else (flwr run,
    a SuperNode) each node's ``ceil(num-clients / num-partitions)``."""
    from mmfl_flwr.flower_app.launch import CLIENTS_PER_NODE_USED_KEY

    if s.clients_per_node_count() is not None:
        return {}
    chosen = (run_config or {}).get(CLIENTS_PER_NODE_USED_KEY)
    if engine == "inprocess":
        used: Any = 1
    elif engine == "vectorized":
        used = s.num_clients
    elif chosen is not None:
        used = int(chosen)
    else:
        used = "ceil(num-clients / num-partitions) of each node"
    return {"clients-per-node": used}


def privacy_line(privacy: dict[str, dict[str, float]]) -> str:
    """The console line of a run under a differential-privacy wrapper: each
    model's epsilon (at the run's delta) and its releases, as summary.json
    records them."""
    parts = []
    for task, p in privacy.items():
        eps = p.get("epsilon")
        spent = (
            "no noise, no guarantee"
            if eps is None or not math.isfinite(float(eps))
            else f"epsilon {float(eps):.3g}"
        )
        parts.append(f"{task} {spent} ({int(p.get('releases', 0))} releases)")
    deltas = {float(p["delta"]) for p in privacy.values() if "delta" in p}
    at = f" at delta {deltas.pop():g}" if len(deltas) == 1 else ""
    return f"[mmfl] privacy spent{at}: {', '.join(parts)}"


def check_output_location(output_dir: str) -> None:
    """Refuse an output folder that cannot hold a run's files: a file, a path
    under a file, or a folder that this process cannot write (permissions, a
    read-only file system). Probed by creating and removing a temporary entry
    in the folder (or, where it does not exist yet, in its nearest existing
    parent), so nothing is left behind. Raises ValueError (one line)."""
    import tempfile

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


def server_main(
    grid: Grid,
    context: Context,
    settings: Settings | None = None,
    strategy: MultiModelStrategy | None = None,
    engine: str | None = None,
    loggers: Sequence[RunLogger] = (),
) -> MultiModelResult:
    """Run the MMFL job described by ``settings`` (or ``context.run_config``).

    With ``strategy`` given, it is used instead of the preset that the settings
    name (the tasks, data, rounds and outputs still come from the settings).
    ``engine`` (else ``$MMFL_ENGINE``, which ``mmfl run`` sets for the simulation
    engine) is recorded in ``config.json`` and ``summary.json``. ``loggers``
    (:class:`~mmfl_flwr.tracking.RunLogger`) are called besides the trackers
    that ``settings.log_to`` names (:mod:`mmfl_flwr.tracking`).

    The settings, the checkpoint to resume, the trackers' packages and the data
    (initial weights, test sets) are all checked before anything is written into
    ``output_dir``, so a run that cannot start leaves an older run there as it
    was. numpy's BLAS runs on one thread meanwhile
    (:func:`~mmfl_flwr.client.threads.limit_blas_threads`: its spinning threads
    slowed every round beside other busy processes).
    """
    from mmfl_flwr.client.threads import limit_blas_threads

    with limit_blas_threads():
        return _run_server(grid, context, settings, strategy, engine, loggers)


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


def _run_server(
    grid: Grid,
    context: Context,
    settings: Settings | None,
    strategy: MultiModelStrategy | None,
    engine: str | None,
    loggers: Sequence[RunLogger] = (),
) -> MultiModelResult:
    from mmfl_flwr.results import summarize, write_outputs
    from mmfl_flwr.tracking import LoggerHub, RunInfo, check_installed, make_logger, parse_log_to
    from mmfl_flwr.tracking import run_params as tracking_params
    from mmfl_flwr.tracking.progress import ProgressBar, use_bar

    load_snapshot(context.run_config)  # tasks registered by the process that started the run
    engine = engine or os.environ.get(ENGINE_ENV) or None
    if settings is not None:
        s = settings
    else:
        try:
            s = Settings.from_run_config(context.run_config)
        except ValueError as err:
            # flwr run exits 0 whatever the ServerApp raises: say it in one line first
            log(ERROR, "mmfl: invalid run-config, the run stops: %s", err)
            raise
    custom = strategy is not None  # not the preset that s names (the plot title says so)
    if strategy is None:
        strategy = strategy_from_settings(s)
    runner = private(strategy, s)
    done = 0
    if s.resume_from:
        done = check_resume(s, runner)
        if isinstance(strategy.aggregator, ScaffoldAggregator):
            log(
                WARNING,
                "Resuming SCAFFOLD: the clients' control variates c_i are not "
                "in the server checkpoint; they restart from zero",
            )
    check_output_folder(s)
    trackers = parse_log_to(s.log_to)
    check_installed(trackers)  # a missing extra: refused before anything is written
    arrays, evaluate_fn = initial_arrays(s), central_evaluator(s)  # loads the data
    if not custom:  # the preset that s names: warn when its budget is too small
        warn_if_few_uploads(s)
    effective = {} if custom else effective_settings(s)
    effective.update(effective_clients_per_node(s, engine, context.run_config))
    name = (
        f"custom {type(strategy.policy).__name__} + {type(strategy.aggregator).__name__}"
        if custom
        else None
    )
    bar: ProgressBar | None = None
    if os.environ.get(VERBOSE_ENV) == "1":  # mmfl run --verbose: every defence action
        strategy.action_level = INFO
    if not custom:  # a custom strategy keeps its own callback
        if use_bar(s.no_progress):
            bar = ProgressBar(s.num_rounds, done, defence_counter(strategy))
            strategy.on_round_end = bar
        else:
            strategy.on_round_end = progress_printer(s.num_rounds, defence_counter(strategy))
    hub = LoggerHub(list(loggers), s.log_clients_every)
    try:
        hub.loggers += [make_logger(n) for n in trackers]
        if hub or s.output_dir:
            events_csv = Path(s.output_dir, "events.csv") if s.output_dir else None
            strategy.on_round_end = _with_loggers(strategy, hub, events_csv)
        if s.output_dir:
            strategy.on_round_end = _with_round_files(strategy, s, effective, name)
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
        run_name = (
            Path(s.output_dir).resolve().name if s.output_dir else f"{s.strategy}-seed{s.seed}"
        )
        hub.start(
            RunInfo(
                name=run_name,
                params=tracking_params(s, effective, engine),
                models=s.model_names,
                num_rounds=s.num_rounds,
                start_round=done,
                output_dir=Path(s.output_dir) if s.output_dir else None,
                settings=s,
            )
        )
        try:
            result = runner.start(
                grid=grid,
                initial_arrays=arrays,
                num_rounds=s.num_rounds,
                timeout=s.timeout,
                evaluate_fn=evaluate_fn,
                resume_from=s.resume_from or None,
            )
        except KeyboardInterrupt:
            if bar is not None:
                bar.close()
                bar = None
            if s.output_dir:
                _files_of_finished_rounds(s.output_dir)
                _report(s)
            _finish_hub(hub, "interrupted", strategy, s, None)
            raise
        if bar is not None:
            bar.close()
            bar = None
        if result.privacy:  # a run under a DP wrapper: the budget spent, on the console too
            print(privacy_line(result.privacy), flush=True)
        summary = None
        if s.output_dir:
            out = write_outputs(
                result, s, s.output_dir, strategy_name=name, effective=effective, engine=engine
            )
            png = out / "assignments.png"
            _report(s, png.read_bytes() if png.is_file() else None)
            with open(out / "summary.json") as f:
                summary = json.load(f)
            print(f"[mmfl] results written to {os.path.abspath(out)}", flush=True)
        elif hub:
            summary = summarize(result, s, effective, engine)
        _finish_hub(hub, "finished", strategy, s, summary)
    finally:
        if bar is not None:
            bar.close()
        _finish_hub(hub, "failed", strategy, s, None)  # no-op when finished above
    sys.stdout.flush()
    return result


def _finish_hub(
    hub: LoggerHub,
    status: str,
    strategy: MultiModelStrategy,
    s: Settings,
    summary: dict[str, Any] | None,
) -> None:
    result = strategy.result
    assignments = result.assignments if result is not None else None
    last = max((int(r["round"]) for r in result.history), default=0) if result else 0
    hub.finish(
        status, last, assignments, summary, _result_files(s.output_dir) if s.output_dir else []
    )


def build_server_app(
    settings: Settings | None = None,
    holder: dict[str, Any] | None = None,
    loggers: Sequence[RunLogger] = (),
) -> ServerApp:
    """The ServerApp; with ``settings`` given, ``run_config`` is not read.
    The result is stored in ``holder["result"]`` when a dict is given."""
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        result = server_main(grid, context, settings, loggers=loggers)
        if holder is not None:
            holder["result"] = result

    return server


app = build_server_app()
