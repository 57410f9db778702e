"""Paper 003's baselines: full participation, random allocation, fixed rates.

Framework-free (numpy only). Random allocation and fixed rates draw every
processor's task independently (:func:`~mmfl_flwr.core.policy.draw_picks`), so
each pick carries its true inclusion probability for the unbiased ``d/(B p)``
rule (paper 003, Eq. 3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmfl_flwr.core.aggregators import FedAvgAggregator, UnbiasedAggregator
from mmfl_flwr.core.card import AlgorithmCard
from mmfl_flwr.core.clients import ClientTable
from mmfl_flwr.core.policy import (
    BUDGET_FRACTION,
    Pick,
    Policy,
    ProbabilityPolicy,
    check_budget,
    draw_picks,
    eligibility_view,
    resolve_budget,
)


class FullParticipation(Policy):
    """Every online client trains every task it holds data for, every round.

    The reference of paper 003 ("full participation"); it ignores processor limits
    and budgets.
    """

    name = "full"

    @property
    def trains_every_pair(self) -> bool:
        return True

    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        active = set(tasks)
        return [Pick(c.cid, t, 1, 1.0) for c in table.clients() for t in c.tasks if t in active]


class RandomAllocation(ProbabilityPolicy):
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
        check_budget(budget, budget_fraction)
        self.budget = budget
        self.budget_fraction = budget_fraction

    def config(self) -> dict[str, Any]:
        return {"budget": self.budget, "budget_fraction": self.budget_fraction}

    def activation_probability(self, total_processors: int) -> float:
        """``q = min(1, m / V)``."""
        if total_processors <= 0:
            return 0.0
        m = resolve_budget(self.budget, self.budget_fraction, total_processors)
        return min(1.0, m / total_processors)

    def probabilities(
        self, table: ClientTable, tasks: Sequence[str]
    ) -> tuple[list[str], np.ndarray, np.ndarray]:
        """``(ids, p (S, N), processors)`` for this round."""
        ids, n, procs, _ = eligibility_view(table, tasks)
        eligible = n > 0
        q = self.activation_probability(int(procs.sum()))
        sizes = eligible.sum(axis=0)
        p = np.where(eligible, q / np.maximum(sizes, 1)[None, :], 0.0)
        return ids, p, procs


class FixedRates(ProbabilityPolicy):
    """Fixed client participation rates (paper 003, Fig. 5's "fixed sampling").

    Clients are split, in id order, into groups of given fractions; every
    processor of a client in a group with rate ``r`` is active with probability
    ``r`` each round and trains a uniformly random eligible task
    (``p = r / |S_i|``). With ``train_all=True`` every client trains every task
    and the draw only decides which updates are aggregated (what MMFL-StaleVR's
    optimal ``beta`` needs).

    Parameters
    ----------
    groups : sequence of (fraction, rate)
        E.g. ``((0.5, 0.04), (0.5, 0.16))``: half the clients at 4%, half at 16%.
    train_all : bool
        Train every pair, select after training.
    """

    name = "fixed-rates"

    def __init__(
        self,
        groups: Sequence[tuple[float, float]] = ((0.5, 0.04), (0.5, 0.16)),
        train_all: bool = False,
    ):
        fracs = [float(f) for f, _ in groups]
        rates = [float(r) for _, r in groups]
        if not groups or any(f <= 0 for f in fracs) or abs(sum(fracs) - 1.0) > 1e-9:
            raise ValueError(f"group fractions must be positive and sum to 1, got {fracs}")
        if any(not 0 < r <= 1 for r in rates):
            raise ValueError(f"rates must be in (0, 1], got {rates}")
        self.groups = [(f, r) for f, r in zip(fracs, rates)]
        self.train_all = bool(train_all)

    def config(self) -> dict[str, Any]:
        return {"groups": self.groups, "train_all": self.train_all}

    @property
    def trains_every_pair(self) -> bool:
        return self.train_all

    @property
    def selects_after_training(self) -> bool:
        return self.train_all

    def rates(self, n: int) -> np.ndarray:
        """The rate of each of ``n`` clients (in id order)."""
        bounds = np.cumsum([f for f, _ in self.groups]) * n
        idx = np.searchsorted(bounds, np.arange(n) + 0.5)
        return np.array([r for _, r in self.groups])[np.minimum(idx, len(self.groups) - 1)]

    def probabilities(
        self, table: ClientTable, tasks: Sequence[str]
    ) -> tuple[list[str], np.ndarray, np.ndarray]:
        """``(ids, p (S, N), processors)``."""
        ids, n, procs, _ = eligibility_view(table, tasks)
        eligible = n > 0
        r = self.rates(len(ids))
        sizes = np.maximum(eligible.sum(axis=0), 1)
        return ids, np.where(eligible, (r / sizes)[None, :], 0.0), procs

    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        if self.train_all:
            return FullParticipation().assign(table, tasks, server_round, rng)
        return super().assign(table, tasks, server_round, rng)

    def select(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        signal: Mapping[tuple[str, str], float],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        """``train_all`` mode: draw the aggregated pairs among those that trained."""
        ids, p, procs = self.probabilities(table, tasks)
        return [pk for pk in draw_picks(ids, tasks, p, procs, rng) if (pk.cid, pk.task) in signal]


# ------------------------------------------------------------------ cards
CARDS = (
    AlgorithmCard(
        name="random",
        function="random_allocation",
        title="Random allocation",
        paper="003",
        section="baseline of Section 6",
        summary="each processor active with probability m/V, then a uniformly random eligible task",
        rule="unbiased `d/(B·p)` (Eq. 3)",
        policy=RandomAllocation,
        aggregator=UnbiasedAggregator,
        parameters=(BUDGET_FRACTION,),
    ),
    AlgorithmCard(
        name="full",
        function="full_participation",
        title="Full participation",
        paper="003",
        section="baseline of Section 6",
        summary="every client trains every task it holds",
        rule="FedAvg (= `w − Σ d·G`)",
        policy=FullParticipation,
        aggregator=FedAvgAggregator,
    ),
)
