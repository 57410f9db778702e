"""Loss-based bandit policies of paper 004: Ranklist-Multi-UCB and Pareto-Multi-UCB.

Framework-free (numpy only). Every (client ``k``, model ``i``) pair has a
discounted UCB index (Eqs. 1-4), with discount ``gamma`` in (0, 1):

``L_t(k,i) = sum_{n<t} gamma^(t-1-n) 1[k trained i at n] loss_n(k,i)``,
``N_t(k,i) = sum_{n<t} gamma^(t-1-n) 1[k trained i at n]``,
``U_t(k,i) = sqrt(2 log(sum_{n<t} gamma^(t-1-n)) / N_t(k,i))``,
``A_t(k,i) = p_k(i) (L_t / N_t + U_t)``, ``p_k(i)`` = the client's share of
model ``i``'s data.

The loss is the local training loss a client reports after training. The index
needs one observation per pair before it is defined: by default the policy asks
for one loss query of every pair (a forward pass, counted as the observation at
time 0); ``init="train"`` instead trains untried pairs first, within the limit
of ``K`` clients per round. (The authors' code trains every client on every
model in the first rounds, breaking the limit ``K``; this does not.)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmfl_flwr.core.aggregators import FedAvgAggregator
from mmfl_flwr.core.card import AlgorithmCard
from mmfl_flwr.core.clients import ClientTable
from mmfl_flwr.core.mfa import CLIENTS_PER_ROUND
from mmfl_flwr.core.parameter import Parameter
from mmfl_flwr.core.policy import MIN_UPLOADS_PER_MODEL, Pick, Policy, check_k


def pareto_front(scores: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated rows of ``scores`` (N, M), higher is better.

    Row ``a`` dominates ``b`` if ``a >= b`` everywhere and ``a > b`` somewhere;
    identical rows do not dominate each other. For ``M <= 2`` this is a sort and
    a sweep, O(N log N); for ``M >= 3`` a sort followed by a sweep that checks
    each row against the current front only (O(N log N + N F M), F the front
    size), vectorised.
    """
    a = np.asarray(scores, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"scores must be 2-D (N, M), got shape {a.shape}")
    n, m = a.shape
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if m == 1:
        return np.flatnonzero(a[:, 0] == a[:, 0].max())
    # Lexicographic descending order: a row can only be dominated by rows
    # before it (or by identical rows, which do not dominate).
    order = np.lexsort(tuple(-a[:, j] for j in reversed(range(m))))
    if m == 2:
        x, y = a[order, 0], a[order, 1]
        keep = np.zeros(n, dtype=bool)
        best_y = -np.inf  # largest y among rows with a strictly larger x
        j = 0
        while j < n:
            # rows sharing this x, y descending: only the largest y (and exact
            # duplicates of that row) can be on the front, and only if that y
            # beats every row with a larger x
            k = j
            while k < n and x[k] == x[j]:
                k += 1
            if y[j] > best_y:
                keep[j:k] = y[j:k] == y[j]
                best_y = y[j]
            j = k
        return np.sort(order[keep])
    front: list[int] = []
    pts = a[order]
    for idx in range(n):
        p = pts[idx]
        if front:
            f = pts[front]
            dominated = np.any(np.all(f >= p, axis=1) & np.any(f > p, axis=1))
            if dominated:
                continue
        front.append(idx)
    return np.sort(order[np.array(front, dtype=np.int64)])


#: How each (client, model) pair is first observed: a loss query, or training.
INITS = ("loss-query", "train")


class _UCBBase(Policy):
    """Discounted UCB statistics per (client, model) pair, and K-client picks.

    The picks follow deterministically from the observed losses (Pareto-UCB
    samples only among the front), so they have no inclusion probability in the
    sense of the unbiased ``d/(B p)`` rule: pair these policies with FedAvg, as
    paper 004 does.
    """

    inclusion_probabilities = False

    @property
    def observes_losses(self) -> bool:
        """The index is built from the training losses."""
        return True

    def __init__(
        self, clients_per_round: int = 2, gamma: float = 0.9, init: str = "loss-query"
    ) -> None:
        check_k(clients_per_round)
        if clients_per_round is None:
            raise ValueError("clients_per_round (K) is required")
        if not 0.0 < gamma < 1.0:
            raise ValueError(f"gamma must be in (0, 1), got {gamma}")
        if init not in INITS:
            raise ValueError(f"init must be 'loss-query' or 'train', got {init!r}")
        self.clients_per_round = int(clients_per_round)
        self.gamma = float(gamma)
        self.init = init
        self.L: dict[tuple[str, str], float] = {}
        self.N: dict[tuple[str, str], float] = {}
        self.D = 0.0  # sum_n gamma^(t-1-n): total discounted time mass
        self._table: ClientTable | None = None
        self._tasks: list[str] = []

    def config(self) -> dict[str, Any]:
        return {"clients_per_round": self.clients_per_round, "gamma": self.gamma, "init": self.init}

    # -- statistics ----------------------------------------------------------
    @property
    def needs_losses(self) -> bool:
        """With ``init="loss-query"``: a loss query is needed while some online
        (client, model) pair has no observation yet (before the first round, and
        when a client joins)."""
        if self.init != "loss-query":
            return False
        if self._table is None:  # before the first assign (or right after a restore)
            return not self.N
        return bool(self._missing(self._table, self._tasks))

    def loss_query_clients(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int = 0,
        rng: np.random.Generator | None = None,
    ) -> set[str]:
        """The clients the loss query must reach: those with unobserved pairs."""
        return {cid for cid, _ in self._missing(table, tasks)}

    def _missing(self, table: ClientTable, tasks: Sequence[str]) -> list[tuple[str, str]]:
        active = set(tasks)
        return [
            (c.cid, t)
            for c in table.clients()
            for t in c.tasks
            if t in active and (c.cid, t) not in self.N
        ]

    def _seed_from_losses(self, table: ClientTable, tasks: Sequence[str]) -> None:
        """Count each pair's queried loss as its observation at time 0 (a pair
        joining later starts with its first queried loss, undiscounted)."""
        if self.D == 0.0:
            self.D = 1.0
        for cid, t in self._missing(table, tasks):
            loss = table[cid].losses.get(t)
            if loss is not None and math.isfinite(loss):
                self.L[(cid, t)] = float(loss)
                self.N[(cid, t)] = 1.0

    def observe(
        self,
        server_round: int,
        losses: Mapping[tuple[str, str], float],
        picks: Sequence[Pick] | None = None,
    ) -> None:
        """Record one round: discount everything, then count every selected pair
        (``1[k in S(n)]`` of Eq. 3: ``picks``; without them, the pairs with a
        finite loss in ``losses``) and add the losses the trained pairs reported.

        A selected pair that reported no (finite) loss counts as selected with
        loss 0, so a client that keeps failing loses its exploration bonus
        instead of being picked forever.
        """
        g = self.gamma
        for key in self.N:
            self.L[key] *= g
            self.N[key] *= g
        self.D = g * self.D + 1.0
        selected = (
            [(p.cid, p.task) for p in picks]
            if picks is not None
            else [k for k, v in losses.items() if math.isfinite(v)]
        )
        for key in selected:
            loss = losses.get(key)
            self.L[key] = self.L.get(key, 0.0) + (
                float(loss) if loss is not None and math.isfinite(loss) else 0.0
            )
            self.N[key] = self.N.get(key, 0.0) + 1.0

    def index(self, table: ClientTable, tasks: Sequence[str]) -> tuple[list[str], np.ndarray]:
        """``(ids, A)``: ``A[k, i]`` the UCB index of client ``ids[k]`` on
        ``tasks[i]``; ``-inf`` where the client holds no data or has no stats."""
        ids = [c.cid for c in table.clients() if any(t in c.num_examples for t in tasks)]
        a = np.full((len(ids), len(tasks)), -np.inf)
        log_d = math.log(self.D) if self.D > 1.0 else 0.0
        for i, t in enumerate(tasks):
            shares = table.data_share(t)
            for k, cid in enumerate(ids):
                n = self.N.get((cid, t), 0.0)
                if cid in shares and n > 0:
                    a[k, i] = shares[cid] * (self.L[(cid, t)] / n + math.sqrt(2 * log_d / n))
        return ids, a

    # -- assignment ----------------------------------------------------------
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
        self._table, self._tasks = table, tasks
        if self.init == "loss-query":
            self._seed_from_losses(table, tasks)
        missing = self._missing(table, tasks)
        if missing and self.init == "train":
            return self._explore(missing, rng)
        ids, a = self.index(table, tasks)
        return self._select(ids, a, tasks, server_round, rng)

    def _explore(self, missing: list[tuple[str, str]], rng: np.random.Generator) -> list[Pick]:
        """Train untried pairs, at most K clients and one model each."""
        picks: list[Pick] = []
        used: set[str] = set()
        for j in rng.permutation(len(missing)):
            cid, t = missing[int(j)]
            if cid in used:
                continue
            used.add(cid)
            picks.append(Pick(cid, t, 1, 1.0))
            if len(picks) == self.clients_per_round:
                break
        return sorted(picks, key=lambda p: (p.cid, p.task))

    def _select(
        self,
        ids: list[str],
        a: np.ndarray,
        tasks: list[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {
            "L": [[c, t, v] for (c, t), v in self.L.items()],
            "N": [[c, t, v] for (c, t), v in self.N.items()],
            "D": self.D,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.L = {(str(c), str(t)): float(v) for c, t, v in state["L"]}
        self.N = {(str(c), str(t)): float(v) for c, t, v in state["N"]}
        self.D = float(state["D"])


def _rank_lists(a: np.ndarray) -> list[np.ndarray]:
    """Per model, client rows ordered by descending index (ties by row order),
    without the clients that hold no data for it (index -inf)."""
    out = []
    for i in range(a.shape[1]):
        col = a[:, i]
        order = np.argsort(-col, kind="stable")
        out.append(order[np.isfinite(col[order])])
    return out


class RanklistMultiUCB(_UCBBase):
    """Ranklist-Multi-UCB (paper 004, Algorithm 3).

    A descending rank list of the UCB index per model; starting from model
    ``t mod M`` (the paper's ``(t mod M) + 1``, 1-based), take the top unpicked
    client from each model's list in turn, assigning it that model, until ``K``
    clients are picked (a model whose list is exhausted is skipped).

    Parameters
    ----------
    clients_per_round : int
        ``K``.
    gamma : float
        Discount in (0, 1).
    init : str
        ``"loss-query"`` (default) or ``"train"``; see the module docstring.
    """

    name = "ranklist-ucb"

    def _select(self, ids, a, tasks, server_round, rng):  # type: ignore[no-untyped-def]
        lists = _rank_lists(a)
        pos = [0] * len(tasks)
        picked: set[int] = set()
        picks: list[Pick] = []
        m = len(tasks)
        step = 0
        exhausted: set[int] = set()
        while len(picks) < self.clients_per_round and len(exhausted) < m:
            i = (server_round + step) % m
            step += 1
            if i in exhausted:
                continue
            lst = lists[i]
            while pos[i] < len(lst) and int(lst[pos[i]]) in picked:
                pos[i] += 1
            if pos[i] >= len(lst):
                exhausted.add(i)
                continue
            k = int(lst[pos[i]])
            picked.add(k)
            picks.append(Pick(ids[k], tasks[i], 1, 1.0))
        return picks


#: What Pareto-UCB does when the front holds fewer than ``K`` clients.
SHORTFALLS = ("front", "next-fronts")


class ParetoMultiUCB(_UCBBase):
    """Pareto-Multi-UCB (paper 004, Algorithm 4).

    The clients whose score vectors are Pareto-optimal (:func:`pareto_front`);
    if there are more than ``K``, ``K`` of them uniformly at random without
    replacement. Each picked client trains the model where its rank is best
    (ties: the lower model index).

    ``shortfall`` says what happens when the front holds fewer than ``K``
    clients: ``"front"`` (the paper's Algorithm 4, the default) trains the front
    only, so one client whose index dominates others can shrink a round to a
    few trainers; ``"next-fronts"`` (an extension, not in the paper) fills the
    round to ``K`` from the next Pareto fronts (non-dominated sorting: the
    front of the clients left, and so on), sampling uniformly in the front that
    overflows, so that one client's index cannot starve the round.
    """

    name = "pareto-ucb"

    def __init__(
        self,
        clients_per_round: int = 2,
        gamma: float = 0.9,
        init: str = "loss-query",
        shortfall: str = "front",
    ) -> None:
        super().__init__(clients_per_round, gamma, init)
        if shortfall not in SHORTFALLS:
            raise ValueError(f"shortfall must be one of {SHORTFALLS}, got {shortfall!r}")
        self.shortfall = shortfall

    def config(self) -> dict[str, Any]:
        # "front" (the paper) is left out: checkpoints written before the option
        # existed compare equal to today's default configuration
        out = super().config()
        return out if self.shortfall == "front" else {**out, "shortfall": self.shortfall}

    def _chosen(self, scores: np.ndarray, rng: np.random.Generator) -> list[tuple[int, float]]:
        """The picked rows and each one's probability given this round's scores:
        the front (``K`` of it at random when larger, each with ``K / |front|``),
        then under ``next-fronts`` the following fronts while the round has
        fewer than ``K`` (the front that overflows sampled, ``need / |front|``)."""
        k = self.clients_per_round
        left = np.arange(scores.shape[0])
        chosen: list[tuple[int, float]] = []
        while left.size and len(chosen) < k:
            front = left[pareto_front(scores[left])]
            need = k - len(chosen)
            prob = min(1.0, need / front.size)
            if front.size > need:
                front = np.sort(rng.choice(front, size=need, replace=False))
            chosen += [(int(r), prob) for r in front]
            if self.shortfall == "front":
                break
            left = np.setdiff1d(left, front, assume_unique=True)
        return chosen

    def _select(self, ids, a, tasks, server_round, rng):  # type: ignore[no-untyped-def]
        if not ids:
            return []
        # clients that hold data for some model but not others: -inf is a valid
        # "worst" score for the front
        chosen = self._chosen(np.where(np.isfinite(a), a, -1e300), rng)
        lists = _rank_lists(a)
        ranks = np.full(a.shape, np.inf)
        for i, lst in enumerate(lists):
            ranks[lst, i] = np.arange(len(lst))
        picks = []
        for k, prob in chosen:
            i = int(np.argmin(ranks[k]))
            if np.isfinite(ranks[k, i]):
                picks.append(Pick(ids[k], tasks[i], 1, prob))
        return picks


# ------------------------------------------------------------------ cards
def default_ucb_clients(num_clients: int, num_models: int) -> int:
    """The ``K`` of the UCB presets when the settings leave it 0:
    ``min(num_clients, MIN_UPLOADS_PER_MODEL * num_models)``, so that each model
    expects :data:`~mmfl_flwr.core.policy.MIN_UPLOADS_PER_MODEL` (5) trainers per
    round (each chosen client trains one model). 15 for the default job (20
    clients, 3 models); 10 for paper 004's two models, the paper's "large
    number of clients (10) per round" (it gives no single default: 2, 10 or 64).
    """
    return max(1, min(int(num_clients), MIN_UPLOADS_PER_MODEL * max(1, int(num_models))))


def _settings_k(values: Mapping[str, Any]) -> int:
    models = [t for t in str(values.get("tasks", "")).split(",") if t.strip()]
    return default_ucb_clients(int(values.get("num_clients", 1)), len(models))


#: ``K`` of the UCB presets: as a setting 0 means :func:`default_ucb_clients`.
UCB_CLIENTS = dataclasses.replace(
    CLIENTS_PER_ROUND,
    zero=f"min(num-clients, {MIN_UPLOADS_PER_MODEL} x number of models)",
    auto=_settings_k,
)
UCB_GAMMA = Parameter(
    name="gamma",
    setting="ucb_gamma",
    type=float,
    default=0.9,
    help="discount gamma of the UCB index",
    low=0,
    low_open=True,
    high=1,
    high_open=True,
)
UCB_INIT = Parameter(
    name="init",
    setting="ucb_init",
    type=str,
    default="loss-query",
    help="first observation of every (client, model) pair: loss-query (one "
    "forward pass of every pair) or train (untried pairs train first, "
    "within K per round)",
    choices=lambda: INITS,
)

_RANKLIST = AlgorithmCard(
    name="ranklist-ucb",
    function="ranklist_ucb",
    title="Ranklist-Multi-UCB",
    paper="004",
    section="Algorithm 3 (Eqs. 1-4)",
    summary="discounted-loss UCB index (Eqs. 1–4), per-model rank lists, round-robin from "
    "model `t mod M`",
    rule="FedAvg per model",
    policy=RanklistMultiUCB,
    aggregator=FedAvgAggregator,
    parameters=(UCB_CLIENTS, UCB_GAMMA, UCB_INIT),
)

PARETO_SHORTFALL = Parameter(
    name="shortfall",
    setting="pareto_shortfall",
    type=str,
    default="front",
    help="when the Pareto front holds fewer than K clients: front (the paper: only the "
    "front trains) or next-fronts (fill to K from the next fronts; an extension "
    "that keeps one client's index from shrinking the round)",
    choices=lambda: SHORTFALLS,
)

CARDS = (
    _RANKLIST,
    dataclasses.replace(
        _RANKLIST,
        name="pareto-ucb",
        function="pareto_ucb",
        title="Pareto-Multi-UCB",
        section="Algorithm 4 (Eqs. 1-5)",
        policy=ParetoMultiUCB,
        summary="Pareto front of the UCB score vectors (K sampled if larger), best-rank model each",
        parameters=(UCB_CLIENTS, UCB_GAMMA, UCB_INIT, PARETO_SHORTFALL),
    ),
)
