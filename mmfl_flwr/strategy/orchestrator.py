"""MultiModelStrategy: one Flower strategy that trains several models at once.

It orchestrates the phases of a round, each in its own module: registration
(:mod:`.registration`), loss query (:mod:`.loss_query`), assignment and train
round trip (:mod:`.train`), reply validation (:mod:`.validation`), aggregation
and round metrics (:mod:`.aggregate`), evaluation (:mod:`.evaluate`) and
checkpoints (:mod:`.persist`). State passes between them explicitly: a
:class:`~.run.RunState` per run and a :class:`~.run.RoundPlan` per round.
Imports flwr and numpy only (no torch).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping, Sequence
from logging import DEBUG, INFO
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from mmfl_flwr import protocol as P
from mmfl_flwr.config import check_option
from mmfl_flwr.core.aggregators import Aggregator, FedAvgAggregator
from mmfl_flwr.core.pairing import check_pairing
from mmfl_flwr.core.policy import Policy
from mmfl_flwr.core.random_allocation import RandomAllocation
from mmfl_flwr.records import numpy_to_arrays
from mmfl_flwr.strategy import aggregate, evaluate, persist, registration, train, validation
from mmfl_flwr.strategy.loss_query import accepted_losses, install_losses, loss_query_messages
from mmfl_flwr.strategy.result import EvaluateFn, MultiModelResult, RoundCallback
from mmfl_flwr.strategy.state import HookError, RoundPlan, RunState
from mmfl_flwr.strategy.timing import PHASE_OBSERVERS, report, round_trip, timed
from mmfl_flwr.strategy.validation import (
    DIRECTION_FACTOR,
    REVERSED_INFLUENCE_FACTOR,
    UPDATE_CLIP_FACTOR,
    Limits,
)


def _check_components(policy: object, aggregator: object) -> None:
    """A policy and an aggregator are objects (``MFARand()``, ``FedAvgAggregator()``),
    not names: a name is a TypeError pointing to the presets by name."""
    for what, obj, method, example in (
        ("policy", policy, "assign", "mmfl_flwr.MFARand()"),
        ("aggregator", aggregator, "aggregate", "mmfl_flwr.FedAvgAggregator()"),
    ):
        if obj is None:
            continue
        if isinstance(obj, str):
            from mmfl_flwr.core.card import AGGREGATORS, cards

            names = [c.name for c in cards()] if what == "policy" else list(AGGREGATORS)
            pointer = (
                "; to build a preset by name use mmfl_flwr.make_strategy(name, ...) "
                f"with one of {', '.join(names)}"
                if what == "policy"
                else f"; a preset factory takes aggregator= as a name, one of {', '.join(names)}"
            )
            raise TypeError(
                f"MultiModelStrategy({what}={obj!r}): {what} is a name; MultiModelStrategy "
                f"takes a {what} object (e.g. {example}){pointer}"
            )
        if isinstance(obj, type) or not callable(getattr(obj, method, None)):
            raise TypeError(
                f"MultiModelStrategy({what}={obj!r}): expected a {what} object with an "
                f"{method}() method (e.g. {example})"
            )


class MultiModelStrategy(Strategy):
    """Train several models at once over one shared pool of clients.

    Each round: register new nodes, query losses if the policy needs them, assign,
    send **one** train message per node with every model assigned to it, validate
    each (client, task) reply part, aggregate and evaluate. Each ``start()`` is a
    fresh run (new RNG from ``seed``, fresh copies of the policy and aggregator).

    The round runs through the Strategy hooks (``configure_loss_query`` /
    ``aggregate_loss_query``, ``configure_train`` / ``aggregate_train``,
    ``configure_evaluate`` / ``aggregate_evaluate``), so a subclass overrides them
    as it would FedAvg's; ``arrays`` and the models ``aggregate_train`` returns
    are a RecordDict of one ArrayRecord per model. For example, a server-side
    step on one model and a metric on every model::

        class DampedDigits(MultiModelStrategy):
            def aggregate_train(self, server_round, replies):
                models, metrics = super().aggregate_train(server_round, replies)
                rec = models["digits"]
                models["digits"] = ArrayRecord(
                    {k: Array(np.asarray(v * 0.5, v.dtype))
                     for k, v in zip(rec.keys(), rec.to_numpy_ndarrays())})
                for model in models.keys():
                    metrics[f"{model}.server-round"] = server_round
                return models, metrics

    What a hook returns is checked before it changes anything; an override that
    raises or returns what the round cannot use stops the run with one
    :class:`~.state.HookError` naming it. Differential privacy per model:
    :mod:`mmfl_flwr.privacy`.

    Parameters
    ----------
    policy : Policy, optional
        Who trains what (default: random allocation).
    aggregator : Aggregator, optional
        How each model's updates are combined (default: FedAvg). A pairing whose
        declared needs do not match is refused (:func:`~mmfl_flwr.core.pairing.check_pairing`).
    local_epochs, lr, batch_size : int, float, int
        Local training sent to the clients (defaults 1, 0.05, 32).
    seed : int
        Seeds every assignment draw and the clients' local training.
    fraction_evaluate : float
        Fraction of clients that also evaluate every model locally (default 0).
    evaluate_every : int
        Evaluate every this many rounds (the last round always).
    min_available_nodes, node_wait_timeout : int, float
        Before the first round, wait at most ``node_wait_timeout`` seconds for
        this many nodes; later rounds use whoever is online.
    min_available_clients : int
        Before the first round, also wait (within ``node_wait_timeout``) until
        this many clients are registered: a node hosting a shard of clients
        counts each of them (default 0: no wait for clients).
    max_loss, loss_cap, max_update_norm, update_norm_factor, count_cap, update_clip_factor,
    direction_factor, influence_clip_factor, reversed_influence_factor
        Bounds on what clients report (:class:`~.validation.Limits` documents
        them), each action recorded as a defence event with the client id
        (``result.events``; its line at :attr:`action_level`, DEBUG:
        :mod:`.events`).
    on_round_end : callable, optional
        ``f(server_round, rows)`` after each round (progress display).
    checkpoint_path : str, optional
        File or folder where the whole state is written atomically after every
        round; ``start(..., resume_from=path)`` continues from it.
    client_arrivals, task_arrivals : mapping, optional
        Client id / task -> first round it takes part in (simulated arrivals;
        MMFL-Group admits a task at its next cycle boundary).
    trainable_keys : mapping, optional
        Task -> keys of its trainable parameters; only these form the update
        ``G`` (norms, beta, ``d/(B p)``, control variates), the other entries
        (batch-norm statistics, counters) are averaged by sample count. Without
        it the first client declaring them (``trainable.<task>``) sets them.
    client_pins : mapping, optional
        Client id -> ``token:<sha256>`` of its ``client-token`` or ``key:<sha256>``
        of its SuperNode's public key (:func:`~.registration.token_pin`,
        :func:`~.registration.key_pin`); a claim of a pinned id without it is
        refused, and the pinned client always gets its id back.
    """

    def __init__(
        self,
        policy: Policy | None = None,
        aggregator: Aggregator | None = None,
        *,
        local_epochs: int = 1,
        lr: float = 0.05,
        batch_size: int = 32,
        seed: int = 0,
        fraction_evaluate: float = 0.0,
        evaluate_every: int = 1,
        min_available_nodes: int = 1,
        min_available_clients: int = 0,
        node_wait_timeout: float = 60.0,
        max_loss: float = 1e6,
        on_round_end: RoundCallback | None = None,
        checkpoint_path: str | None = None,
        loss_cap: float | None = 10.0,
        max_update_norm: float | None = None,
        update_norm_factor: float | None = 100.0,
        count_cap: float | None = 200.0,
        update_clip_factor: float | None = UPDATE_CLIP_FACTOR,
        direction_factor: float | None = DIRECTION_FACTOR,
        influence_clip_factor: float | None = None,
        reversed_influence_factor: float | None = REVERSED_INFLUENCE_FACTOR,
        client_arrivals: Mapping[str, int] | None = None,
        task_arrivals: Mapping[str, int] | None = None,
        trainable_keys: Mapping[str, Sequence[str]] | None = None,
        client_pins: Mapping[str, str] | None = None,
    ) -> None:
        _check_components(policy, aggregator)
        # the settings among the keywords: checked by the option table of mmfl run
        # (one message on every surface); a defence at 0 is off, as on the command line
        for name, value in (
            ("local_epochs", local_epochs),
            ("lr", lr),
            ("batch_size", batch_size),
            ("seed", seed),
            ("fraction_evaluate", fraction_evaluate),
        ):
            check_option(name, value)
        defences: dict[str, float | None] = {
            "loss_cap": loss_cap,
            "max_update_norm": max_update_norm,
            "update_norm_factor": update_norm_factor,
            "count_cap": count_cap,
            "update_clip_factor": update_clip_factor,
            "direction_factor": direction_factor,
            "influence_clip_factor": influence_clip_factor,
            "reversed_influence_factor": reversed_influence_factor,
        }
        for name, bound in defences.items():
            if bound is not None:
                check_option(name, bound)
                if bound == 0:
                    defences[name] = None
        (
            loss_cap,
            max_update_norm,
            update_norm_factor,
            count_cap,
            update_clip_factor,
            direction_factor,
            influence_clip_factor,
            reversed_influence_factor,
        ) = defences.values()
        if not 0.0 <= fraction_evaluate <= 1.0:
            raise ValueError(f"fraction_evaluate must be in [0, 1], got {fraction_evaluate}")
        if evaluate_every < 1:
            raise ValueError(f"evaluate_every must be >= 1, got {evaluate_every}")
        self.policy = policy if policy is not None else RandomAllocation()
        self.aggregator = aggregator if aggregator is not None else FedAvgAggregator()
        check_pairing(self.policy, self.aggregator)
        self._templates = (copy.deepcopy(self.policy), copy.deepcopy(self.aggregator))
        self.train_config = train.TrainConfig(
            int(local_epochs), float(lr), int(batch_size), int(seed)
        )
        self.seed = int(seed)
        self.fraction_evaluate = float(fraction_evaluate)
        self.evaluate_every = int(evaluate_every)
        self.min_available_nodes = int(min_available_nodes)
        self.min_available_clients = int(min_available_clients)
        if self.min_available_nodes < 0 or self.min_available_clients < 0:
            raise ValueError("min_available_nodes and min_available_clients must be >= 0")
        self.node_wait_timeout = float(node_wait_timeout)
        self.limits = Limits(
            float(max_loss),
            loss_cap,
            max_update_norm,
            update_norm_factor,
            count_cap,
            update_clip_factor,
            direction_factor,
            influence_clip_factor,
            reversed_influence_factor,
        )  # checks them
        self.on_round_end = on_round_end
        self.checkpoint_path = checkpoint_path
        self._arrivals = (
            {str(k): int(v) for k, v in (task_arrivals or {}).items()},
            {str(k): int(v) for k, v in (client_arrivals or {}).items()},
        )
        self._trainable = {str(t): [str(k) for k in ks] for t, ks in (trainable_keys or {}).items()}
        self._pins = registration.check_pins(client_pins)
        self.run_state = self._new_run_state()
        self._runs = 0
        # the round's assignment (configure_train -> aggregate_train) and its
        # metrics rows and aggregated models (aggregate_train -> start)
        self._plans: dict[int, RoundPlan] = {}
        self._rows: dict[int, tuple[dict[str, dict[str, Any]], dict[str, Any]]] = {}
        self._hooks: object = self  # whose hooks the rounds call (a wrapper's, in one)
        #: the result of the latest :meth:`start`, filled as its rounds finish (an
        #: interrupted run's history so far; the final weights at its end)
        self.result: MultiModelResult | None = None
        #: the level of each defence action's own log line (:mod:`.events`): DEBUG;
        #: ``mmfl run --verbose`` sets INFO
        self.action_level = DEBUG

    def _new_run_state(self) -> RunState:
        return RunState(
            self.seed,
            *self._arrivals,
            pinned_trainable=dict(self._trainable),
            client_pins=dict(self._pins),
        )

    # views of the current run (see RunState)
    weights = property(lambda self: self.run_state.weights, doc="Global weights per task (numpy).")
    table = property(lambda self: self.run_state.table, doc="The client table of the current run.")
    trainable = property(lambda self: self.run_state.trainable, doc="Task -> trainable keys.")

    def set_models(self, initial_arrays: Mapping[str, ArrayRecord]) -> None:
        """Install the initial global weights, one ArrayRecord per task."""
        self.run_state.set_models(initial_arrays)

    def split_keys(self, task: str) -> tuple[list[str], list[str]]:
        """``(trainable, state)`` keys of ``task``'s model."""
        return self.run_state.split_keys(task)

    def summary(self) -> None:
        """Log every setting of the strategy."""
        log(INFO, "\t├──> MultiModelStrategy settings:")
        for name, value in (
            ("Policy", repr(self.policy)),
            ("Aggregator", repr(self.aggregator)),
            ("Tasks", ", ".join(self.run_state.all_tasks) or "(not set yet)"),
            ("Train config", self.train_config),
            ("Limits", self.limits),
            ("Evaluation", f"fraction {self.fraction_evaluate:g}, every {self.evaluate_every}"),
            (
                "Nodes",
                f"wait for {self.min_available_nodes} nodes and "
                f"{self.min_available_clients} clients at most "
                f"{self.node_wait_timeout:g} s",
            ),
            ("Arrivals (tasks, clients)", self._arrivals),
            ("Trainable keys", self._trainable),
            ("Pinned client ids", sorted(self._pins)),
            ("Checkpoint", self.checkpoint_path),
        ):
            log(INFO, "\t│\t├── %s: %s", name, value)
        log(INFO, "\t│\t└── Seed: %d", self.seed)

    # ------------------------------------------------------------------ hooks
    # start() drives every round through these methods (on the strategy, or on
    # the wrapper whose start() runs it), so a subclass's override takes effect.
    # ``arrays`` is the current global models, one ArrayRecord per active model
    # under its name (a RecordDict); the messages carry the strategy's own.

    def models(self) -> RecordDict:
        """The current global models: one ArrayRecord per active model (task)."""
        run_state = self.run_state
        return RecordDict({t: run_state.arrays[t] for t in run_state.tasks})

    def configure_loss_query(
        self, server_round: int, arrays: RecordDict, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Loss-based policies only: one ``query.losses`` message to every client
        the policy asks (:meth:`Policy.loss_query_clients`; all by default), with
        every active model it holds."""
        run_state = self.run_state
        only = self.policy.loss_query_clients(
            run_state.table, run_state.tasks, server_round, run_state.rng
        )
        return loss_query_messages(run_state, server_round, only)

    def aggregate_loss_query(
        self, server_round: int, replies: Iterable[Message]
    ) -> RecordDict | None:
        """The valid losses of the replies, capped: one MetricRecord per model
        (client id -> loss); start() stores what this returns in the client
        table, where the policy reads it."""
        return accepted_losses(self.run_state, replies, server_round, self.limits)

    def configure_train(  # type: ignore[override]
        self, server_round: int, arrays: RecordDict | None, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The policy's assignment: one train message per node with every model
        assigned to it (an override that changes the messages should call this
        first: the round's picks are kept for :meth:`aggregate_train`)."""
        plan = train.plan_round(
            self.run_state, self.policy, self.aggregator, server_round, config, self.train_config
        )
        self._plans[server_round] = plan
        return plan.messages

    def aggregate_train(  # type: ignore[override]
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[RecordDict | None, MetricRecord | None]:
        """Validate the replies to :meth:`configure_train`'s messages and
        aggregate every model: the new global models (a RecordDict, one
        ArrayRecord per model; start() checks and installs what this returns, a
        model left out stays as it is) and ``<model>.uploads`` /
        ``<model>.train-loss`` metrics."""
        plan = self._plans.pop(server_round, None)
        if plan is None:
            raise HookError(
                f"aggregate_train: round {server_round} has no assignment: an "
                "override of configure_train must call super().configure_train"
            )
        rows, models = aggregate.aggregate_train_replies(
            self.run_state, self.policy, self.aggregator, plan, replies, self.limits
        )
        produced = {t: (numpy_to_arrays(w), w) for t, w in models.items()}
        self._rows[server_round] = (rows, produced)
        return RecordDict({t: rec for t, (rec, _) in produced.items()}), aggregate.train_metrics(
            rows
        )

    def configure_evaluate(  # type: ignore[override]
        self, server_round: int, arrays: RecordDict | None, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Client-side evaluation of every model on ``fraction_evaluate`` of the
        clients (called on evaluation rounds only)."""
        return evaluate.evaluation_messages(
            self.run_state, server_round, config, self.fraction_evaluate
        )

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Example-weighted mean of client-side loss and accuracy, per model
        (``<model>.loss``, ``<model>.accuracy``)."""
        return evaluate.client_metrics(self.run_state, replies, self.limits.max_loss, server_round)

    # ------------------------------------------------------------------ rounds
    def start(  # type: ignore[override]
        self,
        grid: Grid,
        initial_arrays: Mapping[str, ArrayRecord],
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
        resume_from: str | None = None,
    ) -> MultiModelResult:
        """Run ``num_rounds`` rounds over every model (``initial_arrays``: one
        ArrayRecord per task). Each round calls :meth:`configure_loss_query` /
        :meth:`aggregate_loss_query` (loss-based policies), :meth:`configure_train`
        / :meth:`aggregate_train` and, on evaluation rounds,
        :meth:`configure_evaluate` / :meth:`aggregate_evaluate`, so a subclass
        overrides them as it would FedAvg's. ``evaluate_fn(round, task,
        arrays)`` evaluates on the server before the first round and after each
        evaluation round; ``resume_from`` continues a checkpoint of this
        strategy (its models replace ``initial_arrays``; SCAFFOLD's client-held
        ``c_i`` is not in it). Returns the final weights and the per-round,
        per-task history."""
        return self._drive(
            self,
            grid,
            initial_arrays,
            num_rounds,
            timeout,
            train_config,
            evaluate_config,
            evaluate_fn,
            resume_from,
        )

    def _hook(self, hooks: object, name: str, rnd: int, *args: Any) -> Any:
        """``hooks.<name>(rnd, *args)``; what an override (or a wrapper) raises
        becomes one :class:`HookError` naming it."""
        fn = getattr(hooks, name)
        if getattr(type(hooks), name, None) is getattr(MultiModelStrategy, name):
            return fn(rnd, *args)
        try:
            return fn(rnd, *args)
        except HookError:
            raise
        except Exception as err:
            raise HookError(
                f"{type(hooks).__name__}.{name} (round {rnd}) raised {type(err).__name__}: {err}"
            ) from err

    def _messages(self, hooks: object, name: str, rnd: int, *args: Any) -> list[Message]:
        msgs = self._hook(hooks, name, rnd, *args)
        msgs = list(msgs) if msgs is not None else []
        bad = [m for m in msgs if not isinstance(m, Message)]
        if bad:
            raise HookError(
                f"{type(hooks).__name__}.{name} (round {rnd}) returned "
                f"{type(bad[0]).__name__}: expected Flower Messages"
            )
        return msgs

    @staticmethod
    def _metrics(hooks: object, name: str, rnd: int, value: object) -> MetricRecord | None:
        if value is not None and not isinstance(value, MetricRecord):
            raise HookError(
                f"{type(hooks).__name__}.{name} (round {rnd}) returned "
                f"{type(value).__name__} as metrics: expected a MetricRecord or None"
            )
        return value

    def _drive(
        self,
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
        """The rounds of :meth:`start`, with every hook called on ``hooks`` (this
        strategy, or a wrapper around it)."""
        check_option("num_rounds", num_rounds)  # as mmfl run checks them
        check_option("timeout", timeout)
        if isinstance(initial_arrays, ArrayRecord):
            raise TypeError(
                "MultiModelStrategy.start() takes one ArrayRecord per model, as a mapping "
                "{'model-name': arrays}; it was given one ArrayRecord (FedAvg's "
                "initial_arrays). For a single model pass {'model-name': arrays}, with "
                "the name the ClientApp uses for it"
            )
        if self._runs:
            self.policy = copy.deepcopy(self._templates[0])
            self.aggregator = copy.deepcopy(self._templates[1])
            self.run_state = self._new_run_state()
        self._runs += 1
        self._hooks = hooks
        if hooks is not self and hasattr(hooks, "prepare_run"):
            hooks.prepare_run(self.run_state)
        self._plans.clear()
        self._rows.clear()
        run_state = self.run_state
        if resume_from is None and set(run_state.task_arrivals) - set(initial_arrays or {}):
            raise ValueError(
                f"task_arrivals names unknown tasks "
                f"{sorted(set(run_state.task_arrivals) - set(initial_arrays or {}))}"
            )
        result = self.result = MultiModelResult()
        run_state.defence.level = self.action_level
        first = 1
        if resume_from is not None:
            state = self.check_resumable(resume_from, hooks)
            first = persist.restore(run_state, self.policy, self.aggregator, state, result) + 1
            if hooks is not self and hasattr(hooks, "load_wrapper_state"):
                hooks.load_wrapper_state(state.get("wrapper_state", {}), result)
            log(
                INFO,
                "Resuming %s from %s after round %d",
                type(self).__name__,
                resume_from,
                first - 1,
            )
        else:
            run_state.set_models(initial_arrays)
        result.events = run_state.defence.events
        result.received = run_state.defence.received
        log(
            INFO,
            "Starting %s over %d models for %d rounds",
            type(self).__name__,
            len(run_state.tasks),
            num_rounds,
        )
        hooks.summary()  # type: ignore[attr-defined]
        if resume_from is None:
            self._finish_round(0, evaluate.initial_rows(run_state, evaluate_fn, result), result)
        unheld: set[str] = set()  # models named as held by no client
        name = type(hooks).__name__
        run_state.needed_handlers = (
            ["train"]
            + ([P.QUERY_LOSSES] if self.policy.needs_losses else [])
            + (["evaluate"] if self.fraction_evaluate > 0 else [])
        )
        for rnd in range(first, num_rounds + 1):
            t0 = time.monotonic()
            t_round = time.perf_counter()
            run_state.current_round = run_state.defence.round = rnd
            log(INFO, "")
            log(INFO, "[ROUND %s/%s]", rnd, num_rounds)
            with timed(rnd, "registration"):
                registration.refresh_clients(
                    run_state,
                    grid,
                    rnd,
                    timeout,
                    self.min_available_nodes,
                    self.node_wait_timeout,
                    self.min_available_clients,
                )
                validation.apply_count_cap(
                    run_state.table, self.limits.count_cap, run_state.defence
                )
            registration.warn_unheld_models(run_state, unheld)
            log(INFO, "%d clients online", len(run_state.table.ids()))
            if self.policy.needs_losses:
                with timed(rnd, "loss_query"):
                    msgs = self._messages(
                        hooks, "configure_loss_query", rnd, self.models(), ConfigRecord(), grid
                    )
                    replies = round_trip(grid, msgs, timeout, rnd) if msgs else []
                    losses = self._hook(hooks, "aggregate_loss_query", rnd, replies)
                    n = install_losses(
                        run_state,
                        losses if losses is not None else RecordDict(),
                        rnd,
                        self.limits.max_loss,
                        f"{name}.aggregate_loss_query",
                    )
                log(INFO, "Loss query: %d (client, task) losses received", n)
                # clients without a loss handler: out of this round's assignment too
                registration.leave_out_lacking(run_state)
            with timed(rnd, "plan"):
                msgs = self._messages(
                    hooks,
                    "configure_train",
                    rnd,
                    self.models(),
                    train_config or ConfigRecord(),
                    grid,
                )
            plan = self._plans.get(rnd)
            picks = plan.picks if plan is not None else []
            result.assignments[rnd] = [(p.cid, p.task, p.count) for p in picks]
            log(INFO, "configure_train: %d picks on %d nodes", len(picks), len(msgs))
            with timed(rnd, "train"):
                replies = round_trip(grid, msgs, timeout, rnd) if msgs else []
            with timed(rnd, "aggregate"):
                models, metrics = self._pair(
                    hooks, rnd, self._hook(hooks, "aggregate_train", rnd, replies)
                )
                # no client has a train handler: stop before this round finishes
                registration.stop_unless_a_client_can_serve(run_state)
                done = self._rows.pop(rnd, None)
                if done is None:
                    raise HookError(
                        f"{name}.aggregate_train (round {rnd}) did not call "
                        "MultiModelStrategy.aggregate_train (super()), which "
                        "validates and aggregates the replies"
                    )
                rows, produced = done
                new = aggregate.checked_models(
                    run_state, models, f"{name}.aggregate_train", produced
                )
                aggregate.install_models(run_state, new, rows)
            result.rejections[rnd] = list(run_state.rejected_parts)
            result.train_metrics_clientapp[rnd] = {
                "all": metrics if metrics is not None else MetricRecord()
            }
            evaluated = rnd % self.evaluate_every == 0 or rnd == num_rounds
            client_eval = None
            with timed(rnd, "client_eval"):
                msgs = (
                    self._messages(
                        hooks,
                        "configure_evaluate",
                        rnd,
                        self.models(),
                        evaluate_config or ConfigRecord(),
                        grid,
                    )
                    if evaluated
                    else []
                )
                if msgs:
                    client_eval = self._metrics(
                        hooks,
                        "aggregate_evaluate",
                        rnd,
                        self._hook(
                            hooks, "aggregate_evaluate", rnd, round_trip(grid, msgs, timeout, rnd)
                        ),
                    )
                    if client_eval is not None:
                        result.evaluate_metrics_clientapp[rnd] = {"all": client_eval}
                    registration.stop_unless_a_client_can_serve(run_state)
            seconds = time.monotonic() - t0
            with timed(rnd, "server_eval"):
                rows_out = evaluate.round_rows(
                    run_state, rnd, rows, evaluated, evaluate_fn, client_eval, result, seconds
                )
            if PHASE_OBSERVERS:
                report(rnd, "round", time.perf_counter() - t_round)
            run_state.defence.end_round(rnd, rows_out)
            self._finish_round(rnd, rows_out, result)
        run_state.defence.finish()
        result.arrays = dict(run_state.arrays)
        return result

    def _pair(self, hooks: object, rnd: int, value: object) -> tuple[object, MetricRecord | None]:
        if not (isinstance(value, tuple) and len(value) == 2):
            raise HookError(
                f"{type(hooks).__name__}.aggregate_train (round {rnd}) returned "
                f"{type(value).__name__}: expected (models, metrics)"
            )
        return value[0], self._metrics(hooks, "aggregate_train", rnd, value[1])

    def _finish_round(self, rnd: int, rows: list[dict[str, Any]], result: MultiModelResult) -> None:
        result.history.extend(rows)
        if self.checkpoint_path:
            self.save_checkpoint(rnd, result)
        if self.on_round_end:
            self.on_round_end(rnd, rows)

    def state_dict(self, server_round: int, result: MultiModelResult) -> dict[str, Any]:
        """Everything needed to continue after ``server_round`` (plain data),
        with the state of the wrapper running this strategy, if any."""
        state = persist.run_state_dict(
            self.run_state, self.policy, self.aggregator, server_round, result
        )
        state.update(self._wrapper_identity(self._hooks))
        wrapper = self._hooks
        if wrapper is not self and hasattr(wrapper, "wrapper_state"):
            state["wrapper_state"] = wrapper.wrapper_state()
        return state

    def _wrapper_identity(self, wrapper: object) -> dict[str, Any]:
        if wrapper is self:
            return {"wrapper_name": None, "wrapper_config": None}
        config = getattr(wrapper, "wrapper_config", None)
        return {
            "wrapper_name": type(wrapper).__name__,
            "wrapper_config": repr(sorted(config().items())) if config else None,
        }

    def check_resumable(self, path: str, wrapper: object | None = None) -> dict[str, Any]:
        """Load a checkpoint and check it was written by an identical strategy
        (policy, aggregator, their parameters, seed, and the same ``wrapper`` with
        the same parameters, or none); returns its state."""
        return persist.load_resumable(
            path,
            persist.identity(self.policy, self.aggregator, self.seed),
            self._wrapper_identity(self if wrapper is None else wrapper),
        )

    def save_checkpoint(self, server_round: int, result: MultiModelResult) -> None:
        """Write :meth:`state_dict` atomically to ``checkpoint_path``."""
        from mmfl_flwr.checkpoint import save_checkpoint

        save_checkpoint(str(self.checkpoint_path), self.state_dict(server_round, result))


def _refuse_in_flower_dp_wrappers() -> None:
    """Flower 1.42's DP wrappers clip and noise one model (one ArrayRecord): given a
    MultiModelStrategy they would fail deep inside a round. Their constructors
    refuse one here, naming the per-model equivalent in :mod:`mmfl_flwr.privacy`
    (same parameters); any other strategy passes through unchanged."""
    import functools

    from flwr.serverapp import strategy as flower_strategies

    for name in (
        "DifferentialPrivacyServerSideFixedClipping",
        "DifferentialPrivacyClientSideFixedClipping",
        "DifferentialPrivacyServerSideAdaptiveClipping",
        "DifferentialPrivacyClientSideAdaptiveClipping",
    ):
        cls = getattr(flower_strategies, name, None)
        if cls is None or getattr(cls.__init__, "_mmfl_refuses", False):
            continue

        def make(cls: type, name: str) -> Any:
            # patching a class's __init__ is what this function is for
            original = cls.__init__  # type: ignore[misc]

            @functools.wraps(original)
            def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
                wrapped = args[0] if args else kwargs.get("strategy")
                if isinstance(wrapped, MultiModelStrategy):
                    raise TypeError(
                        f"flwr's {name} cannot wrap a MultiModelStrategy (it clips and "
                        f"noises one model); use mmfl_flwr.privacy.{name}, which takes the "
                        "same parameters and acts per model"
                    )
                original(self, *args, **kwargs)

            __init__._mmfl_refuses = True  # type: ignore[attr-defined]
            return __init__

        cls.__init__ = make(cls, name)


_refuse_in_flower_dp_wrappers()
