"""The flwr-datasets partitioners behind :mod:`mmfl_flwr.tasks.partitions` (issue #15).

Every partition here is computed by a flwr-datasets partitioner on a local,
in-memory ``datasets.Dataset`` (offline). The tests check each one's defining
property against an independent reference: IID against the old numpy algorithm,
natural ids against a plain group-by, Dirichlet by its skew statistics, k labels
per client by counting labels.
"""

from __future__ import annotations

import numpy as np
import pytest

from mmfl_flwr.tasks import partitions as P
from mmfl_flwr.tasks.data import load_digits_data


def _old_iid(n, k, rng):
    """The numpy IID partition the module had before flwr-datasets (reference)."""
    perm = rng.permutation(int(n)).astype(np.int64)
    return [np.sort(part) for part in np.array_split(perm, int(k))]


def _valid(parts, n, cover=True):
    """Disjoint sorted int64 index sets inside range(n) (covering it with ``cover``)."""
    allidx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    assert allidx.dtype == np.int64
    assert np.unique(allidx).shape[0] == allidx.shape[0], "a row is in two partitions"
    assert allidx.shape[0] == 0 or (allidx.min() >= 0 and allidx.max() < n)
    for p in parts:
        np.testing.assert_array_equal(p, np.sort(p))
    if cover:
        np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _labels(n=2000, classes=10, seed=0):
    return np.random.default_rng(seed).integers(0, classes, n)


# -------------------------------------------------------------------------- IID


@pytest.mark.parametrize("n,k", [(100, 7), (1797, 20), (1797, 120), (5, 8), (0, 3), (1, 1)])
def test_iid_equals_the_old_numpy_partition_exactly(n, k):
    new = P.iid_partition(n, k, np.random.default_rng(11))
    old = _old_iid(n, k, np.random.default_rng(11))
    assert _same(new, old)
    _valid(new, n)


def test_iid_hand_computed_case():
    class FixedOrder:  # a generator whose permutation is given
        def permutation(self, n):
            assert n == 7
            return np.array([3, 6, 2, 5, 4, 0, 1])

    # contiguous shards of sizes 3, 2, 2 of that order, each sorted
    parts = P.iid_partition(7, 3, FixedOrder())
    assert [p.tolist() for p in parts] == [[2, 3, 6], [4, 5], [0, 1]]


def test_iid_goes_through_flwr_datasets(monkeypatch):
    """The partition is IidPartitioner's: a partitioner that shards differently
    changes the result."""
    fds = P._fds()

    class Reversed(fds.IidPartitioner):
        def load_partition(self, partition_id):
            return super().load_partition(self.num_partitions - 1 - partition_id)

    monkeypatch.setattr(fds, "IidPartitioner", Reversed)
    parts = P.iid_partition(10, 3, np.random.default_rng(0))
    ref = _old_iid(10, 3, np.random.default_rng(0))
    assert _same(parts, ref[::-1])


def test_iid_seeds_differ():
    a = P.iid_partition(200, 5, np.random.default_rng(1))
    b = P.iid_partition(200, 5, np.random.default_rng(2))
    assert not _same(a, b)


# -------------------------------------------------------------------- Dirichlet


def _mean_entropy(labels, parts, classes=10):
    ents = []
    for p in parts:
        q = np.bincount(labels[p], minlength=classes) / max(p.shape[0], 1)
        q = q[q > 0]
        ents.append(-(q * np.log(q)).sum())
    return float(np.mean(ents))


def test_dirichlet_valid_deterministic_and_seeded():
    labels = _labels()
    a = P.dirichlet_partition(labels, 20, 0.5, np.random.default_rng(5))
    b = P.dirichlet_partition(labels, 20, 0.5, np.random.default_rng(5))
    c = P.dirichlet_partition(labels, 20, 0.5, np.random.default_rng(6))
    _valid(a, labels.shape[0])
    assert len(a) == 20 and min(p.shape[0] for p in a) >= 1
    assert _same(a, b)
    assert not _same(a, c)


def test_dirichlet_skew_follows_alpha():
    """Small alpha: clients hold few labels (low label entropy, most of a client's
    data in its top label); large alpha: close to the label distribution of the
    whole set (entropy near log 10, client sizes near n / N)."""
    labels = _labels(3000)
    small = [P.dirichlet_partition(labels, 20, 0.05, np.random.default_rng(s)) for s in range(3)]
    large = [P.dirichlet_partition(labels, 20, 1000.0, np.random.default_rng(s)) for s in range(3)]
    ent_small = np.mean([_mean_entropy(labels, p) for p in small])
    ent_large = np.mean([_mean_entropy(labels, p) for p in large])
    assert ent_small < 0.35 * np.log(10)
    assert ent_large > 0.98 * np.log(10)
    top_small = np.mean(
        [np.bincount(labels[ix], minlength=10).max() / ix.shape[0] for p in small for ix in p]
    )
    assert top_small > 0.6
    sizes = np.array([ix.shape[0] for p in large for ix in p])
    assert np.abs(sizes - 150).max() < 30  # 3000 / 20, within 20%


def test_dirichlet_runs_flwr_datasets_plain(monkeypatch):
    """The partitioner is flwr-datasets' DirichletPartitioner without self-balancing
    and with our minimum size (not its default of 10)."""
    fds = P._fds()
    seen = {}
    original = fds.DirichletPartitioner

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(fds, "DirichletPartitioner", spy)
    P.dirichlet_partition(_labels(500), 10, 0.5, np.random.default_rng(0), min_size=3)
    assert seen["self_balancing"] is False
    assert seen["min_partition_size"] == 3


def test_dirichlet_min_size_and_giving_up():
    labels = _labels(400)
    for seed in range(3):
        parts = P.dirichlet_partition(labels, 10, 0.5, np.random.default_rng(seed), min_size=20)
        assert min(p.shape[0] for p in parts) >= 20
        _valid(parts, 400)
    with pytest.raises(RuntimeError, match="no Dirichlet"):
        P.dirichlet_partition(
            _labels(100), 10, 0.01, np.random.default_rng(0), min_size=10, max_tries=3
        )
    with pytest.raises(ValueError, match="num_clients"):
        P.dirichlet_partition(_labels(5), 6, 1.0, np.random.default_rng(0), min_size=0)


# ------------------------------------------------------------------- natural id


def test_natural_id_equals_grouping_by_id():
    rng = np.random.default_rng(3)
    ids = rng.choice(np.array(["carol", "alice", "bob", "dave", "erin"]), size=300)
    names, parts = P.natural_id_partition(ids)
    assert names == ["alice", "bob", "carol", "dave", "erin"]
    for name, ix in zip(names, parts):
        np.testing.assert_array_equal(ix, np.flatnonzero(ids == name))
    _valid(parts, ids.shape[0])


def test_natural_id_samples_clients_by_seed():
    ids = np.repeat(np.arange(40), 3)[np.random.default_rng(0).permutation(120)]
    names, parts = P.natural_id_partition(ids, 6, np.random.default_rng(1))
    again, parts2 = P.natural_id_partition(ids, 6, np.random.default_rng(1))
    other, _ = P.natural_id_partition(ids, 6, np.random.default_rng(2))
    assert names == again and _same(parts, parts2) and names != other
    assert names == sorted(names) and len(set(names)) == 6
    # the same users natural_partition draws from the same generator state
    ref_users, _ = P.natural_partition({i: None for i in range(40)}, 6, np.random.default_rng(1))
    assert names == ref_users
    for name, ix in zip(names, parts):
        np.testing.assert_array_equal(ix, np.flatnonzero(ids == name))
    with pytest.raises(ValueError, match="rng"):
        P.natural_id_partition(ids, 6)
    with pytest.raises(ValueError, match="num_clients"):
        P.natural_id_partition(ids, 41, np.random.default_rng(0))


# ---------------------------------------------------------- k labels per client


@pytest.mark.parametrize("k", [1, 2, 3])
def test_pathological_at_most_k_labels(k):
    train, _ = load_digits_data(0)
    idx, held = P.pathological_partition(train.y, 20, k, np.random.default_rng(0))
    _valid(idx, len(train), cover=False)
    for ix, h in zip(idx, held):
        assert ix.shape[0] >= 1
        got = np.unique(train.y[ix])
        assert got.shape[0] <= k
        np.testing.assert_array_equal(got, h)
    # every held label's examples are all used: a label is covered or dropped whole
    used = np.concatenate(idx)
    for c in np.unique(np.concatenate(held)):
        assert np.isin(np.flatnonzero(train.y == c), used).all()


def test_pathological_deterministic_and_seeded():
    labels = _labels(1000)
    a = P.pathological_partition(labels, 15, 3, np.random.default_rng(4))
    b = P.pathological_partition(labels, 15, 3, np.random.default_rng(4))
    c = P.pathological_partition(labels, 15, 3, np.random.default_rng(5))
    assert _same(a[0], b[0]) and _same(a[1], b[1])
    assert not _same(a[0], c[0])


def test_pathological_label_sets_are_random():
    """'random' assignment: over many clients every label is held about as often
    (k * N / C = 60 holders each, not a fixed roll)."""
    labels = _labels(4000)
    _, held = P.pathological_partition(labels, 200, 3, np.random.default_rng(0))
    counts = np.bincount(np.concatenate(held), minlength=10)
    assert counts.sum() == 600
    assert counts.min() > 35 and counts.max() < 85
    assert len({tuple(h) for h in held}) > 50


# ------------------------------------------------------- any partitioner, checks


def test_partitioner_indices_takes_any_partitioner_and_refuses_reuse():
    fds = P._fds()
    sizes = [5, 10, 25]
    part = fds.SizePartitioner(sizes)
    order = np.random.default_rng(0).permutation(40)
    parts = P.partitioner_indices(part, {"label": np.zeros(40, np.int64)}, order=order)
    assert [p.shape[0] for p in parts] == sizes
    np.testing.assert_array_equal(parts[0], np.sort(order[:5]))
    _valid(parts, 40)
    with pytest.raises(ValueError, match="already has a dataset"):
        P.partitioner_indices(part, {"label": np.zeros(40, np.int64)})
    with pytest.raises(TypeError, match="Partitioner"):
        P.partitioner_indices(object(), n=3)
    with pytest.raises(ValueError, match="fewer than"):
        P.partitioner_indices(fds.IidPartitioner(3), n=9, num_clients=4)


def test_make_partitioner_copies_instances_and_checks_factories():
    fds = P._fds()
    inst = fds.IidPartitioner(4)
    made = P.make_partitioner(inst, 4, 0)
    assert made is not inst and not inst.is_dataset_assigned()
    assert isinstance(
        P.make_partitioner(lambda n, s: fds.IidPartitioner(n), 3, 0), fds.IidPartitioner
    )
    with pytest.raises(TypeError, match="must return"):
        P.make_partitioner(lambda n, s: None, 3, 0)
    with pytest.raises(TypeError, match="partitioner must be"):
        P.make_partitioner(3, 3, 0)


def test_importing_the_package_does_not_import_flwr_datasets():
    import subprocess
    import sys

    code = (
        "import sys, mmfl_flwr, mmfl_flwr.tasks.partitions, mmfl_flwr.tasks.federation, "
        "mmfl_flwr.tasks.registry, mmfl_flwr.runner\n"
        "from mmfl_flwr.tasks.federation import build_federation\n"
        "build_federation(['digits', 'synthetic', 'digits'], 10, 0)\n"
        "bad = [m for m in ('flwr_datasets', 'datasets') if m in sys.modules]\n"
        "sys.exit(f'imported {bad}' if bad else 0)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
