"""MultiModelStrategy: one Flower strategy that trains several models at once.

The class holds the settings and Flower's Strategy hooks; :mod:`.rounds` runs
the rounds through the hooks, each phase in its own module: registration
(:mod:`.registration`), loss query (:mod:`.loss_query`), assignment and train
round trip (:mod:`.train`), reply validation (:mod:`.validation`), aggregation
and round metrics (:mod:`.aggregate`), evaluation (:mod:`.evaluate`) and
checkpoints (:mod:`.persist`). State passes between them explicitly: a
:class:`~.state.RunState` per run and a :class:`~.state.RoundPlan` per round.
Imports flwr and numpy only (no torch).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from logging import DEBUG
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from mmfl_flwr.core.aggregators import Aggregator, FedAvgAggregator
from mmfl_flwr.core.pairing import check_pairing
from mmfl_flwr.core.policy import Policy
from mmfl_flwr.core.random_allocation import RandomAllocation
from mmfl_flwr.records import numpy_to_arrays
from mmfl_flwr.strategy import aggregate, evaluate, persist, registration, rounds, settings, train
from mmfl_flwr.strategy.flower_dp import refuse_multi_model
from mmfl_flwr.strategy.loss_query import accepted_losses, loss_query_messages
from mmfl_flwr.strategy.result import EvaluateFn, MultiModelResult, RoundCallback
from mmfl_flwr.strategy.state import HookError, RoundPlan
from mmfl_flwr.strategy.validation import (
    DIRECTION_FACTOR,
    REVERSED_INFLUENCE_FACTOR,
    UPDATE_CLIP_FACTOR,
    Limits,
)


class MultiModelStrategy(persist.Checkpointing, Strategy):
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
    direction_factor, influence_clip_factor, reversed_influence_factor, collusion_factor
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
        collusion_factor: float | None = None,
        client_arrivals: Mapping[str, int] | None = None,
        task_arrivals: Mapping[str, int] | None = None,
        trainable_keys: Mapping[str, Sequence[str]] | None = None,
        client_pins: Mapping[str, str] | None = None,
    ) -> None:
        defences = settings.check_arguments(
            policy,
            aggregator,
            {"local_epochs": local_epochs, "lr": lr, "batch_size": batch_size, "seed": seed},
            fraction_evaluate,
            evaluate_every,
            {
                "loss_cap": loss_cap,
                "max_update_norm": max_update_norm,
                "update_norm_factor": update_norm_factor,
                "count_cap": count_cap,
                "update_clip_factor": update_clip_factor,
                "direction_factor": direction_factor,
                "influence_clip_factor": influence_clip_factor,
                "reversed_influence_factor": reversed_influence_factor,
                "collusion_factor": collusion_factor,
            },
        )
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
        self.limits = Limits(float(max_loss), **defences)  # checks them
        self.on_round_end = on_round_end
        self.checkpoint_path = checkpoint_path
        self._arrivals = (
            {str(k): int(v) for k, v in (task_arrivals or {}).items()},
            {str(k): int(v) for k, v in (client_arrivals or {}).items()},
        )
        self._trainable = {str(t): [str(k) for k in ks] for t, ks in (trainable_keys or {}).items()}
        self._pins = registration.check_pins(client_pins)
        self.run_state = settings.new_run_state(self)
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
        settings.log_summary(self)

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

    #: the rounds of :meth:`start`, with every hook called on ``hooks`` (this
    #: strategy, or a wrapper around it): :func:`.rounds.drive`
    _drive = rounds.drive


refuse_multi_model(MultiModelStrategy)  # flwr's one-model DP wrappers refuse it (.flower_dp)
