"""Every script in benchmarks/ answers ``--help`` and refuses an unknown flag in one
line with exit code 2 (no traceback): a script that breaks before parsing its
arguments breaks every command that names it (``reproduce.py --full`` among them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=BENCH,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _refused(proc: subprocess.CompletedProcess[str]) -> str:
    """Assert ``proc`` was refused (exit code 2, no traceback); its last stderr line."""
    assert proc.returncode == 2, (proc.stdout[-1000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    return (proc.stderr.strip().splitlines() or [""])[-1]


def test_the_benchmarks_folder_has_scripts() -> None:
    assert len(SCRIPTS) >= 20, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_answers_help_and_refuses_an_unknown_flag(script: str) -> None:
    helped = _run(script, "--help")
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "usage:" in helped.stdout
    refused = _run(script, "--no-such-flag")
    last = _refused(refused)
    assert "error:" in last and "--no-such-flag" in last, refused.stderr[-2000:]


# An empty or zero override used to fall back silently to the mode's value (the
# default was the same empty string or 0): the user's value is now applied or refused.
EMPTY_OVERRIDES = [
    ("paper003_table1.py", "--seeds", ""),
    ("paper003_table1.py", "--num-rounds", "0"),
    ("paper003_table1.py", "--lengths", ""),
    ("paper003_table1.py", "--num-clients", "0"),
    ("paper003_table1.py", "--methods", ""),
    ("paper001_group.py", "--seeds", ""),
    ("paper001_group.py", "--num-rounds", "0"),
    ("paper003_fig5.py", "--seeds", ""),
    ("paper003_fig5.py", "--num-rounds", "0"),
    ("paper003_fig5.py", "--methods", ""),
    ("paper004_ucb.py", "--seeds", ""),
    ("paper004_ucb.py", "--datasets", ""),
]


@pytest.mark.parametrize("script,flag,value", EMPTY_OVERRIDES)
def test_an_empty_or_zero_override_is_refused(
    script: str, flag: str, value: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = _run(script, "--smoke", "--out", str(out), flag, value)
    last = _refused(proc)
    assert "error:" in last and flag in last, proc.stderr[-2000:]
    assert not out.exists() or not any(out.iterdir())


# The comparison scripts parsed their lists with int() (a traceback on "--seeds a")
# and took any count.
UNPARSED = [
    ("compare_strategies.py", "--seeds", "0,x"),
    ("compare_strategies.py", "--num-rounds", "0"),
    ("fig5_staleness.py", "--seeds", ""),
    ("fig5_staleness.py", "--num-clients", "0"),
    ("group_compare.py", "--seeds", "1-"),
    ("group_compare.py", "--local-epochs", "0"),
    ("ucb_compare.py", "--ks", "2,b"),
    ("ucb_compare.py", "--seeds", "0,0"),
    ("ucb_compare.py", "--workers", "0"),
]


@pytest.mark.parametrize("script,flag,value", UNPARSED)
def test_a_comparison_script_refuses_a_value_that_does_not_parse(
    script: str, flag: str, value: str
) -> None:
    proc = _run(script, flag, value)
    last = _refused(proc)
    assert "error:" in last and flag in last, proc.stderr[-2000:]


def test_group_cstep_quality_refuses_a_cache_of_another_configuration(tmp_path: Path) -> None:
    """Its --cache is checked against its runs before anything runs (as the paper
    scripts' are), not silently ignored."""
    other = tmp_path / "other.jsonl"
    other.write_text(
        '{"key": "[\\"x\\", 0, {}, \\"vectorized\\"]", "result": [], "machine": "m"}\n'
    )
    out = tmp_path / "out"
    proc = _run(
        "group_cstep_quality.py",
        "--scenarios",
        "consistent",
        "--seeds",
        "0",
        "--num-rounds",
        "2",
        "--workers",
        "1",
        "--cache",
        str(other),
        "--out",
        str(out),
    )
    _refused(proc)
    assert "none of its 1 runs belongs to this configuration" in proc.stderr
    assert not out.exists()


# Values that parse but that the runs refuse or misread: before, a traceback after
# the first run started (lr, budget, tasks, a seed past numpy's 32 bits), a silent
# fallback to the mode's value (a negative or NaN budget), or a section written for a
# configuration the script does not model (Fig. 5 with two models, an odd K).
BAD_VALUES = [
    ("paper003_table1.py", "--lr", "nan"),
    ("paper003_table1.py", "--lr", "-1"),
    ("paper003_table1.py", "--budget-fraction", "2"),
    ("paper003_table1.py", "--budget-fraction", "-0.5"),
    ("paper003_table1.py", "--budget-fraction", "nan"),
    ("paper003_table1.py", "--tasks", "bogus"),
    ("paper003_table1.py", "--tasks", ""),
    ("paper003_table1.py", "--seeds", "99999999999999999999999"),
    ("paper001_group.py", "--seeds", "4294967296"),
    ("paper003_fig5.py", "--lr", "nan"),
    ("paper003_fig5.py", "--tasks", "bogus"),
    ("paper003_fig5.py", "--tasks", "digits,digits"),
    ("paper004_ucb.py", "--ks", "3"),
]


@pytest.mark.parametrize("script,flag,value", BAD_VALUES)
def test_a_value_the_runs_would_refuse_is_refused_first(
    script: str, flag: str, value: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = _run(script, "--smoke", "--out", str(out), f"{flag}={value}")
    _refused(proc)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert flag.lstrip("-") in proc.stderr, proc.stderr  # names what it refuses
    assert not out.exists() or not any(out.iterdir())


def test_the_false_positive_summary_counts_rows_against_the_targets():
    """Three rows: 1% touched and equivalent; 3% with an interval above 0; 2.5%
    not shown equivalent: two over 2% (the highest 3%), one interval excluding
    0, two not shown equivalent. Of the two over 2%, b's 30 touched of 1000 less its
    20 clipped leave 1.0%, c's 25 of 1000 less 2 clipped leave 2.3% (by hand): in these
    runs at least c has more than 2% touched by a bound other than the clip."""
    sys.path.insert(0, str(BENCH))
    import honest_false_positives as FP

    def row(pr, fraction, lo, hi, verdict, clipped):
        return {
            "preset": pr,
            "profile": "uniform",
            "touched": round(fraction * 1000),
            "received": 1000,
            "fraction": fraction,
            "by_kind": {"clipped": clipped, "reversed": 3},
            "difference": {"lo": lo, "hi": hi},
            "equivalence": {"verdict": verdict},
        }

    rows = [
        row("a", 0.01, -0.01, 0.01, "equivalent", 1),
        row("b", 0.03, 0.001, 0.02, "not shown equivalent", 20),
        row("c", 0.025, -0.03, 0.02, "not shown equivalent", 2),
    ]
    counts, text = FP.summary(rows, 0.02)
    assert counts["over_target"] == 2 and counts["interval_excludes_0"] == 1
    assert counts["not_shown_equivalent"] == 2 and counts["rows"] == 3
    assert counts["highest"] == {"preset": "b", "profile": "uniform", "fraction": 0.03}
    assert counts["over_target_without_clip"] == [
        {"preset": "c", "profile": "uniform", "at_least": 0.023}
    ]
    assert text == (
        "Against the targets: 2 of 3 rows have more than 2% of their honest updates "
        "touched (the highest: b on uniform, 3.000%); 1 of 3 paired intervals exclude 0; "
        "2 of 3 rows are not shown equivalent within +-0.02. In these runs at least 1 of "
        "the 2 have more than 2% of their honest updates touched by a bound other than the "
        "norm clip (c on uniform, at least 2.300%: a row's touched updates less its clipped "
        "ones)."
    )


def test_runs_cached_before_placement_was_recorded_get_one_line_not_an_empty_table():
    """A page made only from runs cached before each action's model was recorded says so
    in one line (it printed an empty table and "Clipped updates: 0")."""
    sys.path.insert(0, str(BENCH))
    import honest_false_positives as FP

    runs = [{"preset": "mfa-rr", "profile": "uniform", "touched": 2, "by_kind": {"clipped": 2}}]
    placed, lines = FP.placement(runs * 3, {("mfa-rr", "uniform")})
    assert lines == [
        "Where the bounds acted is not recorded in these runs (all 3 were cached before it was)."
    ]
    assert placed["clipped"] is None


def test_the_false_positive_page_says_where_the_bounds_acted():
    """Hand-made events: per model and kind, over every run and over the rows above the
    target; a clipped client's examples against its model's median count (by hand:
    synthetic's counts 5, 10, 40 have median 10, so client c with 40 holds 4 times it,
    client a with 5 half of it)."""
    from types import SimpleNamespace as Ev

    import honest_false_positives as FP

    sizes = {"a": {"synthetic": 5, "digits": 7}, "b": {"synthetic": 10}, "c": {"synthetic": 40}}
    events = [
        Ev(task="synthetic", kind="clipped", client="c"),
        Ev(task="synthetic", kind="clipped", client="a"),
        Ev(task="synthetic", kind="reversed", client="b"),
        Ev(task="digits", kind="direction", client="a"),
    ]
    got = FP.where(events, sizes)
    assert got["by_task"] == {
        "synthetic": {"clipped": 2, "reversed": 1},
        "digits": {"direction": 1},
    }
    assert got["clipped_sizes"] == [4.0, 0.5]
    runs = [
        {"preset": "x", "profile": "paper003", **got},
        {"preset": "y", "profile": "uniform", **got},
        {"preset": "z", "profile": "uniform", "by_kind": {}},  # cached before it was recorded
    ]
    placed, lines = FP.placement(runs, {("x", "paper003")})
    assert placed["by_task"]["synthetic"]["clipped"] == [4, 2]
    assert placed["by_task"]["digits"] == {"direction": [2, 1]}
    assert placed["clipped"] == 4 and placed["clipped_high_data"] == 2
    # columns clipped, direction, reversed; synthetic has no direction event
    assert "| synthetic | 4 (2) | 0 (0) | 2 (1) |" in lines
    assert "| digits | 0 (0) | 2 (1) | 0 (0) |" in lines
    assert any("0.5 to 4 times" in line and "median 2.25" in line for line in lines)
    assert lines[-1] == "(1 runs were cached before this was recorded.)"


def test_the_false_positive_benchmark_runs_the_bounds_it_is_given(monkeypatch):
    """``--defences loose``: the runs set against every bound off get loose's settings
    (update clip 5, reversed-update bound 8), the runs with every bound off get
    ``defences="off"``, and the cache keeps the two apart from the defaults' runs (a run
    recorded before the option existed ran with the defaults)."""
    sys.path.insert(0, str(BENCH))
    import honest_false_positives as FP

    import mmfl_flwr.runner as R

    seen = []

    class Result:
        events: list = []
        received: dict = {}

        def final(self):
            return {"digits": {"accuracy": 0.5}}

    def fake(settings, client_hook=None):
        seen.append(settings)
        return Result()

    monkeypatch.setattr(R, "run_inprocess", fake)
    on = FP._run(("mfa-rr", "uniform", 0, True, 6, 2, 1, "loose"))
    off = FP._run(("mfa-rr", "uniform", 0, False, 6, 2, 1, "loose"))
    plain = FP._run(("mfa-rr", "uniform", 0, True, 6, 2, 1, "default"))
    assert (seen[0].update_clip_factor, seen[0].reversed_influence_factor) == (5.0, 8.0)
    assert seen[0].defences == "default" and seen[1].defences == "off"
    assert (seen[2].update_clip_factor, seen[2].reversed_influence_factor) == (3.0, 4.0)
    assert FP._key(on) == ("mfa-rr", "uniform", 0, "loose")
    assert FP._key(off) == ("mfa-rr", "uniform", 0, "off")
    assert FP._key(plain) == ("mfa-rr", "uniform", 0, "default")
    older = {k: v for k, v in on.items() if k != "defence"}  # recorded before --defences
    assert FP._key(older) == ("mfa-rr", "uniform", 0, "default")


@pytest.mark.parametrize("name", ["median", "off", "bogus"])
def test_the_false_positive_benchmark_refuses_a_configuration_it_cannot_run(name):
    """An aggregator configuration (median) does not apply to every preset, "off" is
    the side every row is set against, an unknown name is unknown: each refused in one
    line, exit 2, before any run."""
    line = _refused(_run("honest_false_positives.py", "--defences", name, "--seeds", "0,1"))
    assert "--defences takes one configuration of" in line and f"'{name}'" in line


def test_the_false_positive_page_reads_the_runs_of_its_configuration(tmp_path, capsys):
    """One cache holding, for one preset and profile and two seeds, runs with the defaults
    (recorded before --defences existed: no ``defence``, no ``bounds``), with ``loose``
    and with every bound off, each configuration with its own touched count: the page
    of each configuration reads its own runs and the off ones (nothing to run), and its
    JSON holds exactly those. A ``loose`` run made with other settings than loose's
    today is not reused."""
    import json

    sys.path.insert(0, str(BENCH))
    import honest_false_positives as FP

    def rec(seed, on, touched, **extra):
        return {
            "preset": "mfa-rr", "profile": "uniform", "seed": seed, "defaults": on,
            "accuracy": {"digits": 0.5 + touched / 100}, "touched": touched,
            "received": 100, "by_kind": {"clipped": touched} if touched else {},
            "shape": [20, 10, 2], **extra,
        }  # fmt: skip

    loose = dict(FP.DEFENCES["loose"])
    runs = [
        r
        for s in (0, 1)
        for r in (
            rec(s, True, 3),
            rec(s, True, 1, defence="loose", bounds=loose),
            rec(s, False, 0),
        )
    ]
    cache = tmp_path / "runs.jsonl"
    cache.write_text("".join(json.dumps(r) + "\n" for r in runs))
    args = ["--presets", "mfa-rr", "--profiles", "uniform", "--seeds", "0,1", "--cache", str(cache)]
    for name, touched, header in (("loose", 1, "loose - off"), ("default", 3, "defaults - off")):
        out = tmp_path / f"{name}.json"
        assert FP.main([*args, "--defences", name, "--json", str(out)]) == 0
        printed = capsys.readouterr().out
        assert printed.startswith("4 runs, 0 to do") and f"| {header} [95% CI]" in printed
        page = json.loads(out.read_text())
        assert page["rows"][0]["touched"] == 2 * touched and page["defence"] == name
        assert sorted((r["seed"], r["touched"]) for r in page["runs"]) == [
            (0, 0), (0, touched), (1, 0), (1, touched),
        ]  # fmt: skip
    retuned = rec(0, True, 1, defence="loose", bounds={**loose, "update_clip_factor": 9.0})
    assert FP._reusable(runs[1]) and FP._reusable(runs[0]) and FP._reusable(runs[2])
    assert not FP._reusable(retuned)
    assert not FP._reusable({**runs[1], "bounds": {}})  # loose's name, the defaults' settings


@pytest.mark.slow
def test_the_false_positive_benchmark_counts_touched_updates(tmp_path):
    """honest_false_positives.py at its smallest: MMFL-Group gets one clustered row (not
    one per unclustered profile), every row's touched count is within what was received,
    and the JSON rows agree with the runs."""
    import json

    out = tmp_path / "fp.json"
    done = _run(
        "honest_false_positives.py",
        "--presets", "mfa-rr,group", "--profiles", "uniform,paper003", "--seeds", "0,1",
        "--num-clients", "6", "--num-rounds", "2", "--local-epochs", "1", "--workers", "1",
        "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["preset"], r["profile"]) for r in rows] == [
        ("mfa-rr", "uniform"),
        ("mfa-rr", "paper003"),
        ("group", "clusters-consistent"),
    ]
    runs = json.loads(out.read_text())["runs"]
    for r in rows:
        mine = [x for x in runs if (x["preset"], x["profile"]) == (r["preset"], r["profile"])]
        on = [x for x in mine if x["defaults"]]
        assert len(on) == 2 and len(mine) == 4
        assert r["touched"] == sum(x["touched"] for x in on) <= r["received"]
        assert all(not x["by_kind"] for x in mine if not x["defaults"])  # off: no event


def test_a_field_run_made_with_other_settings_than_its_configurations_is_run_again():
    """A cached field run is reused while the settings it recorded are still its
    configuration's; one recorded with loose's name and other numbers is not, nor one of a
    configuration no longer defined; a run recorded before settings were recorded is kept."""
    sys.path.insert(0, str(BENCH))
    import hostile_clients as HC

    run = {"preset": "mfa-rr", "defence": "loose", "attack": "x50", "seed": 0}
    assert HC.reusable({**run, "bounds": dict(HC.DEFENCES["loose"])})
    assert not HC.reusable({**run, "bounds": {**HC.DEFENCES["loose"], "update_clip_factor": 9.0}})
    assert not HC.reusable({**run, "defence": "gone", "bounds": {}})
    assert HC.reusable(run)
    # centered clipping keeps the preset's weights: LVR's runs record the unbiased variant
    lvr = {**run, "preset": "lvr", "defence": "centered-clip"}
    assert HC.reusable({**lvr, "bounds": {"aggregator": "unbiased-centered-clip"}})
    assert not HC.reusable({**lvr, "bounds": {"aggregator": "centered-clip"}})


def test_the_field_states_its_rows_against_the_targets():
    """Hand-made rows: a single flipper whose others' drop (0.06) exceeds the
    absent run's upper bound (0.03) + 0.02 by 0.01 while its server drop (0.07)
    is within 0.03 + 0.05; IPM by three dropping 0.2 / 0.1 under the defaults and
    0.12 / 0.05 under the median: the median keeps every model within 0.15."""
    sys.path.insert(0, str(BENCH))
    import hostile_clients as HC

    def ci(mean, hi=None):
        return {"mean": mean, "lo": mean - 0.1, "hi": mean if hi is None else hi}

    def row(attack, defence, model, drop, others=None):
        return {
            "preset": "mfa-rr",
            "defence": defence,
            "attack": attack,
            "model": model,
            "drop": ci(drop),
            "absent_drop": ci(0.0, 0.03),
            "others_drop": None if others is None else ci(others),
            "absent_others_drop": ci(0.0, 0.03),
        }

    rows = [
        row("absent", "default", "digits", 0.0, 0.0),
        row("flip1", "default", "digits", 0.07, 0.06),
        row("ipm2-f3", "default", "digits", 0.2),
        row("ipm2-f3", "default", "synthetic", 0.1),
        row("ipm2-f3", "median", "digits", 0.12),
        row("ipm2-f3", "median", "synthetic", 0.05),
    ]
    counts, lines = HC.target_lines(rows)
    assert counts == {
        "single_others": {"met": 0, "of": 1},
        "single_server": {"met": 1, "of": 1},
        "coalitions": {"met": 1, "of": 1},
    }
    assert "| mfa-rr | default | flip1 | digits | others | +0.060 | +0.050 | +0.010 |" in lines
    assert "| mfa-rr | ipm2-f3 | median | +0.120 | - |" in lines


def test_the_coalitions_absence_is_a_reference_not_an_attack():
    """Hand-made rows: IPM by three drops 0.2 / 0.17 under the defaults and 0.16 /
    0.12 under the median; the coalition simply failing every round (``absent3``)
    drops 0.13 / 0.04 under the median, 0.02 / 0.01 under the defaults. The absence
    is no coalition pair (one pair, not met: 0.16 > 0.15) and is shown beside the
    best defence's worst drop, the same defence's: 0.13."""
    sys.path.insert(0, str(BENCH))
    import hostile_clients as HC

    def row(attack, defence, model, drop):
        ci = {"mean": drop, "lo": drop - 0.1, "hi": drop + 0.1}
        return {
            "preset": "lvr",
            "defence": defence,
            "attack": attack,
            "model": model,
            "drop": ci,
            "absent_drop": ci,
            "others_drop": None,
            "absent_others_drop": None,
        }

    rows = [
        row("ipm2-f3", "default", "digits", 0.2),
        row("ipm2-f3", "default", "synthetic", 0.17),
        row("ipm2-f3", "median", "digits", 0.16),
        row("ipm2-f3", "median", "synthetic", 0.12),
        row("absent3", "median", "digits", 0.13),
        row("absent3", "median", "synthetic", 0.04),
        row("absent3", "default", "digits", 0.02),
        row("absent3", "default", "synthetic", 0.01),
    ]
    counts, lines = HC.target_lines(rows)
    assert counts["coalitions"] == {"met": 0, "of": 1}
    assert counts["single_others"]["of"] == counts["single_server"]["of"] == 0
    assert "| lvr | ipm2-f3 | median | +0.160 | +0.010 | +0.130 |" in lines
    assert HC._attackers("absent3") == set(HC.COLLUDERS)
    assert "absent3" in HC.REFERENCES and "absent3" not in HC.FIELD  # not in the default set
