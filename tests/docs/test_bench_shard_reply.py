"""benchmarks/bench_shard_reply.py: times a shard node's answer to one message
of K clients and prints one line per reply; bad arguments are one line."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from e2e_utils import REPO_ROOT

SCRIPT = str(REPO_ROOT / "benchmarks" / "bench_shard_reply.py")


@pytest.mark.parametrize("kind,records", [("query.losses", 30), ("evaluate", 60)])
def test_bench_shard_reply_prints_a_line_per_reply(kind, records):
    res = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--clients",
            "30",
            "--num-clients",
            "40",
            "--repeats",
            "2",
            "--type",
            kind,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )
    assert res.returncode == 0, res.stderr
    lines = re.findall(
        r"reply (\d): ([\d.]+) s \(([\d.]+) us a client\), (\d+) records", res.stdout
    )
    assert [int(i) for i, *_ in lines] == [1, 2]
    assert all(int(n) == records for *_, n in lines)  # every client answered (per task)


@pytest.mark.parametrize(
    "args,words",
    [
        (["--clients", "0"], "--clients must be in [1, --num-clients]"),
        (["--clients", "50", "--num-clients", "40"], "--clients must be in"),
        (["--repeats", "0"], "--repeats must be >= 1"),
    ],
)
def test_bench_shard_reply_refuses_bad_arguments_in_one_line(args, words):
    res = subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0
    assert words in res.stderr and "Traceback" not in res.stderr
