"""The defining property of every partition."""

from __future__ import annotations

import numpy as np
import pytest

from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.partitions import dirichlet_partition, iid_partition, natural_partition


def _covers_once(parts, n):
    allidx = np.concatenate(parts)
    assert allidx.dtype == np.int64
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))
    for p in parts:
        np.testing.assert_array_equal(p, np.sort(p))


@pytest.mark.parametrize("n,k", [(100, 7), (10, 10), (5, 8), (0, 3), (1003, 30)])
def test_iid_sizes_and_cover(n, k):
    parts = iid_partition(n, k, np.random.default_rng(0))
    assert len(parts) == k
    sizes = [p.shape[0] for p in parts]
    assert max(sizes) - min(sizes) <= 1
    _covers_once(parts, n)
    assert sum(sizes) == n


def test_iid_is_random_and_seeded():
    a = iid_partition(50, 5, np.random.default_rng(1))
    b = iid_partition(50, 5, np.random.default_rng(1))
    c = iid_partition(50, 5, np.random.default_rng(2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert not np.array_equal(a[0], np.arange(10))  # not simply consecutive blocks


def _labels(n=2000, classes=10, seed=0):
    return np.random.default_rng(seed).integers(0, classes, n)


def _mean_label_entropy(labels, parts, classes=10):
    ents = []
    for p in parts:
        counts = np.bincount(labels[p], minlength=classes).astype(float)
        q = counts / counts.sum()
        q = q[q > 0]
        ents.append(-(q * np.log(q)).sum())
    return float(np.mean(ents))


def test_dirichlet_reproducible_by_seed():
    labels = _labels()
    a = dirichlet_partition(labels, 20, 0.5, np.random.default_rng(42))
    b = dirichlet_partition(labels, 20, 0.5, np.random.default_rng(42))
    c = dirichlet_partition(labels, 20, 0.5, np.random.default_rng(43))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("alpha", [0.05, 0.5, 100.0])
def test_dirichlet_covers_every_index_once(alpha):
    labels = _labels()
    parts = dirichlet_partition(labels, 20, alpha, np.random.default_rng(0))
    assert len(parts) == 20
    _covers_once(parts, labels.shape[0])


def test_dirichlet_small_alpha_is_more_skewed():
    labels = _labels()
    ent = {
        alpha: np.mean(
            [
                _mean_label_entropy(
                    labels, dirichlet_partition(labels, 20, alpha, np.random.default_rng(s))
                )
                for s in range(3)
            ]
        )
        for alpha in (0.05, 1.0, 100.0)
    }
    assert ent[0.05] < ent[1.0] < ent[100.0]
    assert ent[100.0] > 0.95 * np.log(10)  # nearly IID: close to the maximum entropy
    assert ent[0.05] < 0.5 * np.log(10)


def test_dirichlet_min_size_respected():
    labels = _labels(400)
    # without the constraint most draws leave some client with fewer than 20 examples
    unconstrained = [
        min(p.shape[0] for p in dirichlet_partition(labels, 10, 0.5, np.random.default_rng(s)))
        for s in range(10)
    ]
    assert min(unconstrained) < 20
    for seed in range(5):
        parts = dirichlet_partition(labels, 10, 0.5, np.random.default_rng(seed), min_size=20)
        assert min(p.shape[0] for p in parts) >= 20
        _covers_once(parts, 400)


def test_dirichlet_impossible_min_size():
    with pytest.raises(ValueError, match="cannot give"):
        dirichlet_partition(_labels(50), 10, 1.0, np.random.default_rng(0), min_size=6)
    with pytest.raises(RuntimeError, match="no Dirichlet"):
        dirichlet_partition(
            _labels(100), 10, 0.01, np.random.default_rng(0), min_size=10, max_tries=3
        )
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_partition(_labels(), 3, 0.0, np.random.default_rng(0))


def _users():
    return {
        "b_user": Dataset(np.zeros((3, 2)), np.zeros(3)),
        "a_user": Dataset(np.ones((1, 2)), np.ones(1)),
        "c_user": Dataset(np.ones((2, 2)), np.ones(2)),
    }


def test_natural_partition_keeps_users():
    users = _users()
    ids, datasets = natural_partition(users)
    assert ids == ["a_user", "b_user", "c_user"]
    assert all(d is users[u] for u, d in zip(ids, datasets))


def test_natural_partition_samples_users():
    users = _users()
    ids, datasets = natural_partition(users, num_clients=2, rng=np.random.default_rng(0))
    again, _ = natural_partition(users, num_clients=2, rng=np.random.default_rng(0))
    assert ids == again and len(ids) == 2 and ids == sorted(ids)
    assert set(ids) <= set(users)
    assert all(d is users[u] for u, d in zip(ids, datasets))
    with pytest.raises(ValueError):
        natural_partition(users, num_clients=4, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="rng"):
        natural_partition(users, num_clients=2)
