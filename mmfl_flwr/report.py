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
"""

from __future__ import annotations

import base64
import csv
import datetime
import html
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1100px;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;padding-bottom:.2em;
margin-top:2em}table{border-collapse:collapse;margin:.5em 0;font-size:.85em}
td,th{border:1px solid #ddd;padding:.2em .5em;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}img{max-width:100%}
details{margin:.5em 0}.note{color:#666;font-size:.9em}
"""


class RunFolder:
    """The files of one run's output folder, read.

    Attributes
    ----------
    folder : Path
    config : dict
        The settings as typed (``config.json`` without ``effective`` / ``engine``).
    effective : dict
        The values used for the automatic settings.
    engine : str or None
    summary : dict or None
        ``summary.json`` (None for an interrupted run).
    header : list[str]
        The columns of ``metrics.csv``.
    cells : list[dict[str, str]]
        The rows of ``metrics.csv`` as written (strings).
    rows : list[dict]
        The same rows as numbers (:func:`~mmfl_flwr.results.read_metrics_csv`).
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        from mmfl_flwr.results import read_metrics_csv

        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ValueError(f"{folder}: not a folder (expected a run's output folder)")
        for name in ("metrics.csv", "config.json"):
            if not (self.folder / name).is_file():
                raise ValueError(
                    f"{folder}: no {name} (expected a run's output folder, as written by mmfl run)"
                )
        try:
            with open(self.folder / "config.json") as f:
                config = json.load(f)
            if not isinstance(config, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as err:
            raise ValueError(f"{folder}: config.json is not readable ({err})") from err
        self.effective: dict[str, Any] = dict(config.pop("effective", None) or {})
        self.engine: str | None = config.pop("engine", None)
        self.config: dict[str, Any] = config
        self.summary: dict[str, Any] | None = None
        if (self.folder / "summary.json").is_file():
            try:
                with open(self.folder / "summary.json") as f:
                    summary = json.load(f)
                self.summary = summary if isinstance(summary, dict) else None
            except (OSError, ValueError) as err:
                raise ValueError(f"{folder}: summary.json is not readable ({err})") from err
        try:
            with open(self.folder / "metrics.csv", newline="") as f:
                reader = csv.DictReader(f)
                self.header: list[str] = list(reader.fieldnames or [])
                self.cells: list[dict[str, str]] = list(reader)
            self.rows = read_metrics_csv(self.folder / "metrics.csv")
        except (OSError, ValueError, TypeError) as err:
            raise ValueError(f"{folder}: metrics.csv is not readable ({err})") from err
        missing = [c for c in ("round", "task", "accuracy", "loss") if c not in self.header]
        if missing:
            raise ValueError(f"{folder}: metrics.csv lacks the column(s) {', '.join(missing)}")
        self.models: list[str] = list(dict.fromkeys(r["task"] for r in self.rows))
        self.last_round = max((int(r["round"]) for r in self.rows), default=0)

    @property
    def num_rounds(self) -> int:
        return int(self.config.get("num-rounds", self.last_round))

    @property
    def finished(self) -> bool:
        return self.summary is not None and self.last_round >= self.num_rounds

    def csv_rows(self, name: str) -> tuple[list[str], list[list[str]]]:
        """Header and rows of another CSV file of the folder (empty if absent)."""
        path = self.folder / name
        if not path.is_file():
            return [], []
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            return header, list(reader)

    def assignments(self) -> dict[int, list[tuple[str, str, int]]]:
        """``assignments.csv`` as :attr:`MultiModelResult.assignments`."""
        out: dict[int, list[tuple[str, str, int]]] = {}
        path = self.folder / "assignments.csv"
        if not path.is_file():
            return out
        with open(path, newline="") as f:
            reader = csv.reader(f)
            next(reader, None)
            for rnd, cid, task, count in reader:
                out.setdefault(int(rnd), []).append((cid, task, int(count)))
        return out


# ---------------------------------------------------------------- HTML pieces


def _e(value: Any) -> str:
    return html.escape(str(value))


def _png(fig: Any, dpi: int = 90) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return _img(buf.getvalue())


def _img(data: bytes, alt: str = "figure") -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    """An HTML table; the first ``left`` columns are left-aligned (names)."""
    out = ["<table><thead><tr>"]
    out += [f'<th class="{"l" if i < left else ""}">{_e(h)}</th>' for i, h in enumerate(header)]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>")
        out += [f'<td class="{"l" if i < left else ""}">{_e(v)}</td>' for i, v in enumerate(row)]
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{_e(title)}</h2>\n{body}\n</section>\n'


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>\n"
        f"<h1>{_e(title)}</h1>\n{body}"
        f'<p class="note">Written {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC '
        "by mmfl report; self-contained (no network needed).</p>\n</body></html>\n"
    )


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


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


def _versions_section(summaries: Sequence[tuple[str, Mapping[str, Any] | None]]) -> str:
    from mmfl_flwr.results import run_versions

    body = ""
    for label, summary in summaries:
        versions = (summary or {}).get("versions")
        if versions:
            body += f"<h3>{_e(label)}</h3>" + _table(
                ["software", "version"], [[k, _fmt(v)] for k, v in versions.items()]
            )
    now = run_versions()
    body += "<h3>This report was written with</h3>" + _table(
        ["software", "version"], [[k, _fmt(v)] for k, v in now.items()]
    )
    return _section("versions", "Versions", body)


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


# ---------------------------------------------------------------- comparison


def comparison_html(folders: Sequence[str | os.PathLike[str]]) -> str:
    """The HTML report comparing the runs in ``folders``."""
    runs = [RunFolder(f) for f in folders]
    labels = _labels(runs)
    parts = []
    parts.append(
        _section(
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
    )
    keys = sorted({k for r in runs for k in r.config} | {"engine"})
    differ = []
    for k in keys:
        values = [(r.engine if k == "engine" else r.config.get(k)) for r in runs]
        if len({json.dumps(v, sort_keys=True) for v in values}) > 1:
            differ.append([k, *(_fmt(v) for v in values)])
    parts.append(
        _section(
            "settings",
            "Settings that differ",
            _table(["setting", *labels], differ)
            if differ
            else "<p>None: the runs share every setting.</p>",
        )
    )
    models = list(dict.fromkeys(m for r in runs for m in r.models))
    final_rows = []
    for lab, r in zip(labels, runs):
        last: dict[str, dict[str, str]] = {}
        for row in r.cells:
            last[row["task"]] = row
        final_rows.append(
            [lab, r.last_round, *(last.get(m, {}).get("accuracy", "") for m in models)]
        )
    parts.append(
        _section(
            "final",
            "Final accuracy per model (metrics.csv, last round)",
            _table(["run", "round", *models], final_rows),
        )
    )
    parts.append(_section("curves", "Curves", _png(_comparison_figure(runs, labels))))
    rounds = sorted({int(r["round"]) for run in runs for r in run.rows})
    means = [_mean_accuracy(r) for r in runs]
    parts.append(
        _section(
            "mean-accuracy",
            "Mean accuracy over the models per round",
            _table(
                ["round", *labels],
                [[rnd, *(_fmt(m.get(rnd)) for m in means)] for rnd in rounds],
                left=0,
            ),
        )
    )
    parts.insert(
        -1,
        _section(
            "model-curves",
            "Accuracy per model",
            _png(_per_model_figure(runs, labels, models)),
        ),
    )
    totals = [_totals(r) for r in runs]
    parts.append(
        _section(
            "uploads-rejections",
            "Uploads and rejections per round (summed over the models)",
            _table(
                ["round", *(f"{lab}: {k}" for lab in labels for k in ("uploads", "rejected"))],
                [
                    [
                        rnd,
                        *(
                            t.get(rnd, {}).get(k, "")
                            for t in totals
                            for k in ("uploads", "rejected")
                        ),
                    ]
                    for rnd in rounds
                    if rnd > 0
                ],
                left=0,
            ),
        )
    )
    parts.append(_versions_section([(lab, r.summary) for lab, r in zip(labels, runs)]))
    return _page(f"Comparison of {len(runs)} MMFL runs", "".join(parts))


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
    labels = [f"{r.config.get('strategy', '?')} seed {r.config.get('seed', '?')}" for r in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{lab} ({r.folder.name})" for lab, r in zip(labels, runs)]
    if len(set(labels)) < len(labels):
        labels = [f"{lab} #{i + 1}" for i, lab in enumerate(labels)]
    return labels


def _mean_accuracy(run: RunFolder) -> dict[int, float]:
    by: dict[int, list[float]] = {}
    for r in run.rows:
        if not math.isnan(r["accuracy"]):
            by.setdefault(int(r["round"]), []).append(r["accuracy"])
    return {k: sum(v) / len(v) for k, v in by.items()}


def _comparison_figure(runs: Sequence[RunFolder], labels: Sequence[str]) -> Any:
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
