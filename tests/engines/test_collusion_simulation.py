"""The collusion check (``collusion-factor``, off by default) on Flower's simulation
engine: the setting travels to the ServerApp in its own process through the run config,
and the check groups the same updates as on the in-process engine, the same seed. The
check's arithmetic is tests/strategy/test_collusion.py's; this is its wiring.

Factor 2 on two synthetic models of 8 clients: in round 1 three of the first model's
four updates lie closer to each other than half the round's median distance, so the
check scales each by 1/3 and names the three (honest clients with alike data: the
reason the check is off by default)."""

from __future__ import annotations

import pytest

from mmfl_flwr import runner
from mmfl_flwr.config import Settings

pytestmark = pytest.mark.slow


def _settings(out) -> Settings:
    return Settings(
        strategy="mfa-rr",
        tasks="synthetic,synthetic",
        synthetic_max_samples=60,
        num_clients=8,
        num_rounds=2,
        local_epochs=2,
        lr=0.05,
        seed=5,
        collusion_factor=2.0,
        output_dir=str(out),
    )


def test_the_collusion_check_acts_alike_on_the_simulation_engine(tmp_path):
    ref = runner.run(_settings(tmp_path / "inprocess"), engine="inprocess")
    sim = runner.run(_settings(tmp_path / "simulation"), engine="simulation", num_cpus=2)

    def acted(result):
        return [(e.round, e.client, e.task, e.kind) for e in result.events]

    grouped = [a for a in acted(sim) if a[3] == "collusion"]
    assert grouped == [(1, c, "synthetic", "collusion") for c in ("1", "2", "3")]
    assert acted(sim) == acted(ref)
    for a, b in zip(sim.events, ref.events):
        assert a.factor == pytest.approx(b.factor, rel=1e-4)
        assert a.reason.split(":")[0] == b.reason.split(":")[0]
