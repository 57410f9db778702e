"""``mmfl run --help`` explains every option with its allowed values, and those
values are the ones ``Settings.validate`` enforces (issue "Native to Flower for
real users", item 7).

The help is read as a user reads it: the output of ``python -m mmfl_flwr.cli run
--help`` (one line per option: ``COLUMNS`` is set wide). Each setting's text is
``<what it does>. Allowed: <values>. Default: <default>.[ Strategies: <presets>.]``;
the allowed values are parsed back (a choice list, an interval, a bound, ``0
(off) or`` a bound) and probed against ``validate()``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mmfl_flwr.cli import SETTING_NAMES, build_parser
from mmfl_flwr.config import Settings, options
from mmfl_flwr.presets import AGGREGATORS, PRESETS, presets_taking
from mmfl_flwr.tasks.kinds import KINDS

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {f.name: f for f in dataclasses.fields(Settings) if f.name != "extra"}
SETTING_HELP = re.compile(
    r"^(?P<what>.+?)\. Allowed: (?P<allowed>.+?)\. Default: (?P<default>.*?)\."
    r"(?: Strategies: (?P<users>.+)\.)?$"
)


@pytest.fixture(scope="module")
def help_text() -> str:
    env = {**os.environ, "COLUMNS": "100000"}  # no wrapping: one line per option
    proc = subprocess.run(
        [sys.executable, "-m", "mmfl_flwr.cli", "run", "--help"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def option_help(help_text: str) -> dict[str, str]:
    """Long flag -> its help text, from the options section of ``--help``."""
    section = help_text.split("\noptions:\n", 1)[1]
    out: dict[str, str] = {}
    flag = None
    for line in section.splitlines():
        if re.match(r"^  -", line):  # "  --flag METAVAR  help" (help maybe on the next line)
            invocation, *rest = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            names = re.findall(r"--?[\w-]+", invocation.split(" {")[0])
            flag = next((n for n in names if n.startswith("--")), names[0])
            out[flag] = rest[0] if rest else ""
        elif line and not line[0].isspace():  # an argument group's title ends the option
            flag = None
        elif flag is not None and line.strip():
            out[flag] = (out[flag] + " " + line.strip()).strip()
    return out


def setting_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parsed(option_help: dict[str, str], name: str) -> dict[str, str]:
    text = option_help[setting_flag(name)]
    m = SETTING_HELP.match(text)
    assert m, f"{setting_flag(name)}: help not in the form 'what. Allowed: .. Default: ..': {text}"
    return {k: (v or "") for k, v in m.groupdict().items()}


def choice_list(allowed: str) -> tuple[list[str], bool]:
    """The values of an ``Allowed:`` choice text and whether ``""`` is allowed."""
    empty = allowed.startswith('"" (')
    m = re.search(r"one of (.+)$", allowed)
    assert m, allowed
    return [v.strip() for v in m.group(1).split(",")], empty


def runs_with(name: str, value: Any, **more: Any) -> Settings:
    """Settings with ``name = value``, under a preset that uses the setting."""
    users = presets_taking(name)
    kw: dict[str, Any] = {name: value, **more}
    if users and "strategy" not in kw:
        kw["strategy"] = users[0]
    return Settings(**kw)


def accepted(s: Settings) -> bool:
    try:
        s.validate()
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------ every option


def test_every_option_of_mmfl_run_has_help(option_help):
    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    flags = [a.option_strings[-1] for a in run._actions if a.option_strings]
    assert set(flags) <= set(option_help), set(flags) - set(option_help)
    for action in run._actions:
        assert action.help and action.help.strip(), action.option_strings
    for flag in flags:
        assert len(option_help[flag]) > 10, f"{flag}: no explanation in --help"


def test_every_setting_has_a_flag_with_what_allowed_and_default(option_help):
    assert set(SETTING_NAMES) == set(options())
    defaults = Settings()
    for name in SETTING_NAMES:
        p = parsed(option_help, name)
        assert len(p["what"]) > 10 and p["allowed"], name
        default = getattr(defaults, name)
        shown = ("on" if default else "off") if isinstance(default, bool) else repr(default)
        assert p["default"] == shown, name
        assert p["allowed"] == options()[name].allowed(), name
        users = [u.strip() for u in p["users"].split(",")] if p["users"] else []
        assert users == presets_taking(name), name


def test_tasks_help_names_every_task_kind(option_help):
    allowed = parsed(option_help, "tasks")["allowed"]
    assert allowed.startswith("comma-separated, each one of ")
    kinds, _ = choice_list(allowed)
    assert sorted(kinds) == sorted(KINDS)
    assert len(KINDS) >= 17


def test_strategy_help_lists_every_preset(option_help):
    presets, empty = choice_list(parsed(option_help, "strategy")["allowed"])
    assert presets == list(PRESETS) and not empty


def test_aggregator_help_lists_every_aggregator_and_the_empty_value(option_help):
    aggregators, empty = choice_list(parsed(option_help, "aggregator")["allowed"])
    assert aggregators == list(AGGREGATORS) and empty


# ----------------------------------------- the help's values are validate()'s


CHOICE_SETTINGS = [n for n, o in options().items() if o.choices is not None]


def test_the_choice_settings_are_found():
    """The settings with a choice list, read from the option table (a new one joins
    the next test by itself); the ones every run has are among them."""
    assert {"strategy", "aggregator", "tasks", "profile", "defences"} <= set(CHOICE_SETTINGS)
    for name in CHOICE_SETTINGS:
        assert options()[name].allowed().startswith(("one of", '""', "comma-separated"))


@pytest.mark.parametrize("name", CHOICE_SETTINGS)
def test_every_listed_choice_is_accepted_and_no_other(option_help, name):
    values, empty = choice_list(parsed(option_help, name)["allowed"])
    assert values, name
    for value in values:
        s = runs_with(name, value)
        if name == "aggregator" and value not in ("fedavg", "mean"):
            s.strategy = "full"  # a preset that takes every aggregator
        if name == "dp":
            s.dp_sampled_clients = 11  # required with dp (> 10 z for adaptive clipping)
        s.validate()  # raises if the help lists a value that validate refuses
    if empty:
        runs_with(name, "").validate()
    else:
        assert not accepted(runs_with(name, ""))
    for bad in ("nope", values[0] + "x", values[0].upper() + "!"):
        assert not accepted(runs_with(name, bad)), (name, bad)


def test_a_listed_task_kind_combination_is_accepted_and_an_unlisted_one_refused(option_help):
    kinds, _ = choice_list(parsed(option_help, "tasks")["allowed"])
    Settings(tasks=",".join(kinds)).validate()
    with pytest.raises(ValueError, match="unknown task kind"):
        Settings(tasks="digits,nope").validate()


_RANGE = re.compile(
    r"^(?:0 \((?P<off>[^)]+)\) or )?(?:(?P<finite>a finite number) )?"
    r"(?:in (?P<lb>[\[(])(?P<lo>[^,]+), (?P<hi>[^\]) ]+)(?P<rb>[\])])"
    r"|(?P<op>>=|>|<=|<) (?P<bound>\S+))(?: \(0 = [^)]+\))?$"
)


def interval(allowed: str, s: Settings):
    """The predicate that an ``Allowed:`` range text states (bounds that name
    another setting read from ``s``)."""
    m = _RANGE.match(allowed)
    assert m, f"not a range: {allowed!r}"

    def num(text: str) -> float:
        return float(getattr(s, text.replace("-", "_"))) if text[0].isalpha() else float(text)

    def pred(v: float) -> bool:
        if m["off"] and v == 0:
            return True
        if m["finite"] and not math.isfinite(v):
            return False
        if m["op"]:
            b = num(m["bound"])
            return {">=": v >= b, ">": v > b, "<=": v <= b, "<": v < b}[m["op"]]
        lo, hi = num(m["lo"]), num(m["hi"])
        return ((v > lo) if m["lb"] == "(" else (v >= lo)) and (
            (v < hi) if m["rb"] == ")" else (v <= hi)
        )

    bounds = [num(b) for b in (m["lo"], m["hi"], m["bound"]) if b]
    return pred, bounds


RANGE_SETTINGS = [
    n
    for n, o in options().items()
    if o.choices is None and (o.low is not None or o.high is not None)
]


def test_the_range_settings_are_every_numeric_setting():
    numeric = {
        n
        for n, f in FIELDS.items()
        if isinstance(getattr(Settings(), n), (int, float))
        and not isinstance(getattr(Settings(), n), bool)
    }
    assert set(RANGE_SETTINGS) == numeric


@pytest.mark.parametrize("name", RANGE_SETTINGS)
def test_the_range_in_the_help_is_the_one_validate_enforces(option_help, name):
    """Probe each bound the help states, a little inside and outside it, and
    the special values: validate() accepts exactly what the help allows."""
    allowed = parsed(option_help, name)["allowed"]
    base = runs_with(name, getattr(Settings(), name))
    pred, bounds = interval(allowed, base)
    is_int = isinstance(getattr(Settings(), name), int)
    probes: set[float] = {0, 1, -1}
    for b in bounds:
        probes |= {b - 1, b, b + 1} if is_int else {b - 0.5, b - 1e-6, b, b + 1e-6, b + 0.5}
    if not is_int:
        probes |= {math.inf, -math.inf, math.nan, 0.5}
    for v in sorted(probes, key=lambda x: (math.isnan(x), x)):
        value = int(v) if is_int else float(v)
        ok = accepted(runs_with(name, value))
        assert ok == pred(value), (
            f"--{name.replace('_', '-')} {value!r}: help says allowed={allowed!r} "
            f"({'accepts' if pred(value) else 'refuses'}), "
            f"validate {'accepts' if ok else 'refuses'}"
        )


def test_a_refused_range_value_names_the_allowed_range_as_the_help_does():
    for name in RANGE_SETTINGS:
        allowed = options()[name].allowed()
        below = min(-1, (options()[name].low or 0) - 1)  # under the range (and not 0)
        with pytest.raises(ValueError) as err:
            runs_with(
                name, int(below) if isinstance(getattr(Settings(), name), int) else float(below)
            ).validate()
        assert f"{name.replace('_', '-')} must be {allowed}" in str(err.value)


def test_ucb_default_k_is_stated_in_the_help(option_help):
    text = option_help["--clients-per-round"]
    assert "0 = min(num-clients, 5 x number of models) for ranklist-ucb, pareto-ucb" in text
    assert "0 = all clients for mfa-rand, mfa-rr, multi-fedavg" in text


#: the argument groups of ``mmfl run --help``, in order (issue 62)
GROUPS = ["run", "strategy", "data", "engine", "defences", "privacy", "outputs"]


def test_run_help_is_in_argument_groups(help_text):
    """Issue 62: ``mmfl run --help`` was one flat group of 100+ options. Now
    the groups run, strategy, data, engine, defences, privacy and outputs, each
    holding options, every option in one of them (but -h)."""
    titles = [ln[:-1] for ln in help_text.splitlines() if re.match(r"^[a-z]+:$", ln)]
    assert titles == ["options", *GROUPS], titles
    run = next(a for a in build_parser()._actions if a.dest == "command").choices["run"]
    groups = {g.title: g._group_actions for g in run._action_groups}
    assert [a.dest for a in groups["options"]] == ["help"]
    every = [a.dest for g in GROUPS for a in groups[g]]
    assert sorted(every) == sorted(a.dest for a in run._actions if a.dest != "help")
    assert all(groups[g] for g in GROUPS)
    placed = {a.dest: g for g in GROUPS for a in groups[g]}
    for name, group in {
        "strategy": "strategy",
        "budget_fraction": "strategy",
        "num_rounds": "run",
        "tasks": "data",
        "engine": "engine",
        "clients_per_node": "engine",
        "loss_cap": "defences",
        "dp_delta": "privacy",
        "output_dir": "outputs",
    }.items():
        assert placed[name] == group, (name, placed[name])


def test_mmfl_version(capsys):
    """Issue 62: ``mmfl --version``."""
    import mmfl_flwr
    from mmfl_flwr.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"mmfl {mmfl_flwr.__version__}") and "flwr 1." in out, out
