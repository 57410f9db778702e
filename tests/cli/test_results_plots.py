"""The run outputs for researchers: ``accuracy.png`` (two panels, a title naming
the strategy, seed and key settings, the legend outside the data), drawn without
touching matplotlib's global backend, and ``summary.json``'s ``versions``."""

from __future__ import annotations

import importlib.metadata
import json
import math
import platform
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import matplotlib
import pytest

import mmfl_flwr
from mmfl_flwr import results
from mmfl_flwr.config import Settings
from mmfl_flwr.results import (
    accuracy_figure,
    plot_accuracy,
    run_title,
    run_versions,
    write_outputs,
)
from mmfl_flwr.strategy import MultiModelResult

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PACKAGE_DIR = Path(mmfl_flwr.__file__).resolve().parent

ACC = {"digits": [0.1, 0.4, 0.7], "synthetic": [0.3, 0.5, 0.6], "digits_2": [0.2, 0.3, 0.8]}
LOSS = {"digits": [2.3, 1.5, 0.9], "synthetic": [1.2, 1.0, 0.7], "digits_2": [2.2, 1.9, 1.1]}


def _history() -> list[dict]:
    return [
        {
            "round": r,
            "task": t,
            "accuracy": ACC[t][r],
            "loss": LOSS[t][r],
            "uploads": 1,
            "assigned": 1,
            "rejected": 0,
            "train_loss": math.nan,
            "step_l1": 0.0,
        }
        for r in range(3)
        for t in ACC
    ]


def _settings(**kw) -> Settings:
    base = {
        "strategy": "lvr",
        "seed": 7,
        "num_clients": 10,
        "num_rounds": 2,
        "local_epochs": 3,
        "budget_fraction": 0.25,
    }
    base.update(kw)
    return Settings(**base)


def _figure_box(fig, artist):
    return artist.get_window_extent().transformed(fig.transFigure.inverted())


def test_png_has_two_panels_accuracy_with_mean_and_loss(tmp_path):
    path = tmp_path / "accuracy.png"
    fig = plot_accuracy(_history(), path, _settings())
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert len(fig.axes) == 2
    ax_acc, ax_loss = fig.axes
    assert ax_acc.get_ylabel() == "test accuracy" and ax_loss.get_ylabel() == "test loss"

    acc_lines = {line.get_label(): list(line.get_ydata()) for line in ax_acc.get_lines()}
    assert set(acc_lines) == set(ACC) | {"mean of models"}
    for task, ys in ACC.items():
        assert acc_lines[task] == pytest.approx(ys)
    means = [sum(ACC[t][r] for t in ACC) / 3 for r in range(3)]
    assert acc_lines["mean of models"] == pytest.approx(means)

    loss_lines = {line.get_label(): list(line.get_ydata()) for line in ax_loss.get_lines()}
    assert set(loss_lines) == set(LOSS)
    for task, ys in LOSS.items():
        assert loss_lines[task] == pytest.approx(ys)
    # one colour per model in both panels
    colours = {line.get_label(): line.get_color() for line in ax_acc.get_lines()}
    for line in ax_loss.get_lines():
        assert line.get_color() == colours[line.get_label()]


def test_nan_rows_are_left_out(tmp_path):
    hist = _history()
    hist[0]["accuracy"] = math.nan  # digits not evaluated at round 0
    hist[0]["loss"] = math.nan
    fig = accuracy_figure(hist, _settings())
    ax_acc, ax_loss = fig.axes
    lines = {line.get_label(): line for line in ax_acc.get_lines()}
    assert list(lines["digits"].get_xdata()) == [1, 2]
    # the round-0 mean is over the two evaluated models
    assert lines["mean of models"].get_ydata()[0] == pytest.approx((0.3 + 0.2) / 2)
    loss = {line.get_label(): line for line in ax_loss.get_lines()}
    assert list(loss["digits"].get_xdata()) == [1, 2]


def test_title_names_strategy_seed_and_key_settings():
    title = accuracy_figure(_history(), _settings()).get_suptitle()
    assert "lvr" in title and "seed 7" in title
    for part in ("10 clients", "2 rounds", "3 local epochs", "budget fraction 0.25"):
        assert part in title, (part, title)
    assert "clients/round" not in title  # lvr has no clients-per-round

    title = run_title(Settings(strategy="mfa-rr", seed=3, clients_per_round=4, local_epochs=1))
    assert "mfa-rr" in title and "seed 3" in title
    assert "4 clients/round" in title and "1 local epoch" in title
    assert "budget fraction" not in title  # mfa-rr has no budget
    # clients-per-round 0 (all clients) is not a setting worth a word
    assert "clients/round" not in run_title(Settings(strategy="mfa-rr"))
    # a custom strategy is named by what the server app passes
    title = run_title(_settings(), "custom MFARand + FedAvgAggregator")
    assert "custom MFARand + FedAvgAggregator" in title and "seed 7" in title
    assert "lvr" not in title
    # no settings: still a title (old callers)
    assert accuracy_figure(_history()).get_suptitle() == "MMFL run"


def test_legend_is_outside_both_panels_and_inside_the_figure():
    fig = accuracy_figure(_history(), _settings())
    fig.canvas.draw()
    assert len(fig.legends) == 1
    assert all(ax.get_legend() is None for ax in fig.axes)
    legend = _figure_box(fig, fig.legends[0])
    for ax in fig.axes:
        box = _figure_box(fig, ax)
        assert not legend.overlaps(box), (legend, box)
        assert legend.x0 >= box.x1  # to the right of the data
    assert legend.x0 >= 0 and legend.y0 >= 0 and legend.x1 <= 1 and legend.y1 <= 1
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == list(ACC) + ["mean of models"]


def test_drawing_leaves_the_global_backend_alone(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("matplotlib.use called by the library")

    monkeypatch.setattr(matplotlib, "use", refuse)
    monkeypatch.setitem(matplotlib.rcParams, "backend", "svg")  # a sentinel, not Agg
    plot_accuracy(_history(), tmp_path / "accuracy.png", _settings())
    results.write_cluster_step(
        {
            "round": 3,
            "k": 2,
            "clients": ["0", "1", "2"],
            "labels": [0, 1, 0],
            "features": [[1.0, 2.0], [3.0, 1.0], [1.5, 2.5]],
        },
        tmp_path,
    )
    assert matplotlib.rcParams["backend"] == "svg"
    assert (tmp_path / "clusters_round_3.png").read_bytes().startswith(PNG_SIGNATURE)


def test_no_pyplot_and_no_backend_choice_in_a_fresh_interpreter(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        import matplotlib
        matplotlib.use = None  # any call fails
        from mmfl_flwr.results import plot_accuracy, write_cluster_step
        rows = [{{"round": r, "task": "m", "accuracy": 0.5, "loss": 1.0}} for r in range(3)]
        plot_accuracy(rows, {str(tmp_path / "a.png")!r})
        write_cluster_step({{"round": 1, "k": 1, "clients": ["0", "1"], "labels": [0, 0],
                            "features": [[1.0, 2.0], [2.0, 1.0]]}}, {str(tmp_path)!r})
        assert "matplotlib.pyplot" not in sys.modules, "pyplot imported"
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_library_never_sets_a_backend():
    pattern = re.compile(
        r"matplotlib\.use\(|import matplotlib\.pyplot|from matplotlib import pyplot"
    )
    offenders = [str(p) for p in PACKAGE_DIR.rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []


def _git_head(folder: Path) -> str | None:
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else None


def test_summary_json_records_the_versions(tmp_path):
    result = MultiModelResult(history=_history(), assignments={1: [("0", "digits", 1)]})
    write_outputs(result, _settings(), tmp_path)
    versions = json.loads((tmp_path / "summary.json").read_text())["versions"]
    assert set(versions) == {"mmfl-flwr", "flwr", "torch", "numpy", "python", "git_commit"}
    for dist in ("mmfl-flwr", "flwr", "torch", "numpy"):
        assert versions[dist] == importlib.metadata.version(dist), dist
    assert versions["python"] == platform.python_version()
    # this test runs from a checkout (the commit) or an install (null)
    tracked = (
        shutil.which("git") is not None
        and subprocess.run(
            ["git", "ls-files", "--error-unmatch", "--", "mmfl_flwr/__init__.py"],
            cwd=PACKAGE_DIR.parent,
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    if tracked:
        assert versions["git_commit"] == _git_head(PACKAGE_DIR.parent)
        assert len(versions["git_commit"]) == 40
    else:
        assert versions["git_commit"] is None
    # the PNG is still there, under its name
    assert (tmp_path / "accuracy.png").read_bytes().startswith(PNG_SIGNATURE)


def test_versions_of_missing_distributions_are_null(monkeypatch):
    real = importlib.metadata.version

    def version(name):
        if name in ("torch", "mmfl-flwr"):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    v = run_versions()
    assert v["torch"] is None
    assert v["mmfl-flwr"] == mmfl_flwr.__version__  # the fallback
    assert v["flwr"] == real("flwr")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_commit_only_for_a_package_tracked_in_a_checkout(tmp_path):
    git = [
        "git",
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.org",
        "-c",
        "commit.gpgsign=false",
    ]
    # not in any repository
    (tmp_path / "plain" / "pkg").mkdir(parents=True)
    (tmp_path / "plain" / "pkg" / "__init__.py").write_text("")
    assert results._git_commit(tmp_path / "plain" / "pkg") is None

    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("")
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    # inside a repository but untracked (an install into a repo's virtualenv)
    (repo / "README").write_text("x")
    subprocess.run([*git, "add", "README"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "one"], cwd=repo, check=True)
    assert results._git_commit(repo / "pkg") is None
    # tracked: the commit
    subprocess.run([*git, "add", "pkg/__init__.py"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "two"], cwd=repo, check=True)
    assert results._git_commit(repo / "pkg") == _git_head(repo)


def test_title_shows_the_effective_value_of_automatic_settings():
    """What was used is what the title says (issue 25): budget-fraction 0 and
    clients-per-round 0 show the values the run used, marked (auto)."""
    title = run_title(Settings(strategy="lvr"), effective={"budget-fraction": 0.25})
    assert "budget fraction 0.25 (auto)" in title and "budget fraction 0," not in title
    title = run_title(Settings(strategy="ranklist-ucb"), effective={"clients-per-round": 15})
    assert "15 clients/round (auto)" in title
    title = run_title(Settings(strategy="mfa-rr"), effective={"clients-per-round": "all clients"})
    assert "clients/round: all clients" in title
    # typed values are shown as typed
    title = run_title(Settings(strategy="lvr", budget_fraction=0.5), effective={})
    assert "budget fraction 0.5" in title and "(auto)" not in title


@pytest.mark.parametrize(
    "strategy, key, expected",
    [
        ("lvr", "budget-fraction", None),  # computed from the federation: checked > 0
        ("ranklist-ucb", "clients-per-round", 15),  # min(20 clients, 5 x 3 models)
        ("mfa-rr", "clients-per-round", "all clients"),
    ],
)
def test_config_and_summary_record_the_effective_values(strategy, key, expected, tmp_path):
    """config.json and summary.json hold the value the run used for each automatic
    setting next to what was typed (0), and config.json still loads as settings."""
    import json

    from mmfl_flwr.config import Settings as S
    from mmfl_flwr.flower_app.data import resolved_budget
    from mmfl_flwr.runner import run

    s = S(strategy=strategy, num_rounds=1, local_epochs=1, output_dir=str(tmp_path))
    run(s, engine="inprocess")
    config = json.loads((tmp_path / "config.json").read_text())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert config[key] == 0 and summary["config"][key] == 0  # as typed
    if expected is None:
        expected = resolved_budget(s).budget_fraction
        assert expected > 0
    assert config["effective"][key] == expected
    assert summary["effective"] == config["effective"]
    assert S.load(str(tmp_path / "config.json")) == s


def _squares_and_crosses(fig):
    ax = fig.axes[0]
    squares = crosses = 0
    for coll in ax.collections:
        marker = coll.get_paths()[0] if coll.get_paths() else None
        n = len(coll.get_offsets())
        # scatter with marker "x" has an open path of 4 vertices (2 strokes)
        if (
            marker is not None
            and len(marker.vertices) == 4
            and marker.codes is not None
            and list(marker.codes).count(1) == 2
        ):
            crosses += n
        else:
            squares += n
    return squares, crosses


def test_who_trained_what_draws_every_part_and_crosses_out_the_rejected_ones():
    from mmfl_flwr.results import assignments_figure

    assignments = {
        1: [("0", "a", 1), ("1", "a", 1), ("1", "b", 1)],
        2: [("10", "b", 2), ("2", "a", 1)],
    }
    rejections = {1: [("1", "b")], 2: [("10", "b")]}
    fig = assignments_figure(assignments, rejections, ["a", "b"])
    assert _squares_and_crosses(fig) == (5, 2)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2", "10"]
    assert ax.get_xlabel() == "round" and ax.get_ylabel() == "client"
    assert "Who trained what: 4 clients x 2 rounds" in fig.get_suptitle()
    # too many clients to draw: a summary per round, parts per model stacked
    many = {1: [(str(c), "a", 1) for c in range(70)] + [("0", "b", 2)]}
    fig = assignments_figure(many, {1: [("3", "a")]}, ["a", "b"], max_clients=60)
    ax = fig.axes[0]
    heights = sorted(p.get_height() for p in ax.patches)
    assert heights == [2.0, 70.0]
    assert "summed per model" in fig.get_suptitle()
    assert list(ax.get_lines()[0].get_ydata()) == [1]


def test_training_figure_shows_uploads_rejections_and_training_loss_per_model():
    from mmfl_flwr.results import training_figure

    hist = [
        {
            "round": r,
            "task": t,
            "uploads": u,
            "rejected": j,
            "train_loss": tl,
            "accuracy": 0.5,
            "loss": 1.0,
        }
        for r, t, u, j, tl in [
            (0, "a", 0, 0, math.nan),
            (1, "a", 3, 1, 0.9),
            (2, "a", 4, 0, 0.5),
            (0, "b", 0, 0, math.nan),
            (1, "b", 2, 0, 1.5),
            (2, "b", 2, 2, 1.2),
        ]
    ]
    fig = training_figure(hist)
    axes = fig.axes
    assert [ax.get_ylabel().split("\n")[0] for ax in axes] == [
        "updates aggregated",
        "parts rejected",
        "training loss",
    ]
    lines = {
        (i, ln.get_label()): list(ln.get_ydata())
        for i, ax in enumerate(axes)
        for ln in ax.get_lines()
    }
    assert lines[(0, "a")] == [3, 4] and lines[(1, "b")] == [0, 2]
    assert lines[(2, "b")] == [1.5, 1.2]
    assert fig.get_suptitle() and axes[-1].get_xlabel() == "round"


def test_a_fresh_run_titles_its_plot_with_the_strategy_not_a_file_name(tmp_path, monkeypatch):
    """Issue 62: a fresh run's accuracy.png was titled "MMFL accuracy.png, seed
    0" (the server app's loop over the old files overwrote the title's name)."""
    from mmfl_flwr.runner import run

    titles: list[str] = []
    real = results.run_title

    def recording(*args, **kwargs):
        titles.append(real(*args, **kwargs))
        return titles[-1]

    monkeypatch.setattr(results, "run_title", recording)
    s = Settings(
        strategy="lvr",
        tasks="digits",
        num_clients=6,
        num_rounds=1,
        local_epochs=1,
        seed=3,
        output_dir=str(tmp_path),
    )
    run(s, engine="inprocess")
    assert titles, "no plot title was drawn"
    for title in titles:
        assert title.startswith("MMFL lvr, seed 3\n"), title
        assert "6 clients" in title and "budget fraction" in title, title


def test_who_trained_what_counts_the_clients_that_never_trained():
    """Issue 62: a 12-client run where 2 clients never trained said "10 clients";
    with the run's client count, they are counted (and drawn as empty rows)."""
    from mmfl_flwr.results import assignments_figure

    assignments = {r: [(str(c), "a", 1) for c in range(10)] for r in (1, 2, 3)}
    fig = assignments_figure(assignments, {}, ["a"], num_clients=12)
    assert "Who trained what: 12 clients x 3 rounds (2 never trained)" in fig.get_suptitle()
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(c) for c in range(12)]
    assert _squares_and_crosses(fig) == (30, 0)
    # every client trained: the title as before
    fig = assignments_figure(assignments, {}, ["a"], num_clients=10)
    assert "Who trained what: 10 clients x 3 rounds" in fig.get_suptitle()
    assert "never trained" not in fig.get_suptitle()


def test_write_outputs_passes_the_run_client_count_to_who_trained_what(tmp_path, monkeypatch):
    seen: list[str] = []
    real = results.assignments_figure

    def recording(*args, **kwargs):
        fig = real(*args, **kwargs)
        seen.append(fig.get_suptitle())
        return fig

    monkeypatch.setattr(results, "assignments_figure", recording)
    res = MultiModelResult(
        history=_history(),
        assignments={1: [("0", "digits", 1)], 2: [("1", "digits", 1)]},
    )
    write_outputs(res, _settings(num_clients=5), tmp_path)
    assert seen == ["Who trained what: 5 clients x 2 rounds (3 never trained)"]


def _int_ticks(ax) -> bool:
    ax.figure.canvas.draw()
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
    return bool(ticks) and all(float(t).is_integer() for t in ticks)


def test_training_figure_counts_on_integer_ticks_and_no_empty_rejected_panel():
    """Issue 62: fractional ticks on the count panels; an all-zero "rejected"
    panel when nothing was rejected (now left out, and the title says so)."""
    from mmfl_flwr.results import training_figure

    def hist(rejected):
        return [
            {"round": r, "task": "a", "uploads": u, "rejected": j, "train_loss": 1.0 / (r + 1)}
            for r, u, j in [(0, 0, 0), (1, 3, rejected), (2, 4, 0)]
        ]

    fig = training_figure(hist(1))
    assert len(fig.axes) == 3
    assert _int_ticks(fig.axes[0]) and _int_ticks(fig.axes[1])
    fig = training_figure(hist(0))
    assert [ax.get_ylabel().split("\n")[0] for ax in fig.axes] == [
        "updates aggregated",
        "training loss",
    ]
    assert _int_ticks(fig.axes[0])
    assert "none rejected or missing" in fig.get_suptitle()
