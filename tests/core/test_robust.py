"""Tests of the robust aggregators (``mmfl_flwr.core.robust``): coordinate-wise
median and trimmed mean (Yin et al. 2018), per model.

Expected numbers are computed by hand or independently of our code: ``np.median``
and ``scipy.stats.trim_mean`` on the *local models* ``w - G_k`` (the aggregators
work on the updates ``G_k``), and a hand-written sort-and-cut for the cut count.
The end-to-end test runs the strategy in-process with a hostile client.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import StepTrainer
from flwr.app import Array, Context
from scipy.stats import trim_mean

import mmfl_flwr
from mmfl_flwr import protocol as P
from mmfl_flwr.client.app import ClientSpec, make_client_app
from mmfl_flwr.core import FullParticipation, Update
from mmfl_flwr.core.aggregators import Aggregator
from mmfl_flwr.core.pairing import check_pairing
from mmfl_flwr.core.robust import MedianAggregator, TrimmedMeanAggregator
from mmfl_flwr.core.ucb import RanklistMultiUCB
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.presets import AGGREGATORS, make_strategy
from mmfl_flwr.records import arrays_to_numpy, numpy_to_arrays
from mmfl_flwr.strategy import MultiModelStrategy


def upd(cid: str, delta: list[np.ndarray], n: int = 1) -> Update:
    return Update(cid=cid, delta=delta, num_examples=n, data_share=0.0)


def random_case(k: int, seed: int):
    """Global weights of three arrays (shapes and dtypes differ) and ``k`` local
    models; the updates are ``G = w - local`` in float64, as the strategy makes them."""
    rng = np.random.default_rng(seed)
    w = [
        rng.normal(size=(2, 3)).astype(np.float32),
        rng.normal(size=(4,)).astype(np.float64),
        rng.normal(size=()).astype(np.float32),
    ]
    locals_ = [
        [(a + rng.normal(scale=2.0, size=a.shape)).astype(a.dtype) for a in w] for _ in range(k)
    ]
    updates = [
        upd(f"c{i}", [a.astype(np.float64) - b for a, b in zip(w, loc)], n=10 * (i + 1))
        for i, loc in enumerate(locals_)
    ]
    return w, locals_, updates


def assert_matches(out, w, expected):
    assert len(out) == len(w)
    for o, a, e in zip(out, w, expected):
        assert o.dtype == a.dtype and o.shape == a.shape
        tol = 1e-6 if a.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(o, e, rtol=tol, atol=tol)


# ------------------------------------------------------------------ median
def test_median_hand_numbers_odd_and_even():
    w = [np.array([0.0, 10.0], np.float32)]
    g = [[np.array([1.0, -3.0])], [np.array([5.0, 0.0])], [np.array([-2.0, 4.0])]]
    # odd K=3: medians of G are 1 and 0 -> w - [1, 0]
    out = MedianAggregator().aggregate("t", w, [upd(f"c{i}", d) for i, d in enumerate(g)], 1)
    np.testing.assert_array_equal(out[0], np.array([-1.0, 10.0], np.float32))
    assert out[0].dtype == np.float32
    # even K=4 (add G=[2, 100]): sorted col 0 = -2,1,2,5 -> 1.5; col 1 = -3,0,4,100 -> 2
    g.append([np.array([2.0, 100.0])])
    out = MedianAggregator().aggregate("t", w, [upd(f"c{i}", d) for i, d in enumerate(g)], 1)
    np.testing.assert_array_equal(out[0], np.array([-1.5, 8.0], np.float32))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7, 8])
def test_median_equals_numpy_median_of_local_models(k):
    w, locals_, updates = random_case(k, seed=k)
    out = MedianAggregator().aggregate("t", w, updates, 1)
    expected = [
        np.median(np.stack([loc[j] for loc in locals_]).astype(np.float64), axis=0)
        for j in range(len(w))
    ]
    assert_matches(out, w, expected)


def test_median_is_unweighted():
    w = [np.zeros(1)]
    us = [
        upd("a", [np.array([1.0])], n=1),
        upd("b", [np.array([2.0])], n=1),
        upd("c", [np.array([9.0])], n=10**6),
    ]
    np.testing.assert_array_equal(MedianAggregator().aggregate("t", w, us, 1)[0], [-2.0])


def test_median_ignores_one_attacker_among_four_honest():
    honest_steps = [-1.0, 0.5, 2.0, 3.0]
    w = [np.full((2, 2), 1.0, np.float32), np.zeros(3, np.float32)]
    us = [upd(f"h{i}", [np.full((2, 2), s), np.full(3, s)]) for i, s in enumerate(honest_steps)]
    # the attacker returns 1e30 as its local model: G = w - 1e30
    us.append(upd("evil", [1.0 - np.full((2, 2), 1e30), 0.0 - np.full(3, 1e30)]))
    out = MedianAggregator().aggregate("t", w, us, 1)
    # K=5, sorted G = [w-1e30, -1, 0.5, 2, 3]: median 0.5 -> local models' range kept
    np.testing.assert_array_equal(out[0], np.full((2, 2), 0.5, np.float32))
    np.testing.assert_array_equal(out[1], np.full(3, -0.5, np.float32))
    for o, base in zip(out, (1.0, 0.0)):
        assert np.isfinite(o).all()
        assert (o >= base - max(honest_steps)).all() and (o <= base - min(honest_steps)).all()


# ------------------------------------------------------------ trimmed mean
@pytest.mark.parametrize("k", [1, 2, 3, 5, 6, 10])
@pytest.mark.parametrize("beta", [0.0, 0.1, 0.2, 0.25, 0.4, 0.49])
def test_trimmed_mean_equals_scipy_on_local_models(k, beta):
    w, locals_, updates = random_case(k, seed=100 + k)
    out = TrimmedMeanAggregator(beta).aggregate("t", w, updates, 1)
    expected = [
        trim_mean(np.stack([loc[j] for loc in locals_]).astype(np.float64), beta, axis=0)
        for j in range(len(w))
    ]
    assert_matches(out, w, expected)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_median_and_trimmed_mean_equal_flowers_own_on_local_models(k):
    """Flower's FedMedian / FedTrimmedAvg functions (flwr.server.strategy.aggregate)
    applied to the local models give what the per-model aggregators step to."""
    from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg

    w, locals_, updates = random_case(k, seed=200 + k)
    results = [
        ([a.astype(np.float64) for a in loc], u.num_examples) for loc, u in zip(locals_, updates)
    ]
    assert_matches(MedianAggregator().aggregate("t", w, updates, 1), w, aggregate_median(results))
    assert_matches(
        TrimmedMeanAggregator(0.2).aggregate("t", w, updates, 1),
        w,
        aggregate_trimmed_avg(results, 0.2),
    )


@pytest.mark.parametrize("k", [2, 3, 5, 8])
def test_beta_zero_is_the_plain_mean(k):
    w, locals_, updates = random_case(k, seed=200 + k)
    out = TrimmedMeanAggregator(0.0).aggregate("t", w, updates, 1)
    expected = [sum(loc[j].astype(np.float64) for loc in locals_) / k for j in range(len(w))]
    assert_matches(out, w, expected)


@pytest.mark.parametrize(
    "beta, k, cut",
    [
        (0.2, 4, 0),
        (0.2, 5, 1),
        (0.2, 9, 1),
        (0.2, 10, 2),
        (0.3, 10, 3),
        (0.1, 9, 0),
        (0.49, 7, 3),
        (0.25, 8, 2),
    ],
)
def test_trimmed_mean_cuts_int_beta_k_from_each_end(beta, k, cut):
    assert int(beta * k) == cut
    # G values 1, 2, 4, ..., 2^(k-1) (distinct powers of two, shuffled): the
    # mean of the kept ones identifies exactly which were dropped
    values = [2.0**i for i in range(k)]
    order = np.random.default_rng(k).permutation(k)
    us = [upd(f"c{i}", [np.array([values[j]])]) for i, j in enumerate(order)]
    kept = values[cut : k - cut]
    out = TrimmedMeanAggregator(beta).aggregate("t", [np.zeros(1)], us, 1)
    assert out[0][0] == -sum(kept) / len(kept)


def test_trimmed_mean_hand_numbers_two_arrays():
    # K=5, beta=0.2 -> cut 1 per end, per coordinate
    w = [np.array([10.0, 0.0], np.float32), np.array([[1.0]], np.float64)]
    g0 = [[3.0, -1.0], [1.0, 5.0], [2.0, 0.0], [100.0, 2.0], [-50.0, 1.0]]
    g1 = [7.0, 1.0, 3.0, 2.0, -9.0]
    us = [upd(f"c{i}", [np.array(a), np.array([[b]])]) for i, (a, b) in enumerate(zip(g0, g1))]
    out = TrimmedMeanAggregator(0.2).aggregate("t", w, us, 1)
    # col 0 kept 1,2,3 -> 2; col 1 kept 0,1,2 -> 1; second array kept 1,2,3 -> 2
    np.testing.assert_array_equal(out[0], np.array([8.0, -1.0], np.float32))
    np.testing.assert_array_equal(out[1], np.array([[-1.0]]))
    assert out[0].dtype == np.float32 and out[1].dtype == np.float64


@pytest.mark.parametrize("beta, k, attackers", [(0.2, 5, 1), (0.2, 10, 2), (0.34, 6, 2)])
def test_trimmed_mean_ignores_attackers_when_cut_covers_them(beta, k, attackers):
    assert int(beta * k) >= attackers
    rng = np.random.default_rng(7)
    honest = rng.uniform(-1.0, 1.0, size=(k - attackers, 3))
    w = [np.zeros(3, np.float32)]
    us = [upd(f"h{i}", [h]) for i, h in enumerate(honest)]
    # attackers on both sides: +1e30 and -1e30
    us += [upd(f"e{i}", [np.full(3, 1e30 * (-1) ** i)]) for i in range(attackers)]
    out = TrimmedMeanAggregator(beta).aggregate("t", w, us, 1)[0]
    assert np.isfinite(out).all()
    lo, hi = (-honest).min(axis=0), (-honest).max(axis=0)
    assert (out >= lo - 1e-6).all() and (out <= hi + 1e-6).all()


def test_trimmed_mean_without_enough_cut_is_not_robust():
    """beta * K < 1: nothing is cut, the attacker moves the model (documented)."""
    us = [upd(f"h{i}", [np.array([s])]) for i, s in enumerate([1.0, 2.0, 3.0])]
    us.append(upd("evil", [np.array([-1e30])]))
    out = TrimmedMeanAggregator(0.2).aggregate("t", [np.zeros(1, np.float32)], us, 1)[0]
    assert out[0] > 1e29


@pytest.mark.parametrize(
    "beta", [-0.1, 0.5, 0.7, 1.0, float("nan"), float("inf"), "0.2", None, True]
)
def test_beta_is_validated(beta):
    with pytest.raises(ValueError, match=r"beta"):
        TrimmedMeanAggregator(beta)


def test_beta_bounds_accepted():
    assert TrimmedMeanAggregator(0).beta == 0.0
    assert TrimmedMeanAggregator(0.4999).beta == 0.4999


# ------------------------------------------------------------------ shared
@pytest.mark.parametrize("agg", [MedianAggregator(), TrimmedMeanAggregator(0.3)])
def test_no_updates_returns_unchanged_copies(agg):
    w = [np.arange(3, dtype=np.float32), np.ones((2, 2))]
    out = agg.aggregate("t", w, [], 1)
    for o, a in zip(out, w):
        np.testing.assert_array_equal(o, a)
        assert o.dtype == a.dtype and o is not a and not np.shares_memory(o, a)


@pytest.mark.parametrize("agg", [MedianAggregator(), TrimmedMeanAggregator()])
def test_inputs_untouched_and_shapes_checked(agg):
    w = [np.array([1.0, 2.0])]
    d = [np.array([3.0, -1.0])]
    us = [upd("a", d), upd("b", [np.array([0.0, 0.0])]), upd("c", [np.array([1.0, 1.0])])]
    agg.aggregate("t", w, us, 1)
    np.testing.assert_array_equal(w[0], [1.0, 2.0])
    np.testing.assert_array_equal(d[0], [3.0, -1.0])
    with pytest.raises(ValueError, match="shapes"):
        agg.aggregate("t", w, [upd("x", [np.zeros(3)])], 1)
    with pytest.raises(ValueError, match="shapes"):
        agg.aggregate("t", w, [upd("x", [np.zeros(2), np.zeros(1)])], 1)


@pytest.mark.parametrize("agg", [MedianAggregator(), TrimmedMeanAggregator()])
def test_coefficients_are_refused(agg):
    with pytest.raises(NotImplementedError, match="not a weighted sum"):
        agg.coefficients([upd("a", [np.zeros(1)])])


def test_repr_config_and_capabilities():
    assert repr(MedianAggregator()) == "MedianAggregator()"
    assert repr(TrimmedMeanAggregator()) == "TrimmedMeanAggregator(beta=0.2)"
    assert repr(TrimmedMeanAggregator(0.1)) == "TrimmedMeanAggregator(beta=0.1)"
    assert TrimmedMeanAggregator(0.3).config() == {"beta": 0.3}
    assert MedianAggregator().config() == {}
    assert (MedianAggregator.name, TrimmedMeanAggregator.name) == ("median", "trimmed-mean")
    for cls in (MedianAggregator, TrimmedMeanAggregator):
        assert issubclass(cls, Aggregator)
        assert not cls.needs_inclusion_probabilities
        assert not cls.needs_fresh and not cls.needs_control and not cls.has_residual
        assert cls.keeps_per_client == ""
        check_pairing(RanklistMultiUCB(2), cls())  # pairs with UCB


def test_registered_and_exported():
    assert AGGREGATORS["median"] is MedianAggregator
    assert AGGREGATORS["trimmed-mean"] is TrimmedMeanAggregator
    assert mmfl_flwr.MedianAggregator is MedianAggregator
    assert mmfl_flwr.TrimmedMeanAggregator is TrimmedMeanAggregator
    assert {"MedianAggregator", "TrimmedMeanAggregator"} <= set(mmfl_flwr.__all__)
    for name, cls in (("median", MedianAggregator), ("trimmed-mean", TrimmedMeanAggregator)):
        assert type(make_strategy("mfa-rand", aggregator=name).aggregator) is cls
        assert type(make_strategy("ranklist-ucb", aggregator=name).aggregator) is cls


# -------------------------------------------------------------- end to end
TASK = "m"
# cid -> (num_examples, step); c4 is hostile: it replaces its model with 1e30
STEPS = {"c0": (10, 1.0), "c1": (20, -2.0), "c2": (30, 0.5), "c3": (40, 3.0), "c4": (50, 0.0)}
SHAPES = {"w": (2, 3), "b": (3,)}


def hostile_app():
    def spec_fn(ctx: Context) -> ClientSpec:
        cid = str(ctx.node_config["cid"])
        n, s = STEPS[cid]
        return ClientSpec(cid, {TASK: StepTrainer(n, s)})

    app = make_client_app(spec_fn)

    def call(msg, ctx):
        reply = app(msg, ctx)
        if ctx.node_config["cid"] == "c4" and msg.metadata.message_type == "train":
            rec = reply.content.array_records[P.arrays_key(TASK)]
            for key, shape in SHAPES.items():
                rec[key] = Array(np.full(shape, 1e30, np.float32))
        return reply

    return call


@pytest.mark.parametrize(
    "make",
    [
        lambda: MultiModelStrategy(
            FullParticipation(),
            MedianAggregator(),
            seed=0,
            node_wait_timeout=0.0,
            update_norm_factor=None,
        ),
        lambda: make_strategy(
            "full", aggregator="median", seed=0, node_wait_timeout=0.0, update_norm_factor=None
        ),
        lambda: make_strategy(
            "full",
            aggregator=TrimmedMeanAggregator(0.2),
            seed=0,
            node_wait_timeout=0.0,
            update_norm_factor=None,
        ),
    ],
)
def test_end_to_end_hostile_client_cannot_move_the_model(make):
    """Five clients train every round; c4 returns 1e30 everywhere. Honest steps
    are 1, -2, 0.5, 3, so with w = 0 the honest local models are -1, 2, -0.5,
    -3 and c4's 1e30. Median of the five: sorted -3, -1, -0.5, 2, 1e30 -> -0.5.
    Trimmed mean beta=0.2 (cut 1 per end): mean(-1, -0.5, 2) = 0.5/3. Each
    later round moves by the same statistic of the steps (c4 again 1e30).
    The default norm bound, which would reject c4's update before the
    aggregator sees it, is off: this is the aggregator's own robustness."""
    grid = InProcessGrid(hostile_app(), [{"cid": c} for c in STEPS], seed=0)
    strategy = make()
    init = {TASK: numpy_to_arrays({k: np.zeros(s, np.float32) for k, s in SHAPES.items()})}
    rounds = 2
    result = strategy.start(grid, init, num_rounds=rounds, timeout=60)
    final = arrays_to_numpy(result.arrays[TASK])
    if isinstance(strategy.aggregator, TrimmedMeanAggregator):
        # round 1: kept -1, -0.5, 2; round 2 (w = 0.5/3): locals w-1, w+2, w-0.5,
        # w-3, 1e30 -> kept w-1, w-0.5, w+2 -> w + 0.5/3
        expected = rounds * (0.5 / 3)
    else:
        # round 1: -0.5; round 2: locals w-1, w+2, w-0.5, w-3, 1e30 -> w-0.5
        expected = rounds * -0.5
    for key, shape in SHAPES.items():
        assert final[key].dtype == np.float32 and final[key].shape == shape
        assert np.isfinite(final[key]).all()
        np.testing.assert_allclose(final[key], np.full(shape, expected), rtol=1e-6)
