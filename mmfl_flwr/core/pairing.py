"""Which policies and aggregators can be paired: each declares its needs
(:class:`~mmfl_flwr.core.policy.Policy`, :class:`~mmfl_flwr.core.aggregators.Aggregator`)
and a pairing whose needs do not match is refused before a run starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mmfl_flwr.core.aggregators import Aggregator
    from mmfl_flwr.core.policy import Policy


def check_pairing(policy: Policy, aggregator: Aggregator) -> None:
    """Raise ValueError, saying what to use instead, when ``aggregator`` needs
    something ``policy`` does not provide:

    - inclusion probabilities (the ``d/(B p)`` rules) from a policy that picks
      deterministically (UCB);
    - every pair's fresh update (MMFL-StaleVR's optimal beta) from a policy that
      does not train every pair;
    - stale updates for the ``stale-residual`` selection signal.
    """
    p, a = type(policy).__name__, type(aggregator).__name__
    if aggregator.needs_inclusion_probabilities and not policy.inclusion_probabilities:
        raise ValueError(
            f"{a} divides by inclusion probabilities, but {p} picks clients "
            f"deterministically from their losses (no inclusion probability); "
            f"use FedAvgAggregator"
        )
    if aggregator.needs_fresh and not policy.trains_every_pair:
        raise ValueError(
            f"{a} needs every pair's fresh update each round, but {p} does not "
            f"train every pair; use StaleVRSampling or GVR"
        )
    if policy.selection_signal == "stale-residual" and not aggregator.has_residual:
        raise ValueError(
            f"{p} samples on the stale residual ||G - beta h||, but {a} keeps no "
            f"stale updates to compute it; use StaleVRAggregator"
        )
