"""Framework-free MMFL math: the client table, assignment policies, aggregators.

Only numpy is needed here; nothing imports flwr or torch.
"""

from mmfl_flwr.core.aggregators import (
    Aggregator,
    FedAvgAggregator,
    UnbiasedAggregator,
    Update,
    apply_step,
)
from mmfl_flwr.core.clients import (
    ClientInfo,
    ClientTable,
    InvalidClientInfo,
    validate_client_info,
)
from mmfl_flwr.core.lvr import (
    GVR,
    LVR,
    RoundRobinGVR,
    lvr_probabilities,
    sample_processors,
    water_fill,
)
from mmfl_flwr.core.mfa import MFARand, MFARoundRobin, MultiFedAvg
from mmfl_flwr.core.policy import Pick, Policy, picks_by_client
from mmfl_flwr.core.random_allocation import FixedRates, FullParticipation, RandomAllocation

__all__ = [
    "FixedRates",
    "GVR",
    "LVR",
    "RoundRobinGVR",
    "lvr_probabilities",
    "sample_processors",
    "water_fill",
    "Aggregator",
    "ClientInfo",
    "ClientTable",
    "FedAvgAggregator",
    "FullParticipation",
    "InvalidClientInfo",
    "MFARand",
    "MFARoundRobin",
    "MultiFedAvg",
    "Pick",
    "Policy",
    "RandomAllocation",
    "UnbiasedAggregator",
    "Update",
    "apply_step",
    "picks_by_client",
    "validate_client_info",
]
