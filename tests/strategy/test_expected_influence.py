"""The expected-step influence bound (``influence_clip_factor`` under the oracle
StaleVR): over the sampling, Eq. 18's step is ``E[Delta] = sum_i d_i G_i``, so a
client moves it by ``d_i ||G_i||`` every round, sampled or not (its stale term
``d beta h`` enters at its data share). An update whose ``d ||G||`` exceeds the
factor times the round's lower median is scaled down to it before the draw,
keeps its direction, and is logged with the client id and the model (issue 26:
a sign-flipping client holding 0.2 of Synthetic(1,1)'s data wrecked honest
users' accuracy under StaleVR with the influence bound on, because the bound on
the counted weights ``d l / (B p)`` left its ``d ||G||`` free).
"""

from __future__ import annotations

import logging

import numpy as np
from conftest import LogTap

from mmfl_flwr.config import Settings
from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.strategy.validation import bound_expected_influence, l2_norm


def upd(cid: str, values: list[float], share: float, prob: float = 0.5) -> Update:
    return Update(
        cid=cid,
        delta=[np.array(values, dtype=np.float64)],
        num_examples=10,
        data_share=share,
        prob=prob,
    )


def run_bound(updates, factor):
    tap = LogTap()
    logger = logging.getLogger("flwr")
    logger.addHandler(tap)
    try:
        bound_expected_influence(updates, factor)
    finally:
        logger.removeHandler(tap)
    return [m for lvl, m in tap.records if lvl == logging.DEBUG]  # actions: DEBUG


def test_a_large_share_update_is_scaled_to_the_bound_and_named():
    """Shares 0.1, 0.1, 0.2, 0.6; norms 1, 2, 1, 5 (c3's (3, 4)): d ||G|| = 0.1,
    0.2, 0.2, 3.0; lower median 0.2, bound 3 x 0.2 = 0.6, so c3's update is
    scaled by 0.6 / 3 = 0.2 to (0.6, 0.8); the others are untouched, whatever
    their inclusion probabilities: c0's p of 0.01 would make its d / (B p) ||G||
    10, far above any bound on those, but the bound reads d."""
    us = {
        "a": [
            upd("c0", [1.0, 0.0], 0.1, prob=0.01),
            upd("c1", [0.0, 2.0], 0.1),
            upd("c2", [1.0, 0.0], 0.2),
            upd("c3", [3.0, 4.0], 0.6),
        ]
    }
    warnings = run_bound(us, 3.0)
    np.testing.assert_allclose(us["a"][3].delta[0], [0.6, 0.8])
    for u, v in zip(us["a"][:3], ([1.0, 0.0], [0.0, 2.0], [1.0, 0.0])):
        np.testing.assert_array_equal(u.delta[0], v)
    assert warnings == [
        "Client c3: clipped update for task 'a': its influence on the expected step (data "
        "share 0.6 x update norm 5 = 3) exceeds 0.6 (3 x the round's reference, 0.2); "
        "update norm scaled to 1"
    ]


def test_off_without_a_factor_and_with_one_update():
    """No factor (the default): nothing moves. One update of a model: no reference,
    untouched. Two updates whose influences are within the factor: untouched."""
    us = {"a": [upd("c0", [100.0], 0.9), upd("c1", [1.0], 0.1)]}
    assert run_bound(us, None) == []
    np.testing.assert_array_equal(us["a"][0].delta[0], [100.0])
    lone = {"a": [upd("c0", [100.0], 0.9)]}
    assert run_bound(lone, 1.0) == []
    np.testing.assert_array_equal(lone["a"][0].delta[0], [100.0])
    even = {"a": [upd("c0", [2.0], 0.5), upd("c1", [1.0], 0.5)]}  # 1.0 and 0.5: lower median 0.5
    assert run_bound(even, 2.0) == []
    np.testing.assert_array_equal(even["a"][0].delta[0], [2.0])


def test_a_non_finite_influence_leaves_the_model_unbounded_and_says_why(caplog):
    """A NaN norm (the norm bounds reject such updates before this runs; here it
    is given directly): no reference can be read, nothing is scaled, and the INFO
    line gives that reason, not the count of positive influences."""
    import logging as _logging

    us = {"a": [upd("c0", [float("nan")], 0.5), upd("c1", [50.0], 0.2)]}
    with caplog.at_level(_logging.INFO, logger="flwr"):
        assert run_bound(us, 1.0) == []
    np.testing.assert_array_equal(us["a"][1].delta[0], [50.0])
    assert any(
        "task 'a' not bounded this round (a share or norm is not finite)" in r.getMessage()
        for r in caplog.records
    )


def test_in_a_stalevr_run_no_fresh_update_moves_the_expected_step_beyond_the_bound(monkeypatch):
    """A real StaleVR run with the influence bound at 1 and client 3 sending -10x
    its update: in every round and model, every fresh update the policy draws
    from, every counted update the aggregate and the stale store take, and every
    fresh update the aggregator reads for beta holds ``d ||G|| <= 1 x`` the lower
    median of the fresh ``d ||G||`` (scaling the ones above it leaves the median
    where it was), and client 3 is named for it in the log. Before the bound, the
    counted weights' bound left ``d ||G||`` up to several times the median (the
    test failed); run after the draw, it would leave the counted updates and the
    reads beta takes unbounded (they are copies made by the draw)."""
    import mmfl_flwr.strategy.aggregate as A
    from mmfl_flwr import runner
    from mmfl_flwr.testing import hostile as H

    original_round = A.aggregate_round
    ratios: list[float] = []

    def round_spy(run_state, aggregator, plan, outcome, updates, shares, fresh=None):
        for task, us in outcome.updates.items():
            if len(us) < 2:
                continue
            x = [u.data_share * l2_norm(u.delta) for u in us]
            ref = float(np.percentile([v for v in x if v > 0], 50, method="lower"))
            read = [u.data_share * l2_norm(fresh[task][u.cid]) for u in us]
            counted = [u.data_share * l2_norm(u.delta) for u in updates[task]]
            ratios.append(max(x + read + counted) / ref)
        return original_round(run_state, aggregator, plan, outcome, updates, shares, fresh)

    monkeypatch.setattr(A, "aggregate_round", round_spy)
    tap = LogTap()
    logger = logging.getLogger("flwr")
    logger.addHandler(tap)
    try:
        runner.run_inprocess(
            Settings(
                strategy="stalevr",
                tasks="digits,synthetic",
                num_clients=12,
                num_rounds=3,
                local_epochs=1,
                output_dir="",
                seed=5,
                influence_clip_factor=1.0,
            ),
            wrap_client_app=H.scaled_update("3", -10.0),
        )
    finally:
        logger.removeHandler(tap)
    assert len(ratios) == 6  # two models, three rounds
    assert max(ratios) <= 1.0 + 1e-9
    assert any(
        m.startswith("Client 3: clipped update for task") and "influence on the expected step" in m
        for _, m in tap.records
    )
