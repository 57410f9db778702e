"""The pieces of every HTML report (:mod:`mmfl_flwr.report`): an output
folder read (:class:`RunFolder`) and the HTML building blocks (escaped text,
inline PNG images, tables, sections, the page with its style sheet, and the
versions section that a run's report and a comparison both end with).

The page needs no network: figures are PNG images inlined in base64, the style
sheet is in the page, there is no script.
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
