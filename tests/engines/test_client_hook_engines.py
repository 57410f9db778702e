"""The in-process engines are one path: a client hook (and a ClientApp wrapper) takes
effect on the vectorized engine as on the in-process one."""

from __future__ import annotations

import numpy as np
import pytest

from mmfl_flwr.config import Settings
from mmfl_flwr.records import arrays_to_numpy
from mmfl_flwr.runner import run_inprocess, run_vectorized
from mmfl_flwr.testing.hostile import label_flipping

ENGINES = {"inprocess": run_inprocess, "vectorized": run_vectorized}


def _settings(tmp_path, name: str) -> Settings:
    return Settings(
        strategy="full",
        tasks="digits",
        num_clients=4,
        num_rounds=2,
        local_epochs=1,
        seed=5,
        output_dir=str(tmp_path / name),
    )


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_client_hook_sees_every_client(tmp_path, engine):
    seen: list[str] = []

    def hook(spec):
        seen.append(spec.client_id)
        return spec

    ENGINES[engine](_settings(tmp_path, engine), client_hook=hook)
    assert sorted(set(seen)) == ["0", "1", "2", "3"]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_poisoning_hook_changes_the_run(tmp_path, engine):
    run = ENGINES[engine]
    honest = run(_settings(tmp_path, "honest"))
    poisoned = run(
        _settings(tmp_path, "poisoned"), client_hook=label_flipping(["0", "1", "2", "3"])
    )

    def final(result):
        return arrays_to_numpy(result.arrays["digits"])

    a, b = final(honest), final(poisoned)
    assert any(not np.array_equal(a[k], b[k]) for k in a)
    # and a run without the hook is reproduced exactly (the difference is the hook's)
    again = final(run(_settings(tmp_path, "again")))
    assert all(np.array_equal(a[k], again[k]) for k in a)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_client_app_wrapper_takes_effect(tmp_path, engine):
    calls: list[str] = []

    def wrap(app):
        def wrapped(message, context):
            calls.append(message.metadata.message_type)
            return app(message, context)

        return wrapped

    ENGINES[engine](_settings(tmp_path, engine), wrap_client_app=wrap)
    assert "train" in calls
