"""Compare finished runs: ``mmfl compare DIR [DIR ...]``.

Each DIR is a run's output folder (``metrics.csv`` and ``summary.json``, as
:func:`mmfl_flwr.results.write_outputs` writes them). Runs are grouped by the
strategy of their ``summary.json`` config. For every run and round the accuracy
(and loss) is averaged over the run's models; per strategy and round these run
means are then averaged over the strategy's runs (its seeds), with their sample
standard deviation (``n - 1``) where at least two runs have that round.

The result is one CSV (``strategy, round, runs, accuracy_mean, accuracy_std,
loss_mean, loss_std``; a std is empty with a single run) and one PNG: an
accuracy panel and a loss panel, one curve per strategy, a band of mean ± 1 sd
where several runs share the strategy.

Wiring into a command line (``argparse``)::

    compare.add_parser(subparsers)
    ...
    if args.command == "compare":
        return compare.main(args)
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import warnings
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

#: Columns of the comparison CSV, in this order.
CSV_COLUMNS = [
    "strategy",
    "round",
    "runs",
    "accuracy_mean",
    "accuracy_std",
    "loss_mean",
    "loss_std",
]

#: Settings that may differ between runs of one strategy without a warning.
_MAY_DIFFER = {
    "seed",
    "output-dir",
    "overwrite",
    "resume-from",
    "timeout",
    # how a run is watched, not what it computes
    "log-to",
    "log-dir",
    "log-clients-every",
    "no-progress",
    "no-report",
}


class _Run:
    """One run folder, read: its strategy, seed, config and per-round means
    over models (NaN where no model has a finite value in that round)."""

    def __init__(
        self,
        folder: Path,
        strategy: str,
        seed: Any,
        config: dict[str, Any],
        accuracy: dict[int, float],
        loss: dict[int, float],
    ) -> None:
        self.folder = folder
        self.strategy = strategy
        self.seed = seed
        self.config = config
        self.accuracy = accuracy
        self.loss = loss


def _mean_over_models(rows: Sequence[dict[str, Any]], key: str) -> dict[int, float]:
    """Round -> mean of ``key`` over the models with a finite value in that round."""
    by_round: dict[int, list[float]] = {}
    for row in rows:
        rnd = int(row["round"])
        by_round.setdefault(rnd, [])
        value = row.get(key, math.nan)
        if isinstance(value, (int, float)) and math.isfinite(value):
            by_round[rnd].append(float(value))
    return {r: (sum(v) / len(v) if v else math.nan) for r, v in by_round.items()}


def read_run(folder: str | os.PathLike[str]) -> _Run:
    """Read one run folder; ValueError (one line naming the folder) when it is
    not a folder or lacks a readable ``metrics.csv`` / ``summary.json``."""
    from mmfl_flwr.results import read_metrics_csv

    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"{folder}: not a folder (expected a run's output folder)")
    for name in ("metrics.csv", "summary.json"):
        if not (path / name).is_file():
            raise ValueError(
                f"{folder}: no {name} (expected a run's output folder, as written by mmfl run)"
            )
    try:
        with open(path / "summary.json") as f:
            summary = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"{folder}: summary.json is not readable JSON ({err})") from err
    config = summary.get("config") if isinstance(summary, dict) else None
    strategy = config.get("strategy") if isinstance(config, dict) else None
    if not strategy or not isinstance(strategy, str):
        raise ValueError(f"{folder}: summary.json has no config with a strategy")
    try:
        rows = read_metrics_csv(path / "metrics.csv")
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"{folder}: metrics.csv is not readable ({err})") from err
    if not rows:
        raise ValueError(f"{folder}: metrics.csv has no rows")
    missing = [c for c in ("round", "task", "accuracy", "loss") if c not in rows[0]]
    if missing:
        raise ValueError(f"{folder}: metrics.csv lacks the column(s) {', '.join(missing)}")
    assert isinstance(config, dict)
    if summary.get("engine"):  # older runs lack it; where present, compared like a setting
        config = {**config, "engine": summary["engine"]}
    seed = summary.get("seed", config.get("seed"))
    return _Run(
        path,
        strategy,
        seed,
        config,
        _mean_over_models(rows, "accuracy"),
        _mean_over_models(rows, "loss"),
    )


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation of the finite ``values`` (None where
    undefined: no value, or fewer than two values for the std)."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return None, None
    mean = statistics.fmean(vals)
    return mean, (statistics.stdev(vals) if len(vals) >= 2 else None)


#: Settings that name a folder: equal when they name the same one.
_PATH_KEYS = {"data-root"}


def _value_key(key: str, value: Any) -> str:
    """A comparable form of a setting's value (a folder by its real path)."""
    if key in _PATH_KEYS and isinstance(value, str) and value:
        return os.path.realpath(value)
    return json.dumps(value, sort_keys=True)


def differing_settings(
    runs: Sequence[_Run], ignore: AbstractSet[str] = frozenset()
) -> dict[str, list[Any]]:
    """Setting -> its distinct values (in run order), for every setting other than
    the seed, the locations and ``ignore`` on which ``runs`` disagree (a folder
    spelled two ways is one value)."""
    keys = sorted({k for r in runs for k in r.config} - _MAY_DIFFER - set(ignore))
    out: dict[str, list[Any]] = {}
    for k in keys:
        seen: dict[str, Any] = {}
        for r in runs:
            seen.setdefault(_value_key(k, r.config.get(k)), r.config.get(k))
        if len(seen) > 1:
            out[k] = list(seen.values())
    return out


def describe_differences(differ: dict[str, list[Any]]) -> str:
    """``local-epochs (1, 5); lr (0.1, 0.05)``."""
    return "; ".join(f"{k} ({', '.join(str(v) for v in vals)})" for k, vals in differ.items())


def _check_groups(groups: dict[str, list[_Run]]) -> None:
    """Warn where runs of one strategy are not seeds of one experiment."""
    for strategy, runs in groups.items():
        seeds = [r.seed for r in runs]
        repeated = sorted({str(s) for s in seeds if seeds.count(s) > 1})
        if repeated:
            warnings.warn(
                f"strategy {strategy}: several runs with seed {', '.join(repeated)}",
                stacklevel=3,
            )
        differ = list(differing_settings(runs))
        if differ:
            warnings.warn(
                f"strategy {strategy}: its runs differ in {', '.join(differ)}",
                stacklevel=3,
            )


def aggregate(runs: Sequence[_Run]) -> list[dict[str, Any]]:
    """Rows of the comparison (keys :data:`CSV_COLUMNS`), per strategy (in the
    order of first appearance) and round. Undefined numbers are None."""
    groups: dict[str, list[_Run]] = {}
    for run in runs:
        groups.setdefault(run.strategy, []).append(run)
    _check_groups(groups)
    out = []
    for strategy, members in groups.items():
        rounds = sorted({r for run in members for r in run.accuracy})
        for rnd in rounds:
            present = [run for run in members if rnd in run.accuracy]
            acc_mean, acc_std = _mean_std([run.accuracy[rnd] for run in present])
            loss_mean, loss_std = _mean_std([run.loss[rnd] for run in present])
            out.append(
                {
                    "strategy": strategy,
                    "round": rnd,
                    "runs": len(present),
                    "accuracy_mean": acc_mean,
                    "accuracy_std": acc_std,
                    "loss_mean": loss_mean,
                    "loss_std": loss_std,
                }
            )
    return out


def write_csv(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write comparison rows; None is an empty cell, floats in full precision."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for row in rows:
            cells = []
            for c in CSV_COLUMNS:
                v = row[c]
                cells.append("" if v is None else repr(v) if isinstance(v, float) else v)
            w.writerow(cells)


def plot(
    rows: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    num_runs: int,
    differ: dict[str, list[Any]] | None = None,
) -> Any:
    """Draw the comparison PNG; returns the matplotlib Figure. ``differ`` (the
    settings the runs disagree on besides strategy and seed) is named under the
    title."""
    from mmfl_flwr.results import new_figure, style_panels

    strategies: list[str] = []
    for row in rows:
        if row["strategy"] not in strategies:
            strategies.append(row["strategy"])
    fig = new_figure((8.5, 6.4), layout="constrained")
    ax_acc, ax_loss = fig.subplots(2, 1, sharex=True)
    any_band = False
    for i, strategy in enumerate(strategies):
        mine = [r for r in rows if r["strategy"] == strategy]
        most = max(r["runs"] for r in mine)
        label = f"{strategy} ({most} run{'s' if most != 1 else ''})"
        color = f"C{i % 10}"
        for ax, key in ((ax_acc, "accuracy"), (ax_loss, "loss")):
            pts = [r for r in mine if r[f"{key}_mean"] is not None]
            xs = [r["round"] for r in pts]
            ax.plot(xs, [r[f"{key}_mean"] for r in pts], marker=".", color=color, label=label)
            band = [r for r in pts if r[f"{key}_std"] is not None]
            if band:
                any_band = True
                ax.fill_between(
                    [r["round"] for r in band],
                    [r[f"{key}_mean"] - r[f"{key}_std"] for r in band],
                    [r[f"{key}_mean"] + r[f"{key}_std"] for r in band],
                    color=color,
                    alpha=0.2,
                    linewidth=0,
                )
    style_panels(
        ax_acc, ax_loss, "test accuracy\n(mean over models)", "test loss\n(mean over models)"
    )
    handles, labels = ax_acc.get_legend_handles_labels()
    if any_band:
        from matplotlib.patches import Patch

        handles.append(Patch(facecolor="0.5", alpha=0.3))
        labels.append("band: mean ± 1 sd\nover the runs (seeds)")
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    fig.suptitle(
        f"MMFL comparison of {num_runs} run{'s' if num_runs != 1 else ''}, "
        f"{len(strategies)} strateg{'ies' if len(strategies) != 1 else 'y'}: "
        "curve = mean over runs"
        + (f"\nsettings that differ: {describe_differences(differ)}" if differ else ""),
        fontsize="medium",
    )
    fig.savefig(path, dpi=110)
    return fig


def compare(
    run_dirs: Sequence[str | os.PathLike[str]],
    out_path_png: str | os.PathLike[str],
    out_path_csv: str | os.PathLike[str] | None = None,
) -> list[dict[str, Any]]:
    """Compare the runs in ``run_dirs``: write the plot to ``out_path_png`` and,
    with ``out_path_csv`` given, the table; returns the table's rows (dicts with
    the keys :data:`CSV_COLUMNS`; None for an undefined number).

    Every folder is read before anything is written. Raises ValueError (one
    line naming the folder) for a folder without ``metrics.csv`` or
    ``summary.json``, or one given twice. Runs of one strategy that repeat a
    seed or differ in other settings than the seed give a :class:`UserWarning`.
    """
    return _compare(run_dirs, out_path_png, out_path_csv)[0]


def _compare(
    run_dirs: Sequence[str | os.PathLike[str]],
    out_path_png: str | os.PathLike[str],
    out_path_csv: str | os.PathLike[str] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, list[Any]]]:
    """:func:`compare`, also returning the settings that differ between the runs
    (:func:`differing_settings`, strategy aside), so ``mmfl compare`` reads each
    folder once."""
    if not run_dirs:
        raise ValueError("no run folders to compare")
    seen: dict[Path, str] = {}
    for d in run_dirs:
        key = Path(d).resolve()
        if key in seen:
            raise ValueError(f"{d}: given twice (as {seen[key]})")
        seen[key] = str(d)
    runs = [read_run(d) for d in run_dirs]
    rows = aggregate(runs)
    differ = differing_settings(runs, ignore={"strategy"})
    for out in (out_path_png, out_path_csv):
        if out is not None:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
    if out_path_csv is not None:
        write_csv(rows, out_path_csv)
    plot(rows, out_path_png, len(runs), differ)
    return rows, differ


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``compare`` subcommand on ``subparsers`` (what
    ``ArgumentParser.add_subparsers`` returns); returns its parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "compare",
        help="compare finished runs: mean and spread over seeds per strategy",
        description=(
            "Read the metrics.csv and summary.json of each run folder, group the runs "
            "by strategy and plot, per round, the accuracy and loss averaged over the "
            "models, then over the runs (seeds) of each strategy, with a band of "
            "mean ± 1 sd where a strategy has several runs; also write the numbers "
            "as CSV."
        ),
    )
    p.add_argument(
        "dirs",
        metavar="DIR",
        nargs="+",
        help="a run's output folder (with metrics.csv and summary.json)",
    )
    p.add_argument(
        "--output",
        metavar="FILE.png",
        default="comparison.png",
        help="the plot (default: comparison.png in the current folder)",
    )
    p.add_argument(
        "--csv",
        metavar="FILE",
        default=None,
        help="the table (default: the --output path with .csv)",
    )
    return p


def main(args: argparse.Namespace) -> int:
    """Run ``mmfl compare`` for parsed ``args``; returns the exit code (0, or 2
    with one ``mmfl compare: error: ...`` line on stderr)."""
    png = Path(args.output)
    table = Path(args.csv) if args.csv else png.with_suffix(".csv")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rows, differ = _compare(args.dirs, png, table)
    except (OSError, ValueError) as err:
        print(f"mmfl compare: error: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
        return 2
    for w in caught:
        print(f"mmfl compare: warning: {w.message}", file=sys.stderr, flush=True)
    if differ:
        print(
            f"[mmfl] settings that differ between the runs (besides strategy and seed): "
            f"{describe_differences(differ)}",
            flush=True,
        )
    last: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["accuracy_mean"] is not None:
            last[row["strategy"]] = row
    for strategy, row in last.items():
        spread = f" ± {row['accuracy_std']:.4f}" if row["accuracy_std"] is not None else ""
        print(
            f"[mmfl] {strategy}: round {row['round']}, {row['runs']} run(s), "
            f"accuracy {row['accuracy_mean']:.4f}{spread}",
            flush=True,
        )
    print(f"[mmfl] comparison written to {png} and {table}", flush=True)
    return 0
