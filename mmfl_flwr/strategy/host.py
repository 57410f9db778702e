"""What the round loop and the run settings read of the strategy: :class:`StrategyHost`.

:class:`~mmfl_flwr.strategy.orchestrator.MultiModelStrategy` imports the modules of its
phases; those that need the strategy itself (:mod:`.rounds`, :mod:`.settings`) name it
through this protocol instead of importing it back, so the package has no import circle
(tests/tools/test_import_cycles.py), and mypy checks that the strategy provides every
attribute here with its type.
"""

from __future__ import annotations

from typing import Any, Protocol

from flwr.app import RecordDict

from mmfl_flwr.core.aggregators import Aggregator
from mmfl_flwr.core.policy import Policy
from mmfl_flwr.strategy.bounds import Limits
from mmfl_flwr.strategy.result import MultiModelResult, RoundCallback
from mmfl_flwr.strategy.state import RoundPlan, RunState
from mmfl_flwr.strategy.train import TrainConfig

__all__ = ["StrategyHost"]


class StrategyHost(Protocol):
    """The attributes and methods of a ``MultiModelStrategy`` that its phases use."""

    policy: Policy
    aggregator: Aggregator
    limits: Limits
    train_config: TrainConfig
    seed: int
    fraction_evaluate: float
    evaluate_every: int
    min_available_nodes: int
    min_available_clients: int
    node_wait_timeout: float
    checkpoint_path: str | None
    on_round_end: RoundCallback | None
    run_state: RunState
    result: MultiModelResult | None
    action_level: int
    _templates: tuple[Policy, Aggregator]
    _runs: int
    _plans: dict[int, RoundPlan]
    _rows: dict[int, tuple[dict[str, dict[str, Any]], dict[str, Any]]]
    _hooks: object
    _arrivals: tuple[dict[str, int], dict[str, int]]
    _trainable: dict[str, list[str]]
    _pins: dict[str, str]

    def models(self) -> RecordDict:
        """The global models as one RecordDict."""
        ...

    def check_resumable(self, path: str, wrapper: object | None = None) -> dict[str, Any]:
        """The checkpoint at ``path``, checked against this strategy."""
        ...

    def save_checkpoint(self, server_round: int, result: MultiModelResult) -> None:
        """Write the checkpoint of round ``server_round``."""
        ...
