"""One self-contained HTML report per run or per comparison: ``mmfl report DIR [DIR ...]``.

A run's report (``report.html``, written at the end of ``mmfl run`` unless
``--no-report``) holds its configuration (as typed and the effective values of
the automatic settings), the final accuracy and loss, the accuracy and loss
curves per model, every row of ``metrics.csv``, who trained what, uploads and
rejections per round, the defence events (``events.csv``: counted by kind and
model, then every row), the clusters of MMFL-Group (``clusters.csv``), the privacy budget of a run
under ``dp``, and the versions of the software. A report of several runs
compares them: the settings that differ, the final accuracies and the curves.

Everything is read from the output folder (``config.json``, ``metrics.csv``,
``assignments.csv``, and where present ``summary.json``, ``events.csv``,
``clusters.csv``): a run interrupted by Ctrl-C gets a report of its finished
rounds. The HTML needs no network: the figures are PNG images inlined in base64,
no script, no external style sheet. The numbers in the tables are the cells of
the CSV files as written.

The pieces every report is built of (the folder read, :class:`RunFolder`, and
the HTML blocks) are :mod:`mmfl_flwr.report_html`; the comparison of several
runs is :mod:`mmfl_flwr.report_comparison`. Both are re-exported here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmfl_flwr.report_comparison import comparison_html as comparison_html
from mmfl_flwr.report_html import RunFolder as RunFolder
from mmfl_flwr.report_html import (
    _e,
    _fmt,
    _img,
    _page,
    _png,
    _section,
    _table,
    _versions_section,
)

#: The report of a run in its output folder.
REPORT_FILE = "report.html"
#: Up to this many clients, the report lists every client's training counts;
#: above, how many clients trained a model how many rounds.
MAX_CLIENT_ROWS = 200
#: The sections of a run's report, by their HTML id, in order.
RUN_SECTIONS = (
    "summary",
    "configuration",
    "curves",
    "metrics",
    "who-trained-what",
    "uploads-rejections",
    "defence",
    "clusters",
    "privacy",
    "versions",
)
#: The sections of a comparison's report.
COMPARISON_SECTIONS = (
    "runs",
    "settings",
    "final",
    "curves",
    "model-curves",
    "mean-accuracy",
    "uploads-rejections",
    "versions",
)

# ---------------------------------------------------------------- one run


def _settings_of(run: RunFolder) -> Any:
    from mmfl_flwr.config import Settings

    try:
        return Settings.from_run_config(run.config)
    except (ValueError, TypeError):
        return None


def _card_line(strategy: Any) -> str:
    try:
        from mmfl_flwr.core.card import _cite, card

        c = card(str(strategy))
    except (KeyError, ValueError, ImportError):
        return ""
    return f"<p>{_e(c.title)} ({_e(_cite(c.paper))}, {_e(c.section)}): {_e(c.summary)}.</p>"


def _summary_section(run: RunFolder) -> str:
    status = (
        f"finished: {run.last_round} of {run.num_rounds} rounds"
        if run.finished
        else f"interrupted or not finished: rounds 0 to {run.last_round} of {run.num_rounds} "
        "are in this report"
    )
    final: dict[str, dict[str, Any]] = {}
    for row in run.cells:
        final[row["task"]] = row
    table = _table(
        ["model", "round", "accuracy", "loss"],
        [[t, r["round"], r["accuracy"], r["loss"]] for t, r in final.items()],
    )
    mean = ""
    if run.summary and run.summary.get("mean_final_accuracy") is not None:
        mean = f"<p>Mean final accuracy: {_e(_fmt(run.summary['mean_final_accuracy']))}</p>"
    body = (
        f"<p>Status: {_e(status)}. Folder: {_e(run.folder.resolve())}. "
        f"Engine: {_e(run.engine or 'unknown')}.</p>"
    )
    return _section(
        "summary", "Summary", body + _card_line(run.config.get("strategy")) + table + mean
    )


def _config_section(run: RunFolder) -> str:
    typed = _table(["setting", "value"], [[k, _fmt(v)] for k, v in sorted(run.config.items())])
    eff = (
        _table(["setting", "value used"], [[k, _fmt(v)] for k, v in sorted(run.effective.items())])
        if run.effective
        else "<p>No automatic setting.</p>"
    )
    return _section(
        "configuration",
        "Configuration",
        "<h3>As typed (config.json)</h3>"
        + typed
        + "<h3>Effective (the automatic settings' values)</h3>"
        + eff,
    )


def _curves_section(run: RunFolder, settings: Any) -> str:
    from mmfl_flwr.results import accuracy_figure

    fig = accuracy_figure(run.rows, settings, None, run.effective)
    return _section("curves", "Accuracy and loss per model", _png(fig))


def _metrics_section(run: RunFolder) -> str:
    table = _table(run.header, [[r.get(c, "") for c in run.header] for r in run.cells], left=2)
    return _section(
        "metrics",
        "Per round and model (metrics.csv)",
        f"<details open><summary>{len(run.cells)} rows</summary>{table}</details>",
    )


def _who_section(run: RunFolder, assignments_png: bytes | None) -> str:
    from mmfl_flwr.results import assignments_figure

    assignments = run.assignments()
    if assignments_png is not None:
        figure = _img(assignments_png, "who trained what")
    elif assignments:
        figure = _png(assignments_figure(assignments, None, run.models))
    else:
        figure = "<p>No assignments.csv.</p>"
    # per round and model: the clients assigned and their parts
    per_round: dict[tuple[int, str], list[int]] = {}
    counts: dict[str, dict[str, int]] = {}
    for rnd, picks in assignments.items():
        seen: set[tuple[str, str]] = set()
        for cid, task, n in picks:
            cell = per_round.setdefault((rnd, task), [0, 0])
            cell[1] += n
            if (cid, task) not in seen:
                seen.add((cid, task))
                cell[0] += 1
                per = counts.setdefault(cid, {})
                per[task] = per.get(task, 0) + 1
    rows = [[r, t, c, p] for (r, t), (c, p) in sorted(per_round.items())]
    body = (
        figure
        + "<h3>Assigned per round</h3>"
        + _table(["round", "model", "clients", "parts"], rows, left=2)
    )
    models = run.models
    if len(counts) <= MAX_CLIENT_ROWS:
        from mmfl_flwr.core.clients import client_sort_key

        ids = sorted(counts, key=client_sort_key)
        body += "<h3>Rounds each client trained each model</h3>" + _table(
            ["client", *models], [[c, *(counts[c].get(m, 0) for m in models)] for c in ids]
        )
    else:
        hist: dict[tuple[str, int], int] = {}
        for per in counts.values():
            for m, n in per.items():
                hist[(m, n)] = hist.get((m, n), 0) + 1
        body += (
            f"<h3>How many clients trained a model how many rounds ({len(counts)} clients "
            "trained)</h3>"
            + _table(
                ["model", "rounds trained", "clients"],
                [[m, n, k] for (m, n), k in sorted(hist.items())],
                left=1,
            )
        )
    return _section("who-trained-what", "Who trained what", body)


def _uploads_section(run: RunFolder) -> str:
    from mmfl_flwr.results import training_figure

    cols = [
        c for c in ("uploads", "assigned", "rejected", "train_loss", "coef_sum") if c in run.header
    ]
    rows = [
        [r["round"], r["task"], *(r.get(c, "") for c in cols)]
        for r in run.cells
        if r["round"] != "0"
    ]
    return _section(
        "uploads-rejections",
        "Uploads and rejections per round",
        _png(training_figure(run.rows)) + _table(["round", "task", *cols], rows, left=2),
    )


def _defence_section(run: RunFolder) -> str:
    header, rows = run.csv_rows("events.csv")
    if not rows:
        body = (
            "<p>No defence event: no update was rejected, clipped or capped by the "
            "server's checks (events.csv empty or absent).</p>"
        )
    else:
        kind, task = header.index("kind"), header.index("task")
        counts: dict[tuple[str, str], int] = {}
        for r in rows:
            counts[(r[task], r[kind])] = counts.get((r[task], r[kind]), 0) + 1
        body = (
            "<p>Counted by model and kind (docs/defence-events.md says what each kind "
            "means), then every event.</p>"
            + _table(["model", "kind", "events"], [[*k, n] for k, n in sorted(counts.items())], 2)
            + _table(header, rows, left=4)
        )
    return _section("defence", "Defence events", body)


def _clusters_section(run: RunFolder) -> str:
    header, rows = run.csv_rows("clusters.csv")
    if not rows:
        return _section("clusters", "Clusters", "<p>No clustering (only MMFL-Group clusters).</p>")
    sizes: dict[tuple[str, str], int] = {}
    for rnd, _cid, g in rows:
        sizes[(rnd, g)] = sizes.get((rnd, g), 0) + 1
    body = _table(
        ["round", "cluster", "clients"],
        [[r, g, n] for (r, g), n in sorted(sizes.items(), key=lambda x: (int(x[0][0]), x[0][1]))],
        left=0,
    )
    for png in sorted(
        run.folder.glob("clusters_round_*.png"), key=lambda p: int(p.stem.rsplit("_", 1)[1])
    ):
        body += f"<h3>{_e(png.stem)}</h3>" + _img(png.read_bytes(), png.stem)
    if len(rows) <= MAX_CLIENT_ROWS * 5:
        body += (
            "<details><summary>clusters.csv</summary>" + _table(header, rows, left=0) + "</details>"
        )
    return _section("clusters", "Clusters", body)


def _privacy_section(run: RunFolder) -> str:
    dp = run.config.get("dp")
    if not dp:
        return _section("privacy", "Privacy budget", "<p>No differential privacy (dp off).</p>")
    privacy = (run.summary or {}).get("privacy")
    if not privacy:
        return _section(
            "privacy",
            "Privacy budget",
            f"<p>dp={_e(dp)}; the budget spent is in summary.json, which this run has not "
            "written (interrupted).</p>",
        )
    keys = sorted({k for p in privacy.values() for k in p})
    return _section(
        "privacy",
        "Privacy budget",
        f"<p>dp={_e(dp)}.</p>"
        + _table(
            ["model", *keys], [[t, *(_fmt(p.get(k)) for k in keys)] for t, p in privacy.items()]
        ),
    )


def run_report_html(folder: str | os.PathLike[str], assignments_png: bytes | None = None) -> str:
    """The HTML report of the run in ``folder`` (see the module docstring).
    ``assignments_png``: the who-trained-what figure already drawn (default: the
    folder's ``assignments.png`` where it is not older than ``assignments.csv``),
    else it is drawn from ``assignments.csv``."""
    from mmfl_flwr.results import run_title

    run = RunFolder(folder)
    png, table = run.folder / "assignments.png", run.folder / "assignments.csv"
    if (
        assignments_png is None
        and png.is_file()
        and table.is_file()
        and png.stat().st_mtime >= table.stat().st_mtime
    ):  # drawn by write_outputs from this assignments.csv
        assignments_png = png.read_bytes()
    settings = _settings_of(run)
    title = run_title(settings, None, run.effective).replace("\n", " — ")
    body = "".join(
        [
            _summary_section(run),
            _config_section(run),
            _curves_section(run, settings),
            _metrics_section(run),
            _who_section(run, assignments_png),
            _uploads_section(run),
            _defence_section(run),
            _clusters_section(run),
            _privacy_section(run),
            _versions_section([(str(run.folder), run.summary)]),
        ]
    )
    return _page(title, body)


# ---------------------------------------------------------------- writing


def write_report(
    folders: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str] | None = None,
    assignments_png: bytes | None = None,
) -> Path:
    """Write the report of one run folder (default ``FOLDER/report.html``) or the
    comparison of several (default ``comparison.html`` in the current folder);
    returns its path. Every folder is read before anything is written; a
    ValueError (one line naming the folder) for one that is not a run's."""
    if not folders:
        raise ValueError("no run folder given")
    seen: dict[Path, str] = {}
    for d in folders:
        key = Path(d).resolve()
        if key in seen:
            raise ValueError(f"{d}: given twice (as {seen[key]})")
        seen[key] = str(d)
    if len(folders) == 1:
        text = run_report_html(folders[0], assignments_png)
        out = Path(output) if output else Path(folders[0]) / REPORT_FILE
    else:
        text = comparison_html(folders)
        out = Path(output) if output else Path("comparison.html")
    if out.is_dir():
        raise ValueError(f"--output {out}: is a folder; name a file")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def add_parser(subparsers: Any) -> Any:
    """Register ``mmfl report`` on ``subparsers``."""
    p = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report of a run, or a comparison of runs",
        description=(
            "Read each run folder (config.json, metrics.csv, assignments.csv and, where "
            "present, summary.json, events.csv, clusters.csv) and write one HTML file "
            "that opens offline: the configuration, the curves, who trained what, "
            "uploads and rejections, defence events, clusters, the privacy budget and "
            "the versions; with several folders, a comparison of the runs."
        ),
    )
    p.add_argument("dirs", metavar="DIR", nargs="+", help="a run's output folder")
    p.add_argument(
        "--output",
        metavar="FILE.html",
        default=None,
        help="the report (default: DIR/report.html for one run, comparison.html in the "
        "current folder for several)",
    )
    return p


def main(args: Any) -> int:
    """Run ``mmfl report``; returns the exit code (0, or 2 with one line on stderr)."""
    import sys

    try:
        out = write_report(args.dirs, args.output)
    except (OSError, ValueError) as err:
        print(f"mmfl report: error: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
        return 2
    print(f"[mmfl] report written to {out}", flush=True)
    return 0
