"""``seed``, ``data-seed`` and ``model-seed``: what each one fixes."""

from __future__ import annotations

import numpy as np

from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app import data as D
from mmfl_flwr.flower_app.server_app import initial_arrays
from mmfl_flwr.records import arrays_to_numpy

BASE = dict(tasks="digits,synthetic", num_clients=6)


def weights(**kw) -> dict[str, dict[str, np.ndarray]]:
    return {t: arrays_to_numpy(r) for t, r in initial_arrays(Settings(**BASE, **kw)).items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[t].keys() == b[t].keys() and all(np.array_equal(a[t][k], b[t][k]) for k in a[t])
        for t in a
    )


def first_samples(**kw) -> list[np.ndarray]:
    fed = D.federation_for(Settings(**BASE, **kw))
    return [
        np.asarray(fed.data[t][c][0].x[0])
        for t in fed.tasks
        for c in range(6)
        if fed.eligible[t][c]
    ]


def test_model_seed_fixes_the_initial_weights_and_only_them():
    w0, w1 = weights(seed=0), weights(seed=1)
    assert not same(w0, w1)  # by default the seed moves the initial weights
    assert same(weights(seed=1, model_seed=0), w0)
    assert same(weights(seed=1, model_seed=-1), w1)
    assert not same(weights(seed=0, model_seed=1), w0)
    assert same(weights(seed=1, model_seed=0, data_seed=5), w0)  # the data does not move them


def test_data_seed_fixes_the_data_and_model_seed_does_not_move_it():
    d0, d1 = first_samples(seed=0), first_samples(seed=1)
    assert len(d0) == len(d1) and not all(np.array_equal(x, y) for x, y in zip(d0, d1))
    fixed = first_samples(seed=1, data_seed=0)
    assert len(fixed) == len(d0) and all(np.array_equal(x, y) for x, y in zip(fixed, d0))
    moved = first_samples(seed=0, model_seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(moved, d0))


def test_the_seeds_used_fall_back_to_seed_only_at_minus_one():
    """``data_seed_used`` / ``model_seed_used``: the setting, or ``seed`` at -1 (0 is a
    seed of its own, not "unset")."""
    for field, used in (("data_seed", "data_seed_used"), ("model_seed", "model_seed_used")):
        assert getattr(Settings(seed=7), used) == 7
        assert getattr(Settings(seed=7, **{field: 0}), used) == 0
        assert getattr(Settings(seed=7, **{field: 3}), used) == 3
