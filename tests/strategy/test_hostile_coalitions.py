"""Min-Max and Min-Sum (Shejwalkar and Houmansadr, NDSS 2021), the coalition attacks of
issue 60's field: the halving search against a brute-force scan of the constraint, and
what a colluder sends on a fake ClientApp whose honest updates are known."""

from __future__ import annotations

import numpy as np
import pytest
from test_hostile_helpers import STEPS, honest, train

from mmfl_flwr.testing import hostile as H


def scan(benign: np.ndarray, direction: np.ndarray, rule: str) -> float:
    """The largest gamma on a fine grid whose update satisfies the rule (independent of
    the halving search: every grid point is tested)."""
    mean = benign.mean(0)
    diff = benign[:, None] - benign[None]
    pair = np.sqrt(np.square(diff).sum(-1))
    ok = 0.0
    for g in np.linspace(0, 19.99, 20_000):
        d2 = np.square(benign - (mean + g * direction)).sum(-1)
        if rule == "min-max":
            inside = np.sqrt(d2.max()) <= pair.max()
        else:
            inside = d2.sum() <= np.square(pair).sum(1).max()
        if inside:
            ok = g
    return ok


@pytest.mark.parametrize("rule", ["min-max", "min-sum"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_halving_search_finds_the_largest_gamma_the_rule_allows(rule, seed):
    rng = np.random.default_rng(seed)
    benign = rng.normal(size=(5, 8)) * 0.3 + rng.normal(size=8)
    direction = -benign.std(0)
    got = H.agr_gamma(benign, direction, rule)
    assert got == pytest.approx(scan(benign, direction, rule), abs=2e-3)
    assert got > 0


def test_one_benign_update_has_no_spread_to_hide_in():
    assert H.agr_gamma(np.ones((1, 3)), -np.ones(3), "min-max") == 0.0


def test_a_colluder_sends_the_mean_plus_gamma_times_minus_std_of_what_it_knows():
    """Colluder 3 first knows only itself: no spread, gamma 0, its own update. Colluder 7
    then knows both honest updates: mean - gamma * std with the search's gamma."""
    app = H.min_max(["3", "7"])(honest(STEPS))
    np.testing.assert_allclose(train(app, "3")["a"], STEPS["3"], rtol=1e-5)
    benign = np.stack([STEPS["3"], STEPS["7"]]).astype(np.float64)
    d = -benign.std(0)
    want = benign.mean(0) + H.agr_gamma(benign, d, "min-max") * d
    np.testing.assert_allclose(train(app, "7")["a"], want, rtol=1e-5, atol=1e-7)
    # and its distance to each benign update is within their pairwise distance
    far = np.linalg.norm(benign - want, axis=1).max()
    assert far <= np.linalg.norm(STEPS["3"] - STEPS["7"]) + 1e-6


def test_min_sum_and_the_other_perturbations_are_wired():
    for attack in (H.min_sum(["3", "7"]), H.min_max(["3", "7"], "unit")):
        app = attack(honest(STEPS))
        train(app, "3")
        got = train(app, "7")["a"]
        assert not np.allclose(got, STEPS["7"])  # it lies
        assert np.all(np.isfinite(got))
    with pytest.raises(ValueError, match="perturbation"):
        H.min_max(["3"], "cosine")


# ------------------------------------------------- the field benchmark's coalitions
def _field():
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(bench))
    import hostile_clients as HC

    return HC


def test_every_field_attack_is_built_with_its_colluders():
    HC = _field()
    for name in HC.FIELD:
        made = HC._field_attack(name) or HC._field_hook(name)
        assert made is not None, name
    assert HC._attackers("alie2-z1.5") == {"3", "7"}
    assert HC._attackers("alie1-z3") == {"3"}
    for name in ("ipm2-f3", "minmax3", "minsum3", "alie3-z1", "lflip3@synthetic"):
        assert HC._attackers(name) == {"3", "7", "9"}, name
    assert HC._attackers("x50") == {"3"}


@pytest.mark.slow
def test_a_min_max_coalition_runs_in_the_field_and_no_model_becomes_nan():
    import logging

    HC = _field()
    flwr = logging.getLogger("flwr")
    before = (flwr.level, [(h, h.level) for h in flwr.handlers])
    row = HC._field_run(("mfa-rr", "default", "minmax3", 0))
    # the run leaves this process's logging as it was (later tests read the log)
    assert (flwr.level, [(h, h.level) for h in flwr.handlers]) == before
    assert set(row["accuracy"]) == {"digits", "synthetic"}
    assert all(0.0 <= a <= 1.0 for a in row["accuracy"].values())
