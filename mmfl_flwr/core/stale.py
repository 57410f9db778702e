"""Stale-update aggregation (paper 003, Section 5) and its baselines.

Framework-free (numpy only). Every aggregator here keeps ``h_{i,s}``, the last
update received from client ``i`` for task ``s`` (zero before the first), in a
:class:`StaleStore`, and refreshes it with the sampled clients' fresh updates
after each aggregation.

- :class:`FedStaleAggregator` (Eq. 17; FedVARP is ``beta = 1``):
  ``Delta = beta * sum_{i in N_s} d_i h_i + sum_{A_s} d_i l (G_i - beta h_i) / (B_i p_i)``.
- :class:`MIFAAggregator`: ``Delta = sum_{i in N_s} d_i (G_i if i trained s else h_i)``.
- :class:`StaleVRAggregator` (Eq. 18 with the optimal ``beta`` of Eq. 20, per pair):
  ``z_i = beta_i h_i``, ``beta_i = <G_i, h_i> / ||h_i||^2`` from every eligible
  client's fresh update (the "oracle" variant: all clients train every task),
  ``Delta = sum_{N_s} d_i z_i + sum_{A_s} d_i l (G_i - z_i) / (B_i p_i)``.
- :class:`StaleVREAggregator` (Eq. 18 with the estimate of Eq. 21): ``beta`` of a
  pair decays linearly with the rounds since its stale update was refreshed,
  along the line through ``(1, b0)`` and ``(Delta_t, beta*)`` measured at the
  pair's last refresh; only sampled clients compute anything.

Updates are ``G = w_global - w_local``; ``w <- w - Delta`` (global step size 1).
With the true inclusion probabilities every rule but MIFA is unbiased: over the
sampling, ``E[Delta] = sum_i d_i G_i``, because ``z_i`` is fixed before the draw.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmfl_flwr.core.aggregators import Aggregator, Update, Weights
from mmfl_flwr.core.card import AlgorithmCard, Parameter
from mmfl_flwr.core.lvr import GVR, LVR
from mmfl_flwr.core.policy import BUDGET_FRACTION
from mmfl_flwr.core.random_allocation import RandomAllocation

STORAGE = ("float32", "float16", "disk")


def default_shares(
    shares: Mapping[str, float] | None, updates: Sequence[Update]
) -> Mapping[str, float]:
    """``d_{i,s}`` of the eligible clients; without them, those of the updates."""
    return shares if shares is not None else {u.cid: u.data_share for u in updates}


def optimal_stale_beta(fresh: Sequence[np.ndarray], stale: Sequence[np.ndarray]) -> float:
    """``<G, h> / ||h||^2`` over all arrays of a model (Eq. 20); 0 when ``h`` is 0.

    Parameters
    ----------
    fresh : sequence of arrays
        ``G``, the fresh update, one array per model tensor.
    stale : sequence of arrays
        ``h``, the stale update, same shapes.
    """
    if len(fresh) != len(stale):
        raise ValueError(f"{len(fresh)} fresh arrays but {len(stale)} stale arrays")
    dot = 0.0
    norm2 = 0.0
    for g, h in zip(fresh, stale):
        g64 = np.asarray(g, dtype=np.float64)
        h64 = np.asarray(h, dtype=np.float64)
        if g64.shape != h64.shape:
            raise ValueError(f"shape mismatch: fresh {g64.shape} vs stale {h64.shape}")
        dot += float(np.vdot(g64, h64))
        norm2 += float(np.vdot(h64, h64))
    return dot / norm2 if norm2 > 0 else 0.0


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
        self._mem: dict[tuple[str, str], list[np.ndarray]] = {}
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
            stored = []
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
                        [np.load(a) for a in arrays] if self.storage == "disk"
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
                    arrays = [np.asarray(a, np.float64) * float(c)
                              for a, c in zip(arrays, e["scales"])]
                self.set(key[0], key[1], arrays)


def _zeros_like(weights: Weights) -> list[np.ndarray]:
    return [np.zeros(w.shape, dtype=np.float64) for w in weights]


class _StaleBase(Aggregator):
    """Shared machinery: the store and the Eq. 17/18 combination."""

    needs_inclusion_probabilities = True
    keeps_per_client = "stale updates"

    def __init__(self, storage: str = "float32", directory: str | None = None) -> None:
        self.store = StaleStore(storage, directory)

    def coefficients(self, updates: Sequence[Update]) -> list[float]:
        """Not used: stale rules are not a weighted sum of the fresh updates."""
        raise NotImplementedError

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
        stale: list[np.ndarray],
        fresh: Mapping[str, Weights],
        server_round: int,
    ) -> float:
        """``beta`` of a pair's stale update this round (Eq. 17's fixed one, Eq. 20's
        optimum, Eq. 21's estimate)."""
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
        stale = {}
        for cid in set(shares) | {u.cid for u in updates}:
            h = self.store.get(cid, task)
            if h is not None:
                stale[cid] = h
        z = {
            cid: [self._stale_weight(task, cid, h, fresh or {}, server_round) * a for a in h]
            for cid, h in stale.items()
        }
        new, _ = self._combine(weights, shares, z, updates)
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
        z: Mapping[str, list[np.ndarray]],
        updates: Sequence[Update],
    ) -> tuple[Weights, list[np.ndarray]]:
        """``Delta = sum_{N_s} d z + sum_{A_s} d l (G - z) / (B p)``; returns the new
        weights and Delta."""
        delta = _zeros_like(weights)
        for cid, d in shares.items():
            if d > 0 and cid in z:
                for acc, a in zip(delta, z[cid]):
                    acc += d * a
        for u in updates:
            if not u.prob > 0:
                raise ValueError(f"client {u.cid}: stale rules need prob > 0, got {u.prob}")
            c = _StaleBase._fresh_coefficient(u)
            zu = z.get(u.cid)
            for j, acc in enumerate(delta):
                g = np.asarray(u.delta[j], dtype=np.float64)
                acc += c * (g - zu[j] if zu is not None else g)
        new = [
            (w.astype(np.float64) - dl).astype(w.dtype, copy=False)
            for w, dl in zip(weights, delta)
        ]
        return new, delta


class FedStaleAggregator(_StaleBase):
    """Eq. 17 with a fixed ``beta`` (FedStale); ``beta = 1`` is FedVARP.

    Parameters
    ----------
    beta : float
        Weight of the stale updates, in [0, 1].
    storage, directory :
        See :class:`StaleStore`.
    """

    name = "fedstale"

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


class MIFAAggregator(_StaleBase):
    """MIFA: ``Delta = sum_{i in N_s} d_i * (G_i if i trained s this round else h_i)``.

    Clients that never uploaded contribute zero. Not unbiased in the paper's
    sense; it averages the latest update of every eligible client.
    """

    name = "mifa"
    needs_inclusion_probabilities = False

    def coefficient_sum(
        self,
        task: str,
        updates: Sequence[Update],
        *,
        shares: Mapping[str, float] | None = None,
    ) -> float:
        """``sum_{i trained s} d_{i,s}``: the coefficients of the round's fresh
        updates (the other eligible clients' stale ``h`` make up the rest of
        the weight 1; not divided by probabilities)."""
        shares = default_shares(shares, updates)
        trained = {u.cid for u in updates}
        return float(math.fsum(d for cid, d in shares.items() if cid in trained and d > 0))

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
        trained = {u.cid: u for u in updates}
        delta = _zeros_like(weights)
        for cid, d in shares.items():
            if d <= 0:
                continue
            if cid in trained:
                src: list[np.ndarray] | None = [
                    np.asarray(a, dtype=np.float64) for a in trained[cid].delta
                ]
            else:
                src = self.store.get(cid, task)
            if src is not None:
                for acc, a in zip(delta, src):
                    acc += d * a
        self._refresh(task, updates)
        return [
            (w.astype(np.float64) - dl).astype(w.dtype, copy=False)
            for w, dl in zip(weights, delta)
        ]


class StaleVRAggregator(_StaleBase):
    """MMFL-StaleVR: Eq. 18 with the per-pair optimal ``beta`` of Eq. 20.

    Needs ``fresh``: the fresh update of every eligible client (all clients train
    every task; only the sampled updates count as uploaded and refresh ``h``).
    A pair without a fresh update this round uses ``beta = 0``.
    """

    name = "stalevr"
    needs_fresh = True
    has_residual = True

    def __init__(self, storage: str = "float32", directory: str | None = None) -> None:
        super().__init__(storage, directory)
        self.last_betas: dict[tuple[str, str], float] = {}

    def residual_norm(self, task: str, cid: str, fresh: Sequence[np.ndarray]) -> float:
        """``||G - beta h||`` with the optimal ``beta`` (``||G||`` without ``h``):
        the sampling signal of the authors' code, offered as an option."""
        h = self.store.get(cid, task)
        if h is None:
            return float(np.sqrt(sum(float(np.vdot(g, g)) for g in fresh)))
        beta = optimal_stale_beta(fresh, h)
        return float(
            np.sqrt(sum(float(np.square(np.asarray(g, np.float64) - beta * a).sum())
                        for g, a in zip(fresh, h)))
        )

    def _stale_weight(self, task, cid, stale, fresh, server_round):  # type: ignore[no-untyped-def]
        g = fresh.get(cid)
        beta = optimal_stale_beta(g, stale) if g is not None else 0.0
        self.last_betas[(cid, task)] = beta
        return beta


class StaleVREAggregator(_StaleBase):
    """MMFL-StaleVRE: Eq. 18 with ``beta`` estimated by Eq. 21.

    Per pair, with ``k`` the rounds since its stale update was refreshed
    (``k = 1`` in the round right after), ``Delta_t`` the staleness at which
    ``beta*`` was last measured, and ``b0`` the starting value (~1):
    ``beta(k) = b0 - (k - 1) (b0 - beta*) / max(Delta_t - 1, 1)``, clipped to
    ``[0, b0]``; ``b0`` until the pair's second upload. When a sampled pair
    uploads ``G`` at staleness ``Delta_t``, ``beta* = <G, h_old> / ||h_old||^2``
    is measured and ``h`` refreshed. ``beta(k)`` is fixed before the draw, for
    sampled and unsampled pairs alike, so the rule stays unbiased.

    Parameters
    ----------
    b0 : float
        The paper's ``beta-hat`` (default 1.0).
    """

    name = "stalevre"

    def __init__(self, b0: float = 1.0, storage: str = "float32", directory: str | None = None):
        if not b0 > 0:
            raise ValueError(f"b0 must be > 0, got {b0}")
        super().__init__(storage, directory)
        self.b0 = float(b0)
        # (cid, task) -> [refresh_round, beta_star or None, delta_t]
        self.schedule: dict[tuple[str, str], list[Any]] = {}

    def config(self) -> dict[str, Any]:
        return {"b0": self.b0, **super().config()}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "schedule": [[c, t, *v] for (c, t), v in self.schedule.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.schedule = {
            (str(c), str(t)): [int(r), None if b is None else float(b), int(dt)]
            for c, t, r, b, dt in state["schedule"]
        }

    def beta(self, cid: str, task: str, server_round: int) -> float:
        """The estimated ``beta`` of a pair at ``server_round`` (0 if no stale update)."""
        entry = self.schedule.get((cid, task))
        if entry is None:
            return 0.0
        refresh_round, beta_star, delta_t = entry
        if beta_star is None:
            return self.b0
        k = server_round - refresh_round
        value = self.b0 - (k - 1) * (self.b0 - beta_star) / max(delta_t - 1, 1)
        return float(min(self.b0, max(0.0, value)))

    def _stale_weight(self, task, cid, stale, fresh, server_round):  # type: ignore[no-untyped-def]
        return self.beta(cid, task, server_round)

    def _after(self, task, updates, stale, server_round):  # type: ignore[no-untyped-def]
        """Measure ``beta*`` of every sampled pair against its old ``h``."""
        for u in updates:
            key = (u.cid, task)
            h_old = stale.get(u.cid)
            if h_old is not None and key in self.schedule:
                delta_t = server_round - self.schedule[key][0]
                self.schedule[key] = [server_round, optimal_stale_beta(u.delta, h_old), delta_t]
            else:
                self.schedule[key] = [server_round, None, 0]


# ---------------------------------------------------------------- sampling
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

    @property
    def needs_losses(self) -> bool:
        """A loss query every round with the paper's ``signal="loss"``."""
        return self.signal == "loss"

    @property
    def selection_signal(self) -> str:
        return "stale-residual" if self.signal == "stale-residual" else "update-norm"

    def config(self) -> dict[str, Any]:
        return {**super().config(), "signal": self.signal}

    def _signal_from_losses(self) -> bool:
        return self.signal == "loss"


# ------------------------------------------------------------------ cards
#: Where the stale updates (and SCAFFOLD's control variates) are kept.
STORAGE_PARAMETER = Parameter(
    name="storage", setting="stale_storage", to="aggregator", type=str, default="float32",
    help="storage of the stale updates and control variates", choices=lambda: STORAGE,
)

CARDS = (
    AlgorithmCard(
        name="stalevr", function="stalevr", title="MMFL-StaleVR", paper="003",
        section="Section 5 (Eqs. 18 and 20)",
        summary='every pair trains; LVR probabilities pick the aggregated updates '
                '(`signal="stale-residual"`: `‖G − βh‖`, as the authors\' code)',
        rule="Eq. 18 with the optimal β of Eq. 20 per pair",
        policy=StaleVRSampling, aggregator=StaleVRAggregator, aggregators=(),
        parameters=(
            BUDGET_FRACTION,
            Parameter(name="signal", setting="stalevr_signal", type=str, default="loss",
                      help="sampling signal of stalevr (loss: the paper's)",
                      choices=lambda: StaleVRSampling.SIGNALS),
            STORAGE_PARAMETER,
        ),
    ),
    AlgorithmCard(
        name="stalevre", function="stalevre", title="MMFL-StaleVRE", paper="003",
        section="Section 5 (Eq. 21)",
        summary="LVR (only sampled clients train)",
        rule="Eq. 18 with β estimated by Eq. 21 (linear decay)",
        policy=LVR, aggregator=StaleVREAggregator, aggregators=(),
        parameters=(
            BUDGET_FRACTION,
            Parameter(name="b0", setting="stalevre_b0", to="aggregator", type=float,
                      default=1.0, help="starting beta b0 of stalevre (Eq. 21)", low=0,
                      low_open=True),
            STORAGE_PARAMETER,
        ),
    ),
    AlgorithmCard(
        name="fedvarp", function="fedvarp", title="FedVARP", paper="003",
        section="baseline of Section 6 (Eq. 17, β = 1)",
        summary="random allocation", rule="Eq. 17, β = 1",
        policy=RandomAllocation, aggregator=FedVARPAggregator, aggregators=(),
        parameters=(BUDGET_FRACTION, STORAGE_PARAMETER),
    ),
    AlgorithmCard(
        name="fedstale", function="fedstale", title="FedStale", paper="003",
        section="baseline of Section 6 (Eq. 17)",
        summary="random allocation", rule="Eq. 17, fixed β",
        policy=RandomAllocation, aggregator=FedStaleAggregator, aggregators=(),
        parameters=(
            BUDGET_FRACTION,
            Parameter(name="beta", setting="stale_beta", to="aggregator", type=float,
                      default=0.8, help="beta of fedstale (Eq. 17)", low=0, high=1),
            STORAGE_PARAMETER,
        ),
    ),
    AlgorithmCard(
        name="mifa", function="mifa", title="MIFA", paper="003", section="baseline of Section 6",
        summary="random allocation", rule="mean of every client's latest update",
        policy=RandomAllocation, aggregator=MIFAAggregator, aggregators=(),
        parameters=(BUDGET_FRACTION, STORAGE_PARAMETER),
    ),
)
