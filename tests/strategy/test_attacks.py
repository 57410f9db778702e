"""Each hostile-client attack of :mod:`mmfl_flwr.testing.hostile`, run through
the public API (the app's ClientApp on :class:`~mmfl_flwr.grid.InProcessGrid`,
real torch training on the embedded tasks): the bound that answers it acts, its
log line names the hostile client, the models stay finite, and the honest
clients' updates still aggregate."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from conftest import LogTap

from mmfl_flwr.config import Settings
from mmfl_flwr.runner import run_inprocess
from mmfl_flwr.testing import hostile as H

HOSTILE = "3"


def run_attack(attack, strategy="mfa-rr", client_hook=None, **kw):
    kw = dict(dict(num_rounds=3), **kw)
    s = Settings(
        strategy=strategy,
        tasks="digits,synthetic",
        num_clients=8,
        local_epochs=1,
        output_dir="",
        seed=2,
        **kw,
    )
    with LogTap.on_flwr() as tap:
        result = run_inprocess(s, wrap_client_app=attack, client_hook=client_hook)
    # the lines naming what the server did: WARNING, and each bound's action at DEBUG
    return result, [m for lvl, m in tap.records if lvl == logging.DEBUG or lvl >= logging.WARNING]


def mine(warnings, *words):
    return [
        m for m in warnings if m.startswith(f"Client {HOSTILE}:") and all(w in m for w in words)
    ]


def assert_sane(result):
    for row in result.history:
        assert math.isfinite(row["loss"]) and math.isfinite(row["step_l1"])
    for rec in result.arrays.values():
        for arr in rec.values():
            assert np.isfinite(arr.numpy()).all()
    later = [r for r in result.history if r["round"] > 0]
    assert sum(r["uploads"] for r in later) > 0


@pytest.mark.parametrize(
    "attack, words",
    [
        (H.huge_weights(HOSTILE), ("rejected update", "update norm", "reference norm")),
        (H.scaled_update(HOSTILE, 1e6), ("rejected update", "update norm", "reference norm")),
    ],
)
def test_huge_updates_are_rejected_and_named(attack, words):
    result, warnings = run_attack(attack)
    # MFA-RR with every client in every round: the hostile update is rejected in
    # each of the 3 rounds, and no honest update is (the default clip may trim
    # an honest one at the edge of the spread: here a synthetic user at 4.0 x
    # its reference; tests/strategy/test_update_clipping.py)
    assert len(mine(warnings, *words)) == 3
    assert [
        m for m in warnings if "rejected update" in m and not m.startswith(f"Client {HOSTILE}:")
    ] == []
    assert sum(r["rejected"] for r in result.history) == 3
    assert_sane(result)


def test_inflated_registration_count_is_capped_and_named():
    result, warnings = run_attack(H.inflated_count(HOSTILE, 10**8))
    assert mine(warnings, "declared 100000000 examples", "are used")
    assert_sane(result)


def test_inflated_train_reply_count_is_rejected_and_named():
    result, warnings = run_attack(H.inflated_count(HOSTILE, 10**6, at_registration=False))
    assert mine(warnings, "rejected update", "exceeds")
    assert all(r["rejected"] <= 1 for r in result.history)
    assert_sane(result)


def test_replayed_reply_is_ignored_and_named():
    result, warnings = run_attack(H.replay(HOSTILE), strategy="full")
    assert len(mine(warnings, "answers round '1'")) == 2  # rounds 2 and 3
    assert_sane(result)


def test_lying_losses_are_capped_and_named():
    result, warnings = run_attack(H.lying_loss(HOSTILE, 1e5), strategy="lvr", budget_fraction=0.3)
    assert mine(warnings, "loss", "capped")
    assert_sane(result)


def test_ucb_training_losses_are_capped_and_named():
    result, warnings = run_attack(
        H.lying_loss(HOSTILE, 1e5), strategy="ranklist-ucb", clients_per_round=3
    )
    assert mine(warnings, "training loss", "capped")
    assert_sane(result)


def test_a_scaled_update_is_clipped_and_named_with_its_model_and_no_honest_client_is_rejected():
    """x50 under the 100x rejection bound: every part client 3 trains is
    clipped (3 x the reference norm) and the log names it with the model; no
    honest client is rejected (the attack is contained without blaming them)."""
    result, warnings = run_attack(H.scaled_update(HOSTILE, 50.0))
    parts = [
        (rnd, task)
        for rnd, picks in result.assignments.items()
        for cid, task, _ in picks
        if cid == HOSTILE
    ]
    clipped = mine(warnings, "clipped update", "3 x the reference norm")
    assert len(parts) == 3 and len(clipped) == len(parts)
    assert sorted(m.split("'")[1] for m in clipped) == sorted(t for _, t in parts)
    assert [m for m in warnings if "rejected" in m] == []
    assert_sane(result)


def test_an_attack_on_one_model_leaves_the_other_models_run_unchanged():
    """Isolation under MFA-RR: client 3 scales only its synthetic updates (x50,
    then -10x); the digits model's history is the honest run's, round by round."""
    honest, _ = run_attack(None)
    for attack in (
        H.scaled_update(HOSTILE, 50.0, {"synthetic"}),
        H.scaled_update(HOSTILE, -10.0, {"synthetic"}),
    ):
        attacked, warnings = run_attack(attack)
        assert mine(warnings, "clipped update for task 'synthetic'")
        assert mine(warnings, "'digits'") == []
        rows = [
            (r["round"], r["accuracy"], r["loss"]) for r in honest.history if r["task"] == "digits"
        ]
        assert rows == [
            (r["round"], r["accuracy"], r["loss"])
            for r in attacked.history
            if r["task"] == "digits"
        ]


def test_a_loss_liar_on_one_model_takes_at_most_its_processors_from_the_other_under_lvr(
    monkeypatch,
):
    """Isolation under LVR, in a real run: client 3 reports 1e5 x its synthetic
    losses (capped by the loss cap). In every round, the digits model's expected
    uploads under the probabilities the policy used are at least those it
    would have had with client 3's synthetic loss at 0 or at the others'
    median, minus client 3's processor count and the stated 0.15
    (tests/core/test_model_isolation.py holds the property on random
    federations)."""
    from mmfl_flwr.core import lvr
    from mmfl_flwr.core.policy import data_shares, eligibility_view, resolve_budget

    calls = []
    original = lvr.LVR.probabilities

    def recording(self, table, tasks):
        ids, p, procs = original(self, table, tasks)
        _, n, _, losses = eligibility_view(table, tasks)
        m = resolve_budget(self.budget, self.budget_fraction, int(procs.sum()))
        calls.append((ids, list(tasks), losses, data_shares(n), procs, m, self.floor, p))
        return ids, p, procs

    monkeypatch.setattr(lvr.LVR, "probabilities", recording)
    result, warnings = run_attack(
        H.lying_loss(HOSTILE, 1e5, tasks={"synthetic"}), strategy="lvr", num_rounds=4
    )
    assert mine(warnings, "'synthetic' capped")
    assert mine(warnings, "'digits'") == []
    assert_sane(result)
    assert len(calls) >= 4
    for ids, tasks, losses, d, procs, m, floor, p in calls:
        j, s, t = ids.index(HOSTILE), tasks.index("synthetic"), tasks.index("digits")
        digits = float((p[t] * procs).sum())
        others = np.delete(losses[s], j)
        for v in (0.0, float(np.nanmedian(others))):
            honest = losses.copy()
            honest[s, j] = v
            q = lvr.lvr_probabilities(honest, d, procs, m, floor)
            assert digits >= float((q[t] * procs).sum()) - procs[j] - 0.15


def test_label_flipping_reaches_the_run_through_client_hook():
    """run_inprocess(client_hook=label_flipping(...)): client 3 trains digits on
    flipped labels; the digits model's run differs from the honest one, the
    synthetic model's does not (MFA-RR reads no losses), nothing is NaN."""
    honest, _ = run_attack(None)
    flipped, _ = run_attack(None, client_hook=H.label_flipping(HOSTILE, tasks={"digits"}))
    assert_sane(flipped)

    def rows(result, task):
        return [(r["round"], r["accuracy"], r["loss"]) for r in result.history if r["task"] == task]

    assert rows(flipped, "digits") != rows(honest, "digits")
    assert rows(flipped, "synthetic") == rows(honest, "synthetic")


def test_attack_helpers_by_hand():
    """ALIE's z of Baruch et al. for 12 clients: s = 7 - f, z = Phi^-1((12 - s) / 12):
    f = 1 -> Phi^-1(0.5) = 0; f = 3 -> Phi^-1(8/12) = 0.4307."""
    assert H.alie_z(12, 1) == pytest.approx(0.0, abs=1e-12)
    assert H.alie_z(12, 3) == pytest.approx(0.430727, abs=1e-6)
    with pytest.raises(ValueError):
        H.alie_z(12, 12)


@pytest.mark.slow
def test_a_flipper_is_shrunk_by_the_direction_check_and_named_and_no_honest_client_is():
    """StaleVR, the attack-family benchmark's federation (12 clients, 5 local
    epochs): client 3 sends -10 x its update every round. The norm clip takes
    it to 3 x the reference norm; from the round its mean cosine with the
    others' median is an outlier, the direction check shrinks its digits
    updates to the reference norm and names it with the model. No honest
    client is shrunk or rejected; synthetic (whose clients do not agree on a
    direction) is never judged."""
    s = Settings(
        strategy="stalevr",
        tasks="digits,synthetic",
        num_clients=12,
        num_rounds=5,
        local_epochs=5,
        output_dir="",
        seed=1,
    )
    with LogTap.on_flwr() as tap:
        result = run_inprocess(s, wrap_client_app=H.scaled_update(HOSTILE, -10.0))
    warnings = [m for lvl, m in tap.records if lvl == logging.DEBUG or lvl >= logging.WARNING]
    # the direction check's own lines (DEBUG), not the WARNING that sums them up
    turned = [
        m for lvl, m in tap.records if lvl == logging.DEBUG and "its updates point against" in m
    ]
    assert any(m.startswith(f"Client {HOSTILE}: its updates point against") for m in warnings)
    assert turned and all(
        m.startswith(f"Client {HOSTILE}: clipped update for task 'digits'") for m in turned
    )
    assert [m for m in warnings if "rejected" in m] == []
    assert_sane(result)
