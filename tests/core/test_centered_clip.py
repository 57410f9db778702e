"""Centered clipping (``centered-clip``, ``unbiased-centered-clip``;
Karimireddy, He and Jaggi 2021), one pass per round around the model's previous
step, keeping the base rule's weights. Numbers computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

import mmfl_flwr
from mmfl_flwr.core import Update
from mmfl_flwr.core.aggregators import FedAvgAggregator, UnbiasedAggregator
from mmfl_flwr.core.robust import CenteredClipAggregator, UnbiasedCenteredClipAggregator
from mmfl_flwr.presets import AGGREGATORS, make_strategy


def upd(cid, values, n=1, **kw):
    return Update(
        cid=cid,
        delta=[np.array(values, dtype=np.float64)],
        num_examples=n,
        data_share=kw.pop("data_share", 0.0),
        **kw,
    )


def test_first_round_clips_around_zero_to_the_median_distance():
    """Center 0; distances 5, 1, 2 -> tau = 2 (lower median). (3, 4) moves to
    (1.2, 1.6); the others stay. FedAvg weights 1, 1, 2 of 4: step = 0.25 (1.2,
    1.6) + 0.25 (0, 1) + 0.5 (0, 2) = (0.3, 1.65); w = (1, 1) - step."""
    agg = CenteredClipAggregator()
    us = [upd("a", [3.0, 4.0], 1), upd("b", [0.0, 1.0], 1), upd("c", [0.0, 2.0], 2)]
    out = agg.aggregate("t", [np.array([1.0, 1.0])], us, 1)
    np.testing.assert_allclose(out[0], [0.7, -0.65])
    np.testing.assert_allclose(agg.state_dict()["center"]["t"][0], [0.3, 1.65])
    assert [u.delta[0].tolist() for u in us] == [[3.0, 4.0], [0.0, 1.0], [0.0, 2.0]]


def test_the_next_round_clips_around_the_previous_step():
    """Center v = (0.3, 1.65); updates v + (1, 0), v + (0, -10), v + (-2, 0):
    distances 1, 10, 2 -> tau 2; the second moves to v + (0, -2) = (0.3, -0.35).
    Equal weights: step = ((1.3 + 0.3 - 1.7) / 3, (1.65 - 0.35 + 1.65) / 3)."""
    agg = CenteredClipAggregator()
    agg.load_state_dict({"center": {"t": [np.array([0.3, 1.65])]}})
    us = [upd("a", [1.3, 1.65]), upd("b", [0.3, -8.35]), upd("c", [-1.7, 1.65])]
    out = agg.aggregate("t", [np.zeros(2)], us, 2)
    np.testing.assert_allclose(out[0], [0.1 / 3, -2.95 / 3])
    np.testing.assert_allclose(agg.state_dict()["center"]["t"][0], [-0.1 / 3, 2.95 / 3])


def test_with_nothing_clipped_it_is_the_base_rule():
    """Distances all equal (1): tau = 1 and nothing moves, so the step is
    FedAvg's, and with inclusion probabilities the unbiased rule's
    d l / (B p): 0.2 x 1 / (1 x 0.5) = 0.4 and 0.3 x 2 / (2 x 0.25) = 1.2."""
    us = [
        upd("a", [1.0, 0.0], 3, data_share=0.2, prob=0.5, processors=1, count=1),
        upd("b", [0.0, 1.0], 1, data_share=0.3, prob=0.25, processors=2, count=2),
    ]
    w = [np.array([5.0, 5.0])]
    for robust, base in (
        (CenteredClipAggregator(), FedAvgAggregator()),
        (UnbiasedCenteredClipAggregator(), UnbiasedAggregator()),
    ):
        np.testing.assert_allclose(
            robust.aggregate("t", w, us, 1)[0], base.aggregate("t", w, us, 1)[0]
        )
    assert UnbiasedCenteredClipAggregator().coefficients(us) == pytest.approx([0.4, 1.2])


def test_the_unbiased_weights_apply_to_the_clipped_updates():
    """Center 0; (0, 10) at distance 10 and (1, 0), (2, 0) -> tau 2: (0, 10)
    moves to (0, 2). Weights d l / (B p) = 0.5, 0.25, 1.0 -> step (0.25 + 2,
    1.0) = (2.25, 1.0)."""
    us = [
        upd("a", [0.0, 10.0], data_share=0.5, prob=1.0),
        upd("b", [1.0, 0.0], data_share=0.25, prob=1.0),
        upd("c", [2.0, 0.0], data_share=0.5, prob=0.5),
    ]
    out = UnbiasedCenteredClipAggregator().aggregate("t", [np.zeros(2)], us, 1)
    np.testing.assert_allclose(out[0], [-2.25, -1.0])


def test_a_huge_update_counts_as_one_at_the_median_distance():
    """Four honest updates of norm 1, (1, 0), (0.6, 0.8), (0.8, 0.6), (0.8,
    -0.6), and one of 1e12 along (0, -1); center 0: distances 1, 1, 1, 1, 1e12
    -> tau 1, and the hostile update acts as (0, -1). Equal weights: step =
    (3.2, -0.2) / 5 = (0.64, -0.04)."""
    honest = [[1.0, 0.0], [0.6, 0.8], [0.8, 0.6], [0.8, -0.6]]
    us = [upd(str(i), v) for i, v in enumerate(honest)] + [upd("x", [0.0, -1e12])]
    out = CenteredClipAggregator().aggregate("t", [np.zeros(2)], us, 1)
    np.testing.assert_allclose(out[0], [-0.64, 0.04])


def test_no_updates_keep_the_center_and_the_state_round_trips():
    agg = CenteredClipAggregator()
    agg.aggregate("t", [np.zeros(2)], [upd("a", [1.0, 0.0]), upd("b", [3.0, 0.0])], 1)
    w = [np.array([4.0, 4.0])]
    out = agg.aggregate("t", w, [], 2)
    assert out[0].tolist() == [4.0, 4.0] and out[0] is not w[0]
    state = agg.state_dict()
    # distances 1 and 3, lower median 1: (3, 0) moves to (1, 0); the step is (1, 0)
    np.testing.assert_allclose(state["center"]["t"][0], [1.0, 0.0])
    back = CenteredClipAggregator()
    back.load_state_dict(state)
    np.testing.assert_array_equal(back.state_dict()["center"]["t"][0], state["center"]["t"][0])


def test_registered_and_exported():
    assert AGGREGATORS["centered-clip"] is CenteredClipAggregator
    assert AGGREGATORS["unbiased-centered-clip"] is UnbiasedCenteredClipAggregator
    assert mmfl_flwr.CenteredClipAggregator is CenteredClipAggregator
    assert UnbiasedCenteredClipAggregator.needs_inclusion_probabilities
    assert not CenteredClipAggregator.needs_inclusion_probabilities
    assert (
        type(make_strategy("mfa-rr", aggregator="centered-clip").aggregator)
        is CenteredClipAggregator
    )
    assert (
        type(make_strategy("lvr", aggregator="unbiased-centered-clip").aggregator)
        is UnbiasedCenteredClipAggregator
    )
