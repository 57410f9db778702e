"""Checks and edits of one model's weights that every client path shares
(numpy only: no torch, no Flower).

- :func:`check_weight_keys`: the one check that received weights have a model's
  keys and shapes (the per-client trainers load them with it, the batched
  engine stacks them with it);
- :func:`clip_to_norm`: client-side differential privacy, the one clipping of
  a trained update that both the per-client and the batched path apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mmfl_flwr.core.clipping import clip_update

__all__ = ["Weights", "check_weight_keys", "clip_to_norm", "trainable_keys"]

Weights = dict[str, np.ndarray]


def check_weight_keys(shapes: Mapping[str, tuple[int, ...]], weights: Mapping[str, Any]) -> None:
    """KeyError unless ``weights`` has exactly the keys of ``shapes`` (a model's
    ``state_dict`` keys and shapes); ValueError naming the first entry, in the
    order of ``shapes``, whose array has another shape."""
    missing = set(shapes) - set(weights)
    extra = set(weights) - set(shapes)
    if missing or extra:
        raise KeyError(f"weight keys mismatch: missing {sorted(missing)}, extra {sorted(extra)}")
    for key, shape in shapes.items():
        arr = np.asarray(weights[key])
        if tuple(arr.shape) != tuple(shape):
            raise ValueError(f"shape mismatch for {key}: {arr.shape} vs {tuple(shape)}")


def trainable_keys(trainer: Any) -> list[str]:
    """The trainer's declared trainable keys (empty when it declares none)."""
    return [str(k) for k in (getattr(trainer, "trainable_keys", None) or [])]


def clip_to_norm(
    new: Weights, received: Mapping[str, np.ndarray], trainer: Any, norm: float
) -> Weights:
    """``new`` with its update ``new - received`` clipped to ``norm`` over the
    trainer's trainable entries (every floating-point entry of ``new`` where the
    trainer declares none); ``new`` itself is not modified."""
    keys = trainable_keys(trainer) or [k for k, v in new.items() if np.asarray(v).dtype.kind == "f"]
    return clip_update(dict(new), received, keys, norm)[0]
