"""The sequential single-model baseline (``mmfl run --sequential``): each model
alone with all clients, ``single.csv``, usable as ``single`` of ``gain``."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from mmfl_flwr import gain, runner
from mmfl_flwr.config import Settings
from mmfl_flwr.convergence import accuracy_curves
from mmfl_flwr.sequential import (
    SINGLE_COLUMNS,
    read_single_csv,
    run_sequential,
    single_settings,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "tasks": "digits,synthetic,digits",
    "num_clients": 3,
    "num_rounds": 2,
    "local_epochs": 1,
    "batch_size": 16,
    "seed": 2,
    "strategy": "lvr",
    "budget_fraction": 0.5,
}


def test_single_settings_train_one_model_with_full_participation():
    s = Settings(**TINY, output_dir="x", target_accuracy="0.5", task_arrivals="synthetic:1")
    one = single_settings(s, "digits_2")
    assert one.strategy == "full" and one.aggregator == ""
    assert one.task_arrivals == "digits:2,synthetic:2"  # the others only in the last round
    assert one.tasks == s.tasks and one.seed == s.seed and one.num_clients == 3
    assert one.output_dir == "" and one.target_accuracy == "" and one.resume_from == ""
    one.validate()
    with pytest.raises(ValueError, match="not a model"):
        single_settings(s, "digits-2")


def test_run_sequential_writes_single_csv_equal_to_models_trained_alone(tmp_path):
    rows = run_sequential(Settings(**TINY, output_dir=str(tmp_path)), engine="inprocess")
    assert [(r["round"], r["task"]) for r in rows] == [
        (r, t) for t in ("digits", "synthetic", "digits_2") for r in range(3)
    ]
    with open(tmp_path / "single.csv", newline="") as f:
        table = list(csv.reader(f))
    assert tuple(table[0]) == SINGLE_COLUMNS
    assert len(table) == 1 + 9
    assert not (tmp_path / "metrics.csv").exists()  # only single.csv is written
    single = read_single_csv(tmp_path / "single.csv")
    assert single == accuracy_curves(rows)
    assert all(len(c) == 3 and not any(math.isnan(a) for a in c) for c in single.values())
    # Under full participation the models never interact, so each model's
    # single curve is exactly its curve in a full-participation run of all of
    # them (same federation, initial weights and seeds; digits_2 keeps its own
    # data, which `tasks=digits` alone would not).
    full = runner.run(
        Settings(**{**TINY, "strategy": "full", "budget_fraction": 0.0}, output_dir=""),
        engine="inprocess",
    )
    by_model = {(r["round"], r["task"]): (r["accuracy"], r["loss"]) for r in full.history}
    for r in rows:
        assert (r["accuracy"], r["loss"]) == by_model[(r["round"], r["task"])]
    # usable as gain's `single`: with parallel == single, T_M <= t1, so g >= M
    assert gain(single, single, 2) >= 3


def test_cli_sequential_beside_a_parallel_run(tmp_path, capsys):
    flags = [
        "--engine",
        "inprocess",
        "--tasks",
        "synthetic",
        "--num-clients",
        "2",
        "--num-rounds",
        "1",
        "--local-epochs",
        "1",
        "--strategy",
        "mfa-rr",
        "--output-dir",
        str(tmp_path),
    ]
    runner.run(
        Settings(
            tasks="synthetic",
            num_clients=2,
            num_rounds=1,
            local_epochs=1,
            strategy="mfa-rr",
            output_dir=str(tmp_path),
        ),
        engine="inprocess",
    )
    metrics = (tmp_path / "metrics.csv").read_bytes()
    config = (tmp_path / "config.json").read_bytes()
    cmd = [sys.executable, "-m", "mmfl_flwr.cli", "run", "--sequential", *flags]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sequential 1/1: synthetic alone" in proc.stdout
    assert set(read_single_csv(tmp_path / "single.csv")) == {"synthetic"}
    # the multi-model run's files are left alone
    assert (tmp_path / "metrics.csv").read_bytes() == metrics
    assert (tmp_path / "config.json").read_bytes() == config
    # an existing single.csv is kept without --overwrite; --resume is refused (the
    # same main() in this process: the process-level one-line refusal is
    # tests/cli/test_cli_errors.py's)
    from mmfl_flwr import cli

    cases = [
        ([], "holds single.csv; pass --overwrite"),
        (["--resume", str(tmp_path)], "--sequential and --resume exclude each other"),
    ]
    for extra, expected in cases:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["run", "--sequential", *flags, *extra])
        assert exit_info.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], lines
