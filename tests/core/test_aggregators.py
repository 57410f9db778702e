"""Tests of the framework-free aggregators.

Hand-computed numbers for the small cases; for the unbiasedness of the ``d l / (B p)``
rule (paper 003, Eq. 3) both an exact enumeration over every processor outcome and a
Monte Carlo check against RandomAllocation with a standard-error-derived tolerance.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from mmfl_flwr.core import (
    ClientInfo,
    ClientTable,
    FedAvgAggregator,
    RandomAllocation,
    UnbiasedAggregator,
    Update,
    apply_step,
)


def upd(cid, delta, n=1, d=1.0, b=1, p=1.0, count=1):
    return Update(
        cid=cid,
        delta=[np.asarray(x) for x in delta],
        num_examples=n,
        data_share=d,
        processors=b,
        prob=p,
        count=count,
    )


# ----------------------------------------------------------------------------- apply_step


class TestApplyStep:
    def test_hand_numbers(self):
        w = [np.array([1.0, 2.0, 3.0]), np.array([[4.0]])]
        deltas = [
            [np.array([1.0, 0.0, -1.0]), np.array([[2.0]])],
            [np.array([0.5, 0.5, 0.5]), np.array([[-4.0]])],
        ]
        out = apply_step(w, deltas, [2.0, 0.5])
        # 1 - (2*1 + .5*.5) = -1.25 ; 2 - (0 + .25) = 1.75 ; 3 - (-2 + .25) = 4.75
        np.testing.assert_allclose(out[0], [-1.25, 1.75, 4.75], rtol=0, atol=1e-15)
        # 4 - (2*2 + .5*(-4)) = 2
        np.testing.assert_allclose(out[1], [[2.0]], rtol=0, atol=1e-15)
        # Inputs untouched.
        np.testing.assert_array_equal(w[0], [1.0, 2.0, 3.0])
        np.testing.assert_array_equal(deltas[0][0], [1.0, 0.0, -1.0])

    def test_no_deltas_is_identity_copy(self):
        w = [np.arange(3.0)]
        out = apply_step(w, [], [])
        np.testing.assert_array_equal(out[0], w[0])
        out[0][0] = 99.0
        assert w[0][0] == 0.0

    def test_dtype_preserved_and_float64_accumulation(self):
        w = [np.zeros(1, dtype=np.float32), np.zeros((2, 2), dtype=np.float64)]
        big = np.float32(1e8)
        deltas = [
            [np.array([big], dtype=np.float32), np.ones((2, 2), dtype=np.float32)],
            [np.array([1.0], dtype=np.float32), np.ones((2, 2), dtype=np.float32)],
            [np.array([-big], dtype=np.float32), np.ones((2, 2), dtype=np.float32)],
        ]
        out = apply_step(w, deltas, [1.0, 1.0, 1.0])
        assert out[0].dtype == np.float32 and out[1].dtype == np.float64
        # float32 accumulation would give 1e8 + 1 - 1e8 = 0; float64 gives 1.
        assert out[0][0] == np.float32(-1.0)
        np.testing.assert_array_equal(out[1], np.full((2, 2), -3.0))


# ------------------------------------------------------------------------------- FedAvg


class TestFedAvg:
    def test_weighted_mean_of_local_models_by_hand(self):
        w = [np.array([10.0, 20.0]), np.array([[1.0, 1.0], [1.0, 1.0]])]
        # Local models and sample counts; the expected result is their n-weighted mean.
        local = {
            "a": ([np.array([8.0, 20.0]), np.array([[0.0, 2.0], [1.0, 1.0]])], 1),
            "b": ([np.array([12.0, 16.0]), np.array([[2.0, 2.0], [1.0, 5.0]])], 3),
            "c": ([np.array([10.0, 24.0]), np.array([[1.0, 0.0], [5.0, 1.0]])], 4),
        }
        updates = [
            upd(c, [w[k] - lw[k] for k in range(2)], n=n, d=0.123) for c, (lw, n) in local.items()
        ]
        out = FedAvgAggregator().aggregate("t", w, updates, 1)
        # (1*8 + 3*12 + 4*10)/8 = 84/8 = 10.5 ; (1*20 + 3*16 + 4*24)/8 = 164/8 = 20.5
        np.testing.assert_allclose(out[0], [10.5, 20.5], rtol=0, atol=1e-12)
        # [[(0+6+4)/8, (2+6+0)/8], [(1+3+20)/8, (1+15+4)/8]]
        np.testing.assert_allclose(out[1], [[1.25, 1.0], [3.0, 2.5]], rtol=0, atol=1e-12)
        assert FedAvgAggregator().coefficients(updates) == pytest.approx([1 / 8, 3 / 8, 4 / 8])

    def test_ignores_prob_and_share(self):
        w = [np.array([0.0])]
        u1 = upd("a", [np.array([1.0])], n=2, d=0.9, b=3, p=0.01, count=3)
        u2 = upd("b", [np.array([4.0])], n=6, d=0.1, b=1, p=0.5)
        out = FedAvgAggregator().aggregate("t", w, [u1, u2], 1)
        np.testing.assert_allclose(out[0], [-(2 * 1 + 6 * 4) / 8], rtol=0, atol=1e-15)

    def test_single_update_replaces_model(self):
        w = [np.array([3.0, -1.0], dtype=np.float32)]
        local = np.array([0.5, 2.0], dtype=np.float32)
        out = FedAvgAggregator().aggregate("t", w, [upd("a", [w[0] - local], n=17)], 1)
        assert out[0].dtype == np.float32
        np.testing.assert_array_equal(out[0], local)

    def test_float32_preserved(self):
        w = [np.array([1.0, 2.0], dtype=np.float32)]
        us = [
            upd("a", [np.array([1.0, 1.0], dtype=np.float32)], n=1),
            upd("b", [np.array([3.0, 0.0], dtype=np.float32)], n=1),
        ]
        out = FedAvgAggregator().aggregate("t", w, us, 1)
        assert out[0].dtype == np.float32
        np.testing.assert_allclose(out[0], [-1.0, 1.5], rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------- Unbiased


class TestUnbiased:
    def test_coefficients_by_hand(self):
        us = [
            upd("a", [np.array([1.0, 0.0])], d=0.5, b=2, p=0.25, count=1),  # .5/(2*.25) = 1
            upd("b", [np.array([0.0, 2.0])], d=0.2, b=4, p=0.1, count=3),  # .6/.4 = 1.5
            upd("c", [np.array([4.0, 4.0])], d=0.3, b=1, p=0.6, count=1),  # .3/.6 = .5
        ]
        agg = UnbiasedAggregator()
        assert agg.coefficients(us) == pytest.approx([1.0, 1.5, 0.5])
        out = agg.aggregate("t", [np.array([10.0, 10.0])], us, 3)
        # 10 - (1*1 + 0 + .5*4) = 7 ; 10 - (0 + 1.5*2 + .5*4) = 5
        np.testing.assert_allclose(out[0], [7.0, 5.0], rtol=0, atol=1e-12)

    def test_float32_preserved(self):
        w = [np.array([1.0, 2.0, 3.0], dtype=np.float32), np.ones((2,), dtype=np.float32)]
        u = upd(
            "a",
            [np.array([0.5, 0.5, 0.5], np.float32), np.array([1.0, -1.0], np.float32)],
            d=0.5,
            b=2,
            p=0.125,
            count=2,
        )  # coefficient .5*2/(2*.125) = 4
        out = UnbiasedAggregator().aggregate("t", w, [u], 1)
        assert [o.dtype for o in out] == [np.float32, np.float32]
        np.testing.assert_allclose(out[0], [-1.0, 0.0, 1.0], rtol=0, atol=1e-6)
        np.testing.assert_allclose(out[1], [-3.0, 5.0], rtol=0, atol=1e-6)

    @pytest.mark.parametrize("agg", [UnbiasedAggregator(), FedAvgAggregator()])
    def test_no_updates_returns_copy(self, agg):
        w = [np.array([1.0, 2.0], dtype=np.float32), np.zeros((2, 2))]
        out = agg.aggregate("t", w, [], 4)
        for a, b in zip(out, w):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype
            assert a is not b and not np.shares_memory(a, b)

    @pytest.mark.parametrize("kw", [{"p": 0.0}, {"p": -0.1}, {"p": float("nan")}, {"b": 0}])
    def test_invalid_prob_or_processors_raises(self, kw):
        good = upd("a", [np.array([1.0])], d=0.5, p=0.5)
        bad = upd("b", [np.array([1.0])], d=0.5, **kw)
        with pytest.raises(ValueError):
            UnbiasedAggregator().aggregate("t", [np.array([0.0])], [good, bad], 1)


# ------------------------------------------------------------------- unbiasedness proofs

# A small federation: 8 clients, 3 tasks, heterogeneous B_i, eligibility and n_{i,s}.
TASKS = ["a", "b", "c"]
FED = {
    "0": ({"a": 30, "b": 5, "c": 12}, 1),
    "1": ({"a": 7}, 2),
    "2": ({"b": 40, "c": 3}, 3),
    "3": ({"a": 11, "c": 9}, 4),
    "4": ({"a": 2, "b": 2, "c": 2}, 4),
    "5": ({"c": 50}, 1),
    "6": ({"b": 8, "a": 16}, 2),
    "7": ({"a": 60, "b": 1}, 1),
}
SHAPES = [(3,), (2, 2)]


def _federation():
    table = ClientTable()
    for cid, (n, b) in FED.items():
        table.upsert(ClientInfo(cid=cid, num_examples=dict(n), processors=b))
    rng = np.random.default_rng(2718)
    deltas = {
        (cid, t): [rng.normal(size=s) for s in SHAPES] for cid, (n, _) in FED.items() for t in n
    }
    w0 = [rng.normal(size=s) for s in SHAPES]
    return table, deltas, w0


def _full_update(task, deltas, w0):
    """w - sum_i d_{i,s} G_{i,s}, with d computed here from FED, not from ClientTable."""
    total = sum(n[task] for n, _ in FED.values() if task in n)
    step = [np.zeros(s) for s in SHAPES]
    for cid, (n, _) in FED.items():
        if task in n:
            for k in range(len(SHAPES)):
                step[k] += n[task] / total * deltas[(cid, task)][k]
    return [w - s for w, s in zip(w0, step)]


def test_unbiased_exact_enumeration():
    """Exact expectation over every processor outcome, from the definition.

    Each processor of client i is idle with prob 1-q, else trains each task of S_i with
    prob q/|S_i|; l processors on the same task give one update with count l.
    """
    table, deltas, w0 = _federation()
    q = 0.3
    task = "a"
    shares = table.data_share(task)
    agg = UnbiasedAggregator()
    # Outcome of client i for task a: number k of its processors that drew 'a'
    # (the other tasks do not matter for model a), k ~ Binomial(B_i, q/|S_i|).
    per_client = []
    for cid, (n, b) in FED.items():
        if task not in n:
            continue
        p = q / len(n)
        per_client.append(
            [(cid, k, math.comb(b, k) * p**k * (1 - p) ** (b - k), p, b) for k in range(b + 1)]
        )
    expected = [np.zeros(s) for s in SHAPES]
    total_prob = 0.0
    for combo in itertools.product(*per_client):
        prob = math.prod(c[2] for c in combo)
        ups = [
            Update(cid, deltas[(cid, task)], FED[cid][0][task], shares[cid], b, p, steps)
            for cid, steps, _, p, b in combo
            if steps > 0
        ]
        out = agg.aggregate(task, w0, ups, 1)
        for k in range(len(SHAPES)):
            expected[k] += prob * out[k]
        total_prob += prob
    assert total_prob == pytest.approx(1.0, abs=1e-12)
    full = _full_update(task, deltas, w0)
    for k in range(len(SHAPES)):
        np.testing.assert_allclose(expected[k], full[k], rtol=0, atol=1e-12)


class TestMonteCarloUnbiased:
    DRAWS = 16000
    BUDGET = 9.0

    @pytest.fixture(scope="class")
    @classmethod
    def mc(cls):
        table, deltas, w0 = _federation()
        shares = {t: table.data_share(t) for t in TASKS}
        policy = RandomAllocation(budget=cls.BUDGET)
        unbiased, fedavg = UnbiasedAggregator(), FedAvgAggregator()
        rng = np.random.default_rng(161803)
        size = sum(math.prod(s) for s in SHAPES)

        def flat(ws):
            return np.concatenate([x.ravel() for x in ws])

        # Running sums of the new weights (and squares) per task and per aggregator:
        # 0 = unbiased, 1 = FedAvg, 2 = unbiased with the wrong prob q/S.
        s1 = np.zeros((3, len(TASKS), size))
        s2 = np.zeros((3, len(TASKS), size))
        q = policy.activation_probability(sum(b for _, b in FED.values()))
        for r in range(cls.DRAWS):
            picks = policy.assign(table, TASKS, r + 1, rng)
            by_task: dict[str, list[Update]] = {t: [] for t in TASKS}
            wrong: dict[str, list[Update]] = {t: [] for t in TASKS}
            for p in picks:
                info = table[p.cid]
                u = Update(
                    cid=p.cid,
                    delta=deltas[(p.cid, p.task)],
                    num_examples=info.num_examples[p.task],
                    data_share=shares[p.task][p.cid],
                    processors=info.processors,
                    prob=p.prob,
                    count=p.count,
                )
                by_task[p.task].append(u)
                wrong[p.task].append(
                    Update(
                        u.cid,
                        u.delta,
                        u.num_examples,
                        u.data_share,
                        u.processors,
                        q / len(TASKS),
                        u.count,
                    )
                )
            for s, t in enumerate(TASKS):
                for a, (agg, ups) in enumerate(
                    [(unbiased, by_task[t]), (fedavg, by_task[t]), (unbiased, wrong[t])]
                ):
                    x = flat(agg.aggregate(t, w0, ups, r + 1))
                    s1[a, s] += x
                    s2[a, s] += x * x
        mean = s1 / cls.DRAWS
        var = np.maximum(s2 / cls.DRAWS - mean**2, 0.0) * cls.DRAWS / (cls.DRAWS - 1)
        stderr = np.sqrt(var / cls.DRAWS)
        w0f = flat(w0)
        expected = np.stack([flat(_full_update(t, deltas, w0)) for t in TASKS])
        return mean, stderr, expected, w0f

    def test_mean_equals_full_participation_update(self, mc):
        mean, stderr, expected, w0f = mc
        dev = np.abs(mean[0] - expected)
        assert (dev <= 5 * stderr[0]).all(), (dev / stderr[0]).max()
        # The tolerance is small relative to the update it checks (L2 norms per task).
        tol_norm = np.linalg.norm(5 * stderr[0], axis=1)
        step_norm = np.linalg.norm(w0f[None, :] - expected, axis=1)
        assert (tol_norm < 0.1 * step_norm).all(), (tol_norm, step_norm)

    def test_fedavg_of_random_picks_is_biased(self, mc):
        mean, stderr, expected, _ = mc
        z = np.abs(mean[1] - expected) / stderr[1]
        assert z.max() > 10

    def test_wrong_probability_is_detected(self, mc):
        """Using rate/S instead of rate/|S_i| (the pitfall in the notes) is biased,
        and the tolerance above is tight enough to see it."""
        mean, stderr, expected, _ = mc
        z = np.abs(mean[2] - expected) / stderr[2]
        assert z.max() > 10
