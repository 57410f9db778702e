#!/usr/bin/env python
"""Check that published runs are reproduction runs: the papers' algorithms with every
defence off.

    python benchmarks/check_reproduction.py                # docs/results
    python benchmarks/check_reproduction.py docs/results/paper003_table1.csv

Every run CSV (columns ``method``, ``seed``, ``round``, ``accuracy``) and every cache
(``.jsonl``) under the given paths is read; each run's recorded settings (the
``defences`` switch and the value of every bound, which the evidence scripts record
with each run) make it a
``reproduction`` run (every bound 0), a ``defended`` run (a bound on) or ``unknown`` (no
settings recorded: made before runs recorded them, never taken for a reproduction).
One line per file; exit code 0 when every run found is a reproduction run, 1 otherwise
(and when no run is found), 2 for a path that does not exist.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import _evidence as E


def check(paths: list[str]) -> list[dict[str, Any]]:
    """:func:`_evidence.check_reproduction` of each folder, :func:`_evidence.check_file`
    of each file."""
    found: list[dict[str, Any]] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found += E.check_reproduction(path)
        else:
            res = E.check_file(path)
            if res is not None:
                found.append(res)
    return found


def main(argv: list[str] | None = None) -> int:
    p = E.Parser(description=__doc__.splitlines()[0])
    p.add_argument(
        "paths",
        nargs="*",
        default=["docs/results"],
        help="folders or files of published runs (default: docs/results)",
    )
    a = p.parse_args(argv)
    missing = [x for x in a.paths if not Path(x).exists()]
    if missing:
        p.error(f"no such file or folder: {missing[0]}")
    found = check(a.paths)
    for r in found:
        verdict = (
            "ok"
            if r["runs"] and r["reproduction"] == r["runs"]
            else "DEFENDED"
            if r["defended"]
            else "UNKNOWN"
        )
        print(
            f"{verdict:8} {r['path']}: {r['runs']} runs, {r['reproduction']} reproduction, "
            f"{r['defended']} defended, {r['unknown']} unknown"
        )
    total = {k: sum(r[k] for r in found) for k in ("runs", "reproduction", "defended", "unknown")}
    print(
        f"{len(found)} files, {total['runs']} runs: {total['reproduction']} reproduction, "
        f"{total['defended']} defended, {total['unknown']} unknown (no settings recorded)"
    )
    return 0 if total["runs"] and total["reproduction"] == total["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
