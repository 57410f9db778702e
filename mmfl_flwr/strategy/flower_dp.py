"""Flower's own differential-privacy wrappers refuse a MultiModelStrategy.

Flower 1.42's DP wrappers clip and noise one model (one ArrayRecord): given a
MultiModelStrategy they would fail deep inside a round. :func:`refuse_multi_model`
patches their constructors once, at import of :mod:`.orchestrator`, to refuse
one at once, naming the per-model equivalent in :mod:`mmfl_flwr.privacy` (same
parameters); any other strategy passes through unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

#: The DP wrappers of ``flwr.serverapp.strategy`` that clip and noise one model.
FLOWER_DP_WRAPPERS = (
    "DifferentialPrivacyServerSideFixedClipping",
    "DifferentialPrivacyClientSideFixedClipping",
    "DifferentialPrivacyServerSideAdaptiveClipping",
    "DifferentialPrivacyClientSideAdaptiveClipping",
)


def refuse_multi_model(multi_model: type) -> None:
    """Make the constructor of each of Flower's :data:`FLOWER_DP_WRAPPERS` raise
    a TypeError when it is given an instance of ``multi_model`` (patched once)."""
    from flwr.serverapp import strategy as flower_strategies

    for name in FLOWER_DP_WRAPPERS:
        cls = getattr(flower_strategies, name, None)
        if cls is None or getattr(cls.__init__, "_mmfl_refuses", False):
            continue
        cls.__init__ = _refusing_init(cls, name, multi_model)


def _refusing_init(cls: type, name: str, multi_model: type) -> Any:
    """``cls.__init__``, refusing an instance of ``multi_model`` as the strategy."""
    # patching a class's __init__ is what this module is for
    original = cls.__init__  # type: ignore[misc]

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        wrapped = args[0] if args else kwargs.get("strategy")
        if isinstance(wrapped, multi_model):
            raise TypeError(
                f"flwr's {name} cannot wrap a MultiModelStrategy (it clips and "
                f"noises one model); use mmfl_flwr.privacy.{name}, which takes the "
                "same parameters and acts per model"
            )
        original(self, *args, **kwargs)

    __init__._mmfl_refuses = True  # type: ignore[attr-defined]
    return __init__
