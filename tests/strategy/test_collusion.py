"""The collusion check (``collusion_factor``, off by default, measured at 4; issue 60):
updates of a model whose cosine distance is under the round's median pairwise
distance / 4 form groups (connected sets), and each member of a group of ``k``
is scaled by ``1 / k`` and named with the others. Distances computed by hand."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from conftest import LogTap
from conftest import one_array_update as upd

from mmfl_flwr.config import Settings
from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.strategy.validation import (
    COLLUSION_FACTOR,
    COLLUSION_MIN_UPDATES,
    Limits,
    check_collusion,
    l2_norm,
)


def logged(fn, *args):
    with LogTap.on_flwr() as tap:
        fn(*args)
    return [m for lvl, m in tap.records if lvl == logging.DEBUG]


def round_of_five():
    """Three honest updates along the axes e1, e2, e3 (pairwise distance 1) and
    two colluders at (1, 1, 1, 10) and (2, 2, 2, 20) / 2 ... scaled copies of one
    direction u = (1, 1, 1, 10) / sqrt(103) with a tilt: b1 = u, b2 = 2 (u +
    0.01 e1). Distances: honest-honest 1; honest-colluder 1 - cos near 0.9; b1-b2
    about 0.0000. The median of the 10 pairwise distances is over 0.9, so the
    limit is over 0.225: only b1 and b2 are alike."""
    u = np.array([1.0, 1.0, 1.0, 10.0])
    return {
        "a": [
            upd("h1", [1.0, 0.0, 0.0, 0.0]),
            upd("h2", [0.0, 1.0, 0.0, 0.0]),
            upd("h3", [0.0, 0.0, 1.0, 0.0]),
            upd("b1", list(u)),
            upd("b2", list(2 * (u + 0.01 * np.array([1.0, 0, 0, 0])))),
        ]
    }


def distances(us):
    v = np.stack([np.concatenate(u.delta) for u in us])
    v = v / np.linalg.norm(v, axis=1, keepdims=True)
    d = 1 - v @ v.T
    return d[np.triu_indices(len(us), k=1)]


def test_two_alike_updates_count_as_one_and_both_are_named():
    us = round_of_five()
    before = [l2_norm(u.delta) for u in us["a"]]
    m = float(np.median(distances(us["a"])))
    lines = logged(check_collusion, us, 4.0)
    after = [l2_norm(u.delta) for u in us["a"]]
    assert after[:3] == before[:3]  # the honest ones untouched
    assert after[3] == pytest.approx(before[3] / 2) and after[4] == pytest.approx(before[4] / 2)
    assert [x.split(":")[0] for x in lines] == ["Client b1", "Client b2"]
    assert all(x.endswith("scaled by 1/2") and f"median distance {m:.3f} / 4" in x for x in lines)
    assert "clients b2 are nearly alike" in lines[0] and "clients b1 are" in lines[1]


def test_a_group_is_a_chain_of_alike_updates():
    """Three honest updates along e4, e5, e6 and a, b, c in the plane of e1, e2
    at angles 0, 35 and 70 degrees: of the 15 distances, 12 are 1 (the median),
    a-b and b-c are 1 - cos 35 = 0.181 (under 1 / 4) and a-c 1 - cos 70 = 0.658
    (over it). a and c are not alike, but b joins them: one group of three,
    each scaled by 1/3, its line giving the distances 0.181 to 0.658."""
    t = np.radians(35.0)
    plane = [[np.cos(k * t), np.sin(k * t), 0, 0, 0, 0] for k in range(3)]
    us = {
        "a": [upd(f"h{i}", list(np.eye(6)[3 + i])) for i in range(3)]
        + [upd(c, v) for c, v in zip("abc", plane)]
    }
    lines = logged(check_collusion, us, 4.0)
    assert [x.split(":")[0] for x in lines] == ["Client a", "Client b", "Client c"]
    assert all(x.endswith("by 1/3") and "0.181 to 0.658" in x and "under 0.250" in x for x in lines)
    assert [round(l2_norm(u.delta), 6) for u in us["a"]] == [1.0] * 3 + [round(1 / 3, 6)] * 3


def test_honest_spread_updates_and_small_rounds_are_left_alone():
    """Five updates along five axes: every distance 1 = the median, nobody is
    alike; two updates (below COLLUSION_MIN_UPDATES) are never read, even
    identical; off (None) nothing is read."""
    spread = {"a": [upd(f"h{i}", list(np.eye(5)[i])) for i in range(5)]}
    assert logged(check_collusion, spread, 4.0) == []
    assert COLLUSION_MIN_UPDATES == 3
    pair = {"a": [upd("b1", [1.0, 2.0]), upd("b2", [1.0, 2.0])]}
    assert logged(check_collusion, pair, 4.0) == []
    assert l2_norm(pair["a"][0].delta) == pytest.approx(np.sqrt(5))
    us = round_of_five()
    assert logged(check_collusion, us, None) == []


def test_zero_updates_have_no_direction_and_are_left_out():
    """A zero update (a client that did not move) joins no group and keeps its
    zero; the others are read as without it."""
    us = round_of_five()
    us["a"].append(upd("z", [0.0, 0.0, 0.0, 0.0]))
    lines = logged(check_collusion, us, 4.0)
    assert [x.split(":")[0] for x in lines] == ["Client b1", "Client b2"]
    assert l2_norm(us["a"][5].delta) == 0.0


def test_off_by_default_and_applied_when_given(tmp_path):
    import json

    from mmfl_flwr.flower_app.server_app import strategy_from_settings

    assert Limits().collusion_factor is None and COLLUSION_FACTOR == 4.0
    assert Settings().collusion_factor == 0.0
    with pytest.raises(ValueError, match="collusion_factor must be > 1"):
        Limits(collusion_factor=1.0)
    with pytest.raises(ValueError, match="collusion-factor must be 0 \\(off\\) or > 1; got 1"):
        Settings(collusion_factor=1.0).validate()  # the CLI's one line, not a traceback
    for value, expected in ((0.0, None), (4.0, 4.0), (2.5, 2.5)):
        s = Settings(strategy="lvr", collusion_factor=value)
        assert strategy_from_settings(s).limits.collusion_factor == expected
    assert strategy_from_settings(Settings(defences="off")).limits.collusion_factor is None
    path = tmp_path / "config.json"  # a run saved before the setting: it had none
    Settings(collusion_factor=4.0).save(str(path))
    data = json.loads(path.read_text())
    assert data.pop("collusion-factor") == 4.0
    path.write_text(json.dumps(data))
    assert Settings.load(str(path)).collusion_factor == 0.0


def test_the_cosines_summed_by_blocks_equal_numpys(monkeypatch):
    """Updates of two arrays (7 and 3 numbers), one of them zero: the blocked Gram
    matrix (blocks of 4 numbers here) gives numpy's cosines of the flattened updates,
    the zero update left out."""
    import mmfl_flwr.strategy.collusion as C

    rng = np.random.default_rng(1)
    us = [
        Update(
            cid=f"c{i}",
            delta=[rng.normal(size=(7,)), rng.normal(size=(3,))],
            num_examples=1,
            data_share=0.2,
        )
        for i in range(4)
    ]
    us.append(Update(cid="z", delta=[np.zeros(7), np.zeros(3)], num_examples=1, data_share=0.2))
    monkeypatch.setattr(C, "GRAM_BLOCK", 4 * len(us))  # 4 coordinates a block
    cos, keep = C._cosines(us)
    v = np.stack([np.concatenate(u.delta) for u in us[:4]])
    v = v / np.linalg.norm(v, axis=1, keepdims=True)
    assert keep == [0, 1, 2, 3]
    np.testing.assert_allclose(cos, v @ v.T, rtol=1e-12, atol=1e-12)


def reversed_round(sign: float, second: list[float] | None = None) -> dict[str, list[Update]]:
    """Three honest updates h1, h2, h3 = (1, 1, 0, 0), (1, 0, 1, 0), (1, 0, 0, 1) / sqrt 2
    (pairwise cosine 1/2, distance 0.5) and two near copies b1 = 2 sign (1, .3, .3, .3),
    b2 = 2 sign (1, .31, .3, .3). With sign -1: each b's cosine with each h is -1.3 /
    (sqrt 2 sqrt 1.27) = -0.816 (distance 1.816, six pairs), so the median of the 10
    distances is 1.816 and the limit 1.816 / 4 = 0.454: the h's (0.5 apart) are not
    alike, b1 and b2 (about 0.00003 apart) are."""
    r = 1 / np.sqrt(2)
    honest = [[r, r, 0, 0], [r, 0, r, 0], [r, 0, 0, r]]
    us = [upd(f"h{i + 1}", v) for i, v in enumerate(honest)]
    us.append(upd("b1", list(2 * sign * np.array([1, 0.3, 0.3, 0.3]))))
    us.append(upd("b2", second or list(2 * sign * np.array([1, 0.31, 0.3, 0.3]))))
    return {"a": us}


def test_a_reversed_coalition_is_rejected_and_every_member_named():
    """b1 and b2 are alike and their mean 2 (-1, -.305, -.3, -.3) points against the
    honest updates' coordinate-wise median (1/sqrt 2, 0, 0, 0): cosine -1 / sqrt(1 +
    .305^2 + .3^2 + .3^2) = -0.886, below -0.1. Both are removed from the round,
    returned and logged as rejected, each naming the other; the honest updates are
    untouched."""
    us = reversed_round(-1.0)
    before = [l2_norm(u.delta) for u in us["a"][:3]]
    with LogTap.on_flwr() as tap:
        out = check_collusion(us, 4.0)
    lines = [m for lvl, m in tap.records if lvl == logging.DEBUG]
    assert out == [("a", "b1"), ("a", "b2")]
    assert [u.cid for u in us["a"]] == ["h1", "h2", "h3"]
    assert [l2_norm(u.delta) for u in us["a"]] == before
    cos = -1 / np.sqrt(1 + 0.305**2 + 0.3**2 + 0.3**2)
    assert cos == pytest.approx(-0.886, abs=5e-4)
    assert [x.split(":")[0] for x in lines] == ["Client b1", "Client b2"]
    assert "clients b2 are nearly alike" in lines[0] and "clients b1 are" in lines[1]
    assert all(f"cosine {cos:.3f} with their median" in x for x in lines)
    assert all("rejected update" in x and x.endswith("a reversed coalition") for x in lines)


def test_an_alike_group_moving_with_the_others_is_scaled_not_rejected():
    """The same copies with sign +1 point with the honest updates (cosine +0.886 with
    their median): each b is 0.184 from each h (cosine 0.816), the median distance is
    0.184 and the limit 0.046, so only b1 and b2 are alike: counted as one client's
    (each scaled by 1/2), none rejected."""
    us = reversed_round(+1.0)
    norms = [l2_norm(u.delta) for u in us["a"]]
    assert check_collusion(us, 4.0) == []
    assert [u.cid for u in us["a"]] == ["h1", "h2", "h3", "b1", "b2"]
    after = [l2_norm(u.delta) for u in us["a"]]
    assert after[:3] == norms[:3]
    assert after[3:] == pytest.approx([norms[3] / 2, norms[4] / 2])


def test_a_group_that_is_most_of_its_round_is_not_judged():
    """Two honest updates and three reversed near copies: the group (3) outnumbers
    the others (2), whose median would be a minority's; it is scaled by 1/3, not
    rejected (a coalition that is most of a round is beyond this rule)."""
    us = reversed_round(-1.0)
    us["a"].pop(2)
    us["a"].append(upd("b3", list(-2 * np.array([1, 0.3, 0.31, 0.3]))))
    assert check_collusion(us, 4.0) == []
    assert [u.cid for u in us["a"]] == ["h1", "h2", "b1", "b2", "b3"]
    norm = 2 * np.sqrt(1 + 0.31**2 + 0.3**2 + 0.3**2)
    assert l2_norm(us["a"][4].delta) == pytest.approx(norm / 3)


def test_a_reversed_coalition_of_a_real_run_is_left_out_and_named():
    """The wiring, in a real in-process run: MFA-RR on digits and synthetic, 12 clients,
    clients 3, 7 and 9 sending inner-product manipulation (-2 x the mean of what they
    trained) and the collusion check at 4. In round 2, 7 and 9 train digits together:
    their alike updates point against the other four's median, and both are rejected
    (named, and counted in the round's rejected updates); in rounds 1 and 3 they train
    synthetic, whose honest updates disagree, and are counted as one client. No honest
    client is rejected and every model stays finite."""
    import math

    from mmfl_flwr.runner import run_inprocess
    from mmfl_flwr.testing import hostile as H

    s = Settings(
        strategy="mfa-rr",
        tasks="digits,synthetic",
        num_clients=12,
        num_rounds=3,
        local_epochs=2,
        output_dir="",
        seed=0,
        collusion_factor=4.0,
    )
    result = run_inprocess(s, wrap_client_app=H.ipm(("3", "7", "9"), 2.0))
    rejected = [(e.round, e.client, e.task) for e in result.events if e.kind == "rejected"]
    assert rejected == [(2, "7", "digits"), (2, "9", "digits")]
    reasons = [e.reason for e in result.events if e.kind == "rejected"]
    assert all(r.endswith("a reversed coalition") for r in reasons)
    assert "clients 9 are nearly alike" in reasons[0] and "clients 7 are" in reasons[1]
    row = [r for r in result.history if r["round"] == 2 and r["task"] == "digits"]
    assert row and row[0]["rejected"] == 2
    assert all(math.isfinite(r["accuracy"]) for r in result.final().values())
