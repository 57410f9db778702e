"""The server side of MMFL on Flower: :class:`MultiModelStrategy`.

One module per phase of a round (registration, loss query, train round trip,
validation, aggregation, evaluation, checkpoints), orchestrated by
:mod:`.orchestrator`. Imports flwr and numpy only (no torch).
"""

from mmfl_flwr.strategy.aggregate import average_state
from mmfl_flwr.strategy.orchestrator import MultiModelStrategy
from mmfl_flwr.strategy.result import EvaluateFn, MultiModelResult, RoundCallback
from mmfl_flwr.strategy.state import HookError
from mmfl_flwr.strategy.validation import Limits, l2_norm

__all__ = [
    "EvaluateFn",
    "HookError",
    "Limits",
    "MultiModelResult",
    "MultiModelStrategy",
    "RoundCallback",
    "average_state",
    "l2_norm",
]
