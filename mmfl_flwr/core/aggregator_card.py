"""Aggregator cards: every aggregator that a preset may take by name declares itself
once, next to its code, as the algorithm cards declare the presets.

A module of :mod:`mmfl_flwr.core` that defines ``AGGREGATOR_CARDS`` (a tuple of
:class:`AggregatorCard`) contributes them; :func:`mmfl_flwr.core.card.register_aggregator`
adds a user's own. The names are the values of ``--aggregator`` (run-config
``aggregator``, a preset's ``aggregator=``): :data:`mmfl_flwr.core.card.AGGREGATORS` and
the privacy wrappers' check are read from the cards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AggregatorCard:
    """One aggregator a preset may take by name.

    Attributes
    ----------
    name : str
        The ``--aggregator`` value (``"trimmed-mean"``).
    factory : callable
        Builds the aggregator with its defaults (the class itself, usually).
    summary : str
        What it computes, in one sentence (no final period).
    private : bool
        Whether the per-model differential-privacy wrappers
        (:mod:`mmfl_flwr.privacy`) cover it: it combines only the round's clipped
        updates, with coefficients that sum to at most one per client, so the noise
        std ``z C / m`` is calibrated for it.
    """

    name: str
    factory: Callable[[], Any]
    summary: str
    private: bool = False
