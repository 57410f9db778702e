"""``mmfl_flwr.gain``: paper 002's g = M * T_1 / T_M (Section 7.2) on made-up
histories, hand-computed."""

from __future__ import annotations

import math

import pytest

import mmfl_flwr
from mmfl_flwr import gain
from mmfl_flwr.convergence import accuracy_curves, first_round_reaching

NAN = math.nan

# Three models, index 0 = the initial model. With t1 = 3 the targets are
# single[s][3]: a -> 0.60, b -> 0.50, c -> 0.70.
SINGLE = {
    "a": [0.10, 0.30, 0.50, 0.60, 0.70],
    "b": [0.10, 0.20, 0.40, 0.50, 0.55],
    "c": [0.10, 0.40, 0.65, 0.70, 0.80],
}
# The multi-model run: a first reaches 0.60 at round 4, b 0.50 at round 2,
# c 0.70 at round 5 -> T_M = 5, g = 3 * 3 / 5 = 1.8.
PARALLEL = {
    "a": [0.10, 0.20, 0.40, 0.55, 0.60, 0.62, 0.65],
    "b": [0.10, 0.30, 0.50, 0.45, 0.52, 0.55, 0.58],
    "c": [0.10, 0.30, 0.50, 0.60, 0.69, 0.70, 0.75],
}


def test_exported():
    assert mmfl_flwr.gain is gain
    assert "gain" in mmfl_flwr.__all__


def test_hand_computed_gain():
    assert gain(PARALLEL, SINGLE, 3) == pytest.approx(9 / 5)
    # t1 = 2: targets 0.50, 0.40, 0.65 reached at rounds 3, 2, 4 -> 3 * 2 / 4
    assert gain(PARALLEL, SINGLE, 2) == pytest.approx(1.5)
    # t1 = 1: targets 0.30, 0.20, 0.40 reached at 2, 1, 2 -> 3 * 1 / 2
    assert gain(PARALLEL, SINGLE, 1) == pytest.approx(1.5)


def test_paper_example_numbers():
    # Section 7.2: 9 models, T_1 = 50, the slowest model reaches its target
    # at round 117 -> 9 * 50 / 117 = 3.846
    single = {f"m{k}": [0.0] * 50 + [0.5] for k in range(9)}
    parallel = {f"m{k}": [0.0] * (60 + k) + [0.5] for k in range(8)}
    parallel["m8"] = [0.0] * 117 + [0.5]
    assert gain(parallel, single, 50) == pytest.approx(3.846, abs=5e-4)


def test_t1_indexes_the_single_curve_directly():
    """The target is single[s][t1] (index 0 = initial model), not t1 - 1."""
    single = {"a": [0.0, 0.2, 0.9]}
    parallel = {"a": [0.0, 0.25, 0.5, 0.95]}
    assert gain(parallel, single, 1) == pytest.approx(1 / 1)  # target 0.2 at round 1
    assert gain(parallel, single, 2) == pytest.approx(2 / 3)  # target 0.9 at round 3


def test_m_is_the_number_of_models():
    one = {"a": SINGLE["a"]}
    assert gain({"a": PARALLEL["a"]}, one, 3) == pytest.approx(3 / 4)
    two = {"a": SINGLE["a"], "b": SINGLE["b"]}
    assert gain({k: PARALLEL[k] for k in two}, two, 3) == pytest.approx(2 * 3 / 4)


def test_a_model_that_never_reaches_gives_zero():
    parallel = dict(PARALLEL, c=[0.10, 0.30, 0.50, 0.60, 0.69, 0.69])
    assert gain(parallel, SINGLE, 3) == 0.0


def test_round_zero_and_nan_never_count():
    single = {"a": [0.5, 0.5, 0.6]}
    # the initial model already meets the target 0.5, but round 0 is not a
    # training round: the first r >= 1 is 2 (round 1 not evaluated)
    parallel = {"a": [0.5, NAN, 0.7]}
    assert first_round_reaching(parallel["a"], 0.5) == 2
    assert gain(parallel, single, 1) == pytest.approx(1 / 2)
    assert first_round_reaching([0.9], 0.5) is None


def test_equal_to_target_counts():
    assert gain({"a": [0.0, 0.4, 0.6]}, {"a": [0.0, 0.6]}, 1) == pytest.approx(1 / 2)


@pytest.mark.parametrize(
    ("parallel", "single", "t1", "match"),
    [
        ({"a": [0, 1]}, {"b": [0, 1]}, 1, "different models"),
        ({"a": [0, 1]}, {"a": [0, 1], "b": [0, 1]}, 1, "only in single"),
        ({}, {}, 1, "no models"),
        (PARALLEL, SINGLE, 0, "t1 must be in"),
        (PARALLEL, SINGLE, 5, "t1 must be in"),  # single curves have rounds 0..4
        (PARALLEL, SINGLE, -1, "t1 must be in"),
        (PARALLEL, SINGLE, 2.0, "integer"),
        (PARALLEL, SINGLE, True, "integer"),
        ({"a": [0, 1]}, {"a": [0, NAN]}, 1, "NaN"),
    ],
)
def test_validation_errors(parallel, single, t1, match):
    with pytest.raises(ValueError, match=match):
        gain(parallel, single, t1)


def test_accuracy_curves_of_a_history():
    """Index = round; a model that arrives at round 2 has NaN before it."""
    history = [
        {"round": 0, "task": "a", "accuracy": 0.1},
        {"round": 1, "task": "a", "accuracy": 0.3},
        {"round": 2, "task": "a", "accuracy": 0.5},
        {"round": 2, "task": "b", "accuracy": 0.2},
        {"round": 3, "task": "b", "accuracy": ""},  # not evaluated (CSV text)
        {"round": 4, "task": "b", "accuracy": "0.7"},
    ]
    curves = accuracy_curves(history)
    assert list(curves) == ["a", "b"]
    assert curves["a"] == [0.1, 0.3, 0.5]
    b = curves["b"]
    assert len(b) == 5 and math.isnan(b[0]) and math.isnan(b[1]) and math.isnan(b[3])
    assert b[2] == 0.2 and b[4] == 0.7
    assert gain(curves, {"a": [0.1, 0.5], "b": [0.2, 0.6]}, 1) == pytest.approx(2 / 4)
