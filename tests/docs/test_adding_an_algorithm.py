"""docs/adding-an-algorithm.md is true: its block that defines a policy and an
aggregator in a module of the user's own, registers both and runs them, runs as
written (from a temporary module, in a fresh process so the registrations stay
there) and the run trains each model in turn under the new aggregator; its block
that defines a task in one module of the user's own registers it and a run
trains it beside a built-in task."""

from __future__ import annotations

import os
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


def _run_probe(probe: str, where: Path) -> subprocess.CompletedProcess[str]:
    """Run ``probe`` in a fresh process in ``where``, which is on the import path
    ahead of the package the tests run (so a module written there is found)."""
    path = os.pathsep.join(p for p in (str(where), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_a_policy_and_an_aggregator_of_ones_own_module_register_and_run(tmp_path):
    module = tmp_path / "my_algorithm.py"
    module.write_text(runnable("own-policy-and-aggregator"))
    probe = (
        "import my_algorithm, mmfl_flwr.core.card as C\n"
        "print(type(my_algorithm.result.arrays), 'half-step-mean' in C.AGGREGATORS)\n"
        "s = my_algorithm.settings\n"
        "print(type(C.card(s.strategy).components(s.aggregator)[1]).__name__)\n"
    )
    proc = _run_probe(probe, tmp_path)
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("[mmfl]")]
    assert "['digits', 'synthetic']" in lines  # round 1 digits... each model had its turn
    assert any(ln.endswith(" True") for ln in lines)  # the aggregator is a --aggregator choice
    assert "HalfStepMean" in lines
    assert (tmp_path / "results/own-algorithm/metrics.csv").is_file()


def test_a_task_of_ones_own_module_registers_and_trains(tmp_path):
    """The task block, written to one module of its own: importing it registers
    the task (a ``tasks`` item like a built-in one, not a built-in), and the run
    trains a model of it beside digits and evaluates it on its server test set."""
    (tmp_path / "my_task.py").write_text(runnable("own-task"))
    probe = (
        "import my_task\n"
        "from mmfl_flwr.tasks.federation import known_kinds\n"
        "from mmfl_flwr.tasks.registry import get_task\n"
        "d = get_task('two-blobs')\n"
        "print('two-blobs' in known_kinds(), d.builtin, d.spec.num_classes)\n"
        "final = my_task.result.final()['two-blobs']\n"
        "print('accuracy', 0.0 <= final['accuracy'] <= 1.0)\n"
    )
    proc = _run_probe(probe, tmp_path)
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("[mmfl]")]
    assert "['digits', 'two-blobs']" in lines
    assert "True False 2" in lines
    assert "accuracy True" in lines
    metrics = (tmp_path / "results/own-task/metrics.csv").read_text()
    assert "two-blobs" in metrics
