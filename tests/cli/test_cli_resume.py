"""Resuming and output folders (issue 11, defects 7 and 8).

``mmfl run --resume DIR --num-rounds N`` extends a finished run; any other
setting that differs from the run's ``config.json`` is refused, on the command
line and through ``resume-from`` alike; an unreadable checkpoint is one line; a
SCAFFOLD resume warns that the clients' control variates restart from zero. A
new run never clobbers a folder holding a checkpoint unless ``--overwrite``, and
writes nothing before its data is loaded. Every refusal: exit code 2, one line on
stderr, no file of the folder touched.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import pytest

from mmfl_flwr.checkpoint import CHECKPOINT_FILE, load_checkpoint
from mmfl_flwr.cli import main as cli_main
from mmfl_flwr.config import Settings
from mmfl_flwr.runner import run

SMALL = [
    "--engine",
    "inprocess",
    "--num-clients",
    "4",
    "--local-epochs",
    "1",
    "--tasks",
    "synthetic",
]


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict[int, Path]:
    """Finished CLI runs of 2 and 3 rounds (the same settings otherwise)."""
    runs = {}
    for rounds in (2, 3):
        out = tmp_path_factory.mktemp(f"rounds{rounds}")
        assert cli_main(["run", *SMALL, "--num-rounds", str(rounds), "--output-dir", str(out)]) == 0
        runs[rounds] = out
    return runs


@pytest.fixture
def old_run(finished, tmp_path) -> Path:
    """A private copy of the finished 2-round run."""
    return Path(shutil.copytree(finished[2], tmp_path / "old"))


def refused(argv: list[str], capsys) -> str:
    """Run ``mmfl`` expecting a usage error; returns its one stderr line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli_main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------ defect 7
def test_resume_extends_num_rounds_of_a_finished_run(finished, old_run):
    # setting flags equal to the run's values are fine beside --num-rounds
    assert (
        cli_main(
            [
                "run",
                "--resume",
                str(old_run),
                "--engine",
                "inprocess",
                "--num-rounds",
                "3",
                "--tasks",
                "synthetic",
                "--seed",
                "0",
            ]
        )
        == 0
    )
    assert Settings.load(str(old_run / "config.json")).num_rounds == 3
    assert load_checkpoint(old_run)["round"] == 3
    for name in ("metrics.csv", "assignments.csv"):  # as if it had run 3 rounds at once
        assert (old_run / name).read_text() == (finished[3] / name).read_text(), name


@pytest.mark.parametrize(
    "flags, key",
    [
        (["--lr", "0.5"], "lr"),
        (["--tasks", "digits"], "tasks"),
        (["--num-clients", "5"], "num-clients"),
        (["--seed", "1"], "seed"),
        (["--strategy", "lvr"], "strategy"),
        (["--num-rounds", "3", "--batch-size", "16", "--local-epochs", "2"], "local-epochs"),
    ],
)
def test_resume_refuses_a_changed_setting(old_run, flags, key, capsys):
    before = snapshot(old_run)
    err = refused(["run", "--resume", str(old_run), "--engine", "inprocess", *flags], capsys)
    assert f"--{key}" in err and "config.json" in err
    assert snapshot(old_run) == before


def test_resume_from_with_other_settings_is_refused(old_run, capsys):
    before = snapshot(old_run)
    stored = Settings.load(str(old_run / "config.json"))
    for change in ({"tasks": "digits"}, {"num_clients": 5}, {"lr": 0.5}):
        s = dataclasses.replace(stored, resume_from=str(old_run), num_rounds=3, **change)
        key = next(iter(change)).replace("_", "-")
        with pytest.raises(ValueError, match=f"{key}=") as err:
            run(s, engine="inprocess")
        assert "\n" not in str(err.value)
        assert snapshot(old_run) == before
    # the same through the CLI's --resume-from (the run-config path)
    err = refused(
        [
            "run",
            *SMALL,
            "--lr",
            "0.5",
            "--num-rounds",
            "3",
            "--output-dir",
            str(old_run),
            "--resume-from",
            str(old_run),
        ],
        capsys,
    )
    assert "lr=" in err
    assert snapshot(old_run) == before


@pytest.mark.parametrize("content", [b"", b"\x80\x05\x95garbage", "half"])
def test_unreadable_checkpoint_is_one_line(old_run, content, capsys):
    ckpt = old_run / CHECKPOINT_FILE
    ckpt.write_bytes(
        ckpt.read_bytes()[: len(ckpt.read_bytes()) // 2] if content == "half" else content
    )
    with pytest.raises(ValueError, match="unreadable/corrupt"):
        load_checkpoint(old_run)
    before = snapshot(old_run)
    err = refused(["run", "--resume", str(old_run), "--engine", "inprocess"], capsys)
    assert "unreadable/corrupt" in err and str(ckpt) in err
    assert snapshot(old_run) == before


def test_resuming_scaffold_warns_that_client_variates_restart(tmp_path, caplog):
    s = Settings(
        strategy="scaffold",
        tasks="synthetic",
        num_clients=4,
        num_rounds=1,
        local_epochs=1,
        budget_fraction=0.5,
        output_dir=str(tmp_path),
    )
    run(s, engine="inprocess")
    s.num_rounds, s.resume_from = 2, str(tmp_path)
    with caplog.at_level(logging.WARNING):
        run(s, engine="inprocess")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("control variates" in m and "zero" in m for m in warned), warned


# ------------------------------------------------------------------ defect 8
def test_missing_data_leaves_the_old_run_resumable(old_run, tmp_path):
    before = snapshot(old_run)
    s = Settings(
        tasks="mnist",
        data_root=str(tmp_path / "nonexistent"),
        num_clients=4,
        num_rounds=1,
        output_dir=str(old_run),
        overwrite=True,
    )
    with pytest.raises(FileNotFoundError, match="nonexistent"):
        run(s, engine="inprocess")
    assert snapshot(old_run) == before


def test_runner_refuses_a_folder_holding_a_run(old_run):
    """Every path (``runner.run``, ``flwr run``'s ServerApp), not only the CLI,
    keeps a folder holding another run's checkpoint unless ``overwrite``."""
    before = snapshot(old_run)
    s = Settings(tasks="synthetic", num_clients=4, num_rounds=1, output_dir=str(old_run))
    with pytest.raises(ValueError, match=r"holds a run .*\(overwrite=true\)"):
        run(s, engine="inprocess")
    assert snapshot(old_run) == before
    assert json.loads((old_run / "config.json").read_text())["tasks"] == "synthetic"


def test_cli_missing_data_with_overwrite_touches_nothing(old_run, tmp_path, capsys):
    before = snapshot(old_run)
    err = refused(
        [
            "run",
            *SMALL,
            "--tasks",
            "mnist",
            "--data-root",
            str(tmp_path / "nonexistent"),
            "--output-dir",
            str(old_run),
            "--overwrite",
        ],
        capsys,
    )
    assert "MNIST not found" in err and "nonexistent" in err
    assert snapshot(old_run) == before


def test_new_run_refuses_a_folder_holding_a_run(old_run, capsys):
    before = snapshot(old_run)
    err = refused(["run", *SMALL, "--num-rounds", "1", "--output-dir", str(old_run)], capsys)
    assert err.endswith(
        f"output folder {old_run} holds a run (checkpoint.pkl); resume it with "
        f"--resume {old_run} (resume-from) or pass --overwrite (overwrite=true)"
    )
    assert snapshot(old_run) == before
    # --overwrite starts the new run there
    assert (
        cli_main(["run", *SMALL, "--num-rounds", "1", "--output-dir", str(old_run), "--overwrite"])
        == 0
    )
    assert Settings.load(str(old_run / "config.json")).num_rounds == 1


def test_new_run_may_use_a_folder_without_checkpoint(old_run):
    (old_run / CHECKPOINT_FILE).unlink()
    assert cli_main(["run", *SMALL, "--num-rounds", "1", "--output-dir", str(old_run)]) == 0
    assert load_checkpoint(old_run)["round"] == 1


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupted_run_ends_with_one_line_and_shows_its_finished_rounds(sig, tmp_path):
    """Ctrl-C (SIGINT) or SIGTERM during a run: exit code 130, one line on stderr
    naming the last finished round and the exact command that continues it, no
    traceback; metrics.csv, assignments.csv and accuracy.png already hold the
    finished rounds; the printed command finishes the run (issue 25)."""
    import signal
    import subprocess
    import sys
    import time

    from mmfl_flwr.results import read_metrics_csv

    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "mmfl_flwr.cli",
        "run",
        *SMALL,
        "--num-rounds",
        "30",
        "--output-dir",
        str(out),
    ]
    # SIGINT as a terminal's Ctrl-C delivers it (pytest-xdist's workers ignore it, and
    # a child would inherit that)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if load_checkpoint(out)["round"] >= 2:
                break
        except Exception:
            pass
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    done = load_checkpoint(out)["round"]
    assert 2 <= done < 30
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"mmfl run: interrupted after round {done} of 30;"), err
    assert last.endswith(f"continue with: mmfl run --resume {out} --engine inprocess"), last
    rows = read_metrics_csv(out / "metrics.csv")
    assert sorted({int(r["round"]) for r in rows}) == list(range(done + 1))
    assert (out / "assignments.csv").is_file() and (out / "accuracy.png").is_file()
    assert not (out / "summary.json").exists()  # written when the run finishes
    # its report (issue 59) covers the finished rounds
    sys.path.insert(0, str(Path(__file__).parents[1] / "tracking"))
    from html_report import parse

    page = parse((out / "report.html").read_text(encoding="utf-8"))
    assert sorted({int(r[0]) for r in page.table("metrics")}) == list(range(done + 1))
    assert f"rounds 0 to {done} of 30" in page.text("summary")
    assert "report.html" in last
    # the command it printed continues the run to the end
    resume = last.split("continue with: ")[1].split()
    assert cli_main(resume[1:]) == 0
    assert sorted({int(r["round"]) for r in read_metrics_csv(out / "metrics.csv")}) == list(
        range(31)
    )


def test_resume_takes_two_spellings_of_one_data_folder_as_equal(tmp_path, monkeypatch):
    """A run started with data-root 'data' resumes with the same folder spelled
    absolute (the simulation engine passes it so), not with another folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    stored = Settings(data_root="data")
    Settings(data_root=str(tmp_path / "data")).check_resumes(stored, "run")
    Settings(data_root="./data/").check_resumes(stored, "run")
    with pytest.raises(ValueError, match="data-root"):
        Settings(data_root=str(tmp_path / "other")).check_resumes(stored, "run")


def test_a_stored_relative_data_folder_names_one_from_the_given_base(tmp_path, monkeypatch):
    """The ServerApp of mmfl run's simulation engine runs in another folder: a
    relative data-root in config.json names a folder from the one mmfl run was
    started in (``base``), not from the ServerApp's."""
    (tmp_path / "user" / "data").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    stored = Settings(data_root="data")
    given = Settings(data_root=str(tmp_path / "user" / "data"))
    with pytest.raises(ValueError, match="data-root"):
        given.check_resumes(stored, "run")
    given.check_resumes(stored, "run", base=str(tmp_path / "user"))
    with pytest.raises(ValueError, match="data-root"):
        given.check_resumes(stored, "run", base=str(tmp_path / "elsewhere"))
