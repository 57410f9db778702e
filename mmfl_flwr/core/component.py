"""What policies and aggregators share: tunable parameters for logs and
checkpoint identity, plain-data state for checkpoints, an informative repr."""

from __future__ import annotations

from typing import Any


class Component:
    """Base of :class:`~mmfl_flwr.core.policy.Policy` and
    :class:`~mmfl_flwr.core.aggregators.Aggregator`."""

    def config(self) -> dict[str, Any]:
        """Tunable parameters, for logs, summaries and checkpoint identity."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state (for checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"
