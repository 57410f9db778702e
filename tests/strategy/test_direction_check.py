"""The direction check (``direction_factor``, :func:`check_directions`): a client
whose updates of a model point, on average over its rounds, against the other
clients' has its updates of that model scaled down to the round's reference norm
and is named, where the model's clients agree on a direction; nothing is
rejected. Numbers computed by hand."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from conftest import LogTap
from conftest import one_array_update as upd

from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.strategy.validation import (
    DIRECTION_FACTOR,
    DIRECTION_HISTORY,
    DIRECTION_LEAVE_ONE_OUT,
    Limits,
    check_directions,
)

R = 1 / math.sqrt(2)


def check(updates, history, factor=3.0):
    """The warnings it logs (it never rejects: always returns [])."""
    tap = LogTap()
    logger = logging.getLogger("flwr")
    logger.addHandler(tap)
    try:
        assert check_directions(updates, history, factor) == []
    finally:
        logger.removeHandler(tap)
    return [m for lvl, m in tap.records if lvl == logging.DEBUG]  # actions: DEBUG


def federation():
    """Five clients on the positive x axis, c5 along (1, 1), c6 along (-1, 1).
    For every client the coordinate-wise median of the six others has y = 0
    (at most two of six y values are 1; np.median of an even count averages the
    middle two, both 0) and x > 0, so the cosines are 1 (c0-c4), 1/sqrt 2 (c5)
    and -1/sqrt 2 (c6)."""
    return {
        "a": [
            upd("c0", [1.0, 0.0]),
            upd("c1", [2.0, 0.0]),
            upd("c2", [3.0, 0.0]),
            upd("c3", [1.0, 0.0]),
            upd("c4", [0.5, 0.0]),
            upd("c5", [1.0, 1.0]),
            upd("c6", [-2.0, 2.0]),
        ]
    }


def test_a_client_pointing_against_the_others_is_shrunk_from_its_second_round_and_named():
    """Round 1: every client has one cosine, fewer than the two needed: nothing
    is judged. Round 2: scores 1 (x5), 0.7071 (c5) and -0.7071 (c6); the median
    is 1 and the deviations |v - 1| are 0 (x5), 0.2929, 1.7071, whose median is
    0: the bound is 1 - 3 x 0 = 1. c6 is negative and below it: a suspect. The
    norms are 1, 2, 3, 1, 0.5, 1.414, 2.828, lower median sqrt 2: c6's (-2, 2)
    becomes (-1, 1), named with the model. c5 is below the bound too but not
    negative: untouched. Every update is kept."""
    history: dict = {}
    us = federation()
    assert check(us, history) == []
    assert [u.delta[0].tolist() for u in us["a"]] == [
        u.delta[0].tolist() for u in federation()["a"]
    ]
    assert history["a"]["c0"] == pytest.approx([1.0])
    assert history["a"]["c5"] == pytest.approx([R])
    assert history["a"]["c6"] == pytest.approx([-R])
    us = federation()
    warnings = check(us, history)
    assert [u.cid for u in us["a"]] == ["c0", "c1", "c2", "c3", "c4", "c5", "c6"]
    np.testing.assert_allclose(us["a"][6].delta[0], [-1.0, 1.0])
    for u, v in zip(us["a"][:6], federation()["a"][:6]):
        np.testing.assert_array_equal(u.delta[0], v.delta[0])
    assert warnings == [
        "Client c6: clipped update for task 'a': its updates point against the other "
        "clients' (mean cosine -0.707 over its last 2 rounds; the clients' median 1.000, "
        "bound 1.000 = median - 3 x robust deviation 0.000); update norm 2.828 scaled to the "
        "reference norm 1.414"
    ]
    assert history["a"]["c6"] == pytest.approx([-R, -R])


def seeded(past_honest: float, past_hostile: float) -> dict:
    """19 past cosines per client: with this round's (1 for c0-c4 on the x
    axis, -1/sqrt 2 for c5) each holds 20, the window."""
    n = DIRECTION_HISTORY - 1
    per = {f"c{i}": [past_honest] * n for i in range(5)}
    per["c5"] = [past_hostile] * n
    return {"a": per}


def round_of_six(last=(-1.0, 1.0)):
    """Norms 1, 2, 3, 1, 0.5 and c5's: with c5 = (-1, 1) (norm 1.414) the lower
    median of the six is 1."""
    return {
        "a": [
            upd("c0", [1.0, 0.0]),
            upd("c1", [2.0, 0.0]),
            upd("c2", [3.0, 0.0]),
            upd("c3", [1.0, 0.0]),
            upd("c4", [0.5, 0.0]),
            upd("c5", list(last)),
        ]
    }


def test_no_client_is_judged_where_the_clients_do_not_agree_on_a_direction():
    """Honest past cosines -0.05: scores (19 x -0.05 + 1) / 20 = 0.0025, below
    the agreement gate 0.1, so c5 (score (19 x -0.9 - 0.7071) / 20 = -0.8904,
    far below the others) is left alone: on such data a flipped update looks
    like an honest one. With honest past cosines 0.2 the scores are (3.8 + 1)
    / 20 = 0.24 >= 0.1, and c5's (-1, 1) is scaled to the reference norm 1."""
    history = seeded(-0.05, -0.9)
    us = round_of_six()
    assert check(us, history) == []
    assert us["a"][5].delta[0].tolist() == [-1.0, 1.0]
    assert np.mean(history["a"]["c0"]) == pytest.approx(0.0025)
    assert np.mean(history["a"]["c5"]) == pytest.approx((19 * -0.9 - R) / 20)
    us = round_of_six()
    warnings = check(us, seeded(0.2, -0.9))
    np.testing.assert_allclose(us["a"][5].delta[0], [-R, R])
    assert "mean cosine -0.890 over its last 20 rounds; the clients' median 0.240" in warnings[0]
    assert warnings[0].endswith("update norm 1.414 scaled to the reference norm 1")


def test_a_suspect_no_larger_than_the_reference_is_left_as_it_is():
    """c5 = (-0.5, 0.5): the same cosine, norm 0.707 below the reference
    norm (the lower median of 0.5, 0.707, 1, 1, 2, 3 is 1): not changed, and
    no line (the bound did not act)."""
    us = round_of_six((-0.5, 0.5))
    assert check(us, seeded(0.2, -0.9)) == []
    assert us["a"][5].delta[0].tolist() == [-0.5, 0.5]


def test_a_spread_of_honest_scores_widens_the_bound():
    """Past honest cosines 0.1, 0.3, 0.5, 0.7, 0.9 (19 each) and c5's -0.1:
    scores 0.145, 0.335, 0.525, 0.715, 0.905 and -0.1304 ((19 x -0.1 - 0.7071)
    / 20). Median of the six: (0.335 + 0.525) / 2 = 0.43; deviations 0.285,
    0.095, 0.095, 0.285, 0.475, 0.5604 -> median (0.285 + 0.285) / 2 = 0.285,
    s = 1.4826 x 0.285 = 0.42254. Factor 3: bound 0.43 - 1.2676 = -0.8376,
    c5 is left alone; factor 1: bound 0.43 - 0.42254 = 0.00746, c5 is shrunk."""

    def history():
        h = seeded(0.0, -0.1)
        for i, v in enumerate((0.1, 0.3, 0.5, 0.7, 0.9)):
            h["a"][f"c{i}"] = [v] * (DIRECTION_HISTORY - 1)
        return h

    assert check(round_of_six(), history(), factor=3.0) == []
    warnings = check(round_of_six(), history(), factor=1.0)
    assert (
        "mean cosine -0.130 over its last 20 rounds; the clients' median 0.430, bound "
        "0.007 = median - 1 x robust deviation 0.423"
    ) in warnings[0]


def test_fewer_than_five_judged_clients_are_not_judged():
    """Three clients on the x axis and one against them, twice: four clients
    with two cosines each, one fewer than needed; nothing changes."""
    history: dict = {}
    for _ in range(3):
        us = {
            "a": [
                upd("c0", [1.0, 0.0]),
                upd("c1", [2.0, 0.0]),
                upd("c2", [1.0, 0.0]),
                upd("c3", [-1.0, 0.0]),
            ]
        }
        assert check(us, history) == []
        assert us["a"][3].delta[0].tolist() == [-1.0, 0.0]
    assert history["a"]["c3"] == pytest.approx([-1.0] * 3)


def test_the_reference_leaves_the_update_out():
    """Two updates, (1, 0) and (-1, 0): each is compared with the other alone
    (with itself in, the median would be 0 and the cosine undefined): -1 each.
    A lone update and a zero update get no cosine."""
    history: dict = {}
    check({"a": [upd("p", [1.0, 0.0]), upd("q", [-1.0, 0.0])]}, history)
    assert history == {"a": {"p": [-1.0], "q": [-1.0]}}
    check({"b": [upd("p", [1.0, 0.0])], "a": [upd("p", [1.0, 0.0]), upd("z", [0.0, 0.0])]}, history)
    assert history == {"a": {"p": [-1.0], "q": [-1.0]}}


def test_above_the_leave_one_out_size_the_reference_is_the_median_of_all():
    """17 updates (one above the size): 12 along (1, 0), 5 along (0, 1). The
    median of all 17 is (1, 0): cosines 1 and 0. (Left out, a y-client's
    reference would still be (1, 0); a cheaper rule with the same outcome
    here, checked on the values.)"""
    assert DIRECTION_LEAVE_ONE_OUT == 16
    us = {
        "a": [upd(f"x{i}", [1.0, 0.0]) for i in range(12)]
        + [upd(f"y{i}", [0.0, 1.0]) for i in range(5)]
    }
    history: dict = {}
    check(us, history)
    assert all(history["a"][f"x{i}"] == [1.0] for i in range(12))
    assert all(history["a"][f"y{i}"] == [0.0] for i in range(5))


def test_the_history_keeps_the_last_cosines_and_off_means_off():
    history = {"a": {"c0": [0.5] * DIRECTION_HISTORY}}
    check({"a": [upd("c0", [1.0, 0.0]), upd("c1", [1.0, 0.0])]}, history)
    assert history["a"]["c0"] == [0.5] * (DIRECTION_HISTORY - 1) + [1.0]
    before = {"a": {"c0": [0.5]}}
    us = federation()
    assert check_directions(us, before, None) == []
    assert before == {"a": {"c0": [0.5]}}
    assert [u.delta[0].tolist() for u in us["a"]] == [
        u.delta[0].tolist() for u in federation()["a"]
    ]


def test_the_default_factor_and_its_check():
    assert Limits().direction_factor == DIRECTION_FACTOR == 3.0
    Limits(direction_factor=None)
    with pytest.raises(ValueError, match="direction_factor must be > 0"):
        Limits(direction_factor=0.0)


def test_a_run_saved_before_the_check_existed_resumes_without_it(tmp_path):
    """A config.json without ``direction-factor`` describes a run without the
    check: it loads as 0 (off)."""
    import json

    from mmfl_flwr.config import Settings

    path = tmp_path / "config.json"
    Settings(num_rounds=2).save(str(path))
    data = json.loads(path.read_text())
    assert data.pop("direction-factor") == 3.0
    path.write_text(json.dumps(data))
    assert Settings.load(str(path)).direction_factor == 0.0
    path.write_text(json.dumps({**data, "direction-factor": 2.0}))
    assert Settings.load(str(path)).direction_factor == 2.0


@pytest.mark.parametrize("value,expected", [(3.0, 3.0), (0.0, None), (1.5, 1.5)])
def test_the_setting_reaches_the_strategy(value, expected):
    from mmfl_flwr.config import Settings
    from mmfl_flwr.flower_app.server_app import strategy_from_settings

    for preset in ("mfa-rr", "lvr", "stalevr"):
        s = Settings(strategy=preset, direction_factor=value)
        assert strategy_from_settings(s).limits.direction_factor == expected


def _stacked_cosines(us):
    """The cosines as a stacked computation gives them: every update flattened into
    one matrix, the leave-one-out or whole median of its rows (independent of the
    blocked median the check uses)."""
    flat = np.stack([np.concatenate([d.ravel() for d in u.delta]) for u in us])
    whole = None if len(us) <= DIRECTION_LEAVE_ONE_OUT else np.median(flat, axis=0)
    out = {}
    for i, u in enumerate(us):
        ref = whole if whole is not None else np.median(np.delete(flat, i, axis=0), axis=0)
        out[u.cid] = float(flat[i] @ ref) / (
            float(np.linalg.norm(flat[i])) * float(np.linalg.norm(ref))
        )
    return out


@pytest.mark.parametrize("n", [2, 3, DIRECTION_LEAVE_ONE_OUT, DIRECTION_LEAVE_ONE_OUT + 1, 40])
def test_the_blocked_median_gives_the_stacked_cosines_exactly(monkeypatch, n):
    """The check takes medians a block of coordinates at a time (no stacked copy of
    the updates): with blocks far smaller than a piece, odd and even counts, and
    pieces of several shapes, the cosines it keeps equal the stacked computation's
    to the last bit."""
    import mmfl_flwr.strategy.directions as V  # where the check reads MEDIAN_BLOCK

    monkeypatch.setattr(V, "MEDIAN_BLOCK", 7 * n)  # 7 coordinates a block
    rng = np.random.default_rng(n)
    us = [
        Update(
            cid=f"c{k}",
            delta=[rng.normal(size=(5, 9)), rng.normal(size=23), rng.normal(size=(2, 2, 3))],
            num_examples=10,
            data_share=0.1,
        )
        for k in range(n)
    ]
    history: dict = {}
    check({"m": us}, history)
    expected = _stacked_cosines(us)
    assert {cid: v[-1] for cid, v in history["m"].items()} == expected


def test_the_check_holds_no_stacked_copy_of_the_updates(monkeypatch):
    """40 updates of 200,000 coordinates (64 MB in float64), medians taken 2 MB at a
    time: what the check allocates at its peak (numpy's allocations, traced) stays
    below a quarter of the updates' size; stacking them, as a flat matrix would,
    alone takes all of it."""
    import tracemalloc

    import mmfl_flwr.strategy.directions as V  # where the check reads MEDIAN_BLOCK

    monkeypatch.setattr(V, "MEDIAN_BLOCK", 1 << 18)
    rng = np.random.default_rng(0)
    n, size = 40, 200_000
    us = [
        Update(cid=f"c{k}", delta=[rng.normal(size=size)], num_examples=10, data_share=0.1)
        for k in range(n)
    ]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        check({"m": us}, {})
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < n * size * 8 / 4, f"peak {peak / 1e6:.1f} MB"
