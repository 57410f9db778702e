"""The policy contract: who trains which model this round.

Framework-free (numpy only). A :class:`Policy` looks at the :class:`ClientTable`
and the active tasks and returns :class:`Pick` objects, drawing every random
choice from the ``numpy.random.Generator`` it is given, so one seed fixes a run.
Everything :class:`~mmfl_flwr.strategy.MultiModelStrategy` calls on a policy is
declared here with a safe default; the algorithm families live in their own
modules (:mod:`~mmfl_flwr.core.random_allocation`, :mod:`~mmfl_flwr.core.mfa`,
:mod:`~mmfl_flwr.core.lvr`, :mod:`~mmfl_flwr.core.stale`,
:mod:`~mmfl_flwr.core.ucb`, :mod:`~mmfl_flwr.core.group`).

This module also holds the sampling helpers the families share: the budget
``m``, the dense eligibility view, the data shares ``d`` and the independent
categorical draw of every processor (paper 003, Section 3).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mmfl_flwr.core.clients import ClientTable
from mmfl_flwr.core.component import Component
from mmfl_flwr.core.parameter import Parameter

#: Fewest expected uploads per model and round that a run's defaults aim at.
#: The budgeted presets warn below it (:func:`mmfl_flwr.flower_app.data.warn_if_few_uploads`);
#: the UCB presets' default ``K`` is this many clients per model
#: (:func:`mmfl_flwr.core.ucb.default_ucb_clients`): with far fewer uploads per
#: model a budgeted preset barely moves its models in a short run.
MIN_UPLOADS_PER_MODEL = 5

#: The budget of the budgeted policies (paper 003's ``m = fraction x V``), shared
#: by their cards. As a setting, 0 means auto (resolved from the federation by
#: :func:`mmfl_flwr.flower_app.data.resolved_budget` before the strategy is
#: built); in Python, leaving it out gives the policy's own default (0.1).
BUDGET_FRACTION = Parameter(
    name="budget_fraction",
    type=float,
    default=0.0,
    unset=0.0,
    help="m / V, the expected uploads per round m over the total processors V, for "
    "the budgeted presets; 0 = auto: the smallest hundredth giving "
    f"{MIN_UPLOADS_PER_MODEL} expected uploads per model (at most 1); a run warns "
    f"below {MIN_UPLOADS_PER_MODEL} expected uploads per model",
    low=0,
    high=1,
)


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


class Policy(Component, ABC):
    """Base class of all assignment policies: the whole contract with the strategy.

    Each round :class:`~mmfl_flwr.strategy.MultiModelStrategy` does, in order:

    1. if :attr:`needs_losses`: a loss query of :meth:`loss_query_clients`
       (their losses land in the client table);
    2. :meth:`assign` -> the picks to train;
    3. after the replies, :meth:`observe` with the training losses;
    4. if :attr:`selects_after_training` (every pair trained): :meth:`select`
       on each trained update's :attr:`selection_signal` -> the updates that
       are aggregated.

    Subclasses set ``name`` and implement :meth:`assign`; every other member
    has a default that suits a policy that needs nothing before assigning,
    selects before training and keeps no statistics.
    """

    name: ClassVar[str] = "policy"
    #: True when every pick's ``prob`` is its true inclusion probability over the
    #: policy's random draw, with every eligible pair drawn with positive
    #: probability: what the unbiased ``d/(B p)`` rule and the stale-update rules
    #: need. False for policies that choose deterministically from observed
    #: losses (the UCB policies), which are refused with those aggregators.
    inclusion_probabilities: ClassVar[bool] = True

    @property
    def needs_losses(self) -> bool:
        """Whether this round's :meth:`assign` needs a loss query first."""
        return False

    def loss_query_clients(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int = 0,
        rng: np.random.Generator | None = None,
    ) -> set[str] | None:
        """The clients to ask for their losses when :attr:`needs_losses`
        (None, the default: every online client). A policy that draws whom to
        ask (Power-of-Choice's candidates) draws from ``rng``, the run's
        generator that :meth:`assign` gets next."""
        return None

    @property
    def trains_every_pair(self) -> bool:
        """Whether every online client trains every active task it holds each
        round (what an aggregator that needs every fresh update requires)."""
        return False

    @property
    def selects_after_training(self) -> bool:
        """Whether the aggregated updates are drawn by :meth:`select` after
        training (GVR-style) rather than fixed by :meth:`assign`."""
        return False

    @property
    def selection_signal(self) -> str:
        """What :meth:`select` samples on: ``"update-norm"`` (``||G||``),
        ``"stale-residual"`` (``||G - beta h||``, which needs an aggregator that
        keeps stale updates) or ``"loss"`` (the pair's loss from this round's
        loss query, in the client table: no update norm is computed)."""
        return "update-norm"

    @abstractmethod
    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        """Return this round's picks among the online clients of ``table``."""

    def select(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        signal: Mapping[tuple[str, str], float],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        """Among the trained ``(client, task)`` pairs (the keys of ``signal``),
        the ones to aggregate, with their probabilities. Called only when
        :attr:`selects_after_training`."""
        raise NotImplementedError(f"{type(self).__name__} does not select after training")

    @property
    def observes_losses(self) -> bool:
        """Whether :meth:`observe` uses the training losses (UCB's index): the
        strategy then caps them like loss-query reports."""
        return False

    def observe(
        self,
        server_round: int,
        losses: Mapping[tuple[str, str], float],
        picks: Sequence[Pick],
    ) -> None:
        """After a round: the training losses of the accepted updates
        (``(client, task) -> loss``) and the round's picks. Default: nothing."""

    def cluster_steps(self) -> list[dict[str, Any]]:
        """Records of the client clusterings made so far (MMFL-Group's C-steps),
        for the results; empty for policies that do not cluster."""
        return []


def check_k(clients_per_round: int | None) -> None:
    if clients_per_round is not None and (
        isinstance(clients_per_round, bool)
        or not isinstance(clients_per_round, (int, np.integer))
        or clients_per_round < 1
    ):
        raise ValueError(
            f"clients_per_round must be a positive integer or None, got {clients_per_round!r}"
        )


def sample_clients(
    ids: list[str], k: int | None, rng: np.random.Generator
) -> tuple[list[str], float]:
    """Uniformly sample ``k`` ids without replacement; returns (ids, k/N)."""
    if k is None or k >= len(ids):
        return list(ids), 1.0
    idx = np.sort(rng.choice(len(ids), size=k, replace=False))
    return [ids[i] for i in idx], k / len(ids)


def sample_processors(
    probs: np.ndarray, processors: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Independent categorical draw for every processor.

    Processor ``b`` of client ``i`` trains task ``s`` with probability
    ``probs[s, i]`` and is idle with probability ``1 - sum_s probs[s, i]``.

    Returns
    -------
    array (S, N) of int
        How many processors of client ``i`` drew task ``s`` (paper 003, Remark 1:
        the client trains once and the update counts that many times).
    """
    p = np.asarray(probs, dtype=np.float64)
    s_count, n_count = p.shape
    b = np.asarray(processors, dtype=np.int64)
    owner = np.repeat(np.arange(n_count), b)
    cum = np.cumsum(p, axis=0)  # (S, N)
    u = rng.random(owner.size)
    # category = number of cumulative bounds <= u; S means idle
    cat = (u[None, :] >= cum[:, owner]).sum(axis=0)
    counts = np.zeros((s_count + 1, n_count), dtype=np.int64)
    np.add.at(counts, (cat, owner), 1)
    return counts[:s_count]


def resolve_budget(budget: float | None, budget_fraction: float, total_processors: int) -> float:
    """``m``: the absolute ``budget`` if given, else ``budget_fraction * V``."""
    return float(budget) if budget is not None else budget_fraction * total_processors


def check_budget(budget: float | None, budget_fraction: float) -> None:
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget must be a positive number, got {budget!r}")
    if not (math.isfinite(budget_fraction) and budget_fraction > 0):
        raise ValueError(f"budget_fraction must be a positive number, got {budget_fraction!r}")


def eligibility_view(
    table: ClientTable, tasks: Sequence[str]
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Online clients holding at least one active task, as dense arrays.

    Returns ``(ids, n, processors, losses)``: ``n`` and ``losses`` of shape
    (S, N) (0 / NaN where ineligible or unknown), ``processors`` of shape (N,).
    """
    ids, n, procs, losses = table.matrices(list(tasks))
    keep = n.sum(axis=0) > 0
    if not keep.all():
        ids = [c for c, k in zip(ids, keep) if k]
        n, procs, losses = n[:, keep], procs[keep], losses[:, keep]
    return ids, n, procs, losses


def data_shares(n: np.ndarray) -> np.ndarray:
    """``d_{i,s}`` from the (S, N) sample counts (each row sums to 1)."""
    totals = n.sum(axis=1, keepdims=True)
    shares: np.ndarray = np.divide(n, totals, out=np.zeros_like(n), where=totals > 0)
    return shares


def draw_picks(
    ids: Sequence[str],
    tasks: Sequence[str],
    probs: np.ndarray,
    processors: np.ndarray,
    rng: np.random.Generator,
) -> list[Pick]:
    """One independent categorical draw per processor (``probs`` of shape (S, N)),
    as picks carrying the per-processor probabilities."""
    if not len(ids):
        return []
    return picks_from_counts(ids, tasks, sample_processors(probs, processors, rng), probs)


class ProbabilityPolicy(Policy):
    """A policy defined by per-processor probabilities: subclasses implement
    :meth:`probabilities`; :meth:`assign` draws every processor's task from them."""

    def probabilities(
        self, table: ClientTable, tasks: Sequence[str]
    ) -> tuple[list[str], np.ndarray, np.ndarray]:
        """``(ids, p (S, N), processors)`` for this round."""
        raise NotImplementedError

    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        ids, p, procs = self.probabilities(table, tasks)
        return draw_picks(ids, tasks, p, procs, rng)


def picks_from_counts(
    ids: Sequence[str], tasks: Sequence[str], counts: np.ndarray, probs: np.ndarray
) -> list[Pick]:
    """Picks for every (task, client) with a positive processor count, ordered by
    client then task."""
    out = []
    for j, s in zip(*np.nonzero(counts.T)):
        out.append(Pick(ids[int(j)], tasks[int(s)], int(counts[s, j]), float(probs[s, j])))
    return out
