"""MultiModelStrategy: one Flower strategy that trains several models at once.

Imports flwr and numpy only (no torch), so a ServerApp using it runs where torch
is absent.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from mmfl_flwr import protocol as P
from mmfl_flwr.core.aggregators import Aggregator, FedAvgAggregator, Update
from mmfl_flwr.core.clients import (
    MAX_NUM_EXAMPLES,
    ClientInfo,
    ClientTable,
    InvalidClientInfo,
    validate_client_info,
)
from mmfl_flwr.core.policies import Pick, Policy, RandomAllocation, picks_by_client
from mmfl_flwr.records import (
    InvalidReply,
    NumpyWeights,
    arrays_to_numpy,
    check_count,
    check_loss,
    check_weights,
    numpy_to_arrays,
)

#: Server-side evaluation: ``(server_round, task, arrays) -> metrics or None``.
EvaluateFn = Callable[[int, str, ArrayRecord], "MetricRecord | Mapping[str, float] | None"]
#: Called after every round with that round's history rows.
RoundCallback = Callable[[int, list[dict[str, Any]]], None]


def l2_norm(arrays: Iterable[np.ndarray]) -> float:
    """``sqrt(sum of squares)`` over several arrays, scaled so it cannot overflow
    for finite inputs (inf only if the true norm exceeds the float range)."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    scale = max((float(np.abs(a).max()) for a in arrays if a.size), default=0.0)
    if scale == 0.0:
        return 0.0
    return scale * float(np.sqrt(sum(float(np.square(a / scale).sum()) for a in arrays)))


def average_state(old: list[np.ndarray], updates: Sequence[Update]) -> list[np.ndarray]:
    """Non-trainable model state (batch-norm running statistics, counters) of the
    new global model: the sample-weighted mean of the aggregated clients' values
    (``n_{i,s}`` weights), in float64, cast back to each entry's dtype (integer
    counters rounded to the nearest integer). Unchanged without updates."""
    received = [u for u in updates if u.state is not None]
    if not old or not received:
        return [a.copy() for a in old]
    total = float(sum(u.num_examples for u in received))
    out = []
    for j, a in enumerate(old):
        mean = sum(
            (u.num_examples / total) * np.asarray(u.state[j], dtype=np.float64)  # type: ignore[index]
            for u in received
        )
        mean = np.asarray(mean, dtype=np.float64)
        if a.dtype.kind in "iub":
            mean = np.rint(mean)
        out.append(mean.astype(a.dtype).reshape(a.shape))
    return out


@dataclass
class MultiModelResult:
    """What :meth:`MultiModelStrategy.start` returns.

    Attributes
    ----------
    arrays : dict[str, ArrayRecord]
        Final global weights, one ArrayRecord per task.
    history : list[dict]
        One row per (round, task): ``round``, ``task``, ``accuracy``, ``loss``
        (server-side evaluation, NaN without ``evaluate_fn``), ``uploads``
        (accepted updates), ``assigned`` (clients assigned), ``rejected``,
        ``train_loss``, ``step_l1`` (``||w_old - w_new||_1``), ``round_step_l1``
        (the sum of ``step_l1`` over the tasks: paper 003's summed global step
        size ``sum_s ||H_s||_1``), and with
        client-side evaluation ``client_accuracy`` and ``client_loss``.
        Round 0 holds the evaluation of the initial weights.
    assignments : dict[int, list[tuple[str, str, int]]]
        Per round, the ``(client id, task, count)`` picks of the policy.
    """

    arrays: dict[str, ArrayRecord] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    assignments: dict[int, list[tuple[str, str, int]]] = field(default_factory=dict)
    train_metrics_clientapp: dict[int, dict[str, MetricRecord]] = field(
        default_factory=dict
    )
    evaluate_metrics_clientapp: dict[int, dict[str, MetricRecord]] = field(
        default_factory=dict
    )
    evaluate_metrics_serverapp: dict[int, dict[str, MetricRecord]] = field(
        default_factory=dict
    )

    def final(self) -> dict[str, dict[str, Any]]:
        """The last history row of each task."""
        out: dict[str, dict[str, Any]] = {}
        for row in self.history:
            out[row["task"]] = row
        return out


class MultiModelStrategy(Strategy):
    """Train several models at once over one shared pool of clients.

    Each round: register new nodes (``query.info``), optionally ask every client
    for its loss on each model (``query.losses``, when the policy needs it), let
    the policy assign models to clients, send **one** train message per node
    carrying every model assigned to it, validate every reply per task (rejecting
    bad parts one by one, with a log line naming the client), aggregate each model
    with the aggregator, and evaluate every model.

    Parameters
    ----------
    policy : Policy, optional
        Who trains what (default: :class:`~mmfl_flwr.core.RandomAllocation`).
    aggregator : Aggregator, optional
        How each model's updates are combined (default: FedAvg per model).
    local_epochs : int
        Local epochs ``K`` sent to the clients (default 1).
    lr : float
        Client learning rate (default 0.05).
    batch_size : int
        Client mini-batch size (default 32).
    seed : int
        Seeds the strategy's ``numpy.random.Generator`` (every assignment draw) and
        is sent to clients to seed their local training.
    fraction_evaluate : float
        Fraction of online clients asked to evaluate every model on their local
        test data each evaluation round (default 0: server-side evaluation only).
    evaluate_every : int
        Evaluate every this many rounds (the last round is always evaluated).
    min_available_nodes : int
        Before the first round, wait (at most ``node_wait_timeout`` seconds) for
        this many nodes; never waits without bound. Later rounds use whoever is
        online.
    node_wait_timeout : float
        Seconds to wait for ``min_available_nodes``.
    max_loss : float
        Reported losses above this are rejected as absurd.
    on_round_end : callable, optional
        ``f(server_round, rows)`` called after each round (progress display).
    checkpoint_path : str, optional
        File (or folder, for ``checkpoint.pkl`` in it) where the full strategy
        state is written atomically after every round;
        ``start(..., resume_from=path)`` continues from it.
    loss_cap : float or None
        A reported loss above ``loss_cap`` times the median loss of that task is
        capped (and logged), so one client cannot steer loss-based sampling
        (LVR, UCB, Group) with an absurd value; with the default 100 an honest
        federation never hits it. None disables the cap.
    max_update_norm : float or None
        Reject (and log) an update whose L2 norm ``||w_global - w_local||``
        exceeds this: huge but finite values would otherwise pass validation and
        ruin a model. None (default) disables the check.
    client_arrivals : mapping, optional
        Stable client id -> first round it may take part in (a simulated
        arrival schedule; in deployment, SuperNodes that connect later simply
        register when they come). Clients not listed are there from the start.
    task_arrivals : mapping, optional
        Task -> first round it is trained and evaluated (models that join during
        training). A policy sees a task from its arrival round on; MMFL-Group
        admits it at its next cycle boundary. Its metrics rows start then.
    trainable_keys : mapping, optional
        Task -> the keys of its model's trainable parameters. Only these form
        the update ``G = w_global - w_local`` (norms, ``beta``, the ``d/(B p)``
        scaling, control variates); the other entries (batch-norm running
        statistics, step counters) are model state, combined by the
        sample-weighted mean of the aggregated clients' values. Without it, the
        first client that declares a task's trainable keys (``trainable.<task>``
        in its info reply; :class:`~mmfl_flwr.client.trainer.TorchTrainer` does)
        sets them; until then every floating-point entry counts as trainable.
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
        loss_cap: float | None = 100.0,
        max_update_norm: float | None = None,
        client_arrivals: Mapping[str, int] | None = None,
        task_arrivals: Mapping[str, int] | None = None,
        trainable_keys: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        if local_epochs < 1:
            raise ValueError(f"local_epochs must be >= 1, got {local_epochs}")
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a positive number, got {lr}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0.0 <= fraction_evaluate <= 1.0:
            raise ValueError(f"fraction_evaluate must be in [0, 1], got {fraction_evaluate}")
        if evaluate_every < 1:
            raise ValueError(f"evaluate_every must be >= 1, got {evaluate_every}")
        self.policy = policy if policy is not None else RandomAllocation()
        self.aggregator = aggregator if aggregator is not None else FedAvgAggregator()
        if (
            self.aggregator.needs_inclusion_probabilities
            and not self.policy.inclusion_probabilities
        ):
            raise ValueError(
                f"{type(self.aggregator).__name__} divides by inclusion probabilities, "
                f"but {type(self.policy).__name__} picks clients deterministically from "
                f"their losses (no inclusion probability); use FedAvgAggregator"
            )
        self.local_epochs = int(local_epochs)
        self.lr = float(lr)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.fraction_evaluate = float(fraction_evaluate)
        self.evaluate_every = int(evaluate_every)
        self.min_available_nodes = int(min_available_nodes)
        self.node_wait_timeout = float(node_wait_timeout)
        self.max_loss = float(max_loss)
        self.on_round_end = on_round_end
        self.checkpoint_path = checkpoint_path
        if loss_cap is not None and not loss_cap > 1:
            raise ValueError(f"loss_cap must be > 1 (a multiple of the median) or None")
        self.loss_cap = loss_cap
        if max_update_norm is not None and not max_update_norm > 0:
            raise ValueError("max_update_norm must be > 0 or None")
        self.max_update_norm = max_update_norm
        self.client_arrivals = {str(k): int(v) for k, v in (client_arrivals or {}).items()}
        self.task_arrivals = {str(k): int(v) for k, v in (task_arrivals or {}).items()}
        self._pinned_trainable = {
            str(t): [str(k) for k in keys] for t, keys in (trainable_keys or {}).items()
        }
        #: Task -> trainable keys in force (pinned, or the first client's declaration).
        self.trainable: dict[str, list[str]] = dict(self._pinned_trainable)
        self._current_round = 0

        self.rng = np.random.default_rng(self.seed)
        self._eval_rng = np.random.default_rng([self.seed, 1])
        self.table = ClientTable()
        self.weights: dict[str, NumpyWeights] = {}
        self.arrays: dict[str, ArrayRecord] = {}
        self._node_to_cid: dict[int, str] = {}
        self._cid_to_node: dict[str, int] = {}
        self._round_picks: list[Pick] = []
        self._waited = False
        self._round_rows: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ setup
    @property
    def all_tasks(self) -> list[str]:
        """Every model (task) of this strategy, in order, arrived or not."""
        return list(self.weights)

    @property
    def tasks(self) -> list[str]:
        """The models (tasks) active in the current round: those whose arrival
        round (``task_arrivals``, default 0) has come."""
        return [t for t in self.weights if self.task_arrivals.get(t, 0) <= self._current_round]

    def set_models(self, initial_arrays: Mapping[str, ArrayRecord]) -> None:
        """Install the initial global weights, one ArrayRecord per task."""
        if not initial_arrays:
            raise ValueError("initial_arrays must map at least one task name to an ArrayRecord")
        for task, rec in initial_arrays.items():
            if not isinstance(task, str) or not task:
                raise ValueError(f"task names must be non-empty strings, got {task!r}")
            if not isinstance(rec, ArrayRecord) or len(rec) == 0:
                raise ValueError(f"task {task!r}: expected a non-empty ArrayRecord")
        self.weights = {t: arrays_to_numpy(r) for t, r in initial_arrays.items()}
        for task, w in self.weights.items():
            for k, v in w.items():
                if v.dtype.kind in "fc" and not np.isfinite(v).all():
                    raise ValueError(f"task {task!r}: initial array {k!r} has NaN or inf")
        self.arrays = {t: numpy_to_arrays(w) for t, w in self.weights.items()}
        for task, keys in self._pinned_trainable.items():
            problem = self._trainable_problem(task, keys)
            if problem:
                raise ValueError(f"trainable_keys[{task!r}]: {problem}")

    def _trainable_problem(self, task: str, keys: Sequence[str]) -> str | None:
        """Why ``keys`` cannot be ``task``'s trainable entries (None if they can)."""
        if task not in self.weights:
            return "no such model"
        w = self.weights[task]
        unknown = [k for k in keys if k not in w]
        if unknown:
            return f"keys {unknown[:3]} are not in the model"
        if len(set(keys)) != len(keys) or not keys:
            return "must be a non-empty list of distinct keys"
        bad = [k for k in keys if w[k].dtype.kind != "f"]
        if bad:
            return f"entries {bad[:3]} are not floating-point arrays"
        return None

    def split_keys(self, task: str) -> tuple[list[str], list[str]]:
        """``(trainable, state)`` keys of ``task``'s model, in model order.

        Trainable entries form the update ``G``; state entries (batch-norm
        running statistics, counters) are averaged (see ``trainable_keys``)."""
        w = self.weights[task]
        declared = self.trainable.get(task)
        if declared is None:
            train = [k for k, v in w.items() if v.dtype.kind == "f"]
        else:
            wanted = set(declared)
            train = [k for k in w if k in wanted]
        chosen = set(train)
        return train, [k for k in w if k not in chosen]

    def summary(self) -> None:
        """Log the configuration."""
        log(INFO, "\t├──> MultiModelStrategy settings:")
        log(INFO, "\t│\t├── Policy: %r (needs losses: %s)", self.policy, self.policy.needs_losses)
        log(INFO, "\t│\t├── Aggregator: %r", self.aggregator)
        log(INFO, "\t│\t├── Tasks: %s", ", ".join(self.all_tasks) or "(not set yet)")
        log(
            INFO,
            "\t│\t├── Local epochs: %d, lr: %g, batch size: %d",
            self.local_epochs,
            self.lr,
            self.batch_size,
        )
        log(INFO, "\t│\t├── Client-side evaluation fraction: %g", self.fraction_evaluate)
        log(INFO, "\t│\t└── Seed: %d", self.seed)

    # ------------------------------------------------------------- messages
    def _message(
        self, node: int, content: RecordDict, message_type: str, server_round: int
    ) -> Message:
        """An instruction to ``node`` for ``server_round`` (the round is the
        message's group id)."""
        return Message(
            content, dst_node_id=node, message_type=message_type, group_id=str(server_round)
        )

    def _models_for(self, cid: str, active: set[str]) -> tuple[list[str], RecordDict]:
        """The active tasks ``cid`` holds data for, and a RecordDict carrying their
        current global weights (``arrays.<task>``)."""
        tasks = [t for t in self.table[cid].tasks if t in active]
        return tasks, RecordDict({P.arrays_key(t): self.arrays[t] for t in tasks})

    # ------------------------------------------------------------- clients
    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        # Wait for min_available_nodes only before the first round; afterwards a
        # round goes ahead with whoever is online (late nodes join when they come).
        if self._waited:
            return sorted(grid.get_node_ids())
        self._waited = True
        deadline = time.monotonic() + self.node_wait_timeout
        while True:
            nodes = sorted(grid.get_node_ids())
            if len(nodes) >= self.min_available_nodes or time.monotonic() >= deadline:
                if len(nodes) < self.min_available_nodes:
                    log(
                        WARNING,
                        "Only %d of the %d requested nodes are online after %.0f s; "
                        "continuing with them",
                        len(nodes),
                        self.min_available_nodes,
                        self.node_wait_timeout,
                    )
                return nodes
            time.sleep(1.0)

    def refresh_clients(self, grid: Grid, server_round: int, timeout: float) -> None:
        """Register new nodes and mark which clients are online."""
        nodes = self._wait_for_nodes(grid)
        # Forget nodes that are gone: a client that reconnects comes back with a
        # new node id and registers again under its stable id.
        for nid in list(self._node_to_cid):
            if nid not in nodes:
                gone = self._node_to_cid.pop(nid)
                log(INFO, "Client %s (node %d) went offline; left out until it reconnects",
                    gone, nid)
        new = [n for n in nodes if n not in self._node_to_cid]
        if new:
            msgs = [self._message(n, RecordDict(), P.QUERY_INFO, server_round) for n in new]
            answered = set()
            for reply in grid.send_and_receive(msgs, timeout=timeout):
                answered.add(reply.metadata.src_node_id)
                self._register(reply)
            for n in new:
                if n not in answered:
                    log(WARNING, "Node %d did not answer the info query within %g s; it is "
                        "asked again next round", n, timeout)
        online = {
            self._node_to_cid[n]
            for n in nodes
            if n in self._node_to_cid
            and self.client_arrivals.get(self._node_to_cid[n], 0) <= server_round
        }
        self._cid_to_node = {
            cid: nid for nid, cid in self._node_to_cid.items() if cid in online
        }
        self.table.set_online(online)

    def _register(self, reply: Message) -> None:
        node = reply.metadata.src_node_id
        if reply.has_error():
            log(WARNING, "Node %d could not describe itself (error %s: %s); "
                "it is left out this round", node, reply.error.code, reply.error.reason)
            return
        try:
            info = reply.content.config_records[P.INFO_KEY]
            cid = str(info[P.CLIENT_ID])
            tasks = list(info[P.TASKS])  # type: ignore[arg-type]
            counts = list(info[P.NUM_EXAMPLES])  # type: ignore[arg-type]
            procs = info.get(P.PROCESSORS, 1)
            if len(tasks) != len(counts):
                raise InvalidClientInfo(
                    f"{len(tasks)} tasks but {len(counts)} sample counts"
                )
            if len(set(tasks)) != len(tasks):
                raise InvalidClientInfo(f"duplicated tasks in {tasks}")
            usable, unknown = validate_client_info(
                cid, dict(zip(tasks, counts)), procs, self.all_tasks  # type: ignore[arg-type]
            )
        except (KeyError, TypeError, ValueError) as err:
            log(WARNING, "Node %d sent an invalid self-description, left out: %s", node, err)
            return
        if unknown:
            log(WARNING, "Client %s declared unknown tasks %s; ignoring them", cid, unknown)
        # Nodes that went away were already forgotten, so another live node with
        # this id is a duplicate claim: keep the first one.
        other = next((n for n, c in self._node_to_cid.items() if c == cid and n != node), None)
        if other is not None:
            log(WARNING, "Client id %s is claimed by nodes %d and %d; keeping %d",
                cid, other, node, other)
            return
        self._note_trainable(cid, info, usable)
        log(INFO, "Client %s %s as node %d (tasks %s)", cid,
            "re-registered" if cid in self.table else "registered", node, sorted(usable))
        self._node_to_cid[node] = cid
        self.table.upsert(ClientInfo(cid=cid, num_examples=usable, processors=int(procs)))  # type: ignore[arg-type]

    def _note_trainable(self, cid: str, info: ConfigRecord, tasks: Iterable[str]) -> None:
        """Take a client's ``trainable.<task>`` declarations: the first valid one
        of a task sets its trainable keys (unless pinned); a different one is
        logged and ignored."""
        for task in tasks:
            raw = info.get(P.trainable_key(task))
            if raw is None:
                continue
            keys = [str(k) for k in raw] if isinstance(raw, list) else []
            problem = self._trainable_problem(task, keys)
            if problem:
                log(WARNING, "Client %s declared invalid trainable keys for %r (%s); "
                    "ignored", cid, task, problem)
                continue
            known = self.trainable.get(task)
            if known is None:
                self.trainable[task] = keys
                train, state = self.split_keys(task)
                log(INFO, "Task %r: %d trainable entries, %d state entries (averaged, "
                    "not part of the update), as declared by client %s",
                    task, len(train), len(state), cid)
            elif set(known) != set(keys):
                log(WARNING, "Client %s declared other trainable keys for %r than "
                    "those in force; ignored", cid, task)

    def query_losses(
        self, grid: Grid, server_round: int, timeout: float, only: set[str] | None = None
    ) -> int:
        """Ask every online client (or the ones in ``only``) for its loss on each of
        its tasks (no training).

        Returns the number of accepted (client, task) losses.
        """
        msgs = []
        active = set(self.tasks)
        for cid in self.table.ids():
            if only is not None and cid not in only:
                continue
            tasks, content = self._models_for(cid, active)
            if tasks:
                msgs.append(
                    self._message(self._cid_to_node[cid], content, P.QUERY_LOSSES, server_round)
                )
        accepted = 0
        seen: set[str] = set()
        received: dict[str, list[tuple[str, float]]] = {}
        for reply in grid.send_and_receive(msgs, timeout=timeout):
            cid = self._node_to_cid.get(reply.metadata.src_node_id)
            if cid is None:
                log(WARNING, "Ignoring a loss reply from unknown node %d",
                    reply.metadata.src_node_id)
                continue
            if cid in seen:
                log(WARNING, "Client %s: duplicated loss reply ignored", cid)
                continue
            seen.add(cid)
            if reply.has_error():
                log(WARNING, "Client %s failed the loss query (error %s: %s)",
                    cid, reply.error.code, reply.error.reason)
                continue
            losses = reply.content.metric_records.get(P.LOSSES_KEY)
            if losses is None:
                log(WARNING, "Client %s: loss reply has no '%s' record; ignored", cid, P.LOSSES_KEY)
                continue
            for task, value in losses.items():
                if task not in self.table[cid].num_examples:
                    log(WARNING, "Client %s reported a loss for task %r it was not asked "
                        "about; ignored", cid, task)
                    continue
                try:
                    loss = check_loss(value, f"loss of task {task!r}", self.max_loss)
                except InvalidReply as err:
                    log(WARNING, "Client %s: rejected loss: %s", cid, err)
                    continue
                received.setdefault(task, []).append((cid, loss))
                accepted += 1
        for task, pairs in received.items():
            cap = self._loss_cap(task, [v for _, v in pairs])
            for cid, loss in pairs:
                if loss > cap:
                    log(WARNING, "Client %s: loss %.4g on task %r capped at %.4g "
                        "(%g x the median)", cid, loss, task, cap, self.loss_cap)
                    loss = cap
                self.table.set_loss(cid, task, loss, server_round)
        return accepted

    def _loss_cap(self, task: str, values: list[float]) -> float:
        """``loss_cap`` times the median loss of ``task`` (this round's reports
        plus the clients' latest ones), so that one client cannot steer the
        sampling probabilities with an absurd loss."""
        if self.loss_cap is None:
            return math.inf
        pool = values + [
            c.losses[task] for c in self.table.clients() if task in c.losses
        ]
        med = float(np.median(pool)) if pool else 0.0
        return self.loss_cap * med if med > 0 else math.inf

    # -------------------------------------------------------------- training
    def configure_train(
        self,
        server_round: int,
        arrays: ArrayRecord | None,
        config: ConfigRecord,
        grid: Grid,
    ) -> Iterable[Message]:
        """Assign models to clients and build one train message per node.

        ``arrays`` is ignored: the strategy holds one ArrayRecord per task in
        :attr:`arrays`.
        """
        active = self.tasks
        picks = self.policy.assign(self.table, active, server_round, self.rng)
        valid = [
            p
            for p in picks
            if p.cid in self._cid_to_node
            and p.task in active
            and p.task in self.table[p.cid].num_examples
        ]
        if len(valid) != len(picks):
            log(WARNING, "Policy %r made %d picks of offline clients or of tasks a "
                "client holds no data for; dropped", self.policy, len(picks) - len(valid))
        picks = valid
        self._round_picks = picks
        controls: dict[str, ArrayRecord] = {}
        if getattr(self.aggregator, "needs_control", False):
            for t in {p.task for p in picks}:
                keys = self.split_keys(t)[0]
                c = self.aggregator.server_control(  # type: ignore[attr-defined]
                    t, [self.weights[t][k] for k in keys]
                )
                controls[t] = numpy_to_arrays(dict(zip(keys, c)))
        messages = []
        for cid, mine in picks_by_client(picks).items():
            tasks = [p.task for p in mine]
            cfg = ConfigRecord(dict(config))
            cfg[P.CFG_ROUND] = server_round
            cfg[P.CFG_TASKS] = tasks
            cfg.setdefault(P.CFG_EPOCHS, self.local_epochs)
            cfg.setdefault(P.CFG_LR, self.lr)
            cfg.setdefault(P.CFG_BATCH_SIZE, self.batch_size)
            cfg.setdefault(P.CFG_SEED, self.seed)
            content = RecordDict({P.arrays_key(t): self.arrays[t] for t in tasks})
            content[P.CONFIG_KEY] = cfg
            if getattr(self.aggregator, "needs_control", False):
                for t in tasks:
                    content[P.control_key(t)] = controls[t]
            messages.append(
                self._message(self._cid_to_node[cid], content, MessageType.TRAIN, server_round)
            )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate every reply per task and aggregate each model.

        Updates :attr:`arrays` in place and returns ``(None, metrics)``: there is
        no single ArrayRecord to thread through rounds.
        """
        expected: dict[str, dict[str, Pick]] = {}
        for p in self._round_picks:
            expected.setdefault(p.cid, {})[p.task] = p
        updates: dict[str, list[Update]] = {t: [] for t in self.tasks}
        train_losses: dict[str, list[tuple[float, int]]] = {t: [] for t in self.tasks}
        rejected = {t: 0 for t in self.tasks}
        shares = {t: self.table.data_share(t) for t in self.tasks}
        seen: set[str] = set()
        needs_control = getattr(self.aggregator, "needs_control", False)
        observed: dict[tuple[str, str], float] = {}
        split = {t: self.split_keys(t) for t in self.tasks}
        for reply in replies:
            node = reply.metadata.src_node_id
            cid = self._node_to_cid.get(node)
            if cid is None or cid not in expected:
                log(WARNING, "Ignoring a train reply from node %d, which was not asked", node)
                continue
            if cid in seen:
                log(WARNING, "Client %s: duplicated train reply ignored", cid)
                continue
            seen.add(cid)
            asked = expected[cid]
            if reply.has_error():
                log(WARNING, "Client %s failed to train %s (error %s: %s); its updates are "
                    "missing from the aggregate",
                    cid, sorted(asked), reply.error.code, reply.error.reason)
                for t in asked:
                    rejected[t] += 1
                continue
            content = reply.content
            for key in content.array_records:
                task = P.task_of(key, P.ARRAYS_PREFIX)
                if task is None and needs_control:
                    task = P.task_of(key, P.CONTROL_PREFIX)
                if task not in asked:
                    log(WARNING, "Client %s: rejected arrays under %r (task not assigned "
                        "to it this round)", cid, key)
            for task, pick in asked.items():
                try:
                    if P.arrays_key(task) not in content.array_records:
                        raise InvalidReply("no weights returned")
                    local = check_weights(content[P.arrays_key(task)], self.weights[task])
                    train_keys, state_keys = split[task]
                    if self.max_update_norm is not None:
                        glob_w = self.weights[task]
                        norm = l2_norm(
                            glob_w[k].astype(np.float64) - local[k] for k in train_keys
                        )
                        if not norm <= self.max_update_norm:
                            raise InvalidReply(
                                f"update norm {norm:.4g} exceeds max_update_norm "
                                f"{self.max_update_norm:g}"
                            )
                    metrics = content.metric_records.get(P.metrics_key(task))
                    if metrics is None:
                        raise InvalidReply(f"no '{P.metrics_key(task)}' MetricRecord")
                    check_count(metrics.get(P.NUM_EXAMPLES), P.NUM_EXAMPLES, MAX_NUM_EXAMPLES)
                    control = None
                    if needs_control:
                        if P.control_key(task) not in content.array_records:
                            raise InvalidReply("no SCAFFOLD control variate returned")
                        ref = {k: self.weights[task][k] for k in train_keys}
                        c = check_weights(content[P.control_key(task)], ref)
                        control = [c[k] for k in train_keys]
                    tl = metrics.get(P.TRAIN_LOSS)
                    train_loss = (
                        None if tl is None else check_loss(tl, P.TRAIN_LOSS, self.max_loss)
                    )
                except InvalidReply as err:
                    log(WARNING, "Client %s: rejected update for task %r: %s", cid, task, err)
                    rejected[task] += 1
                    continue
                info = self.table[cid]
                n = info.num_examples[task]
                glob = self.weights[task]
                updates[task].append(
                    Update(
                        cid=cid,
                        delta=[glob[k].astype(np.float64) - local[k] for k in train_keys],
                        num_examples=n,
                        data_share=shares[task].get(cid, 0.0),
                        processors=info.processors,
                        prob=pick.prob,
                        count=pick.count,
                        control=control,
                        state=[local[k] for k in state_keys],
                    )
                )
                if train_loss is not None:
                    train_losses[task].append((train_loss, n))
                    observed[(cid, task)] = train_loss
        for cid, asked in expected.items():
            if cid not in seen:
                log(WARNING, "Client %s sent no train reply this round (tasks %s); "
                    "its updates are missing from the aggregate", cid, sorted(asked))
                for t in asked:
                    rejected[t] += 1
        if hasattr(self.policy, "observe"):
            self.policy.observe(server_round, observed, self._round_picks)
        trained = updates
        if getattr(self.policy, "selects_after_training", False):
            updates = self._select_after_training(server_round, updates)
        needs_fresh = getattr(self.aggregator, "needs_fresh", False)
        metrics = MetricRecord()
        self._round_rows = {}
        for task in self.tasks:
            old = self.weights[task]
            train_keys, state_keys = split[task]
            new_train = self.aggregator.aggregate(
                task,
                [old[k] for k in train_keys],
                updates[task],
                server_round,
                shares=shares[task],
                fresh={u.cid: u.delta for u in trained[task]} if needs_fresh else None,
            )
            new_state = average_state([old[k] for k in state_keys], updates[task])
            if not all(
                np.isfinite(a).all() for a in new_train + new_state if a.dtype.kind in "fc"
            ):
                log(ERROR, "Task %r: aggregation produced NaN/inf (overflow); the global "
                    "model is left unchanged this round", task)
                new_train = [old[k] for k in train_keys]
                new_state = [old[k] for k in state_keys]
            step_l1 = float(
                sum(
                    np.abs(a.astype(np.float64) - old[k]).sum()
                    for a, k in zip(new_train, train_keys)
                )
            )
            new_values = dict(zip(train_keys + state_keys, new_train + new_state))
            self.weights[task] = {k: new_values[k] for k in old}
            self.arrays[task] = numpy_to_arrays(self.weights[task])
            tl = train_losses[task]
            mean_tl = (
                float(sum(v * n for v, n in tl) / sum(n for _, n in tl)) if tl else math.nan
            )
            self._round_rows[task] = {
                "uploads": len(updates[task]),
                "assigned": sum(1 for p in self._round_picks if p.task == task),
                "rejected": rejected[task],
                "train_loss": mean_tl,
                "step_l1": step_l1,
            }
            metrics[f"{task}.uploads"] = len(updates[task])
            if tl:
                metrics[f"{task}.train-loss"] = mean_tl
        return None, metrics

    def _select_after_training(
        self, server_round: int, updates: dict[str, list[Update]]
    ) -> dict[str, list[Update]]:
        """GVR-style policies: every pair trained; sample which updates count.

        The signal is each update's norm ``||G||``, or ``||G - beta h||`` when the
        policy asks for the ``stale-residual`` signal and the aggregator keeps
        stale updates.
        """
        residual = getattr(self.policy, "signal", None) == "stale-residual" and hasattr(
            self.aggregator, "residual_norm"
        )
        norms = {
            (u.cid, task): (
                self.aggregator.residual_norm(task, u.cid, u.delta)  # type: ignore[attr-defined]
                if residual
                else l2_norm(u.delta)
            )
            for task, us in updates.items()
            for u in us
        }
        chosen = {
            (p.cid, p.task): p
            for p in self.policy.select(  # type: ignore[attr-defined]
                self.table, self.tasks, norms, server_round, self.rng
            )
        }
        return {
            task: [
                dataclasses.replace(
                    u, prob=chosen[(u.cid, task)].prob, count=chosen[(u.cid, task)].count
                )
                for u in us
                if (u.cid, task) in chosen
            ]
            for task, us in updates.items()
        }

    # ------------------------------------------------------------ evaluation
    def configure_evaluate(
        self,
        server_round: int,
        arrays: ArrayRecord | None,
        config: ConfigRecord,
        grid: Grid,
    ) -> Iterable[Message]:
        """Client-side evaluation of every model on a fraction of the clients."""
        if self.fraction_evaluate <= 0:
            return []
        ids = self.table.ids()
        k = max(1, int(round(self.fraction_evaluate * len(ids)))) if ids else 0
        chosen = sorted(self._eval_rng.choice(len(ids), size=k, replace=False)) if k else []
        messages = []
        active = set(self.tasks)
        for j in chosen:
            cid = ids[int(j)]
            tasks, content = self._models_for(cid, active)
            if not tasks:
                continue
            cfg = ConfigRecord(dict(config))
            cfg[P.CFG_ROUND] = server_round
            cfg[P.CFG_TASKS] = tasks
            content[P.CONFIG_KEY] = cfg
            messages.append(
                self._message(self._cid_to_node[cid], content, MessageType.EVALUATE, server_round)
            )
        return messages

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Example-weighted mean of client-side loss and accuracy, per task."""
        sums: dict[str, list[float]] = {}
        seen: set[str] = set()
        active = set(self.tasks)
        for reply in replies:
            cid = self._node_to_cid.get(reply.metadata.src_node_id)
            if cid is None:
                continue
            if cid in seen:
                log(WARNING, "Client %s: duplicated evaluation reply ignored", cid)
                continue
            seen.add(cid)
            if reply.has_error():
                log(WARNING, "Client %s failed to evaluate (error %s: %s)",
                    cid, reply.error.code, reply.error.reason)
                continue
            sent = [t for t in self.table[cid].tasks if t in active]
            for key in reply.content.metric_records:
                task = P.task_of(key, P.METRICS_PREFIX)
                if task not in sent:
                    log(WARNING, "Client %s: rejected evaluation record %r (model not "
                        "sent to it)", cid, key)
            for task in sent:
                m = reply.content.metric_records.get(P.metrics_key(task))
                if m is None:
                    continue
                try:
                    n = check_count(m.get(P.NUM_EXAMPLES), P.NUM_EXAMPLES, MAX_NUM_EXAMPLES)
                    loss = check_loss(m.get(P.LOSS), P.LOSS, self.max_loss)
                    acc = check_loss(m.get(P.ACCURACY), P.ACCURACY, 1.0)
                except InvalidReply as err:
                    log(WARNING, "Client %s: rejected evaluation of %r: %s", cid, task, err)
                    continue
                s = sums.setdefault(task, [0.0, 0.0, 0.0])
                s[0] += n * loss
                s[1] += n * acc
                s[2] += n
        if not sums:
            return None
        out = MetricRecord()
        for task, (l_sum, a_sum, n) in sums.items():
            out[f"{task}.loss"] = l_sum / n
            out[f"{task}.accuracy"] = a_sum / n
        return out

    # ------------------------------------------------------------------ start
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
        """Run ``num_rounds`` MMFL rounds over every model.

        Parameters
        ----------
        grid : Grid
            Flower's Grid (simulation, deployment, or
            :class:`~mmfl_flwr.grid.InProcessGrid`).
        initial_arrays : Mapping[str, ArrayRecord]
            Initial weights, one ArrayRecord per task (model) name.
        num_rounds : int
            Rounds to run.
        timeout : float
            Seconds to wait for the replies of one send (late replies are dropped).
        train_config, evaluate_config : ConfigRecord, optional
            Extra configuration sent to the clients with every train / evaluate
            message.
        evaluate_fn : callable, optional
            Server-side evaluation ``(server_round, task, arrays) -> metrics``,
            called for every task before the first round and after each
            evaluation round. Metrics named ``accuracy`` and ``loss`` go to the
            history.
        resume_from : str, optional
            A checkpoint written by this strategy (``checkpoint_path``): the run
            continues after its last finished round, with its models, policy and
            aggregator state, client table, RNG states and history
            (``initial_arrays`` is then ignored). State that clients keep
            themselves (SCAFFOLD's ``c_i``) is not part of it.

        Returns
        -------
        MultiModelResult
            Final weights per task and the per-round, per-task history.
        """
        self._waited = False
        self._current_round = 0
        unknown = set(self.task_arrivals) - set(initial_arrays or {}) if resume_from is None else set()
        if unknown:
            raise ValueError(f"task_arrivals names unknown tasks {sorted(unknown)}")
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        result = MultiModelResult()
        first = 1
        if resume_from is not None:
            first = self._resume(resume_from, result) + 1
            log(INFO, "Resuming %s from %s after round %d", type(self).__name__,
                resume_from, first - 1)
        else:
            self.set_models(initial_arrays)
        log(INFO, "Starting %s over %d models for %d rounds",
            type(self).__name__, len(self.tasks), num_rounds)
        self.summary()

        if resume_from is None:
            rows0 = []
            for task in self.tasks:
                row = {"round": 0, "task": task, "uploads": 0, "assigned": 0, "rejected": 0,
                       "train_loss": math.nan, "step_l1": 0.0}
                row.update(self._server_eval(evaluate_fn, 0, task, result))
                rows0.append(row)
            result.history.extend(rows0)
            if self.checkpoint_path:
                self.save_checkpoint(0, result)
            if self.on_round_end:
                self.on_round_end(0, rows0)

        for rnd in range(first, num_rounds + 1):
            self._current_round = rnd
            t0 = time.monotonic()
            log(INFO, "")
            log(INFO, "[ROUND %s/%s]", rnd, num_rounds)
            self.refresh_clients(grid, rnd, timeout)
            log(INFO, "%d clients online", len(self.table.ids()))
            if self.policy.needs_losses:
                only = (
                    self.policy.loss_query_clients(self.table, self.tasks)  # type: ignore[attr-defined]
                    if hasattr(self.policy, "loss_query_clients")
                    else None
                )
                n = self.query_losses(grid, rnd, timeout, only)
                log(INFO, "Loss query: %d (client, task) losses received", n)
            messages = list(self.configure_train(rnd, None, train_config, grid))
            result.assignments[rnd] = [(p.cid, p.task, p.count) for p in self._round_picks]
            log(INFO, "configure_train: %d picks on %d nodes", len(self._round_picks), len(messages))
            replies = list(grid.send_and_receive(messages, timeout=timeout)) if messages else []
            _, train_metrics = self.aggregate_train(rnd, replies)
            if train_metrics is not None:
                result.train_metrics_clientapp[rnd] = {"all": train_metrics}

            rows = []
            is_eval_round = rnd % self.evaluate_every == 0 or rnd == num_rounds
            client_eval = None
            if is_eval_round:
                ev_msgs = list(self.configure_evaluate(rnd, None, evaluate_config, grid))
                if ev_msgs:
                    client_eval = self.aggregate_evaluate(
                        rnd, grid.send_and_receive(ev_msgs, timeout=timeout)
                    )
                    if client_eval is not None:
                        result.evaluate_metrics_clientapp[rnd] = {"all": client_eval}
            round_l1 = sum(r["step_l1"] for r in self._round_rows.values())
            for task in self.tasks:
                row = {"round": rnd, "task": task, **self._round_rows[task],
                       "round_step_l1": round_l1}
                if is_eval_round:
                    row.update(self._server_eval(evaluate_fn, rnd, task, result))
                else:
                    row.update({"accuracy": math.nan, "loss": math.nan})
                if client_eval is not None:
                    row["client_accuracy"] = client_eval.get(f"{task}.accuracy", math.nan)
                    row["client_loss"] = client_eval.get(f"{task}.loss", math.nan)
                row["seconds"] = time.monotonic() - t0
                rows.append(row)
            result.history.extend(rows)
            for row in rows:
                log(INFO, "  %-12s acc %.4f loss %.4f uploads %d", row["task"],
                    row["accuracy"], row["loss"], row["uploads"])
            if self.checkpoint_path:
                self.save_checkpoint(rnd, result)
            if self.on_round_end:
                self.on_round_end(rnd, rows)
        result.arrays = dict(self.arrays)
        return result

    # ------------------------------------------------------------ checkpoints
    def state_dict(self, server_round: int, result: MultiModelResult) -> dict[str, Any]:
        """Everything needed to continue after ``server_round`` (plain data)."""
        return {
            "round": server_round,
            "weights": {t: dict(w) for t, w in self.weights.items()},
            "policy": self.policy.state_dict(),
            "aggregator": self.aggregator.state_dict(),
            "table": self.table.state_dict(),
            "rng": self.rng.bit_generator.state,
            "eval_rng": self._eval_rng.bit_generator.state,
            "history": [dict(r) for r in result.history],
            "trainable": {t: list(k) for t, k in self.trainable.items()},
            "assignments": dict(result.assignments),
            **self._identity(),
        }

    def _identity(self) -> dict[str, Any]:
        """What must match for a checkpoint to be resumed by this strategy."""
        agg = {k: v for k, v in self.aggregator.config().items() if k != "storage"}
        return {
            "policy_name": type(self.policy).__name__,
            "aggregator_name": type(self.aggregator).__name__,
            "policy_config": repr(sorted(self.policy.config().items())),
            "aggregator_config": repr(sorted(agg.items())),
            "seed": self.seed,
        }

    def check_resumable(self, path: str) -> dict[str, Any]:
        """Load a checkpoint and check it was written by an identical strategy
        (policy, aggregator, their parameters, seed); returns its state."""
        from mmfl_flwr.checkpoint import load_checkpoint

        state = load_checkpoint(path)
        for key, mine in self._identity().items():
            if key in state and state[key] != mine:
                raise ValueError(
                    f"checkpoint {path} was written with {key} = {state[key]!r}, but this "
                    f"strategy has {mine!r}; resume with the same strategy and seed"
                )
        return state

    def save_checkpoint(self, server_round: int, result: MultiModelResult) -> None:
        """Write :meth:`state_dict` atomically to ``checkpoint_path``."""
        from mmfl_flwr.checkpoint import save_checkpoint

        assert self.checkpoint_path is not None
        save_checkpoint(self.checkpoint_path, self.state_dict(server_round, result))

    def _resume(self, path: str, result: MultiModelResult) -> int:
        state = self.check_resumable(path)
        self.set_models({t: numpy_to_arrays(w) for t, w in state["weights"].items()})
        self.policy.load_state_dict(state["policy"])
        self.aggregator.load_state_dict(state["aggregator"])
        self.table.load_state_dict(state["table"])
        self.trainable = {**state.get("trainable", {}), **self._pinned_trainable}
        self.rng.bit_generator.state = state["rng"]
        self._eval_rng.bit_generator.state = state["eval_rng"]
        result.history.extend(state["history"])
        result.assignments.update(state["assignments"])
        return int(state["round"])

    def _server_eval(
        self, evaluate_fn: EvaluateFn | None, rnd: int, task: str, result: MultiModelResult
    ) -> dict[str, float]:
        if evaluate_fn is None:
            return {"accuracy": math.nan, "loss": math.nan}
        res = evaluate_fn(rnd, task, self.arrays[task])
        if res is None:
            return {"accuracy": math.nan, "loss": math.nan}
        rec = res if isinstance(res, MetricRecord) else MetricRecord(dict(res))
        result.evaluate_metrics_serverapp.setdefault(rnd, {})[task] = rec
        return {
            "accuracy": float(rec.get("accuracy", math.nan)),  # type: ignore[arg-type]
            "loss": float(rec.get("loss", math.nan)),  # type: ignore[arg-type]
        }
