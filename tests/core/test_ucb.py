"""Tests of the loss-based bandit policies of paper 004 (``mmfl_flwr.core.ucb``).

Ranklist-Multi-UCB (Algorithm 3) and Pareto-Multi-UCB (Algorithm 4) over the
discounted UCB index of Eqs. 1-4:

``L_t(k,i) = sum_{n<t} g^(t-1-n) 1[k trained i at n] loss_n(k,i)``,
``N_t(k,i) = sum_{n<t} g^(t-1-n) 1[k trained i at n]``,
``D_t = sum_{n<t} g^(t-1-n)``, ``U_t = sqrt(2 log D_t / N_t)``,
``A_t(k,i) = p_k(i) (L_t/N_t + U_t)``.

Every expected number is written by hand (with the arithmetic in comments) or
computed from these definitions by code written here, independently of the
code under test: brute-force Pareto fronts, a literal transcription of
Algorithm 3, explicit rank counting, direct discounted sums.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from conftest import StepTrainer
from flwr.app import Context, Message, MessageType

from mmfl_flwr import protocol as P
from mmfl_flwr.client.app import ClientSpec, make_client_app
from mmfl_flwr.core.clients import ClientInfo, ClientTable
from mmfl_flwr.core.policy import Pick
from mmfl_flwr.core.ucb import ParetoMultiUCB, RanklistMultiUCB, pareto_front
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.presets import pareto_ucb, ranklist_ucb
from mmfl_flwr.records import numpy_to_arrays

TASKS = ["a", "b"]


# ------------------------------------------------------------------ helpers
def make_table(
    n: dict[str, dict[str, int]], losses: dict[str, dict[str, float]] | None = None
) -> ClientTable:
    """``n = {cid: {task: num_examples}}``; ``losses = {cid: {task: queried loss}}``."""
    table = ClientTable()
    for cid, counts in n.items():
        table.upsert(ClientInfo(cid=cid, num_examples=dict(counts)))
        for t, v in (losses or {}).get(cid, {}).items():
            table.set_loss(cid, t, v, 0)
    return table


def seeded(policy_cls, n, losses, k=2, gamma=0.5, tasks=TASKS, server_round=1):
    """A loss-query policy whose pairs are seeded with ``losses`` by one assign."""
    table = make_table(n, losses)
    pol = policy_cls(k, gamma, "loss-query")
    picks = pol.assign(table, tasks, server_round, np.random.default_rng(0))
    return pol, table, picks


def tuples(picks: Sequence[Pick]) -> list[tuple[str, str]]:
    return [(p.cid, p.task) for p in picks]


def reference_stats(seed_losses: dict, rounds: list[dict], gamma: float):
    """Eqs. 2-4 as literal sums: observation times n = 0 (the loss query) and
    n = 1..T (training rounds), evaluated at t = T + 1."""
    T = len(rounds)
    obs = [dict(seed_losses)] + [dict(r) for r in rounds]
    pairs = set().union(*[set(o) for o in obs])
    L = {k: sum(gamma ** (T - n) * o[k] for n, o in enumerate(obs) if k in o) for k in pairs}
    N = {k: sum(gamma ** (T - n) for n, o in enumerate(obs) if k in o) for k in pairs}
    D = sum(gamma ** (T - n) for n in range(T + 1))
    return L, N, D


def brute_front(a: np.ndarray) -> set[int]:
    """O(N^2): rows not dominated by any row (>= everywhere, > somewhere)."""
    out = set()
    for k in range(a.shape[0]):
        dominated = any(
            np.all(a[j] >= a[k]) and np.any(a[j] > a[k]) for j in range(a.shape[0]) if j != k
        )
        if not dominated:
            out.add(k)
    return out


def ref_ranks(a: np.ndarray) -> np.ndarray:
    """rank[k, i] = #clients strictly better on i + #earlier clients equal on i
    (0 = best), counting only clients with a finite score; inf where a is -inf."""
    n, m = a.shape
    r = np.full((n, m), np.inf)
    for i in range(m):
        for k in range(n):
            if not np.isfinite(a[k, i]):
                continue
            r[k, i] = sum(
                1
                for j in range(n)
                if np.isfinite(a[j, i]) and (a[j, i] > a[k, i] or (a[j, i] == a[k, i] and j < k))
            )
    return r


def ref_ranklist(a: np.ndarray, k: int, t: int) -> list[tuple[int, int]]:
    """Algorithm 3 transcribed: model (t + count) mod M in turn takes its top
    unpicked client; a model with no unpicked eligible client is skipped."""
    n, m = a.shape
    lists = [
        sorted((j for j in range(n) if np.isfinite(a[j, i])), key=lambda j: (-a[j, i], j))
        for i in range(m)
    ]
    picked: list[tuple[int, int]] = []
    used: set[int] = set()
    count = 0
    while len(picked) < k:
        live = [i for i in range(m) if any(j not in used for j in lists[i])]
        if not live:
            break
        i = (t + count) % m
        count += 1
        if i not in live:
            continue
        j = next(j for j in lists[i] if j not in used)
        used.add(j)
        picked.append((j, i))
    return picked


# ===================================================== 1. the index by hand
# 3 clients, 2 models.  n_k(i):  a: 10, 30, 60 (sum 100)  b: 50, 25, 25 (sum 100)
# so p_k(a) = 0.1, 0.3, 0.6 and p_k(b) = 0.5, 0.25, 0.25.
HAND_N = {"0": {"a": 10, "b": 50}, "1": {"a": 30, "b": 25}, "2": {"a": 60, "b": 25}}
HAND_P = {
    ("0", "a"): 0.1,
    ("1", "a"): 0.3,
    ("2", "a"): 0.6,
    ("0", "b"): 0.5,
    ("1", "b"): 0.25,
    ("2", "b"): 0.25,
}
# loss query (time 0):  a: 2.0, 1.0, 0.5   b: 1.5, 3.0, 1.0
HAND_SEED = {"0": {"a": 2.0, "b": 1.5}, "1": {"a": 1.0, "b": 3.0}, "2": {"a": 0.5, "b": 1.0}}
# trained pairs and their reported train losses, rounds 1..3
HAND_ROUNDS = [
    {("0", "a"): 1.0, ("2", "b"): 2.0},
    {("1", "a"): 0.4, ("0", "b"): 0.8},
    {("0", "a"): 0.6, ("1", "b"): 2.0},
]
# gamma = 0.5.  Every round: L *= 0.5, N *= 0.5, D = 0.5 D + 1, then the
# trained pairs get L += loss, N += 1.
#
# t=1 (seeded):   L = seed, N = 1, D = 1 -> U = sqrt(2 log 1 / 1) = 0, A = p * seed
# t=2 (D = 1.5):  (0,a) L = 1.0 + 1.0 = 2.0, N = 0.5 + 1 = 1.5
#                 (2,b) L = 0.5 + 2.0 = 2.5, N = 1.5
#                 (1,a) L = 0.5 N = 0.5; (2,a) L = 0.25 N = 0.5
#                 (0,b) L = 0.75 N = 0.5; (1,b) L = 1.5 N = 0.5
# t=3 (D = 1.75): (0,a) L = 1.0 N = 0.75;  (2,b) L = 1.25 N = 0.75
#                 (1,a) L = 0.25 + 0.4 = 0.65 N = 0.25 + 1 = 1.25
#                 (0,b) L = 0.375 + 0.8 = 1.175 N = 1.25
#                 (2,a) L = 0.125 N = 0.25; (1,b) L = 0.75 N = 0.25
# t=4 (D = 1.875):(0,a) L = 0.5 + 0.6 = 1.1 N = 0.375 + 1 = 1.375
#                 (1,b) L = 0.375 + 2.0 = 2.375 N = 0.125 + 1 = 1.125
#                 (1,a) L = 0.325 N = 0.625; (0,b) L = 0.5875 N = 0.625
#                 (2,a) L = 0.0625 N = 0.125; (2,b) L = 0.625 N = 0.375
HAND_STATS = {
    1: (
        1.0,
        {
            ("0", "a"): (2.0, 1.0),
            ("1", "a"): (1.0, 1.0),
            ("2", "a"): (0.5, 1.0),
            ("0", "b"): (1.5, 1.0),
            ("1", "b"): (3.0, 1.0),
            ("2", "b"): (1.0, 1.0),
        },
    ),
    2: (
        1.5,
        {
            ("0", "a"): (2.0, 1.5),
            ("1", "a"): (0.5, 0.5),
            ("2", "a"): (0.25, 0.5),
            ("0", "b"): (0.75, 0.5),
            ("1", "b"): (1.5, 0.5),
            ("2", "b"): (2.5, 1.5),
        },
    ),
    3: (
        1.75,
        {
            ("0", "a"): (1.0, 0.75),
            ("1", "a"): (0.65, 1.25),
            ("2", "a"): (0.125, 0.25),
            ("0", "b"): (1.175, 1.25),
            ("1", "b"): (0.75, 0.25),
            ("2", "b"): (1.25, 0.75),
        },
    ),
    4: (
        1.875,
        {
            ("0", "a"): (1.1, 1.375),
            ("1", "a"): (0.325, 0.625),
            ("2", "a"): (0.0625, 0.125),
            ("0", "b"): (0.5875, 0.625),
            ("1", "b"): (2.375, 1.125),
            ("2", "b"): (0.625, 0.375),
        },
    ),
}
# A = p (L/N + sqrt(2 log D / N)), a few worked out:
#  t=1: (0,a) 0.1 * 2.0 = 0.2;  (1,b) 0.25 * 3.0 = 0.75
#  t=2: log 1.5 = 0.405465; (0,a) 0.1 * (2/1.5 + sqrt(0.81093/1.5) = 1.333333 + 0.735269)
#       = 0.206860;  (0,b) 0.5 * (1.5 + sqrt(0.81093/0.5) = 1.273523) = 1.386761
#  t=4: log 1.875 = 0.628609; (2,a) 0.6 * (0.5 + sqrt(1.257217/0.125) = 3.171394)
#       = 2.202836;  (1,b) 0.25 * (2.111111 + 1.057131) = 0.792061
HAND_A = {
    1: {("0", "a"): 0.2, ("1", "b"): 0.75},
    2: {("0", "a"): 0.206860, ("0", "b"): 1.386761},
    4: {("2", "a"): 2.202836, ("1", "b"): 0.792061},
}


@pytest.mark.parametrize("cls", [RanklistMultiUCB, ParetoMultiUCB])
def test_index_matches_hand_computation_over_three_rounds(cls):
    pol, table, _ = seeded(cls, HAND_N, HAND_SEED, k=2, gamma=0.5)
    assert table.data_share("a") == pytest.approx({"0": 0.1, "1": 0.3, "2": 0.6})
    assert table.data_share("b") == pytest.approx({"0": 0.5, "1": 0.25, "2": 0.25})
    seed_losses = {(c, t): v for c, d in HAND_SEED.items() for t, v in d.items()}
    for t in range(1, 5):
        if t > 1:
            pol.observe(t - 1, HAND_ROUNDS[t - 2])
        D, stats = HAND_STATS[t]
        # the hand numbers agree with the literal sums of Eqs. 2-4
        rl, rn, rd = reference_stats(seed_losses, HAND_ROUNDS[: t - 1], 0.5)
        assert rd == pytest.approx(D)
        for key, (L, N) in stats.items():
            assert rl[key] == pytest.approx(L) and rn[key] == pytest.approx(N)
        # ... and the policy's statistics
        assert pytest.approx(D, abs=1e-12) == pol.D
        assert set(pol.N) == set(stats)
        for key, (L, N) in stats.items():
            assert pol.L[key] == pytest.approx(L, abs=1e-12), (t, key)
            assert pol.N[key] == pytest.approx(N, abs=1e-12), (t, key)
        ids, a = pol.index(table, TASKS)
        assert ids == ["0", "1", "2"]
        for k, cid in enumerate(ids):
            for i, task in enumerate(TASKS):
                L, N = stats[(cid, task)]
                expect = HAND_P[(cid, task)] * (L / N + math.sqrt(2 * math.log(D) / N))
                assert a[k, i] == pytest.approx(expect, rel=1e-12), (t, cid, task)
        for (cid, task), v in HAND_A.get(t, {}).items():
            assert a[ids.index(cid), TASKS.index(task)] == pytest.approx(v, abs=1e-6)


def test_untrained_pairs_are_discounted_and_bonus_shrinks_with_count():
    pol, table, _ = seeded(RanklistMultiUCB, HAND_N, HAND_SEED, k=2, gamma=0.5)
    bonus_2a = []
    for t, obs in enumerate(HAND_ROUNDS, start=1):
        pol.observe(t, obs)
        # (2,a) is never trained: L and N both halve each round, L/N stays the
        # queried 0.5, N = 0.5^t
        assert pol.N[("2", "a")] == pytest.approx(0.5**t)
        assert pol.L[("2", "a")] / pol.N[("2", "a")] == pytest.approx(0.5)
        ids, a = pol.index(table, TASKS)
        bonus = {}
        for k, cid in enumerate(ids):
            for i, task in enumerate(TASKS):
                key = (cid, task)
                bonus[key] = a[k, i] / HAND_P[key] - pol.L[key] / pol.N[key]
                assert bonus[key] == pytest.approx(math.sqrt(2 * math.log(pol.D) / pol.N[key]))
        # at a fixed t (one D), the exploration bonus is strictly decreasing in N
        for x, y in itertools.combinations(bonus, 2):
            if pol.N[x] < pol.N[y] - 1e-12:
                assert bonus[x] > bonus[y]
            elif abs(pol.N[x] - pol.N[y]) <= 1e-12:
                assert bonus[x] == pytest.approx(bonus[y])
        bonus_2a.append(bonus[("2", "a")])
    # the neglected pair's bonus grows round after round (its N shrinks)
    assert bonus_2a[0] < bonus_2a[1] < bonus_2a[2]
    # counts: (0,a) trained in rounds 1 and 3 -> N = 0.125 + 0.25 + 1 = 1.375 > 1
    assert pol.N[("0", "a")] == pytest.approx(1.375)
    # repeated training of one pair raises its count, lowering its bonus vs. a
    # fresh pair with the same D: train (1,b) 5 more rounds
    for t in range(4, 9):
        pol.observe(t, {("1", "b"): 1.0})
    ids, a = pol.index(table, TASKS)
    assert pol.N[("1", "b")] > pol.N[("0", "b")]
    b1 = a[1, 1] / 0.25 - pol.L[("1", "b")] / pol.N[("1", "b")]
    b0 = a[0, 1] / 0.5 - pol.L[("0", "b")] / pol.N[("0", "b")]
    assert b1 < b0


def test_non_finite_loss_is_not_counted():
    pol, table, _ = seeded(RanklistMultiUCB, HAND_N, HAND_SEED, k=2, gamma=0.5)
    pol.observe(1, {("0", "a"): float("nan"), ("1", "a"): float("inf")})
    # both discounted only: N = 0.5, L = seed / 2
    assert pol.N[("0", "a")] == pytest.approx(0.5) and pol.L[("0", "a")] == pytest.approx(1.0)
    assert pol.N[("1", "a")] == pytest.approx(0.5) and pol.L[("1", "a")] == pytest.approx(0.5)


# ====================================================== 2. Ranklist (Alg. 3)
# 4 clients, equal n on both tasks -> p = 1/4 for all, and with D = 1 after
# seeding (U = 0) A = loss / 4: the rank lists follow the queried losses.
#   a: 4, 3, 2, 1  -> list a = [0, 1, 2, 3]
#   b: 5, 1, 4, 3  -> list b = [0, 2, 3, 1]   (client 0 tops both lists)
RL_N = {str(c): {"a": 10, "b": 10} for c in range(4)}
RL_LOSS = {
    "0": {"a": 4.0, "b": 5.0},
    "1": {"a": 3.0, "b": 1.0},
    "2": {"a": 2.0, "b": 4.0},
    "3": {"a": 1.0, "b": 3.0},
}


@pytest.mark.parametrize(
    "k, t, expected",
    [
        # t even: start on a: 0->a; b: 0 taken -> 2->b
        (2, 2, [("0", "a"), ("2", "b")]),
        # t odd: start on b: 0->b; a: 0 taken -> 1->a
        (2, 1, [("0", "b"), ("1", "a")]),
        (2, 3, [("0", "b"), ("1", "a")]),
        # K=3, t=2: 0->a, 2->b, 1->a
        (3, 2, [("0", "a"), ("2", "b"), ("1", "a")]),
        # K=3, t=1: 0->b, 1->a, 2->b
        (3, 1, [("0", "b"), ("1", "a"), ("2", "b")]),
        # K=4, t=2: 0->a, 2->b, 1->a, 3->b
        (4, 2, [("0", "a"), ("2", "b"), ("1", "a"), ("3", "b")]),
        # K=4, t=1: 0->b, 1->a, 2->b, 3->a
        (4, 1, [("0", "b"), ("1", "a"), ("2", "b"), ("3", "a")]),
        # K > clients: every client once, then stop
        (7, 1, [("0", "b"), ("1", "a"), ("2", "b"), ("3", "a")]),
    ],
)
def test_ranklist_hand_examples(k, t, expected):
    pol, table, _ = seeded(RanklistMultiUCB, RL_N, RL_LOSS, k=k)
    picks = pol.assign(table, TASKS, t, np.random.default_rng(1))
    assert tuples(picks) == expected
    assert all(p.count == 1 and p.prob == 1.0 for p in picks)


def test_ranklist_skips_exhausted_lists():
    # only client 0 holds b; clients 1, 2 hold a only.  p: a 1/3 each, b 1 for 0.
    n = {"0": {"a": 10, "b": 10}, "1": {"a": 10}, "2": {"a": 10}}
    losses = {"0": {"a": 3.0, "b": 1.0}, "1": {"a": 2.0}, "2": {"a": 1.0}}
    pol, table, _ = seeded(RanklistMultiUCB, n, losses, k=3)
    # t=1: b: 0->b; a: 0 taken -> 1->a; b exhausted, skipped; a: 2->a
    assert tuples(pol.assign(table, TASKS, 1, np.random.default_rng(0))) == [
        ("0", "b"),
        ("1", "a"),
        ("2", "a"),
    ]
    # t=0: a: 0->a; b: only 0, taken -> exhausted; a: 1, then 2
    assert tuples(pol.assign(table, TASKS, 0, np.random.default_rng(0))) == [
        ("0", "a"),
        ("1", "a"),
        ("2", "a"),
    ]
    # a model nobody holds data for: always exhausted, never loops forever
    # t=2: model 2 (zzz) exhausted; a: 0; b: 0 taken -> exhausted; zzz; a: 1; ...; a: 2
    assert tuples(pol.assign(table, ["a", "b", "zzz"], 2, np.random.default_rng(0))) == [
        ("0", "a"),
        ("1", "a"),
        ("2", "a"),
    ]


def test_ranklist_three_models_starting_model_is_t_mod_m():
    # three models, client c has loss 1 + c on every model: every list is
    # [3, 2, 1, 0]; with K=1 the single pick is client 3 on model t mod 3
    n = {str(c): {t: 10 for t in "xyz"} for c in range(4)}
    losses = {str(c): {t: 1.0 + c for t in "xyz"} for c in range(4)}
    pol, table, _ = seeded(RanklistMultiUCB, n, losses, k=1, tasks=list("xyz"))
    for t in range(7):
        assert tuples(pol.assign(table, list("xyz"), t, np.random.default_rng(0))) == [
            ("3", "xyz"[t % 3])
        ]


def test_ranklist_matches_algorithm_3_on_random_instances():
    rng = np.random.default_rng(2024)
    for trial in range(300):
        n_clients = int(rng.integers(1, 12))
        m = int(rng.integers(1, 4))
        tasks = [f"m{i}" for i in range(m)]
        n, losses = {}, {}
        for c in range(n_clients):
            held = [t for t in tasks if rng.random() < 0.7] or [tasks[int(rng.integers(m))]]
            n[str(c)] = {t: 10 for t in held}
            losses[str(c)] = {t: float(rng.uniform(0.1, 5.0)) for t in held}
        k = int(rng.integers(1, n_clients + 3))
        t = int(rng.integers(0, 10))
        pol, table, _ = seeded(RanklistMultiUCB, n, losses, k=k, tasks=tasks)
        picks = pol.assign(table, tasks, t, np.random.default_rng(0))
        # reference on the losses, scaled by the (equal within a model) share
        a = np.full((n_clients, m), -np.inf)
        for c in range(n_clients):
            for i, task in enumerate(tasks):
                if task in n[str(c)]:
                    a[c, i] = losses[str(c)][task] / sum(
                        task in n[str(j)] for j in range(n_clients)
                    )
        expected = [(str(j), tasks[i]) for j, i in ref_ranklist(a, k, t)]
        assert tuples(picks) == expected, (trial, k, t)
        cids = [p.cid for p in picks]
        assert len(set(cids)) == len(cids)
        assert len(picks) == min(k, n_clients)
        for p in picks:
            assert p.task in n[p.cid]


# ======================================================== 3. Pareto (Alg. 4)
def test_pareto_front_matches_brute_force_on_random_integer_matrices():
    rng = np.random.default_rng(7)
    for m in range(1, 5):
        for trial in range(250):
            n = int(rng.integers(1, 30))
            hi = int(rng.integers(1, 5))
            a = rng.integers(0, hi + 1, size=(n, m)).astype(float)
            if n > 2 and rng.random() < 0.5:  # explicit duplicate rows
                a[rng.integers(n)] = a[rng.integers(n)]
            got = pareto_front(a)
            assert got.dtype.kind == "i"
            assert list(got) == sorted(brute_front(a)), (m, trial, a.tolist())
    assert pareto_front(np.zeros((0, 3))).size == 0
    # all identical rows: nobody dominates anybody
    assert list(pareto_front(np.ones((5, 3)))) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        pareto_front(np.zeros(4))


def test_pareto_front_hand_examples():
    # (3,1) (1,3) (2,2) (2,1) (3,1): (2,1) is dominated by (3,1) and (2,2);
    # the duplicate (3,1) rows do not dominate each other
    a = np.array([[3, 1], [1, 3], [2, 2], [2, 1], [3, 1]], dtype=float)
    assert list(pareto_front(a)) == [0, 1, 2, 4]
    # 3-D: (1,1,1) is dominated by (1,1,2); (0,2,0) and (2,0,0) are not
    a = np.array([[1, 1, 1], [1, 1, 2], [0, 2, 0], [2, 0, 0]], dtype=float)
    assert list(pareto_front(a)) == [1, 2, 3]
    # 1-D: all maxima
    assert list(pareto_front(np.array([[1.0], [3.0], [2.0], [3.0]]))) == [1, 3]


# 7 clients, equal n, A = loss / 7 (U = 0 after seeding).
#   a: 5 4 3 2 1 2 1       b: 1 2 3 4 5 1 1
# front = {0,1,2,3,4} (an antichain); 5 = (2,1) <= 3 = (2,4); 6 = (1,1) <= 4.
# rank list a (desc, ties by id): [0,1,2,3,5,4,6] -> ranks 0:0 1:1 2:2 3:3 4:5
# rank list b: [4,3,2,1,0,5,6] -> ranks 0:4 1:3 2:2 3:1 4:0
# best-rank model: 0->a (0<4), 1->a (1<3), 2->a (2=2, tie -> lower index), 3->b, 4->b
PF_N = {str(c): {"a": 10, "b": 10} for c in range(7)}
PF_A = [5, 4, 3, 2, 1, 2, 1]
PF_B = [1, 2, 3, 4, 5, 1, 1]
PF_LOSS = {str(c): {"a": float(PF_A[c]), "b": float(PF_B[c])} for c in range(7)}
PF_MODEL = {"0": "a", "1": "a", "2": "a", "3": "b", "4": "b"}


@pytest.mark.parametrize("k", [5, 6, 10])
def test_pareto_selects_whole_front_when_it_fits(k):
    pol, table, _ = seeded(ParetoMultiUCB, PF_N, PF_LOSS, k=k)
    picks = pol.assign(table, TASKS, 3, np.random.default_rng(0))
    assert sorted(tuples(picks)) == sorted(PF_MODEL.items())


def test_pareto_samples_k_of_the_front_uniformly():
    pol, table, _ = seeded(ParetoMultiUCB, PF_N, PF_LOSS, k=2)
    rng = np.random.default_rng(99)
    trials = 4000
    single: Counter = Counter()
    pairs: Counter = Counter()
    for _ in range(trials):
        picks = pol.assign(table, TASKS, 2, rng)
        cids = [p.cid for p in picks]
        assert len(picks) == 2 and len(set(cids)) == 2
        for p in picks:
            assert PF_MODEL[p.cid] == p.task  # only front clients, on their best model
        single.update(cids)
        pairs[frozenset(cids)] += 1
    # each of the 5 front clients: P = K/F = 2/5; stderr sqrt(.4*.6/4000) = .0077
    for c in PF_MODEL:
        assert abs(single[c] / trials - 0.4) < 5 * math.sqrt(0.4 * 0.6 / trials)
    # each of the C(5,2) = 10 pairs: P = 1/10; stderr sqrt(.1*.9/4000) = .0047
    assert len(pairs) == 10
    for v in pairs.values():
        assert abs(v / trials - 0.1) < 5 * math.sqrt(0.1 * 0.9 / trials)


def test_pareto_matches_reference_on_random_instances():
    rng = np.random.default_rng(11)
    for trial in range(200):
        n_clients = int(rng.integers(1, 10))
        m = int(rng.integers(1, 4))
        tasks = [f"m{i}" for i in range(m)]
        n, losses = {}, {}
        for c in range(n_clients):
            held = [t for t in tasks if rng.random() < 0.8] or [tasks[int(rng.integers(m))]]
            n[str(c)] = {t: 10 for t in held}
            # integer losses: many ties in scores and ranks
            losses[str(c)] = {t: float(rng.integers(1, 4)) for t in held}
        k = int(rng.integers(1, n_clients + 2))
        pol, table, _ = seeded(ParetoMultiUCB, n, losses, k=k, tasks=tasks)
        picks = pol.assign(table, tasks, trial, np.random.default_rng(trial))
        # reference on A = loss / |eligible for the model| (same order as A)
        a = np.full((n_clients, m), -np.inf)
        for c in range(n_clients):
            for i, task in enumerate(tasks):
                if task in n[str(c)]:
                    a[c, i] = losses[str(c)][task] / sum(
                        task in n[str(j)] for j in range(n_clients)
                    )
        front = brute_front(a)
        ranks = ref_ranks(a)
        cids = [int(p.cid) for p in picks]
        assert len(set(cids)) == len(cids) == min(k, len(front)), (trial, k, front)
        assert set(cids) <= front
        if len(front) <= k:
            assert set(cids) == front
        for p in picks:
            c = int(p.cid)
            best = min(range(m), key=lambda i: (ranks[c, i], i))
            assert p.task == tasks[best], (trial, c, ranks[c])


# ===================================================== 4. initialisation modes
@pytest.mark.parametrize("cls", [RanklistMultiUCB, ParetoMultiUCB])
def test_init_train_explores_untried_pairs_within_k(cls):
    n = {str(c): {"a": 10 + c, "b": 20 - c} for c in range(5)}
    n["5"] = {"a": 7}  # holds one task only
    table = make_table(n)
    pol = cls(2, 0.9, "train")
    rng = np.random.default_rng(3)
    untried = {(c, t) for c, d in n.items() for t in d}
    rounds = 0
    while untried:
        assert pol.needs_losses is False
        rounds += 1
        picks = pol.assign(table, TASKS, rounds, rng)
        cids = [p.cid for p in picks]
        assert 1 <= len(picks) <= 2
        assert len(set(cids)) == len(cids)
        assert all((p.cid, p.task) in untried for p in picks)
        obs = {(p.cid, p.task): 1.0 + 0.1 * rounds for p in picks}
        pol.observe(rounds, obs)
        untried -= set(obs)
        assert rounds <= 11
    assert pol.needs_losses is False
    assert set(pol.N) == {(c, t) for c, d in n.items() for t in d}
    # from now on the index decides: K distinct clients
    for t in range(rounds + 1, rounds + 4):
        picks = pol.assign(table, TASKS, t, rng)
        cids = [p.cid for p in picks]
        assert len(set(cids)) == len(cids) and 1 <= len(picks) <= 2
        if cls is RanklistMultiUCB:
            assert len(picks) == 2
        pol.observe(t, {(p.cid, p.task): 1.0 for p in picks})
    assert pol.needs_losses is False


def test_init_train_retries_a_pair_whose_training_reported_nothing():
    # a pair whose training fails (no observation) stays untried and is retried
    table = make_table({"0": {"a": 5}, "1": {"a": 5}})
    pol = RanklistMultiUCB(1, 0.9, "train")
    rng = np.random.default_rng(0)
    seen = set()
    for t in range(1, 6):
        picks = pol.assign(table, ["a"], t, rng)
        assert len(picks) == 1
        seen.add(picks[0].cid)
        pol.observe(t, {})  # nobody reports
    assert seen == {"0", "1"} and not pol.N


def test_init_loss_query_needs_losses_until_every_pair_is_seeded():
    n = {"0": {"a": 10, "b": 10}, "1": {"a": 10, "b": 10}, "2": {"a": 10}}
    table = make_table(n, {"0": {"a": 1.0, "b": 2.0}, "1": {"a": 3.0}, "2": {"a": 0.5}})
    pol = ParetoMultiUCB(2, 0.9)  # default init = loss-query
    assert pol.init == "loss-query"
    assert pol.needs_losses is True
    picks = pol.assign(table, TASKS, 1, np.random.default_rng(0))
    # (1,b) had no loss: not seeded, still needed, and not picked on b
    assert ("1", "b") not in pol.N and pol.needs_losses is True
    assert ("1", "b") not in tuples(picks)
    assert {k: (pol.L[k], pol.N[k]) for k in pol.N} == {
        ("0", "a"): (1.0, 1.0),
        ("0", "b"): (2.0, 1.0),
        ("1", "a"): (3.0, 1.0),
        ("2", "a"): (0.5, 1.0),
    }
    assert pol.D == 1.0
    pol.observe(1, {(p.cid, p.task): 1.0 for p in picks})
    table.set_loss("1", "b", 4.0, 2)  # the next loss query answers
    pol.assign(table, TASKS, 2, np.random.default_rng(0))
    assert pol.needs_losses is False
    assert (pol.L[("1", "b")], pol.N[("1", "b")]) == (4.0, 1.0)  # first sample, undiscounted


@pytest.mark.parametrize("cls", [RanklistMultiUCB, ParetoMultiUCB])
def test_init_loss_query_late_joiner_makes_needs_losses_true_again(cls):
    pol, table, _ = seeded(cls, HAND_N, HAND_SEED, k=2, gamma=0.5)
    assert pol.needs_losses is False
    pol.observe(1, {("0", "a"): 1.0})
    table.upsert(ClientInfo(cid="3", num_examples={"a": 40, "b": 40}))  # no stats yet
    picks = pol.assign(table, TASKS, 2, np.random.default_rng(0))
    assert "3" not in [p.cid for p in picks]  # no index yet: not picked
    assert pol.needs_losses is True
    ids, a = pol.index(table, TASKS)
    assert np.all(np.isneginf(a[ids.index("3")]))
    pol.observe(2, {("0", "b"): 1.0})
    table.set_loss("3", "a", 9.0, 3)
    table.set_loss("3", "b", 8.0, 3)
    pol.assign(table, TASKS, 3, np.random.default_rng(0))
    assert pol.needs_losses is False
    assert (pol.L[("3", "a")], pol.N[("3", "a")]) == (9.0, 1.0)
    assert (pol.L[("3", "b")], pol.N[("3", "b")]) == (8.0, 1.0)
    # the old pairs were not re-seeded by the new query: (2,a) never trained,
    # seeded 0.5 at time 0, discounted twice -> N = 0.25, L = 0.125
    assert pol.N[("2", "a")] == pytest.approx(0.25) and pol.L[("2", "a")] == pytest.approx(0.125)


def test_constructor_validation():
    for bad in (0, -1, None, 1.5, True):
        with pytest.raises(ValueError):
            RanklistMultiUCB(bad)  # type: ignore[arg-type]
    for g in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            ParetoMultiUCB(2, g)
    with pytest.raises(ValueError):
        ParetoMultiUCB(2, 0.9, "bogus")
    assert RanklistMultiUCB(3, 0.7, "train").config() == {
        "clients_per_round": 3,
        "gamma": 0.7,
        "init": "train",
    }


# ======================================================= 5. state round trip
@pytest.mark.parametrize("cls", [RanklistMultiUCB, ParetoMultiUCB])
@pytest.mark.parametrize("init", ["loss-query", "train"])
def test_state_dict_round_trip_gives_identical_picks(cls, init):
    rng_data = np.random.default_rng(5)
    n = {
        str(c): {"a": int(rng_data.integers(5, 50)), "b": int(rng_data.integers(5, 50))}
        for c in range(8)
    }
    losses = {c: {t: float(rng_data.uniform(0.1, 3)) for t in TASKS} for c in n}
    table = make_table(n, losses)
    pol = cls(3, 0.8, init)
    rng = np.random.default_rng(0)

    def step(p, t, r):
        picks = p.assign(table, TASKS, t, r)
        p.observe(t, {(q.cid, q.task): 0.5 + ((int(q.cid) * 7 + t) % 5) / 3 for q in picks})
        return tuples(picks)

    for t in range(1, 4):  # for init=train: still exploring after 3 rounds
        step(pol, t, rng)
    state = json.loads(json.dumps(pol.state_dict()))  # plain data
    other = cls(3, 0.8, init)
    other.load_state_dict(state)
    assert other.needs_losses == pol.needs_losses
    r1 = np.random.default_rng(123)
    r2 = np.random.default_rng(123)
    for t in range(4, 12):
        assert step(pol, t, r1) == step(other, t, r2)
    assert pol.state_dict() == other.state_dict()


# ===================================================== 6. strategy level
SHAPES = {"w": (2, 3), "b": (3,)}


def fake(n: int, qloss: float, tloss: float, fail: bool = False) -> StepTrainer:
    """``train`` returns ``w - 0.01`` and a train loss that decays by 0.8 with
    each training of this (client, task); ``loss`` is fixed."""
    return StepTrainer(n, 0.01, qloss, train_loss=tloss, fail=fail, train_loss_decay=0.8)


def qloss_of(c: int, task: str) -> float:
    return 1.0 + 0.37 * ((c * 3 + (task == "b") * 5) % 7)


@dataclass
class Log:
    queries: list[tuple[int, str]] = field(default_factory=list)  # (round, cid)
    trains: list[tuple[int, str, list[str]]] = field(default_factory=list)  # (round, cid, tasks)
    losses: dict[int, dict[tuple[str, str], float]] = field(default_factory=dict)


def run_ucb(
    preset, k=2, rounds=6, n_clients=8, failing=("5",), init="loss-query", hook=None
) -> tuple[Any, Any, Log]:
    def spec_fn(ctx: Context) -> ClientSpec:
        cid = str(ctx.node_config["cid"])
        c = int(cid)
        trainers = {
            t: fake(
                10 + 5 * c + (t == "b") * (40 - 5 * c),
                qloss_of(c, t),
                0.5 + 0.3 * ((c + (t == "a")) % 4),
                fail=cid in failing,
            )
            for t in TASKS
        }
        return ClientSpec(client_id=cid, trainers=trainers)

    app = make_client_app(spec_fn)
    log = Log()

    def recording(msg: Message, ctx: Context) -> Message:
        cid = str(ctx.node_config["cid"])
        rnd = int(msg.metadata.group_id)
        mtype = msg.metadata.message_type
        sent = [P.task_of(key, P.ARRAYS_PREFIX) for key in msg.content.array_records]
        if mtype == P.QUERY_LOSSES:
            log.queries.append((rnd, cid))
        elif mtype == MessageType.TRAIN:
            log.trains.append((rnd, cid, sent))
        reply = app(msg, ctx)  # may raise (the crashing client): no loss recorded
        if mtype == MessageType.TRAIN:
            for t in sent:
                m = reply.content.metric_records[P.metrics_key(t)]
                log.losses.setdefault(rnd, {})[(cid, t)] = float(m[P.TRAIN_LOSS])
        return reply

    grid = InProcessGrid(recording, [{"cid": str(c)} for c in range(n_clients)], seed=0)
    strategy = preset(clients_per_round=k, gamma=0.7, init=init, seed=0, node_wait_timeout=0.0)
    if hook is not None:
        strategy.on_round_end = lambda rnd, rows: hook(rnd, grid, strategy)
    init_arrays = {
        t: numpy_to_arrays({n: np.zeros(s, np.float32) for n, s in SHAPES.items()}) for t in TASKS
    }
    result = strategy.start(grid, init_arrays, num_rounds=rounds, timeout=60)
    return result, strategy, log


@pytest.mark.parametrize("preset", [ranklist_ucb, pareto_ucb])
def test_strategy_k_clients_one_query_and_stats_from_train_losses(preset):
    rounds, k, n_clients = 6, 2, 8
    # (no crashing client here: how a picked pair that reports nothing should
    # count is the subject of the regression tests at the end of this file)
    result, strategy, log = run_ucb(preset, k=k, rounds=rounds, n_clients=n_clients, failing=())
    # one loss query per client, all in round 1
    assert sorted(log.queries) == [(1, str(c)) for c in range(n_clients)]
    per_round = Counter(r for r, _, _ in log.trains)
    for rnd in range(1, rounds + 1):
        trained = [(c, ts) for r, c, ts in log.trains if r == rnd]
        # the authors' bug is not reproduced: never more than K clients
        assert 1 <= len(trained) <= k, (rnd, trained)
        assert len({c for c, _ in trained}) == len(trained)
        assert all(len(ts) == 1 for _, ts in trained)  # one model per client
        assert sorted(result.assignments[rnd]) == sorted((c, ts[0], 1) for c, ts in trained)
    if preset is ranklist_ucb:
        assert all(per_round[r] == k for r in range(1, rounds + 1))
    # the policy's statistics = Eqs. 2-4 over the queried losses (time 0) and the
    # train losses of the accepted updates
    seeds = {(str(c), t): qloss_of(c, t) for c in range(n_clients) for t in TASKS}
    obs = [{key: v for key, v in log.losses.get(r, {}).items()} for r in range(1, rounds + 1)]
    L, N, D = reference_stats(seeds, obs, 0.7)
    pol = strategy.policy
    assert pytest.approx(D) == pol.D
    assert set(pol.N) == set(N)
    for key in N:
        assert pol.N[key] == pytest.approx(N[key]), key
        assert pol.L[key] == pytest.approx(L[key]), key
    for row in result.history:
        if row["round"] >= 1:
            assert row["assigned"] <= k and row["uploads"] <= row["assigned"]


@pytest.mark.parametrize("preset", [ranklist_ucb, pareto_ucb])
def test_strategy_init_train_never_queries_and_stays_within_k(preset):
    result, strategy, log = run_ucb(preset, k=3, rounds=8, n_clients=6, failing=(), init="train")
    assert log.queries == []
    for rnd in range(1, 9):
        cids = [c for r, c, _ in log.trains if r == rnd]
        assert 1 <= len(cids) <= 3 and len(set(cids)) == len(cids)
    assert all(len(ts) == 1 for _, _, ts in log.trains)
    # exactly the pairs trained so far have statistics
    trained = {(c, ts[0]) for _, c, ts in log.trains}
    assert set(strategy.policy.N) == trained


def test_strategy_late_joiner_gets_a_loss_query_and_is_seeded():
    def hook(rnd, grid, strategy):
        if rnd == 2:
            grid.add_node({"cid": "9"})

    result, strategy, log = run_ucb(ranklist_ucb, k=2, rounds=5, n_clients=4, failing=(), hook=hook)
    q9 = [r for r, c in log.queries if c == "9"]
    assert len(q9) == 1 and q9[0] in (3, 4)
    assert ("9", "a") in strategy.policy.N and ("9", "b") in strategy.policy.N
    assert strategy.policy.needs_losses is False
    for rnd in range(1, 6):
        assert len([c for r, c, _ in log.trains if r == rnd]) <= 2


@pytest.mark.parametrize("name", ["ranklist-ucb", "pareto-ucb"])
def test_runner_inprocess_synthetic_tasks(tmp_path, name):
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run

    s = Settings(
        strategy=name,
        clients_per_round=2,
        tasks="synthetic,synthetic-b",
        num_clients=10,
        num_rounds=3,
        output_dir=str(tmp_path),
    )
    result = run(s, engine="inprocess")
    assert {r["task"] for r in result.history} == {"synthetic", "synthetic-b"}
    for row in result.history:
        assert math.isfinite(row["accuracy"]) and math.isfinite(row["loss"])
        if row["round"] >= 1:
            assert math.isfinite(row["step_l1"])
    for rnd in range(1, 4):
        picks = result.assignments[rnd]
        assert 1 <= len(picks) <= 2 and len({c for c, _, _ in picks}) == len(picks)
    assert (tmp_path / "metrics.csv").exists()


@pytest.mark.parametrize("name", ["ranklist-ucb", "pareto-ucb"])
def test_settings_ucb_k_defaults_or_is_checked(name):
    from mmfl_flwr.config import Settings

    Settings(strategy=name, clients_per_round=0).validate()  # K = default_ucb_clients
    with pytest.raises(ValueError, match="clients-per-round"):
        Settings(strategy=name, clients_per_round=-1).validate()
    Settings(strategy=name, clients_per_round=2).validate()


# ================================ regressions of bugs found and fixed
# A pair that is picked but reports no train loss (crash, timeout, or a reply
# without ``train-loss``) is never counted: ``observe`` only increments N for
# pairs with a reported loss (ucb.py, observe, ~line 138-142; strategy.py
# ~line 513-521 passes only the reported losses).  Its N then decays by gamma
# every round while L/N stays constant, so its bonus sqrt(2 log D / N) grows
# without bound and it is picked again every round.  Eq. 3 counts *selections*
# (1[k in S^(n)]), not reports.
_STARVE = (
    "BUG ucb.py _UCBBase.observe (~l.132-142) + strategy.py aggregate_train "
    "(~l.521): a picked pair that reports no train loss is not counted in N, so "
    "its UCB bonus grows without bound and it is re-picked every round (Pareto: "
    "it alone; nobody else trains). Fix: count every selection in N (Eq. 3, "
    "1[k in S^(n)]), e.g. remember the picks returned by assign and in observe "
    "add N += 1 for each (L += the loss if reported, else 0 or the current mean)."
)


@pytest.mark.parametrize("preset", [ranklist_ucb, pareto_ucb])
def test_a_client_that_always_crashes_does_not_take_a_slot_every_round(preset):
    rounds = 16
    _, _, log = run_ucb(preset, k=2, rounds=rounds, n_clients=8, failing=("5",))
    picked_5 = [r for r, c, _ in log.trains if c == "5"]
    healthy_uploads = sum(len(v) for v in log.losses.values())
    # observed today: "5" is picked in 15-16 of 16 rounds; under Pareto, from
    # round 4 on it is the only client picked, so no model is updated at all
    assert len(picked_5) <= rounds // 2, picked_5
    assert healthy_uploads >= rounds, healthy_uploads


def test_a_client_omitting_train_loss_does_not_get_a_permanent_seat():
    def spec_fn(ctx: Context) -> ClientSpec:
        c = int(ctx.node_config["cid"])
        return ClientSpec(str(c), {t: fake(20, qloss_of(c, t), 0.5) for t in TASKS})

    app = make_client_app(spec_fn)
    trained: list[tuple[int, str]] = []

    def hostile(msg: Message, ctx: Context) -> Message:
        reply = app(msg, ctx)
        if msg.metadata.message_type == MessageType.TRAIN:
            cid = str(ctx.node_config["cid"])
            trained.append((int(msg.metadata.group_id), cid))
            if cid == "3":
                for key in list(reply.content.metric_records):
                    del reply.content.metric_records[key][P.TRAIN_LOSS]
        return reply

    grid = InProcessGrid(hostile, [{"cid": str(c)} for c in range(8)], seed=0)
    strategy = pareto_ucb(clients_per_round=2, gamma=0.7, seed=0, node_wait_timeout=0.0)
    init_arrays = {
        t: numpy_to_arrays({n: np.zeros(s, np.float32) for n, s in SHAPES.items()}) for t in TASKS
    }
    result = strategy.start(grid, init_arrays, num_rounds=12, timeout=60)
    rounds_3 = {r for r, c in trained if c == "3"}
    # its update is accepted (uploads > 0 whenever it trains) ...
    assert sum(row["uploads"] for row in result.history) > 0
    # ... and it must not be picked in (nearly) every round
    assert len(rounds_3) <= 6, sorted(rounds_3)


def test_init_train_a_never_reporting_pair_does_not_block_the_index_phase():
    n = {str(c): {"a": 10, "b": 10} for c in range(4)}
    table = make_table(n)
    pol = RanklistMultiUCB(2, 0.9, "train")
    rng = np.random.default_rng(0)
    sizes = []
    for t in range(1, 21):
        picks = pol.assign(table, TASKS, t, rng)
        sizes.append(len(picks))
        pol.observe(t, {(p.cid, p.task): 1.0 for p in picks if p.cid != "0"}, picks)
    # 6 healthy pairs are explored within a few rounds; afterwards K=2 clients
    # should train per round (today: only client "0", retried forever)
    assert sizes[-5:] == [2] * 5, sizes


def test_late_joiner_is_queried_in_the_round_it_joins():
    def hook(rnd, grid, strategy):
        if rnd == 2:
            grid.add_node({"cid": "9"})  # registers at the start of round 3

    _, _, log = run_ucb(ranklist_ucb, k=2, rounds=4, n_clients=4, failing=(), hook=hook)
    assert [r for r, c in log.queries if c == "9"] == [3]


# ------------------------------------------- inclusion probabilities (issue 11)
@pytest.mark.parametrize("k, prob", [(2, 2 / 5), (3, 3 / 5), (5, 1.0), (6, 1.0)])
def test_pareto_picks_carry_k_over_front_size(k, prob):
    """A sampled front member is picked with probability K/|front| (the front
    here has 5 clients; the Monte Carlo test above confirms 2/5 for K = 2); a
    front that fits is taken whole, probability 1."""
    pol, table, _ = seeded(ParetoMultiUCB, PF_N, PF_LOSS, k=k)
    picks = pol.assign(table, TASKS, 3, np.random.default_rng(0))
    assert picks and all(p.prob == pytest.approx(prob, rel=1e-12) for p in picks)


@pytest.mark.parametrize("policy_cls", [RanklistMultiUCB, ParetoMultiUCB])
@pytest.mark.parametrize(
    "aggregator",
    [
        "UnbiasedAggregator",
        "FedStaleAggregator",
        "FedVARPAggregator",
        "StaleVRAggregator",
        "StaleVREAggregator",
        "ScaffoldAggregator",
    ],
)
def test_ucb_with_probability_weighted_aggregators_is_refused(policy_cls, aggregator):
    """The UCB picks follow from the losses, not from a random draw with known
    inclusion probabilities, so the d/(B p) rules (paper 003, Eq. 3, 17, 18)
    would be biased: refused in the constructor with a clear message."""
    import mmfl_flwr
    from mmfl_flwr.strategy import MultiModelStrategy

    cls = getattr(mmfl_flwr, aggregator)
    with pytest.raises(ValueError, match="inclusion probabilit.*FedAvgAggregator"):
        MultiModelStrategy(policy_cls(2), cls())


def test_ucb_presets_refuse_unbiased_but_take_fedavg_and_mifa():
    from mmfl_flwr.core.stale import MIFAAggregator
    from mmfl_flwr.presets import pareto_ucb, ranklist_ucb
    from mmfl_flwr.strategy import MultiModelStrategy

    for preset in (ranklist_ucb, pareto_ucb):
        with pytest.raises(ValueError, match="inclusion probabilit"):
            preset(clients_per_round=2, aggregator="unbiased")
        assert preset(clients_per_round=2, aggregator="fedavg").aggregator.name == "fedavg"
    MultiModelStrategy(ParetoMultiUCB(2), MIFAAggregator())  # no d/(B p): accepted
