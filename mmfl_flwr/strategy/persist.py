"""Checkpoints of a run: everything needed to continue after a round, as plain
data, and the identity a checkpoint must share with the strategy resuming it.

:class:`Checkpointing` gives :class:`~.orchestrator.MultiModelStrategy` its
checkpoint methods (``state_dict``, ``check_resumable``, ``save_checkpoint``)
over the functions here."""

from __future__ import annotations

from typing import Any

from mmfl_flwr.core.aggregators import Aggregator
from mmfl_flwr.core.policy import Policy
from mmfl_flwr.records import numpy_to_arrays
from mmfl_flwr.strategy.result import MultiModelResult
from mmfl_flwr.strategy.state import RunState


def identity(policy: Policy, aggregator: Aggregator, seed: int) -> dict[str, Any]:
    """What must match for a checkpoint to be resumed: the policy, the aggregator,
    their parameters (storage aside) and the seed."""
    agg = {k: v for k, v in aggregator.config().items() if k != "storage"}
    return {
        "policy_name": type(policy).__name__,
        "aggregator_name": type(aggregator).__name__,
        "policy_config": repr(sorted(policy.config().items())),
        "aggregator_config": repr(sorted(agg.items())),
        "seed": seed,
    }


def run_state_dict(
    run_state: RunState,
    policy: Policy,
    aggregator: Aggregator,
    server_round: int,
    result: MultiModelResult,
) -> dict[str, Any]:
    """Everything needed to continue after ``server_round`` (plain data)."""
    return {
        "round": server_round,
        "weights": {t: dict(w) for t, w in run_state.weights.items()},
        "policy": policy.state_dict(),
        "aggregator": aggregator.state_dict(),
        "table": run_state.table.state_dict(),
        "rng": run_state.rng.bit_generator.state,
        "eval_rng": run_state.eval_rng.bit_generator.state,
        "history": [dict(r) for r in result.history],
        "trainable": {t: list(k) for t, k in run_state.trainable.items()},
        "norm_history": {t: list(v) for t, v in run_state.norm_history.items()},
        "direction_history": {
            t: {c: list(v) for c, v in per.items()}
            for t, per in run_state.direction_history.items()
        },
        "loss_reference": dict(run_state.loss_reference),
        "bound_at_first_use": dict(run_state.bound_at_first_use),
        "assignments": dict(result.assignments),
        "rejections": dict(result.rejections),
        "defence": run_state.defence.state_dict(),
        **identity(policy, aggregator, run_state.seed),
    }


def load_resumable(
    path: str, mine: dict[str, Any], required: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Read the checkpoint at ``path``; raise ValueError if it was written by a
    strategy with another :func:`identity` than ``mine`` (keys an older
    checkpoint lacks are not compared) or with other ``required`` values (a
    checkpoint that lacks one counts as holding None: the wrapper identity,
    absent from checkpoints written before wrappers existed)."""
    from mmfl_flwr.checkpoint import load_checkpoint

    state = load_checkpoint(path)
    for key, value in (required or {}).items():
        if state.get(key) != value:
            raise ValueError(
                f"checkpoint {path} was written with {key} = {state.get(key)!r}, but this "
                f"strategy has {value!r}; resume with the same strategy and seed"
            )
    for key, value in mine.items():
        if key in state and state[key] != value:
            raise ValueError(
                f"checkpoint {path} was written with {key} = {state[key]!r}, but this "
                f"strategy has {value!r}; resume with the same strategy and seed"
            )
    return state


def restore(
    run_state: RunState,
    policy: Policy,
    aggregator: Aggregator,
    state: dict[str, Any],
    result: MultiModelResult,
) -> int:
    """Load a checkpoint's state into a fresh run; returns its last round."""
    run_state.set_models({t: numpy_to_arrays(w) for t, w in state["weights"].items()})
    policy.load_state_dict(state["policy"])
    aggregator.load_state_dict(state["aggregator"])
    run_state.table.load_state_dict(state["table"])
    run_state.trainable = {**state.get("trainable", {}), **run_state.pinned_trainable}
    run_state.norm_history = {t: list(v) for t, v in state.get("norm_history", {}).items()}
    run_state.direction_history = {
        t: {c: list(v) for c, v in per.items()}
        for t, per in state.get("direction_history", {}).items()
    }
    run_state.loss_reference = dict(state.get("loss_reference", {}))
    for cid, pin in state.get("bound_at_first_use", {}).items():
        if run_state.client_pins.get(cid, run_state.client_pins.get("*")) == "key:first-use":
            run_state.client_pins[cid] = run_state.bound_at_first_use[cid] = pin
    run_state.rng.bit_generator.state = state["rng"]
    run_state.eval_rng.bit_generator.state = state["eval_rng"]
    result.history.extend(state["history"])
    result.assignments.update(state["assignments"])
    result.rejections.update(state.get("rejections", {}))  # absent in older checkpoints
    run_state.defence.load_state_dict(state.get("defence", {}))
    return int(state["round"])


class Checkpointing:
    """The checkpoint methods of :class:`~.orchestrator.MultiModelStrategy`: the
    state of its run, and of the wrapper running it, if any (``_hooks``)."""

    run_state: RunState
    policy: Policy
    aggregator: Aggregator
    seed: int
    checkpoint_path: str | None
    _hooks: object

    def state_dict(self, server_round: int, result: MultiModelResult) -> dict[str, Any]:
        """Everything needed to continue after ``server_round`` (plain data),
        with the state of the wrapper running this strategy, if any."""
        state = run_state_dict(self.run_state, self.policy, self.aggregator, server_round, result)
        state.update(self._wrapper_identity(self._hooks))
        wrapper = self._hooks
        if wrapper is not self and hasattr(wrapper, "wrapper_state"):
            state["wrapper_state"] = wrapper.wrapper_state()
        return state

    def _wrapper_identity(self, wrapper: object) -> dict[str, Any]:
        """The name and settings of the wrapper running this strategy (None: none)."""
        if wrapper is self:
            return {"wrapper_name": None, "wrapper_config": None}
        config = getattr(wrapper, "wrapper_config", None)
        return {
            "wrapper_name": type(wrapper).__name__,
            "wrapper_config": repr(sorted(config().items())) if config else None,
        }

    def check_resumable(self, path: str, wrapper: object | None = None) -> dict[str, Any]:
        """Load a checkpoint and check it was written by an identical strategy
        (policy, aggregator, their parameters, seed, and the same ``wrapper`` with
        the same parameters, or none); returns its state."""
        return load_resumable(
            path,
            identity(self.policy, self.aggregator, self.seed),
            self._wrapper_identity(self if wrapper is None else wrapper),
        )

    def save_checkpoint(self, server_round: int, result: MultiModelResult) -> None:
        """Write :meth:`state_dict` atomically to ``checkpoint_path``."""
        from mmfl_flwr.checkpoint import save_checkpoint

        save_checkpoint(str(self.checkpoint_path), self.state_dict(server_round, result))
