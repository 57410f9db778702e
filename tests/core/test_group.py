"""Tests of MMFL-Group Sampling (papers 000/001, Algorithm 1).

- :func:`c_step` on loss vectors with planted clusters (well-separated Gaussian
  blobs): recovery (adjusted Rand index), the choice of ``k`` (``k >= S``),
  silhouette sampling for large federations, tiny federations, invalid input.
- :class:`GroupSampling`: the round-robin of models over groups (every
  (model, group) pair once per cycle, pseudo-models = the highest-loss models),
  ``assign`` (per-group sample sizes, one model per client, cycle boundaries,
  when a loss query is needed and of whom), newcomers (cosine, no new C-step),
  the modified C-step, models that arrive mid-cycle, and the state round trip.
- The strategy on the in-process engine with the real runner: cluster records,
  recovery of the planted client clusters of the ``clusters-consistent``
  profile, the ``modified`` variant, resuming.
- The ``clusters-*`` federation profiles themselves.

Every expected value is derived from the planted structure or the paper's rules,
never from the code under test.
"""

from __future__ import annotations

import copy
import csv
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from mmfl_flwr.core.clients import ClientInfo, ClientTable
from mmfl_flwr.core.group import GroupSampling, c_step, nearest_by_cosine
from mmfl_flwr.tasks.federation import PROFILES, build_federation

TASKS3 = ["a", "b", "c"]


# --------------------------------------------------------------------- helpers
def blobs(
    sizes: list[int],
    dim: int,
    seed: int,
    spread: float = 0.05,
    min_sep: float = 1.0,
    low: float = 0.5,
    high: float = 5.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Well-separated Gaussian blobs (positive, loss-like values), rows shuffled.

    Returns ``(x, labels)`` with ``labels[i]`` the planted blob of row ``i``."""
    rng = np.random.default_rng(seed)
    k = len(sizes)
    for _ in range(1000):
        centers = rng.uniform(low, high, size=(k, dim))
        d = np.linalg.norm(centers[:, None] - centers[None], axis=-1)
        if k < 2 or d[np.triu_indices(k, 1)].min() >= min_sep:
            break
    else:  # pragma: no cover - the box is large enough
        raise RuntimeError("could not place the blob centres")
    labels = np.repeat(np.arange(k), sizes)
    perm = rng.permutation(labels.shape[0])
    labels = labels[perm]
    x = centers[labels] + rng.normal(0.0, spread, size=(labels.shape[0], dim))
    return x, labels


def make_table(
    losses: np.ndarray, tasks: list[str], ids: list[str] | None = None, n: int = 10
) -> ClientTable:
    """A client table: client ``i`` holds ``n`` examples of every task and
    reports ``losses[i]``."""
    table = ClientTable()
    for i, row in enumerate(np.asarray(losses)):
        cid = str(i) if ids is None else ids[i]
        table.upsert(
            ClientInfo(
                cid=cid,
                num_examples={t: n for t in tasks},
                losses={t: float(v) for t, v in zip(tasks, row)},
            )
        )
    return table


def add_client(table: ClientTable, cid: str, tasks: list[str], losses=None, n: int = 10):
    table.upsert(
        ClientInfo(
            cid=cid,
            num_examples={t: n for t in tasks},
            losses={} if losses is None else {t: float(v) for t, v in zip(tasks, losses)},
        )
    )


def set_all_losses(table: ClientTable, losses: dict[str, float]) -> None:
    for cid in table.ids():
        for t, v in losses.items():
            table.set_loss(cid, t, v, 0)


def labels_of(pol: GroupSampling, ids: list[str]) -> list[int]:
    return [pol.groups[c] for c in ids]


# ---------------------------------------------------------------------- C-step
class TestCStep:
    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_recovers_five_blobs_and_picks_k5(self, seed):
        x, truth = blobs([12] * 5, dim=3, seed=seed)
        cl = c_step(x, min_clusters=3)
        assert cl.k == 5
        assert adjusted_rand_score(truth, cl.labels) >= 0.95
        assert cl.labels.shape == (60,)
        assert cl.centroids.shape == (5, 3)
        # silhouette scores were computed for every candidate k = S .. S + 4
        assert sorted(cl.scores) == [3, 4, 5, 6, 7]
        assert max(cl.scores, key=cl.scores.get) == 5

    @pytest.mark.parametrize("seed", [0, 1])
    def test_recovers_seven_blobs_and_picks_k7(self, seed):
        x, truth = blobs([10] * 7, dim=3, seed=10 + seed)
        cl = c_step(x, min_clusters=3)  # default max_clusters = S + 4 = 7
        assert cl.k == 7
        assert adjusted_rand_score(truth, cl.labels) >= 0.95

    @pytest.mark.parametrize("planted", [1, 2])
    def test_fewer_planted_clusters_than_models_still_gives_k_at_least_s(self, planted):
        x, truth = blobs([20] * planted, dim=3, seed=5)
        cl = c_step(x, min_clusters=3)
        assert cl.k >= 3
        assert len(np.unique(cl.labels)) >= 3
        assert all(k >= 3 for k in cl.scores)
        if planted > 1:
            # the extra clusters split blobs; they never merge two blobs
            for g in np.unique(cl.labels):
                assert len(np.unique(truth[cl.labels == g])) == 1

    def test_uses_silhouette_sampling_above_threshold(self, monkeypatch):
        import sklearn.metrics

        real = sklearn.metrics.silhouette_score
        seen: list[object] = []

        def spy(*args, **kwargs):
            seen.append(kwargs.get("sample_size"))
            return real(*args, **kwargs)

        monkeypatch.setattr(sklearn.metrics, "silhouette_score", spy)
        x, truth = blobs([1000] * 5, dim=3, seed=3)
        cl = c_step(x, min_clusters=3, silhouette_sample=500)
        assert seen and all(s == 500 for s in seen)
        assert cl.k == 5
        assert adjusted_rand_score(truth, cl.labels) >= 0.95

        # at or below the threshold the full silhouette is used
        seen.clear()
        small, _ = blobs([12] * 5, dim=3, seed=3)
        c_step(small, min_clusters=3, silhouette_sample=60)
        assert seen and all(s is None for s in seen)

    @pytest.mark.parametrize("n", [1, 2, 3])
    def test_tiny_federation_one_group_per_client(self, n):
        x = np.arange(3 * n, dtype=float).reshape(n, 3) + 1.0
        cl = c_step(x, min_clusters=3)
        assert sorted(cl.labels.tolist()) == list(range(n))  # everyone alone
        for i, g in enumerate(cl.labels):
            np.testing.assert_allclose(cl.centroids[g], x[i])

    def test_just_above_s_clients(self):
        x = np.array([[1.0, 1, 1], [1.1, 1, 1], [5, 5, 5], [9, 1, 9]])
        cl = c_step(x, min_clusters=3)
        assert cl.k == 3
        assert cl.labels[0] == cl.labels[1]
        assert len({int(cl.labels[i]) for i in (0, 2, 3)}) == 3

    @pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
    def test_identical_vectors_do_not_crash(self):
        cl = c_step(np.ones((10, 3)), min_clusters=3)
        assert cl.k >= 3 and cl.labels.shape == (10,)

    @pytest.mark.parametrize(
        "x, kwargs",
        [
            (np.ones(5), {}),  # 1-D
            (np.ones((2, 3, 4)), {}),  # 3-D
            (np.array([[1.0, np.nan], [1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), {}),
            (np.array([[1.0, np.inf], [1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), {}),
            (np.ones((10, 3)), {"min_clusters": 0}),
            (np.ones((10, 3)), {"min_clusters": 3, "max_clusters": 2}),
        ],
    )
    def test_invalid_input_raises(self, x, kwargs):
        kwargs = {"min_clusters": 2, **kwargs}
        with pytest.raises(ValueError):
            c_step(x, **kwargs)

    @pytest.mark.parametrize(
        "kwargs",
        [{"participation": 0.0}, {"participation": 1.5}, {"variant": "auto?"}, {"max_clusters": 0}],
    )
    def test_invalid_policy_parameters_raise(self, kwargs):
        with pytest.raises(ValueError):
            GroupSampling(**kwargs)


def test_nearest_by_cosine_differs_from_euclidean():
    centroids = np.array([[1.0, 1.0], [10.0, 1.0]])
    v = np.array([8.0, 8.0])
    euclid = int(np.argmin(np.linalg.norm(centroids - v, axis=1)))
    assert euclid == 1
    assert nearest_by_cosine(v, centroids) == 0


# ------------------------------------------------------------------- rotation
def policy_with_groups(planted: int, tasks: list[str], seed: int = 0, size: int = 8):
    """A GroupSampling after its first C-step on ``planted`` blobs."""
    x, truth = blobs([size] * planted, dim=len(tasks), seed=seed)
    table = make_table(x, tasks)
    pol = GroupSampling(participation=1 / 6)
    pol.assign(table, tasks, 1, np.random.default_rng(0))
    return pol, table, truth


class TestRotation:
    @pytest.mark.parametrize("planted", [3, 5, 6])
    def test_every_model_group_pair_once_per_cycle(self, planted):
        pol, table, _ = policy_with_groups(planted, TASKS3)
        L, S = pol.num_groups, len(TASKS3)
        assert planted == L
        real_pairs: Counter[tuple[str, int]] = Counter()
        idle_count: Counter[int] = Counter()
        for tau in range(L):
            model_of = pol.group_models(table, tau)
            assert len(model_of) == L
            assert all(m in TASKS3 for m in model_of)
            real = {(s + tau) % L for s in range(S)}  # g_s = (s + tau) mod L
            for s, t in enumerate(TASKS3):
                assert model_of[(s + tau) % L] == t
                real_pairs[(t, (s + tau) % L)] += 1
            for g in range(L):
                if g not in real:
                    idle_count[g] += 1
        # each (real model, group) pair exactly once in the cycle
        assert real_pairs == Counter({(t, g): 1 for t in TASKS3 for g in range(L)})
        # each group is idle (pseudo-model) in exactly L - S steps
        if L > S:
            assert idle_count == Counter({g: L - S for g in range(L)})
        else:
            assert not idle_count

    def test_pseudo_models_are_highest_loss_models_descending(self):
        """Slot ``S + j`` holds the ``j``-th highest-loss model and sits at group
        ``(S + j + tau) mod L`` (Algorithm 1: pseudo-models rotate too)."""
        pol, table, _ = policy_with_groups(5, TASKS3)
        assert pol.num_groups == 5
        for losses, ranked in (
            ({"a": 1.0, "b": 3.0, "c": 2.0}, ["b", "c"]),
            ({"a": 9.0, "b": 3.0, "c": 5.0}, ["a", "c"]),
        ):
            set_all_losses(table, losses)
            for tau in range(5):
                model_of = pol.group_models(table, tau)
                assert [model_of[(3 + j + tau) % 5] for j in range(2)] == ranked

    def test_pseudo_models_rotate_over_groups_algorithm_1(self):
        """Algorithm 1 (papers 000/001, T-step): all L slots rotate,
        ``g_s = (s + tau) mod L``. With L = 5, S = 3 and fixed losses b > c > a,
        every group trains each slot once per cycle: b and c twice (real and
        pseudo), a once. (Refilling idle groups in group order made group 0
        train the top model three times a cycle.)"""
        pol, table, _ = policy_with_groups(5, TASKS3)
        assert pol.num_groups == 5
        set_all_losses(table, {"a": 1.0, "b": 3.0, "c": 2.0})
        per_group = {g: Counter() for g in range(5)}
        for tau in range(5):
            for g, model in enumerate(pol.group_models(table, tau)):
                per_group[g][model] += 1
        for g in range(5):
            assert per_group[g] == Counter({"a": 1, "b": 2, "c": 2}), (g, per_group[g])

    def test_one_idle_group_gets_the_top_model(self):
        pol, table, _ = policy_with_groups(4, TASKS3)
        assert pol.num_groups == 4
        set_all_losses(table, {"a": 1.0, "b": 0.5, "c": 7.0})
        for tau in range(4):
            model_of = pol.group_models(table, tau)
            assert Counter(model_of) == Counter({"a": 1, "b": 1, "c": 2})


# --------------------------------------------------------------------- assign
class TestAssign:
    SIZES = [3, 5, 11, 17, 24]  # 0.25 * size never ends in .5

    def setup(self, participation=0.25, seed=4):
        x, truth = blobs(self.SIZES, dim=3, seed=seed)
        table = make_table(x, TASKS3)
        pol = GroupSampling(participation=participation)
        return pol, table, truth

    def test_groups_sample_sizes_and_models(self):
        pol, table, truth = self.setup()
        rng = np.random.default_rng(0)
        ids = table.ids()
        picks = pol.assign(table, TASKS3, 1, rng)
        assert pol.num_groups == 5
        # the C-step recovered the planted blobs
        assert adjusted_rand_score(truth, labels_of(pol, ids)) == 1.0
        sizes = Counter(pol.groups.values())
        for rnd in range(1, 6):
            if rnd > 1:
                picks = pol.assign(table, TASKS3, rnd, rng)
            model_of = pol.group_models(table, rnd - 1)
            cids = [p.cid for p in picks]
            assert len(cids) == len(set(cids)), "a client trains twice in one round"
            per_group = Counter(pol.groups[c] for c in cids)
            for g in range(5):
                assert per_group[g] == max(1, round(0.25 * sizes[g])), (rnd, g)
            for p in picks:
                assert p.task == model_of[pol.groups[p.cid]]
                assert p.count == 1
                assert p.prob == pytest.approx(
                    per_group[pol.groups[p.cid]] / sizes[pol.groups[p.cid]]
                )
            # every real model is trained in every round
            assert {p.task for p in picks} == set(TASKS3)
            assert pol.cycle_start == 1 and len(pol.csteps) == 1
        # round L + 1: a new cycle with a new C-step
        pol.assign(table, TASKS3, 6, rng)
        assert pol.cycle_start == 6 and len(pol.csteps) == 2 and pol.cycle == 2

    def test_sampled_clients_are_uniform_within_group(self):
        # participation 1/6 on groups of 12: 2 of 12 each round, uniformly at
        # random. Repeating one mid-cycle round draws afresh each time.
        x, _ = blobs([12] * 3, dim=3, seed=8)
        table = make_table(x, TASKS3)
        pol = GroupSampling(participation=1 / 6)
        rng = np.random.default_rng(1)
        pol.assign(table, TASKS3, 1, rng)
        assert pol.num_groups == 3
        counts: Counter[str] = Counter()
        draws = 1200
        for _ in range(draws):
            picks = pol.assign(table, TASKS3, 2, rng)
            assert len(picks) == 6
            for p in picks:
                counts[p.cid] += 1
        assert len(pol.csteps) == 1
        expected = draws * 2 / 12
        sd = math.sqrt(draws * (2 / 12) * (10 / 12))
        for cid in table.ids():
            assert abs(counts[cid] - expected) < 5 * sd

    def test_needs_losses_and_loss_query_clients(self):
        pol, table, _ = self.setup()
        rng = np.random.default_rng(0)
        assert pol.needs_losses  # nothing known yet
        assert pol.loss_query_clients(table, TASKS3) is None  # a C-step: everyone
        pol.assign(table, TASKS3, 1, rng)
        L = pol.num_groups
        assert L == 5
        for rnd in range(2, L + 1):
            assert not pol.needs_losses, rnd  # mid-cycle, nobody new
            assert pol.loss_query_clients(table, TASKS3) == set()
            pol.assign(table, TASKS3, rnd, rng)
        # after round L the next round starts a cycle: C-step, everyone asked
        assert pol.needs_losses
        assert pol.loss_query_clients(table, TASKS3) is None
        pol.assign(table, TASKS3, L + 1, rng)
        assert not pol.needs_losses
        # an online client without a group mid-cycle: only it is asked
        add_client(table, "new", TASKS3)
        assert pol.needs_losses
        assert pol.loss_query_clients(table, TASKS3) == {"new"}
        # an offline newcomer does not count
        table.set_online([c for c in table.ids() if c != "new"])
        assert not pol.needs_losses
        assert pol.loss_query_clients(table, TASKS3) == set()

    def test_newcomer_without_losses_waits(self):
        pol, table, _ = self.setup()
        rng = np.random.default_rng(0)
        pol.assign(table, TASKS3, 1, rng)
        add_client(table, "new", TASKS3)  # no loss vector
        picks = pol.assign(table, TASKS3, 2, rng)
        assert "new" not in pol.groups
        assert "new" not in {p.cid for p in picks}
        assert pol.needs_losses

    def test_fewer_clients_than_models(self):
        # N = 2 < S = 3: L = S groups (one empty); each client trains every
        # model once over the cycle.
        table = make_table(np.array([[1.0, 2, 3], [3.0, 2, 1]]), TASKS3)
        pol = GroupSampling(participation=1 / 6)
        rng = np.random.default_rng(0)
        trained: dict[str, list[str]] = {"0": [], "1": []}
        for rnd in range(1, 4):
            picks = pol.assign(table, TASKS3, rnd, rng)
            assert len({p.cid for p in picks}) == len(picks)
            for p in picks:
                trained[p.cid].append(p.task)
        assert pol.num_groups == 3 and len(pol.csteps) == 1
        assert sorted(trained["0"]) == TASKS3 and sorted(trained["1"]) == TASKS3


def test_newcomer_joins_cosine_nearest_cluster_without_new_cstep():
    tasks = ["a", "b"]
    rng_data = np.random.default_rng(0)
    a = np.array([1.0, 1.0]) + rng_data.normal(0, 0.05, (20, 2))
    b = np.array([10.0, 1.0]) + rng_data.normal(0, 0.05, (20, 2))
    table = make_table(np.vstack([a, b]), tasks)
    pol = GroupSampling(participation=1.0)
    rng = np.random.default_rng(0)
    pol.assign(table, tasks, 1, rng)
    assert pol.num_groups == 2
    group_a = {pol.groups[str(i)] for i in range(20)}
    group_b = {pol.groups[str(i)] for i in range(20, 40)}
    assert len(group_a) == 1 and len(group_b) == 1 and group_a != group_b
    (ga,), (gb,) = group_a, group_b

    v = np.array([8.0, 8.0])
    cent = pol.centroids
    euclid = int(np.argmin(np.linalg.norm(cent - v, axis=1)))
    cos = (cent @ v) / (np.linalg.norm(cent, axis=1) * np.linalg.norm(v))
    assert euclid == gb and int(np.argmax(cos)) == ga  # they differ

    add_client(table, "new", tasks)  # registers without losses first
    assert pol.needs_losses and pol.loss_query_clients(table, tasks) == {"new"}
    for t, val in zip(tasks, v):
        table.set_loss("new", t, val, 2)
    picks = pol.assign(table, tasks, 2, rng)
    assert pol.groups["new"] == ga
    assert pol.cycle_start == 1 and len(pol.csteps) == 1  # no new C-step
    # participation 1: the newcomer trains its group's model this round
    model_of = pol.group_models(table, 1)
    assert ("new", model_of[ga]) in {(p.cid, p.task) for p in picks}


def test_modified_cstep_clusters_on_one_rotating_model():
    n = 60
    maps = [np.random.default_rng(100 + s).permutation(np.arange(n) % 3) for s in range(3)]
    assert adjusted_rand_score(maps[0], maps[1]) < 0.5  # inconsistent structures
    noise = np.random.default_rng(7).normal(0, 0.05, (n, 3))
    levels = np.array([1.0, 4.0, 7.0])
    x = np.column_stack([levels[maps[s]] for s in range(3)]) + noise
    table = make_table(x, TASKS3)
    pol = GroupSampling(participation=1 / 6, variant="modified")
    rng = np.random.default_rng(0)
    ids = table.ids()
    seen_tasks = []
    rnd = 1
    for cycle in range(4):
        pol.assign(table, TASKS3, rnd, rng)
        assert len(pol.csteps) == cycle + 1 and pol.cycle_start == rnd
        expected = TASKS3[cycle % 3]  # tasks[cycle % S]
        assert pol.cluster_task == expected
        assert pol.csteps[-1]["cluster_task"] == expected
        s = TASKS3.index(expected)
        labels = labels_of(pol, ids)
        assert adjusted_rand_score(maps[s][[int(c) for c in ids]], labels) == 1.0
        for other in range(3):
            if other != s:
                assert adjusted_rand_score(maps[other][[int(c) for c in ids]], labels) < 0.5
        # the centroids are of the full loss vectors (for newcomers)
        assert pol.centroids.shape[1] == 3
        seen_tasks.append(expected)
        L = pol.num_groups
        assert L == 3
        for r in range(rnd + 1, rnd + L):
            pol.assign(table, TASKS3, r, rng)
        rnd += L
    assert seen_tasks == ["a", "b", "c", "a"]


def test_consistent_variant_has_no_cluster_task():
    pol, _, _ = policy_with_groups(3, TASKS3)
    assert pol.cluster_task is None and pol.csteps[-1]["cluster_task"] is None


def test_model_arriving_mid_cycle_waits_for_next_cstep():
    x, _ = blobs([10] * 4, dim=3, seed=21)
    table = make_table(x, TASKS3)
    pol = GroupSampling(participation=0.5)
    rng = np.random.default_rng(0)
    pol.assign(table, ["a", "b"], 1, rng)
    L = pol.num_groups
    assert L >= 2 and pol.cycle_tasks == ["a", "b"]
    for rnd in range(2, L + 1):
        picks = pol.assign(table, TASKS3, rnd, rng)  # "c" has arrived
        assert "c" not in {p.task for p in picks}, rnd
        assert pol.cycle_tasks == ["a", "b"] and len(pol.csteps) == 1
    picks = pol.assign(table, TASKS3, L + 1, rng)
    assert len(pol.csteps) == 2 and pol.cycle_start == L + 1
    assert pol.cycle_tasks == TASKS3
    assert pol.csteps[-1]["tasks"] == TASKS3
    assert np.asarray(pol.csteps[-1]["features"]).shape == (40, 3)
    assert pol.num_groups >= 3  # L >= S with the new model
    assert "c" in {p.task for p in picks}


def run_rounds(pol, table, tasks, rounds, rng, hook=None):
    out = []
    for rnd in rounds:
        if hook is not None:
            hook(rnd)
        out.append([(p.cid, p.task, p.count, p.prob) for p in pol.assign(table, tasks, rnd, rng)])
    return out


class TestState:
    def test_round_trip_continues_identically(self):
        x, _ = blobs([8] * 5, dim=3, seed=31)
        kw = {"participation": 0.25, "max_clusters": 7, "seed": 3}
        table = make_table(x, TASKS3)
        a = GroupSampling(**kw)
        rng = np.random.default_rng(0)
        run_rounds(a, table, TASKS3, range(1, 4), rng)  # mid-cycle (L = 5)
        state = copy.deepcopy(a.state_dict())
        b = GroupSampling(**kw)
        b.load_state_dict(state)
        rng_b = copy.deepcopy(rng)

        def newcomer(rnd):
            if rnd == 5:
                add_client(table, "new", TASKS3, [4.0, 4.0, 4.0])

        # the same table object is shared: run a to the end first, then undo
        # the newcomer and run b over the same history
        picks_a = run_rounds(a, table, TASKS3, range(4, 15), rng, newcomer)
        table_b = make_table(x, TASKS3)
        picks_b = run_rounds(
            b,
            table_b,
            TASKS3,
            range(4, 15),
            rng_b,
            lambda r: add_client(table_b, "new", TASKS3, [4.0, 4.0, 4.0]) if r == 5 else None,
        )
        assert picks_a == picks_b
        assert a.state_dict() == b.state_dict()

    def test_loaded_policy_asks_nobody_mid_cycle(self):
        x, _ = blobs([8] * 5, dim=3, seed=31)
        table = make_table(x, TASKS3)
        a = GroupSampling(participation=0.25)
        run_rounds(a, table, TASKS3, range(1, 3), np.random.default_rng(0))
        b = GroupSampling(participation=0.25)
        b.load_state_dict(copy.deepcopy(a.state_dict()))
        assert a.loss_query_clients(table, TASKS3) == set()
        assert b.loss_query_clients(table, TASKS3) == set()


# ------------------------------------------------------- federation profiles
def label_sets(fed, task: str) -> list[tuple[int, ...]]:
    return [
        tuple(np.unique(fed.client_data(c, task)[0].y).tolist()) for c in range(fed.num_clients)
    ]


def partition(sets: list[tuple[int, ...]]) -> list[int]:
    ids: dict[tuple[int, ...], int] = {}
    return [ids.setdefault(s, len(ids)) for s in sets]


def planted_map(fed) -> list[int]:
    """Client -> planted cluster: clients of one cluster hold the same label set
    for every digits task."""
    return partition([tuple(ls) for ls in zip(*(label_sets(fed, t) for t in fed.tasks))])


class TestProfiles:
    def test_profiles_defined(self):
        assert PROFILES["clusters-consistent"].clusters == 5
        assert PROFILES["clusters-consistent"].consistent
        assert PROFILES["clusters-inconsistent"].clusters == 5
        assert not PROFILES["clusters-inconsistent"].consistent

    @pytest.mark.parametrize("seed", [0, 1])
    def test_consistent_clusters(self, seed):
        fed = build_federation(["digits"] * 3, 30, seed, profile="clusters-consistent")
        parts = []
        for t in fed.tasks:
            sets = label_sets(fed, t)
            assert all(len(s) == 2 for s in sets)  # 20% of 10 labels
            by_set = Counter(sets)
            assert len(by_set) == 5 and set(by_set.values()) == {6}
            # the 5 label sets are disjoint and cover the 10 labels
            assert sorted(label for s in by_set for label in s) == list(range(10))
            parts.append(partition(sets))
        for p in parts[1:]:
            assert adjusted_rand_score(parts[0], p) == 1.0  # same partition
        assert sorted(Counter(planted_map(fed)).values()) == [6] * 5

    def test_inconsistent_clusters(self):
        low = 0
        for seed in range(5):
            fed = build_federation(["digits"] * 3, 30, seed, profile="clusters-inconsistent")
            parts = []
            for t in fed.tasks:
                sets = label_sets(fed, t)
                assert all(len(s) == 2 for s in sets)
                assert sorted(Counter(sets).values()) == [6] * 5
                parts.append(partition(sets))
            aris = [adjusted_rand_score(parts[i], parts[j]) for i, j in ((0, 1), (0, 2), (1, 2))]
            low += all(a < 0.5 for a in aris)
            # most pairs of clients that share their labels in task 0 do not in task 1
            same0 = [
                (i, j) for i in range(30) for j in range(i + 1, 30) if parts[0][i] == parts[0][j]
            ]
            kept = sum(parts[1][i] == parts[1][j] for i, j in same0)
            if seed == 0:
                assert kept < 0.5 * len(same0)
        assert low >= 4  # for most seeds


# ---------------------------------------------------- strategy (real runner)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_clusters(path: Path) -> list[dict[str, int]]:
    with open(path, newline="") as f:
        return [{k: int(v) for k, v in row.items()} for row in csv.DictReader(f)]


def group_settings(tmp: Path, **kw):
    from mmfl_flwr.config import Settings

    base = dict(
        strategy="group",
        tasks="digits,digits,digits",
        profile="clusters-consistent",
        num_clients=30,
        num_rounds=8,
        output_dir=str(tmp),
    )
    base.update(kw)
    return Settings(**base)


def test_strategy_recovers_planted_clusters(tmp_path):
    from mmfl_flwr import runner
    from mmfl_flwr.flower_app.data import federation_for

    s = group_settings(tmp_path, local_epochs=1)
    result = runner.run(s, engine="inprocess")
    assert max(r["round"] for r in result.history) == 8
    assert (tmp_path / "clusters.csv").exists()
    png = tmp_path / "clusters_round_1.png"
    assert png.exists() and png.read_bytes()[:8] == PNG_SIGNATURE
    rows = read_clusters(tmp_path / "clusters.csv")
    first = {r["client"]: r["cluster"] for r in rows if r["round"] == 1}
    assert sorted(first) == list(range(30))
    truth = planted_map(federation_for(s))
    assert len(set(truth)) == 5
    assert adjusted_rand_score(truth, [first[c] for c in range(30)]) >= 0.9
    # every later C-step is recorded with its own PNG
    for rnd in sorted({r["round"] for r in rows}):
        assert (tmp_path / f"clusters_round_{rnd}.png").exists()
    # each round trains every model (mean aggregation of the sampled clients)
    for rnd in range(1, 9):
        assert {t for _, t, _ in result.assignments[rnd]} == {"digits", "digits_2", "digits_3"}


def test_strategy_modified_variant_completes(tmp_path):
    from mmfl_flwr import runner
    from mmfl_flwr.flower_app.data import federation_for

    s = group_settings(
        tmp_path, profile="clusters-inconsistent", group_variant="modified", local_epochs=1
    )
    result = runner.run(s, engine="inprocess")
    assert max(r["round"] for r in result.history) == 8
    rows = read_clusters(tmp_path / "clusters.csv")
    rounds = sorted({r["round"] for r in rows})
    assert rounds[0] == 1 and len(rounds) >= 2
    # the first C-step clusters on the first model only
    fed = federation_for(s)
    first = {r["client"]: r["cluster"] for r in rows if r["round"] == 1}
    truth0 = partition(label_sets(fed, fed.tasks[0]))
    assert adjusted_rand_score(truth0, [first[c] for c in range(30)]) >= 0.7


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory):
    """An uninterrupted 12-round run, a 7-round run resumed to 12 rounds, and a
    fresh 1-round run into a folder holding an older run's clusters.csv."""
    import shutil

    from mmfl_flwr import runner

    full = tmp_path_factory.mktemp("full")
    part = tmp_path_factory.mktemp("resumed")
    again = tmp_path_factory.mktemp("again")
    kw = dict(local_epochs=1, num_rounds=12)
    runner.run(group_settings(full, **kw), engine="inprocess")
    runner.run(group_settings(part, **{**kw, "num_rounds": 7}), engine="inprocess")
    runner.run(group_settings(part, **kw, resume_from=str(part)), engine="inprocess")
    shutil.copy(full / "clusters.csv", again / "clusters.csv")
    runner.run(group_settings(again, local_epochs=1, num_rounds=1), engine="inprocess")
    return full, part, again


def test_resumed_run_records_every_cstep_once(resumed_runs):
    full, part, _ = resumed_runs
    rows = read_clusters(full / "clusters.csv")
    assert Counter((r["round"], r["client"]) for r in rows).most_common(1)[0][1] == 1


def test_resume_does_not_duplicate_cluster_records(resumed_runs):
    full, part, _ = resumed_runs
    rows = read_clusters(part / "clusters.csv")
    dup = [k for k, n in Counter((r["round"], r["client"]) for r in rows).items() if n > 1]
    assert not dup
    # the C-steps before the checkpoint (rounds 1 and 6) are recorded once, as
    # in the uninterrupted run
    before = [r for r in rows if r["round"] <= 7]
    assert before == [r for r in read_clusters(full / "clusters.csv") if r["round"] <= 7]
    assert {r["round"] for r in before} == {1, 6}


def test_resumed_group_run_is_identical(resumed_runs):
    full, part, _ = resumed_runs
    assert (part / "assignments.csv").read_text() == (full / "assignments.csv").read_text()
    assert (part / "metrics.csv").read_text() == (full / "metrics.csv").read_text()


def test_fresh_run_replaces_old_cluster_records(resumed_runs):
    _, _, again = resumed_runs
    rows = read_clusters(again / "clusters.csv")
    assert [r["round"] for r in rows] == [1] * 30


def test_a_seed_at_the_top_of_the_32_bit_range_survives_later_c_steps():
    """The C-step seeds K-means and the silhouette with ``seed + cycle``; scikit-learn
    takes 32-bit seeds, so seed 2**32 - 1 failed at the second C-step. The seed wraps."""
    x, _ = blobs([8] * 3, dim=len(TASKS3), seed=0)
    table = make_table(x, TASKS3)
    pol = GroupSampling(participation=1 / 6, seed=2**32 - 1)
    rng = np.random.default_rng(0)
    rnd = 0
    while pol.cycle < 2 and rnd < 60:
        rnd += 1
        pol.assign(table, TASKS3, rnd, rng)
    assert pol.cycle >= 2
    assert pol.cstep_seed() == (2**32 - 1 + pol.cycle) % 2**32
