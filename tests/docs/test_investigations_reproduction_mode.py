"""The investigation scripts' reproduction mode (issue 61): ``coef_sum_mean.py``,
``mifa_seen_share.py``, ``stalevre_dips.py`` and ``group_cstep_quality.py`` take
``--defences`` as the paper scripts do (default ``off``: every bound off), run with it,
and say which mode they ran in (printed header; the C-step CSV's recorded settings)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import _evidence as E  # noqa: E402

from mmfl_flwr.config import BOUNDS, Settings  # noqa: E402

OFF_TEXT = "Defences: off (reproduction mode"
ON_TEXT = "Defences: the project's defaults on"


def _stop_run(monkeypatch: pytest.MonkeyPatch, history: list[dict[str, Any]] | None = None):
    """Replace ``mmfl_flwr.runner.run`` by one that records the ``Settings`` it is given
    and returns ``history`` (no training); returns the list of recorded settings."""
    import mmfl_flwr.runner

    seen: list[Any] = []

    def fake(s: Any, engine: str = "inprocess") -> Any:
        seen.append(s)
        return SimpleNamespace(history=list(history or []))

    monkeypatch.setattr(mmfl_flwr.runner, "run", fake)
    return seen


@pytest.mark.parametrize(
    "script", ["coef_sum_mean", "mifa_seen_share", "stalevre_dips", "group_cstep_quality"]
)
def test_an_investigation_refuses_an_unknown_mode_and_names_the_modes(script, capsys):
    mod = __import__(script)
    with pytest.raises(SystemExit) as exc:
        mod.main(["--defences", "paper"])
    assert exc.value.code == 2
    assert "--defences" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        mod.main(["--help"])
    assert exc.value.code == 0
    assert "--defences {off,default}" in capsys.readouterr().out


@pytest.mark.parametrize("given, mode", [([], "off"), (["--defences", "default"], "default")])
def test_coef_sum_mean_runs_in_the_mode_given_and_prints_it(given, mode, monkeypatch, capsys):
    import coef_sum_mean as C

    history = [{"round": r, "coef_sum": v} for r, v in ((0, ""), (1, 0.9), (1, 1.1), (2, 1.0))]
    seen = _stop_run(monkeypatch, history)
    assert C.main(["--num-rounds", "2", *given]) == 0
    assert len(seen) == 1 and seen[0].defences == mode
    assert all(v == 0 for v in seen[0].bounds().values()) == (mode == "off")
    header = capsys.readouterr().out.splitlines()[0]
    assert (OFF_TEXT if mode == "off" else ON_TEXT) in header


def test_coef_sum_mean_policy_only_draws_the_same_in_either_mode(capsys):
    """No training in --policy-only: the switch is accepted and changes nothing."""
    import coef_sum_mean as C

    outs = []
    for mode in ("off", "default"):
        args = ["--policy-only", "0", "--num-rounds", "3", "--window", "2", "--defences", mode]
        assert C.main(args) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "seed 0:" in outs[0] and "no bound acts" in outs[0]


class _Stop(Exception):
    pass


@pytest.mark.parametrize("given, mode", [([], "off"), (["--defences", "default"], "default")])
def test_mifa_seen_share_runs_in_the_mode_given_and_prints_it(given, mode, monkeypatch, capsys):
    import mifa_seen_share as M

    import mmfl_flwr.runner
    from mmfl_flwr.core import stale

    plain = stale.MIFAAggregator.aggregate
    seen: list[Any] = []

    def fake(s: Any, engine: str = "inprocess") -> Any:
        seen.append(s)
        raise _Stop  # the settings are what is checked: no training

    monkeypatch.setattr(mmfl_flwr.runner, "run", fake)
    with pytest.raises(_Stop):
        M.main(["--seeds", "2", "--rounds", "3", *given])
    assert stale.MIFAAggregator.aggregate is plain  # the recording patch is undone
    assert len(seen) == 1 and seen[0].strategy == "mifa" and seen[0].defences == mode
    assert all(v == 0 for v in seen[0].bounds().values()) == (mode == "off")
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("MIFA") and (OFF_TEXT if mode == "off" else ON_TEXT) in header


@pytest.mark.parametrize("given, mode", [([], "off"), (["--defences", "default"], "default")])
def test_stalevre_dips_runs_in_the_mode_given_and_prints_it(given, mode, monkeypatch, capsys):
    import stalevre_dips as D

    rounds = 3
    history = [
        {"round": rd, "task": t, "accuracy": 0.1 * rd}
        for rd in range(rounds + 1)
        for t in ("digits", "digits_2", "digits_3")
    ]
    seen = _stop_run(monkeypatch, history)
    assert D.main(["--seeds", "4", "--num-rounds", str(rounds), "--after", "0", *given]) == 0
    assert len(seen) == 1 and seen[0].strategy == "stalevre" and seen[0].seed == 4
    assert seen[0].defences == mode
    assert all(v == 0 for v in seen[0].bounds().values()) == (mode == "off")
    lines = capsys.readouterr().out.splitlines()
    assert (OFF_TEXT if mode == "off" else ON_TEXT) in lines[1]  # after the machine line
    # the run function's own default is the reproduction mode too
    assert D.settings(0, 2).defences == "off"


def test_group_cstep_quality_keys_its_runs_by_mode():
    import group_cstep_quality as Q

    off = Q.jobs_for(["consistent"], [0, 1], 6, "off")
    on = Q.jobs_for(["consistent"], [0, 1], 6, "default")
    assert on == [("consistent", 0, 6), ("consistent", 1, 6)]  # earlier caches' keys
    assert off == [(*j, {"defences": "off"}) for j in on]


@pytest.mark.parametrize("given, mode", [([], "off"), (["--defences", "default"], "default")])
def test_group_cstep_quality_runs_in_the_mode_given_and_records_it(
    given, mode, tmp_path, monkeypatch, capsys
):
    """A real two-round run (one C-step): the strategy it runs holds the mode's bounds,
    the CSV's rows record them, check_reproduction classifies the CSV, the header names
    the mode."""
    import group_cstep_quality as Q

    strategies: list[Any] = []
    real = Q.P.quiet_run

    def recording(s: Any, strategy: Any, engine: str) -> Any:
        strategies.append(strategy)
        return real(s, strategy, engine)

    monkeypatch.setattr(Q.P, "quiet_run", recording)
    args = ["--scenarios", "consistent", "--seeds", "0", "--num-rounds", "2", "--workers", "1"]
    assert Q.main([*args, "--out", str(tmp_path), *given]) == 0
    want = Settings(defences=mode).bounds()
    assert len(strategies) == 1
    applied = E.applied_settings(strategies[0], mode)
    assert {b: applied[b] for b in BOUNDS} == want
    with open(tmp_path / "group_cstep_quality.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["defences"] == mode and r["method"] == "group" for r in rows)
    assert all(float(r[b]) == want[b] for r in rows for b in BOUNDS)
    assert all(0 <= float(r["accuracy"]) <= 1 for r in rows)
    found = E.check_file(tmp_path / "group_cstep_quality.csv")
    assert found is not None and found["runs"] == 1
    assert found[E.REPRODUCTION if mode == "off" else E.DEFENDED] == 1
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("MMFL-Group's C-steps"))
    assert (OFF_TEXT if mode == "off" else ON_TEXT) in header
    assert ("(sensitivity)" in header) == (mode == "default")


def test_group_cstep_quality_does_not_reuse_a_cache_of_the_other_mode(tmp_path, capsys):
    """A cache of --defences default runs holds none of the reproduction runs' keys: it is
    refused before anything runs, not silently reused."""
    import json

    import group_cstep_quality as Q

    cache = tmp_path / "runs.jsonl"
    (job,) = Q.jobs_for(["consistent"], [0], 2, "default")
    cache.write_text(json.dumps({"key": E._key(job), "result": [], "machine": "m"}) + "\n")
    out = tmp_path / "out"
    args = ["--scenarios", "consistent", "--seeds", "0", "--num-rounds", "2", "--workers", "1"]
    with pytest.raises(SystemExit) as exc:
        Q.main([*args, "--out", str(out), "--cache", str(cache)])
    assert exc.value.code == 2
    assert "none of its 1 runs belongs to this configuration" in capsys.readouterr().err
    assert not out.exists()
