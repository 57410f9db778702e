"""mmfl-flwr: multi-model federated learning (MMFL) for the Flower framework.

Importing this package does not import torch: the server side (core math,
``MultiModelStrategy``, presets) runs where torch is absent. Names are loaded
lazily on first access.

The exports are :data:`_EXPORTS` and, read from the algorithm and aggregator cards
(:mod:`mmfl_flwr.core.card`), every card's factory (``lvr``), policy class (``LVR``)
and default aggregator class, and every aggregator card's class: adding an
algorithm or an aggregator exports it without a list to edit here.
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
    "lvr_probabilities": "mmfl_flwr.core",
    "optimal_stale_beta": "mmfl_flwr.core.stalevr",
    "FixedRates": "mmfl_flwr.core.random_allocation",
    "StaleStore": "mmfl_flwr.core.stale",
    "pareto_front": "mmfl_flwr.core.ucb",
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


def _card_exports() -> dict[str, str]:
    """Name -> module of everything the cards declare (see the module docstring)."""
    from mmfl_flwr.core.card import aggregator_cards, cards

    out: dict[str, str] = {}
    for c in cards():
        out[c.function] = "mmfl_flwr.presets"
        for obj in (c.policy, c.aggregator):
            out[obj.__name__] = obj.__module__
    for a in aggregator_cards():
        out[a.factory.__name__] = a.factory.__module__
    return out


def _all() -> list[str]:
    return sorted({*_EXPORTS, *_card_exports()}) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name == "__all__":  # computed: the cards' exports are found when asked for
        return _all()
    module = _EXPORTS.get(name)
    if module is None and not name.startswith("_"):
        module = _card_exports().get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mmfl_flwr' has no attribute {name!r}")


def __dir__() -> list[str]:
    return _all()
