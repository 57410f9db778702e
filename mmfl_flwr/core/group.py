"""MMFL-Group Sampling (papers 000/001, Algorithm 1).

Framework-free (numpy + scikit-learn). A round-robin *cycle* is a C-step and
``L`` training rounds (the T-step):

- **C-step**: every client reports its loss vector ``delta_i = [f_{i,1}..f_{i,S}]``
  (a loss query); K-means groups the vectors, the number of clusters ``L`` is
  chosen by the silhouette score among ``k >= S`` (up to ``max_clusters``). The
  **modified C-step** (inconsistent structures across models) clusters on one
  model's loss only, that model rotating with the cycle.
- **T-step**: at cycle step ``tau`` model ``s`` trains on group
  ``(s + tau) mod L``, with a uniformly random sample (``participation``, 1/6 by
  default) of that group's clients. When ``L > S`` the idle groups train
  *pseudo-models*: copies of the models with the largest current loss, whose
  updates are aggregated into those models.
- **New clients** join the cluster whose centroid has the highest cosine
  similarity with their loss vector, without a new C-step; **new models** wait
  for the next cycle boundary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmfl_flwr.core.aggregators import MeanAggregator
from mmfl_flwr.core.card import AlgorithmCard
from mmfl_flwr.core.clients import ClientTable
from mmfl_flwr.core.parameter import Parameter
from mmfl_flwr.core.policy import Pick, Policy


@dataclass
class Clustering:
    """The outcome of one C-step."""

    labels: np.ndarray  # (N,) cluster of each client, 0..k-1
    centroids: np.ndarray  # (k, F)
    k: int
    scores: dict[int, float] = field(default_factory=dict)  # silhouette per candidate k


def c_step(
    features: np.ndarray,
    min_clusters: int,
    max_clusters: int | None = None,
    seed: int = 0,
    silhouette_sample: int = 2000,
    n_init: int = 1,
) -> Clustering:
    """K-means on the rows of ``features``, ``k`` chosen by silhouette score.

    Parameters
    ----------
    features : array (N, F)
        One loss vector per client.
    min_clusters : int
        Smallest ``k`` tried (the number of models: ``L >= S``).
    max_clusters : int, optional
        Largest ``k`` tried (default ``min_clusters + 4``); capped at ``N - 1``.
    seed : int
        Seeds K-means and the silhouette sample.
    silhouette_sample : int
        Above this many clients the silhouette score uses a random sample of
        this size (scikit-learn's ``sample_size``), so the C-step stays fast.
    n_init : int
        K-means restarts per ``k`` (k-means++ initialisation; 1 keeps the C-step
        of 10,000 clients fast).
    """
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"features must be 2-D (N, F), got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("features must be finite")
    n = x.shape[0]
    if min_clusters < 1:
        raise ValueError(f"min_clusters must be >= 1, got {min_clusters}")
    hi = min_clusters + 4 if max_clusters is None else max_clusters
    if hi < min_clusters:
        raise ValueError(f"max_clusters ({hi}) < min_clusters ({min_clusters})")
    if n <= min_clusters:
        # fewer clients than groups: one group per client (cycled when L > N)
        labels = np.arange(n)
        return Clustering(labels, x.copy(), max(n, 1))
    lo, hi = min_clusters, min(hi, n - 1)
    if hi < lo:  # n == min_clusters + ... can't compute silhouette for k = n
        hi = lo
    best: tuple[float, int, Any] | None = None
    scores: dict[int, float] = {}
    distinct = len(np.unique(x, axis=0))
    for k in range(lo, hi + 1):
        km = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(x)
        if len(np.unique(km.labels_)) < 2 or distinct <= k - 1 or k >= n:
            score = -1.0
        else:
            score = float(
                silhouette_score(
                    x,
                    km.labels_,
                    sample_size=min(silhouette_sample, n) if n > silhouette_sample else None,
                    random_state=seed,
                )
            )
        scores[k] = score
        if best is None or score > best[0] + 1e-12:
            best = (score, k, km)
    assert best is not None
    _, k, km = best
    return Clustering(np.asarray(km.labels_, dtype=np.int64), km.cluster_centers_.copy(), k, scores)


def nearest_by_cosine(vector: np.ndarray, centroids: np.ndarray) -> int:
    """Index of the centroid with the highest cosine similarity to ``vector``."""
    v = np.asarray(vector, dtype=np.float64)
    c = np.asarray(centroids, dtype=np.float64)
    nv = np.linalg.norm(v)
    nc = np.linalg.norm(c, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        sim = np.where((nc > 0) & (nv > 0), c @ v / (nc * nv), -np.inf)
    return int(np.argmax(sim))


#: C-step variants: on the full loss vectors, or on one (rotating) model's loss.
VARIANTS = ("consistent", "modified")


class GroupSampling(Policy):
    """MMFL-Group Sampling (papers 000/001). Pair it with a mean or FedAvg aggregator.

    Parameters
    ----------
    participation : float
        Fraction of a group's clients sampled to train each round (1/6).
    variant : str
        ``"consistent"`` (C-step on the full loss vectors) or ``"modified"``
        (C-step on one model's loss, the model rotating every cycle).
    max_clusters : int, optional
        Upper bound of the silhouette search (default ``S + 4``).
    silhouette_sample : int
        Sample size of the silhouette score for large federations.
    seed : int
        Seeds K-means.
    grouping : str
        ``"kmeans"`` (the C-step) or ``"random"``: the papers' baseline
        "round-robin with random groups" (random balanced groups each cycle, the
        same T-step, no clustering).
    random_groups : int
        Number of random groups (at least ``S``).
    n_init : int
        K-means restarts per candidate ``k`` (k-means++ initialisation).
    """

    name = "group"

    def __init__(
        self,
        participation: float = 1 / 6,
        variant: str = "consistent",
        max_clusters: int | None = None,
        silhouette_sample: int = 2000,
        seed: int = 0,
        grouping: str = "kmeans",
        random_groups: int = 0,
        n_init: int = 1,
    ) -> None:
        if not 0 < participation <= 1:
            raise ValueError(f"participation must be in (0, 1], got {participation}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be 'consistent' or 'modified', got {variant!r}")
        if max_clusters is not None and max_clusters < 1:
            raise ValueError(f"max_clusters must be >= 1, got {max_clusters}")
        if grouping not in ("kmeans", "random"):
            raise ValueError(f"grouping must be 'kmeans' or 'random', got {grouping!r}")
        self.grouping = grouping
        if n_init < 1:
            raise ValueError(f"n_init must be >= 1, got {n_init}")
        self.n_init = int(n_init)
        self.random_groups = int(random_groups)
        self.participation = float(participation)
        self.variant = variant
        self.max_clusters = max_clusters
        self.silhouette_sample = int(silhouette_sample)
        self.seed = int(seed)
        self.groups: dict[str, int] = {}
        self.centroids = np.zeros((0, 0))
        self.num_groups = 0
        self.cycle_start = 0
        self.cycle = 0  # number of C-steps done
        self.cycle_tasks: list[str] = []
        self.cluster_task: str | None = None  # modified C-step: the model clustered on
        self.csteps: list[dict[str, Any]] = []  # record of every C-step
        self._table: ClientTable | None = None
        self._tasks: list[str] = []
        self._round = 0

    def cstep_seed(self) -> int:
        """The K-means / silhouette seed of the current C-step: ``seed + cycle``,
        wrapped to scikit-learn's 32-bit range (a seed near 2**32 - 1 would
        otherwise overflow it in a later cycle)."""
        return (self.seed + self.cycle) % 2**32

    def config(self) -> dict[str, Any]:
        return {
            "participation": self.participation,
            "variant": self.variant,
            "max_clusters": self.max_clusters,
            "grouping": self.grouping,
        }

    # -- when does the strategy need a loss query? --------------------------
    def _cycle_over(self, server_round: int) -> bool:
        return not self.groups or server_round - self.cycle_start >= self.num_groups

    @property
    def needs_losses(self) -> bool:
        """At a cycle boundary (C-step), or when online clients have no group."""
        if self._table is None:
            return True
        if self._cycle_over(self._round + 1):
            return True
        return any(cid not in self.groups for cid in self._table.ids())

    def loss_query_clients(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int = 0,
        rng: np.random.Generator | None = None,
    ) -> set[str] | None:
        """Everyone at a C-step; only the newcomers in the middle of a cycle."""
        if self._cycle_over(self._round + 1):
            return None
        return {cid for cid in table.ids() if cid not in self.groups}

    # -- C-step ------------------------------------------------------------
    def _features(self, table: ClientTable, ids: list[str], tasks: list[str]) -> np.ndarray:
        """Loss vectors (N, S); a missing loss takes that model's mean."""
        x = np.full((len(ids), len(tasks)), np.nan)
        for j, cid in enumerate(ids):
            for s, t in enumerate(tasks):
                v = table[cid].losses.get(t)
                if v is not None and math.isfinite(v):
                    x[j, s] = v
        means = np.nanmean(np.where(np.isnan(x), np.nan, x), axis=0) if len(ids) else []
        for s in range(len(tasks)):
            col = x[:, s]
            fill = means[s] if np.isfinite(means[s]) else 0.0
            col[np.isnan(col)] = fill
        return x

    def run_c_step(self, table: ClientTable, tasks: list[str], server_round: int) -> None:
        """Cluster the online clients and start a new cycle at ``server_round``."""
        ids = table.ids()
        feats = self._features(table, ids, tasks)
        if self.variant == "modified":
            self.cluster_task = tasks[self.cycle % len(tasks)]
            cols = [tasks.index(self.cluster_task)]
        else:
            self.cluster_task = None
            cols = list(range(len(tasks)))
        if self.grouping == "random":
            # Baseline "round-robin with random groups": same T-step, no clustering.
            k = max(len(tasks), self.random_groups)
            rng = np.random.default_rng([self.seed, self.cycle, 11])
            labels = rng.permutation(np.arange(len(ids)) % k)
            cl = Clustering(labels.astype(np.int64), np.zeros((k, len(cols))), k)
        else:
            cl = c_step(
                feats[:, cols],
                min_clusters=len(tasks),
                max_clusters=self.max_clusters,
                seed=self.cstep_seed(),
                silhouette_sample=self.silhouette_sample,
                n_init=self.n_init,
            )
        self.groups = {cid: int(g) for cid, g in zip(ids, cl.labels)}
        # Centroids of the full loss vectors (for newcomers' cosine similarity).
        k = max(cl.k, len(tasks))
        self.centroids = np.zeros((k, len(tasks)))
        for g in range(k):
            members = feats[cl.labels == g]
            if len(members):
                self.centroids[g] = members.mean(axis=0)
        self.num_groups = k
        self.cycle_start = server_round
        self.cycle += 1
        self.cycle_tasks = list(tasks)
        self.csteps.append(
            {
                "round": server_round,
                "clients": list(ids),
                "labels": cl.labels.tolist(),
                "features": feats.tolist(),
                "tasks": list(tasks),
                "k": k,
                "silhouette": {int(a): float(b) for a, b in cl.scores.items()},
                "cluster_task": self.cluster_task,
            }
        )

    def place_newcomers(self, table: ClientTable) -> list[str]:
        """Put online clients without a group into the nearest cluster (cosine)."""
        placed = []
        for cid in table.ids():
            if cid in self.groups:
                continue
            losses = table[cid].losses
            vec = np.array([losses.get(t, np.nan) for t in self.cycle_tasks], dtype=np.float64)
            if not np.isfinite(vec).any():
                continue  # no loss vector yet: wait for the next loss query
            vec = np.where(np.isfinite(vec), vec, np.nanmean(self.centroids, axis=0))
            self.groups[cid] = nearest_by_cosine(vec, self.centroids)
            placed.append(cid)
        return placed

    # -- T-step ------------------------------------------------------------
    def _model_losses(self, table: ClientTable, tasks: list[str]) -> np.ndarray:
        """Current loss of each model: data-weighted mean of the clients' latest
        reported losses."""
        out = np.zeros(len(tasks))
        for s, t in enumerate(tasks):
            num = den = 0.0
            for c in table.clients():
                v = c.losses.get(t)
                if t in c.num_examples and v is not None and math.isfinite(v):
                    num += c.num_examples[t] * v
                    den += c.num_examples[t]
            out[s] = num / den if den > 0 else 0.0
        return out

    def group_models(self, table: ClientTable, tau: int) -> list[str]:
        """The model each group trains at cycle step ``tau`` (Algorithm 1).

        The routine has ``L`` slots: slot ``s < S`` is model ``s``, and each slot
        ``s >= S`` is a pseudo-model, a copy of the ``(s - S)``-th highest-loss
        model (ranked by the current loss). Every slot rotates:
        ``g_s = (s + tau) mod L``, pseudo-models included, so over a cycle each
        group trains every slot once.
        """
        tasks = self.cycle_tasks
        s_count, l_count = len(tasks), self.num_groups
        slots = list(tasks)
        if l_count > s_count:
            order = np.argsort(-self._model_losses(table, tasks), kind="stable")
            slots += [tasks[int(order[j % s_count])] for j in range(l_count - s_count)]
        model_of = [""] * l_count
        for s, t in enumerate(slots):
            model_of[(s + tau) % l_count] = t
        return model_of

    def assign(
        self,
        table: ClientTable,
        tasks: Sequence[str],
        server_round: int,
        rng: np.random.Generator,
    ) -> list[Pick]:
        tasks = list(tasks)
        self._table, self._tasks, self._round = table, tasks, server_round
        if not tasks or not table.ids():
            return []
        if self._cycle_over(server_round):
            self.run_c_step(table, tasks, server_round)
        else:
            self.place_newcomers(table)
        tau = server_round - self.cycle_start
        model_of = self.group_models(table, tau)
        members: dict[int, list[str]] = {}
        for cid in table.ids():
            g = self.groups.get(cid)
            if g is not None:
                members.setdefault(g, []).append(cid)
        picks = []
        for g in range(self.num_groups):
            task = model_of[g]
            pool = [c for c in members.get(g, []) if task in table[c].num_examples]
            if not pool:
                continue
            k = max(1, int(round(self.participation * len(pool))))
            chosen = sorted(rng.choice(len(pool), size=min(k, len(pool)), replace=False))
            for j in chosen:
                picks.append(Pick(pool[int(j)], task, 1, k / len(pool)))
        return picks

    def cluster_steps(self) -> list[dict[str, Any]]:
        """Every C-step so far: round, clients, cluster labels, loss vectors."""
        return self.csteps

    # -- state -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "groups": dict(self.groups),
            "centroids": self.centroids.tolist(),
            "num_groups": self.num_groups,
            "cycle_start": self.cycle_start,
            "cycle": self.cycle,
            "cycle_tasks": list(self.cycle_tasks),
            "cluster_task": self.cluster_task,
            "csteps": list(self.csteps),
            "round": self._round,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups = {str(k): int(v) for k, v in state["groups"].items()}
        self.centroids = np.asarray(state["centroids"], dtype=np.float64)
        self.num_groups = int(state["num_groups"])
        self.cycle_start = int(state["cycle_start"])
        self.cycle = int(state["cycle"])
        self.cycle_tasks = list(state["cycle_tasks"])
        self.cluster_task = state["cluster_task"]
        self.csteps = list(state["csteps"])
        self._round = int(state["round"])


# ------------------------------------------------------------------ cards
CARDS = (
    AlgorithmCard(
        name="group",
        function="group_sampling",
        title="MMFL-Group Sampling",
        paper="000/001",
        section="Algorithm 1",
        summary="C-step (K-means on the clients' loss vectors, k ≥ S by silhouette; "
        '`variant="modified"` clusters on one model\'s losses, rotating per cycle), '
        "T-step round-robin of models over groups, idle groups train copies of the "
        "highest-loss models; newcomers join the nearest centroid by cosine similarity",
        rule='plain mean per model (`aggregator="fedavg"` for data-weighted)',
        policy=GroupSampling,
        aggregator=MeanAggregator,
        seeded=True,
        parameters=(
            Parameter(
                name="participation",
                setting="group_participation",
                type=float,
                default=1 / 6,
                help="fraction of a group's clients that train each round",
                low=0,
                low_open=True,
                high=1,
            ),
            Parameter(
                name="variant",
                setting="group_variant",
                type=str,
                default="consistent",
                help="C-step on the loss vectors (consistent) or on one model's loss, "
                "rotating every cycle (modified)",
                choices=lambda: VARIANTS,
            ),
            Parameter(
                name="max_clusters",
                setting="group_max_clusters",
                type=int,
                default=0,
                unset=0,
                help="upper bound of the silhouette search",
                low=0,
                zero="S + 4",
            ),
        ),
    ),
)
