"""Compatibility module: the policies by their old import path.

The policies now live one algorithm family per module (:mod:`.policy` holds the
contract and the shared sampling helpers); import from there or from
:mod:`mmfl_flwr.core`.
"""

from mmfl_flwr.core.lvr import GVR, LVR
from mmfl_flwr.core.mfa import MFARand, MFARoundRobin, MultiFedAvg
from mmfl_flwr.core.policy import (
    Pick,
    Policy,
    ProbabilityPolicy,
    data_shares,
    draw_picks,
    eligibility_view,
    picks_by_client,
    picks_from_counts,
    resolve_budget,
)
from mmfl_flwr.core.random_allocation import FixedRates, FullParticipation, RandomAllocation
from mmfl_flwr.core.stale import StaleVRSampling

__all__ = [
    "GVR",
    "LVR",
    "FixedRates",
    "FullParticipation",
    "MFARand",
    "MFARoundRobin",
    "MultiFedAvg",
    "Pick",
    "Policy",
    "ProbabilityPolicy",
    "RandomAllocation",
    "StaleVRSampling",
    "data_shares",
    "draw_picks",
    "eligibility_view",
    "picks_by_client",
    "picks_from_counts",
    "resolve_budget",
]
