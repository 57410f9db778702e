"""``--target-accuracy``: the setting, its one-line errors, and ``summary.json``'s
``rounds_to_target`` / ``rounds_to_target_all``, hand-computed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from mmfl_flwr import runner
from mmfl_flwr.config import Settings
from mmfl_flwr.convergence import rounds_to_target, rounds_to_target_all
from mmfl_flwr.results import summarize, write_outputs
from mmfl_flwr.strategy import MultiModelResult

ROOT = Path(__file__).resolve().parents[2]

# Server-side accuracy per round (index = round; round 0 = initial model).
ACC = {
    "digits": [0.10, 0.50, 0.85, 0.80, 0.90],
    "synthetic": [0.70, 0.40, 0.55, 0.65, 0.72],
    "digits_2": [0.10, 0.20, math.nan, 0.30, 0.40],
}


def _result() -> MultiModelResult:
    return MultiModelResult(
        history=[
            {
                "round": r,
                "task": t,
                "accuracy": ACC[t][r],
                "loss": 1.0,
                "uploads": 1,
                "assigned": 1,
                "rejected": 0,
                "train_loss": math.nan,
                "step_l1": 0.0,
            }
            for r in range(5)
            for t in ACC
        ]
    )


def test_settings_parse_one_value_or_pairs():
    assert Settings().target_accuracies() == {}
    assert Settings(target_accuracy="0.8").target_accuracies() == {
        "digits": 0.8,
        "synthetic": 0.8,
        "digits_2": 0.8,
    }
    assert Settings(target_accuracy=" digits:0.8, digits_2:0.3,").target_accuracies() == {
        "digits": 0.8,
        "digits_2": 0.3,
    }
    assert Settings(target_accuracy="1").target_accuracies()["synthetic"] == 1.0


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("1.5", "'1.5' is not an accuracy in (0, 1]"),
        ("0", "'0' is not an accuracy in (0, 1]"),
        ("nan", "'nan' is not an accuracy in (0, 1]"),
        ("abc", "'abc' is not an accuracy in (0, 1]"),
        (
            "digits:0.8,mnist:0.5",
            "names 'mnist', which is not a model of this run (digits, synthetic, digits_2)",
        ),
        ("digits-2:0.5", "names 'digits-2', which is not a model"),
        ("digits:0.8,digits:0.7", "names 'digits' twice"),
        ("digits:0.8,0.7", "expected model:accuracy pairs"),
        ("digits:x", "'x' is not an accuracy"),
    ],
)
def test_invalid_target_is_a_one_line_error(spec, expected):
    with pytest.raises(ValueError) as err:
        Settings(target_accuracy=spec).validate()
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"target-accuracy={spec!r}")


def test_rounds_to_target_hand_computed():
    # digits >= 0.8 first at round 2; synthetic >= 0.7: round 0 (0.70) does not
    # count, first trained round is 4; digits_2 never reaches 0.5
    reached = rounds_to_target(ACC, {"digits": 0.8, "synthetic": 0.7, "digits_2": 0.5})
    assert reached == {"digits": 2, "synthetic": 4, "digits_2": None}
    assert rounds_to_target_all(reached) is None
    reached = rounds_to_target(ACC, {"digits": 0.8, "synthetic": 0.7, "digits_2": 0.3})
    assert reached == {"digits": 2, "synthetic": 4, "digits_2": 3}  # round 2 is NaN
    assert rounds_to_target_all(reached) == 4
    assert rounds_to_target_all({}) is None


def test_summary_records_rounds_to_target():
    s = summarize(_result(), Settings(target_accuracy="digits:0.8,synthetic:0.7"))
    assert s["target_accuracy"] == {"digits": 0.8, "synthetic": 0.7}
    assert s["rounds_to_target"] == {"digits": 2, "synthetic": 4}
    assert s["rounds_to_target_all"] == 4
    s = summarize(_result(), Settings(target_accuracy="0.5"))
    assert s["rounds_to_target"] == {"digits": 1, "synthetic": 2, "digits_2": None}
    assert s["rounds_to_target_all"] is None


def test_summary_without_target_has_no_such_keys():
    s = summarize(_result(), Settings())
    assert not {"target_accuracy", "rounds_to_target", "rounds_to_target_all"} & set(s)
    assert "rounds_to_target" not in summarize(_result(), None)


def test_summary_json_writes_null_for_never(tmp_path):
    write_outputs(_result(), Settings(target_accuracy="0.5"), tmp_path)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["rounds_to_target"] == {"digits": 1, "synthetic": 2, "digits_2": None}
    assert s["rounds_to_target_all"] is None
    assert '"rounds_to_target_all": null' in (tmp_path / "summary.json").read_text()


def test_a_run_writes_rounds_to_target(tmp_path):
    settings = Settings(
        tasks="synthetic",
        num_clients=3,
        num_rounds=2,
        local_epochs=1,
        strategy="full",
        seed=1,
        output_dir=str(tmp_path),
        target_accuracy="synthetic:0.01",
    )
    result = runner.run(settings, engine="inprocess")
    s = json.loads((tmp_path / "summary.json").read_text())
    acc = [r["accuracy"] for r in result.history]
    first = next(r for r in (1, 2) if acc[r] >= 0.01)
    assert s["rounds_to_target"] == {"synthetic": first}
    assert s["rounds_to_target_all"] == first
    assert s["config"]["target-accuracy"] == "synthetic:0.01"


def test_cli_flag_error_is_one_line_exit_2(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmfl_flwr.cli",
            "run",
            "--engine",
            "inprocess",
            "--tasks",
            "synthetic",
            "--num-clients",
            "3",
            "--target-accuracy",
            "digits:0.5",
            "--output-dir",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmfl run: error: target-accuracy="), lines
    assert "not a model of this run (synthetic)" in lines[0]
    assert not out.exists()
