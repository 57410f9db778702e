"""The state of one run and of one round, passed explicitly between the phases.

:class:`RunState` is everything a run accumulates (global weights, the client
table, node ids, the trainable keys, the random generators); :class:`RoundPlan`
is one round's assignment and its train messages, handed from the train
configuration to the reply validation and the aggregation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from mmfl_flwr import protocol as P
from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.core.clients import ClientTable
from mmfl_flwr.core.policy import Pick
from mmfl_flwr.records import NumpyWeights, arrays_to_numpy, numpy_to_arrays
from mmfl_flwr.strategy.events import DefenceLog


class HookError(RuntimeError):
    """A strategy hook (``configure_train``, ``aggregate_train``, ... of a
    subclass or wrapper) raised, or returned something the round cannot use;
    the message names the hook. No global model was changed by it."""


@dataclass
class RunState:
    """Everything one run of the strategy accumulates.

    Attributes
    ----------
    seed : int
        The run's seed: ``rng`` (every assignment draw) and ``eval_rng``
        (client-side evaluation sampling) derive from it.
    task_arrivals, client_arrivals : dict
        Task / client id -> first round it takes part in.
    pinned_trainable : dict
        Task -> trainable keys given by the operator (``trainable_keys``).
    weights, arrays : dict
        Current global weights per task (numpy, and as ArrayRecords).
    table : ClientTable
        Registered clients, keyed by stable client id.
    node_to_cid, cid_to_node : dict
        Flower node id -> stable client id of a registered single-client node;
        stable client id -> node id of the clients online now (a multi-client
        node hosts several).
    shards : dict
        Multi-client node id -> the client ids it hosts.
    trainable : dict
        Task -> trainable keys in force (pinned, or the first declaration).
    current_round : int
        The round being run (0 before the first).
    waited : bool
        Whether the wait for ``min_available_nodes`` is done.
    client_pins : dict
        Client id -> the credential its claims must carry (``token:<sha256
        hex>`` of its ``client-token``, or ``key:<sha256 hex>`` of its
        SuperNode's public key); empty = no pinning (see
        :mod:`.registration`).
    verified_nodes : dict
        Node id -> the pin it proved when it registered (pinned ids only).
    bound_at_first_use : dict
        Client id -> the ``key:`` pin it was bound to at first use (kept in
        checkpoints).
    """

    seed: int
    task_arrivals: dict[str, int] = field(default_factory=dict)
    client_arrivals: dict[str, int] = field(default_factory=dict)
    pinned_trainable: dict[str, list[str]] = field(default_factory=dict)
    weights: dict[str, NumpyWeights] = field(default_factory=dict)
    arrays: dict[str, ArrayRecord] = field(default_factory=dict)
    table: ClientTable = field(default_factory=ClientTable)
    node_to_cid: dict[int, str] = field(default_factory=dict)
    cid_to_node: dict[str, int] = field(default_factory=dict)
    #: multi-client node id -> the ids of the clients it hosts (registered)
    shards: dict[int, list[str]] = field(default_factory=dict)
    #: client id -> the multi-client node hosting it (the index of ``shards``)
    shard_of: dict[str, int] = field(default_factory=dict)
    #: multi-client node id -> the ids it declared that were refused (a duplicate
    #: claim, a pin): the node is asked again every round while there are any
    shard_refused: dict[int, list[str]] = field(default_factory=dict)
    #: message type -> the clients its latest round trip addressed (a multi-client
    #: node's parts of other clients are ignored)
    addressed: dict[str, set[str]] = field(default_factory=dict)
    trainable: dict[str, list[str]] = field(default_factory=dict)
    current_round: int = 0
    waited: bool = False
    client_pins: dict[str, str] = field(default_factory=dict)
    verified_nodes: dict[int, str] = field(default_factory=dict)
    #: (multi-client node, client id) -> the pin the client proved when it registered
    verified_shard_clients: dict[tuple[int, str], str] = field(default_factory=dict)
    bound_at_first_use: dict[str, str] = field(default_factory=dict)
    #: task -> recent accepted update norms (the reference of the norm bound)
    norm_history: dict[str, list[float]] = field(default_factory=dict)
    #: task -> client id -> its recent direction cosines (:func:`~.validation.check_directions`)
    direction_history: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    #: task -> largest median reported loss so far (the reference of the loss cap)
    loss_reference: dict[str, float] = field(default_factory=dict)
    #: client id -> the message type its ClientApp has no handler for (left out)
    lacking: dict[str, str] = field(default_factory=dict)
    #: the message types the strategy sends to every client (set by the strategy;
    #: a client that declares its handlers and lacks one is refused at registration)
    needed_handlers: list[str] = field(default_factory=list)
    #: whether a client's declaration of trainable keys may set them (not under DP)
    trust_declared_trainable: bool = True
    #: (client, task) parts of the latest round that did not reach the aggregate
    rejected_parts: list[tuple[str, str]] = field(default_factory=list)
    #: the defence events of the run and the updates received (:mod:`.events`)
    defence: DefenceLog = field(default_factory=DefenceLog)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.eval_rng = np.random.default_rng([self.seed, 1])
        self.trainable = dict(self.pinned_trainable)

    # ----------------------------------------------------------------- models
    @property
    def all_tasks(self) -> list[str]:
        """Every model (task), in order, arrived or not."""
        return list(self.weights)

    @property
    def tasks(self) -> list[str]:
        """The models active in the current round (their arrival round has come)."""
        return [t for t in self.weights if self.task_arrivals.get(t, 0) <= self.current_round]

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
        for task, keys in self.pinned_trainable.items():
            problem = self.trainable_problem(task, keys)
            if problem:
                raise ValueError(f"trainable_keys[{task!r}]: {problem}")

    def set_weights(self, task: str, weights: NumpyWeights) -> None:
        """Replace the global weights of ``task``."""
        self.weights[task] = weights
        self.arrays[task] = numpy_to_arrays(weights)

    def trainable_problem(self, task: str, keys: Sequence[str]) -> str | None:
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
        running statistics, counters) are averaged. Until a declaration, every
        floating-point entry counts as trainable."""
        w = self.weights[task]
        declared = self.trainable.get(task)
        if declared is None:
            train = [k for k, v in w.items() if v.dtype.kind == "f"]
        else:
            wanted = set(declared)
            train = [k for k in w if k in wanted]
        chosen = set(train)
        return train, [k for k in w if k not in chosen]

    # ---------------------------------------------------------------- clients
    def models_for(self, cid: str, active: set[str]) -> tuple[list[str], RecordDict]:
        """The active tasks ``cid`` holds data for, and a RecordDict carrying their
        current global weights (``arrays.<task>``)."""
        tasks = [t for t in self.table[cid].tasks if t in active]
        return tasks, RecordDict({P.arrays_key(t): self.arrays[t] for t in tasks})

    def message(
        self, cid: str, content: RecordDict, message_type: str, server_round: int
    ) -> Message:
        """An instruction to online client ``cid`` for ``server_round``."""
        return instruction(self.cid_to_node[cid], content, message_type, server_round)

    def messages(
        self, parts: list[tuple[str, RecordDict]], message_type: str, server_round: int
    ) -> list[Message]:
        """One instruction per node for the ``(client id, content)`` parts of a
        round trip: a single-client node's content as it is; the parts of a
        multi-client node's clients in one message, the shared records
        (``arrays.<task>``, ``control.<task>``) once and each client's config
        as ``config@<id>`` (with its ``tasks``), in the order of its first part."""
        order: list[tuple[int, RecordDict]] = []
        merged: dict[int, RecordDict] = {}
        self.addressed[message_type] = {cid for cid, _ in parts}
        for cid, content in parts:
            node = self.cid_to_node[cid]
            if node not in self.shards:
                order.append((node, content))
                continue
            whole = merged.get(node)
            if whole is None:
                whole = merged[node] = RecordDict()
                order.append((node, whole))
            cfg = content.config_records.get(P.CONFIG_KEY)
            cfg = ConfigRecord(dict(cfg)) if cfg is not None else ConfigRecord()
            tasks = [
                t
                for t in (P.task_of(k, P.ARRAYS_PREFIX) for k in content.array_records)
                if t is not None
            ]
            cfg.setdefault(P.CFG_TASKS, tasks)
            cfg.setdefault(P.CFG_ROUND, server_round)
            for key, record in content.items():
                if key == P.CONFIG_KEY:
                    continue
                if not key.startswith((P.ARRAYS_PREFIX, P.CONTROL_PREFIX)):
                    raise ValueError(
                        f"record {key!r} of client {cid}'s message cannot be "
                        "shared on its multi-client node"
                    )
                if key not in whole:
                    whole[key] = record
            whole[P.client_key(P.CONFIG_KEY, cid)] = cfg
        return [instruction(node, content, message_type, server_round) for node, content in order]


def instruction(node: int, content: RecordDict, message_type: str, server_round: int) -> Message:
    """An instruction to ``node`` for ``server_round`` (its group id)."""
    return Message(content, dst_node_id=node, message_type=message_type, group_id=str(server_round))


@dataclass
class RoundPlan:
    """One round's assignment: the picks and the train messages carrying them."""

    server_round: int
    tasks: list[str]
    picks: list[Pick]
    messages: list[Message]

    def expected(self) -> dict[str, dict[str, Pick]]:
        """Client id -> task -> its pick."""
        out: dict[str, dict[str, Pick]] = {}
        for p in self.picks:
            out.setdefault(p.cid, {})[p.task] = p
        return out


@dataclass
class TrainOutcome:
    """The validated result of one round's train replies, per task."""

    updates: dict[str, list[Update]]
    #: task -> (training loss, examples, client) of every accepted update reporting one
    train_losses: dict[str, list[tuple[float, int, str]]]
    rejected: dict[str, int]
    #: (client, task) -> training loss of every accepted update (for the policy)
    observed: dict[tuple[str, str], float] = field(default_factory=dict)
    #: (client, task) of every assigned part that did not reach the aggregate
    rejected_parts: list[tuple[str, str]] = field(default_factory=list)

    def reject(self, cid: str, task: str) -> None:
        """Count client ``cid``'s part of ``task`` as one that did not reach the aggregate."""
        self.rejected[task] += 1
        self.rejected_parts.append((cid, task))
