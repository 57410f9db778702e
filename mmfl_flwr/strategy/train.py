"""Phases 3-4 of a round: the policy's assignment and one train message per node
carrying every model assigned to it (the replies are validated in
:mod:`~mmfl_flwr.strategy.validation`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from logging import WARNING

from flwr.app import ArrayRecord, ConfigRecord, MessageType, RecordDict
from flwr.common.logger import log

from mmfl_flwr import protocol as P
from mmfl_flwr.core.aggregators import Aggregator
from mmfl_flwr.core.policy import Policy, picks_by_client
from mmfl_flwr.records import numpy_to_arrays
from mmfl_flwr.strategy.state import RoundPlan, RunState


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
    run_state: RunState,
    policy: Policy,
    aggregator: Aggregator,
    server_round: int,
    base_config: ConfigRecord,
    train: TrainConfig,
) -> RoundPlan:
    """Ask the policy who trains what, drop impossible picks (offline clients,
    inactive tasks, tasks a client holds no data for), and build one train
    message per client with every model assigned to it."""
    active = run_state.tasks
    picks = policy.assign(run_state.table, active, server_round, run_state.rng)
    valid = [
        p
        for p in picks
        if p.cid in run_state.cid_to_node
        and p.task in active
        and p.task in run_state.table[p.cid].num_examples
    ]
    if len(valid) != len(picks):
        log(
            WARNING,
            "Policy %r made %d picks of offline clients or of tasks a client holds "
            "no data for; dropped",
            policy,
            len(picks) - len(valid),
        )
    controls: dict[str, ArrayRecord] = {}
    if aggregator.needs_control:
        for t in {p.task for p in valid}:
            keys = run_state.split_keys(t)[0]
            c = aggregator.server_control(t, [run_state.weights[t][k] for k in keys])
            controls[t] = numpy_to_arrays(dict(zip(keys, c)))
    parts = []
    for cid, mine in picks_by_client(valid).items():
        tasks = [p.task for p in mine]
        content = RecordDict({P.arrays_key(t): run_state.arrays[t] for t in tasks})
        content[P.CONFIG_KEY] = train.record(base_config, server_round, tasks)
        for t in tasks:
            if t in controls:
                content[P.control_key(t)] = controls[t]
        parts.append((cid, content))
    messages = run_state.messages(parts, MessageType.TRAIN, server_round)
    return RoundPlan(server_round, list(active), valid, messages)
