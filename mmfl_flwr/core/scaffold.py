"""SCAFFOLD's server side for MMFL (baseline of paper 003).

Framework-free (numpy only). Per task ``s`` the server keeps the control variate
``c_s`` and the latest ``c_{i,s}`` of every client that trained ``s``; ``c_s`` is
the ``d``-weighted mean ``sum_{i in N_s} d_{i,s} c_{i,s}`` (zero for clients that
never trained ``s``). Clients step ``w <- w - lr (grad + c_s - c_{i,s})`` and
return ``c_{i,s} <- c_{i,s} - c_s + (w_global - w_local) / (K lr)``
(:mod:`mmfl_flwr.client.app`). The model update itself is the unbiased
``d/(B p)`` rule of paper 003, Eq. 3.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmfl_flwr.core.aggregators import UnbiasedAggregator, Update, Weights
from mmfl_flwr.core.card import AlgorithmCard
from mmfl_flwr.core.policy import BUDGET_FRACTION
from mmfl_flwr.core.random_allocation import RandomAllocation
from mmfl_flwr.core.stale import STORAGE_PARAMETER, StaleStore, default_shares


class ScaffoldAggregator(UnbiasedAggregator):
    """Unbiased aggregation of the models plus SCAFFOLD's control variates.

    Parameters
    ----------
    storage : str
        Storage of the clients' control variates (see
        :class:`~mmfl_flwr.core.stale.StaleStore`).
    """

    name = "scaffold"
    needs_control = True
    keeps_per_client = "control variates"

    def __init__(self, storage: str = "float32") -> None:
        self.controls = StaleStore(storage)
        self.server: dict[str, list[np.ndarray]] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(storage={self.controls.storage!r})"

    def server_control(self, task: str, weights: Weights) -> list[np.ndarray]:
        """``c_s`` (zeros shaped like ``weights`` before the first aggregation)."""
        c = self.server.get(task)
        if c is None:
            return [np.zeros(w.shape, dtype=w.dtype) for w in weights]
        return [a.astype(w.dtype) for a, w in zip(c, weights)]

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
        new = super().aggregate(task, weights, updates, server_round)
        for u in updates:
            if u.control is None:
                raise ValueError(f"client {u.cid}: SCAFFOLD update without control variate")
            self.controls.set(u.cid, task, u.control)
        shares = default_shares(shares, updates)
        c = [np.zeros(w.shape, dtype=np.float64) for w in weights]
        for cid, d in shares.items():
            ci = self.controls.get(cid, task)
            if ci is not None and d > 0:
                for acc, a in zip(c, ci):
                    acc += d * a
        self.server[task] = c
        return new

    def state_dict(self) -> dict[str, Any]:
        return {
            "controls": self.controls.state_dict(),
            "server": {t: [np.array(a) for a in c] for t, c in self.server.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controls.load_state_dict(state["controls"])
        self.server = {
            t: [np.asarray(a, np.float64) for a in c] for t, c in state["server"].items()
        }


# ------------------------------------------------------------------ cards
CARDS = (
    AlgorithmCard(
        name="scaffold",
        function="scaffold",
        title="SCAFFOLD",
        paper="003",
        section="baseline of Section 6",
        summary="random allocation",
        rule="unbiased rule + SCAFFOLD control variates (client `c_i` in `context.state`)",
        policy=RandomAllocation,
        aggregator=ScaffoldAggregator,
        aggregators=(),
        parameters=(BUDGET_FRACTION, STORAGE_PARAMETER),
    ),
)
