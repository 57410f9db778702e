"""The rounds of :meth:`MultiModelStrategy.start`, in order, each phase timed.

:func:`drive` starts a run (fresh, or resumed from a checkpoint) and runs its
rounds. Every strategy hook is called on ``hooks`` (the strategy, or a wrapper
whose ``start()`` runs it) through a :class:`HookCaller`, which turns what an
override raises, or returns that the round cannot use, into one
:class:`~.state.HookError` naming it. The phases themselves live in their own
modules (:mod:`.registration`, :mod:`.loss_query`, :mod:`.train`,
:mod:`.validation`, :mod:`.aggregate`, :mod:`.evaluate`, :mod:`.persist`); this
module orders them and times each one for :mod:`.timing`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass
from logging import INFO
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from mmfl_flwr import protocol as P
from mmfl_flwr.config import check_option
from mmfl_flwr.strategy import aggregate, evaluate, persist, registration, settings, validation
from mmfl_flwr.strategy.loss_query import install_losses
from mmfl_flwr.strategy.result import EvaluateFn, MultiModelResult
from mmfl_flwr.strategy.state import HookError
from mmfl_flwr.strategy.timing import PHASE_OBSERVERS, report, round_trip, timed

if TYPE_CHECKING:
    from mmfl_flwr.strategy.host import StrategyHost


@dataclass(frozen=True)
class HookCaller:
    """Calls the strategy hooks of ``hooks`` and checks what they return.

    ``base`` is the class whose own hooks are called as they are (an error in
    them is the strategy's, not an override's)."""

    hooks: object
    base: type

    @property
    def name(self) -> str:
        """The class name the errors give for the hooks."""
        return type(self.hooks).__name__

    def call(self, name: str, rnd: int, *args: Any) -> Any:
        """``hooks.<name>(rnd, *args)``; what an override (or a wrapper) raises
        becomes one :class:`HookError` naming it."""
        fn = getattr(self.hooks, name)
        if getattr(type(self.hooks), name, None) is getattr(self.base, name):
            return fn(rnd, *args)
        try:
            return fn(rnd, *args)
        except HookError:
            raise
        except Exception as err:
            raise HookError(
                f"{self.name}.{name} (round {rnd}) raised {type(err).__name__}: {err}"
            ) from err

    def messages(self, name: str, rnd: int, *args: Any) -> list[Message]:
        """The Flower Messages a ``configure_*`` hook returns (None: none)."""
        msgs = self.call(name, rnd, *args)
        msgs = list(msgs) if msgs is not None else []
        bad = [m for m in msgs if not isinstance(m, Message)]
        if bad:
            raise HookError(
                f"{self.name}.{name} (round {rnd}) returned "
                f"{type(bad[0]).__name__}: expected Flower Messages"
            )
        return msgs

    def metrics(self, name: str, rnd: int, value: object) -> MetricRecord | None:
        """``value`` if it is a MetricRecord or None; else a :class:`HookError`."""
        if value is not None and not isinstance(value, MetricRecord):
            raise HookError(
                f"{self.name}.{name} (round {rnd}) returned "
                f"{type(value).__name__} as metrics: expected a MetricRecord or None"
            )
        return value

    def pair(self, rnd: int, value: object) -> tuple[object, MetricRecord | None]:
        """The ``(models, metrics)`` pair ``aggregate_train`` returned, checked."""
        if not (isinstance(value, tuple) and len(value) == 2):
            raise HookError(
                f"{self.name}.aggregate_train (round {rnd}) returned "
                f"{type(value).__name__}: expected (models, metrics)"
            )
        return value[0], self.metrics("aggregate_train", rnd, value[1])


@dataclass(frozen=True)
class Run:
    """What every round of one ``start()`` reads: the strategy, its hooks and
    ``start()``'s arguments."""

    strategy: StrategyHost
    hooks: HookCaller
    grid: Grid
    num_rounds: int
    timeout: float
    train_config: ConfigRecord | None
    evaluate_config: ConfigRecord | None
    evaluate_fn: EvaluateFn | None
    result: MultiModelResult


def drive(
    strategy: StrategyHost,
    hooks: object,
    grid: Grid,
    initial_arrays: Mapping[str, ArrayRecord],
    num_rounds: int,
    timeout: float,
    train_config: ConfigRecord | None,
    evaluate_config: ConfigRecord | None,
    evaluate_fn: EvaluateFn | None,
    resume_from: str | None,
) -> MultiModelResult:
    """The rounds of :meth:`~.MultiModelStrategy.start`, with every hook called
    on ``hooks`` (``strategy``, or a wrapper around it)."""
    check_option("num_rounds", num_rounds)  # as mmfl run checks them
    check_option("timeout", timeout)
    if isinstance(initial_arrays, ArrayRecord):
        raise TypeError(
            "MultiModelStrategy.start() takes one ArrayRecord per model, as a mapping "
            "{'model-name': arrays}; it was given one ArrayRecord (FedAvg's "
            "initial_arrays). For a single model pass {'model-name': arrays}, with "
            "the name the ClientApp uses for it"
        )
    result, first = _start(strategy, hooks, initial_arrays, resume_from)
    run_state = strategy.run_state
    result.events = run_state.defence.events
    result.received = run_state.defence.received
    log(
        INFO,
        "Starting %s over %d models for %d rounds",
        type(strategy).__name__,
        len(run_state.tasks),
        num_rounds,
    )
    hooks.summary()  # type: ignore[attr-defined]
    if resume_from is None:
        finish_round(strategy, 0, evaluate.initial_rows(run_state, evaluate_fn, result), result)
    # the class whose hooks are the defaults: the furthest base defining the rounds
    # (MultiModelStrategy; named without importing its module, which imports this one)
    base = [c for c in type(strategy).__mro__ if "_drive" in vars(c)][-1]
    run = Run(
        strategy,
        HookCaller(hooks, base),
        grid,
        num_rounds,
        timeout,
        train_config,
        evaluate_config,
        evaluate_fn,
        result,
    )
    unheld: set[str] = set()  # models named as held by no client
    run_state.needed_handlers = (
        ["train"]
        + ([P.QUERY_LOSSES] if strategy.policy.needs_losses else [])
        + (["evaluate"] if strategy.fraction_evaluate > 0 else [])
    )
    for rnd in range(first, num_rounds + 1):
        _round(run, rnd, unheld)
    run_state.defence.finish()
    result.arrays = dict(run_state.arrays)
    return result


def _start(
    strategy: StrategyHost,
    hooks: object,
    initial_arrays: Mapping[str, ArrayRecord],
    resume_from: str | None,
) -> tuple[MultiModelResult, int]:
    """Make ``strategy`` ready for a fresh run (a second ``start()`` gets fresh
    copies of the policy and aggregator, and a new run state) and install its
    models, or a checkpoint's; returns the new result and the first round."""
    if strategy._runs:
        strategy.policy = copy.deepcopy(strategy._templates[0])
        strategy.aggregator = copy.deepcopy(strategy._templates[1])
        strategy.run_state = settings.new_run_state(strategy)
    strategy._runs += 1
    strategy._hooks = hooks
    if hooks is not strategy and hasattr(hooks, "prepare_run"):
        hooks.prepare_run(strategy.run_state)
    strategy._plans.clear()
    strategy._rows.clear()
    run_state = strategy.run_state
    if resume_from is None and set(run_state.task_arrivals) - set(initial_arrays or {}):
        raise ValueError(
            f"task_arrivals names unknown tasks "
            f"{sorted(set(run_state.task_arrivals) - set(initial_arrays or {}))}"
        )
    result = strategy.result = MultiModelResult()
    run_state.defence.level = strategy.action_level
    first = 1
    if resume_from is not None:
        state = strategy.check_resumable(resume_from, hooks)
        first = persist.restore(run_state, strategy.policy, strategy.aggregator, state, result) + 1
        if hooks is not strategy and hasattr(hooks, "load_wrapper_state"):
            hooks.load_wrapper_state(state.get("wrapper_state", {}), result)
        log(
            INFO,
            "Resuming %s from %s after round %d",
            type(strategy).__name__,
            resume_from,
            first - 1,
        )
    else:
        run_state.set_models(initial_arrays)
    return result, first


def _round(run: Run, rnd: int, unheld: set[str]) -> None:
    """Round ``rnd``: registration, the loss query (loss-based policies), the
    assignment and train round trip, aggregation, client-side evaluation (on
    evaluation rounds) and the round's rows; ``unheld`` keeps the models already
    named as held by no client."""
    strategy, run_state = run.strategy, run.strategy.run_state
    t0 = time.monotonic()
    t_round = time.perf_counter()
    run_state.current_round = run_state.defence.round = rnd
    log(INFO, "")
    log(INFO, "[ROUND %s/%s]", rnd, run.num_rounds)
    with timed(rnd, "registration"):
        registration.refresh_clients(
            run_state,
            run.grid,
            rnd,
            run.timeout,
            strategy.min_available_nodes,
            strategy.node_wait_timeout,
            strategy.min_available_clients,
        )
        validation.apply_count_cap(run_state.table, strategy.limits.count_cap, run_state.defence)
    registration.warn_unheld_models(run_state, unheld)
    log(INFO, "%d clients online", len(run_state.table.ids()))
    if strategy.policy.needs_losses:
        _query_losses(run, rnd)
    rows = _train(run, rnd)
    evaluated = rnd % strategy.evaluate_every == 0 or rnd == run.num_rounds
    with timed(rnd, "client_eval"):
        client_eval = _client_eval(run, rnd) if evaluated else None
    seconds = time.monotonic() - t0
    with timed(rnd, "server_eval"):
        rows_out = evaluate.round_rows(
            run_state, rnd, rows, evaluated, run.evaluate_fn, client_eval, run.result, seconds
        )
    if PHASE_OBSERVERS:
        report(rnd, "round", time.perf_counter() - t_round)
    run_state.defence.end_round(rnd, rows_out)
    finish_round(strategy, rnd, rows_out, run.result)


def _query_losses(run: Run, rnd: int) -> None:
    """The loss query of round ``rnd``: its messages, replies and accepted losses,
    installed in the client table; clients lacking a loss handler leave the round."""
    strategy, run_state, hooks = run.strategy, run.strategy.run_state, run.hooks
    with timed(rnd, "loss_query"):
        msgs = hooks.messages(
            "configure_loss_query", rnd, strategy.models(), ConfigRecord(), run.grid
        )
        replies = round_trip(run.grid, msgs, run.timeout, rnd) if msgs else []
        losses = hooks.call("aggregate_loss_query", rnd, replies)
        n = install_losses(
            run_state,
            losses if losses is not None else RecordDict(),
            rnd,
            strategy.limits.max_loss,
            f"{hooks.name}.aggregate_loss_query",
        )
    log(INFO, "Loss query: %d (client, task) losses received", n)
    # clients without a loss handler: out of this round's assignment too
    registration.leave_out_lacking(run_state)


def _train(run: Run, rnd: int) -> dict[str, dict[str, Any]]:
    """The assignment, train round trip and aggregation of round ``rnd``; the new
    models are checked and installed. Returns the round's per-model rows."""
    strategy, run_state, hooks, result = (
        run.strategy,
        run.strategy.run_state,
        run.hooks,
        run.result,
    )
    with timed(rnd, "plan"):
        msgs = hooks.messages(
            "configure_train",
            rnd,
            strategy.models(),
            run.train_config or ConfigRecord(),
            run.grid,
        )
    plan = strategy._plans.get(rnd)
    picks = plan.picks if plan is not None else []
    result.assignments[rnd] = [(p.cid, p.task, p.count) for p in picks]
    log(INFO, "configure_train: %d picks on %d nodes", len(picks), len(msgs))
    with timed(rnd, "train"):
        replies = round_trip(run.grid, msgs, run.timeout, rnd) if msgs else []
    with timed(rnd, "aggregate"):
        models, metrics = hooks.pair(rnd, hooks.call("aggregate_train", rnd, replies))
        # no client has a train handler: stop before this round finishes
        registration.stop_unless_a_client_can_serve(run_state)
        done = strategy._rows.pop(rnd, None)
        if done is None:
            raise HookError(
                f"{hooks.name}.aggregate_train (round {rnd}) did not call "
                "MultiModelStrategy.aggregate_train (super()), which "
                "validates and aggregates the replies"
            )
        rows, produced = done
        new = aggregate.checked_models(run_state, models, f"{hooks.name}.aggregate_train", produced)
        aggregate.install_models(run_state, new, rows)
    result.rejections[rnd] = list(run_state.rejected_parts)
    result.train_metrics_clientapp[rnd] = {
        "all": metrics if metrics is not None else MetricRecord()
    }
    return rows


def _client_eval(run: Run, rnd: int) -> MetricRecord | None:
    """Client-side evaluation of an evaluation round: the messages, the replies
    and the metrics ``aggregate_evaluate`` makes of them (None without any)."""
    strategy, hooks = run.strategy, run.hooks
    msgs = hooks.messages(
        "configure_evaluate",
        rnd,
        strategy.models(),
        run.evaluate_config or ConfigRecord(),
        run.grid,
    )
    if not msgs:
        return None
    client_eval = hooks.metrics(
        "aggregate_evaluate",
        rnd,
        hooks.call("aggregate_evaluate", rnd, round_trip(run.grid, msgs, run.timeout, rnd)),
    )
    if client_eval is not None:
        run.result.evaluate_metrics_clientapp[rnd] = {"all": client_eval}
    registration.stop_unless_a_client_can_serve(strategy.run_state)
    return client_eval


def finish_round(
    strategy: StrategyHost, rnd: int, rows: list[dict[str, Any]], result: MultiModelResult
) -> None:
    """Add round ``rnd``'s rows to the history, write the checkpoint (with a
    ``checkpoint_path``) and call ``on_round_end``."""
    result.history.extend(rows)
    if strategy.checkpoint_path:
        strategy.save_checkpoint(rnd, result)
    if strategy.on_round_end:
        strategy.on_round_end(rnd, rows)
