"""Clipping of a model update to a norm, over the model's trainable entries
(numpy only): the per-model differential privacy of :mod:`mmfl_flwr.privacy`
on the server and of ``make_client_app`` on the clients."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

#: the train-config key of the clipping norm (Flower's ``KEY_CLIPPING_NORM``);
#: ``clipping_norm.<model>`` holds one model's norm, and wins
KEY_CLIPPING_NORM = "clipping_norm"


def update_norm(
    new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray], keys: Iterable[str]
) -> float:
    """``||new - old||_2`` over ``keys``, in float64, scaled by the largest entry so
    that finite updates of huge entries do not overflow (inf only when an entry
    of the difference is not finite)."""
    diffs = [
        (np.asarray(new[k], dtype=np.float64) - np.asarray(old[k], dtype=np.float64)).ravel()
        for k in keys
    ]
    diffs = [d for d in diffs if d.size]
    if not diffs:
        return 0.0
    scale = max(float(np.max(np.abs(d))) for d in diffs)
    if not math.isfinite(scale):
        return math.inf if not any(np.isnan(d).any() for d in diffs) else math.nan
    if scale == 0.0:
        return 0.0
    total = sum(float(np.dot(d / scale, d / scale)) for d in diffs)
    return scale * math.sqrt(total)


def clip_update(
    new: dict[str, np.ndarray], old: Mapping[str, np.ndarray], keys: list[str], clipping_norm: float
) -> tuple[dict[str, np.ndarray], float, bool]:
    """``new`` with its update ``new - old`` over ``keys`` scaled to norm at most
    ``clipping_norm`` (the other entries as they are); returns the weights, the
    update's norm before clipping and whether it was clipped (a clipped update's
    norm is C up to a relative 1e-6 below it)."""
    norm = update_norm(new, old, keys)
    if not norm > clipping_norm:  # also NaN: left for the reply validation to reject
        return new, norm, False
    scale = clipping_norm / norm * (1 - 1e-6)  # stays <= C after the cast back
    out = dict(new)
    for k in keys:
        o = np.asarray(old[k], dtype=np.float64)
        out[k] = (o + (np.asarray(new[k], dtype=np.float64) - o) * scale).astype(new[k].dtype)
    return out, norm, True


def clipping_norm_for(config: Mapping[str, object], task: str) -> float | None:
    """The clipping norm a train config sets for ``task`` (``clipping_norm.<task>``,
    else ``clipping_norm``), or None."""
    value = config.get(f"{KEY_CLIPPING_NORM}.{task}", config.get(KEY_CLIPPING_NORM))
    if value is None:
        return None
    norm = float(value)  # type: ignore[arg-type]
    if not (norm > 0 and math.isfinite(norm)):
        raise ValueError(f"clipping norm of {task!r} must be positive, got {value!r}")
    return norm
