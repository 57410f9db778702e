"""User task registry: registering, refusing clashes, and replacing a task in
the same process (the replaced task's data must not be served from a cache)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app.client_app import client_spec
from mmfl_flwr.flower_app.data import federation_for
from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.registry import get_task, register_task, unregister_task

NAME = "reg-test-task"


def data_with(per_client: int):
    """A data_fn giving every client ``per_client`` training examples."""

    def data_fn(num_clients, seed, copy):
        rng = np.random.default_rng(seed)

        def ds(n):
            return Dataset(
                rng.normal(size=(n, 3)).astype(np.float32), rng.integers(0, 2, n).astype(np.int64)
            )

        return [(ds(per_client), ds(2)) for _ in range(num_clients)], ds(5)

    return data_fn


def model_fn():
    import torch

    return torch.nn.Linear(3, 2)


@pytest.fixture(autouse=True)
def _clean():
    unregister_task(NAME)
    yield
    unregister_task(NAME)


def _settings() -> Settings:
    return Settings(tasks=NAME, num_clients=3, output_dir="")


def _ctx(pid: int) -> Context:
    return Context(
        run_id=1,
        node_id=pid + 1,
        node_config={"partition-id": pid},
        state=RecordDict(),
        run_config={},
    )


def test_register_get_and_refuse_clashes():
    first = data_with(4)
    d = register_task(NAME, model_fn=model_fn, data_fn=first)
    assert get_task(NAME) is d
    register_task(NAME, model_fn=model_fn, data_fn=first)  # same data_fn: harmless
    with pytest.raises(ValueError, match="already registered"):
        register_task(NAME, model_fn=model_fn, data_fn=data_with(5))
    with pytest.raises(ValueError, match="built-in"):
        register_task("digits", model_fn=model_fn, data_fn=first)
    with pytest.raises(ValueError, match="commas"):
        register_task("a,b", model_fn=model_fn, data_fn=first)


def test_replace_serves_the_new_data_in_the_same_process():
    """register_task(..., replace=True) must not leave the old task's data in the
    federation cache: clients and the server see the new data."""
    register_task(NAME, model_fn=model_fn, data_fn=data_with(4))
    s = _settings()
    assert federation_for(s).client_data(0, NAME)[0].x.shape[0] == 4
    assert client_spec(_ctx(1), s).trainers[NAME].num_examples == 4

    register_task(NAME, model_fn=model_fn, data_fn=data_with(7), replace=True)
    assert federation_for(s).client_data(0, NAME)[0].x.shape[0] == 7
    assert client_spec(_ctx(1), s).trainers[NAME].num_examples == 7


def test_every_built_in_kind_is_a_registration_of_its_own_module():
    """The built-in kinds are register_task registrations made by the modules of
    mmfl_flwr.tasks.builtin, each kind by one module, every module registering
    some; KINDS and the known kinds are read from them."""
    import importlib
    import pkgutil

    import mmfl_flwr.tasks.builtin as B
    from mmfl_flwr.tasks.federation import known_kinds
    from mmfl_flwr.tasks.kinds import KINDS
    from mmfl_flwr.tasks.registry import registered_tasks, task_kinds

    by_module: dict[str, list[str]] = {}
    for kind in KINDS:
        d = get_task(kind)
        assert d is not None and d.builtin and d.build is not None and d.spec == KINDS[kind]
        by_module.setdefault(
            d.build.func.__module__ if hasattr(d.build, "func") else d.build.__module__, []
        ).append(kind)
    modules = {f"{B.__name__}.{m.name}" for m in pkgutil.iter_modules(B.__path__)}
    assert set(by_module) == modules
    for module in modules:
        importlib.import_module(module)  # imported again: no second registration
    assert sorted(KINDS) == sorted(k for k in task_kinds() if get_task(k).builtin)
    assert known_kinds() == task_kinds()
    assert not set(KINDS) & set(registered_tasks())  # not shipped to other processes


def test_a_built_in_kind_cannot_be_replaced_or_unregistered():
    before = get_task("synthetic")
    with pytest.raises(ValueError, match="built-in"):
        register_task("synthetic", model_fn=model_fn, data_fn=data_with(2), replace=True)
    unregister_task("synthetic")
    assert get_task("synthetic") is before


def test_a_task_built_from_the_request_is_trained_like_a_built_in_one():
    """build= sees the profile's eligibility and may narrow it; refused together
    with another source of data."""
    from mmfl_flwr.tasks.federation import build_federation

    def build(req):
        holders = req.eligible & (np.arange(req.num_clients) % 2 == 0)
        rng = np.random.default_rng([req.seed, req.copy])

        def ds(n):
            return Dataset(rng.normal(size=(n, 3)).astype(np.float32), np.zeros(n, np.int64))

        clients = [
            (ds(3 + k), ds(1)) if holders[k] else (ds(0), ds(0)) for k in range(len(holders))
        ]
        return clients, ds(4), holders

    register_task(NAME, model_fn=model_fn, build=build)
    fed = build_federation(["digits", NAME, NAME], 6, 1)  # uniform: every client eligible
    for task in fed.tasks[1:]:
        assert fed.eligible[task].tolist() == [k % 2 == 0 for k in range(6)]
        for k in (0, 2, 4):
            assert len(fed.client_data(k, task)[0]) == 3 + k
    partial = build_federation(["digits", NAME], 20, 1, profile="paper003")
    assert not partial.eligible[NAME][1::2].any()
    a, b = (fed.client_data(0, t)[0].x for t in fed.tasks[1:])
    assert not np.array_equal(a, b)  # each copy its own request
    with pytest.raises(ValueError, match="build= alone"):
        register_task(NAME, model_fn=model_fn, build=build, data_fn=data_with(2), replace=True)
