"""The CSV files of an output folder: ``metrics.csv`` (its columns,
:data:`COLUMN_DOCS`), ``assignments.csv`` and ``events.csv``, written and read.

Each file is written beside its path and moved over it when complete, so a
reader, or a run interrupted mid-write, sees the old file or the new one.
:mod:`mmfl_flwr.results` re-exports every public name.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from mmfl_flwr.strategy.events import DefenceEvent

__all__ = [
    "BASE_COLUMNS",
    "COLUMN_DOCS",
    "read_events_csv",
    "read_metrics_csv",
    "write_assignments_csv",
    "write_events_csv",
    "write_metrics_csv",
]

#: Columns always present in metrics.csv, in this order; extra columns follow.
BASE_COLUMNS = [
    "round",
    "task",
    "accuracy",
    "loss",
    "uploads",
    "assigned",
    "rejected",
    "train_loss",
    "step_l1",
]

#: What each column of ``metrics.csv`` holds (one row per round and model; an
#: empty cell is NaN / not applicable). Extra columns follow the base ones in
#: this order of first appearance: ``round_step_l1``, ``coef_sum``, then the
#: client-side evaluation columns.
COLUMN_DOCS = {
    "round": "the round; 0 is the evaluation of the initial weights",
    "task": "the model (task) name; repeated kinds are digits, digits_2, ...",
    "accuracy": "server-side test accuracy of the model after the round",
    "loss": "server-side test loss of the model after the round",
    "uploads": "updates aggregated into the model this round",
    "assigned": "clients assigned to train the model this round",
    "rejected": "updates refused by the server's checks this round",
    "train_loss": "the trainers' reported training loss, weighted by their samples",
    "step_l1": "||w_old - w_new||_1 over the trainable entries: the size of the "
    "model's weight change",
    "round_step_l1": "the sum of step_l1 over the round's models (a weight-change "
    "size, not paper 003's ||H||_1); empty in round 0",
    "coef_sum": "the sum of the aggregation coefficients applied to the round's "
    "aggregated updates of the model: paper 003's ||H_{tau,s}||_1 = "
    "sum over the aggregated (i, b) of d_{i,s} / (B_i p_{s|(i,b)}) for the "
    "unbiased rules (random, lvr, gvr, scaffold; the fresh updates' "
    "coefficients for fedvarp, fedstale, stalevr, stalevre), expectation 1; "
    "1 for fedavg and mean; the trained clients' d_{i,s} for mifa; empty "
    "for median and trimmed-mean; 0 without updates; empty in round 0",
    "client_accuracy": "accuracy on the clients' local test data (fraction-evaluate > 0), "
    "weighted by their samples",
    "client_loss": "loss on the clients' local test data (fraction-evaluate > 0)",
}


def _fmt(v: Any) -> Any:
    """A CSV cell: a float as its repr, NaN as an empty cell, anything else as is."""
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    return v


def write_metrics_csv(history: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """One row per (round, task), the columns of :data:`COLUMN_DOCS`. Timing
    columns are left out so that the same seed gives a byte-identical file."""
    extra: list[str] = []
    for row in history:
        for k in row:
            if k not in BASE_COLUMNS and k not in extra and k != "seconds":
                extra.append(k)
    cols = BASE_COLUMNS + extra
    with _replace_atomically(path) as f:
        w = csv.writer(f)
        w.writerow(cols)
        for row in history:
            w.writerow([_fmt(row.get(c, "")) for c in cols])


@contextlib.contextmanager
def _replace_atomically(path: str | os.PathLike[str]) -> Iterator[IO[str]]:
    """A text file written beside ``path`` and moved over it when complete, so a
    reader (or a run interrupted mid-write) sees the old file or the new one."""
    tmp = Path(f"{os.fspath(path)}.tmp")
    try:
        with open(tmp, "w", newline="") as f:
            yield f
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_assignments_csv(
    assignments: dict[int, list[tuple[str, str, int]]], path: str | os.PathLike[str]
) -> None:
    """Who trained what: one row per (round, client, task) pick, with its count."""
    with _replace_atomically(path) as f:
        w = csv.writer(f)
        w.writerow(["round", "client", "task", "count"])
        for rnd in sorted(assignments):
            for cid, task, count in assignments[rnd]:
                w.writerow([rnd, cid, task, count])


def write_events_csv(events: Sequence[DefenceEvent], path: str | os.PathLike[str]) -> None:
    """Every defence event of a run (:mod:`mmfl_flwr.strategy.events`), one row
    each: ``round, client, task, kind, value, bound, reason`` (a value or bound
    that is not a number left empty); the header alone when there is none."""
    from mmfl_flwr.strategy.events import COLUMNS

    with _replace_atomically(path) as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for e in events:
            w.writerow([e.round, e.client, e.task, e.kind, _fmt(e.value), _fmt(e.bound), e.reason])


def read_events_csv(path: str | os.PathLike[str]) -> list[DefenceEvent]:
    """Read ``events.csv`` back (empty value and bound cells as NaN)."""
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            out.append(
                DefenceEvent(
                    int(r["round"]),
                    r["client"],
                    r["task"],
                    r["kind"],
                    float(r["value"]) if r["value"] else math.nan,
                    float(r["bound"]) if r["bound"] else math.nan,
                    r["reason"],
                )
            )
    return out


def read_metrics_csv(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read ``metrics.csv`` back (numbers as float/int, empty cells as NaN)."""
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = {}
            for k, v in raw.items():
                if k == "task":
                    row[k] = v
                elif v == "":
                    row[k] = math.nan
                else:
                    num = float(v)
                    row[k] = int(num) if k in ("round", "uploads", "assigned", "rejected") else num
            rows.append(row)
    return rows
