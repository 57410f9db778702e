"""docs/adding-an-algorithm.md is true: its block that defines a policy and an
aggregator in a module of the user's own, registers both and runs them, runs as
written (from a temporary module, in a fresh process so the registrations stay
there) and the run trains each model in turn under the new aggregator."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "adding-an-algorithm.md"


def runnable(name: str) -> str:
    found = re.search(
        rf"<!-- runnable: {re.escape(name)} -->\n```python\n(.+?)\n```", DOC.read_text(), re.S
    )
    assert found, f"no runnable block {name!r} in {DOC.name}"
    return found.group(1)


def test_a_policy_and_an_aggregator_of_ones_own_module_register_and_run(tmp_path):
    module = tmp_path / "my_algorithm.py"
    module.write_text(runnable("own-policy-and-aggregator"))
    probe = (
        "import my_algorithm, mmfl_flwr.core.card as C\n"
        "print(type(my_algorithm.result.arrays), 'half-step-mean' in C.AGGREGATORS)\n"
        "s = my_algorithm.settings\n"
        "print(type(C.card(s.strategy).components(s.aggregator)[1]).__name__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("[mmfl]")]
    assert "['digits', 'synthetic']" in lines  # round 1 digits... each model had its turn
    assert any(ln.endswith(" True") for ln in lines)  # the aggregator is a --aggregator choice
    assert "HalfStepMean" in lines
    assert (tmp_path / "results/own-algorithm/metrics.csv").is_file()
