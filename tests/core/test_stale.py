"""Tests of the stale-update aggregators (paper 003, Section 5, Eq. 17-21).

Hand-computed numbers (the arithmetic is in the comments) for Eq. 17 (FedStale,
FedVARP), MIFA, MMFL-StaleVR (Eq. 18 + 20) and the StaleVRE schedule (Eq. 21 as
settled in shared/notes/algorithms.md); Monte Carlo unbiasedness checks over a
small heterogeneous federation with a standard-error tolerance; the StaleStore
storage kinds and its memory formula; and short runs of the stale presets on the
in-process engine.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from mmfl_flwr.core import LVR, ClientInfo, ClientTable, RandomAllocation, Update
from mmfl_flwr.core.stale import (
    FedStaleAggregator,
    FedVARPAggregator,
    MIFAAggregator,
    StaleStore,
)
from mmfl_flwr.core.stalevr import StaleVRAggregator, StaleVREAggregator, optimal_stale_beta

T = "t"


def upd(cid, delta, d, b=1, p=1.0, count=1, n=1):
    return Update(
        cid=cid,
        delta=[np.asarray(a, dtype=np.float64) for a in delta],
        num_examples=n,
        data_share=d,
        processors=b,
        prob=p,
        count=count,
    )


def vec(*x):
    return [np.array(x, dtype=np.float64)]


# ====================================================================== Eq. 20


class TestOptimalStaleBeta:
    def test_hand_values_over_several_arrays(self):
        # <G, h> = 1*1 + 2*0 + 3*1 = 4 ; ||h||^2 = 1 + 0 + 1 = 2 ; beta = 2
        g = [np.array([1.0, 2.0]), np.array([[3.0]])]
        h = [np.array([1.0, 0.0]), np.array([[1.0]])]
        assert optimal_stale_beta(g, h) == pytest.approx(2.0, abs=1e-15)
        # <G, h> = 2 - 1 + 0 = 1 ; ||h||^2 = 3 ; beta = 1/3
        assert optimal_stale_beta([np.array([2.0, -1.0, 0.0])], [np.ones(3)]) == pytest.approx(
            1 / 3, abs=1e-15
        )
        # three arrays: <G,h> = (1*2 + 1*0) + 2*1 + (0*0 + 4*2) = 12 ; ||h||^2 = 4+1+4 = 9
        g3 = [np.array([1.0, 1.0]), np.array([2.0]), np.array([0.0, 4.0])]
        h3 = [np.array([2.0, 0.0]), np.array([1.0]), np.array([0.0, 2.0])]
        assert optimal_stale_beta(g3, h3) == pytest.approx(4 / 3, abs=1e-15)
        # opposite direction: <G,h> = -6 ; ||h||^2 = 4 + 16 = 20 -> -0.3 (not clipped)
        assert optimal_stale_beta([np.array([-1.0, -1.0])], [np.array([2.0, 4.0])]) == (
            pytest.approx(-0.3, abs=1e-15)
        )
        # float32 inputs are accumulated in float64
        g32 = [np.array([1.0, 2.0], np.float32)]
        h32 = [np.array([3.0, 4.0], np.float32)]
        # (3 + 8) / (9 + 16) = 11/25 = 0.44
        assert optimal_stale_beta(g32, h32) == pytest.approx(0.44, abs=1e-12)

    def test_zero_stale_gives_zero(self):
        g = [np.array([1.0, 2.0]), np.array([5.0])]
        h = [np.zeros(2), np.zeros(1)]
        assert optimal_stale_beta(g, h) == 0.0
        assert optimal_stale_beta([np.zeros(3)], [np.zeros(3)]) == 0.0

    def test_shape_mismatch_raises(self):
        with pytest.raises(ValueError, match="shape"):
            optimal_stale_beta([np.zeros(3)], [np.zeros(4)])
        with pytest.raises(ValueError, match="shape"):
            optimal_stale_beta([np.zeros((2, 3))], [np.zeros((3, 2))])
        with pytest.raises(ValueError):
            optimal_stale_beta([np.zeros(3), np.zeros(2)], [np.zeros(3)])

    @pytest.mark.parametrize("seed", range(5))
    def test_is_the_argmin_of_the_residual(self, seed):
        rng = np.random.default_rng(seed)
        shapes = [(3, 4), (5,), (2, 2, 2)]
        h = [rng.normal(size=s) for s in shapes]
        g = [0.7 * a + rng.normal(scale=0.5, size=a.shape) for a in h]

        def residual(beta):
            return sum(float(np.square(a - beta * b).sum()) for a, b in zip(g, h))

        best = minimize_scalar(residual, bracket=(-5.0, 5.0), tol=1e-12)
        beta = optimal_stale_beta(g, h)
        assert beta == pytest.approx(best.x, abs=1e-6)
        # and no beta on a grid does better
        grid = np.linspace(beta - 1, beta + 1, 201)
        assert residual(beta) <= min(residual(b) for b in grid) + 1e-12


# =============================================================== Eq. 17 / MIFA

# Three clients of one task:  d = (a .5, b .3, c .2),  B = (a 1, b 2, c 1).
SHARES = {"a": 0.5, "b": 0.3, "c": 0.2}
W0 = vec(10.0, 10.0)


def round1_updates():
    """Round 1 fills h: h_a = [2,0], h_b = [0,4], h_c = [2,2].

    Coefficients d l / (B p):  a .5*1/(1*1) = .5 ; b .3*2/(2*.5) = .6 ; c .2*1/(1*1) = .2
    Delta = .5*[2,0] + .6*[0,4] + .2*[2,2] = [1,0] + [0,2.4] + [.4,.4] = [1.4, 2.8]
    w1 = [10,10] - [1.4,2.8] = [8.6, 7.2]   (h = 0 before, so any beta gives this)
    """
    return [
        upd("a", vec(2, 0), 0.5, b=1, p=1.0),
        upd("b", vec(0, 4), 0.3, b=2, p=0.5, count=2),
        upd("c", vec(2, 2), 0.2, b=1, p=1.0),
    ]


W1 = [8.6, 7.2]


def round2_updates():
    """Round 2: a and c sampled.  a: G=[4,2], B=1, p=.5 -> coefficient .5/(.5) = 1
    c: G=[1,-1], B=1, p=.25 -> coefficient .2/.25 = .8 ; b not sampled."""
    return [
        upd("a", vec(4, 2), 0.5, b=1, p=0.5),
        upd("c", vec(1, -1), 0.2, b=1, p=0.25),
    ]


class TestEq17:
    @pytest.mark.parametrize(
        "make, expected",
        [
            # beta = .5:
            #   stale  .5 * (.5[2,0] + .3[0,4] + .2[2,2]) = .5 * [1.4, 1.6] = [.7, .8]
            #   a      1 * ([4,2] - .5[2,0])  = [3, 2]
            #   c      .8 * ([1,-1] - .5[2,2]) = .8 * [0,-2] = [0, -1.6]
            #   Delta = [3.7, 1.2] ; w2 = [8.6-3.7, 7.2-1.2] = [4.9, 6.0]
            (lambda: FedStaleAggregator(beta=0.5), [4.9, 6.0]),
            # beta = 1 (FedVARP):
            #   stale  [1.4, 1.6]
            #   a      [4,2] - [2,0] = [2, 2]
            #   c      .8 * ([1,-1] - [2,2]) = .8 * [-1,-3] = [-.8, -2.4]
            #   Delta = [2.6, 1.2] ; w2 = [6.0, 6.0]
            (FedVARPAggregator, [6.0, 6.0]),
            (lambda: FedStaleAggregator(beta=1.0), [6.0, 6.0]),
        ],
    )
    def test_hand_example(self, make, expected):
        agg = make()
        w1 = agg.aggregate(T, W0, round1_updates(), 1, shares=SHARES)
        np.testing.assert_allclose(w1[0], W1, rtol=0, atol=1e-12)
        assert sorted(agg.store.keys()) == [("a", T), ("b", T), ("c", T)]
        w2 = agg.aggregate(T, w1, round2_updates(), 2, shares=SHARES)
        np.testing.assert_allclose(w2[0], expected, rtol=0, atol=1e-12)
        # h refreshed only for the sampled clients a and c; b keeps its round-1 update
        np.testing.assert_array_equal(agg.store.get("a", T)[0], [4, 2])
        np.testing.assert_array_equal(agg.store.get("b", T)[0], [0, 4])
        np.testing.assert_array_equal(agg.store.get("c", T)[0], [1, -1])
        # inputs untouched
        np.testing.assert_array_equal(W0[0], [10, 10])

    def test_fedvarp_is_beta_one_and_beta_validated(self):
        assert FedVARPAggregator().beta == 1.0
        for bad in (-0.1, 1.5):
            with pytest.raises(ValueError):
                FedStaleAggregator(beta=bad)

    def test_beta_zero_is_the_unbiased_rule(self):
        # beta = 0: Delta = a 1*[4,2] + c .8*[1,-1] = [4.8, 1.2] ; w2 = [3.8, 6.0]
        agg = FedStaleAggregator(beta=0.0)
        w1 = agg.aggregate(T, W0, round1_updates(), 1, shares=SHARES)
        w2 = agg.aggregate(T, w1, round2_updates(), 2, shares=SHARES)
        np.testing.assert_allclose(w2[0], [3.8, 6.0], rtol=0, atol=1e-12)

    def test_no_update_round_still_applies_the_stale_term(self):
        # FedVARP, round 2 without any sampled client: Delta = [1.4, 1.6]
        agg = FedVARPAggregator()
        w1 = agg.aggregate(T, W0, round1_updates(), 1, shares=SHARES)
        w2 = agg.aggregate(T, w1, [], 2, shares=SHARES)
        np.testing.assert_allclose(w2[0], [8.6 - 1.4, 7.2 - 1.6], rtol=0, atol=1e-12)

    def test_prob_zero_rejected(self):
        agg = FedVARPAggregator()
        with pytest.raises(ValueError, match="prob"):
            agg.aggregate(T, W0, [upd("a", vec(1, 1), 0.5, p=0.0)], 1, shares=SHARES)


class TestMIFA:
    def test_two_rounds_by_hand(self):
        agg = MIFAAggregator()
        # Round 1: a and b train, c never seen (contributes 0); prob is ignored.
        #   Delta = .5*[2,0] + .3*[0,4] = [1, 1.2] ; w1 = [9, 8.8]
        r1 = [upd("a", vec(2, 0), 0.5, p=0.1), upd("b", vec(0, 4), 0.3, b=2, p=0.1)]
        w1 = agg.aggregate(T, W0, r1, 1, shares=SHARES)
        np.testing.assert_allclose(w1[0], [9.0, 8.8], rtol=0, atol=1e-12)
        # Round 2: a (G=[4,2]) and c (G=[2,2]) train; b uses its stale h_b = [0,4].
        #   Delta = .5*[4,2] + .3*[0,4] + .2*[2,2] = [2,1] + [0,1.2] + [.4,.4] = [2.4, 2.6]
        #   w2 = [9-2.4, 8.8-2.6] = [6.6, 6.2]
        r2 = [upd("a", vec(4, 2), 0.5, p=0.3), upd("c", vec(2, 2), 0.2, p=0.7)]
        w2 = agg.aggregate(T, w1, r2, 2, shares=SHARES)
        np.testing.assert_allclose(w2[0], [6.6, 6.2], rtol=0, atol=1e-12)
        # Round 3: nobody trains: Delta = .5*[4,2] + .3*[0,4] + .2*[2,2] = [2.4, 2.6] again
        w3 = agg.aggregate(T, w2, [], 3, shares=SHARES)
        np.testing.assert_allclose(w3[0], [4.2, 3.6], rtol=0, atol=1e-12)

    def test_uploaded_start_by_hand(self):
        """``start="uploaded"``: the same rounds as above, each divided by the data
        share of the pairs that have uploaded (round 1: a and b, 0.8)."""
        agg = MIFAAggregator(start="uploaded")
        r1 = [upd("a", vec(2, 0), 0.5, p=0.1), upd("b", vec(0, 4), 0.3, b=2, p=0.1)]
        # coefficients of the fresh updates: (.5 + .3) / .8 = 1 (zero start: .8)
        assert agg.coefficient_sum(T, r1, shares=SHARES) == pytest.approx(1.0, abs=1e-15)
        assert MIFAAggregator().coefficient_sum(T, r1, shares=SHARES) == pytest.approx(0.8)
        #   Delta = ([1, 0] + [0, 1.2]) / .8 = [1.25, 1.5] ; w1 = [8.75, 8.5]
        w1 = agg.aggregate(T, W0, r1, 1, shares=SHARES)
        np.testing.assert_allclose(w1[0], [8.75, 8.5], rtol=0, atol=1e-12)
        # Round 2: everyone has uploaded (sum d = 1): the zero start's round-2 Delta
        r2 = [upd("a", vec(4, 2), 0.5, p=0.3), upd("c", vec(2, 2), 0.2, p=0.7)]
        assert agg.coefficient_sum(T, r2, shares=SHARES) == pytest.approx(0.7)
        w2 = agg.aggregate(T, w1, r2, 2, shares=SHARES)
        np.testing.assert_allclose(w2[0], [8.75 - 2.4, 8.5 - 2.6], rtol=0, atol=1e-12)

    def test_uploaded_start_with_one_stale_pair(self):
        """Only b's stored update, a trains fresh, c never seen:
        Delta = (.5 [4, 2] + .3 [0, 4]) / .8 = [2, 2.2] / .8 = [2.5, 2.75]."""
        agg = MIFAAggregator(start="uploaded")
        agg.aggregate(T, W0, [upd("b", vec(0, 4), 0.3)], 1, shares=SHARES)  # [0,4]/.3*.3
        w = agg.aggregate(T, W0, [upd("a", vec(4, 2), 0.5)], 2, shares=SHARES)
        np.testing.assert_allclose(w[0], [10 - 2.5, 10 - 2.75], rtol=0, atol=1e-12)

    def test_uploaded_start_before_any_upload_leaves_the_model(self):
        agg = MIFAAggregator(start="uploaded")
        w = agg.aggregate(T, W0, [], 1, shares=SHARES)
        np.testing.assert_array_equal(w[0], W0[0])
        assert agg.coefficient_sum(T, [], shares=SHARES) == 0.0

    def test_the_starts_agree_once_every_pair_uploaded(self):
        rng = np.random.default_rng(3)
        shares = {"a": 0.2, "b": 0.5, "c": 0.3}
        aggs = [MIFAAggregator(), MIFAAggregator(start="uploaded")]
        ws = [W0, W0]
        first = [upd(c, [rng.normal(size=2)], d) for c, d in shares.items()]
        for _k, agg in enumerate(aggs):
            agg.aggregate(T, W0, first, 1, shares=shares)
        for rnd in range(2, 6):
            ups = [upd(c, [rng.normal(size=2)], d) for c, d in shares.items() if rng.random() < 0.5]
            ws = [agg.aggregate(T, w, ups, rnd, shares=shares) for agg, w in zip(aggs, ws)]
            np.testing.assert_allclose(ws[0][0], ws[1][0], rtol=1e-13, atol=1e-13)

    def test_an_unknown_start_is_refused(self):
        with pytest.raises(ValueError, match="start must be one of zero, uploaded"):
            MIFAAggregator(start="wait")
        assert MIFAAggregator(start="uploaded").config()["start"] == "uploaded"


# ===================================================================== StaleVR


class TestStaleVR:
    FRESH = {"a": vec(4, 2), "b": vec(1, 2), "c": vec(1, -1)}

    def _filled(self):
        agg = StaleVRAggregator()
        w1 = agg.aggregate(
            T,
            W0,
            round1_updates(),
            1,
            shares=SHARES,
            fresh={"a": vec(2, 0), "b": vec(0, 4), "c": vec(2, 2)},
        )
        np.testing.assert_allclose(w1[0], W1, rtol=0, atol=1e-12)  # h = 0: no stale term
        return agg, w1

    def test_betas_and_delta_by_hand(self):
        agg, w1 = self._filled()
        # residual signal before the round (h as after round 1):
        #   a: beta = <[4,2],[2,0]>/4 = 2 ; ||[4,2] - 2[2,0]|| = ||[0,2]|| = 2
        #   b: beta = <[1,2],[0,4]>/16 = .5 ; ||[1,2] - .5[0,4]|| = ||[1,0]|| = 1
        #   c: beta = <[1,-1],[2,2]>/8 = 0 ; ||[1,-1]|| = sqrt 2
        assert agg.residual_norm(T, "a", self.FRESH["a"]) == pytest.approx(2.0, abs=1e-12)
        assert agg.residual_norm(T, "b", self.FRESH["b"]) == pytest.approx(1.0, abs=1e-12)
        assert agg.residual_norm(T, "c", self.FRESH["c"]) == pytest.approx(math.sqrt(2), abs=1e-12)
        # a pair without h: ||G|| = ||[3,4]|| = 5
        assert agg.residual_norm(T, "zed", vec(3, 4)) == pytest.approx(5.0, abs=1e-12)
        # Round 2, sampled a (B=1, p=.5: coefficient 1) and b (B=2, p=.25, l=1: .3/(2*.25) = .6)
        #   z_a = 2[2,0] = [4,0] ; z_b = .5[0,4] = [0,2] ; z_c = 0
        #   stale term  .5[4,0] + .3[0,2] + .2*0 = [2, .6]
        #   a  1 * ([4,2] - [4,0]) = [0, 2]
        #   b  .6 * ([1,2] - [0,2]) = [.6, 0]
        #   Delta = [2.6, 2.6] ; w2 = [8.6-2.6, 7.2-2.6] = [6.0, 4.6]
        ups = [upd("a", self.FRESH["a"], 0.5, p=0.5), upd("b", self.FRESH["b"], 0.3, b=2, p=0.25)]
        w2 = agg.aggregate(T, w1, ups, 2, shares=SHARES, fresh=self.FRESH)
        np.testing.assert_allclose(w2[0], [6.0, 4.6], rtol=0, atol=1e-12)
        assert agg.last_betas == pytest.approx({("a", T): 2.0, ("b", T): 0.5, ("c", T): 0.0})
        # h refreshed for a and b only (the sampled, uploaded pairs), not for c
        np.testing.assert_array_equal(agg.store.get("a", T)[0], [4, 2])
        np.testing.assert_array_equal(agg.store.get("b", T)[0], [1, 2])
        np.testing.assert_array_equal(agg.store.get("c", T)[0], [2, 2])

    def test_pair_without_fresh_uses_beta_zero(self):
        agg, w1 = self._filled()
        fresh = {k: v for k, v in self.FRESH.items() if k != "b"}
        # beta_b = 0 -> z_b = 0 ; stale term .5[4,0] = [2, 0]
        #   a [0, 2] ; b .6 * [1,2] = [.6, 1.2] ; Delta = [2.6, 3.2] ; w2 = [6.0, 4.0]
        ups = [upd("a", self.FRESH["a"], 0.5, p=0.5), upd("b", self.FRESH["b"], 0.3, b=2, p=0.25)]
        w2 = agg.aggregate(T, w1, ups, 2, shares=SHARES, fresh=fresh)
        np.testing.assert_allclose(w2[0], [6.0, 4.0], rtol=0, atol=1e-12)
        assert agg.last_betas[("b", T)] == 0.0
        assert agg.last_betas[("a", T)] == pytest.approx(2.0)

    def test_needs_fresh_flag(self):
        assert StaleVRAggregator.needs_fresh is True


# ==================================================================== StaleVRE


class TestStaleVREBetaSchedule:
    def test_rounds_1_4_then_5_to_10(self):
        # One client a, d = 1, B = 1, p = .5 (coefficient 2), b0 = 1.
        agg = StaleVREAggregator(b0=1.0)
        sh = {"a": 1.0}
        assert agg.beta("a", T, 1) == 0.0  # no stale update yet
        # round 1: h = 0 -> Delta = 2*[2,0] = [4,0] ; w = [6, 10]
        w = agg.aggregate(T, W0, [upd("a", vec(2, 0), 1.0, p=0.5)], 1, shares=sh)
        np.testing.assert_allclose(w[0], [6, 10], atol=1e-12)
        # rounds 2, 3 (k = 1, 2): no beta* yet -> b0 = 1 ; Delta = 1*[2,0] each
        for rnd, exp in ((2, [4, 10]), (3, [2, 10])):
            assert agg.beta("a", T, rnd) == 1.0
            w = agg.aggregate(T, w, [], rnd, shares=sh)
            np.testing.assert_allclose(w[0], exp, atol=1e-12)
        # round 4: second upload G = [1,1]; beta before it is still b0 = 1, z = [2,0]
        #   Delta = [2,0] + 2*([1,1] - [2,0]) = [2,0] + [-2,2] = [0, 2] ; w = [2, 8]
        assert agg.beta("a", T, 4) == 1.0
        w = agg.aggregate(T, w, [upd("a", vec(1, 1), 1.0, p=0.5)], 4, shares=sh)
        np.testing.assert_allclose(w[0], [2, 8], atol=1e-12)
        # beta* against the OLD h = [2,0]: <[1,1],[2,0]>/4 = .5 (against the new h it would
        # be 1) ; Delta_t = 4 - 1 = 3 ; h <- [1,1]
        assert agg.schedule[("a", T)] == [4, pytest.approx(0.5), 3]
        np.testing.assert_array_equal(agg.store.get("a", T)[0], [1, 1])
        # rounds 5..10, k = 1..6: beta = 1 - (k-1)(1 - .5)/max(3-1, 1) = 1 - .25 (k-1)
        #   -> 1, .75, .5, .25, 0, -.25 clipped to 0
        # (the authors' slope .5/3 would give .8333 at k=2: not what we want)
        expected_beta = {5: 1.0, 6: 0.75, 7: 0.5, 8: 0.25, 9: 0.0, 10: 0.0}
        for rnd, b in expected_beta.items():
            assert agg.beta("a", T, rnd) == pytest.approx(b, abs=1e-15), rnd
        # and the aggregate uses them: Delta = beta * [1,1]
        #   w: [2,8] -1-> [1,7] -.75-> [.25,6.25] -.5-> [-.25,5.75] -.25-> [-.5,5.5] -0-> -0->
        exp_w = {
            5: [1, 7],
            6: [0.25, 6.25],
            7: [-0.25, 5.75],
            8: [-0.5, 5.5],
            9: [-0.5, 5.5],
            10: [-0.5, 5.5],
        }
        for rnd in range(5, 11):
            w = agg.aggregate(T, w, [], rnd, shares=sh)
            np.testing.assert_allclose(w[0], exp_w[rnd], atol=1e-12, err_msg=str(rnd))

    def test_consecutive_uploads_slope_denominator_one_and_clipping(self):
        agg = StaleVREAggregator(b0=1.0)
        sh = {"b": 1.0}
        agg.aggregate(T, W0, [upd("b", vec(2, 0), 1.0)], 1, shares=sh)
        agg.aggregate(T, W0, [upd("b", vec(1, 1), 1.0)], 2, shares=sh)
        # beta* = <[1,1],[2,0]>/4 = .5 ; Delta_t = 1 -> denominator max(0, 1) = 1
        assert agg.schedule[("b", T)] == [2, pytest.approx(0.5), 1]
        # k = rnd - 2: beta = 1 - (k-1)*.5 -> k=1: 1, k=2: .5, k=3: 0, k=4: -.5 -> 0
        for rnd, b in ((3, 1.0), (4, 0.5), (5, 0.0), (6, 0.0), (20, 0.0)):
            assert agg.beta("b", T, rnd) == pytest.approx(b, abs=1e-15)

    def test_beta_star_above_b0_is_clipped_to_b0(self):
        agg = StaleVREAggregator(b0=1.0)
        sh = {"c": 1.0}
        agg.aggregate(T, W0, [upd("c", vec(1, 0), 1.0)], 1, shares=sh)
        agg.aggregate(T, W0, [upd("c", vec(3, 0), 1.0)], 3, shares=sh)
        # beta* = 3 ; Delta_t = 2 ; beta(k) = 1 - (k-1)(1-3)/1 = 1 + 2(k-1) -> clipped to 1
        assert agg.schedule[("c", T)] == [3, pytest.approx(3.0), 2]
        for rnd in (4, 5, 9):
            assert agg.beta("c", T, rnd) == 1.0

    def test_custom_b0_before_and_after_second_upload(self):
        agg = StaleVREAggregator(b0=0.8)
        sh = {"a": 1.0}
        agg.aggregate(T, W0, [upd("a", vec(2, 0), 1.0)], 1, shares=sh)
        assert agg.beta("a", T, 2) == 0.8 and agg.beta("a", T, 7) == 0.8
        agg.aggregate(T, W0, [upd("a", vec(1, 1), 1.0)], 4, shares=sh)
        # beta* = .5, Delta_t = 3: beta(k) = .8 - (k-1)(.8-.5)/2 = .8 - .15 (k-1)
        for k, b in ((1, 0.8), (2, 0.65), (3, 0.5), (4, 0.35), (6, 0.05), (7, 0.0)):
            assert agg.beta("a", T, 4 + k) == pytest.approx(b, abs=1e-12)
        with pytest.raises(ValueError):
            StaleVREAggregator(b0=0.0)

    def test_state_dict_round_trip_keeps_the_schedule(self):
        agg = StaleVREAggregator()
        agg.aggregate(T, W0, [upd("a", vec(2, 0), 1.0)], 1, shares={"a": 1.0})
        agg.aggregate(T, W0, [upd("a", vec(1, 1), 1.0)], 4, shares={"a": 1.0})
        other = StaleVREAggregator()
        other.load_state_dict(agg.state_dict())
        assert other.schedule == agg.schedule
        for rnd in range(5, 10):
            assert other.beta("a", T, rnd) == agg.beta("a", T, rnd)
        np.testing.assert_array_equal(other.store.get("a", T)[0], [1, 1])


# ============================================================ unbiasedness (MC)

TASKS = ["t1", "t2"]
FED = [  # cid, n per task, B_i
    ("0", {"t1": 10, "t2": 30}, 2),
    ("1", {"t1": 50}, 1),
    ("2", {"t2": 20, "t1": 5}, 3),
    ("3", {"t2": 40}, 1),
    ("4", {"t1": 20, "t2": 10}, 1),
]
NO_H = {("1", "t1"), ("3", "t2")}  # pairs that never uploaded
DIM = 3
DRAWS = 3000


def _table():
    table = ClientTable()
    rng = np.random.default_rng(5)
    for cid, n, b in FED:
        table.upsert(ClientInfo(cid, dict(n), b))
        for t in n:
            table.set_loss(cid, t, float(rng.uniform(0.2, 3.0)), 0)
    return table


def _vectors():
    rng = np.random.default_rng(11)
    g, h = {}, {}
    for cid, n, _ in FED:
        for t in n:
            g[(cid, t)] = [rng.normal(size=DIM), rng.normal(size=(2,))]
            if (cid, t) not in NO_H:
                # correlated with G, but far from it
                h[(cid, t)] = [
                    0.6 * a + rng.normal(scale=1.0, size=a.shape) + 1.5 for a in g[(cid, t)]
                ]
    return g, h


def _weights():
    return {t: [np.full(DIM, 1.0), np.array([-2.0, 3.0])] for t in TASKS}


def _expected_full(table, g, w):
    out = {}
    for t in TASKS:
        d = table.data_share(t)
        out[t] = [w[t][j] - sum(d[c] * g[(c, t)][j] for c in d) for j in range(2)]
    return out


def _prefilled(make, h):
    agg = make()
    for (cid, t), arrays in h.items():
        agg.store.set(cid, t, arrays)
    return agg


def _stalevre_state(table, g, h):
    """A StaleVRE aggregator whose pairs have a mix of schedules at round 5."""
    agg = StaleVREAggregator()
    w = _weights()
    # round 1: every pair with an h uploads an older update h1; round 3: half of them
    # upload h (beta* measured at Delta_t = 2); the others keep h1 (beta = b0 = 1).
    for t in TASKS:
        d = table.data_share(t)
        ups1 = [upd(c, [2.0 * a + 1.0 for a in h[(c, t)]], d[c]) for c in d if (c, t) in h]
        agg.aggregate(t, w[t], ups1, 1, shares=d)
        ups3 = [upd(c, h[(c, t)], d[c]) for c in d if (c, t) in h and c in ("0", "2")]
        agg.aggregate(t, w[t], ups3, 3, shares=d)
    return agg


def _mc(policy, make_agg, state, table, g, with_fresh=False, rnd=5, draws=DRAWS):
    rng = np.random.default_rng(2024)
    w = _weights()
    samples = {t: [[], []] for t in TASKS}
    shares = {t: table.data_share(t) for t in TASKS}
    fresh = {t: {c: g[(c, t)] for c in shares[t]} for t in TASKS}
    n_updates = 0
    for _ in range(draws):
        agg = make_agg()
        agg.load_state_dict(state)
        picks = policy.assign(table, TASKS, rnd, rng)
        n_updates += len(picks)
        for t in TASKS:
            info = {c: table[c] for c in shares[t]}
            ups = [
                upd(
                    p.cid,
                    g[(p.cid, t)],
                    shares[t][p.cid],
                    b=info[p.cid].processors,
                    p=p.prob,
                    count=p.count,
                )
                for p in picks
                if p.task == t
            ]
            new = agg.aggregate(
                t, w[t], ups, rnd, shares=shares[t], fresh=fresh[t] if with_fresh else None
            )
            for j in range(2):
                samples[t][j].append(new[j])
    assert n_updates > 0
    mean = {t: [np.mean(samples[t][j], axis=0) for j in range(2)] for t in TASKS}
    se = {
        t: [np.std(samples[t][j], axis=0, ddof=1) / math.sqrt(draws) for j in range(2)]
        for t in TASKS
    }
    return mean, se


POLICIES = {
    "random": lambda: RandomAllocation(budget_fraction=0.4),
    "lvr": lambda: LVR(budget=3.0),
}
UNBIASED = {
    "fedstale": (lambda: FedStaleAggregator(beta=0.5), False),
    "fedvarp": (FedVARPAggregator, False),
    "stalevr": (StaleVRAggregator, True),
    "stalevre": (StaleVREAggregator, False),
}


@pytest.mark.parametrize("policy_name", sorted(POLICIES))
@pytest.mark.parametrize("agg_name", sorted(UNBIASED))
def test_stale_rules_are_unbiased(policy_name, agg_name):
    table = _table()
    g, h = _vectors()
    make, with_fresh = UNBIASED[agg_name]
    base = _stalevre_state(table, g, h) if agg_name == "stalevre" else _prefilled(make, h)
    if agg_name == "stalevre":  # a non-trivial mix of betas (not all b0)
        betas = {base.beta(c, t, 5) for (c, t) in h}
        assert 1.0 in betas and any(0.0 < b < 1.0 for b in betas)
    state = base.state_dict()
    mean, se = _mc(POLICIES[policy_name](), make, state, table, g, with_fresh)
    exp = _expected_full(table, g, _weights())
    for t in TASKS:
        for j in range(2):
            assert (se[t][j] > 0).all(), "no sampling variance: the check would be vacuous"
            err = np.abs(mean[t][j] - exp[t][j])
            assert (err <= 5 * se[t][j] + 1e-12).all(), (
                f"{agg_name}/{policy_name} task {t} array {j}: mean {mean[t][j]} vs "
                f"full participation {exp[t][j]}, 5 stderr = {5 * se[t][j]}"
            )


def test_mifa_is_biased_and_matches_its_own_expectation():
    table = _table()
    g, h = _vectors()
    policy = RandomAllocation(budget_fraction=0.4)
    state = _prefilled(MIFAAggregator, h).state_dict()
    mean, se = _mc(policy, MIFAAggregator, state, table, g)
    ids, p, procs = policy.probabilities(table, TASKS)
    w = _weights()
    exp_full = _expected_full(table, g, w)
    biased = False
    for s, t in enumerate(TASKS):
        d = table.data_share(t)
        # E[Delta] = sum_i d_i (pi_i G_i + (1 - pi_i) h_i), pi_i = 1 - (1 - p_i)^{B_i}
        # (h_i = 0 for pairs that never uploaded)
        exp_mifa = []
        for j in range(2):
            acc = np.zeros_like(w[t][j])
            for c in d:
                i = ids.index(c)
                pi = 1.0 - (1.0 - p[s, i]) ** procs[i]
                hj = h[(c, t)][j] if (c, t) in h else 0.0
                acc += d[c] * (pi * g[(c, t)][j] + (1 - pi) * hj)
            exp_mifa.append(w[t][j] - acc)
        for j in range(2):
            np.testing.assert_array_less(np.abs(mean[t][j] - exp_mifa[j]), 5 * se[t][j] + 1e-12)
            if (np.abs(mean[t][j] - exp_full[t][j]) > 10 * se[t][j]).any():
                biased = True
    assert biased, "MIFA should not average to the full-participation update here"


# ================================================================= StaleStore

SHAPES = [(3, 4), (5,)]  # 17 parameters
N_CLIENTS, N_TASKS = 4, 3


def _fill(store, rng, low=0.01, high=10.0):
    data = {}
    for c in range(N_CLIENTS):
        for s in range(N_TASKS):
            arrays = [
                rng.uniform(low, high, size=sh) * rng.choice([-1, 1], size=sh) for sh in SHAPES
            ]
            store.set(str(c), f"task{s}", arrays)
            data[(str(c), f"task{s}")] = arrays
    return data


class TestStaleStore:
    @pytest.mark.parametrize(
        "storage, nbytes_per_param", [("float32", 4), ("float16", 2), ("disk", 4)]
    )
    def test_memory_formula_of_a_full_store(self, storage, nbytes_per_param, tmp_path):
        store = StaleStore(storage, str(tmp_path / "h") if storage == "disk" else None)
        assert store.nbytes() == 0 and len(store) == 0
        _fill(store, np.random.default_rng(0))
        # N x S x params x bytes = 4 x 3 x 17 x (4 | 2)
        assert store.nbytes() == N_CLIENTS * N_TASKS * 17 * nbytes_per_param
        assert len(store) == N_CLIENTS * N_TASKS
        # overwriting a pair does not grow the store
        store.set("0", "task0", [np.zeros(sh) for sh in SHAPES])
        assert store.nbytes() == N_CLIENTS * N_TASKS * 17 * nbytes_per_param

    def test_float32_round_trip(self):
        store = StaleStore("float32")
        data = _fill(store, np.random.default_rng(1))
        for key, arrays in data.items():
            got = store.get(*key)
            assert [a.dtype for a in got] == [np.float64, np.float64]  # float64 copies
            for a, b in zip(got, arrays):
                np.testing.assert_array_equal(a, b.astype(np.float32))
                np.testing.assert_allclose(a, b, rtol=1e-7)
        assert store.get("nobody", "task0") is None
        assert ("0", "task0") in store and ("0", "nope") not in store

    def test_float16_round_trip_within_1e3_relative(self):
        store = StaleStore("float16")
        data = _fill(store, np.random.default_rng(2))
        for key, arrays in data.items():
            for a, b in zip(store.get(*key), arrays):
                # half precision: 11 significant bits -> relative error <= 2^-11 ~ 4.9e-4
                np.testing.assert_allclose(a, b, rtol=1e-3, atol=0)
        # genuinely rounded (not stored at full precision)
        key = next(iter(data))
        assert not all(np.array_equal(a, b) for a, b in zip(store.get(*key), data[key]))

    def test_disk_writes_files_into_the_directory_and_round_trips(self, tmp_path):
        folder = tmp_path / "stale"
        store = StaleStore("disk", str(folder))
        data = _fill(store, np.random.default_rng(3))
        files = sorted(os.listdir(folder))
        assert len(files) == N_CLIENTS * N_TASKS * len(SHAPES)
        assert all(f.endswith(".npy") for f in files)
        assert sum(os.path.getsize(folder / f) for f in files) >= store.nbytes()
        for key, arrays in data.items():
            for a, b in zip(store.get(*key), arrays):
                np.testing.assert_array_equal(a, b.astype(np.float32))
        # a file holds the pair's array (it is a real .npy on disk)
        loaded = [np.load(folder / f) for f in files]
        stored = {a.astype(np.float32).tobytes() for arrays in data.values() for a in arrays}
        assert all(x.tobytes() in stored for x in loaded)
        # overwrite keeps the file count and returns the new values
        store.set("1", "task2", [np.full(sh, 7.0) for sh in SHAPES])
        assert len(os.listdir(folder)) == len(files)
        assert (store.get("1", "task2")[0] == 7.0).all()

    def test_get_returns_copies(self):
        store = StaleStore("float32")
        store.set("a", "t", [np.array([1.0, 2.0])])
        got = store.get("a", "t")
        got[0][0] = 99.0
        assert store.get("a", "t")[0][0] == 1.0
        src = [np.array([5.0])]
        store.set("b", "t", src)
        src[0][0] = -1.0
        assert store.get("b", "t")[0][0] == 5.0

    @pytest.mark.parametrize("src", ["float32", "float16", "disk"])
    @pytest.mark.parametrize("dst", ["float32", "float16", "disk"])
    def test_state_dict_round_trip(self, src, dst, tmp_path):
        a = StaleStore(src, str(tmp_path / "a") if src == "disk" else None)
        data = _fill(a, np.random.default_rng(4))
        state = a.state_dict()
        assert state["storage"] == src
        b = StaleStore(dst, str(tmp_path / "b") if dst == "disk" else None)
        b.set("stale-entry", "x", [np.ones(2)])  # replaced by the load
        b.load_state_dict(state)
        assert sorted(b.keys()) == sorted(data)
        rtol = 1e-3 if "float16" in (src, dst) else 1e-7
        for key, arrays in data.items():
            for x, y in zip(b.get(*key), arrays):
                np.testing.assert_allclose(x, y, rtol=rtol)
        if src == dst:
            for key in data:
                for x, y in zip(b.get(*key), a.get(*key)):
                    np.testing.assert_array_equal(x, y)

    @pytest.mark.filterwarnings("ignore:overflow encountered")
    def test_float16_keeps_large_finite_updates_finite(self):
        store = StaleStore("float16")
        store.set("a", "t", [np.array([7e4, -1e5, 1.0])])
        got = store.get("a", "t")[0]
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got[:2], [7e4, -1e5], rtol=1e-3)
        # and FedVARP on top of it stays finite: Delta = 1 * h = [7e4, -1e5, 1]
        agg = FedVARPAggregator(storage="float16")
        agg.store.set("a", "t", [np.array([7e4, -1e5, 1.0])])
        new = agg.aggregate("t", [np.zeros(3)], [], 2, shares={"a": 1.0})
        assert np.isfinite(new[0]).all()

    def test_invalid_storage(self):
        with pytest.raises(ValueError, match="storage"):
            StaleStore("int8")

    @pytest.mark.parametrize("storage", ["float16", "disk"])
    def test_aggregator_state_through_other_storage(self, storage, tmp_path):
        # FedVARP on the Eq. 17 example, h kept in half precision / on disk: the hand values
        # are exactly representable, so the result is the same.
        agg = FedVARPAggregator(
            storage=storage, directory=str(tmp_path) if storage == "disk" else None
        )
        w1 = agg.aggregate(T, W0, round1_updates(), 1, shares=SHARES)
        again = FedVARPAggregator(storage=storage)
        again.load_state_dict(agg.state_dict())
        w2 = again.aggregate(T, w1, round2_updates(), 2, shares=SHARES)
        np.testing.assert_allclose(w2[0], [6.0, 6.0], atol=1e-12)


# ============================================================ preset runs

STALE_PRESETS = ["stalevr", "stalevre", "fedvarp", "fedstale", "mifa"]


@pytest.mark.parametrize("strategy", STALE_PRESETS)
def test_preset_runs_inprocess_with_finite_metrics(strategy, tmp_path):
    from mmfl_flwr.config import Settings
    from mmfl_flwr.results import read_metrics_csv
    from mmfl_flwr.runner import run

    s = Settings(
        strategy=strategy,
        num_clients=8,
        num_rounds=3,
        profile="paper003",
        output_dir=str(tmp_path),
        local_epochs=1,
        budget_fraction=0.5,
    )
    result = run(s, engine="inprocess")
    rows = read_metrics_csv(tmp_path / "metrics.csv")
    assert {r["round"] for r in rows} == {0, 1, 2, 3}
    for r in rows:
        assert math.isfinite(r["accuracy"]) and 0.0 <= r["accuracy"] <= 1.0, r
        assert math.isfinite(r["loss"]) and r["loss"] >= 0, r
        assert math.isfinite(r["step_l1"]), r
        if r["uploads"] > 0:
            assert math.isfinite(r["train_loss"]), r
    assert sum(r["uploads"] for r in rows) > 0  # the stale rules were exercised
    # a round after the first upload moves the model even where nobody uploads
    # (except for no-stale pairs): at least the step is finite and some step is > 0
    assert any(r["step_l1"] > 0 for r in rows if r["round"] > 0)
    for rec in result.arrays.values():
        for arr in rec.values():
            assert np.isfinite(arr.numpy()).all()


def test_stalevr_declares_the_signal_it_samples_on(monkeypatch):
    """StaleVR samples on what it declares: with the paper's loss signal on the
    losses, with the residual signal on ||G - beta h||; neither computes ||G||
    (with the loss signal it used to be computed and thrown away). GVR, which
    samples on ||G||, computes one norm per trained pair."""
    from mmfl_flwr.config import Settings
    from mmfl_flwr.core.stalevr import StaleVRSampling
    from mmfl_flwr.runner import run
    from mmfl_flwr.strategy import aggregate

    real = aggregate.l2_norm

    def norms_of(**settings) -> int:
        calls = []
        monkeypatch.setattr(aggregate, "l2_norm", lambda arrays: calls.append(1) or real(arrays))
        run(
            Settings(
                num_clients=4,
                num_rounds=1,
                local_epochs=1,
                budget_fraction=0.5,
                output_dir="",
                **settings,
            ),
            engine="inprocess",
        )
        return len(calls)

    for signal in ("loss", "stale-residual"):
        assert StaleVRSampling(signal=signal).selection_signal == signal
        assert norms_of(strategy="stalevr", stalevr_signal=signal) == 0
    assert norms_of(strategy="gvr") == 4 * 3  # 4 clients x 3 models, one round


@pytest.mark.parametrize(
    "make",
    [FedVARPAggregator, StaleVRAggregator, StaleVREAggregator],
    ids=["fedvarp", "stalevr", "stalevre"],
)
def test_a_round_holds_one_stale_update_at_a_time(make):
    """40 clients with stored updates of 100,000 parameters (32 MB in float64), 4 of
    them fresh this round: what aggregating allocates at its peak (numpy's
    allocations, traced) stays below a quarter of the stale updates' float64 size;
    reading every client's stale update at once (and its beta h) takes twice it."""
    import tracemalloc

    n, size = 40, 100_000
    rng = np.random.default_rng(0)
    agg = make()
    w = [np.zeros(size, dtype=np.float32)]
    shares = {f"c{k}": 1 / n for k in range(n)}
    agg.aggregate(
        T,
        w,
        [upd(f"c{k}", [rng.normal(size=size)], 1 / n) for k in range(n)],
        1,
        shares=shares,
        fresh={f"c{k}": [rng.normal(size=size)] for k in range(n)},
    )
    ups = [upd(f"c{k}", [rng.normal(size=size)], 1 / n, p=0.1) for k in range(4)]
    fresh = {f"c{k}": [rng.normal(size=size)] for k in range(n)}
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        agg.aggregate(T, w, ups, 2, shares=shares, fresh=fresh)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < n * size * 8 / 4, f"peak {peak / 1e6:.1f} MB"


@pytest.mark.parametrize("storage", ["float32", "float16", "disk"])
@pytest.mark.parametrize(
    "make,sampled_reads",
    [
        (FedVARPAggregator, 2),
        (lambda **kw: FedStaleAggregator(beta=0.5, **kw), 2),
        (StaleVRAggregator, 2),
        (StaleVREAggregator, 3),
    ],
    ids=["fedvarp", "fedstale", "stalevr", "stalevre"],
)
def test_a_round_reads_each_stale_update_as_few_times_as_it_must(
    make, sampled_reads, storage, tmp_path
):
    """Reading a stale update is a float64 copy (a half-precision decode or a file read
    with float16 / disk storage), so a round reads each unsampled pair's once (its term
    ``d beta h``; Eq. 20's beta is computed from the same read) and a sampled pair's at
    most ``sampled_reads`` times (the ``d beta h`` term, the ``-beta h`` of its fresh
    term, and StaleVRE's measurement of ``beta*``); before, every pair was also read once
    for its beta. The result is the same to the last bit as reading it anew each time."""
    n = 10
    rng = np.random.default_rng(1)

    def kw(name):  # each store its own folder (disk files are named by pair)
        return {
            "storage": storage,
            **({"directory": str(tmp_path / name)} if storage == "disk" else {}),
        }

    shares = {f"c{k}": 1 / n for k in range(n)}
    w = [np.zeros(5, dtype=np.float32), np.zeros((2, 3), dtype=np.float32)]

    def delta():
        return [rng.normal(size=5), rng.normal(size=(2, 3))]

    first = [upd(f"c{k}", delta(), 1 / n) for k in range(n)]
    fresh = {f"c{k}": delta() for k in range(n)}
    ups = [upd(f"c{k}", delta(), 1 / n, p=0.3) for k in (2, 5, 7)]
    agg, reference = make(**kw("agg")), make(**kw("reference"))
    for a in (agg, reference):
        a.aggregate(T, w, first, 1, shares=shares, fresh=fresh)
        a.aggregate(T, w, first[:4], 2, shares=shares, fresh=fresh)  # StaleVRE: a beta*
    reads: dict[str, int] = {}
    real = agg.store.get

    def counted(cid, task):
        reads[cid] = reads.get(cid, 0) + 1
        return real(cid, task)

    agg.store.get = counted  # type: ignore[method-assign]
    new = agg.aggregate(T, w, ups, 3, shares=shares, fresh=fresh)
    sampled = {u.cid for u in ups}
    assert {c: r for c, r in reads.items() if c not in sampled} == {
        c: 1 for c in shares if c not in sampled
    }
    assert all(1 <= reads[c] <= sampled_reads for c in sampled), reads
    # the same numbers as an aggregation whose every read is fresh
    fresh_reads = StaleStore.get.__get__(reference.store)
    reference.store.get = lambda cid, task: [a.copy() for a in fresh_reads(cid, task)]
    expected = reference.aggregate(T, w, ups, 3, shares=shares, fresh=fresh)
    for x, y in zip(new, expected):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
    if isinstance(agg, StaleVRAggregator):
        assert agg.last_betas == reference.last_betas
    if isinstance(agg, StaleVREAggregator):
        assert agg.schedule == reference.schedule
