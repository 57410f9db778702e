"""``mmfl run --verbose`` on Flower's simulation engine (issue 57 item 5): the ServerApp runs
in a process of its own there, so the switch travels as an environment variable
(``MMFL_VERBOSE``) and every defence action's line must come back through the streamed log;
without it the same actions stay off the console (events.csv still holds them).
The in-process engines' side is tests/strategy/test_defence_events.py."""

from __future__ import annotations

import pytest

from mmfl_flwr import runner
from mmfl_flwr.config import Settings
from mmfl_flwr.results import read_events_csv
from mmfl_flwr.strategy import events as E

pytestmark = pytest.mark.slow


def test_verbose_streams_every_defence_action_from_the_simulation_engine(tmp_path, capfd):
    out = tmp_path / "verbose"
    # update-clip-factor 1 clips every update above its model's median: actions in every round
    settings = Settings(
        tasks="digits,synthetic",
        num_clients=4,
        num_rounds=2,
        local_epochs=1,
        update_clip_factor=1.0,
        output_dir=str(out),
    )
    runner.run(settings, engine="simulation", num_cpus=2, verbose=True)
    console = "".join(capfd.readouterr())
    events = read_events_csv(out / "events.csv")
    lines = E.action_lines(events)
    assert lines, "the clip should act on some update"
    missing = [line for line in lines if line not in console]
    assert not missing, f"{len(missing)} of {len(lines)} action lines not on the console"
