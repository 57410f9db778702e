"""A process builds only the part of the federation it needs (issue 24, item 7):
a shard node its clients' data, the server the test sets. What is built must be
exactly what the whole federation holds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app import data as D
from mmfl_flwr.tasks.federation import build_federation


def _same(a, b) -> None:
    assert a.x.shape == b.x.shape and a.y.shape == b.y.shape
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)


@pytest.mark.parametrize("profile", ["uniform", "paper003", "paper003-sizes"])
@pytest.mark.parametrize(
    "kinds", [["synthetic", "synthetic"], ["digits", "synthetic-b"], ["synthetic-iid", "synthetic"]]
)
def test_a_shard_builds_exactly_its_clients_data(kinds, profile):
    full = build_federation(kinds, 23, 4, profile=profile, max_synthetic_samples=60)
    ids = [2, 3, 4, 5, 17]
    part = build_federation(
        kinds, 23, 4, profile=profile, max_synthetic_samples=60, clients=ids, server_tests=False
    )
    assert part.hosted == frozenset(ids) and not part.has_server_tests
    np.testing.assert_array_equal(part.processors, full.processors)
    for task in full.tasks:
        np.testing.assert_array_equal(part.eligible[task], full.eligible[task])
        for k in ids:
            if full.eligible[task][k]:
                for a, b in zip(part.client_data(k, task), full.client_data(k, task)):
                    _same(a, b)
        held = [k for k in range(23) if k not in ids and full.eligible[task][k]]
        with pytest.raises(KeyError, match="not built here"):
            part.client_data(held[0], task)
        with pytest.raises(KeyError, match="not built here"):
            part.server_test(task)
        if full.kinds[task].startswith("synthetic"):  # nothing kept for the others
            assert all(len(part.data[task][k][0]) == 0 for k in held)


@pytest.mark.parametrize("profile", ["uniform", "paper003", "paper003-sizes"])
def test_the_server_part_holds_the_test_sets_and_no_client_data(profile):
    kinds = ["synthetic", "digits", "synthetic-b"]
    full = build_federation(kinds, 15, 1, profile=profile, max_synthetic_samples=40)
    server = build_federation(kinds, 15, 1, profile=profile, max_synthetic_samples=40, clients=())
    for task in full.tasks:
        _same(server.server_test(task), full.server_test(task))
        if full.kinds[task].startswith("synthetic"):
            assert sum(len(tr) + len(te) for tr, te in server.data[task]) == 0
        with pytest.raises(KeyError, match="not built here"):
            server.client_data(int(np.flatnonzero(full.eligible[task])[0]), task)


def test_build_federation_refuses_client_ids_outside_the_federation():
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        build_federation(["synthetic"], 5, 0, clients=[5])


def test_federation_for_serves_every_part_from_the_whole_federation_once_built(monkeypatch):
    built = []
    real = D.build_federation

    def counting(*a, **kw):
        built.append(kw.get("clients"))
        return real(*a, **kw)

    monkeypatch.setattr(D, "build_federation", counting)
    monkeypatch.setattr(D, "_FEDERATIONS", type(D._FEDERATIONS)())
    s = Settings(tasks="synthetic", num_clients=9, seed=123)
    shard = D.federation_for(s, clients=range(3, 6), server_tests=False)
    assert shard.hosted == frozenset({3, 4, 5})
    assert D.federation_for(s, clients=[5, 4, 3], server_tests=False) is shard  # cached
    server = D.federation_for(s, clients=(), server_tests=True)
    assert server.hosted == frozenset() and server.has_server_tests
    assert len(built) == 2
    other = D.federation_for(s, clients=range(6, 9), server_tests=False)
    assert other.hosted == frozenset({6, 7, 8}) and len(built) == 3
    # one shard part at a time: the first one is built again; the server part stays
    assert D.federation_for(s, clients=range(3, 6), server_tests=False) is not shard
    assert D.federation_for(s, clients=(), server_tests=True) is server
    assert len(built) == 4
    whole = D.federation_for(s)
    assert whole.hosted is None and len(built) == 5
    # from now on the whole federation answers every request, without a build
    assert D.federation_for(s, clients=[1], server_tests=False) is whole
    assert D.federation_for(s, clients=(), server_tests=True) is whole
    assert D.federation_for(s, clients=range(9)) is whole
    assert len(built) == 5


def test_a_shards_clients_are_packed_and_read_without_a_copy():
    """Each synthetic task's client data lies in one array, client after client;
    the batched kernels read the clients of a node in that order without copying
    them, and in any other order with a copy of the same values."""
    import torch

    from mmfl_flwr.client import vectorized as V
    from mmfl_flwr.client.trainer import TorchTrainer
    from mmfl_flwr.tasks.models import make_model

    fed = build_federation(["synthetic"], 12, 3, clients=range(2, 9), server_tests=False)
    task = fed.tasks[0]
    trainers = [
        TorchTrainer(lambda: make_model("synthetic"), *fed.client_data(k, task), 4)
        for k in range(2, 9)
    ]
    data = [V.ClientData(*t.train_tensors()) for t in trainers]
    x_all, y_all, owner, offsets = V._concat(data)
    assert x_all.data_ptr() == data[0].x.data_ptr()  # a view: no copy
    assert torch.equal(x_all, torch.cat([d.x for d in data]))
    assert torch.equal(y_all, torch.cat([d.y for d in data]))
    assert owner.tolist() == [i for i, d in enumerate(data) for _ in range(d.n)]
    shuffled = data[::-1]
    x_rev, *_ = V._concat(shuffled)
    assert x_rev.data_ptr() != data[-1].x.data_ptr()
    assert torch.equal(x_rev, torch.cat([d.x for d in shuffled]))
    # the whole federation's values are unchanged by the packing
    whole = build_federation(["synthetic"], 12, 3)
    for k in range(2, 9):
        for a, b in zip(fed.client_data(k, task), whole.client_data(k, task)):
            _same(a, b)


def test_the_clis_check_generates_no_synthetic_user(monkeypatch):
    """``mmfl run`` checks the data before it writes anything: that loads the
    real datasets, but generates none of a synthetic task's users (the engine
    builds what it needs), also under a profile with low-data subsets."""
    from mmfl_flwr.tasks.builtin import synthetic as F

    calls = []
    real = F.synthetic_users
    monkeypatch.setattr(F, "synthetic_users", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    fed = build_federation(
        ["synthetic", "digits"], 40, 0, profile="paper003", clients=(), server_tests=False
    )
    assert calls == [] or all(list(kw.get("ids", [None])) == [] for kw in calls)
    assert len(fed.data[fed.tasks[1]]) == 40  # the digits task is built as before


def test_a_model_that_writes_into_its_input_does_not_change_the_clients_data():
    """Where the batched kernels read the clients' own memory (no copy), a model
    whose first operation is in place gets a copy of each batch."""
    import torch
    from torch import nn

    from mmfl_flwr.client import vectorized as V

    def model_fn():
        torch.manual_seed(0)
        return nn.Sequential(nn.ReLU(inplace=True), nn.Linear(6, 3))

    base = torch.randn(10, 6)
    labels = torch.arange(10) % 3
    before = base.clone()
    data = [V.ClientData(base[a:b], labels[a:b]) for a, b in ((0, 3), (3, 7), (7, 10))]
    vm = V.VectorModel(model_fn, torch.device("cpu"))
    weights = {k: v.detach().numpy() for k, v in model_fn().state_dict().items()}
    first = V.batched_losses(vm, weights, data)
    assert torch.equal(base, before)  # negative inputs not zeroed in the clients' data
    assert V.batched_losses(vm, weights, data) == first


def _mapped_file(a: np.ndarray) -> str | None:
    """The file ``a``'s memory is mapped from (None: private memory)."""
    base = a
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    return None if base is None else base.filename


def test_with_a_shared_data_directory_shards_map_one_copy_of_their_data(tmp_path, monkeypatch):
    """Where MMFL_SHARED_DATA names a directory, a shard's packed arrays are
    mapped from files there named by their content: a second process (here a
    second build) that builds the same clients maps the same files instead of
    holding a copy; the values are those of a build without it, and the batched
    kernels still read a node's clients without a copy."""
    from mmfl_flwr.client import vectorized as V
    from mmfl_flwr.client.trainer import TorchTrainer
    from mmfl_flwr.tasks.federation import SHARED_DATA_ENV
    from mmfl_flwr.tasks.models import make_model

    plain = build_federation(["synthetic"], 80, 5, clients=range(0, 60), server_tests=False)
    monkeypatch.setenv(SHARED_DATA_ENV, str(tmp_path))
    first = build_federation(["synthetic"], 80, 5, clients=range(0, 60), server_tests=False)
    files = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    assert files and all(f.endswith(".npy") for f in files)  # no temporary file left
    second = build_federation(["synthetic"], 80, 5, clients=range(0, 60), server_tests=False)
    # nothing written again: the same files, not rewritten
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in tmp_path.iterdir()} == files
    task = plain.tasks[0]
    x_first = first.client_data(0, task)[0].x
    where = _mapped_file(x_first)
    assert where is not None and str(tmp_path) in where
    assert _mapped_file(second.client_data(0, task)[0].x) == where
    for k in range(0, 60):
        for a, b in zip(first.client_data(k, task), plain.client_data(k, task)):
            _same(a, b)
    trainers = [
        TorchTrainer(lambda: make_model("synthetic"), *first.client_data(k, task), 4)
        for k in range(0, 60)
    ]
    data = [V.ClientData(*t.train_tensors()) for t in trainers]
    x_all, *_ = V._concat(data)
    assert x_all.data_ptr() == data[0].x.data_ptr() == x_first.ctypes.data  # no copy


def test_an_unusable_shared_data_directory_is_warned_about_and_changes_nothing(
    tmp_path, monkeypatch
):
    """A directory that cannot be written: one warning, the data built as without
    it. A file of the right name whose content differs is not read as the data."""
    from mmfl_flwr.tasks import packed as F

    a = np.arange(300_000, dtype=np.float32).reshape(-1, 60)  # over the 1 MiB floor
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    monkeypatch.setenv(F.SHARED_DATA_ENV, str(not_a_dir))
    monkeypatch.setattr(F, "_SHARE_FAILED", set())
    with pytest.warns(RuntimeWarning, match="not shared"):
        got = F.shared_array(a)
    assert got is a
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert F.shared_array(a) is a  # warned once per directory
    # a file named for a's content, holding other values
    monkeypatch.setenv(F.SHARED_DATA_ENV, str(tmp_path))
    mapped = F.shared_array(a)
    assert _mapped_file(mapped) is not None and np.array_equal(mapped, a)
    path = _mapped_file(mapped)
    del mapped
    np.save(path, np.zeros_like(a))
    again = F.shared_array(a)
    assert _mapped_file(again) is None and np.array_equal(again, a)
    # a file that cannot be read as an array: this array not shared, the folder still used
    np.save(path, a)  # (back to a's content)
    broken = np.arange(300_000, dtype=np.float32).reshape(-1, 60) + 1
    digest_path = _mapped_file(F.shared_array(broken))
    del broken
    with open(digest_path, "wb") as f:
        f.write(b"not an array")
    fresh = np.arange(300_000, dtype=np.float32).reshape(-1, 60) + 1
    assert F.shared_array(fresh) is not None and _mapped_file(F.shared_array(fresh)) is None
    assert _mapped_file(F.shared_array(a.copy())) == path  # the folder is still used
    # small arrays are not worth a file
    small = np.ones((10, 60), np.float32)
    assert F.shared_array(small) is small


def test_two_processes_writing_the_same_data_at_once_map_one_file(tmp_path, monkeypatch):
    """The file takes its name by a link that fails where another process got
    there first: the late writer maps the first one's file (not a second copy),
    and leaves no temporary file."""
    from mmfl_flwr.tasks import packed as F

    monkeypatch.setenv(F.SHARED_DATA_ENV, str(tmp_path))
    monkeypatch.setattr(F, "_SHARE_FAILED", set())
    a = np.arange(300_000, dtype=np.float32).reshape(-1, 60)
    first = F.shared_array(a)
    path = _mapped_file(first)
    inode = (tmp_path / path.split("/")[-1]).stat().st_ino
    real_exists = F.os.path.exists
    # the second writer checked before the first one's file was there
    monkeypatch.setattr(F.os.path, "exists", lambda p: False if p == path else real_exists(p))
    second = F.shared_array(a.copy())
    assert _mapped_file(second) == path and np.array_equal(second, a)
    assert (tmp_path / path.split("/")[-1]).stat().st_ino == inode  # not replaced
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".npy"]
