"""The HTML report comparing several runs (``mmfl report DIR DIR ...``): the
runs, the settings that differ, the final accuracies, the curves (mean over the
models, and per model), the mean accuracy per round, uploads and rejections, and
the versions. :func:`mmfl_flwr.report.write_report` writes it; the sections are
:data:`mmfl_flwr.report.COMPARISON_SECTIONS`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

from mmfl_flwr.report_html import (
    RunFolder,
    _fmt,
    _page,
    _png,
    _section,
    _table,
    _versions_section,
)


def comparison_html(folders: Sequence[str | os.PathLike[str]]) -> str:
    """The HTML report comparing the runs in ``folders``."""
    runs = [RunFolder(f) for f in folders]
    labels = _labels(runs)
    models = list(dict.fromkeys(m for r in runs for m in r.models))
    rounds = sorted({int(r["round"]) for run in runs for r in run.rows})
    parts = [
        _runs_section(runs, labels),
        _differ_section(runs, labels),
        _final_section(runs, labels, models),
        _section("curves", "Curves", _png(_comparison_figure(runs, labels))),
        _section(
            "model-curves", "Accuracy per model", _png(_per_model_figure(runs, labels, models))
        ),
        _mean_section(runs, labels, rounds),
        _totals_section(runs, labels, rounds),
        _versions_section([(lab, r.summary) for lab, r in zip(labels, runs)]),
    ]
    return _page(f"Comparison of {len(runs)} MMFL runs", "".join(parts))


def _runs_section(runs: Sequence[RunFolder], labels: Sequence[str]) -> str:
    """The runs compared: label, folder, strategy, seed, rounds and status."""
    return _section(
        "runs",
        "Runs",
        _table(
            ["run", "folder", "strategy", "seed", "rounds", "status"],
            [
                [
                    lab,
                    r.folder.resolve(),
                    r.config.get("strategy", ""),
                    r.config.get("seed", ""),
                    r.last_round,
                    "finished" if r.finished else "not finished",
                ]
                for lab, r in zip(labels, runs)
            ],
            left=3,
        ),
    )


def _differ_section(runs: Sequence[RunFolder], labels: Sequence[str]) -> str:
    """The settings (and the engine) whose values differ between the runs."""
    keys = sorted({k for r in runs for k in r.config} | {"engine"})
    differ = []
    for k in keys:
        values = [(r.engine if k == "engine" else r.config.get(k)) for r in runs]
        if len({json.dumps(v, sort_keys=True) for v in values}) > 1:
            differ.append([k, *(_fmt(v) for v in values)])
    return _section(
        "settings",
        "Settings that differ",
        _table(["setting", *labels], differ)
        if differ
        else "<p>None: the runs share every setting.</p>",
    )


def _final_section(runs: Sequence[RunFolder], labels: Sequence[str], models: Sequence[str]) -> str:
    """Each run's last round and its accuracy per model, as written in metrics.csv."""
    final_rows = []
    for lab, r in zip(labels, runs):
        last: dict[str, dict[str, str]] = {}
        for row in r.cells:
            last[row["task"]] = row
        final_rows.append(
            [lab, r.last_round, *(last.get(m, {}).get("accuracy", "") for m in models)]
        )
    return _section(
        "final",
        "Final accuracy per model (metrics.csv, last round)",
        _table(["run", "round", *models], final_rows),
    )


def _mean_section(runs: Sequence[RunFolder], labels: Sequence[str], rounds: list[int]) -> str:
    """Each run's accuracy averaged over its models, per round."""
    means = [_mean_accuracy(r) for r in runs]
    return _section(
        "mean-accuracy",
        "Mean accuracy over the models per round",
        _table(
            ["round", *labels],
            [[rnd, *(_fmt(m.get(rnd)) for m in means)] for rnd in rounds],
            left=0,
        ),
    )


def _totals_section(runs: Sequence[RunFolder], labels: Sequence[str], rounds: list[int]) -> str:
    """Each run's uploads and rejections per round, summed over its models."""
    totals = [_totals(r) for r in runs]
    return _section(
        "uploads-rejections",
        "Uploads and rejections per round (summed over the models)",
        _table(
            ["round", *(f"{lab}: {k}" for lab in labels for k in ("uploads", "rejected"))],
            [
                [
                    rnd,
                    *(t.get(rnd, {}).get(k, "") for t in totals for k in ("uploads", "rejected")),
                ]
                for rnd in rounds
                if rnd > 0
            ],
            left=0,
        ),
    )


def _totals(run: RunFolder) -> dict[int, dict[str, int]]:
    """Round -> uploads and rejected summed over the run's models."""
    out: dict[int, dict[str, int]] = {}
    for r in run.rows:
        cell = out.setdefault(int(r["round"]), {"uploads": 0, "rejected": 0})
        for k in cell:
            v = r.get(k, math.nan)
            if isinstance(v, (int, float)) and math.isfinite(v):
                cell[k] += int(v)
    return out


def _per_model_figure(
    runs: Sequence[RunFolder], labels: Sequence[str], models: Sequence[str]
) -> Any:
    """One accuracy panel per model, a curve per run."""
    from mmfl_flwr.results import new_figure

    fig = new_figure((8.5, 1.0 + 2.2 * max(len(models), 1)), layout="constrained")
    axes = fig.subplots(max(len(models), 1), 1, sharex=True, squeeze=False)[:, 0]
    for ax, m in zip(axes, models):
        for i, (run, lab) in enumerate(zip(runs, labels)):
            pts = [
                (int(r["round"]), r["accuracy"])
                for r in run.rows
                if r["task"] == m and not math.isnan(r["accuracy"])
            ]
            if pts:
                ax.plot(*zip(*pts), marker=".", color=f"C{i % 10}", label=lab)
        ax.set_ylabel(f"{m}\ntest accuracy")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("round")
    handles, names = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="outside right upper", fontsize="small")
    return fig


def _labels(runs: Sequence[RunFolder]) -> list[str]:
    """A distinct label per run: strategy and seed, then the folder name or a number."""
    labels = [f"{r.config.get('strategy', '?')} seed {r.config.get('seed', '?')}" for r in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{lab} ({r.folder.name})" for lab, r in zip(labels, runs)]
    if len(set(labels)) < len(labels):
        labels = [f"{lab} #{i + 1}" for i, lab in enumerate(labels)]
    return labels


def _mean_accuracy(run: RunFolder) -> dict[int, float]:
    """Round -> the run's accuracy averaged over the models evaluated that round."""
    by: dict[int, list[float]] = {}
    for r in run.rows:
        if not math.isnan(r["accuracy"]):
            by.setdefault(int(r["round"]), []).append(r["accuracy"])
    return {k: sum(v) / len(v) for k, v in by.items()}


def _comparison_figure(runs: Sequence[RunFolder], labels: Sequence[str]) -> Any:
    """Mean accuracy and mean loss over the models, a curve per run."""
    from mmfl_flwr.results import new_figure, style_panels

    fig = new_figure((8.5, 6.4), layout="constrained")
    ax_acc, ax_loss = fig.subplots(2, 1, sharex=True)
    for i, (run, lab) in enumerate(zip(runs, labels)):
        acc = _mean_accuracy(run)
        by: dict[int, list[float]] = {}
        for r in run.rows:
            if not math.isnan(r["loss"]):
                by.setdefault(int(r["round"]), []).append(r["loss"])
        color = f"C{i % 10}"
        if acc:
            ax_acc.plot(
                sorted(acc), [acc[k] for k in sorted(acc)], marker=".", color=color, label=lab
            )
        if by:
            ax_loss.plot(
                sorted(by), [sum(by[k]) / len(by[k]) for k in sorted(by)], marker=".", color=color
            )
    style_panels(ax_acc, ax_loss, "mean test accuracy over models", "mean test loss")
    handles, names = ax_acc.get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="outside right upper", fontsize="small")
    return fig
