"""mmfl-flwr: multi-model federated learning (MMFL) for the Flower framework.

Importing this package does not import torch: the server side (core math,
``MultiModelStrategy``, presets) runs where torch is absent. Names are loaded
lazily on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "MultiModelStrategy": "mmfl_flwr.strategy",
    "HookError": "mmfl_flwr.strategy",
    "NoClientCanServe": "mmfl_flwr.strategy.registration",
    "MultiModelResult": "mmfl_flwr.strategy",
    "InProcessGrid": "mmfl_flwr.grid",
    "make_strategy": "mmfl_flwr.presets",
    "PRESETS": "mmfl_flwr.presets",
    "random_allocation": "mmfl_flwr.presets",
    "full_participation": "mmfl_flwr.presets",
    "mfa_rand": "mmfl_flwr.presets",
    "mfa_rr": "mmfl_flwr.presets",
    "multi_fedavg": "mmfl_flwr.presets",
    "make_client_app": "mmfl_flwr.client.app",
    "ClientSpec": "mmfl_flwr.client.app",
    "LocalTrainer": "mmfl_flwr.client.contract",
    "VectorizableTrainer": "mmfl_flwr.client.contract",
    "FunctionTrainer": "mmfl_flwr.client.functions",
    "client_app_from_functions": "mmfl_flwr.client.functions",
    "Settings": "mmfl_flwr.config",
    "ClientTable": "mmfl_flwr.core",
    "ClientInfo": "mmfl_flwr.core",
    "Pick": "mmfl_flwr.core",
    "Policy": "mmfl_flwr.core",
    "Aggregator": "mmfl_flwr.core",
    "AlgorithmCard": "mmfl_flwr.core.card",
    "Parameter": "mmfl_flwr.core.card",
    "register_card": "mmfl_flwr.core.card",
    "Update": "mmfl_flwr.core",
    "FedAvgAggregator": "mmfl_flwr.core",
    "UnbiasedAggregator": "mmfl_flwr.core",
    "RandomAllocation": "mmfl_flwr.core",
    "FullParticipation": "mmfl_flwr.core",
    "MFARand": "mmfl_flwr.core",
    "MFARoundRobin": "mmfl_flwr.core",
    "MultiFedAvg": "mmfl_flwr.core",
    "LVR": "mmfl_flwr.core",
    "GVR": "mmfl_flwr.core",
    "RoundRobinGVR": "mmfl_flwr.core",
    "lvr_probabilities": "mmfl_flwr.core",
    "lvr": "mmfl_flwr.presets",
    "gvr": "mmfl_flwr.presets",
    "rr_gvr": "mmfl_flwr.presets",
    "stalevr": "mmfl_flwr.presets",
    "stalevre": "mmfl_flwr.presets",
    "fedvarp": "mmfl_flwr.presets",
    "fedstale": "mmfl_flwr.presets",
    "mifa": "mmfl_flwr.presets",
    "scaffold": "mmfl_flwr.presets",
    "ranklist_ucb": "mmfl_flwr.presets",
    "pareto_ucb": "mmfl_flwr.presets",
    "group_sampling": "mmfl_flwr.presets",
    "FixedRates": "mmfl_flwr.core.random_allocation",
    "StaleVRSampling": "mmfl_flwr.core.stalevr",
    "MeanAggregator": "mmfl_flwr.core.aggregators",
    "MedianAggregator": "mmfl_flwr.core.robust",
    "CenteredClipAggregator": "mmfl_flwr.core.robust",
    "UnbiasedCenteredClipAggregator": "mmfl_flwr.core.robust",
    "TrimmedMeanAggregator": "mmfl_flwr.core.robust",
    "optimal_stale_beta": "mmfl_flwr.core.stalevr",
    "StaleStore": "mmfl_flwr.core.stale",
    "FedStaleAggregator": "mmfl_flwr.core.stale",
    "FedVARPAggregator": "mmfl_flwr.core.stale",
    "MIFAAggregator": "mmfl_flwr.core.stale",
    "StaleVRAggregator": "mmfl_flwr.core.stalevr",
    "StaleVREAggregator": "mmfl_flwr.core.stalevr",
    "ScaffoldAggregator": "mmfl_flwr.core.scaffold",
    "RanklistMultiUCB": "mmfl_flwr.core.ucb",
    "ParetoMultiUCB": "mmfl_flwr.core.ucb",
    "pareto_front": "mmfl_flwr.core.ucb",
    "GroupSampling": "mmfl_flwr.core.group",
    "register_task": "mmfl_flwr.tasks.registry",
    "token_pin": "mmfl_flwr.strategy.registration",
    "key_pin": "mmfl_flwr.strategy.registration",
    "Limits": "mmfl_flwr.strategy",
    "gain": "mmfl_flwr.convergence",
    "rounds_to_target": "mmfl_flwr.convergence",
    "accuracy_curves": "mmfl_flwr.convergence",
    "run_sequential": "mmfl_flwr.sequential",
    "read_single_csv": "mmfl_flwr.sequential",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("_"):  # the factory of an algorithm card not listed above
        from mmfl_flwr.core.card import cards

        if any(c.function == name for c in cards()):
            value = getattr(importlib.import_module("mmfl_flwr.presets"), name)
            globals()[name] = value
            return value
    raise AttributeError(f"module 'mmfl_flwr' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
