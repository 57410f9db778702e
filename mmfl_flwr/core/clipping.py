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


def update_norm(new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray],
                keys: Iterable[str]) -> float:
    """``||new - old||_2`` over ``keys``, in float64."""
    total = 0.0
    for k in keys:
        d = np.asarray(new[k], dtype=np.float64) - np.asarray(old[k], dtype=np.float64)
        total += float(np.dot(d.ravel(), d.ravel()))
    return math.sqrt(total)


def clip_update(new: dict[str, np.ndarray], old: Mapping[str, np.ndarray], keys: list[str],
                clipping_norm: float) -> tuple[dict[str, np.ndarray], float, bool]:
    """``new`` with its update ``new - old`` over ``keys`` scaled to norm at most
    ``clipping_norm`` (the other entries as they are); returns the weights, the
    update's norm before clipping and whether it was clipped."""
    norm = update_norm(new, old, keys)
    if not norm > clipping_norm:  # also NaN: left for the reply validation to reject
        return new, norm, False
    scale = clipping_norm / norm
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
