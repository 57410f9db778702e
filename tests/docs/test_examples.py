"""Every folder under ``examples/`` has a README with its commands and what they
print, and each command runs as written (issue 25).

The lines after ``<!-- example-commands -->`` in an example's README are its
commands. A command with an ``<!-- example-output: COMMAND -->`` block runs here
as written, from a folder holding a copy of the example at the same path (so its
results stay out of the checkout), and prints every line of that block; the
others run verbatim in a slow test named in :data:`RUN_ELSEWHERE`.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    p for p in (ROOT / "examples").iterdir() if p.is_dir() and not p.name.startswith((".", "__"))
)

#: commands run verbatim by a slow test: command -> the test
RUN_ELSEWHERE = {
    "flwr run examples/plug_into_your_app --stream --federation-config "
    '"num-supernodes=6 client-resources-num-cpus=1"': (
        "tests/docs/test_flwr_run_readme.py (docs/how-to/flwr-run.md's flwr-run-commands block)"
    ),
    "python examples/user_task/run.py": (
        "tests/engines/test_sim_strategies_slow.py"
        "::test_user_task_example_runs_on_the_simulation_engine"
    ),
}


def commands(readme: str) -> list[str]:
    block = re.search(r"<!-- example-commands -->\n```bash\n(.+?)\n```", readme, re.DOTALL)
    assert block, "no bash block after <!-- example-commands -->"
    return block.group(1).splitlines()


def outputs(readme: str) -> dict[str, list[str]]:
    found = re.findall(r"<!-- example-output: (.+?) -->\n```text\n(.*?)\n```", readme, re.DOTALL)
    return {cmd: text.splitlines() for cmd, text in found}


def test_every_example_has_a_readme_whose_commands_are_all_run():
    assert EXAMPLES, "no examples"
    for folder in EXAMPLES:
        readme = (folder / "README.md").read_text()
        cmds, outs = commands(readme), outputs(readme)
        assert set(outs) <= set(cmds), (folder.name, set(outs) - set(cmds))
        for cmd in cmds:
            assert cmd in outs or cmd in RUN_ELSEWHERE, f"{folder.name}: nothing runs {cmd!r}"
    for cmd, where in RUN_ELSEWHERE.items():
        path = ROOT / where.split("::")[0].split(" ")[0]
        text = path.read_text()
        if "flwr_run_readme" in where:  # that test runs docs/how-to/flwr-run.md's block verbatim
            text = (ROOT / "docs" / "how-to" / "flwr-run.md").read_text()
        assert cmd in text or shlex.split(cmd)[1] in text, (cmd, where)


CASES = [
    (folder.name, cmd, lines)
    for folder in EXAMPLES
    for cmd, lines in outputs((folder / "README.md").read_text()).items()
]


@pytest.mark.parametrize("folder, cmd, lines", CASES, ids=[c for _, c, _ in CASES])
def test_example_prints_what_its_readme_says(folder, cmd, lines, tmp_path):
    argv = shlex.split(cmd)
    assert argv[0] == "python"  # as written, with this interpreter
    shutil.copytree(
        ROOT / "examples" / folder,
        tmp_path / "examples" / folder,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    proc = subprocess.run(
        [sys.executable, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout.splitlines()
    for line in lines:
        assert line in printed, (line, proc.stdout[-3000:])
