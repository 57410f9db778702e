"""Tests of the datasets and the simulated federation (numpy only)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mmfl_flwr.tasks.data import Dataset, load_digits_data, synthetic_users
from mmfl_flwr.tasks.federation import (
    KINDS,
    build_federation,
    label_skew_partition,
    task_names,
)


def _same(a: Dataset, b: Dataset) -> bool:
    return np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)


# --------------------------------------------------------------------------- digits


def test_digits_shapes_and_ranges() -> None:
    train, test = load_digits_data(0)
    assert train.x.dtype == np.float32 and train.y.dtype == np.int64
    assert train.x.shape[1:] == (1, 8, 8) and test.x.shape[1:] == (1, 8, 8)
    assert len(train) + len(test) == 1797
    assert len(test) == pytest.approx(0.2 * 1797, abs=1)
    assert train.x.min() >= 0.0 and train.x.max() <= 1.0
    assert train.x.max() == 1.0
    assert set(np.unique(train.y)) == set(range(10)) == set(np.unique(test.y))
    # Stratified: the class proportions of the two splits agree closely.
    p_train = np.bincount(train.y, minlength=10) / len(train)
    p_test = np.bincount(test.y, minlength=10) / len(test)
    assert np.abs(p_train - p_test).max() < 0.01


def test_digits_deterministic_and_seed_dependent() -> None:
    a_train, a_test = load_digits_data(3)
    b_train, b_test = load_digits_data(3)
    assert _same(a_train, b_train) and _same(a_test, b_test)
    # Returned arrays are copies: mutating one must not affect the cache.
    a_train.x[:] = -1.0
    c_train, _ = load_digits_data(3)
    assert _same(c_train, b_train)
    d_train, _ = load_digits_data(4)
    assert not _same(d_train, b_train)


def test_digits_are_scikit_learns_read_without_importing_it() -> None:
    """The file read directly gives load_digits' arrays exactly."""
    from sklearn.datasets import load_digits

    from mmfl_flwr.tasks import data as D

    assert D._sklearn_digits_file() is not None  # else the fallback would hide the test
    x, y = D._raw_digits()
    bunch = load_digits()
    assert np.array_equal(x, (bunch.data.astype(np.float32) / np.float32(16)).reshape(-1, 1, 8, 8))
    assert np.array_equal(y, bunch.target)


def _fresh_split(monkeypatch, tmp_path, seed, fraction, cache="cache"):
    from mmfl_flwr.tasks import data as D

    monkeypatch.setenv("MMFL_CACHE_DIR", str(tmp_path / cache) if cache else "")
    D._digits_split_indices.cache_clear()
    try:
        return D._digits_split_indices(seed, fraction)
    finally:
        D._digits_split_indices.cache_clear()


@pytest.mark.parametrize("seed,fraction", [(0, 0.2), (7, 0.2), (3, 0.35)])
def test_digits_split_is_train_test_splits_and_the_cache_gives_it_back(
    monkeypatch, tmp_path, seed, fraction
) -> None:
    from sklearn.model_selection import train_test_split

    from mmfl_flwr.tasks import data as D

    _, y = D._raw_digits()
    want = train_test_split(
        np.arange(y.shape[0]), test_size=fraction, random_state=seed, stratify=y, shuffle=True
    )
    first = _fresh_split(monkeypatch, tmp_path, seed, fraction)
    assert [np.array_equal(a, b) for a, b in zip(first, want)] == [True, True]
    assert len(list((tmp_path / "cache").glob("digits-split-*.npz"))) == 1

    # read back from the file: scikit-learn's split is not computed again
    def no_sklearn(*a):
        raise AssertionError("recomputed")

    monkeypatch.setattr(D, "_sklearn_split", no_sklearn)
    again = _fresh_split(monkeypatch, tmp_path, seed, fraction)
    assert [np.array_equal(a, b) for a, b in zip(again, want)] == [True, True]


def test_a_bad_digits_cache_file_is_ignored_and_rewritten(monkeypatch, tmp_path) -> None:

    want = _fresh_split(monkeypatch, tmp_path, 1, 0.2)
    (path,) = (tmp_path / "cache").glob("digits-split-*.npz")
    # not a partition of the examples (an index twice, one missing)
    np.savez(path, train=np.r_[want[0][:-1], want[0][0]], test=want[1])
    got = _fresh_split(monkeypatch, tmp_path, 1, 0.2)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    path.write_bytes(b"not a numpy file")
    got = _fresh_split(monkeypatch, tmp_path, 1, 0.2)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    with np.load(path) as f:  # rewritten
        assert np.array_equal(f["train"], want[0]) and np.array_equal(f["test"], want[1])


def test_an_empty_cache_dir_setting_writes_nothing(monkeypatch, tmp_path) -> None:
    from mmfl_flwr.tasks import data as D

    monkeypatch.chdir(tmp_path)
    got = _fresh_split(monkeypatch, tmp_path, 2, 0.2, cache="")
    assert D.cache_dir() is None and list(tmp_path.iterdir()) == []
    assert len(got[1]) == 360


def test_loading_digits_with_a_warm_cache_does_not_import_scikit_learn(tmp_path) -> None:
    code = (
        "import sys; from mmfl_flwr.tasks.data import load_digits_data; "
        "load_digits_data(0); print('sklearn' in sys.modules)"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "MMFL_CACHE_DIR": str(tmp_path),
    }
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    ]
    assert runs == ["True", "False"]  # the first computes the split, the second reads it


def test_data_modules_do_not_import_torch() -> None:
    code = (
        "import sys, mmfl_flwr.tasks, mmfl_flwr.tasks.data, mmfl_flwr.tasks.federation; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


# ------------------------------------------------------------------------ synthetic


def test_synthetic_user_independent_of_num_users() -> None:
    few = synthetic_users(1.0, 1.0, 3, seed=7)
    many = synthetic_users(1.0, 1.0, 10, seed=7)
    for k in range(3):
        assert _same(few[k][0], many[k][0]) and _same(few[k][1], many[k][1])
    few_iid = synthetic_users(1.0, 1.0, 2, seed=7, iid=True)
    many_iid = synthetic_users(1.0, 1.0, 6, seed=7, iid=True)
    for k in range(2):
        assert _same(few_iid[k][0], many_iid[k][0])


def test_synthetic_shapes_counts_and_determinism() -> None:
    users = synthetic_users(1.0, 1.0, 20, dim=60, num_classes=5, seed=1)
    again = synthetic_users(1.0, 1.0, 20, dim=60, num_classes=5, seed=1)
    other = synthetic_users(1.0, 1.0, 20, dim=60, num_classes=5, seed=2)
    for (tr, te), (tr2, te2) in zip(users, again):
        assert _same(tr, tr2) and _same(te, te2)
        n = len(tr) + len(te)
        assert n >= 50
        assert len(tr) == int(0.9 * n)
        assert tr.x.dtype == np.float32 and tr.x.shape[1] == 60
        assert tr.y.dtype == np.int64
        assert tr.y.min() >= 0 and tr.y.max() < 5
    assert not _same(users[0][0], other[0][0])


def test_synthetic_cap_and_iid_structure() -> None:
    users = synthetic_users(1.0, 1.0, 30, seed=0, max_samples=80)
    for tr, te in users:
        assert 50 <= len(tr) + len(te) <= 80
    # Synthetic-IID: inputs are centred (v = 0) and share one model, so the pooled
    # per-coordinate mean is near 0 while non-IID user means are spread (std ~ sqrt(2)).
    iid = synthetic_users(1.0, 1.0, 30, seed=0, iid=True, max_samples=200)
    means = np.array([tr.x.mean(axis=0)[0] for tr, _ in iid])
    non_iid_means = np.array([tr.x.mean(axis=0)[0] for tr, _ in users])
    assert np.abs(means).max() < 0.5
    assert non_iid_means.std() > 0.7
    # Coordinate variance decays like j^-1.2 (coordinate 1 vs coordinate 60).
    pooled = np.concatenate([tr.x for tr, _ in iid])
    var = pooled.var(axis=0)
    assert var[0] == pytest.approx(1.0, rel=0.1)
    assert var[59] == pytest.approx(60.0**-1.2, rel=0.15)


# ----------------------------------------------------------------------- federation


def test_task_names_suffixes() -> None:
    assert task_names(["digits", "synthetic", "digits"]) == ["digits", "synthetic", "digits_2"]
    assert task_names(["digits"] * 3 + ["synthetic"] * 2) == [
        "digits",
        "digits_2",
        "digits_3",
        "synthetic",
        "synthetic_2",
    ]
    with pytest.raises(ValueError):
        task_names(["no-such-kind"])


@pytest.fixture(scope="module")
def fed():
    return build_federation(["digits", "synthetic", "digits"], num_clients=40, seed=5)


def test_federation_fields(fed) -> None:
    assert fed.tasks == ["digits", "synthetic", "digits_2"]
    assert fed.kinds == {"digits": "digits", "synthetic": "synthetic", "digits_2": "digits"}
    assert fed.processors.shape == (40,) and np.all(fed.processors == 1)
    for t in fed.tasks:
        assert fed.eligible[t].dtype == bool and fed.eligible[t].shape == (40,)
        assert fed.eligible[t].all()
    for cid in range(40):
        assert fed.client_tasks(cid) == fed.tasks
        counts = fed.num_examples(cid)
        assert set(counts) == set(fed.tasks)
        assert all(c > 0 for c in counts.values())
        for t in fed.tasks:
            assert counts[t] == len(fed.client_data(cid, t)[0])


def test_federation_label_skew_and_full_use(fed) -> None:
    train, test = load_digits_data(5)
    max_labels = max(1, round(0.3 * 10))
    for t in ("digits", "digits_2"):
        ys = []
        for cid in range(fed.num_clients):
            tr, te = fed.client_data(cid, t)
            assert len(tr) >= 1
            labels = set(np.unique(tr.y))
            assert len(labels) <= max_labels
            assert set(np.unique(te.y)) <= labels
            ys.append(tr.y)
            assert tr.x.shape[1:] == (1, 8, 8)
        # Every training example used exactly once: the multiset of (image, label)
        # pairs of the clients equals the global training split.
        xs = np.concatenate([fed.client_data(c, t)[0].x for c in range(fed.num_clients)])
        yall = np.concatenate(ys)
        assert len(yall) == len(train)

        def rows(x: np.ndarray, y: np.ndarray) -> list[bytes]:
            flat = np.concatenate([x.reshape(len(x), -1).astype(np.float64), y[:, None]], 1)
            return sorted(map(bytes, flat))

        assert rows(xs, yall) == rows(train.x, train.y)
        assert _same(fed.server_test(t), test)


def test_federation_copies_differ(fed) -> None:
    a = [fed.client_data(c, "digits")[0] for c in range(fed.num_clients)]
    b = [fed.client_data(c, "digits_2")[0] for c in range(fed.num_clients)]
    assert any(not _same(x, y) for x, y in zip(a, b))
    # Two synthetic copies hold different data too.
    f2 = build_federation(["synthetic", "synthetic"], num_clients=5, seed=5)
    assert not _same(f2.client_data(0, "synthetic")[0], f2.client_data(0, "synthetic_2")[0])


def test_federation_deterministic(fed) -> None:
    again = build_federation(["digits", "synthetic", "digits"], num_clients=40, seed=5)
    other = build_federation(["digits", "synthetic", "digits"], num_clients=40, seed=6)
    for t in fed.tasks:
        for cid in range(fed.num_clients):
            assert _same(fed.client_data(cid, t)[0], again.client_data(cid, t)[0])
            assert _same(fed.client_data(cid, t)[1], again.client_data(cid, t)[1])
        assert _same(fed.server_test(t), again.server_test(t))
    assert any(
        not _same(fed.client_data(c, "digits")[0], other.client_data(c, "digits")[0])
        for c in range(fed.num_clients)
    )


def test_federation_synthetic_matches_users_and_server_test(fed) -> None:
    server = fed.server_test("synthetic")
    total = sum(len(fed.client_data(c, "synthetic")[1]) for c in range(fed.num_clients))
    assert len(server) == total
    np.testing.assert_array_equal(
        server.x[: len(fed.client_data(0, "synthetic")[1])],
        fed.client_data(0, "synthetic")[1].x,
    )
    for c in range(fed.num_clients):
        tr, te = fed.client_data(c, "synthetic")
        assert 50 <= len(tr) + len(te) <= 500
        assert tr.x.shape[1] == KINDS["synthetic"].input_shape[0]


def test_ineligible_client_raises(fed) -> None:
    fed.eligible["digits"][3] = False
    try:
        with pytest.raises(KeyError):
            fed.client_data(3, "digits")
        assert "digits" not in fed.client_tasks(3)
        assert "digits" not in fed.num_examples(3)
    finally:
        fed.eligible["digits"][3] = True
    with pytest.raises(KeyError):
        fed.client_data(0, "nope")


@pytest.mark.parametrize("num_clients", [1, 2, 3, 7, 100, 600])
def test_partition_edge_cases(num_clients: int) -> None:
    train, _ = load_digits_data(0)
    rng = np.random.default_rng(0)
    idx, held = label_skew_partition(train.y, num_clients, 3, rng, 10)
    allidx = np.sort(np.concatenate(idx))
    np.testing.assert_array_equal(allidx, np.arange(len(train)))
    for ix, h in zip(idx, held):
        assert len(ix) >= 1
        assert set(np.unique(train.y[ix])) <= set(h.tolist())
        if num_clients * 3 >= 10:
            assert len(np.unique(train.y[ix])) <= 3


def test_build_is_fast() -> None:
    import time

    build_federation(["digits"], num_clients=10, seed=11)  # warm the digits cache
    start = time.perf_counter()
    build_federation(["digits", "synthetic", "digits"], num_clients=100, seed=11)
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("iid", [False, True])
@pytest.mark.parametrize("max_samples", [None, 20])
def test_packed_synthetic_users_are_the_users_one_after_another(
    iid, max_samples, monkeypatch
) -> None:
    """A shard node generates its users straight into the packed arrays: the same
    values as synthetic_users gives them, train rows and test rows each in order."""
    from mmfl_flwr.tasks.data import packed_synthetic_users

    ids = [3, 0, 7, 8, 2]
    users = synthetic_users(1.0, 1.0, 10, seed=5, iid=iid, max_samples=max_samples, ids=ids)
    packed = packed_synthetic_users(1.0, 1.0, 10, ids, seed=5, iid=iid, max_samples=max_samples)
    for side, (x, y, ends) in enumerate(packed):
        assert x.dtype == np.float32 and y.dtype == np.int64
        np.testing.assert_array_equal(x, np.concatenate([u[side].x for u in users]))
        np.testing.assert_array_equal(y, np.concatenate([u[side].y for u in users]))
        np.testing.assert_array_equal(ends, np.cumsum([len(u[side]) for u in users]))
    with monkeypatch.context() as m:  # no array left unwritten: fresh arrays hold 7s
        m.setattr(np, "empty", lambda shape, dtype=float, **kw: np.ones(shape, dtype) * 7)
        got = packed_synthetic_users(
            1.0, 1.0, 10, iter(ids), seed=5, iid=iid, max_samples=max_samples
        )  # any iterable
    for side in (0, 1):
        for a, b in zip(got[side], packed[side]):
            np.testing.assert_array_equal(a, b)
    (x, y, ends), _ = packed_synthetic_users(1.0, 1.0, 10, [], seed=5)
    assert x.shape == (0, 60) and y.shape == (0,) and len(ends) == 0
    with pytest.raises(ValueError, match="outside"):
        packed_synthetic_users(1.0, 1.0, 10, [10], seed=5)
