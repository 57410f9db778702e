"""The gain commands of docs/how-to/papers-experiments.md (``<!-- gain-commands -->``)
run verbatim: a multi-model run and the sequential single-model runs on the vectorized engine
into one folder, then ``mmfl_flwr.gain`` on their curves."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from e2e_utils import REPO_ROOT

pytestmark = pytest.mark.slow


def readme_block() -> list[str]:
    text = (REPO_ROOT / "docs" / "how-to" / "papers-experiments.md").read_text()
    block = re.search(r"<!-- gain-commands -->\n```bash\n(.+?)\n```", text, re.DOTALL)
    assert block, "no bash block after <!-- gain-commands --> in docs/how-to/papers-experiments.md"
    return block.group(1).splitlines()


def test_readme_gain_commands_run_verbatim(tmp_path: Path) -> None:
    lines = readme_block()
    assert len(lines) == 3
    proc = subprocess.run(
        ["bash", "-c", "set -e\n" + "\n".join(lines)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = tmp_path / "results" / "g"
    for name in ("metrics.csv", "single.csv", "summary.json"):
        assert (out / name).is_file(), name
    value = float(proc.stdout.strip().splitlines()[-1])
    assert value >= 0.0
