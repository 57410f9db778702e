"""User errors are one line, exit code 2, no traceback (issue 11, defect 9).

``Settings.validate`` names the key and its allowed range for values that used
to pass (or to fail later with a traceback); ``python -m mmfl_flwr.cli run``
reports them, a missing ``--config`` file, a missing dataset and a malformed flag
as one line on stderr with exit code 2, before it writes anything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mmfl_flwr.config import Settings

ROOT = Path(__file__).resolve().parents[2]

#: (settings change, text the error must hold: the key and the allowed range)
INVALID = [
    ({"lr": float("inf")}, "lr must be a finite number > 0"),
    ({"lr": float("nan")}, "lr must be a finite number > 0"),
    ({"seed": -1}, "seed must be >= 0"),
    ({"budget_fraction": 1.5}, "budget-fraction must be in [0, 1]"),
    ({"budget_fraction": float("nan")}, "budget-fraction must be in [0, 1]"),
    ({"num_clients": 4, "clients_per_round": 5}, "clients-per-round must be in [0, num-clients]"),
    ({"task_arrivals": "digits_2:-1"}, "task-arrivals rounds must be in [0, num-rounds=20]"),
    ({"task_arrivals": "digits_2:21"}, "task-arrivals rounds must be in [0, num-rounds=20]"),
    ({"task_arrivals": "digits_2:3,digits_2:5"}, "names digits_2 twice"),
    ({"client_arrivals": "exponential:static=4,rate=nan"}, "rate must be a finite number > 0"),
    ({"client_arrivals": "exponential:static=4,rate=inf"}, "rate must be a finite number > 0"),
    (
        {"client_arrivals": "exponential:static=inf"},
        "static must be an integer in [0, num-clients=20]",
    ),
]


@pytest.mark.parametrize("change, expected", INVALID, ids=[str(c) for c, _ in INVALID])
def test_validate_names_the_key_and_the_allowed_range(change, expected):
    with pytest.raises(ValueError) as err:
        Settings(**change).validate()
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_the_edges_of_the_ranges_are_valid():
    Settings(
        seed=0, num_clients=4, clients_per_round=4, task_arrivals="digits_2:0,synthetic:20"
    ).validate()
    Settings(strategy="random", budget_fraction=1.0).validate()


@pytest.mark.parametrize(
    "flags, key",
    [
        (dict(strategy="mfa-rr", budget_fraction=0.5), "budget-fraction"),
        (dict(strategy="lvr", stale_beta=0.5), "stale-beta"),
        (dict(strategy="fedvarp", mifa_start="uploaded"), "mifa-start"),
        (dict(strategy="random", ucb_gamma=0.5), "ucb-gamma"),
        (dict(strategy="fedvarp", group_variant="modified"), "group-variant"),
    ],
)
def test_a_setting_the_preset_does_not_use_is_refused(flags, key):
    """The user's words are never dropped: a non-default value of a setting that
    only other presets use is refused, naming the key and who uses it."""
    with pytest.raises(ValueError, match=f"{key}=.* is not used by strategy"):
        Settings(**flags).validate()


SMALL = [
    "--engine",
    "inprocess",
    "--num-clients",
    "4",
    "--num-rounds",
    "1",
    "--local-epochs",
    "1",
    "--tasks",
    "synthetic",
]

CLI_CASES = [
    (["--lr", "inf"], "lr must be a finite number > 0"),
    (["--seed", "-1"], "seed must be >= 0"),
    (["--budget-fraction", "2"], "budget-fraction must be in [0, 1]"),
    (["--clients-per-round", "9"], "clients-per-round must be in [0, num-clients]"),
    (["--task-arrivals", "synthetic:2"], "task-arrivals rounds must be in [0, num-rounds=1]"),
    (["--client-arrivals", "exponential:static=1,rate=nan"], "rate must be a finite number"),
    (["--client-arrivals", "exponential:static=inf"], "static must be an integer"),
    (["--config", "{tmp}/missing.toml"], "--config {tmp}/missing.toml: cannot read it"),
    (["--tasks", "mnist", "--data-root", "{tmp}/nonexistent"], "MNIST not found"),
    (["--num-rounds", "abc"], "--num-rounds: invalid int value: 'abc'"),
    # pins need a client-token or a node key, which mmfl run's nodes never have: with
    # *=key:first-use the run trained 20 rounds with 0 uploads and exited 0
    (["--client-pins", "3=token:" + "ab" * 32], "--client-pins: the nodes of mmfl run's engines"),
    (["--client-pins", "*=key:first-use"], "--client-pins: the nodes of mmfl run's engines"),
    (["--client-pins", "0=key:" + "ab" * 32], "--client-pins: the nodes of mmfl run's engines"),
    (
        ["--client-pins", "*=key:first-use", "--sequential"],
        "--client-pins: the nodes of mmfl run's engines",
    ),
]


@pytest.mark.parametrize("flags, expected", CLI_CASES, ids=[" ".join(f) for f, _ in CLI_CASES])
def test_cli_user_error_is_one_line_exit_2(flags, expected, tmp_path):
    out = tmp_path / "out"
    argv = [f.format(tmp=tmp_path) for f in flags]
    proc = subprocess.run(
        [sys.executable, "-m", "mmfl_flwr.cli", "run", *SMALL, *argv, "--output-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmfl run: error: "), proc.stderr
    assert expected.format(tmp=tmp_path) in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("engine", ["inprocess", "simulation"])
def test_an_output_dir_that_is_a_file_is_one_line_before_anything_starts(engine, tmp_path):
    """An --output-dir naming a file (or a folder under one) is one line, exit 2,
    on every engine, before any engine starts; the file is left as it was, also
    with --overwrite (which replaces run outputs, never a file by a folder)."""
    taken = tmp_path / "taken.txt"
    taken.write_text("mine")
    flags = [f for f in SMALL if f not in ("--engine", "inprocess")]
    for out, extra in ((taken, []), (taken / "sub", []), (taken, ["--overwrite"])):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "mmfl_flwr.cli",
                "run",
                *flags,
                "--engine",
                engine,
                "--output-dir",
                str(out),
                *extra,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mmfl run: error: "), proc.stderr
        assert f"--output-dir {out}" in lines[0] and f"{taken} is a file" in lines[0], lines
        assert taken.read_text() == "mine"


def test_logs_written_to_a_file_carry_no_colour_codes(tmp_path):
    """ANSI colours only on a terminal: a warning of a run whose stderr is a file
    (or a pipe) is plain text (the simulation engine's: tests/docs/test_readme_main_job.py)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmfl_flwr.cli",
            "run",
            *SMALL,
            "--strategy",
            "lvr",
            "--output-dir",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" in proc.stderr  # the budget warning of 4 clients
    assert "\x1b[" not in proc.stderr + proc.stdout, proc.stderr


def _unwritable_locations(tmp_path: Path) -> list[tuple[str, str]]:
    """(output dir, what the error names) that this process cannot write: a
    read-only or virtual file system (/sys, /proc where mkdir fails), and a
    folder without write permission (only for a user that permissions bind)."""
    import os

    out = []
    for base in ("/sys", "/proc"):
        try:
            os.mkdir(f"{base}/mmfl-probe-x")
        except OSError:
            out.append((f"{base}/x", f"cannot write into {base}"))
        else:  # pragma: no cover - a writable /sys: not a read-only location here
            os.rmdir(f"{base}/mmfl-probe-x")
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        out += [(str(ro), f"cannot write into {ro}"), (str(ro / "sub"), f"cannot write into {ro}")]
    return out


@pytest.mark.parametrize("engine", ["inprocess", "simulation"])
def test_an_unwritable_output_dir_is_one_line_before_data_or_engine(
    engine, tmp_path, monkeypatch, capsys
):
    """Issue 62: an output folder that cannot be written (permissions, a read-only
    file system) was a PermissionError traceback after the data had loaded (and
    Ray had started). Now one line, exit 2, before data or engine."""
    from mmfl_flwr import cli, runner
    from mmfl_flwr.flower_app import data

    started: list[str] = []
    monkeypatch.setattr(data, "federation_for", lambda *a, **k: started.append("data"))
    monkeypatch.setattr(cli, "run", lambda *a, **k: started.append("engine"))
    monkeypatch.setattr(runner, "run_simulation_engine", lambda *a, **k: started.append("ray"))
    cases = _unwritable_locations(tmp_path)
    assert cases, "no unwritable location on this machine"
    flags = [f for f in SMALL if f not in ("--engine", "inprocess")]
    for out, named in cases:
        with pytest.raises(SystemExit) as stop:
            cli.main(["run", *flags, "--engine", engine, "--output-dir", out])
        assert stop.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mmfl run: error: "), lines
        assert f"--output-dir {out}" in lines[0] and named in lines[0], lines
        assert started == []


def test_the_python_run_refuses_an_unwritable_output_dir_before_the_engine(monkeypatch):
    from mmfl_flwr import runner
    from mmfl_flwr.config import Settings as S

    started: list[str] = []
    monkeypatch.setattr(runner, "run_simulation_engine", lambda *a, **k: started.append("ray"))
    monkeypatch.setattr(runner, "run_inprocess", lambda *a, **k: started.append("inprocess"))
    for engine in ("simulation", "inprocess"):
        with pytest.raises(ValueError, match="cannot write into /sys"):
            runner.run(S(output_dir="/sys/x"), engine=engine)
    assert started == []


def test_a_config_toml_boolean_for_a_number_is_one_line(tmp_path):
    """Issue 62: ``local-epochs = true`` in a --config TOML ran with 1 epoch."""
    cfg = tmp_path / "run.toml"
    cfg.write_text("local-epochs = true\n")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmfl_flwr.cli",
            "run",
            "--config",
            str(cfg),
            "--output-dir",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "local-epochs must be a whole number >= 1; got True" in lines[0]
    assert not out.exists()


def test_cli_refuses_an_empty_task_item(tmp_path, capsys):
    from mmfl_flwr import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["run", "--tasks", "digits,,synthetic", "--output-dir", str(tmp_path / "o")])
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "tasks='digits,,synthetic'" in lines[0] and "empty" in lines[0]


def test_a_run_that_fails_on_the_engine_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    """Issue 62: where Flower's run fails (its ServerApp raised; ``flwr run``
    itself exits 0), mmfl run reports it as one line and exit code 1, not a
    SimulationError traceback."""
    from mmfl_flwr import cli
    from mmfl_flwr.flower_app.launch import SimulationError

    def failing(*args, **kwargs):
        raise SimulationError("the run ended as 'finished:failed' (ServerApp raised)")

    monkeypatch.setattr(cli, "run", failing)
    monkeypatch.setattr(cli, "check_before_run", lambda settings: None)
    code = cli.main(["run", *SMALL, "--output-dir", str(tmp_path / "o")])
    assert code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert (
        lines[0].startswith("mmfl run: error: the run failed: ") and "finished:failed" in lines[0]
    )


def test_the_server_app_names_an_invalid_run_config_in_one_error_line(caplog):
    """``flwr run . --run-config "num-clients=-1"``: Flower shows the ServerApp's
    traceback and exits 0; the ServerApp first logs one ERROR line saying what
    is wrong with the run-config."""
    import logging

    from flwr.app import Context, RecordDict

    from mmfl_flwr.flower_app.server_app import server_main

    context = Context(
        run_id=1,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config={"num-clients": -1},
    )
    with caplog.at_level(logging.ERROR, logger="flwr"), pytest.raises(ValueError):
        server_main(None, context)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("invalid run-config" in m and "num-clients must be >= 1" in m for m in errors), (
        errors
    )
