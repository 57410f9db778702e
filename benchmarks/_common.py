"""Shared plumbing of the comparison benchmarks: parallel runs, mean ± sd, output files."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def run_jobs(
    fn: Callable[[Any], dict[str, Any]],
    jobs: Sequence[Any],
    workers: int,
    describe: Callable[[dict[str, Any]], str],
) -> list[dict[str, Any]]:
    """Run ``fn`` over ``jobs`` in ``workers`` processes (results in job order),
    printing ``describe(result)`` as each one finishes."""
    runs = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for r in pool.map(fn, jobs):
            runs.append(r)
            print("  " + describe(r), flush=True)
    return runs


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def write_outputs(json_path: str, markdown_path: str, payload: dict[str, Any], table: str) -> None:
    """Write the numbers (``--json``) and the table (``--markdown``) when asked."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(payload, f, indent=2)
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(table + "\n")
