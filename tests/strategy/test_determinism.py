"""One seed fixes a run: same seed, same files; another seed, other assignments.
Also the ``mmfl run`` command line on the in-process engine.

These run the real embedded tasks (torch) on the in-process engine, with small
federations so the whole file stays within a few seconds.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from mmfl_flwr.cli import main
from mmfl_flwr.config import Settings
from mmfl_flwr.runner import run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
METRIC_COLUMNS = ["round", "task", "accuracy", "loss", "uploads"]


def _run(tmp_path: Path, name: str, seed: int = 0) -> tuple[Path, object]:
    out = tmp_path / name
    settings = Settings(
        num_clients=6, num_rounds=3, tasks="digits,synthetic", output_dir=str(out), seed=seed
    )
    result = run(settings, engine="inprocess")
    return out, result


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    tmp = tmp_path_factory.mktemp("determinism")
    return {
        "first": _run(tmp, "first"),
        "second": _run(tmp, "second"),
        "other-seed": _run(tmp, "other-seed", seed=1),
    }


def test_same_seed_gives_byte_identical_metrics_and_assignments(runs):
    (a, ra), (b, rb) = runs["first"], runs["second"]
    metrics_a = (a / "metrics.csv").read_bytes()
    assert metrics_a == (b / "metrics.csv").read_bytes()
    assert (a / "assignments.csv").read_bytes() == (b / "assignments.csv").read_bytes()
    assert ra.assignments == rb.assignments  # type: ignore[attr-defined]
    # the file is not trivially empty: 2 tasks x (3 rounds + round 0)
    rows = _csv_rows(a / "metrics.csv")
    assert len(rows) == 8
    assert sum(int(r["uploads"]) for r in rows) > 0
    # accuracies are real numbers in [0, 1] for every evaluated row
    for r in rows:
        assert 0.0 <= float(r["accuracy"]) <= 1.0
    # and the summaries agree on everything but nothing time-dependent is in them
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    sa["config"].pop("output-dir")
    sb["config"].pop("output-dir")
    assert sa == sb


def test_assignments_csv_matches_the_result(runs):
    out, result = runs["first"]
    rows = _csv_rows(out / "assignments.csv")
    assert list(rows[0]) == ["round", "client", "task", "count"]
    expected = [
        (str(rnd), cid, task, str(count))
        for rnd in sorted(result.assignments)  # type: ignore[attr-defined]
        for cid, task, count in result.assignments[rnd]  # type: ignore[attr-defined]
    ]
    assert [(r["round"], r["client"], r["task"], r["count"]) for r in rows] == expected
    assert {r["round"] for r in rows} == {"1", "2", "3"}


def test_another_seed_gives_other_assignments(runs):
    (a, ra), (c, rc) = runs["first"], runs["other-seed"]
    assert (a / "assignments.csv").read_bytes() != (c / "assignments.csv").read_bytes()
    assert ra.assignments != rc.assignments  # type: ignore[attr-defined]
    assert (a / "metrics.csv").read_bytes() != (c / "metrics.csv").read_bytes()


def test_cli_run_inprocess_writes_all_outputs(tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(
        [
            "run",
            "--engine",
            "inprocess",
            "--num-rounds",
            "2",
            "--num-clients",
            "5",
            "--output-dir",
            str(out),
        ]
    )
    assert code == 0
    for name in ("metrics.csv", "summary.json", "assignments.csv", "accuracy.png"):
        assert (out / name).is_file(), name
    png = (out / "accuracy.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 1000

    models = Settings().model_names  # the default tasks, e.g. digits, synthetic, digits_2
    assert len(models) == len(set(models)) >= 2

    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["final_accuracy"]) == set(models)
    accs = list(summary["final_accuracy"].values())
    assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in accs)
    assert summary["mean_final_accuracy"] == pytest.approx(sum(accs) / len(accs))
    assert summary["seed"] == 0
    assert summary["config"]["num-rounds"] == 2
    assert summary["config"]["num-clients"] == 5
    assert summary["config"]["seed"] == 0

    with open(out / "metrics.csv", newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        body = list(reader)
    assert header[: len(METRIC_COLUMNS)] == METRIC_COLUMNS
    assert "seconds" not in header
    keys = [(int(r[0]), r[1]) for r in body]
    assert len(keys) == len(set(keys)), "one row per (round, task)"
    assert sorted(keys) == sorted((rnd, t) for rnd in range(3) for t in models)
    for r in body:
        row = dict(zip(header, r))
        assert 0.0 <= float(row["accuracy"]) <= 1.0
        assert math.isfinite(float(row["loss"]))
        assert int(row["uploads"]) >= 0
    # the final accuracies of the summary are the last rows of metrics.csv
    last = {
        dict(zip(header, r))["task"]: float(dict(zip(header, r))["accuracy"])
        for r in body
        if int(r[0]) == 2
    }
    assert last == pytest.approx(summary["final_accuracy"])

    text = capsys.readouterr().out
    assert "final accuracy" in text


def test_cli_rejects_bad_settings(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "--engine",
                "inprocess",
                "--num-clients",
                "0",
                "--output-dir",
                str(tmp_path / "x"),
            ]
        )
    assert exc.value.code == 2
    assert "num-clients" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
