"""Rounds to a target accuracy and the gain of paper 002 (pure functions).

No flwr, no torch. An accuracy curve is a sequence indexed by round: entry 0
is the initial model (a run's round-0 evaluation), entry ``r`` the accuracy
after training round ``r``; NaN where a round has no server-side evaluation.

- :func:`rounds_to_target`: the first training round ``r >= 1`` whose accuracy
  is ``>= eps`` (``summary.json``'s ``rounds_to_target``, ``mmfl run
  --target-accuracy``).
- :func:`gain`: paper 002, Section 7.2, ``g = M * T_1 / T_M``.
- :func:`accuracy_curves`: the curves of a run's history (``metrics.csv`` rows).
- :func:`parse_target_accuracy`: the ``target-accuracy`` setting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "accuracy_curves",
    "first_round_reaching",
    "gain",
    "parse_target_accuracy",
    "rounds_to_target",
    "rounds_to_target_all",
]


def first_round_reaching(curve: Sequence[float], target: float) -> int | None:
    """The first round ``r >= 1`` with ``curve[r] >= target``; None if there is none.

    Round 0 (the initial model) never counts: rounds to a target are training
    rounds. NaN entries (rounds without an evaluation) never reach."""
    for r in range(1, len(curve)):
        value = float(curve[r])
        if not math.isnan(value) and value >= target:
            return r
    return None


def accuracy_curves(
    history: Iterable[Mapping[str, Any]], key: str = "accuracy"
) -> dict[str, list[float]]:
    """Per task, its ``key`` (server-side ``accuracy`` by default) per round,
    from a run's history rows (:attr:`MultiModelResult.history` or
    :func:`mmfl_flwr.results.read_metrics_csv`): entry ``r`` is round ``r``,
    NaN for rounds without a row (a model that arrives later) or without a
    value; tasks in order of first appearance, each curve up to its last row."""
    values: dict[str, dict[int, float]] = {}
    for row in history:
        v = row.get(key, math.nan)
        values.setdefault(str(row["task"]), {})[int(row["round"])] = (
            math.nan if v is None or v == "" else float(v)
        )
    return {
        task: [by_round.get(r, math.nan) for r in range(max(by_round) + 1)]
        for task, by_round in values.items()
    }


def rounds_to_target(
    curves: Mapping[str, Sequence[float]], targets: Mapping[str, float]
) -> dict[str, int | None]:
    """Per model of ``targets``, the first round ``r >= 1`` whose accuracy is
    ``>= targets[model]`` (:func:`first_round_reaching`); None when it never
    does (or the model has no curve)."""
    return {task: first_round_reaching(curves.get(task, ()), eps) for task, eps in targets.items()}


def rounds_to_target_all(reached: Mapping[str, int | None]) -> int | None:
    """The round by which every model has reached its target: the largest of
    :func:`rounds_to_target`; None when some model never reaches (or there is
    no model)."""
    if not reached or any(r is None for r in reached.values()):
        return None
    return max(r for r in reached.values() if r is not None)


def gain(
    parallel: Mapping[str, Sequence[float]], single: Mapping[str, Sequence[float]], t1: int
) -> float:
    """The gain of multi-model over sequential training, paper 002 Section 7.2.

    ``g = M * t1 / T_M``: training the ``M`` models one after another takes
    ``M * t1`` rounds; ``T_M`` is the rounds the multi-model run needs until
    every model has reached the accuracy its single-model run reached after
    ``t1`` rounds.

    Parameters
    ----------
    parallel : mapping of str to sequence of float
        Each model's accuracy per round in the multi-model run (index 0 = the
        initial model; :func:`accuracy_curves` of its history).
    single : mapping of str to sequence of float
        Each model's accuracy per round when trained alone with all clients
        (``single.csv`` of :func:`mmfl_flwr.sequential.run_sequential`); the
        same model names as ``parallel``.
    t1 : int
        ``T_1``: the target of model ``s`` is ``single[s][t1]``; ``1 <= t1 <
        len(single[s])`` for every model.

    Returns
    -------
    float
        ``M * t1 / T_M`` with ``M = len(single)`` and ``T_M`` the largest, over
        the models, of the first round ``r >= 1`` with ``parallel[s][r] >=
        single[s][t1]`` (:func:`first_round_reaching`); 0.0 when some model
        never reaches its target within ``parallel[s]``.

    Raises
    ------
    ValueError
        No models, different model names, ``t1`` not an integer in range, or
        a NaN target (``single[s][t1]`` not evaluated).

    Examples
    --------
    >>> gain({"a": [0.1, 0.5, 0.8], "b": [0.1, 0.7, 0.9]},
    ...      {"a": [0.1, 0.4, 0.6, 0.8], "b": [0.1, 0.3, 0.6, 0.9]}, t1=2)
    2.0
    """
    if not single:
        raise ValueError("gain: no models (single is empty)")
    if set(parallel) != set(single):
        raise ValueError(
            f"gain: parallel and single name different models: only in parallel "
            f"{sorted(set(parallel) - set(single))}, only in single "
            f"{sorted(set(single) - set(parallel))}"
        )
    if isinstance(t1, bool) or not isinstance(t1, int):
        raise ValueError(f"gain: t1 must be an integer >= 1, got {t1!r}")  # noqa: TRY004
    shortest = min(len(c) for c in single.values())
    if not 1 <= t1 < shortest:
        raise ValueError(
            f"gain: t1 must be in [1, {shortest - 1}] (the rounds of the shortest single "
            f"curve; index 0 is the initial model), got {t1}"
        )
    t_m = 0
    for task, curve in single.items():
        target = float(curve[t1])
        if math.isnan(target):
            raise ValueError(f"gain: single[{task!r}][{t1}] is NaN (no evaluation at round {t1})")
        reached = first_round_reaching(parallel[task], target)
        if reached is None:
            return 0.0
        t_m = max(t_m, reached)
    return len(single) * t1 / t_m


def parse_target_accuracy(spec: str, models: Sequence[str]) -> dict[str, float]:
    """The ``target-accuracy`` setting: ``""`` (none: ``{}``), one accuracy for
    every model (``"0.8"``) or ``model:accuracy`` pairs separated by commas
    (``"digits:0.8,synthetic:0.6"``, model names as in the results: repeats
    are ``digits_2``); each accuracy a number in (0, 1], each model of
    ``models`` at most once. Raises ValueError with a one-line message."""
    text = spec.strip()
    if not text:
        return {}

    def number(value: str) -> float:
        try:
            eps = float(value)
        except ValueError:
            eps = math.nan
        if not 0.0 < eps <= 1.0:  # NaN fails too
            raise ValueError(
                f"target-accuracy={spec!r}: {value.strip()!r} is not an accuracy in (0, 1]; "
                "use one number (0.8) or model:accuracy pairs (digits:0.8,synthetic:0.6)"
            )
        return eps

    if ":" not in text:
        eps = number(text)
        return {m: eps for m in models}
    out: dict[str, float] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition(":")
        name = name.strip()
        if not sep or not name:
            raise ValueError(
                f"target-accuracy={spec!r}: expected model:accuracy pairs separated by "
                f"commas (digits:0.8,synthetic:0.6), got {item.strip()!r}"
            )
        if name not in models:
            raise ValueError(
                f"target-accuracy={spec!r} names {name!r}, which is not a model of this run "
                f"({', '.join(models)})"
            )
        if name in out:
            raise ValueError(f"target-accuracy={spec!r} names {name!r} twice")
        out[name] = number(value)
    return out
