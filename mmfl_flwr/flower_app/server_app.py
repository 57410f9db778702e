"""ServerApp of the Flower App: an MMFL run on the embedded default tasks.

Reads :class:`~mmfl_flwr.config.Settings` from ``context.run_config``, runs the
chosen preset strategy over all models, evaluates every model on its server-side
test set each round, and writes ``metrics.csv``, ``summary.json`` and
``accuracy.png`` into ``output-dir``. Nothing is written before the settings, the
checkpoint to resume (if any) and the data have been checked. The strategy is
torch-free; torch is only imported here to make initial weights and evaluate.
The files of the output folder (its checks, the round callbacks that write
them, ``report.html``) are :mod:`mmfl_flwr.flower_app.run_files`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from mmfl_flwr.checkpoint import checkpoint_file
from mmfl_flwr.config import Settings
from mmfl_flwr.core.card import card, check_unused_settings
from mmfl_flwr.core.scaffold import ScaffoldAggregator
from mmfl_flwr.flower_app.app_folder import LAUNCH_DIR_KEY
from mmfl_flwr.flower_app.data import effective_settings, resolved_budget, warn_if_few_uploads
from mmfl_flwr.flower_app.run_files import PLOT_EVERY_SECONDS as PLOT_EVERY_SECONDS
from mmfl_flwr.flower_app.run_files import RUN_FILES as RUN_FILES
from mmfl_flwr.flower_app.run_files import _files_of_finished_rounds as _files_of_finished_rounds
from mmfl_flwr.flower_app.run_files import _report as _report
from mmfl_flwr.flower_app.run_files import _result_files, prepare_output_folder
from mmfl_flwr.flower_app.run_files import check_output_folder as check_output_folder
from mmfl_flwr.flower_app.run_files import check_output_location as check_output_location
from mmfl_flwr.presets import build
from mmfl_flwr.records import arrays_to_numpy, numpy_to_arrays
from mmfl_flwr.strategy import MultiModelResult, MultiModelStrategy
from mmfl_flwr.tasks.registry import load_snapshot
from mmfl_flwr.tracking import LoggerHub, RunInfo, RunLogger

if TYPE_CHECKING:
    from mmfl_flwr.tracking.progress import ProgressBar


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
        # mmfl run's simulation engine runs this in another folder than its own
        base = s.extra.get(LAUNCH_DIR_KEY)
        s.check_resumes(
            Settings.load(str(stored)), str(target.parent), base if isinstance(base, str) else None
        )
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


def _run_server(
    grid: Grid,
    context: Context,
    settings: Settings | None,
    strategy: MultiModelStrategy | None,
    engine: str | None,
    loggers: Sequence[RunLogger] = (),
) -> MultiModelResult:
    """The run of :func:`server_main`: every check, then the rounds, then the outputs."""
    from mmfl_flwr.tracking import LoggerHub, check_installed, make_logger, parse_log_to

    load_snapshot(context.run_config)  # tasks registered by the process that started the run
    engine = engine or os.environ.get(ENGINE_ENV) or None
    s = settings if settings is not None else _settings_of(context)
    custom = strategy is not None  # not the preset that s names (the plot title says so)
    if strategy is None:
        strategy = strategy_from_settings(s)
    runner = private(strategy, s)
    done = _resumed_rounds(s, strategy, runner)
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
    bar = _show_rounds(strategy, s, done, custom)
    hub = LoggerHub(list(loggers), s.log_clients_every)
    try:
        hub.loggers += [make_logger(n) for n in trackers]
        prepare_output_folder(strategy, s, hub, trackers, effective, engine, name)
        hub.start(_run_info(s, effective, engine, done))
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
        summary = _write_results(result, s, hub, effective, engine, name)
        if s.output_dir:  # the last line, which mmfl run's simulation launcher waits for
            print(f"[mmfl] results written to {os.path.abspath(s.output_dir)}", flush=True)
        _finish_hub(hub, "finished", strategy, s, summary)
    finally:
        if bar is not None:
            bar.close()
        _finish_hub(hub, "failed", strategy, s, None)  # no-op when finished above
    sys.stdout.flush()
    return result


def _settings_of(context: Context) -> Settings:
    """The settings of ``context.run_config``; invalid ones are logged in one line."""
    try:
        return Settings.from_run_config(context.run_config)
    except ValueError as err:
        # flwr run exits 0 whatever the ServerApp raises: say it in one line first
        log(ERROR, "mmfl: invalid run-config, the run stops: %s", err)
        raise


def _resumed_rounds(s: Settings, strategy: MultiModelStrategy, runner: Any) -> int:
    """The rounds already done of the checkpoint that ``s`` resumes (0 for a fresh run)."""
    if not s.resume_from:
        return 0
    done = check_resume(s, runner)
    if isinstance(strategy.aggregator, ScaffoldAggregator):
        log(
            WARNING,
            "Resuming SCAFFOLD: the clients' control variates c_i are not "
            "in the server checkpoint; they restart from zero",
        )
    return done


def _show_rounds(
    strategy: MultiModelStrategy, s: Settings, done: int, custom: bool
) -> ProgressBar | None:
    """Set how the rounds show on the console: every defence action at INFO under
    ``--verbose``; for a preset, a progress bar (returned) or one line per round."""
    from mmfl_flwr.tracking.progress import ProgressBar, use_bar

    if os.environ.get(VERBOSE_ENV) == "1":  # mmfl run --verbose: every defence action
        strategy.action_level = INFO
    if custom:  # a custom strategy keeps its own callback
        return None
    if use_bar(s.no_progress):
        bar = ProgressBar(s.num_rounds, done, defence_counter(strategy))
        strategy.on_round_end = bar
        return bar
    strategy.on_round_end = progress_printer(s.num_rounds, defence_counter(strategy))
    return None


def _run_info(s: Settings, effective: dict[str, Any], engine: str | None, done: int) -> RunInfo:
    """What the trackers are told of the run when it starts."""
    from mmfl_flwr.tracking import run_params as tracking_params

    run_name = Path(s.output_dir).resolve().name if s.output_dir else f"{s.strategy}-seed{s.seed}"
    return RunInfo(
        name=run_name,
        params=tracking_params(s, effective, engine),
        models=s.model_names,
        num_rounds=s.num_rounds,
        start_round=done,
        output_dir=Path(s.output_dir) if s.output_dir else None,
        settings=s,
    )


def _write_results(
    result: MultiModelResult,
    s: Settings,
    hub: LoggerHub,
    effective: dict[str, Any],
    engine: str | None,
    name: str | None,
) -> dict[str, Any] | None:
    """The run's outputs at its end (the privacy line, the output folder's files,
    report.html); returns its summary where it is written or a tracker needs it.
    The line that says where the results are is :func:`_run_server`'s."""
    from mmfl_flwr.results import summarize, write_outputs

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
    elif hub:
        summary = summarize(result, s, effective, engine)
    return summary


def _finish_hub(
    hub: LoggerHub,
    status: str,
    strategy: MultiModelStrategy,
    s: Settings,
    summary: dict[str, Any] | None,
) -> None:
    """Tell the trackers how the run ended, with its last round and result files."""
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
