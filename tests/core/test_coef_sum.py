"""The ``coef_sum`` column: the sum of the aggregation coefficients of a round,
paper 003's ``||H_{tau,s}||_1 = sum_{(i,b) in A_s} d_{i,s} / (B_i p_{s|(i,b)})``
(Eq. 15-16, Fig. 2), hand-computed for a known round, averaging to 1 over
Monte Carlo rounds of the LVR sampling, and as the strategy reports it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_lvr import (
    STRAT_IDS,
    TASKS3,
    _run,
    _strategy_matrices,
    ref_probabilities,
    shares_of,
)

from mmfl_flwr import presets
from mmfl_flwr.core import (
    LVR,
    ClientInfo,
    ClientTable,
    FedAvgAggregator,
    UnbiasedAggregator,
    Update,
)
from mmfl_flwr.core.aggregators import MeanAggregator
from mmfl_flwr.core.robust import MedianAggregator, TrimmedMeanAggregator
from mmfl_flwr.core.scaffold import ScaffoldAggregator
from mmfl_flwr.core.stale import FedStaleAggregator, FedVARPAggregator, MIFAAggregator
from mmfl_flwr.core.stalevr import StaleVRAggregator, StaleVREAggregator

# A known round of one task: four eligible clients with n = 40, 24, 16, 20
# (d = 0.4, 0.24, 0.16, 0.2); clients 0, 1, 2 were sampled:
#   client 0: B = 2, p = 0.25, one processor drew the task: 0.4 / (2 * 0.25) = 0.8
#   client 1: B = 1, p = 0.5:                               0.24 / 0.5      = 0.48
#   client 2: B = 1, p = 0.8:                               0.16 / 0.8      = 0.2
# ||H||_1 = 0.8 + 0.48 + 0.2 = 1.48; with both processors of client 0 on the
# task (Remark 1, count 2) its term doubles: 1.6 + 0.48 + 0.2 = 2.28.
SHARES = {"0": 0.4, "1": 0.24, "2": 0.16, "3": 0.2}
ONES = [np.ones(3)]


def known_round(count0: int = 1) -> list[Update]:
    return [
        Update("0", ONES, 40, 0.4, processors=2, prob=0.25, count=count0),
        Update("1", ONES, 24, 0.24, processors=1, prob=0.5),
        Update("2", ONES, 16, 0.16, processors=1, prob=0.8),
    ]


@pytest.mark.parametrize(
    "agg",
    [
        UnbiasedAggregator(),
        ScaffoldAggregator(),
        FedVARPAggregator(),
        FedStaleAggregator(0.5),
        StaleVRAggregator(),
        StaleVREAggregator(),
    ],
    ids=lambda a: a.name,
)
def test_unbiased_rules_sum_d_over_b_p(agg):
    assert agg.coefficient_sum("t", known_round(), shares=SHARES) == pytest.approx(1.48)
    assert agg.coefficient_sum("t", known_round(2), shares=SHARES) == pytest.approx(2.28)


@pytest.mark.parametrize(
    "agg",
    [
        UnbiasedAggregator(),
        FedVARPAggregator(),
        StaleVREAggregator(),
        MIFAAggregator(),
        FedAvgAggregator(),
        MeanAggregator(),
    ],
    ids=lambda a: a.name,
)
def test_coef_sum_is_what_aggregate_applies(agg):
    """With every G = 1 and no stale update yet, the step w_old - w_new is the
    sum of the coefficients applied to the fresh updates, entry by entry."""
    updates = known_round()
    new = agg.aggregate("t", [np.zeros(3)], updates, 1, shares=SHARES)
    np.testing.assert_allclose(-new[0], agg.coefficient_sum("t", updates, shares=SHARES))


def test_fedavg_mean_mifa_and_robust_rules():
    ups = known_round()
    assert FedAvgAggregator().coefficient_sum("t", ups) == pytest.approx(1.0)
    assert MeanAggregator().coefficient_sum("t", ups) == pytest.approx(1.0)
    # MIFA: the fresh updates weigh d of their clients, 0.4 + 0.24 + 0.16
    assert MIFAAggregator().coefficient_sum("t", ups, shares=SHARES) == pytest.approx(0.8)
    # coordinate-wise statistics have no coefficients
    assert math.isnan(MedianAggregator().coefficient_sum("t", ups))
    assert math.isnan(TrimmedMeanAggregator().coefficient_sum("t", ups))
    # no update: no step
    for agg in (
        UnbiasedAggregator(),
        FedAvgAggregator(),
        MedianAggregator(),
        MIFAAggregator(),
        FedVARPAggregator(),
    ):
        assert agg.coefficient_sum("t", [], shares=SHARES) == 0.0


def _lvr_table() -> tuple[ClientTable, dict[str, dict[str, int]], dict[str, int]]:
    """Nine clients, two tasks, B = 1..3, uneven data and losses."""
    rng = np.random.default_rng(5)
    table = ClientTable()
    counts: dict[str, dict[str, int]] = {}
    procs: dict[str, int] = {}
    for i in range(9):
        cid = str(i)
        tasks = ["x", "y"] if i % 4 else ["x"]
        counts[cid] = {t: int(rng.integers(5, 120)) for t in tasks}
        procs[cid] = 1 + i % 3
        table.upsert(ClientInfo(cid, dict(counts[cid]), procs[cid]))
        for t in tasks:
            table.set_loss(cid, t, float(rng.uniform(0.2, 3.0)), 0)
    return table, counts, procs


def test_coef_sum_averages_to_one_over_monte_carlo_rounds_of_lvr():
    """E||H_s||_1 = 1 (Eq. 16). Per round, K_i (the processors of client i that
    draw s) is Binomial(B_i, p_i), so ||H_s||_1 = sum_i d_i K_i / (B_i p_i) has
    variance sum_i d_i^2 (1 - p_i) / (B_i p_i); the mean of R rounds must be
    within 4.5 standard errors sqrt(var / R) of 1 (a false alarm has
    probability below 1e-5; the seed makes it deterministic anyway)."""
    table, _, procs = _lvr_table()
    policy = LVR(budget=4.0)
    ids, p, b = policy.probabilities(table, ["x", "y"])
    agg = UnbiasedAggregator()
    rng = np.random.default_rng(11)
    rounds = 8000
    sums = {t: np.empty(rounds) for t in ("x", "y")}
    shares = {t: table.data_share(t) for t in ("x", "y")}
    for r in range(rounds):
        ups: dict[str, list[Update]] = {"x": [], "y": []}
        for pk in policy.assign(table, ["x", "y"], r + 1, rng):
            ups[pk.task].append(
                Update(pk.cid, ONES, 1, shares[pk.task][pk.cid], procs[pk.cid], pk.prob, pk.count)
            )
        for t in ("x", "y"):
            sums[t][r] = agg.coefficient_sum(t, ups[t], shares=shares[t])
    for s, t in enumerate(("x", "y")):
        d = np.array([shares[t].get(c, 0.0) for c in ids])
        ps = p[s]
        on = d > 0
        assert (ps[on] > 0).all() and (ps[on] < 1).all()  # a genuinely random round
        var = float(np.sum(d[on] ** 2 * (1 - ps[on]) / (b[on] * ps[on])))
        se = math.sqrt(var / rounds)
        assert abs(sums[t].mean() - 1.0) < 4.5 * se, (t, sums[t].mean(), se)
        # and the spread is the binomial one (processors draw independently);
        # the sample variance's relative standard error is about 0.03 here
        # (sqrt((mu4 - var^2) / R) / var), so 0.1 is over 3 of them
        assert sums[t].var(ddof=1) == pytest.approx(var, rel=0.1)
        assert sums[t].std() > 0.05  # not trivially 1


def test_strategy_reports_coef_sum_of_each_round():
    """Strategy level (the fake clients of test_lvr): every round's coef_sum of
    a task is sum d k / (B p) over that round's aggregated picks, with the Eq. 13
    probabilities of the clients' losses; FedAvg rounds give 1."""
    rounds = 12
    m = 3.0
    result, *_ = _run(lambda: presets.lvr(budget=m, floor=0.0, seed=7), rounds)
    n, loss, _, b = _strategy_matrices()
    d = shares_of(n)
    p = ref_probabilities(loss, d, b, m, 0.0)
    seen = []
    for rnd in range(1, rounds + 1):
        rows = {r["task"]: r for r in result.history if r["round"] == rnd}
        for s, t in enumerate(TASKS3):
            j = [(STRAT_IDS.index(c), k) for c, tt, k in result.assignments[rnd] if tt == t]
            expected = sum(d[s, i] * k / (b[i] * p[s, i]) for i, k in j)
            assert rows[t]["coef_sum"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
            seen.append(rows[t]["coef_sum"])
    assert len(set(seen)) > 3  # it varies from round to round
    assert all("coef_sum" not in r for r in result.history if r["round"] == 0)
    full, *_ = _run(lambda: presets.full_participation(seed=1), 2)
    assert [r["coef_sum"] for r in full.history if r["round"] > 0] == pytest.approx([1.0] * 6)
