"""The evidence scripts' reproduction mode (issue 61): runs record their defences, and
``benchmarks/check_reproduction.py`` tells a reproduction run from a defended one and
from one that recorded nothing."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import _evidence as E  # noqa: E402

from mmfl_flwr.config import BOUNDS, Settings  # noqa: E402


def _history(settings: dict[str, object]) -> list[dict[str, object]]:
    """Two rounds' rows of one run, with the columns a run records."""
    return [
        {"method": "lvr", "seed": 0, "round": rd, "task": "digits", "accuracy": 0.5, **settings}
        for rd in (0, 1)
    ]


def _write_csv(path: Path, rows: list[dict[str, object]]) -> Path:
    return E.write_long_csv(path, rows)


def test_the_recorded_settings_name_the_switch_and_every_bound():
    off = E.recorded_settings("off", Settings(defences="off").bounds())
    on = E.recorded_settings("default", Settings().bounds())
    assert set(off) == set(on) == {"defences", *BOUNDS}
    assert all(off[b] == 0.0 for b in BOUNDS)
    assert any(on[b] > 0 for b in BOUNDS)
    assert E.run_status(off) == E.REPRODUCTION
    assert E.run_status(on) == E.DEFENDED


def test_with_defences_adds_the_switch_only_for_the_reproduction_mode():
    kw = {"strategy": "lvr", "num_rounds": 3}
    assert E.with_defences(kw, "off") == {**kw, "defences": "off"}
    assert E.with_defences(kw, "default") == kw  # earlier caches keep their keys
    with pytest.raises(ValueError):
        E.with_defences(kw, "paper")


def test_bound_kwargs_turn_every_bound_off_as_mmfl_run_does():
    from mmfl_flwr.strategy import MultiModelStrategy

    off = MultiModelStrategy(**E.bound_kwargs("off"))
    assert E.run_status(E.applied_settings(off, "off")) == E.REPRODUCTION
    plain = MultiModelStrategy()
    assert E.run_status(E.applied_settings(plain, "default")) == E.DEFENDED


@pytest.mark.parametrize(
    "record, status",
    [
        ({}, E.UNKNOWN),  # nothing recorded: never passed
        ({"defences": "off"}, E.UNKNOWN),  # the bounds not recorded
        ({"defences": "", **dict.fromkeys(BOUNDS, 0.0)}, E.UNKNOWN),
        ({"defences": "off", **dict.fromkeys(BOUNDS, "")}, E.UNKNOWN),
        ({"defences": "off", **dict.fromkeys(BOUNDS, 0.0)}, E.REPRODUCTION),
        ({"defences": "off", **dict.fromkeys(BOUNDS, 0.0), "update_clip_factor": 3.0}, E.DEFENDED),
        ({"defences": "default", **dict.fromkeys(BOUNDS, 0.0), "loss_cap": 10.0}, E.DEFENDED),
        # recorded before the collusion check existed (off by default): it ran without it
        (
            {"defences": "off", **dict.fromkeys(set(BOUNDS) - {"collusion_factor"}, 0.0)},
            E.REPRODUCTION,
        ),
        ({"defences": "off", **dict.fromkeys(BOUNDS, 0.0), "collusion_factor": 4.0}, E.DEFENDED),
        # an older bound missing still makes the run unknown
        ({"defences": "off", **dict.fromkeys(set(BOUNDS) - {"loss_cap"}, 0.0)}, E.UNKNOWN),
    ],
)
def test_run_status_of_planted_records(record, status):
    assert E.run_status(record) == status


def test_the_checker_flags_defended_and_unknown_runs_and_passes_reproduction_runs(tmp_path):
    repro = E.recorded_settings("off", Settings(defences="off").bounds())
    defended = E.recorded_settings("default", Settings().bounds())
    good = tmp_path / "good"
    _write_csv(good / "a.csv", _history(repro))
    # a derived table (no accuracy column) holds no runs: left out
    _write_csv(good / "fig.csv", [{"method": "lvr", "seed": 0, "round": 1, "coef_sum": 3.0}])
    cache = good / "runs.jsonl"
    cache.write_text(json.dumps({"key": "k", "result": _history(repro), "machine": "m"}) + "\n")
    assert [r["path"] for r in E.check_reproduction(good)] == [
        str(good / "a.csv"),
        str(cache),
    ]
    assert all(r["reproduction"] == r["runs"] == 1 for r in E.check_reproduction(good))
    cli = [sys.executable, str(BENCH / "check_reproduction.py")]
    ok = subprocess.run([*cli, str(good)], capture_output=True, text=True, cwd=BENCH)
    assert ok.returncode == 0, ok.stdout + ok.stderr

    bad = tmp_path / "bad"
    rows = _history(repro) + [
        {**r, "seed": 1, **defended} for r in _history(repro)
    ]  # seed 1 defended
    _write_csv(bad / "mixed.csv", rows)
    _write_csv(bad / "old.csv", _history({}))  # made before runs recorded settings
    lines = [json.dumps({"key": "a", "result": _history(defended), "machine": "m"})]
    lines.append(json.dumps({"key": "b", "result": _history({}), "machine": "m"}))
    (bad / "runs.jsonl").write_text("\n".join(lines) + "\n")
    found = {Path(r["path"]).name: r for r in E.check_reproduction(bad)}
    assert (found["mixed.csv"]["reproduction"], found["mixed.csv"]["defended"]) == (1, 1)
    assert (found["old.csv"]["unknown"], found["old.csv"]["reproduction"]) == (1, 0)
    assert (found["runs.jsonl"]["defended"], found["runs.jsonl"]["unknown"]) == (1, 1)
    flagged = subprocess.run([*cli, str(bad)], capture_output=True, text=True, cwd=BENCH)
    assert flagged.returncode == 1
    assert "DEFENDED" in flagged.stdout and "UNKNOWN" in flagged.stdout
    # a run whose one row lacks the settings is not a reproduction run
    partial = tmp_path / "partial.csv"
    _write_csv(partial, [_history(repro)[0], _history({})[1]])
    assert E.check_file(partial)["unknown"] == 1
    empty = subprocess.run(
        [*cli, str(tmp_path / "nothing")], capture_output=True, text=True, cwd=BENCH
    )
    assert empty.returncode == 2


def test_a_csv_of_another_mode_is_refused_for_reanalysis(tmp_path):
    repro = E.recorded_settings("off", Settings(defences="off").bounds())
    defended = E.recorded_settings("default", Settings().bounds())
    p = E.Parser(prog="x")
    assert E.check_defences(p, "a.csv", _history(repro), "off") == E.REPRODUCTION
    assert E.check_defences(p, "a.csv", _history({}), "off") == E.UNKNOWN
    assert E.check_defences(p, "a.csv", _history(defended), "default") == E.DEFENDED
    with pytest.raises(SystemExit):
        E.check_defences(p, "a.csv", _history(defended), "off")
    with pytest.raises(SystemExit):
        E.check_defences(p, "a.csv", _history(repro) + _history(defended), "default")


def test_the_sections_say_which_mode_their_runs_used():
    assert "off" in E.defences_text(E.REPRODUCTION)
    assert "sensitivity" in E.defences_text(E.DEFENDED)
    assert "not a reproduction" in E.defences_text(E.UNKNOWN)
    assert E.defences_heading(E.REPRODUCTION) == ""
    assert "sensitivity" in E.defences_heading(E.DEFENDED)


def test_a_published_section_that_says_reproduction_mode_is_one_by_its_runs():
    """Issue 61: every published section whose fragment says ``Defences: off`` has a run
    CSV beside it whose every run the checker finds to be a reproduction run (the
    recorded switch and every bound off); the sections not yet rerun say "not recorded"
    and RESULTS.md's header lists them. At least the sections rerun so far (papers 002
    and 004) are checked."""
    import re

    results = E.REPO / "docs" / "results"
    checked = []
    for fragment in sorted(results.rglob("*.md")):
        text = fragment.read_text()
        if not re.search(r"(?m)^(?:- )?Defences: off\b", text):
            continue
        csv_path = fragment.with_suffix(".csv")
        assert csv_path.is_file(), f"{fragment}: no run CSV beside it"
        found = E.check_file(csv_path)
        assert found is not None and found["runs"] > 0, csv_path
        assert found["reproduction"] == found["runs"], found
        checked.append(fragment.name)
    assert {"paper002_gain.md", "paper004_ucb.md"} <= set(checked)


@pytest.mark.slow
def test_a_table1_run_records_its_mode_in_its_csv(tmp_path):
    """The smallest Table 1 run in the reproduction mode (the default) writes a CSV the
    checker passes; with ``--defences default`` the checker flags it and the section's
    heading says it is a sensitivity row."""
    import paper003_table1 as T

    args = ["--smoke", "--methods", "full,lvr", "--seeds", "0,1"]
    for defences, status in (("off", "ok"), ("default", "DEFENDED")):
        out = tmp_path / defences
        argv = [*args, "--out", str(out)]
        if defences == "default":
            argv += ["--defences", "default"]
        assert T.main(argv) == 0
        with open(out / "paper003_table1.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert {r["defences"] for r in rows} == {defences}
        res = E.check_file(out / "paper003_table1.csv")
        assert res is not None
        assert (res["reproduction"] == res["runs"] == 4) is (status == "ok")
        heading = (out / "paper003_table1.md").read_text().splitlines()[0]
        assert ("sensitivity" in heading) is (defences == "default")


#: The published sections (benchmarks/reproduce.py's EXPERIMENTS, and the investigations'
#: sections RESULTS.md assembles after them, its EXTRA_FRAGMENTS) whose runs are not yet
#: reproduction runs: made with the project's defences of their day before runs recorded
#: their settings, waiting for their rerun (issue 61). A rerun section leaves this set;
#: none may join it. RESULTS.md's header lists the same sections as not yet rerun.
NOT_YET_RERUN: set[str] = set()


def test_no_published_section_ran_with_a_defence_but_those_waiting_for_their_rerun():
    """Issue 61: the runs of every published section (its run CSV) are all reproduction
    runs (the switch and every bound recorded at 0), except the sections listed in
    NOT_YET_RERUN, whose runs must then be all made before the settings were recorded
    (unknown, never defended): a section rerun with a defence on, or a rerun one falling
    back, fails; so does a section rerun in the reproduction mode while still listed."""
    sys.path.insert(0, str(E.REPO / "benchmarks"))
    import reproduce

    results = E.REPO / "docs" / "results"
    pending = set()
    sections = [name for _, fragments in reproduce.EXPERIMENTS for name in fragments]
    sections += [name for extra in reproduce.EXTRA_FRAGMENTS.values() for name in extra]
    for name in sections:
        found = E.check_file(results / f"{name}.csv")
        assert found is not None and found["runs"] > 0, name
        assert found["defended"] == 0, found
        if found["reproduction"] != found["runs"]:
            assert found["unknown"] == found["runs"], found
            pending.add(name)
    assert pending == NOT_YET_RERUN
