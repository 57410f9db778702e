"""``report.html`` and ``mmfl report`` (issue 59): every section present, every
number in the tables equal to the CSV files' cells, no network needed to open it.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from html_report import parse  # noqa: E402

from mmfl_flwr import cli, runner  # noqa: E402
from mmfl_flwr.config import Settings  # noqa: E402
from mmfl_flwr.report import COMPARISON_SECTIONS, RUN_SECTIONS  # noqa: E402

BASE = dict(tasks="digits,synthetic", num_clients=8, num_rounds=3, local_epochs=1, seed=2)
RUNS = {
    "lvr": dict(BASE, strategy="lvr", budget_fraction=0.6, update_clip_factor=1.0),
    "group": dict(
        BASE,
        strategy="group",
        tasks="digits,digits",
        num_clients=12,
        profile="clusters-consistent",
        group_participation=0.5,
    ),
    "dp": dict(
        BASE, strategy="mfa-rr", dp="server-fixed", dp_sampled_clients=4, dp_noise_multiplier=0.5
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("reports")
    out = {}
    for name, kw in RUNS.items():
        out[name] = base / name
        runner.run(Settings(**kw, output_dir=str(out[name])), engine="inprocess")
    return out


def cells(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def page_of(folder: Path):
    return parse((folder / "report.html").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", list(RUNS))
def test_every_section_is_there_and_the_page_is_self_contained(runs, name):
    text = (runs[name] / "report.html").read_text(encoding="utf-8")
    page = parse(text)
    assert list(page.sections) == list(RUN_SECTIONS)
    assert page.scripts == 0
    assert page.links and all(src.startswith("data:image/png;base64,") for src in page.links)
    assert "http://" not in text and "https://" not in text
    assert page.images("curves") and page.images("who-trained-what")
    assert page.images("uploads-rejections")


@pytest.mark.parametrize("name", list(RUNS))
def test_the_metrics_table_is_metrics_csv(runs, name):
    header, rows = cells(runs[name] / "metrics.csv")
    page = page_of(runs[name])
    assert page.header("metrics") == header
    assert page.table("metrics") == rows


def test_summary_configuration_uploads_and_who_trained_what_equal_the_files(runs):
    out = runs["lvr"]
    page = page_of(out)
    header, rows = cells(out / "metrics.csv")
    col = {c: i for i, c in enumerate(header)}
    last = {}
    for r in rows:
        last[r[col["task"]]] = r
    assert page.table("summary") == [
        [t, r[col["round"]], r[col["accuracy"]], r[col["loss"]]] for t, r in last.items()
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert repr(summary["mean_final_accuracy"]) in page.text("summary")
    assert "finished: 3 of 3 rounds" in page.text("summary")
    config = json.loads((out / "config.json").read_text())
    typed = {k: v for k, v in config.items() if k not in ("effective", "engine")}
    got = dict(page.table("configuration", 0))
    assert set(got) == set(typed)
    for k, v in typed.items():
        want = "" if v is None else (repr(v) if isinstance(v, float) else str(v))
        assert got[k] == want, k
    effective = config.get("effective") or {}
    if effective:
        assert dict(page.table("configuration", 1)) == {
            k: (repr(v) if isinstance(v, float) else str(v)) for k, v in effective.items()
        }
    else:
        assert len(page.tables("configuration")) == 1
        assert "No automatic setting" in page.text("configuration")
    # uploads and rejections: metrics.csv's cells of rounds >= 1
    ucols = page.header("uploads-rejections")
    assert page.table("uploads-rejections") == [
        [r[col[c]] for c in ucols] for r in rows if r[col["round"]] != "0"
    ]
    # who trained what: per round and model the clients and parts of assignments.csv
    _, picks = cells(out / "assignments.csv")
    per: dict[tuple[int, str], list] = {}
    trained: dict[tuple[str, str], set] = {}
    for rnd, cid, task, count in picks:
        cell = per.setdefault((int(rnd), task), [set(), 0])
        cell[0].add(cid)
        cell[1] += int(count)
        trained.setdefault((cid, task), set()).add(rnd)
    assert page.table("who-trained-what", 0) == [
        [str(r), t, str(len(c)), str(p)] for (r, t), (c, p) in sorted(per.items())
    ]
    models = page.header("who-trained-what", 1)[1:]
    for row in page.table("who-trained-what", 1):
        for m, n in zip(models, row[1:]):
            assert int(n) == len(trained.get((row[0], m), ())), (row[0], m)
    clients = {cid for _, cid, _, _ in picks}
    assert {row[0] for row in page.table("who-trained-what", 1)} == clients


def test_defence_events_are_events_csv(runs):
    out = runs["lvr"]
    header, rows = cells(out / "events.csv")
    assert rows, "update_clip_factor=1 clips updates"
    page = page_of(out)
    assert header == ["round", "client", "task", "kind", "value", "bound", "reason"]
    assert page.header("defence", 1) == header
    assert page.table("defence", 1) == rows
    counted: dict[tuple[str, str], int] = {}
    for r in rows:
        counted[(r[2], r[3])] = counted.get((r[2], r[3]), 0) + 1
    assert page.table("defence", 0) == [[t, k, str(n)] for (t, k), n in sorted(counted.items())]
    group_rows = cells(runs["group"] / "events.csv")[1]
    assert not group_rows or page_of(runs["group"]).tables("defence")


def test_clusters_of_group(runs):
    out = runs["group"]
    _, rows = cells(out / "clusters.csv")
    sizes: dict[tuple[str, str], int] = {}
    for rnd, _, g in rows:
        sizes[(rnd, g)] = sizes.get((rnd, g), 0) + 1
    page = page_of(out)
    got = {(r, g): int(n) for r, g, n in page.table("clusters", 0)}
    assert got == sizes
    assert len(page.images("clusters")) == len(list(out.glob("clusters_round_*.png"))) >= 1
    assert page.table("clusters", 1) == rows
    assert "No clustering" in page_of(runs["lvr"]).text("clusters")


def test_privacy_budget_with_dp(runs):
    out = runs["dp"]
    privacy = json.loads((out / "summary.json").read_text())["privacy"]
    page = page_of(out)
    keys = page.header("privacy")[1:]
    assert set(keys) == {k for p in privacy.values() for k in p}
    for row in page.table("privacy"):
        for k, v in zip(keys, row[1:]):
            want = privacy[row[0]][k]
            assert v == (
                "" if want is None else repr(want) if isinstance(want, float) else str(want)
            )
    assert "dp off" in page_of(runs["lvr"]).text("privacy")


def test_versions_are_summary_json_versions(runs):
    out = runs["lvr"]
    versions = json.loads((out / "summary.json").read_text())["versions"]
    page = page_of(out)
    assert {k: v for k, v in page.table("versions", 0)} == {
        k: ("" if v is None else str(v)) for k, v in versions.items()
    }


def test_mmfl_report_compares_runs(runs, tmp_path, capsys):
    target = tmp_path / "cmp.html"
    assert cli.main(["report", str(runs["lvr"]), str(runs["dp"]), "--output", str(target)]) == 0
    page = parse(target.read_text(encoding="utf-8"))
    assert list(page.sections) == list(COMPARISON_SECTIONS)
    assert page.scripts == 0 and all(s.startswith("data:image/png") for s in page.links)
    finals = page.table("final")
    models = page.header("final")[2:]
    for row, folder in zip(finals, (runs["lvr"], runs["dp"])):
        header, rows = cells(folder / "metrics.csv")
        col = {c: i for i, c in enumerate(header)}
        last = {r[col["task"]]: r for r in rows}
        assert row[1] == max(r[col["round"]] for r in rows)
        assert row[2:] == [last[m][col["accuracy"]] if m in last else "" for m in models]
    differ = dict((r[0], r[1:]) for r in page.table("settings"))
    assert differ["strategy"] == ["lvr", "mfa-rr"] and differ["dp"] == ["", "server-fixed"]
    for row in page.table("mean-accuracy"):
        for folder, cell in zip((runs["lvr"], runs["dp"]), row[1:]):
            header, rows = cells(folder / "metrics.csv")
            col = {c: i for i, c in enumerate(header)}
            accs = [float(r[col["accuracy"]]) for r in rows if r[col["round"]] == row[0]]
            assert cell == (repr(sum(accs) / len(accs)) if accs else "")


def test_the_comparison_sums_uploads_and_rejections_per_round_as_metrics_csv(runs, tmp_path):
    target = tmp_path / "cmp.html"
    assert cli.main(["report", str(runs["lvr"]), str(runs["dp"]), "--output", str(target)]) == 0
    page = parse(target.read_text(encoding="utf-8"))
    assert len(page.images("model-curves")) == 1
    folders = (runs["lvr"], runs["dp"])
    table = page.table("uploads-rejections")
    assert table
    for row in table:
        for i, folder in enumerate(folders):
            header, rows = cells(folder / "metrics.csv")
            col = {c: j for j, c in enumerate(header)}
            mine = [r for r in rows if r[col["round"]] == row[0]]
            for k, key in enumerate(("uploads", "rejected")):
                assert row[1 + 2 * i + k] == str(sum(int(r[col[key]]) for r in mine))


def test_mmfl_report_rewrites_a_run_report(runs, capsys):
    out = runs["dp"]
    before = (out / "report.html").read_text()
    (out / "report.html").unlink()
    assert cli.main(["report", str(out)]) == 0
    after = (out / "report.html").read_text()
    strip = lambda t: t[: t.rindex("<p class=")]  # noqa: E731 - the time it was written
    assert (
        strip(after).split("This report was written with")[0]
        == strip(before).split("This report was written with")[0]
    )


def test_no_report_writes_none(tmp_path):
    out = tmp_path / "run"
    runner.run(
        Settings(**{**RUNS["lvr"], "num_rounds": 1}, output_dir=str(out), no_report=True),
        engine="inprocess",
    )
    assert (out / "metrics.csv").is_file() and not (out / "report.html").exists()


@pytest.mark.parametrize("case", ["missing", "not-a-run", "output-is-a-folder", "twice"])
def test_bad_input_is_one_line_exit_2_and_nothing_overwritten(runs, tmp_path, capsys, case):
    (tmp_path / "empty").mkdir()
    keep = tmp_path / "keep.html"
    keep.write_text("old")
    args = {
        "missing": [str(tmp_path / "nope"), "--output", str(keep)],
        "not-a-run": [str(tmp_path / "empty"), "--output", str(keep)],
        "output-is-a-folder": [str(runs["lvr"]), "--output", str(tmp_path / "empty")],
        "twice": [str(runs["lvr"]), str(runs["lvr"]), "--output", str(keep)],
    }[case]
    assert cli.main(["report", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mmfl report: error: "), err
    assert keep.read_text() == "old"
    assert not list((tmp_path / "empty").iterdir())


def test_the_final_plot_of_a_preset_run_is_titled_by_its_preset(tmp_path, monkeypatch):
    """The fresh-run clean-up loop reused the strategy name's variable, so the
    final accuracy.png of every fresh preset run was titled "MMFL accuracy.png"
    (and lost its budget fraction): write_outputs got strategy_name="accuracy.png"."""
    from mmfl_flwr import results

    seen = []
    real = results.write_outputs

    def spy(result, settings, output_dir, strategy_name=None, **kw):
        seen.append(strategy_name)
        return real(result, settings, output_dir, strategy_name=strategy_name, **kw)

    monkeypatch.setattr(results, "write_outputs", spy)
    s = Settings(**{**RUNS["lvr"], "num_rounds": 1}, output_dir=str(tmp_path / "run"))
    runner.run(s, engine="inprocess")
    assert seen == [None]
    title = results.run_title(s, seen[0])
    assert title.startswith("MMFL lvr, seed 2") and "budget fraction 0.6" in title
