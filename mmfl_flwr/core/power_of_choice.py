"""Power-of-Choice client selection (Cho, Wang and Joshi, "Client Selection in
Federated Learning: Convergence Analysis and Power-of-Choice Selection
Strategies", 2020), per model.

Framework-free (numpy only). Each round, for every model ``s``:

1. draw ``d`` candidate clients among the online clients holding ``s``, without
   replacement, with probability proportional to their data size ``n_{i,s}``;
2. ask the candidates for their loss on ``s`` (the strategy's loss query);
3. pick the ``k`` candidates with the highest loss.

In MMFL the picks must fit the clients' processors: a client trains at most
``B_i`` models per round. The models take turns in a random order each round;
a candidate whose processors are all taken by earlier models is passed over
for the next-highest loss. ``k`` is the per-model share of the budget,
``round(m / S)`` with ``m = budget_fraction x V`` (at least 1), so the budget
means what it means for LVR. Candidates are sampled in proportion to data size,
so the selected models are averaged with equal weights (the paper's rule).

The selection is deterministic given the losses: picks carry no inclusion
probability, so the unbiased ``d/(B p)`` rules are refused with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mmfl_flwr.core.aggregators import MeanAggregator
from mmfl_flwr.core.card import AlgorithmCard
from mmfl_flwr.core.clients import ClientTable
from mmfl_flwr.core.parameter import Parameter
from mmfl_flwr.core.policy import (
    BUDGET_FRACTION,
    Pick,
    Policy,
    check_budget,
    eligibility_view,
    resolve_budget,
)


def draw_candidates(
    ids: Sequence[str], n: np.ndarray, d: int, rng: np.random.Generator
) -> list[str]:
    """``min(d, eligible)`` of ``ids`` without replacement, with probability
    proportional to ``n`` (clients with ``n = 0`` are never drawn), in draw order."""
    n = np.asarray(n, dtype=np.float64)
    eligible = np.flatnonzero(n > 0)
    size = min(int(d), eligible.size)
    if size == 0:
        return []
    p = n[eligible] / n[eligible].sum()
    drawn = rng.choice(eligible.size, size=size, replace=False, p=p)
    return [ids[int(eligible[j])] for j in drawn]


def highest_loss(
    candidates: Sequence[str], losses: dict[str, float], k: int, free: dict[str, int]
) -> list[str]:
    """Up to ``k`` of ``candidates`` with the highest loss among those with a
    reported loss and a free processor (``free[cid] > 0``); ties keep the
    candidates' order. Takes one processor of each one picked from ``free``."""
    ranked = sorted(
        (c for c in candidates if c in losses and np.isfinite(losses[c])), key=lambda c: -losses[c]
    )
    out: list[str] = []
    for cid in ranked:
        if len(out) == k:
            break
        if free.get(cid, 0) > 0:
            free[cid] -= 1
            out.append(cid)
    return out


class PowerOfChoice(Policy):
    """Power-of-Choice selection per model (module docstring).

    Parameters
    ----------
    candidates : int, optional
        ``d``, candidates per model and round; default ``2 k`` (twice the
        picks per model). Fewer are drawn when fewer clients hold the model.
    budget, budget_fraction : float
        The budget ``m`` (absolute, or ``budget_fraction x V``), shared equally
        by the models: ``k = max(1, round(m / S))`` picks per model.
    """

    name = "power-of-choice"
    inclusion_probabilities = False

    def __init__(
        self,
        candidates: int | None = None,
        budget: float | None = None,
        budget_fraction: float = 0.1,
    ) -> None:
        if candidates is not None and (
            isinstance(candidates, bool) or int(candidates) != candidates or candidates < 1
        ):
            raise ValueError(f"candidates must be a positive integer or None, got {candidates!r}")
        check_budget(budget, budget_fraction)
        self.candidates = None if candidates is None else int(candidates)
        self.budget = budget
        self.budget_fraction = budget_fraction
        self._drawn: tuple[int, dict[str, list[str]]] | None = None

    def config(self) -> dict[str, Any]:
        return {
            "candidates": self.candidates,
            "budget": self.budget,
            "budget_fraction": self.budget_fraction,
        }

    @property
    def needs_losses(self) -> bool:
        """The candidates' losses, every round."""
        return True

    def picks_per_model(self, table: ClientTable, tasks: Sequence[str]) -> int:
        """``k = max(1, round(m / S))`` for this round's online clients."""
        _, _, procs, _ = eligibility_view(table, tasks)
        m = resolve_budget(self.budget, self.budget_fraction, int(procs.sum()))
        return max(1, int(np.floor(m / max(1, len(tasks)) + 0.5)))

    def draw(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> dict[str, list[str]]:
        """Model -> its candidates this round (drawn once per round)."""
        if self._drawn is None or self._drawn[0] != server_round:
            ids, n, _, _ = eligibility_view(table, tasks)
            d = self.candidates or 2 * self.picks_per_model(table, tasks)
            self._drawn = (
                server_round,
                {t: draw_candidates(ids, n[s], d, rng) for s, t in enumerate(tasks)},
            )
        return self._drawn[1]

    def loss_query_clients(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int = 0,
        rng: np.random.Generator | None = None,
    ) -> set[str]:
        """The union of every model's candidates."""
        drawn = self.draw(
            table,
            tasks,
            server_round,
            rng if rng is not None else np.random.default_rng(server_round),
        )
        return {cid for cands in drawn.values() for cid in cands}

    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        tasks = list(tasks)
        drawn = self.draw(table, tasks, server_round, rng)
        k = self.picks_per_model(table, tasks)
        free = {c.cid: c.processors for c in table.clients()}
        picks = []
        for s in rng.permutation(len(tasks)):
            task = tasks[int(s)]
            # only this round's reports count: a candidate that did not answer is passed over
            losses = {
                cid: table[cid].losses[task]
                for cid in drawn.get(task, [])
                if table[cid].loss_round.get(task) == server_round
            }
            for cid in highest_loss(drawn.get(task, []), losses, k, free):
                picks.append(Pick(cid, task, 1, 1.0))
        return sorted(picks, key=lambda p: (tasks.index(p.task), p.cid))


# ------------------------------------------------------------------ cards
CARDS = (
    AlgorithmCard(
        name="power-of-choice",
        function="power_of_choice",
        title="Power-of-Choice",
        paper="Cho, Wang and Joshi 2020",
        section="Algorithm 1 (pow-d)",
        summary="per model, d candidates drawn in proportion to their data size answer a loss "
        "query and the k = m/S with the highest loss train, within the clients' "
        "processors",
        rule="plain mean per model",
        policy=PowerOfChoice,
        aggregator=MeanAggregator,
        parameters=(
            Parameter(
                name="candidates",
                type=int,
                default=0,
                unset=0,
                help="d, the candidates per model that answer the loss query",
                low=0,
                zero="2 x the picks per model",
            ),
            BUDGET_FRACTION,
        ),
    ),
)
