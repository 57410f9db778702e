"""The bounds on reversed updates (``reversed_influence_factor``, on by default
at 4; issues 26 and 60). An update is reversed when its cosine with the
coordinate-wise median of its model's other updates is below -0.1 this round
and on average over its client's recent rounds. Each reversed update alone is
held to 4x the round's lower median influence (:class:`InfluenceBound`), and
where the model's clients agree on a direction the reversed updates together
pull the model back (weight x norm x |cosine|) by at most 4x the lower median
push of the updates that agree and half the pushes' sum
(:func:`bound_reversed_pull`); each update a bound scales is named with the
model. Numbers computed by hand; cosines checked against numpy directly."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from conftest import LogTap
from conftest import one_array_update as upd

from mmfl_flwr.config import Settings
from mmfl_flwr.core.aggregators import FedAvgAggregator
from mmfl_flwr.core.robust import MedianAggregator
from mmfl_flwr.strategy.validation import (
    REVERSED_INFLUENCE_FACTOR,
    REVERSED_MIN_COSINE,
    REVERSED_PULL_SHARE,
    InfluenceBound,
    Limits,
    bound_expected_influence,
    bound_fresh_influence,
    bound_influence,
    bound_reversed_pull,
    check_directions,
    l2_norm,
)


def logged(fn, *args):
    tap = LogTap()
    logger = logging.getLogger("flwr")
    logger.addHandler(tap)
    try:
        fn(*args)
    finally:
        logger.removeHandler(tap)
    return tap.records


def heavy_pair():
    """FedAvg weights from 10, 10, 40 and 40 examples: 0.1, 0.1, 0.4, 0.4; norms
    1, 2, 5, 5; influences 0.1, 0.2, 2.0, 2.0. Lower median 0.2, so the bound at
    4 is 0.8: c2 and c3 are both 10x the reference."""
    return {
        "a": [
            upd("c0", [1.0, 0.0], 10),
            upd("c1", [0.0, 2.0], 10),
            upd("c2", [3.0, 4.0], 40),
            upd("c3", [-3.0, -4.0], 40),
        ]
    }


def test_only_the_reversed_heavy_update_is_held_and_named():
    """c3 is reversed (cosine -0.5 this round, mean -0.4 over 3 rounds): scaled
    by 0.8 / 2.0 to norm 2, (-1.2, -1.6), and named with why. c2, as heavy but
    agreed with, keeps its weight: the papers' weighting is kept for it."""
    us = heavy_pair()
    rule = InfluenceBound(None, 4.0, {("a", "c3"): (-0.5, -0.4, 3)})
    records = logged(bound_influence, us, FedAvgAggregator().step_weights, rule)
    np.testing.assert_allclose(us["a"][3].delta[0], [-1.2, -1.6])
    for u, v in zip(us["a"][:3], ([1.0, 0.0], [0.0, 2.0], [3.0, 4.0])):
        np.testing.assert_array_equal(u.delta[0], v)
    assert [m for lvl, m in records if lvl == logging.DEBUG] == [
        "Client c3: clipped update for task 'a': its influence on the step (weight 0.4 x "
        "update norm 5 = 2) exceeds 0.8 (4 x the round's reference influence, 0.2); it "
        "points against the model's other updates (cosine -0.500 with their median this "
        "round, mean -0.400 over its last 3 rounds); update norm scaled to 2"
    ]


def test_with_no_reversed_update_nothing_moves_and_nothing_is_logged():
    us = heavy_pair()
    records = logged(
        bound_influence, us, FedAvgAggregator().step_weights, InfluenceBound(None, 4.0, {})
    )
    assert records == []
    assert [float(l2_norm(u.delta)) for u in us["a"]] == [1.0, 2.0, 5.0, 5.0]


def test_the_fresh_updates_beta_reads_are_held_only_when_reversed():
    """The oracle StaleVR's reads (d ||G||) at the reference 0.2 and factor 4:
    bound 0.8. c4 (d 0.5, norm 5: 2.5) is reversed and read scaled by 0.8 / 2.5
    to (0.96, 1.28); c5, as heavy but agreed with, is read as it came."""
    fresh = {"a": [upd("c4", [3.0, 4.0], share=0.5), upd("c5", [3.0, 4.0], share=0.5)]}
    rule = InfluenceBound(None, 4.0, {("a", "c4"): (-0.3, -0.2, 2)})
    got: dict = {}
    records = logged(lambda: got.update(bound_fresh_influence(fresh, {}, {"a": 0.2}, rule)))
    np.testing.assert_allclose(got["a"]["c4"][0], [0.96, 1.28])
    assert got["a"]["c5"] is fresh["a"][1].delta
    (line,) = [m for lvl, m in records if lvl == logging.DEBUG]  # actions: DEBUG
    assert line.startswith("Client c4:") and "points against the model's other updates" in line


def test_no_weights_no_line_unless_the_bound_on_every_update_was_asked_for():
    """A coordinate-wise rule (the median) has no weights: the default reversed
    bound leaves it alone without a line every round; asked for, the bound on
    every update says once a round that it could not bound the model."""
    rev = {("a", "c3"): (-0.5, -0.4, 3)}
    for rule, lines in ((InfluenceBound(None, 4.0, rev), 0), (InfluenceBound(4.0, 4.0, rev), 1)):
        us = heavy_pair()
        records = logged(bound_influence, us, MedianAggregator().step_weights, rule)
        assert len([m for lvl, m in records if lvl == logging.INFO]) == lines
        assert [float(l2_norm(u.delta)) for u in us["a"]] == [1.0, 2.0, 5.0, 5.0]


def test_off_the_aggregator_is_not_asked_for_weights():
    """Both factors off: the path before the bound existed (no weights read)."""

    def weights(_):
        raise KeyError("not to be called")

    assert bound_influence(heavy_pair(), weights, InfluenceBound(None, None, {})) == {}
    assert bound_influence(heavy_pair(), weights, None) == {}


def test_reversed_means_below_minus_a_tenth_this_round_and_on_average():
    """Of the cosines (this round, mean, rounds): c1 below -0.1 only this
    round, c2 only on average, c3 both, c4 neither, c5 negative in both but
    within 0.1 of orthogonal (an honest Synthetic(1,1) client's typical
    scores): only c3 is reversed. Off (factor None) nothing is."""
    assert REVERSED_MIN_COSINE == 0.1
    cos = {
        ("a", "c1"): (-0.2, 0.1, 3),
        ("a", "c2"): (0.3, -0.2, 3),
        ("a", "c3"): (-0.15, -0.11, 2),
        ("a", "c4"): (0.4, 0.3, 2),
        ("a", "c5"): (-0.09, -0.05, 6),
    }
    assert set(InfluenceBound.of(None, 4.0, cos).reversed) == {("a", "c3")}
    assert InfluenceBound.of(None, None, cos).reversed == {}


def test_the_lower_factor_holds_and_the_log_says_which():
    """With the bound on every update too, a reversed update is held to the
    lower of the two factors; where that is the every-update factor, the line
    is the every-update bound's (nothing about direction)."""
    rev = {("a", "c3"): (-0.5, -0.4, 3)}
    assert InfluenceBound(2.0, 4.0, rev).factor_for("a", "c3") == 2.0
    assert InfluenceBound(6.0, 4.0, rev).factor_for("a", "c3") == 4.0
    assert InfluenceBound(6.0, 4.0, rev).factor_for("a", "c2") == 6.0
    assert InfluenceBound(None, 4.0, rev).factor_for("a", "c2") is None
    assert InfluenceBound(4.0, 4.0, rev).why("a", "c3") == ""
    us = heavy_pair()  # c2, c3 at 10x the reference 0.2: every update at 6 (1.2), c3 at 4
    records = logged(
        bound_influence, us, FedAvgAggregator().step_weights, InfluenceBound(6.0, 4.0, rev)
    )
    assert l2_norm(us["a"][2].delta) == pytest.approx(5.0 * 1.2 / 2.0)
    assert l2_norm(us["a"][3].delta) == pytest.approx(5.0 * 0.8 / 2.0)
    lines = [m for lvl, m in records if lvl == logging.DEBUG]  # actions: DEBUG
    assert len(lines) == 2 and "points against" not in lines[0] and "points against" in lines[1]


def test_the_expected_step_bound_holds_reversed_updates_only():
    """Under the oracle StaleVR, data share x norm: shares 0.1, 0.1, 0.4, 0.4
    with the norms above give the same 0.1, 0.2, 2, 2; only reversed c3 is held."""
    us = {
        "a": [
            upd("c0", [1.0, 0.0], share=0.1),
            upd("c1", [0.0, 2.0], share=0.1),
            upd("c2", [3.0, 4.0], share=0.4),
            upd("c3", [-3.0, -4.0], share=0.4),
        ]
    }
    records = logged(
        bound_expected_influence, us, InfluenceBound(None, 4.0, {("a", "c3"): (-0.5, -0.4, 3)})
    )
    np.testing.assert_allclose(us["a"][3].delta[0], [-1.2, -1.6])
    np.testing.assert_array_equal(us["a"][2].delta[0], [3.0, 4.0])
    (line,) = [m for lvl, m in records if lvl == logging.DEBUG]  # actions: DEBUG
    assert line.startswith(
        "Client c3: clipped update for task 'a': its influence on the "
        "expected step (data share 0.4 x update norm 5 = 2)"
    )


def heavy_five():
    """FedAvg weights from 10, 10, 40, 40 and 100 examples: 0.05, 0.05, 0.2,
    0.2, 0.5; norms 1, 2, 5, 5, 1 (five updates: the least the bound on the
    reversed ones together reads)."""
    us = heavy_pair()
    us["a"].append(upd("c4", [0.6, 0.8], 100))
    return us


#: (cosine this round, mean cosine, rounds) of each update of heavy_five(): c3
#: reversed; the mean cosines' median is 0.5, so the clients agree.
COS = {
    ("a", "c0"): (0.8, 0.5, 3),
    ("a", "c1"): (0.6, 0.4, 3),
    ("a", "c2"): (0.9, 0.7, 3),
    ("a", "c3"): (-0.5, -0.4, 3),
    ("a", "c4"): (0.7, 0.6, 3),
}
NORMS = [1.0, 2.0, 5.0, 5.0, 1.0]


def test_together_a_heavy_reversed_update_is_held_and_named():
    """Along the others: c0 0.05 x 1 x 0.8 = 0.04, c1 0.05 x 2 x 0.6 = 0.06, c2
    0.2 x 5 x 0.9 = 0.9, c4 0.5 x 1 x 0.7 = 0.35 push; c3 pulls 0.2 x 5 x 0.5
    = 0.5. The reference push is the lower median 0.06, the pushes' sum 1.35:
    allowed min(4 x 0.06, 0.5 x 1.35) = 0.24, so c3 is scaled by 0.48 to
    (-1.44, -1.92) and named with why. c2, as heavy but agreed with, keeps its
    weight."""
    us = heavy_five()
    records = logged(bound_reversed_pull, us, FedAvgAggregator().step_weights, 4.0, COS)
    np.testing.assert_allclose(us["a"][3].delta[0], [-1.44, -1.92])
    for i in (0, 1, 2, 4):
        assert l2_norm(us["a"][i].delta) == NORMS[i]
    assert [m for lvl, m in records if lvl == logging.DEBUG] == [
        "Client c3: clipped update for task 'a': it points against the model's other "
        "updates (cosine -0.500 with their median this round, mean -0.400 over its last 3 "
        "rounds); the 1 such updates of this round together pull the step back by 0.5 "
        "(weight x norm x |cosine|), above 0.24 (the lower of 4 x the reference push "
        "0.06, the lower median of weight x norm x cosine over the 4 updates that agree, "
        "and 0.5 of their sum 1.35); update norm 5 scaled to 2.4"
    ]


def test_together_needs_five_updates():
    """Four updates (c4 left out): each one's reference is the median of three
    others, too few to tell a coalition; nothing moves."""
    us = heavy_five()
    us["a"].pop()
    assert logged(bound_reversed_pull, us, FedAvgAggregator().step_weights, 4.0, COS) == []
    assert [float(l2_norm(u.delta)) for u in us["a"]] == NORMS[:4]


def test_a_coalition_is_held_together_though_each_alone_is_under_the_bound():
    """Eight updates of norm 1 with FedAvg weights 1/8: five honest ones at
    cosine 0.6 push 0.075 each (reference 0.075, sum 0.375); three colluders at
    cosine -0.9 pull 0.1125 each, 0.3375 together. Each alone is under both
    bounds (4 x 0.075 = 0.3, 0.5 x 0.375 = 0.1875); together they exceed
    0.1875, so each is scaled by 0.1875 / 0.3375 and each is named."""
    honest = [upd(f"h{i}", [1.0, 0.0]) for i in range(5)]
    bad = [upd(f"b{i}", [-1.0, 0.0]) for i in range(3)]
    cos = {("a", u.cid): (0.6, 0.5, 4) for u in honest}
    cos |= {("a", u.cid): (-0.9, -0.8, 4) for u in bad}
    us = {"a": honest + bad}
    records = logged(bound_reversed_pull, us, FedAvgAggregator().step_weights, 4.0, cos)
    for u in bad:
        assert l2_norm(u.delta) == pytest.approx(0.1875 / 0.3375)
    assert all(l2_norm(u.delta) == 1.0 for u in honest)
    lines = [m for lvl, m in records if lvl == logging.DEBUG]
    assert [m.split(":")[0] for m in lines] == ["Client b0", "Client b1", "Client b2"]
    assert all("the 3 such updates of this round together pull the step back" in m for m in lines)
    assert REVERSED_PULL_SHARE == 0.5


def test_a_heavy_update_at_a_small_angle_past_perpendicular_keeps_its_weight():
    """c3 reversed at cosine -0.15: it pulls 0.2 x 5 x 0.15 = 0.15, under the
    0.24 allowed, so nothing moves (its influence, 1.0, is 10 x the reference
    influence 0.1: the bound on each update alone holds it, not this one)."""
    us = heavy_five()
    cos = dict(COS) | {("a", "c3"): (-0.15, -0.12, 6)}
    assert logged(bound_reversed_pull, us, FedAvgAggregator().step_weights, 4.0, cos) == []
    assert [float(l2_norm(u.delta)) for u in us["a"]] == NORMS


def test_together_where_the_clients_disagree_nobody_is_held():
    """The clients' mean cosines have a median under DIRECTION_AGREEMENT (0.1):
    near a heterogeneous model's optimum each honest update points against the
    others' (they sum to about zero), so reversed means nothing: the heavy
    reversed c3 keeps its weight."""
    us = heavy_five()
    cos = {k: (c, m - 0.5, n) for k, (c, m, n) in COS.items()}  # means 0, -.1, .2, -.9, .1
    assert logged(bound_reversed_pull, us, FedAvgAggregator().step_weights, 4.0, cos) == []
    assert [float(l2_norm(u.delta)) for u in us["a"]] == NORMS


def test_together_only_the_reversed_are_held():
    """c3 below -0.1 only this round (mean 0.1), only on average (cosine
    0.3), or within 0.1 of orthogonal is not reversed: nothing is held."""
    for c3 in ((-0.5, 0.1, 3), (0.3, -0.4, 3), (-0.09, -0.08, 3)):
        us = heavy_five()
        cos = dict(COS) | {("a", "c3"): c3}
        bound_reversed_pull(us, FedAvgAggregator().step_weights, 4.0, cos)
        assert float(l2_norm(us["a"][3].delta)) == 5.0


def test_together_no_weights_or_off_nothing_moves_and_nothing_is_logged():
    """A coordinate-wise rule (the median) has no weights: left alone without a
    line; off (None) or without cosines the aggregator is not even asked."""
    us = heavy_five()
    assert logged(bound_reversed_pull, us, MedianAggregator().step_weights, 4.0, COS) == []
    assert [float(l2_norm(u.delta)) for u in us["a"]] == NORMS

    def weights(_):
        raise KeyError("not to be called")

    bound_reversed_pull(heavy_five(), weights, None, COS)
    bound_reversed_pull(heavy_five(), weights, 4.0, None)


def test_together_on_the_expected_step_the_data_shares_are_the_weights():
    """The oracle StaleVR's expected step: shares 0.05, 0.05, 0.2, 0.2, 0.5
    give the same numbers as the FedAvg weights above, and the line says which
    step."""
    us = {
        "a": [
            upd(u.cid, list(u.delta[0]), share=s)
            for u, s in zip(heavy_five()["a"], (0.05, 0.05, 0.2, 0.2, 0.5))
        ]
    }
    records = logged(
        bound_reversed_pull,
        us,
        lambda xs: [x.data_share for x in xs],
        4.0,
        COS,
        None,
        "expected step",
    )
    np.testing.assert_allclose(us["a"][3].delta[0], [-1.44, -1.92])
    (line,) = [m for lvl, m in records if lvl == logging.DEBUG]
    assert "together pull the expected step back by 0.5" in line


def test_check_directions_reports_each_cosine_and_mean_even_when_off():
    """The cosines the bound reads: each update against the coordinate-wise
    median of the round's others (computed here with numpy), and the mean of the
    client's cosines so far; given with the direction check off too."""
    rng = np.random.default_rng(0)
    history: dict = {}
    seen: dict = {}
    for _ in range(2):
        vecs = rng.normal(size=(5, 3))
        us = {"a": [upd(f"c{i}", list(v)) for i, v in enumerate(vecs)]}
        cos: dict = {}
        assert check_directions(us, history, None, cos) == []
        for i, v in enumerate(vecs):
            others = np.median(np.delete(vecs, i, axis=0), axis=0)
            want = float(v @ others / (np.linalg.norm(v) * np.linalg.norm(others)))
            seen.setdefault(i, []).append(want)
            c, mean, n = cos[("a", f"c{i}")]
            assert c == pytest.approx(want)
            assert mean == pytest.approx(np.mean(seen[i])) and n == len(seen[i])
    assert check_directions({"a": [upd("c0", [1.0])]}, {}, None, None) == []


def test_on_by_default_zero_is_off_and_old_runs_resume_without_it(tmp_path):
    from mmfl_flwr.flower_app.server_app import strategy_from_settings

    assert Limits().reversed_influence_factor == REVERSED_INFLUENCE_FACTOR == 4.0
    assert Settings().reversed_influence_factor == 4.0
    with pytest.raises(ValueError, match="reversed_influence_factor must be >= 1"):
        Limits(reversed_influence_factor=0.5)
    for value, expected in ((0.0, None), (4.0, 4.0), (2.5, 2.5)):
        s = Settings(strategy="lvr", reversed_influence_factor=value)
        assert strategy_from_settings(s).limits.reversed_influence_factor == expected
    # a config.json written before the setting existed describes a run without it
    path = tmp_path / "config.json"
    Settings().save(str(path))
    data = json.loads(path.read_text())
    assert data.pop("reversed-influence-factor") == 4.0
    path.write_text(json.dumps(data))
    assert Settings.load(str(path)).reversed_influence_factor == 0.0


def _run(strategy: str, attack: str, **kw):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import hostile_clients as HC

    from mmfl_flwr.runner import run_inprocess

    tap = LogTap()
    logger = logging.getLogger("flwr")
    logger.addHandler(tap)
    try:
        s = Settings(
            strategy=strategy,
            tasks="digits,synthetic",
            num_clients=12,
            num_rounds=4,
            local_epochs=5,
            output_dir="",
            seed=5,
            **kw,
        )
        result = run_inprocess(s, wrap_client_app=HC._field_attack(attack))
    finally:
        logger.removeHandler(tap)
    return result, [m for _, m in tap.records if "points against the model's other" in m]


def test_off_no_cosines_are_read_and_the_direction_history_is_left_alone(monkeypatch):
    """With the bound off (and the direction check off) the aggregation asks
    for no cosines, as before the bound existed."""
    import mmfl_flwr.strategy.aggregate as A
    from mmfl_flwr.runner import run_inprocess

    seen = []
    original = A.check_directions

    def spy(updates, history, factor, cosines=None, events=None):
        seen.append((factor, cosines))
        return original(updates, history, factor, cosines, events)

    monkeypatch.setattr(A, "check_directions", spy)
    for kw, want in (({"reversed_influence_factor": 0.0}, None), ({}, {})):
        seen.clear()
        run_inprocess(
            Settings(
                strategy="mfa-rr",
                tasks="digits,synthetic",
                num_clients=6,
                num_rounds=2,
                local_epochs=1,
                output_dir="",
                seed=0,
                direction_factor=0.0,
                **kw,
            )
        )
        assert seen and all(f is None for f, _ in seen)
        assert all((c is None) if want is None else isinstance(c, dict) for _, c in seen)


@pytest.mark.parametrize("strategy", ["mfa-rr", "stalevr"])
def test_by_default_a_heavy_sign_flipper_is_held_and_named(strategy):
    """Real in-process runs (digits and synthetic, 12 clients, seed 5, where
    client 3 holds the most synthetic data and flips its updates: the field's
    worst case, where the norm clip and the direction check leave it free).
    With the defaults the bound holds client 3's synthetic updates and names it
    with the model; with ``reversed-influence-factor 0`` no such line appears
    and the run differs."""
    on, lines = _run(strategy, "flip1")
    assert any(m.startswith("Client 3: clipped update for task 'synthetic'") for m in lines)
    off, none = _run(strategy, "flip1", reversed_influence_factor=0.0)
    assert none == []
    assert [r["accuracy"] for r in on.history] != [r["accuracy"] for r in off.history]
