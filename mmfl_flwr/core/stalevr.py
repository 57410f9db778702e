"""MMFL-StaleVR and MMFL-StaleVRE (paper 003, Section 5): stale updates reused
with a per-pair ``beta``, and StaleVR's sampling.

Framework-free (numpy only). The aggregators keep ``h_{i,s}`` in a
:class:`~mmfl_flwr.core.stale.StaleStore` like the baselines of
:mod:`mmfl_flwr.core.stale`:

- :class:`StaleVRAggregator` (Eq. 18 with the optimal ``beta`` of Eq. 20, per pair):
  ``z_i = beta_i h_i``, ``beta_i = <G_i, h_i> / ||h_i||^2`` from every eligible
  client's fresh update (the "oracle" variant: all clients train every task),
  ``Delta = sum_{N_s} d_i z_i + sum_{A_s} d_i l (G_i - z_i) / (B_i p_i)``.
- :class:`StaleVREAggregator` (Eq. 18 with the estimate of Eq. 21): ``beta`` of a
  pair decays linearly with the rounds since its stale update was refreshed,
  along the line through ``(1, b0)`` and ``(Delta_t, beta*)`` measured at the
  pair's last refresh; only sampled clients compute anything.
- :class:`StaleVRSampling`: every pair trains, LVR probabilities (Eq. 13) on the
  losses pick which updates count.

With the true inclusion probabilities both rules are unbiased: over the
sampling, ``E[Delta] = sum_i d_i G_i``, because ``z_i`` is fixed before the draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mmfl_flwr.core.card import AlgorithmCard
from mmfl_flwr.core.lvr import GVR, LVR
from mmfl_flwr.core.parameter import Parameter
from mmfl_flwr.core.policy import BUDGET_FRACTION
from mmfl_flwr.core.stale import STORAGE_PARAMETER, StaleAggregator


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


class StaleVRAggregator(StaleAggregator):
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
            np.sqrt(
                sum(
                    float(np.square(np.asarray(g, np.float64) - beta * a).sum())
                    for g, a in zip(fresh, h)
                )
            )
        )

    def _stale_weight(self, task, cid, stale, fresh, server_round):  # type: ignore[no-untyped-def]
        g = fresh.get(cid)
        beta = optimal_stale_beta(g, stale) if g is not None else 0.0
        self.last_betas[(cid, task)] = beta
        return beta


class StaleVREAggregator(StaleAggregator):
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
    beta_reads_stale = False

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
        """``"loss"`` (the paper's) or ``"stale-residual"``."""
        return self.signal

    def config(self) -> dict[str, Any]:
        return {**super().config(), "signal": self.signal}


# ------------------------------------------------------------------ cards
CARDS = (
    AlgorithmCard(
        name="stalevr",
        function="stalevr",
        title="MMFL-StaleVR",
        paper="003",
        section="Section 5 (Eqs. 18 and 20)",
        summary="every pair trains; LVR probabilities pick the aggregated updates "
        '(`signal="stale-residual"`: `‖G − βh‖`, as the authors\' code)',
        rule="Eq. 18 with the optimal β of Eq. 20 per pair",
        policy=StaleVRSampling,
        aggregator=StaleVRAggregator,
        aggregators=(),
        parameters=(
            BUDGET_FRACTION,
            Parameter(
                name="signal",
                setting="stalevr_signal",
                type=str,
                default="loss",
                help="sampling signal of stalevr (loss: the paper's)",
                choices=lambda: StaleVRSampling.SIGNALS,
            ),
            STORAGE_PARAMETER,
        ),
    ),
    AlgorithmCard(
        name="stalevre",
        function="stalevre",
        title="MMFL-StaleVRE",
        paper="003",
        section="Section 5 (Eq. 21)",
        summary="LVR (only sampled clients train)",
        rule="Eq. 18 with β estimated by Eq. 21 (linear decay)",
        policy=LVR,
        aggregator=StaleVREAggregator,
        aggregators=(),
        parameters=(
            BUDGET_FRACTION,
            Parameter(
                name="b0",
                setting="stalevre_b0",
                to="aggregator",
                type=float,
                default=1.0,
                help="starting beta b0 of stalevre (Eq. 21)",
                low=0,
                low_open=True,
            ),
            STORAGE_PARAMETER,
        ),
    ),
)
