"""benchmarks/bench_scale.py at the smallest size: it runs the federation on the
vectorized engine in a subprocess and prints one row with seconds and memory."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from e2e_utils import REPO_ROOT


def test_bench_scale_prints_seconds_and_peak_memory(tmp_path):
    out = tmp_path / "scale.json"
    res = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "benchmarks" / "bench_scale.py"),
            "--num-clients",
            "30",
            "--engines",
            "vectorized",
            "--rounds",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    row = [ln for ln in res.stdout.splitlines() if ln.startswith("vectorized")]
    assert len(row) == 1 and re.search(r"vectorized\s+30\s+[\d.]+\s+[\d.]+\s+[\d.]+", row[0])
    [rep] = json.loads(out.read_text())
    assert rep["n"] == 30 and rep["maxrss"] > 10**7 and set(rep["seconds"]) == {"1", "2"}
    assert rep["uploads"] > 0
    assert rep["peak_pss"] > 10**7  # the process tree's proportional set size, sampled


def test_bench_scale_refuses_a_bad_engine():
    res = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "bench_scale.py"), "--engines", "ray"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2 and "engines from" in res.stderr


def test_bench_scale_refuses_a_bad_clients_per_node():
    res = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "benchmarks" / "bench_scale.py"),
            "--clients-per-node",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2 and "--clients-per-node '0'" in res.stderr
