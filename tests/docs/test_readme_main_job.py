"""The README's first command, the main job, run as a new user runs it.

The command is read from the README (the first ``bash`` block under "The two
commands"): ``python3 -m venv .venv && . .venv/bin/activate && pip install ...
&& mmfl run``. The venv and the install are what runs this test suite already
(the README's second command makes them), so the test runs what follows them,
verbatim, in an empty folder with this venv's ``bin`` first on ``PATH`` and no
network-facing Flower state: the embedded data, Flower's simulation engine,
progress lines, and the results folder with its plot.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from e2e_utils import REPO_ROOT, check_outputs, default_model_names, run_isolated

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process clean-up reads /proc"),
]


def main_job_command() -> list[str]:
    """The README's first command, split at ``&&``."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("## The two commands", 1)[1]
    block = re.search(r"```bash\n(.+?)\n```", section, re.DOTALL)
    assert block, "no bash block under 'The two commands'"
    return [part.strip() for part in block.group(1).split("&&")]


def test_the_main_job_command_is_venv_install_then_mmfl_run():
    parts = main_job_command()
    assert parts[0].startswith("python3 -m venv") and parts[1].startswith(". ")
    assert parts[2].startswith("pip install") and " -e ." in parts[2] + " "
    assert parts[3:] == ["mmfl run"], parts


@pytest.mark.slow
def test_the_main_job_runs_verbatim(tmp_path: Path) -> None:
    run_part = main_job_command()[3:]
    assert run_part == ["mmfl run"]
    rc, output = run_isolated(
        shlex.split(run_part[0]), tmp_path, cwd=tmp_path, timeout=1500, local_superlink=False
    )
    assert rc == 0, output[-6000:]
    out = tmp_path / "results" / "mmfl"
    summary = json.loads((out / "summary.json").read_text())
    rounds = summary["rounds"]
    progress = [line for line in output.splitlines() if line.startswith("[mmfl] round")]
    assert len(progress) == rounds + 1, output[-3000:]  # round 0 and every round
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "metrics.csv").is_file() and (out / "assignments.csv").is_file()
    assert "on Flower's simulation engine (Ray)" in output
    assert "DEPRECATED" not in output  # Flower's supported simulation path
    # every output file, a row per round and model (the default tasks)
    check_outputs(out, default_model_names(), num_rounds=rounds)
    # written to a pipe, not a terminal: no ANSI colour codes (issue 25)
    assert "\x1b[" not in output, [ln for ln in output.splitlines() if "\x1b[" in ln][:5]
    # the run records the engine that ran it (mmfl compare lists it when it differs)
    config = json.loads((out / "config.json").read_text())
    assert summary["engine"] == config["engine"] == "simulation", (summary["engine"], config)
    # `mmfl run` hosts the clients on shard nodes (clients-per-node auto: one node per
    # CPU Ray sees), each training its clients batched; that they give the
    # in-process engine's run is tests/engines/test_parity_matrix.py's
    shards = re.search(r"\[mmfl\] \d+ clients on (\d+) Flower nodes? of up to (\d+)", output)
    assert shards and int(shards.group(2)) > 1, output[-3000:]
    # config.json holds the settings as typed: "auto", not the K this machine chose (a
    # resumed run on another machine chooses again; mmfl compare sees no difference)
    assert config["clients-per-node"] == "auto", config["clients-per-node"]
