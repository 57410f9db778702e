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
