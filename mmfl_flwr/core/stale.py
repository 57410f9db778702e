"""Stale-update storage and the stale-update baselines of paper 003 (Section 5).

Framework-free (numpy only). Every stale-update aggregator keeps ``h_{i,s}``,
the last update received from client ``i`` for task ``s`` (zero before the
first), in a :class:`StaleStore`, and refreshes it with the sampled clients'
fresh updates after each aggregation (:class:`StaleAggregator`, shared with
:mod:`mmfl_flwr.core.stalevr` and SCAFFOLD's control variates).

- :class:`FedStaleAggregator` (Eq. 17; FedVARP is ``beta = 1``):
  ``Delta = beta * sum_{i in N_s} d_i h_i + sum_{A_s} d_i l (G_i - beta h_i) / (B_i p_i)``.
- :class:`MIFAAggregator`: ``Delta = sum_{i in N_s} d_i (G_i if i trained s else h_i)``.

Updates are ``G = w_global - w_local``; ``w <- w - Delta`` (global step size 1).
With the true inclusion probabilities FedStale and FedVARP are unbiased: over the
sampling, ``E[Delta] = sum_i d_i G_i``, because ``beta h_i`` is fixed before the
draw; MIFA is not.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mmfl_flwr.core.aggregators import Aggregator, Update, Weights
from mmfl_flwr.core.card import AlgorithmCard
from mmfl_flwr.core.parameter import Parameter
from mmfl_flwr.core.policy import BUDGET_FRACTION
from mmfl_flwr.core.random_allocation import RandomAllocation

STORAGE = ("float32", "float16", "disk")
#: What MIFA counts a (client, model) pair that has never uploaded as
#: (:class:`MIFAAggregator`'s ``start``).
MIFA_STARTS = ("zero", "uploaded")


def default_shares(
    shares: Mapping[str, float] | None, updates: Sequence[Update]
) -> Mapping[str, float]:
    """``d_{i,s}`` of the eligible clients; without them, those of the updates."""
    return shares if shares is not None else {u.cid: u.data_share for u in updates}


class StaleStore:
    """``h_{i,s}``: the latest update of every (client, task) pair.

    Memory: one model-sized entry per pair that has ever uploaded, i.e. at most
    ``N x S x (parameters) x bytes``: 4 bytes per parameter with ``float32``,
    2 with ``float16`` (each array rounded to half precision relative to its
    largest magnitude, which is kept in float32), and next to nothing in memory
    with ``disk`` (one float32 ``.npy`` file per tensor in ``directory``, a
    temporary folder by default, read back when needed).

    Parameters
    ----------
    storage : str
        ``float32`` (default), ``float16`` or ``disk``.
    directory : str, optional
        Folder of the ``disk`` storage.
    """

    def __init__(self, storage: str = "float32", directory: str | None = None) -> None:
        if storage not in STORAGE:
            raise ValueError(f"storage must be one of {STORAGE}, got {storage!r}")
        self.storage = storage
        # per pair: its arrays, or with storage 'disk' the paths of their .npy files
        self._mem: dict[tuple[str, str], list[Any]] = {}
        self._scales: dict[tuple[str, str], list[np.float32]] = {}
        self._file_ids: dict[tuple[str, str], int] = {}
        self._dir = directory
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def _folder(self) -> str:
        if self._dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="mmfl-stale-")
            self._dir = self._tmp.name
        os.makedirs(self._dir, exist_ok=True)
        return self._dir

    def __contains__(self, key: object) -> bool:
        return key in self._mem

    def __len__(self) -> int:
        return len(self._mem)

    def keys(self) -> list[tuple[str, str]]:
        """The (client id, task) pairs with a stored update."""
        return list(self._mem)

    def get(self, cid: str, task: str) -> list[np.ndarray] | None:
        """The stored update (float64 copies), or None if the pair never uploaded."""
        arrays = self._mem.get((cid, task))
        if arrays is None:
            return None
        if self.storage == "float16":
            scales = self._scales[(cid, task)]
            return [np.asarray(a, dtype=np.float64) * float(c) for a, c in zip(arrays, scales)]
        if self.storage == "disk":
            return [np.load(path).astype(np.float64) for path in arrays]
        return [np.asarray(a, dtype=np.float64) for a in arrays]

    def set(self, cid: str, task: str, update: Sequence[np.ndarray]) -> None:
        """Store the latest update of a pair."""
        if self.storage == "disk":
            # One .npy file per tensor; nothing stays mapped, so the process holds
            # only the file names (the kernel's page cache may keep recent files).
            folder = self._folder()
            key = (cid, task)
            if key not in self._file_ids:
                self._file_ids[key] = len(self._file_ids)
            stored: list[Any] = []
            for j, a in enumerate(update):
                path = os.path.join(folder, f"h{self._file_ids[key]}_{j}.npy")
                np.save(path, np.asarray(a, dtype=np.float32))
                stored.append(path)
            self._mem[key] = stored
        elif self.storage == "float16":
            # Half precision relative to each array's largest magnitude (kept in
            # float32), so large finite updates never overflow to inf.
            stored, scales = [], []
            for a in update:
                a64 = np.asarray(a, dtype=np.float64)
                scale = float(np.abs(a64).max()) if a64.size else 0.0
                scale = scale if scale > 0 and np.isfinite(scale) else 1.0
                stored.append((a64 / scale).astype(np.float16))
                scales.append(np.float32(scale))
            self._mem[(cid, task)] = stored
            self._scales[(cid, task)] = scales
        else:
            self._mem[(cid, task)] = [np.asarray(a, dtype=np.float32).copy() for a in update]

    def nbytes(self) -> int:
        """Bytes held by the stored arrays (on disk for ``disk``), without the
        per-array float32 scale of ``float16`` (4 bytes per tensor)."""
        if self.storage == "disk":
            return int(
                sum(np.load(p, mmap_mode="r").nbytes for paths in self._mem.values() for p in paths)
            )
        return int(sum(a.nbytes for arrays in self._mem.values() for a in arrays))

    def state_dict(self) -> dict[str, Any]:
        """Plain-data snapshot: storage kind and every stored pair's arrays."""
        return {
            "storage": self.storage,
            "entries": [
                {
                    "cid": c,
                    "task": t,
                    "arrays": (
                        [np.load(a) for a in arrays]
                        if self.storage == "disk"
                        else [np.array(a) for a in arrays]
                    ),
                    **({"scales": list(self._scales[(c, t)])} if (c, t) in self._scales else {}),
                }
                for (c, t), arrays in self._mem.items()
            ],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self._mem = {}
        self._scales = {}
        for e in state["entries"]:
            key = (str(e["cid"]), str(e["task"]))
            if "scales" in e and self.storage == "float16":
                # exact: the stored half-precision arrays and their scales
                self._mem[key] = [np.asarray(a, dtype=np.float16).copy() for a in e["arrays"]]
                self._scales[key] = [np.float32(c) for c in e["scales"]]
            else:
                arrays = e["arrays"]
                if "scales" in e:
                    arrays = [
                        np.asarray(a, np.float64) * float(c) for a, c in zip(arrays, e["scales"])
                    ]
                self.set(key[0], key[1], arrays)


def _zeros_like(weights: Weights) -> list[np.ndarray]:
    return [np.zeros(w.shape, dtype=np.float64) for w in weights]


class _Stored(Mapping[str, list[np.ndarray]]):
    """The stale updates of one task's pairs ``cids``, read from the store when asked
    (a fresh float64 copy each time): a round's aggregation then holds one client's
    stale update at a time, not a copy of every client's."""

    def __init__(self, store: StaleStore, task: str, cids: Mapping[str, Any]) -> None:
        self._store, self._task, self._cids = store, task, cids

    def __getitem__(self, cid: str) -> list[np.ndarray]:
        h = self._store.get(cid, self._task) if cid in self._cids else None
        if h is None:
            raise KeyError(cid)
        return h

    def __contains__(self, cid: object) -> bool:
        return cid in self._cids

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._cids)

    def __len__(self) -> int:
        return len(self._cids)


class StaleAggregator(Aggregator):
    """Shared machinery: the store and the Eq. 17/18 combination."""

    needs_inclusion_probabilities = True
    keeps_per_client = "stale updates"
    #: Whether :meth:`_stale_weight` reads the stale update (Eq. 20's optimum does; a
    #: fixed or scheduled beta does not, and is then computed without reading it).
    beta_reads_stale = True

    def __init__(self, storage: str = "float32", directory: str | None = None) -> None:
        self.store = StaleStore(storage, directory)

    def coefficients(self, updates: Sequence[Update]) -> list[float]:
        """Not used: stale rules are not a weighted sum of the fresh updates."""
        raise NotImplementedError

    def step_weights(self, updates: Sequence[Update]) -> list[float] | None:
        """The fresh updates' weights ``d_{i,s} l / (B_i p_{s|(i,b)})`` in Eq. 17 /
        18 (what a fresh update, stored, also carries into later rounds is
        bounded by its clipped value); None while a pick's probability is not
        positive."""
        if any(not u.prob > 0 or u.processors < 1 for u in updates):
            return None
        return [self._fresh_coefficient(u) for u in updates]

    @staticmethod
    def _fresh_coefficient(u: Update) -> float:
        """``d_{i,s} l / (B_i p_{s|(i,b)})``: the weight of a sampled pair's
        fresh update ``G`` (and of ``-z``) in Eq. 17 / 18."""
        return u.data_share * u.count / (u.processors * u.prob)

    def coefficient_sum(
        self,
        task: str,
        updates: Sequence[Update],
        *,
        shares: Mapping[str, float] | None = None,
    ) -> float:
        """``sum_{(i,b) in A_s} d_{i,s} / (B_i p_{s|(i,b)})``: the sum of the
        coefficients of the round's fresh updates ``G`` in Eq. 17 / 18, which
        is paper 003's ``||H_{tau,s}||_1`` (expectation 1). The stale terms
        (``beta sum_{N_s} d h`` and the ``-z`` inside the sampled sum) are not
        counted."""
        return float(math.fsum(self._fresh_coefficient(u) for u in updates))

    def config(self) -> dict[str, Any]:
        return {"storage": self.store.storage}

    def state_dict(self) -> dict[str, Any]:
        return {"store": self.store.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.store.load_state_dict(state["store"])

    def _stale_weight(
        self,
        task: str,
        cid: str,
        stale: list[np.ndarray] | None,
        fresh: Mapping[str, Weights],
        server_round: int,
    ) -> float:
        """``beta`` of a pair's stale update this round (Eq. 17's fixed one, Eq. 20's
        optimum, Eq. 21's estimate); ``stale`` is the pair's ``h``, None for a rule
        that does not read it (:attr:`beta_reads_stale`)."""
        raise NotImplementedError

    def _after(
        self,
        task: str,
        updates: Sequence[Update],
        stale: Mapping[str, list[np.ndarray]],
        server_round: int,
    ) -> None:
        """Hook run after aggregation, before ``h`` is refreshed (``stale`` holds the
        old ``h`` of every pair read this round)."""

    def aggregate(
        self,
        task: str,
        weights: Weights,
        updates: Sequence[Update],
        server_round: int,
        *,
        shares: Mapping[str, float] | None = None,
        fresh: Mapping[str, Weights] | None = None,
    ) -> Weights:
        """Eq. 17 / 18: ``z_i = beta_i h_i`` for every pair with a stale update, then
        ``Delta = sum d z + sum d l (G - z) / (B p)``; afterwards ``h <- G`` for the
        sampled pairs."""
        shares = default_shares(shares, updates)
        fresh = fresh or {}
        # the pairs with a stale update (the store's keys: no array is read here)
        pairs = {
            cid: None for cid in set(shares) | {u.cid for u in updates} if (cid, task) in self.store
        }
        stale = _Stored(self.store, task, pairs)
        betas: dict[str, float] = {}

        def beta(cid: str, h: list[np.ndarray] | None) -> float:
            # a pair's beta, computed once, from the read of h that first needs it
            if cid not in betas:
                betas[cid] = self._stale_weight(task, cid, h, fresh, server_round)
            return betas[cid]

        if not self.beta_reads_stale:
            for cid in pairs:
                beta(cid, None)
        new, _ = self._combine(weights, shares, beta, stale, updates)
        for cid in pairs:  # a pair with no share that did not train: its beta all the same
            if cid not in betas:
                beta(cid, stale[cid])
        self._after(task, updates, stale, server_round)
        self._refresh(task, updates)
        return new

    def _refresh(self, task: str, updates: Sequence[Update]) -> None:
        for u in updates:
            self.store.set(u.cid, task, u.delta)

    @staticmethod
    def _combine(
        weights: Weights,
        shares: Mapping[str, float],
        beta: Callable[[str, list[np.ndarray] | None], float],
        stale: Mapping[str, list[np.ndarray]],
        updates: Sequence[Update],
    ) -> tuple[Weights, list[np.ndarray]]:
        """``Delta = sum_{N_s} d z + sum_{A_s} d l (G - z) / (B p)`` with ``z = beta
        h`` (``stale``: the pairs with a stale update; ``beta(cid, h)``: a pair's beta,
        given its ``h`` as read here); returns the new weights and Delta. Each ``z`` is
        formed when it is added and dropped after, so no copy of every client's stale
        update is held at once, and an unsampled pair's ``h`` is read once."""
        delta = _zeros_like(weights)
        for cid, d in shares.items():
            if d > 0 and cid in stale:
                h = stale[cid]
                b = beta(cid, h)
                for acc, a in zip(delta, h):
                    acc += d * (b * a)
        for u in updates:
            if not u.prob > 0:
                raise ValueError(f"client {u.cid}: stale rules need prob > 0, got {u.prob}")
            c = StaleAggregator._fresh_coefficient(u)
            # a key check, then one read: stale stores count their reads (.get reads)
            hu = stale[u.cid] if u.cid in stale else None  # noqa: SIM401
            b = beta(u.cid, hu) if hu is not None else 0.0
            for j, acc in enumerate(delta):
                g = np.asarray(u.delta[j], dtype=np.float64)
                acc += c * (g - b * hu[j] if hu is not None else g)
        new = [
            (w.astype(np.float64) - dl).astype(w.dtype, copy=False) for w, dl in zip(weights, delta)
        ]
        return new, delta


class FedStaleAggregator(StaleAggregator):
    """Eq. 17 with a fixed ``beta`` (FedStale); ``beta = 1`` is FedVARP.

    Parameters
    ----------
    beta : float
        Weight of the stale updates, in [0, 1].
    storage, directory :
        See :class:`StaleStore`.
    """

    name = "fedstale"
    beta_reads_stale = False

    def __init__(self, beta: float = 0.8, storage: str = "float32", directory: str | None = None):
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        super().__init__(storage, directory)
        self.beta = float(beta)

    def config(self) -> dict[str, Any]:
        return {"beta": self.beta, **super().config()}

    def _stale_weight(self, task, cid, stale, fresh, server_round):  # type: ignore[no-untyped-def]
        return self.beta


class FedVARPAggregator(FedStaleAggregator):
    """FedVARP: Eq. 17 with ``beta = 1``."""

    name = "fedvarp"

    def __init__(self, storage: str = "float32", directory: str | None = None):
        super().__init__(1.0, storage, directory)


class MIFAAggregator(StaleAggregator):
    """MIFA: ``Delta = sum_{i in N_s} d_i * (G_i if i trained s this round else h_i)``.

    Not unbiased in the paper's sense; it averages the latest update of every
    eligible client. ``start`` says what a (client, model) pair that has never
    uploaded counts as:

    - ``"zero"`` (default): a zero update that keeps its full weight ``d_i``, the
      rule as stated (memory initialised to zero, as in the no-wait variant of
      Gu et al.'s code, ``fdu_no_wait``; their ``fdu`` waits until every device
      has uploaded once), so the step is shrunk by the share of data not seen yet;
    - ``"uploaded"``: nothing; the mean runs over the pairs that have uploaded
      (fresh this round or stored), ``Delta = sum_{i in U_s} d_i x_i /
      sum_{i in U_s} d_i``. Once every eligible pair has uploaded the two are
      the same rule.

    Parameters
    ----------
    start : str
        ``"zero"`` or ``"uploaded"`` (:data:`MIFA_STARTS`).
    storage, directory :
        See :class:`StaleStore`.
    """

    name = "mifa"
    needs_inclusion_probabilities = False

    def __init__(
        self, start: str = "zero", storage: str = "float32", directory: str | None = None
    ) -> None:
        if start not in MIFA_STARTS:
            raise ValueError(f"start must be one of {', '.join(MIFA_STARTS)}; got {start!r}")
        super().__init__(storage, directory)
        self.start = start

    def config(self) -> dict[str, Any]:
        return {"start": self.start, **super().config()}

    def step_weights(self, updates: Sequence[Update]) -> list[float] | None:
        """``d_i`` of each fresh update (the ``uploaded`` start's common factor
        ``1 / sum_{U_s} d`` does not change how the updates compare): MIFA
        divides by no probability."""
        return [float(u.data_share) for u in updates]

    def _sources(
        self, task: str, updates: Sequence[Update], shares: Mapping[str, float]
    ) -> list[tuple[float, Sequence[np.ndarray]]]:
        """``(d_i, x_i)`` of every eligible pair with an update: the fresh ``G_i``
        of a pair that trained, else its stored ``h_i``."""
        trained = {u.cid: u for u in updates}
        out: list[tuple[float, Sequence[np.ndarray]]] = []
        for cid, d in shares.items():
            if d <= 0:
                continue
            if cid in trained:
                out.append((d, trained[cid].delta))
            else:
                h = self.store.get(cid, task)
                if h is not None:
                    out.append((d, h))
        return out

    def _scale(self, task: str, updates: Sequence[Update], shares: Mapping[str, float]) -> float:
        """1 with the zero start; ``1 / sum_{U_s} d_i`` with ``uploaded`` (0
        when no pair has uploaded yet)."""
        if self.start == "zero":
            return 1.0
        trained = {u.cid for u in updates}
        # which pairs have an update, read from the store's keys (no array is loaded)
        total = math.fsum(
            d
            for cid, d in shares.items()
            if d > 0 and (cid in trained or (cid, task) in self.store)
        )
        return 1.0 / total if total > 0 else 0.0

    def coefficient_sum(
        self,
        task: str,
        updates: Sequence[Update],
        *,
        shares: Mapping[str, float] | None = None,
    ) -> float:
        """``sum_{i trained s} d_{i,s}`` (divided by ``sum_{U_s} d`` with the
        ``uploaded`` start): the coefficients of the round's fresh updates (the
        other pairs' stale ``h`` make up the rest; not divided by
        probabilities). Read before :meth:`aggregate` stores the fresh updates."""
        shares = default_shares(shares, updates)
        trained = {u.cid for u in updates}
        fresh = math.fsum(d for cid, d in shares.items() if cid in trained and d > 0)
        return float(fresh * self._scale(task, updates, shares))

    def aggregate(
        self,
        task: str,
        weights: Weights,
        updates: Sequence[Update],
        server_round: int,
        *,
        shares: Mapping[str, float] | None = None,
        fresh: Mapping[str, Weights] | None = None,
    ) -> Weights:
        shares = default_shares(shares, updates)
        scale = self._scale(task, updates, shares)
        delta = _zeros_like(weights)
        for d, src in self._sources(task, updates, shares):
            for acc, a in zip(delta, src):
                acc += (d * scale) * np.asarray(a, dtype=np.float64)
        self._refresh(task, updates)
        return [
            (w.astype(np.float64) - dl).astype(w.dtype, copy=False) for w, dl in zip(weights, delta)
        ]


# ------------------------------------------------------------------ cards
#: Where the stale updates (and SCAFFOLD's control variates) are kept.
STORAGE_PARAMETER = Parameter(
    name="storage",
    setting="stale_storage",
    to="aggregator",
    type=str,
    default="float32",
    help="storage of the stale updates and control variates",
    choices=lambda: STORAGE,
)

CARDS = (
    AlgorithmCard(
        name="fedvarp",
        function="fedvarp",
        title="FedVARP",
        paper="003",
        section="baseline of Section 6 (Eq. 17, β = 1)",
        summary="random allocation",
        rule="Eq. 17, β = 1",
        policy=RandomAllocation,
        aggregator=FedVARPAggregator,
        aggregators=(),
        parameters=(BUDGET_FRACTION, STORAGE_PARAMETER),
    ),
    AlgorithmCard(
        name="fedstale",
        function="fedstale",
        title="FedStale",
        paper="003",
        section="baseline of Section 6 (Eq. 17)",
        summary="random allocation",
        rule="Eq. 17, fixed β",
        policy=RandomAllocation,
        aggregator=FedStaleAggregator,
        aggregators=(),
        parameters=(
            BUDGET_FRACTION,
            Parameter(
                name="beta",
                setting="stale_beta",
                to="aggregator",
                type=float,
                default=0.8,
                help="beta of fedstale (Eq. 17)",
                low=0,
                high=1,
            ),
            STORAGE_PARAMETER,
        ),
    ),
    AlgorithmCard(
        name="mifa",
        function="mifa",
        title="MIFA",
        paper="003",
        section="baseline of Section 6",
        summary="random allocation",
        rule="d-weighted sum of every client's latest update (zero before its first)",
        policy=RandomAllocation,
        aggregator=MIFAAggregator,
        aggregators=(),
        parameters=(
            BUDGET_FRACTION,
            Parameter(
                name="start",
                setting="mifa_start",
                to="aggregator",
                type=str,
                default="zero",
                choices=lambda: MIFA_STARTS,
                help="what mifa counts a client that has not uploaded a model yet "
                "as: zero (the rule as stated, default) or uploaded (mean "
                "over the clients that have)",
            ),
            STORAGE_PARAMETER,
        ),
    ),
)
