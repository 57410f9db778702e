"""Each hostile-client attack of :mod:`mmfl_flwr.testing.hostile`, run through
the public API (the app's ClientApp on :class:`~mmfl_flwr.grid.InProcessGrid`,
real torch training on the embedded tasks): the bound that answers it acts, its
log line names the hostile client, the models stay finite, and the honest
clients' updates still aggregate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import LogTap

from mmfl_flwr.config import Settings
from mmfl_flwr.runner import run_inprocess
from mmfl_flwr.testing import hostile as H

HOSTILE = "3"


def run_attack(attack, strategy="mfa-rr", **kw):
    s = Settings(strategy=strategy, tasks="digits,synthetic", num_clients=8, num_rounds=3,
                 local_epochs=1, output_dir="", seed=2, **kw)
    with LogTap.on_flwr() as tap:
        result = run_inprocess(s, wrap_client_app=attack)
    return result, tap.warnings()


def mine(warnings, *words):
    return [m for m in warnings
            if m.startswith(f"Client {HOSTILE}:") and all(w in m for w in words)]


def assert_sane(result):
    for row in result.history:
        assert math.isfinite(row["loss"]) and math.isfinite(row["step_l1"])
    for rec in result.arrays.values():
        for arr in rec.values():
            assert np.isfinite(arr.numpy()).all()
    later = [r for r in result.history if r["round"] > 0]
    assert sum(r["uploads"] for r in later) > 0


@pytest.mark.parametrize("attack, words", [
    (H.huge_weights(HOSTILE), ("rejected update", "update norm", "reference norm")),
    (H.scaled_update(HOSTILE, 1e6), ("rejected update", "update norm", "reference norm")),
])
def test_huge_updates_are_rejected_and_named(attack, words):
    result, warnings = run_attack(attack)
    # MFA-RR with every client in every round: the hostile update is rejected in
    # each of the 3 rounds, and no honest update is (the default clip may trim
    # an honest one at the edge of the spread: here a synthetic user at 4.0 x
    # its reference; tests/strategy/test_update_clipping.py)
    assert len(mine(warnings, *words)) == 3
    assert [m for m in warnings if "rejected update" in m
            and not m.startswith(f"Client {HOSTILE}:")] == []
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
    result, warnings = run_attack(H.lying_loss(HOSTILE, 1e5), strategy="lvr",
                                  budget_fraction=0.3)
    assert mine(warnings, "loss", "capped")
    assert_sane(result)


def test_ucb_training_losses_are_capped_and_named():
    result, warnings = run_attack(H.lying_loss(HOSTILE, 1e5), strategy="ranklist-ucb",
                                  clients_per_round=3)
    assert mine(warnings, "training loss", "capped")
    assert_sane(result)
