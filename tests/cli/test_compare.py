"""``mmfl compare``: runs grouped by strategy, the mean over models per run and
round, then the mean and sample std over the runs (seeds) of each strategy.

The fake run folders are written by the results module's own writer
(:func:`mmfl_flwr.results.write_outputs`), so their format is the real one; two
tiny real in-process runs check the same on folders a run wrote."""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from mmfl_flwr import compare as cmp
from mmfl_flwr.config import Settings
from mmfl_flwr.results import write_outputs
from mmfl_flwr.strategy import MultiModelResult

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NAN = math.nan

# per run: model -> values at rounds 0, 1, 2
RUNS = {
    "a0": (
        "a",
        0,
        {"m1": [0.10, 0.40, 0.60], "m2": [0.30, 0.60, 0.80]},
        {"m1": [2.0, 1.2, 0.8], "m2": [2.4, 1.6, 1.0]},
    ),
    "a1": (
        "a",
        1,
        {"m1": [0.20, 0.50, 0.90], "m2": [0.20, 0.70, 0.90]},
        {"m1": [2.0, 1.0, 0.4], "m2": [2.0, 1.2, 0.6]},
    ),
    # m2 of b is not evaluated at round 0 (NaN): b's round 0 is m1's alone
    "b0": (
        "b",
        0,
        {"m1": [0.10, 0.30, 0.50], "m2": [NAN, 0.50, 0.50]},
        {"m1": [2.0, 1.5, 1.0], "m2": [NAN, 1.5, 1.2]},
    ),
}

# By hand. Mean over models per run and round:
#   a0 accuracy 0.2, 0.5, 0.7   loss 2.2, 1.4, 0.9
#   a1 accuracy 0.2, 0.6, 0.9   loss 2.0, 1.1, 0.5
#   b0 accuracy 0.1, 0.4, 0.5   loss 2.0, 1.5, 1.1
# a over its two runs: mean, and sample std |x - y| / sqrt(2).
S2 = math.sqrt(2)
EXPECTED = [
    ("a", 0, 2, 0.20, 0.0, 2.10, 0.2 / S2),
    ("a", 1, 2, 0.55, 0.1 / S2, 1.25, 0.3 / S2),
    ("a", 2, 2, 0.80, 0.2 / S2, 0.70, 0.4 / S2),
    ("b", 0, 1, 0.10, None, 2.00, None),
    ("b", 1, 1, 0.40, None, 1.50, None),
    ("b", 2, 1, 0.50, None, 1.10, None),
]


def _write_run(folder: Path, strategy: str, seed: int, acc: dict, loss: dict, **settings) -> Path:
    history = [
        {
            "round": r,
            "task": m,
            "accuracy": acc[m][r],
            "loss": loss[m][r],
            "uploads": 1,
            "assigned": 1,
            "rejected": 0,
            "train_loss": NAN,
            "step_l1": 0.0,
        }
        for r in range(3)
        for m in acc
    ]
    s = Settings(
        strategy=strategy,
        seed=seed,
        num_clients=4,
        num_rounds=2,
        output_dir=str(folder),
        **settings,
    )
    write_outputs(MultiModelResult(history=history, assignments={}), s, folder)
    return folder


@pytest.fixture
def fake_runs(tmp_path) -> dict[str, Path]:
    return {name: _write_run(tmp_path / name, *spec) for name, spec in RUNS.items()}


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(cell: str) -> float | None:
    return None if cell == "" else float(cell)


def _approx(x):
    return None if x is None else pytest.approx(x, abs=1e-12)


def test_csv_holds_the_hand_computed_means_and_stds(fake_runs, tmp_path):
    png, table = tmp_path / "out" / "cmp.png", tmp_path / "out" / "cmp.csv"
    # a's runs are not next to each other: the strategies keep first-appearance order
    rows = cmp.compare([fake_runs["a0"], fake_runs["b0"], fake_runs["a1"]], png, table)
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    written = _read_csv(table)
    assert (
        list(written[0])
        == cmp.CSV_COLUMNS
        == [
            "strategy",
            "round",
            "runs",
            "accuracy_mean",
            "accuracy_std",
            "loss_mean",
            "loss_std",
        ]
    )
    assert len(written) == len(rows) == len(EXPECTED)
    for got, ret, exp in zip(written, rows, EXPECTED):
        strategy, rnd, runs, acc, acc_sd, loss, loss_sd = exp
        assert (got["strategy"], int(got["round"]), int(got["runs"])) == (strategy, rnd, runs)
        assert (ret["strategy"], ret["round"], ret["runs"]) == (strategy, rnd, runs)
        for key, want in (
            ("accuracy_mean", acc),
            ("accuracy_std", acc_sd),
            ("loss_mean", loss),
            ("loss_std", loss_sd),
        ):
            assert _num(got[key]) == _approx(want), (exp, key, got[key])
            assert ret[key] == _approx(want), (exp, key, ret[key])


def test_plot_has_two_panels_bands_for_shared_strategies_and_an_outside_legend(fake_runs, tmp_path):
    rows = cmp.aggregate([cmp.read_run(fake_runs[n]) for n in ("a0", "a1", "b0")])
    fig = cmp.plot(rows, tmp_path / "c.png", 3)
    assert (tmp_path / "c.png").read_bytes().startswith(PNG_SIGNATURE)
    assert "3 runs" in fig.get_suptitle()
    assert len(fig.axes) == 2
    for ax, key in zip(fig.axes, ("accuracy", "loss")):
        lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
        assert set(lines) == {"a (2 runs)", "b (1 run)"}
        assert lines["a (2 runs)"] == pytest.approx(
            [e[3] if key == "accuracy" else e[5] for e in EXPECTED[:3]]
        )
        # one shaded band (strategy a); b has a single run
        assert len(ax.collections) == 1
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent().transformed(fig.transFigure.inverted())
    for ax in fig.axes:
        box = ax.get_window_extent().transformed(fig.transFigure.inverted())
        assert not legend.overlaps(box)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:2] == ["a (2 runs)", "b (1 run)"]
    assert "mean ± 1 sd" in labels[2]  # the legend says what the band is


def test_a_folder_without_metrics_csv_is_a_one_line_error(fake_runs, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(fake_runs["b0"], bad)
    (bad / "metrics.csv").unlink()
    png = tmp_path / "never.png"
    with pytest.raises(ValueError) as err:
        cmp.compare([fake_runs["a0"], bad], png)
    msg = str(err.value)
    assert str(bad) in msg and "metrics.csv" in msg and "\n" not in msg
    assert not png.exists()  # nothing written before every folder is read

    (bad / "summary.json").unlink()
    shutil.copy(fake_runs["b0"] / "metrics.csv", bad / "metrics.csv")
    with pytest.raises(ValueError, match="summary.json"):
        cmp.compare([bad], png)
    with pytest.raises(ValueError, match="not a folder"):
        cmp.compare([tmp_path / "nowhere"], png)
    with pytest.raises(ValueError, match="given twice"):
        cmp.compare([fake_runs["a0"], fake_runs["a0"]], png)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mmfl")
    sub = parser.add_subparsers(dest="command", required=True)
    cmp.add_parser(sub)
    return parser.parse_args(argv)


def test_main_reports_the_error_on_stderr_and_returns_2(fake_runs, tmp_path, capsys):
    bad = tmp_path / "empty"
    bad.mkdir()
    args = _parse(["compare", str(fake_runs["a0"]), str(bad), "--output", str(tmp_path / "x.png")])
    assert args.command == "compare"
    assert cmp.main(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("mmfl compare: error: ") and str(bad) in err[0]


def test_main_defaults_write_comparison_png_and_csv_in_the_current_folder(
    fake_runs, tmp_path, monkeypatch, capsys
):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    args = _parse(["compare", *(str(fake_runs[n]) for n in ("a0", "a1", "b0"))])
    assert args.output == "comparison.png" and args.csv is None
    assert cmp.main(args) == 0
    assert (work / "comparison.png").read_bytes().startswith(PNG_SIGNATURE)
    assert len(_read_csv(work / "comparison.csv")) == len(EXPECTED)
    out = capsys.readouterr()
    assert out.err == ""
    assert "a: round 2, 2 run(s), accuracy 0.8000" in out.out

    args = _parse(
        [
            "compare",
            str(fake_runs["a0"]),
            "--output",
            str(tmp_path / "p.png"),
            "--csv",
            str(tmp_path / "t" / "table.csv"),
        ]
    )
    assert cmp.main(args) == 0
    assert (tmp_path / "t" / "table.csv").is_file() and (tmp_path / "p.png").is_file()


def test_runs_of_one_strategy_with_other_settings_warn(fake_runs, tmp_path, capsys):
    other = _write_run(tmp_path / "a-big", "a", 2, *RUNS["a0"][2:], local_epochs=9)
    with pytest.warns(UserWarning, match="differ in local-epochs"):
        cmp.compare([fake_runs["a0"], other], tmp_path / "w.png")
    args = _parse(
        ["compare", str(fake_runs["a0"]), str(other), "--output", str(tmp_path / "w2.png")]
    )
    assert cmp.main(args) == 0
    err = capsys.readouterr().err
    assert err.startswith("mmfl compare: warning: strategy a: its runs differ in local-epochs")


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory) -> list[Path]:
    from mmfl_flwr.runner import run_inprocess

    tmp = tmp_path_factory.mktemp("real")
    out = []
    for seed in (0, 1):
        folder = tmp / f"r{seed}"
        run_inprocess(
            Settings(
                strategy="mfa-rr",
                num_clients=4,
                num_rounds=2,
                local_epochs=1,
                output_dir=str(folder),
                seed=seed,
            )
        )
        out.append(folder)
    return out


def test_compare_two_real_runs(real_runs, tmp_path):
    rows = cmp.compare(real_runs, tmp_path / "real.png", tmp_path / "real.csv")
    assert [(r["strategy"], r["round"], r["runs"]) for r in rows] == [
        ("mfa-rr", 0, 2),
        ("mfa-rr", 1, 2),
        ("mfa-rr", 2, 2),
    ]
    summaries = [json.loads((d / "summary.json").read_text()) for d in real_runs]
    assert [s["seed"] for s in summaries] == [0, 1]
    assert all(set(s["versions"]) >= {"mmfl-flwr", "flwr", "git_commit"} for s in summaries)
    # at the last round every model is evaluated: the mean over models is the
    # summary's mean final accuracy
    finals = [s["mean_final_accuracy"] for s in summaries]
    assert rows[-1]["accuracy_mean"] == pytest.approx(sum(finals) / 2)
    assert rows[-1]["accuracy_std"] == pytest.approx(abs(finals[0] - finals[1]) / S2)
    losses = [sum(s["final_loss"].values()) / len(s["final_loss"]) for s in summaries]
    assert rows[-1]["loss_mean"] == pytest.approx(sum(losses) / 2)
    assert (tmp_path / "real.png").read_bytes().startswith(PNG_SIGNATURE)
    assert len(_read_csv(tmp_path / "real.csv")) == 3
    for d in real_runs:
        assert (d / "accuracy.png").read_bytes().startswith(PNG_SIGNATURE)


def test_mmfl_compare_command_line(fake_runs, tmp_path):
    """``mmfl compare DIR... --output F`` through the ``mmfl`` entry point."""
    from mmfl_flwr.cli import main

    out = tmp_path / "cli.png"
    assert main(["compare", *map(str, fake_runs.values()), "--output", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = _read_csv(out.with_suffix(".csv"))
    assert {r["strategy"] for r in rows} == {"a", "b"}
    assert main(["compare", str(tmp_path / "missing")]) == 2


def test_the_readme_compare_command_runs_verbatim(tmp_path, monkeypatch):
    """The ``mmfl compare ...`` line of docs/tutorials/compare-policies.md, in a
    folder holding run folders of those names (two seeds of two strategies)."""
    import re
    import shlex

    from mmfl_flwr.cli import main

    readme = (
        Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "compare-policies.md"
    ).read_text()
    (line,) = re.findall(r"^mmfl compare .+$", readme, re.MULTILINE)
    argv = shlex.split(line)[1:]
    folders = [a for a in argv[1:] if not a.startswith("--") and a.startswith("results/")]
    assert len(folders) == 4
    for i, folder in enumerate(folders):
        strategy, seed = folder.split("/")[-1].split("-s")
        spec = RUNS[sorted(RUNS)[i % 2]]
        _write_run(tmp_path / folder, strategy, int(seed), *spec[2:])
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    rows = _read_csv(tmp_path / "cmp.csv")
    assert {r["strategy"] for r in rows} == {"rr", "lvr"}
    assert (tmp_path / "cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_settings_that_differ_between_runs_are_listed_in_the_output_and_on_the_plot(
    fake_runs, tmp_path, capsys
):
    """Runs of two strategies with other local epochs are not overlaid in silence:
    the output and the plot name the settings that differ (issue 25)."""
    longer = _write_run(tmp_path / "b-long", "b", 0, *RUNS["a0"][2:], local_epochs=7)
    args = _parse(
        ["compare", str(fake_runs["a0"]), str(longer), "--output", str(tmp_path / "d.png")]
    )
    assert cmp.main(args) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "settings that differ" in ln]
    default = Settings().local_epochs
    assert lines == [
        f"[mmfl] settings that differ between the runs (besides strategy and "
        f"seed): local-epochs ({default}, 7)"
    ], lines
    runs = [cmp.read_run(fake_runs["a0"]), cmp.read_run(longer)]
    differ = cmp.differing_settings(runs, ignore={"strategy"})
    assert differ == {"local-epochs": [default, 7]}
    fig = cmp.plot(cmp.aggregate(runs), tmp_path / "e.png", 2, differ)
    assert f"settings that differ: local-epochs ({default}, 7)" in fig.get_suptitle()
    # runs that agree: nothing listed
    assert (
        cmp.differing_settings([cmp.read_run(fake_runs["a0"]), cmp.read_run(fake_runs["a1"])]) == {}
    )


def test_one_data_folder_spelled_two_ways_is_not_a_difference(tmp_path, monkeypatch):
    import warnings

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    rel = _write_run(tmp_path / "r0", "a", 0, *RUNS["a0"][2:], data_root="data")
    absolute = _write_run(
        tmp_path / "r1", "a", 1, *RUNS["a1"][2:], data_root=str(tmp_path / "data")
    )
    other = _write_run(
        tmp_path / "r2", "a", 2, *RUNS["a1"][2:], data_root=str(tmp_path / "elsewhere")
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cmp.compare([rel, absolute], tmp_path / "p.png")
    with pytest.warns(UserWarning, match="differ in data-root"):
        cmp.compare([rel, absolute, other], tmp_path / "q.png")


def test_the_engine_is_recorded_and_compared_like_a_setting(real_runs, tmp_path):
    """mmfl run records the engine in config.json and summary.json; mmfl compare
    lists it among the settings that differ (issue 25); Settings.load skips it."""
    for folder in real_runs:
        assert json.loads((folder / "summary.json").read_text())["engine"] == "inprocess"
        assert json.loads((folder / "config.json").read_text())["engine"] == "inprocess"
        Settings.load(str(folder / "config.json")).validate()
    other = tmp_path / "vec"
    import shutil

    shutil.copytree(real_runs[1], other)
    summary = json.loads((other / "summary.json").read_text())
    summary["engine"] = "vectorized"
    (other / "summary.json").write_text(json.dumps(summary))
    runs = [cmp.read_run(real_runs[0]), cmp.read_run(other)]
    assert cmp.differing_settings(runs) == {"engine": ["inprocess", "vectorized"]}
    assert cmp.differing_settings([cmp.read_run(d) for d in real_runs]) == {}
