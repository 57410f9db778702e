"""Every script in benchmarks/ answers ``--help`` and refuses an unknown flag in one
line with exit code 2 (no traceback): a script that breaks before parsing its
arguments breaks every command that names it (``reproduce.py --full`` among them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, str(BENCH / script), *args], cwd=BENCH,
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_benchmarks_folder_has_scripts() -> None:
    assert len(SCRIPTS) >= 20, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_answers_help_and_refuses_an_unknown_flag(script: str) -> None:
    helped = _run(script, "--help")
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "usage:" in helped.stdout
    refused = _run(script, "--no-such-flag")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert "error:" in last and "--no-such-flag" in last, refused.stderr[-2000:]
