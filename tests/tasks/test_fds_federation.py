"""flwr-datasets partitioners behind the federation builder (issue #15).

* built-in image tasks: ``Profile(partition="iid" | "dirichlet" | "pathological")``;
* user tasks: ``register_task(..., dataset=..., partitioner=...)`` with any
  flwr-datasets partitioner, also through ``runner.run(engine="inprocess")``.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from mmfl_flwr import runner
from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app.data import federation_for
from mmfl_flwr.tasks.data import Dataset, load_digits_data
from mmfl_flwr.tasks.federation import Profile, build_federation
from mmfl_flwr.tasks.partitions import _fds
from mmfl_flwr.tasks.registry import (
    get_task,
    register_task,
    registered_tasks,
    restore,
    unregister_task,
)

NAME = "fds-user-task"


@pytest.fixture(autouse=True)
def _clean():
    unregister_task(NAME)
    yield
    unregister_task(NAME)


def model_fn():
    import torch

    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))


def _train_sets(fed, task):
    return [fed.client_data(c, task)[0] for c in range(fed.num_clients) if fed.eligible[task][c]]


def _rows(train: Dataset, part: Dataset) -> np.ndarray:
    """Row indices of ``part``'s examples in ``train`` (digits rows are unique)."""
    keys = {row.tobytes(): i for i, row in enumerate(train.x.reshape(len(train), -1))}
    assert len(keys) == len(train)
    return np.array([keys[r.tobytes()] for r in part.x.reshape(len(part), -1)], np.int64)


# -------------------------------------------------- built-in kinds, Profile.partition


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "pathological"])
def test_profile_partition_builds_a_valid_digits_federation(partition):
    train, test = load_digits_data(0)
    fed = build_federation(["digits"], 12, 0, profile=Profile(partition=partition))
    sets = _train_sets(fed, "digits")
    assert len(sets) == 12 and all(len(s) >= 1 for s in sets)
    rows = np.concatenate([_rows(train, s) for s in sets])
    assert np.unique(rows).shape[0] == rows.shape[0]  # disjoint
    if partition != "pathological":  # pathological drops labels nobody drew
        np.testing.assert_array_equal(np.sort(rows), np.arange(len(train)))
    labels_per = [np.unique(s.y).shape[0] for s in sets]
    if partition == "pathological":
        assert max(labels_per) <= 3  # round(0.3 * 10)
    if partition == "iid":
        assert min(labels_per) >= 8  # ~120 examples of 10 labels each
        assert max(len(s) for s in sets) - min(len(s) for s in sets) <= 1
    # local test sets: the test examples of the client's labels
    for c in range(12):
        tr, te = fed.client_data(c, "digits")
        assert set(np.unique(te.y)) <= set(np.unique(tr.y))
    assert fed.server_test("digits").y.shape == test.y.shape


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "pathological"])
def test_profile_partition_is_seeded(partition):
    prof = Profile(partition=partition)

    def sizes(seed, kinds=("digits",)):
        fed = build_federation(list(kinds), 10, seed, profile=prof)
        return [tuple(s.y.tolist()) for s in _train_sets(fed, "digits")]

    assert sizes(1) == sizes(1)
    assert sizes(1) != sizes(2)
    fed = build_federation(["digits", "digits"], 10, 1, profile=prof)
    a = [tuple(s.y.tolist()) for s in _train_sets(fed, "digits")]
    b = [tuple(s.y.tolist()) for s in _train_sets(fed, "digits_2")]
    assert a != b  # every copy draws its own partition


@pytest.mark.parametrize(
    "partition,cls",
    [
        ("iid", "IidPartitioner"),
        ("dirichlet", "DirichletPartitioner"),
        ("pathological", "PathologicalPartitioner"),
    ],
)
def test_profile_partition_runs_the_flwr_datasets_partitioner(partition, cls, monkeypatch):
    fds = _fds()
    made = []
    original = getattr(fds, cls)

    def spy(*args, **kwargs):
        made.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(fds, cls, spy)
    build_federation(["digits", "synthetic", "digits"], 9, 0, profile=Profile(partition=partition))
    assert made == [9, 9]  # one partitioner per digits copy, one partition per client
    made.clear()
    build_federation(["digits"], 9, 0)  # the default label skew is our own code
    assert made == []


def test_dirichlet_profile_alpha_controls_skew():
    def labels_held(alpha):
        fed = build_federation(
            ["digits"], 10, 0, profile=Profile(partition="dirichlet", dirichlet_alpha=alpha)
        )
        return np.mean([np.unique(s.y).shape[0] for s in _train_sets(fed, "digits")])

    assert labels_held(0.05) < 4
    assert labels_held(100.0) > 9.5


def test_profile_partition_respects_eligibility():
    prof = Profile(partition="dirichlet", partial_fraction=1.0)  # each client drops a task
    fed = build_federation(["digits", "synthetic"], 10, 0, profile=prof)
    members = np.flatnonzero(fed.eligible["digits"])
    assert 0 < members.shape[0] < 10
    assert all(len(fed.client_data(int(c), "digits")[0]) >= 1 for c in members)
    total = sum(len(fed.client_data(int(c), "digits")[0]) for c in members)
    assert total == len(load_digits_data(0)[0])


def test_profile_partition_refuses_what_flwr_datasets_cannot_express():
    with pytest.raises(ValueError, match="cannot express"):
        build_federation(["digits"], 10, 0, profile=Profile(partition="iid", clusters=5))
    with pytest.raises(ValueError, match="cannot express"):
        build_federation(
            ["digits"], 10, 0, profile=Profile(partition="pathological", high_data_fraction=0.1)
        )
    with pytest.raises(ValueError, match="unknown partition"):
        build_federation(["digits"], 10, 0, profile=Profile(partition="shards"))


# ------------------------------------------------------------------ user tasks


def _register(partitioner, dataset=None):
    train, test = load_digits_data(0)
    return register_task(
        NAME,
        model_fn=model_fn,
        dataset=dataset or (train, test),
        partitioner=partitioner,
        replace=True,
    )


def test_user_partitioner_factory_gets_clients_and_a_derived_seed():
    fds = _fds()
    calls = []

    def factory(num_partitions, seed):
        calls.append((num_partitions, seed))
        return fds.DirichletPartitioner(
            num_partitions, "label", 0.3, min_partition_size=1, seed=seed
        )

    _register(factory)
    train, test = load_digits_data(0)
    fed = build_federation([NAME, NAME], 8, 4)
    fed_again = build_federation([NAME, NAME], 8, 4)
    build_federation([NAME], 8, 5)
    assert [c[0] for c in calls] == [8, 8, 8, 8, 8]
    seeds = [c[1] for c in calls]
    assert all(isinstance(s, int) for s in seeds)
    assert seeds[0] != seeds[1]  # copies
    assert seeds[:2] == seeds[2:4]  # deterministic
    assert seeds[4] not in seeds[:2]  # run seed
    sets = _train_sets(fed, NAME)
    rows = np.concatenate([_rows(train, s) for s in sets])
    np.testing.assert_array_equal(np.sort(rows), np.arange(len(train)))
    for c in range(8):
        np.testing.assert_array_equal(
            fed.client_data(c, NAME)[0].y, fed_again.client_data(c, NAME)[0].y
        )
        assert len(fed.client_data(c, NAME)[1]) == 0  # no local test set
    np.testing.assert_array_equal(fed.server_test(NAME).y, test.y)


def test_user_size_partitioner_instance_is_copied_for_every_use():
    fds = _fds()
    part = fds.SizePartitioner([10, 20, 30, 40])
    _register(part)
    train, _ = load_digits_data(0)
    fed = build_federation([NAME, NAME], 4, 0)
    assert not part.is_dataset_assigned()
    for task in fed.tasks:
        assert [len(s) for s in _train_sets(fed, task)] == [10, 20, 30, 40]
    a = _rows(train, fed.client_data(0, NAME)[0])
    b = _rows(train, fed.client_data(0, NAME + "_2")[0])
    assert set(a.tolist()) != set(b.tolist())  # rows in a random order per copy


def test_user_natural_id_partitioner_with_a_column():
    fds = _fds()
    train, test = load_digits_data(0)
    writers = np.random.default_rng(0).integers(0, 30, len(train))
    _register(
        lambda n, seed: fds.NaturalIdPartitioner("writer"),
        dataset=lambda seed: (train, test, {"writer": writers}),
    )
    fed = build_federation([NAME], 6, 0)
    seen = set()
    for s in _train_sets(fed, NAME):
        ws = np.unique(writers[_rows(train, s)])
        assert ws.shape[0] == 1  # one writer per client
        assert len(s) == int((writers == ws[0]).sum())  # all of that writer's data
        seen.add(int(ws[0]))
    assert len(seen) == 6
    assert seen != {0, 1, 2, 3, 4, 5}  # six of the 30 writers drawn, not the first six


def test_empty_partitions_make_clients_ineligible():
    fds = _fds()
    _register(
        lambda n, seed: fds.PathologicalPartitioner(n, "label", 1, "deterministic", seed=seed)
    )
    fed = build_federation([NAME], 4, 0)
    assert fed.eligible[NAME].all()
    with pytest.raises(ValueError, match="fewer than"):
        _register(lambda n, seed: fds.IidPartitioner(n - 1))
        build_federation([NAME], 4, 0)


def test_register_refuses_bad_partitioners_and_datasets():
    fds = _fds()
    train, test = load_digits_data(0)
    used = fds.IidPartitioner(2)
    used.dataset = __import__("datasets").Dataset.from_dict({"label": [0, 1]})
    with pytest.raises(ValueError, match="already has a dataset"):
        register_task(NAME, model_fn, dataset=(train, test), partitioner=used)
    with pytest.raises(TypeError, match="partitioner must be"):
        register_task(NAME, model_fn, dataset=(train, test), partitioner=3)
    with pytest.raises(ValueError, match="needs dataset"):
        register_task(NAME, model_fn, partitioner=fds.IidPartitioner(2))
    with pytest.raises(ValueError, match="not both"):
        register_task(
            NAME,
            model_fn,
            data_fn=lambda n, s, c: None,
            dataset=(train, test),
            partitioner=fds.IidPartitioner(2),
        )
    with pytest.raises(ValueError, match="needs partitioner"):
        register_task(NAME, model_fn, data_fn=lambda n, s, c: None, dataset=(train, test))
    with pytest.raises(TypeError, match="dataset must be"):
        register_task(NAME, model_fn, dataset=train, partitioner=fds.IidPartitioner(2))
    with pytest.raises(ValueError, match="one value per training example"):
        register_task(
            NAME,
            model_fn,
            dataset=(train, test, {"w": np.zeros(3)}),
            partitioner=fds.IidPartitioner(2),
        )
    with pytest.raises(ValueError, match="'label'"):
        register_task(
            NAME,
            model_fn,
            dataset=(train, test, {"label": train.y}),
            partitioner=fds.IidPartitioner(2),
        )
    assert get_task(NAME) is None
    # a factory returning something else is caught when the federation is built
    register_task(NAME, model_fn, dataset=(train, test), partitioner=lambda n, s: "iid")
    with pytest.raises(TypeError, match="must return"):
        build_federation([NAME], 3, 0)
    # re-registering the same definition is harmless; a different one needs replace
    part = fds.IidPartitioner(3)
    register_task(NAME, model_fn, dataset=(train, test), partitioner=part, replace=True)
    register_task(NAME, model_fn, dataset=(train, test), partitioner=part)
    with pytest.raises(ValueError, match="already registered"):
        register_task(NAME, model_fn, dataset=(train, test), partitioner=fds.IidPartitioner(3))


def test_partitioned_task_travels_in_the_registry_snapshot():
    """Simulated clients get the task from a cloudpickled snapshot (launch.py)."""
    import cloudpickle

    fds = _fds()
    _register(lambda n, seed: fds.LinearPartitioner(n))
    snap = pickle.loads(cloudpickle.dumps(registered_tasks()))
    unregister_task(NAME)
    restore(snap)
    fed = build_federation([NAME], 3, 0)
    sizes = [len(s) for s in _train_sets(fed, NAME)]
    assert sizes[0] < sizes[1] < sizes[2]


def test_user_partitioner_runs_through_the_runner():
    """A user task split by flwr-datasets' LinearPartitioner trains next to
    digits for two rounds on the in-process engine, and each client holds its
    linear share (client i: (i+1)/15 of the data, the rest to the last)."""
    fds = _fds()
    calls = []

    def factory(num_partitions, seed):
        calls.append(num_partitions)
        return fds.LinearPartitioner(num_partitions)

    train, _ = load_digits_data(0)
    _register(factory)
    s = Settings(
        tasks=f"{NAME},digits", num_clients=5, num_rounds=2, local_epochs=1, output_dir="", seed=7
    )
    result = runner.run(s, engine="inprocess")
    rows = [h for h in result.history if h["task"] == NAME]
    assert [h["round"] for h in rows] == [0, 1, 2]
    assert rows[-1]["uploads"] >= 1
    assert rows[-1]["accuracy"] > rows[0]["accuracy"]
    assert calls == [5]
    fed = federation_for(s)
    n = len(train)
    expected = [n * (i + 1) // 15 for i in range(4)]
    expected.append(n - sum(expected))
    assert [len(fed.client_data(c, NAME)[0]) for c in range(5)] == expected
