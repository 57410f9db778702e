"""``mmfl run`` flags: only the flags given on the command line override a
``--config`` file, whatever their value (issue 11, defect 5); ``--aggregator``
is taken exactly by the presets that can use it and refused at validation by
the others (defect 6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mmfl_flwr import cli
from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app.server_app import strategy_from_settings
from mmfl_flwr.presets import AGGREGATORS, PRESETS

ROOT = Path(__file__).resolve().parents[2]
PAPER002 = ROOT / "configs" / "paper002-synthetic.toml"


class _NoResult:
    """What the fake runner returns: a finished run without rows."""

    def final(self) -> dict[str, Any]:
        return {}


@pytest.fixture
def ran(monkeypatch) -> list[Settings]:
    """Replace the runner: record the settings ``mmfl run`` would run."""
    seen: list[Settings] = []

    def fake_run(settings: Settings, **kwargs: Any) -> _NoResult:
        seen.append(settings)
        return _NoResult()

    monkeypatch.setattr(cli, "run", fake_run)
    return seen


def test_flags_equal_to_their_default_still_override_the_config_file(ran, tmp_path):
    defaults = Settings()
    flags = {"num_rounds": 20, "num_clients": 20, "lr": 0.1, "local_epochs": 5, "batch_size": 16}
    assert all(getattr(defaults, k) == v for k, v in flags.items())  # default values
    argv = [
        "run",
        "--engine",
        "inprocess",
        "--config",
        str(PAPER002),
        "--output-dir",
        str(tmp_path / "out"),
    ]
    for name, value in flags.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    assert cli.main(argv) == 0
    (s,) = ran
    for name, value in flags.items():
        assert getattr(s, name) == value, name  # the file says 70, 100, 0.05, 1, 10
    # what no flag names still comes from the file
    assert s.tasks == "synthetic,synthetic-b" and s.strategy == "mfa-rr"


def test_without_flags_the_config_file_wins_over_the_defaults(ran, tmp_path):
    assert (
        cli.main(
            [
                "run",
                "--engine",
                "inprocess",
                "--config",
                str(PAPER002),
                "--num-clients",
                "5",
                "--output-dir",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    (s,) = ran
    assert (s.num_rounds, s.lr, s.local_epochs, s.batch_size) == (70, 0.05, 1, 10)


#: The presets whose aggregator is part of the algorithm.
OWN_AGGREGATOR = {"stalevr", "stalevre", "fedvarp", "fedstale", "mifa", "scaffold"}


@pytest.mark.parametrize("aggregator", sorted(AGGREGATORS))
@pytest.mark.parametrize("preset", list(PRESETS))
def test_aggregator_is_applied_or_refused_at_validation(preset, aggregator):
    """Validation passes exactly when the strategy can be built with the
    aggregator, and then the strategy uses it."""
    s = Settings(strategy=preset, aggregator=aggregator, clients_per_round=2)
    try:
        strategy = strategy_from_settings(s)
    except (TypeError, ValueError):
        strategy = None
    if strategy is None:
        with pytest.raises(ValueError) as err:
            s.validate()
        msg = str(err.value)
        assert "\n" not in msg and f"'{preset}'" in msg
        if preset in OWN_AGGREGATOR:
            assert f"aggregator='{aggregator}' cannot be used" in msg
        return
    assert preset not in OWN_AGGREGATOR
    s.validate()
    assert type(strategy.aggregator) is AGGREGATORS[aggregator]


@pytest.mark.parametrize("preset", sorted(OWN_AGGREGATOR))
def test_cli_refuses_aggregator_for_a_preset_without_one(preset, ran, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        cli.main(
            [
                "run",
                "--engine",
                "inprocess",
                "--strategy",
                preset,
                "--aggregator",
                "fedavg",
                "--output-dir",
                str(out),
            ]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and preset in err and "aggregator" in err
    assert not ran and not out.exists()
