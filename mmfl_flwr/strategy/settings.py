"""What :class:`~.orchestrator.MultiModelStrategy`'s constructor checks, the
fresh run state its settings make, and what its ``summary()`` logs.

The constructor refuses names where objects are expected (a policy, an
aggregator), and checks its settings and defence bounds with the option table
of ``mmfl run`` (:func:`mmfl_flwr.config.check_option`), so each wrong value
gets the same message on every surface; a defence at 0 is off, as on the
command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from logging import INFO
from typing import TYPE_CHECKING, Any

from flwr.common.logger import log

from mmfl_flwr.config import check_option
from mmfl_flwr.strategy.state import RunState

if TYPE_CHECKING:
    from mmfl_flwr.strategy.host import StrategyHost


def check_components(policy: object, aggregator: object) -> None:
    """A policy and an aggregator are objects (``MFARand()``, ``FedAvgAggregator()``),
    not names: a name is a TypeError pointing to the presets by name."""
    for what, obj, method, example in (
        ("policy", policy, "assign", "mmfl_flwr.MFARand()"),
        ("aggregator", aggregator, "aggregate", "mmfl_flwr.FedAvgAggregator()"),
    ):
        if obj is None:
            continue
        if isinstance(obj, str):
            from mmfl_flwr.core.card import AGGREGATORS, cards

            names = [c.name for c in cards()] if what == "policy" else list(AGGREGATORS)
            pointer = (
                "; to build a preset by name use mmfl_flwr.make_strategy(name, ...) "
                f"with one of {', '.join(names)}"
                if what == "policy"
                else f"; a preset factory takes aggregator= as a name, one of {', '.join(names)}"
            )
            raise TypeError(
                f"MultiModelStrategy({what}={obj!r}): {what} is a name; MultiModelStrategy "
                f"takes a {what} object (e.g. {example}){pointer}"
            )
        if isinstance(obj, type) or not callable(getattr(obj, method, None)):
            raise TypeError(
                f"MultiModelStrategy({what}={obj!r}): expected a {what} object with an "
                f"{method}() method (e.g. {example})"
            )


def check_arguments(
    policy: object,
    aggregator: object,
    options: Mapping[str, Any],
    fraction_evaluate: float,
    evaluate_every: int,
    defences: Mapping[str, float | None],
) -> dict[str, float | None]:
    """Check the constructor's components, then its ``options`` (name -> value),
    ``fraction_evaluate`` and ``defences`` (name -> bound or None) with the
    option table of ``mmfl run``, then the evaluation settings; returns the
    defences with each one at 0 turned off (None)."""
    check_components(policy, aggregator)
    for name, value in options.items():
        check_option(name, value)
    check_option("fraction_evaluate", fraction_evaluate)
    out = dict(defences)
    for name, bound in out.items():
        if bound is not None:
            check_option(name, bound)
            if bound == 0:
                out[name] = None
    if not 0.0 <= fraction_evaluate <= 1.0:
        raise ValueError(f"fraction_evaluate must be in [0, 1], got {fraction_evaluate}")
    if evaluate_every < 1:
        raise ValueError(f"evaluate_every must be >= 1, got {evaluate_every}")
    return out


def log_summary(strategy: StrategyHost) -> None:
    """Log every setting of ``strategy`` (its ``summary()``)."""
    log(INFO, "\t├──> MultiModelStrategy settings:")
    for name, value in (
        ("Policy", repr(strategy.policy)),
        ("Aggregator", repr(strategy.aggregator)),
        ("Tasks", ", ".join(strategy.run_state.all_tasks) or "(not set yet)"),
        ("Train config", strategy.train_config),
        ("Limits", strategy.limits),
        (
            "Evaluation",
            f"fraction {strategy.fraction_evaluate:g}, every {strategy.evaluate_every}",
        ),
        (
            "Nodes",
            f"wait for {strategy.min_available_nodes} nodes and "
            f"{strategy.min_available_clients} clients at most "
            f"{strategy.node_wait_timeout:g} s",
        ),
        ("Arrivals (tasks, clients)", strategy._arrivals),
        ("Trainable keys", strategy._trainable),
        ("Pinned client ids", sorted(strategy._pins)),
        ("Checkpoint", strategy.checkpoint_path),
    ):
        log(INFO, "\t│\t├── %s: %s", name, value)
    log(INFO, "\t│\t└── Seed: %d", strategy.seed)


def new_run_state(strategy: StrategyHost) -> RunState:
    """A fresh :class:`~.state.RunState` from ``strategy``'s settings (seed,
    arrivals, pinned trainable keys, client pins): one per run."""
    return RunState(
        strategy.seed,
        *strategy._arrivals,
        pinned_trainable=dict(strategy._trainable),
        client_pins=dict(strategy._pins),
    )
