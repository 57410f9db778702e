"""Assignment policies: who trains which model this round.

Framework-free (numpy only). A policy looks at the :class:`ClientTable` and the list
of active tasks and returns a list of :class:`Pick` objects, drawing every random
choice from the ``numpy.random.Generator`` it is given, so one seed fixes a run.

Each pick carries the *true* inclusion probability ``p_{s|(i,b)}`` of one processor
of the client training that task, so that any policy can be paired with the
unbiased ``d / (B p)`` aggregator of paper 003 (Eq. 3).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mmfl_flwr.core.clients import ClientTable


@dataclass(frozen=True)
class Pick:
    """Client ``cid`` trains ``task`` this round.

    Parameters
    ----------
    cid : str
        Stable client id.
    task : str
        Model (task) name.
    count : int
        How many of the client's processors drew this task (paper 003, Remark 1:
        the client trains once and the update counts ``count`` times).
    prob : float
        Probability that one processor of this client trains this task this round,
        ``p_{s|(i,b)}``, identical for each of the client's processors.
    """

    cid: str
    task: str
    count: int = 1
    prob: float = 1.0


def picks_by_client(picks: Sequence[Pick]) -> dict[str, list[Pick]]:
    """Group picks by client id, keeping their order."""
    out: dict[str, list[Pick]] = {}
    for p in picks:
        out.setdefault(p.cid, []).append(p)
    return out


class Policy(ABC):
    """Base class of all assignment policies.

    Subclasses set ``name`` and, if they need fresh client losses before assigning,
    ``needs_losses = True`` (the strategy then sends a loss query first).
    """

    name: ClassVar[str] = "policy"
    needs_losses: ClassVar[bool] = False

    @abstractmethod
    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        """Return this round's picks among the online clients of ``table``."""

    def config(self) -> dict[str, Any]:
        """Tunable parameters, for logs and summaries."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state (for checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


def _check_k(clients_per_round: int | None) -> None:
    if clients_per_round is not None and (
        isinstance(clients_per_round, bool)
        or not isinstance(clients_per_round, (int, np.integer))
        or clients_per_round < 1
    ):
        raise ValueError(
            f"clients_per_round must be a positive integer or None, "
            f"got {clients_per_round!r}"
        )


def _sample_clients(
    ids: list[str], k: int | None, rng: np.random.Generator
) -> tuple[list[str], float]:
    """Uniformly sample ``k`` ids without replacement; returns (ids, k/N)."""
    if k is None or k >= len(ids):
        return list(ids), 1.0
    idx = np.sort(rng.choice(len(ids), size=k, replace=False))
    return [ids[i] for i in idx], k / len(ids)


class FullParticipation(Policy):
    """Every online client trains every task it holds data for, every round.

    The reference of paper 003 ("full participation"); it ignores processor limits
    and budgets.
    """

    name = "full"

    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        active = set(tasks)
        return [
            Pick(c.cid, t, 1, 1.0)
            for c in table.clients()
            for t in c.tasks
            if t in active
        ]


class RandomAllocation(Policy):
    """Paper 003's random baseline, at processor level.

    Each processor of each client is active with probability ``q = min(1, m / V)``
    (``V`` the total number of processors) and then trains a uniformly random task
    among the client's eligible tasks, so ``p_{s|(i,b)} = q / |S_i|``. Processors of
    one client that draw the same task count once each (``Pick.count``).

    Parameters
    ----------
    budget : float, optional
        ``m``, the expected number of updates per round. Overrides
        ``budget_fraction``.
    budget_fraction : float
        ``m`` as a fraction of ``V`` (default 0.1, as in paper 003).
    """

    name = "random"

    def __init__(self, budget: float | None = None, budget_fraction: float = 0.1):
        if budget is not None and not (math.isfinite(budget) and budget > 0):
            raise ValueError(f"budget must be a positive number, got {budget!r}")
        if not (math.isfinite(budget_fraction) and 0 < budget_fraction):
            raise ValueError(
                f"budget_fraction must be a positive number, got {budget_fraction!r}"
            )
        self.budget = budget
        self.budget_fraction = budget_fraction

    def config(self) -> dict[str, Any]:
        return {"budget": self.budget, "budget_fraction": self.budget_fraction}

    def activation_probability(self, total_processors: int) -> float:
        """``q = min(1, m / V)``."""
        if total_processors <= 0:
            return 0.0
        m = (
            self.budget
            if self.budget is not None
            else self.budget_fraction * total_processors
        )
        return min(1.0, m / total_processors)

    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        active = set(tasks)
        clients = [
            (c, [t for t in c.tasks if t in active]) for c in table.clients()
        ]
        clients = [(c, ts) for c, ts in clients if ts]
        q = self.activation_probability(sum(c.processors for c, _ in clients))
        picks: list[Pick] = []
        for c, ts in clients:
            busy = int(rng.binomial(c.processors, q))
            if busy == 0:
                continue
            counts = rng.multinomial(busy, np.full(len(ts), 1.0 / len(ts)))
            for t, k in zip(ts, counts):
                if k > 0:
                    picks.append(Pick(c.cid, t, int(k), q / len(ts)))
        return picks


class MultiFedAvg(Policy):
    """Multi-FedAvg (paper 004): ``K`` uniformly random clients, each with a
    uniformly random model among the ones it holds data for.

    Parameters
    ----------
    clients_per_round : int
        ``K``; all online clients when None.
    """

    name = "multi-fedavg"

    def __init__(self, clients_per_round: int | None = None):
        _check_k(clients_per_round)
        self.clients_per_round = clients_per_round

    def config(self) -> dict[str, Any]:
        return {"clients_per_round": self.clients_per_round}

    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        active = set(tasks)
        ids = [c.cid for c in table.clients() if any(t in active for t in c.tasks)]
        chosen, rate = _sample_clients(ids, self.clients_per_round, rng)
        picks = []
        for cid in chosen:
            ts = [t for t in table[cid].tasks if t in active]
            t = ts[int(rng.integers(len(ts)))]
            picks.append(Pick(cid, t, 1, rate / len(ts)))
        return picks


class MFARand(Policy):
    """MFA-Rand (paper 002, Algorithm 2).

    Every round the participating clients are split uniformly at random into
    ``M`` near-equal groups (``M`` = number of active tasks), and the groups are
    matched to the models uniformly at random. With ``clients_per_round = K`` the
    round first samples ``K`` of the ``N`` online clients (the partial-participation
    variant of Section 7.1). A client whose group's model is one it has no data for
    sits the round out.
    """

    name = "mfa-rand"

    def __init__(self, clients_per_round: int | None = None):
        _check_k(clients_per_round)
        self.clients_per_round = clients_per_round

    def config(self) -> dict[str, Any]:
        return {"clients_per_round": self.clients_per_round}

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
        chosen, rate = _sample_clients(table.ids(), self.clients_per_round, rng)
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


class MFARoundRobin(Policy):
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
        _check_k(clients_per_round)
        self.clients_per_round = clients_per_round
        self._groups: dict[str, int] = {}
        self._frame_start = 0
        self._frame_tasks: list[str] = []

    def config(self) -> dict[str, Any]:
        return {"clients_per_round": self.clients_per_round}

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
        chosen, rate = _sample_clients(members, self.clients_per_round, rng)
        picks = []
        for cid in chosen:
            task = tasks[(self._groups[cid] + u) % m]
            if task in table[cid].num_examples:
                picks.append(Pick(cid, task, 1, rate / m))
        return picks
