"""Phases 3-5 of a round: the policy's assignment, one train message per node
carrying every model assigned to it, and the validation of the replies."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log

from mmfl_flwr import protocol as P
from mmfl_flwr.core.aggregators import Aggregator, Update
from mmfl_flwr.core.policy import Policy, picks_by_client
from mmfl_flwr.records import InvalidReply, numpy_to_arrays
from mmfl_flwr.strategy.replies import client_replies
from mmfl_flwr.strategy.run import RoundPlan, RunState
from mmfl_flwr.strategy.validation import Limits, validate_train_part


@dataclass(frozen=True)
class TrainConfig:
    """Local-training settings sent with every train message (the user's
    ``train_config`` keys win)."""

    local_epochs: int
    lr: float
    batch_size: int
    seed: int

    def __post_init__(self) -> None:
        if self.local_epochs < 1:
            raise ValueError(f"local_epochs must be >= 1, got {self.local_epochs}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    def record(self, base: ConfigRecord, server_round: int, tasks: list[str]) -> ConfigRecord:
        """The ``config`` record of one train message."""
        cfg = ConfigRecord(dict(base))
        cfg[P.CFG_ROUND] = server_round
        cfg[P.CFG_TASKS] = tasks
        cfg.setdefault(P.CFG_EPOCHS, self.local_epochs)
        cfg.setdefault(P.CFG_LR, self.lr)
        cfg.setdefault(P.CFG_BATCH_SIZE, self.batch_size)
        cfg.setdefault(P.CFG_SEED, self.seed)
        return cfg


def plan_round(
    run: RunState,
    policy: Policy,
    aggregator: Aggregator,
    server_round: int,
    base_config: ConfigRecord,
    train: TrainConfig,
) -> RoundPlan:
    """Ask the policy who trains what, drop impossible picks (offline clients,
    inactive tasks, tasks a client holds no data for), and build one train
    message per client with every model assigned to it."""
    active = run.tasks
    picks = policy.assign(run.table, active, server_round, run.rng)
    valid = [
        p for p in picks
        if p.cid in run.cid_to_node and p.task in active and p.task in run.table[p.cid].num_examples
    ]
    if len(valid) != len(picks):
        log(WARNING, "Policy %r made %d picks of offline clients or of tasks a client holds "
            "no data for; dropped", policy, len(picks) - len(valid))
    controls: dict[str, ArrayRecord] = {}
    if aggregator.needs_control:
        for t in {p.task for p in valid}:
            keys = run.split_keys(t)[0]
            c = aggregator.server_control(t, [run.weights[t][k] for k in keys])
            controls[t] = numpy_to_arrays(dict(zip(keys, c)))
    messages = []
    for cid, mine in picks_by_client(valid).items():
        tasks = [p.task for p in mine]
        content = RecordDict({P.arrays_key(t): run.arrays[t] for t in tasks})
        content[P.CONFIG_KEY] = train.record(base_config, server_round, tasks)
        for t in tasks:
            if t in controls:
                content[P.control_key(t)] = controls[t]
        messages.append(run.message(cid, content, MessageType.TRAIN, server_round))
    return RoundPlan(server_round, list(active), valid, messages)


@dataclass
class TrainOutcome:
    """The validated result of one round's train replies, per task."""

    updates: dict[str, list[Update]]
    #: task -> (training loss, examples, client) of every accepted update reporting one
    train_losses: dict[str, list[tuple[float, int, str]]]
    rejected: dict[str, int]
    #: (client, task) -> training loss of every accepted update (for the policy)
    observed: dict[tuple[str, str], float] = field(default_factory=dict)


def collect_updates(
    run: RunState,
    plan: RoundPlan,
    replies: Iterable[Message],
    shares: dict[str, dict[str, float]],
    limits: Limits,
    needs_control: bool,
) -> TrainOutcome:
    """Validate every (client, task) part of every reply on its own; each
    rejection is logged with the client id and the rest becomes updates."""
    expected = plan.expected()
    out = TrainOutcome(
        updates={t: [] for t in plan.tasks},
        train_losses={t: [] for t in plan.tasks},
        rejected={t: 0 for t in plan.tasks},
    )
    split = {t: run.split_keys(t) for t in plan.tasks}
    answered: set[str] = set()

    def failed(cid: str, reply: Message) -> None:
        answered.add(cid)
        log(WARNING, "Client %s failed to train %s (error %s: %s); its updates are missing "
            "from the aggregate", cid, sorted(expected[cid]), reply.error.code,
            reply.error.reason)
        for t in expected[cid]:
            out.rejected[t] += 1

    for cid, reply in client_replies(run.node_to_cid, replies, "train", expected, failed,
                                     plan.server_round):
        answered.add(cid)
        asked = expected[cid]
        content = reply.content
        for key in content.array_records:
            task = P.task_of(key, P.ARRAYS_PREFIX)
            if task is None and needs_control:
                task = P.task_of(key, P.CONTROL_PREFIX)
            if task not in asked:
                log(WARNING, "Client %s: rejected arrays under %r (task not assigned to it "
                    "this round)", cid, key)
        info = run.table[cid]
        for task, pick in asked.items():
            try:
                update, train_loss = validate_train_part(
                    content, task, pick, info, run.weights[task], split[task],
                    shares[task].get(cid, 0.0), limits, needs_control,
                )
            except InvalidReply as err:
                log(WARNING, "Client %s: rejected update for task %r: %s", cid, task, err)
                out.rejected[task] += 1
                continue
            out.updates[task].append(update)
            if train_loss is not None:
                out.train_losses[task].append((train_loss, update.num_examples, cid))
                out.observed[(cid, task)] = train_loss
    for cid, asked in expected.items():
        if cid not in answered:
            log(WARNING, "Client %s sent no train reply this round (tasks %s); its updates "
                "are missing from the aggregate", cid, sorted(asked))
            for t in asked:
                out.rejected[t] += 1
    return out
