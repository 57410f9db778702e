"""``defences = "off"``: one switch for the papers' algorithms as stated, every bound on
hostile updates off; a bound asked for alongside it is refused, not dropped."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from mmfl_flwr.config import BOUNDS, Settings
from mmfl_flwr.flower_app.server_app import strategy_from_settings

SMALL = dict(tasks="synthetic", num_clients=6, num_rounds=1, local_epochs=1)


def test_off_turns_every_bound_off_and_default_keeps_each_setting():
    assert Settings(defences="off").bounds() == dict.fromkeys(BOUNDS, 0.0)
    s = Settings(update_clip_factor=5.0)
    assert s.bounds() == {n: float(getattr(s, n)) for n in BOUNDS}
    # every bound setting of the option table is in BOUNDS (a new bound joins the switch)
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert set(BOUNDS) <= fields
    assert {"update_clip_factor", "reversed_influence_factor", "count_cap"} <= set(BOUNDS)


def test_the_strategy_of_a_run_without_defences_has_no_bound():
    limits = strategy_from_settings(Settings(defences="off", **SMALL)).limits
    for name in BOUNDS:
        assert getattr(limits, name) is None, name
    on = strategy_from_settings(Settings(**SMALL)).limits
    assert on.update_clip_factor == 3.0 and on.reversed_influence_factor == 4.0


@pytest.mark.parametrize(
    ("bound", "value"), [("update_clip_factor", 5.0), ("max_update_norm", 10.0), ("loss_cap", 0.0)]
)
def test_a_bound_asked_for_with_off_is_refused(bound, value):
    with pytest.raises(ValueError, match=rf"defences=off .*{bound.replace('_', '-')}="):
        Settings(defences="off", **{bound: value}).validate()
    Settings(defences="off").validate()  # alone it is fine
    with pytest.raises(ValueError, match="defences"):
        Settings(defences="none").validate()


def test_mmfl_run_applies_it_and_refuses_a_contradiction_in_one_line(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "mmfl_flwr.cli", "run", "--engine", "inprocess"]
    small = ["--tasks", "synthetic", "--num-clients", "6", "--num-rounds", "1"]
    bad = subprocess.run(
        [*cmd, *small, "--defences", "off", "--update-clip-factor", "5", "--output-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    assert not out.exists()
    ok = subprocess.run(
        [*cmd, *small, "--defences", "off", "--output-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["defences"] == "off"
