"""The default update clip (``update_clip_factor``): an update whose norm exceeds
the factor times its model's reference norm is scaled down to that norm, keeps
its direction, and is logged with the client id and the model every time."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from conftest import LogTap
from conftest import one_array_update as upd

from mmfl_flwr.strategy.validation import (
    MIN_ROUND_NORMS,
    UPDATE_CLIP_FACTOR,
    Limits,
    bound_update_norms,
    l2_norm,
)


def bound(updates, history=None, factor=100.0, clip=3.0, model_norm=None):
    tap = LogTap()
    logger = logging.getLogger("flwr")
    logger.addHandler(tap)
    try:
        history = {} if history is None else history
        rejected = bound_update_norms(updates, history, factor, model_norm, clip)
    finally:
        logger.removeHandler(tap)
    return (
        rejected,
        history,
        [m for lvl, m in tap.records if lvl == logging.DEBUG],
    )  # actions: DEBUG


def test_an_update_above_the_clip_is_scaled_to_it_and_named():
    """Norms 1, 2, 3 and 30 (3-4-5 triangles and a 1-D one): the lower median
    is 2, the bound 3 x 2 = 6, so c3's (18, 24) becomes (3.6, 4.8): the same
    direction at norm 6. The others are untouched; nothing is rejected (100 x 2
    = 200 > 30); the history holds the norms after clipping."""
    us = {
        "a": [
            upd("c0", [0.6, 0.8]),
            upd("c1", [1.2, 1.6]),
            upd("c2", [1.8, 2.4]),
            upd("c3", [18.0, 24.0]),
        ]
    }
    rejected, history, warnings = bound(us)
    assert rejected == []
    np.testing.assert_allclose(us["a"][3].delta[0], [3.6, 4.8])
    for u, v in zip(us["a"][:3], ([0.6, 0.8], [1.2, 1.6], [1.8, 2.4])):
        np.testing.assert_array_equal(u.delta[0], v)
    assert history["a"] == pytest.approx([1.0, 2.0, 3.0, 6.0])
    assert warnings == [
        "Client c3: clipped update for task 'a': update norm 30 exceeds 6 "
        "(3 x the reference norm, 2); scaled to it"
    ]


def test_rejection_comes_first_and_a_rejected_update_is_not_clipped():
    """Norms 1, 2 and 500: reference 2, rejection bound 200 -> c2 is rejected
    (and not also clipped); c0 and c1 are within 3 x 2."""
    us = {"a": [upd("c0", [1.0]), upd("c1", [2.0]), upd("c2", [500.0])]}
    rejected, history, warnings = bound(us)
    assert rejected == [("a", "c2")]
    assert [u.cid for u in us["a"]] == ["c0", "c1"]
    assert len(warnings) == 1 and warnings[0].startswith("Client c2: rejected update")
    assert history["a"] == [1.0, 2.0]


def test_a_lone_update_is_clipped_against_the_models_history():
    """One update this round (norm 40): the pool is it plus the history
    [4, 5, 6, 7] -> lower median 6, bound 18 -> scaled to 18."""
    us = {"a": [upd("c3", [40.0])]}
    rejected, history, warnings = bound(us, {"a": [4.0, 5.0, 6.0, 7.0]})
    assert rejected == []
    np.testing.assert_allclose(us["a"][0].delta[0], [18.0])
    assert warnings[0].startswith(
        "Client c3: clipped update for task 'a': update norm 40 "
        "exceeds 18 (3 x the reference norm, 6)"
    )


def test_each_model_has_its_own_reference():
    """The clip of one model never looks at another's norms: "b"'s norms are
    100x "a"'s and nothing is clipped in either."""
    us = {"a": [upd("c0", [1.0]), upd("c1", [2.0])], "b": [upd("c0", [100.0]), upd("c1", [150.0])]}
    rejected, _, warnings = bound(us, clip=3.0)
    assert rejected == [] and warnings == []
    us["b"].append(upd("c2", [1000.0]))  # b's lower median is now 150: clipped to 450
    _, _, warnings = bound(us, clip=3.0)
    assert warnings == [
        "Client c2: clipped update for task 'b': update norm 1000 exceeds 450 "
        "(3 x the reference norm, 150); scaled to it"
    ]
    assert l2_norm(us["b"][2].delta) == pytest.approx(450.0)


def test_no_clip_without_a_factor():
    us = {"a": [upd("c0", [1.0]), upd("c1", [2.0]), upd("c2", [50.0])]}
    _, _, warnings = bound(us, clip=None)
    assert warnings == [] and us["a"][2].delta[0][0] == 50.0


def test_the_default_factor_and_its_check():
    assert Limits().update_clip_factor == UPDATE_CLIP_FACTOR
    Limits(update_clip_factor=None)
    with pytest.raises(ValueError, match="update_clip_factor must be >= 1"):
        Limits(update_clip_factor=0.5)


def test_a_run_saved_before_the_clip_existed_resumes_without_it(tmp_path):
    """A config.json written before ``update-clip-factor`` existed describes a run
    without the clip: loading it gives 0 (off), not today's default, so
    ``mmfl run --resume`` continues that run as it was computed."""
    import json

    from mmfl_flwr.config import Settings

    path = tmp_path / "config.json"
    Settings(num_rounds=2).save(str(path))
    data = json.loads(path.read_text())
    assert data.pop("update-clip-factor") == 3.0
    path.write_text(json.dumps(data))
    assert Settings.load(str(path)).update_clip_factor == 0.0
    path.write_text(json.dumps({**data, "update-clip-factor": 5.0}))
    assert Settings.load(str(path)).update_clip_factor == 5.0


@pytest.mark.parametrize("value,expected", [(3.0, 3.0), (0.0, None), (5.0, 5.0)])
def test_the_setting_reaches_the_strategy(value, expected):
    """``update-clip-factor`` (run config, CLI flag) is the strategy's clip; 0 is off."""
    from mmfl_flwr.config import Settings
    from mmfl_flwr.flower_app.server_app import strategy_from_settings

    for preset in ("mfa-rr", "lvr", "stalevr"):
        s = Settings(strategy=preset, update_clip_factor=value)
        assert strategy_from_settings(s).limits.update_clip_factor == expected
    assert Settings().update_clip_factor == UPDATE_CLIP_FACTOR


def test_huge_finite_updates_are_clipped_without_overflow_or_nan():
    """Without the rejection bound: entries of 1e300 have a norm of 1.41e300,
    computed without overflow, and are scaled to the bound 6 along (1, 1);
    entries of 1.5e308 have a norm beyond the float range (inf): scaled by
    bound / inf = 0, the update adds nothing and no NaN. Both are named."""
    us = {
        "a": [
            upd("c0", [1.0, 0.0]),
            upd("c1", [2.0, 0.0]),
            upd("c2", [1e300, 1e300]),
            upd("c3", [1.5e308, 1.5e308]),
        ]
    }
    _, _, warnings = bound(us, factor=None)
    np.testing.assert_allclose(us["a"][2].delta[0], [6 / np.sqrt(2)] * 2)
    np.testing.assert_array_equal(us["a"][3].delta[0], [0.0, 0.0])
    assert warnings[0].startswith("Client c2: clipped update for task 'a': update norm 1.414e+300")
    assert warnings[1].startswith("Client c3: clipped update for task 'a': update norm inf")


def test_a_small_round_pools_the_recent_norms_so_one_tiny_honest_norm_sets_no_bound():
    """Measured on the paper-003 profile (pareto-ucb, seed 1): a round of two
    synthetic updates, one from a client that barely moves the model (norm
    0.001) and one of an ordinary size (norm 1.2), rejected the second at
    100 x 0.001 = 0.1. With the model's recent accepted norms (ten of 0.5)
    pooled, the lower median of [0.001, 1.2, 0.5 x 10] is 0.5: bound 1.5, reject
    50; nothing is touched."""
    us = {"a": [upd("c0", [0.001]), upd("c1", [1.2])]}
    rejected, history, warnings = bound(us, {"a": [0.5] * 10})
    assert rejected == [] and warnings == []
    np.testing.assert_array_equal(us["a"][1].delta[0], [1.2])
    assert history["a"][-2:] == pytest.approx([0.001, 1.2])


def test_a_round_of_min_round_norms_updates_is_measured_on_its_own():
    """MIN_ROUND_NORMS (6) updates of norms 1..5 and 200: the lower median is 3
    (the history of 100s is left out), bound 9, so the 200 is clipped to 9; with
    one update fewer the history joins the pool: [1..4, 200] + [100] x 10 has
    lower median 100, and the 200 (under 3 x 100) is left alone."""
    assert MIN_ROUND_NORMS == 6
    big = {"a": [upd(f"c{i}", [float(i + 1)]) for i in range(6)]}
    big["a"][5].delta = [np.array([200.0])]
    _, _, warnings = bound(big, {"a": [100.0] * 10})
    assert warnings == [
        "Client c5: clipped update for task 'a': update norm 200 exceeds 9 "
        "(3 x the reference norm, 3); scaled to it"
    ]
    small = {"a": [upd(f"c{i}", [float(i + 1)]) for i in range(5)]}
    small["a"][4].delta = [np.array([200.0])]
    _, _, warnings = bound(small, {"a": [100.0] * 10})
    assert warnings == []


def test_a_coalition_scaling_up_a_small_round_is_held_to_the_models_history():
    """Three colluders of a round of five send norm 50 (x10 an honest 5): on
    its own the round's lower median would be 50 (three of five), and nothing
    clipped. The model's history (twenty honest norms of 5) joins the pool, so
    the reference is 5 and the three are scaled to 15."""
    us = {"a": [upd("h0", [5.0]), upd("h1", [5.0])] + [upd(f"x{i}", [50.0]) for i in range(3)]}
    _, _, warnings = bound(us, {"a": [5.0] * 20})
    assert len(warnings) == 3
    assert all("exceeds 15 (3 x the reference norm, 5)" in w for w in warnings)
    for u in us["a"][2:]:
        np.testing.assert_allclose(u.delta[0], [15.0])
