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
from logging import INFO
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from mmfl_flwr.core.aggregators import Aggregator, FedAvgAggregator
from mmfl_flwr.core.pairing import check_pairing
from mmfl_flwr.core.policy import Policy
from mmfl_flwr.core.random_allocation import RandomAllocation
from mmfl_flwr.strategy import aggregate, evaluate, persist, registration, train, validation
from mmfl_flwr.strategy.loss_query import query_losses
from mmfl_flwr.strategy.timing import PHASE_OBSERVERS, report, round_trip, timed
from mmfl_flwr.strategy.result import EvaluateFn, MultiModelResult, RoundCallback
from mmfl_flwr.strategy.state import RoundPlan, RunState
from mmfl_flwr.strategy.validation import Limits


class MultiModelStrategy(Strategy):
    """Train several models at once over one shared pool of clients.

    Each round: register new nodes, query losses if the policy needs them, assign,
    send **one** train message per node with every model assigned to it, validate
    each (client, task) reply part, aggregate and evaluate. Each ``start()`` is a
    fresh run (new RNG from ``seed``, fresh copies of the policy and aggregator).

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
    max_loss, loss_cap, max_update_norm, update_norm_factor, count_cap
        Bounds on what clients report (:class:`~.validation.Limits` documents
        them), each logged with the client id when it acts.
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
        node_wait_timeout: float = 60.0,
        max_loss: float = 1e6,
        on_round_end: RoundCallback | None = None,
        checkpoint_path: str | None = None,
        loss_cap: float | None = 10.0,
        max_update_norm: float | None = None,
        update_norm_factor: float | None = 100.0,
        count_cap: float | None = 200.0,
        client_arrivals: Mapping[str, int] | None = None,
        task_arrivals: Mapping[str, int] | None = None,
        trainable_keys: Mapping[str, Sequence[str]] | None = None,
        client_pins: Mapping[str, str] | None = None,
    ) -> None:
        if not 0.0 <= fraction_evaluate <= 1.0:
            raise ValueError(f"fraction_evaluate must be in [0, 1], got {fraction_evaluate}")
        if evaluate_every < 1:
            raise ValueError(f"evaluate_every must be >= 1, got {evaluate_every}")
        self.policy = policy if policy is not None else RandomAllocation()
        self.aggregator = aggregator if aggregator is not None else FedAvgAggregator()
        check_pairing(self.policy, self.aggregator)
        self._templates = (copy.deepcopy(self.policy), copy.deepcopy(self.aggregator))
        self.train_config = train.TrainConfig(int(local_epochs), float(lr), int(batch_size),
                                              int(seed))
        self.seed = int(seed)
        self.fraction_evaluate = float(fraction_evaluate)
        self.evaluate_every = int(evaluate_every)
        self.min_available_nodes = int(min_available_nodes)
        self.node_wait_timeout = float(node_wait_timeout)
        self.limits = Limits(float(max_loss), loss_cap, max_update_norm, update_norm_factor,
                             count_cap)  # checks them
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
        self._plans: dict[int, RoundPlan] = {}  # only for the Flower-API methods below
        #: the result of the latest :meth:`start`, filled as its rounds finish (an
        #: interrupted run's history so far; the final weights at its end)
        self.result: MultiModelResult | None = None

    def _new_run_state(self) -> RunState:
        return RunState(self.seed, *self._arrivals, pinned_trainable=dict(self._trainable),
                        client_pins=dict(self._pins))

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
            ("Policy", repr(self.policy)), ("Aggregator", repr(self.aggregator)),
            ("Tasks", ", ".join(self.run_state.all_tasks) or "(not set yet)"),
            ("Train config", self.train_config), ("Limits", self.limits),
            ("Evaluation", f"fraction {self.fraction_evaluate:g}, every {self.evaluate_every}"),
            ("Nodes", f"wait for {self.min_available_nodes} at most {self.node_wait_timeout:g} s"),
            ("Arrivals (tasks, clients)", self._arrivals), ("Trainable keys", self._trainable),
            ("Pinned client ids", sorted(self._pins)), ("Checkpoint", self.checkpoint_path),
        ):
            log(INFO, "\t│\t├── %s: %s", name, value)
        log(INFO, "\t│\t└── Seed: %d", self.seed)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord | None, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Assign models to clients; one train message per node (``arrays`` is
        ignored: the strategy holds one ArrayRecord per task)."""
        plan = train.plan_round(self.run_state, self.policy, self.aggregator, server_round, config,
                                self.train_config)
        self._plans[server_round] = plan
        return plan.messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate and aggregate the replies to :meth:`configure_train`'s messages."""
        rows = self._aggregate(self._plans.pop(server_round), replies)
        return None, aggregate.train_metrics(rows)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord | None, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Client-side evaluation of every model on a fraction of the clients."""
        return evaluate.evaluation_messages(self.run_state, server_round, config, self.fraction_evaluate)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Example-weighted mean of client-side loss and accuracy, per task."""
        return evaluate.client_metrics(self.run_state, replies, self.limits.max_loss, server_round)

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
        ArrayRecord per task). ``evaluate_fn(round, task, arrays)`` evaluates on
        the server before the first round and after each evaluation round;
        ``resume_from`` continues a checkpoint of this strategy (its models
        replace ``initial_arrays``; SCAFFOLD's client-held ``c_i`` is not in it).
        Returns the final weights and the per-round, per-task history."""
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
        run_state = self.run_state
        if resume_from is None and set(run_state.task_arrivals) - set(initial_arrays or {}):
            raise ValueError(f"task_arrivals names unknown tasks "
                             f"{sorted(set(run_state.task_arrivals) - set(initial_arrays or {}))}")
        result = self.result = MultiModelResult()
        first = 1
        if resume_from is not None:
            state = self.check_resumable(resume_from)
            first = persist.restore(run_state, self.policy, self.aggregator, state, result) + 1
            log(INFO, "Resuming %s from %s after round %d", type(self).__name__, resume_from,
                first - 1)
        else:
            run_state.set_models(initial_arrays)
        log(INFO, "Starting %s over %d models for %d rounds", type(self).__name__,
            len(run_state.tasks), num_rounds)
        self.summary()
        if resume_from is None:
            self._finish_round(0, evaluate.initial_rows(run_state, evaluate_fn, result), result)
        unheld: set[str] = set()  # models named as held by no client
        for rnd in range(first, num_rounds + 1):
            t0 = time.monotonic()
            t_round = time.perf_counter()
            run_state.current_round = rnd
            log(INFO, "")
            log(INFO, "[ROUND %s/%s]", rnd, num_rounds)
            with timed(rnd, "registration"):
                registration.refresh_clients(run_state, grid, rnd, timeout, self.min_available_nodes,
                                             self.node_wait_timeout)
                validation.apply_count_cap(run_state.table, self.limits.count_cap)
            registration.warn_unheld_models(run_state, unheld)
            log(INFO, "%d clients online", len(run_state.table.ids()))
            if self.policy.needs_losses:
                with timed(rnd, "loss_query"):
                    only = self.policy.loss_query_clients(run_state.table, run_state.tasks, rnd, run_state.rng)
                    n = query_losses(run_state, grid, rnd, timeout, self.limits, only)
                log(INFO, "Loss query: %d (client, task) losses received", n)
            with timed(rnd, "plan"):
                plan = train.plan_round(run_state, self.policy, self.aggregator, rnd,
                                        train_config or ConfigRecord(), self.train_config)
            result.assignments[rnd] = [(p.cid, p.task, p.count) for p in plan.picks]
            log(INFO, "configure_train: %d picks on %d nodes", len(plan.picks),
                len(plan.messages))
            with timed(rnd, "train"):
                replies = (round_trip(grid, plan.messages, timeout, rnd) if plan.messages
                           else [])
            with timed(rnd, "aggregate"):
                rows = self._aggregate(plan, replies)
            result.rejections[rnd] = list(run_state.rejected_parts)
            result.train_metrics_clientapp[rnd] = {"all": aggregate.train_metrics(rows)}
            evaluated = rnd % self.evaluate_every == 0 or rnd == num_rounds
            with timed(rnd, "client_eval"):
                client_eval = evaluate.client_round(
                    run_state, grid, rnd, evaluate_config or ConfigRecord(),
                    self.fraction_evaluate if evaluated else 0.0, timeout,
                    self.limits.max_loss, result,
                )
            seconds = time.monotonic() - t0
            with timed(rnd, "server_eval"):
                rows_out = evaluate.round_rows(run_state, rnd, rows, evaluated, evaluate_fn,
                                               client_eval, result, seconds)
            if PHASE_OBSERVERS:
                report(rnd, "round", time.perf_counter() - t_round)
            self._finish_round(rnd, rows_out, result)
        result.arrays = dict(run_state.arrays)
        return result

    def _aggregate(self, plan: RoundPlan, replies: Iterable[Message]) -> dict[str, dict[str, Any]]:
        return aggregate.aggregate_train_replies(self.run_state, self.policy, self.aggregator, plan, replies,
                                     self.limits)

    def _finish_round(self, rnd: int, rows: list[dict[str, Any]], result: MultiModelResult) -> None:
        result.history.extend(rows)
        if self.checkpoint_path:
            self.save_checkpoint(rnd, result)
        if self.on_round_end:
            self.on_round_end(rnd, rows)

    def state_dict(self, server_round: int, result: MultiModelResult) -> dict[str, Any]:
        """Everything needed to continue after ``server_round`` (plain data)."""
        return persist.run_state_dict(self.run_state, self.policy, self.aggregator, server_round, result)

    def check_resumable(self, path: str) -> dict[str, Any]:
        """Load a checkpoint and check it was written by an identical strategy
        (policy, aggregator, their parameters, seed); returns its state."""
        return persist.load_resumable(path, persist.identity(self.policy, self.aggregator,
                                                             self.seed))

    def save_checkpoint(self, server_round: int, result: MultiModelResult) -> None:
        """Write :meth:`state_dict` atomically to ``checkpoint_path``."""
        from mmfl_flwr.checkpoint import save_checkpoint

        save_checkpoint(str(self.checkpoint_path), self.state_dict(server_round, result))

