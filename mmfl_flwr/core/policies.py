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
from mmfl_flwr.core.lvr import lvr_probabilities, sample_processors


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
    #: True when every pick's ``prob`` is its true inclusion probability over the
    #: policy's random draw, with every eligible pair drawn with positive
    #: probability: what the unbiased ``d/(B p)`` rule and the stale-update rules
    #: need. False for policies that choose deterministically from observed
    #: losses (the UCB policies), which are refused with those aggregators.
    inclusion_probabilities: ClassVar[bool] = True

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


def resolve_budget(budget: float | None, budget_fraction: float, total_processors: int) -> float:
    """``m``: the absolute ``budget`` if given, else ``budget_fraction * V``."""
    return float(budget) if budget is not None else budget_fraction * total_processors


def _check_budget(budget: float | None, budget_fraction: float) -> None:
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget must be a positive number, got {budget!r}")
    if not (math.isfinite(budget_fraction) and 0 < budget_fraction):
        raise ValueError(
            f"budget_fraction must be a positive number, got {budget_fraction!r}"
        )


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
    return np.divide(n, totals, out=np.zeros_like(n), where=totals > 0)


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
        _check_budget(budget, budget_fraction)
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
        self.selects_after_training = self.train_all  # type: ignore[misc]

    def config(self) -> dict[str, Any]:
        return {"groups": self.groups, "train_all": self.train_all}

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
        norms: dict[tuple[str, str], float],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        """``train_all`` mode: draw the aggregated pairs among those that trained."""
        ids, p, procs = self.probabilities(table, tasks)
        return [pk for pk in draw_picks(ids, tasks, p, procs, rng) if (pk.cid, pk.task) in norms]


class _Eq13Sampling(Policy):
    """Shared parameters of the policies that sample with Eq. 13 (budget ``m``
    and the lower-bound constant ``floor``)."""

    def __init__(
        self, budget: float | None = None, budget_fraction: float = 0.1, floor: float = 1e-4
    ):
        _check_budget(budget, budget_fraction)
        if not (math.isfinite(floor) and floor >= 0):
            raise ValueError(f"floor must be a non-negative number, got {floor!r}")
        self.budget = budget
        self.budget_fraction = budget_fraction
        self.floor = floor

    def config(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "budget_fraction": self.budget_fraction,
            "floor": self.floor,
        }


class LVR(_Eq13Sampling, ProbabilityPolicy):
    """MMFL-LVR (paper 003, Theorem 2): loss-based variance-reduced sampling.

    Every round the strategy first asks every client for its loss on each of its
    tasks (forward pass only); the policy then computes the optimal probabilities
    of Eq. 13 (:func:`~mmfl_flwr.core.lvr.lvr_probabilities`) with budget ``m``
    and draws an independent task (or idleness) for every processor. Pair it with
    the unbiased ``d/(B p)`` aggregator. A client whose loss is missing this round
    keeps its latest reported loss; a pair that never reported one gets only the
    ``floor`` share.

    Parameters
    ----------
    budget : float, optional
        ``m``; overrides ``budget_fraction``.
    budget_fraction : float
        ``m / V`` (default 0.1).
    floor : float
        Lower-bound constant (Assumption 5), relative to the mean ``U``; see
        :func:`~mmfl_flwr.core.lvr.lvr_probabilities`.
    """

    name = "lvr"
    needs_losses = True

    def probabilities(
        self, table: ClientTable, tasks: Sequence[str]
    ) -> tuple[list[str], np.ndarray, np.ndarray]:
        """``(ids, p (S, N), processors)`` from the table's latest losses."""
        ids, n, procs, losses = eligibility_view(table, tasks)
        if not ids:
            return ids, np.zeros((len(tasks), 0)), procs
        m = resolve_budget(self.budget, self.budget_fraction, int(procs.sum()))
        return ids, lvr_probabilities(losses, data_shares(n), procs, m, self.floor), procs


class GVR(_Eq13Sampling):
    """MMFL-GVR (paper 003, Section 4.2): gradient(update)-norm-based sampling.

    Every client trains every task it holds every round (``assign`` returns all
    pairs); after training, :meth:`select` computes the Eq. 13 probabilities with
    the update norms ``||G_{i,s}||`` as the signal, draws every processor's task,
    and only the drawn updates are aggregated (unbiased ``d/(B p)`` rule). In
    this implementation clients send all updates and the server samples among
    them; ``uploads`` in the metrics counts the sampled ones, which is what a
    two-phase deployment (norms first, then the sampled updates) would upload.
    """

    name = "gvr"
    selects_after_training = True

    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        return FullParticipation().assign(table, tasks, server_round, rng)

    def select(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        norms: dict[tuple[str, str], float],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        """Sample among the trained pairs, with ``norms[(cid, task)] = ||G||``.

        Pairs without a (valid) update are not eligible this round; ``d`` and
        ``B`` stay those of the whole federation.
        """
        ids, n, procs, losses = eligibility_view(table, tasks)
        if not ids:
            return []
        d = data_shares(n)
        sig = np.full(n.shape, np.nan)
        col = {cid: j for j, cid in enumerate(ids)}
        row = {t: s for s, t in enumerate(tasks)}
        for (cid, task), value in norms.items():
            if cid in col and task in row:
                sig[row[task], col[cid]] = value
        d_avail = np.where(np.isnan(sig), 0.0, d)
        if self._signal_from_losses():
            sig = np.where(np.isnan(sig), np.nan, losses)
        m = resolve_budget(self.budget, self.budget_fraction, int(procs.sum()))
        p = lvr_probabilities(np.where(np.isnan(sig), 0.0, sig), d_avail, procs, m, self.floor)
        return draw_picks(ids, tasks, p, procs, rng)

    def _signal_from_losses(self) -> bool:
        return False


class StaleVRSampling(GVR):
    """The sampling of MMFL-StaleVR (paper 003, Section 5).

    Every client trains every task it holds each round (the optimal ``beta`` of
    Eq. 20 needs every pair's fresh update); which updates are aggregated is drawn
    with the Eq. 13 probabilities. The signal is the loss (``signal="loss"``,
    the paper's LVR, default; the strategy sends a loss query first) or
    ``signal="stale-residual"``: ``||G - beta h||``, the signal of the authors'
    code (needs an aggregator with stale updates).
    """

    name = "stalevr-sampling"
    SIGNALS = ("loss", "stale-residual")

    def __init__(
        self,
        budget: float | None = None,
        budget_fraction: float = 0.1,
        floor: float = 1e-4,
        signal: str = "loss",
    ):
        if signal not in self.SIGNALS:
            raise ValueError(f"signal must be one of {self.SIGNALS}, got {signal!r}")
        super().__init__(budget, budget_fraction, floor)
        self.signal = signal
        self.needs_losses = signal == "loss"  # type: ignore[misc]

    def config(self) -> dict[str, Any]:
        return {**super().config(), "signal": self.signal}

    def _signal_from_losses(self) -> bool:
        return self.signal == "loss"


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
