"""Full participation split across models: MFA-Rand and MFA-RR (paper 002,
Algorithms 2 and 3), and paper 004's Multi-FedAvg baseline.

Framework-free (numpy only). Every client trains at most one model per round;
aggregate with FedAvg per model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mmfl_flwr.core.aggregators import FedAvgAggregator
from mmfl_flwr.core.card import AlgorithmCard
from mmfl_flwr.core.clients import ClientTable
from mmfl_flwr.core.parameter import Parameter
from mmfl_flwr.core.policy import Pick, Policy, check_k, sample_clients


class _KClients(Policy):
    """A policy of ``K`` clients per round (``clients_per_round``; None = all)."""

    def __init__(self, clients_per_round: int | None = None):
        check_k(clients_per_round)
        self.clients_per_round = clients_per_round

    def config(self) -> dict[str, Any]:
        return {"clients_per_round": self.clients_per_round}


class MultiFedAvg(_KClients):
    """Multi-FedAvg (paper 004): ``K`` uniformly random clients, each with a
    uniformly random model among the ones it holds data for.

    Parameters
    ----------
    clients_per_round : int
        ``K``; all online clients when None.
    """

    name = "multi-fedavg"

    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        active = set(tasks)
        ids = [c.cid for c in table.clients() if any(t in active for t in c.tasks)]
        chosen, rate = sample_clients(ids, self.clients_per_round, rng)
        picks = []
        for cid in chosen:
            ts = [t for t in table[cid].tasks if t in active]
            t = ts[int(rng.integers(len(ts)))]
            picks.append(Pick(cid, t, 1, rate / len(ts)))
        return picks


class MFARand(_KClients):
    """MFA-Rand (paper 002, Algorithm 2).

    Every round the participating clients are split uniformly at random into
    ``M`` near-equal groups (``M`` = number of active tasks), and the groups are
    matched to the models uniformly at random. With ``clients_per_round = K`` the
    round first samples ``K`` of the ``N`` online clients (the partial-participation
    variant of Section 7.1). A client whose group's model is one it has no data for
    sits the round out.
    """

    name = "mfa-rand"

    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        tasks = list(tasks)
        if not tasks:
            return []
        chosen, rate = sample_clients(table.ids(), self.clients_per_round, rng)
        order = rng.permutation(len(chosen))
        groups = np.array_split(order, len(tasks))
        model_of_group = rng.permutation(len(tasks))
        prob = rate / len(tasks)
        picks = []
        for g, members in enumerate(groups):
            task = tasks[int(model_of_group[g])]
            for j in np.sort(members):
                cid = chosen[int(j)]
                if task in table[cid].num_examples:
                    picks.append(Pick(cid, task, 1, prob))
        return picks


class MFARoundRobin(_KClients):
    """MFA-RR (paper 002, Algorithm 3).

    At the start of each frame of ``M`` rounds the online clients are split
    uniformly at random into ``M`` near-equal groups; in round ``u`` (0-based) of
    the frame, group ``j`` trains model ``(j + u) mod M``, so each client trains
    each model exactly once per frame. With ``clients_per_round = K``, only ``K``
    uniformly sampled clients train in each round (each the model its group has
    that round). A new frame starts early when the set of tasks changes; clients
    that come online mid-frame wait for the next frame.
    """

    name = "mfa-rr"

    def __init__(self, clients_per_round: int | None = None):
        super().__init__(clients_per_round)
        self._groups: dict[str, int] = {}
        self._frame_start = 0
        self._frame_tasks: list[str] = []

    def state_dict(self) -> dict[str, Any]:
        return {
            "groups": dict(self._groups),
            "frame_start": self._frame_start,
            "frame_tasks": list(self._frame_tasks),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._groups = {str(k): int(v) for k, v in state["groups"].items()}
        self._frame_start = int(state["frame_start"])
        self._frame_tasks = list(state["frame_tasks"])

    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        tasks = list(tasks)
        m = len(tasks)
        if m == 0:
            return []
        if (
            not self._groups
            or tasks != self._frame_tasks
            or server_round - self._frame_start >= m
            or server_round < self._frame_start
        ):
            ids = table.ids()
            order = rng.permutation(len(ids))
            # Random group labels: with N not divisible by M the larger groups
            # must not always start on the same model, or Pick.prob (1/M) would
            # not be the true marginal inclusion probability.
            label = rng.permutation(m)
            self._groups = {
                ids[int(j)]: int(label[g])
                for g, members in enumerate(np.array_split(order, m))
                for j in members
            }
            self._frame_start = server_round
            self._frame_tasks = tasks
        u = server_round - self._frame_start
        members = [cid for cid in table.ids() if cid in self._groups]
        chosen, rate = sample_clients(members, self.clients_per_round, rng)
        picks = []
        for cid in chosen:
            task = tasks[(self._groups[cid] + u) % m]
            if task in table[cid].num_examples:
                picks.append(Pick(cid, task, 1, rate / m))
        return picks


# ------------------------------------------------------------------ cards
#: ``K`` of the K-client policies; as a setting 0 means all clients (the
#: policy's default, None).
CLIENTS_PER_ROUND = Parameter(
    name="clients_per_round",
    type=int,
    default=0,
    unset=0,
    help="K, the clients that train per round",
    low=0,
    high="num_clients",
    zero="all clients",
)

CARDS = (
    AlgorithmCard(
        name="mfa-rand",
        function="mfa_rand",
        title="MFA-Rand",
        paper="002",
        section="Algorithm 2",
        summary="random near-equal groups each round, random group→model matching",
        rule="FedAvg per model",
        policy=MFARand,
        aggregator=FedAvgAggregator,
        parameters=(CLIENTS_PER_ROUND,),
    ),
    AlgorithmCard(
        name="mfa-rr",
        function="mfa_rr",
        title="MFA-RR",
        paper="002",
        section="Algorithm 3",
        summary="groups fixed per frame of M rounds, models rotate, each client trains each "
        "model once per frame",
        rule="FedAvg per model",
        policy=MFARoundRobin,
        aggregator=FedAvgAggregator,
        parameters=(CLIENTS_PER_ROUND,),
    ),
    AlgorithmCard(
        name="multi-fedavg",
        function="multi_fedavg",
        title="Multi-FedAvg",
        paper="004",
        section="Section 3, baseline",
        summary="K random clients, a random model each",
        rule="FedAvg per model",
        policy=MultiFedAvg,
        aggregator=FedAvgAggregator,
        parameters=(CLIENTS_PER_ROUND,),
    ),
)
