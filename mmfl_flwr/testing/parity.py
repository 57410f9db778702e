"""How close two runs' models are: the measure of engine and sharding parity.

Batched training (a shard node, the vectorized engine) rounds float32 sums in
another order than one client trained alone, so two engines' models agree to
rounding, not bit for bit. The measure is the *relative update gap*:
``||(b - w0) - (a - w0)|| / ||a - w0||`` over the floating-point entries of a
model, where ``w0`` is the model's initial weights and ``a`` the reference
run's final weights; integer entries (batch-norm counters) must be equal.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["relative_update_gap", "run_gaps"]


def relative_update_gap(
    start: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]
) -> float:
    """``||Δ_got - Δ_ref|| / ||Δ_ref||`` with ``Δ = weights - start`` over the
    floating-point entries (0 when both updates are zero); ``inf`` when an
    integer entry differs or the keys differ."""
    if set(start) != set(ref) or set(ref) != set(got):
        return float("inf")
    keys = [k for k in start if np.asarray(start[k]).dtype.kind == "f"]
    if any(not np.array_equal(ref[k], got[k]) for k in start if k not in keys):
        return float("inf")
    if not keys:
        return 0.0
    d_ref = np.concatenate([(np.asarray(ref[k], np.float64) - start[k]).ravel() for k in keys])
    d_got = np.concatenate([(np.asarray(got[k], np.float64) - start[k]).ravel() for k in keys])
    gap = float(np.linalg.norm(d_got - d_ref))
    size = float(np.linalg.norm(d_ref))
    if size == 0.0:
        return 0.0 if gap == 0.0 else float("inf")
    return gap / size


def run_gaps(
    start: Mapping[str, Mapping[str, np.ndarray]],
    ref: Mapping[str, Mapping[str, np.ndarray]],
    got: Mapping[str, Mapping[str, np.ndarray]],
) -> dict[str, float]:
    """Model -> :func:`relative_update_gap` of two runs' final weights (numpy
    arrays per model, e.g. ``{t: arrays_to_numpy(r) for t, r in result.arrays.items()}``);
    a model missing from either run is ``inf``."""
    return {
        t: (
            relative_update_gap(start[t], ref[t], got[t]) if t in ref and t in got else float("inf")
        )
        for t in start
    }
