"""The ``flwr run`` commands of docs/how-to/flwr-run.md, run verbatim (slow).

The lines after ``<!-- flwr-run-commands -->`` in that page run as one bash
script from the repository root, as a user would paste them: they export the
one variable the page tells the user to set, run this repository's app with
``flwr run . --stream`` and the plug-into-your-app example. The test only
isolates Flower's state (a private ``FLWR_HOME`` and private ports for the
local SuperLink that ``flwr run`` starts, ended afterwards); it does not set
``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION`` itself.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from e2e_utils import REPO_ROOT, check_outputs, default_model_names, run_isolated

#: Where the commands live (the README's section moved there, issue 57).
FLWR_RUN_PAGE = REPO_ROOT / "docs" / "how-to" / "flwr-run.md"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="clean-up reads /proc"),
]


def readme_commands() -> list[str]:
    text = FLWR_RUN_PAGE.read_text()
    block = re.search(r"<!-- flwr-run-commands -->\n```bash\n(.+?)\n```", text, re.DOTALL)
    assert block, f"no bash block after <!-- flwr-run-commands --> in {FLWR_RUN_PAGE}"
    return block.group(1).splitlines()


def test_readme_flwr_run_commands_run_verbatim(tmp_path: Path) -> None:
    lines = readme_commands()
    assert lines[0] == "export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1"
    script = "set -e\n" + "\n".join(lines) + "\n"
    # only the page's block sets FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION
    rc, output = run_isolated(
        ["bash", "-c", script], tmp_path, cwd=REPO_ROOT, timeout=900, keep_runtime_install=True
    )
    assert rc == 0, output[-6000:]
    assert "[mmfl] round   3/3" in output, output[-6000:]  # --stream showed the progress
    assert "Exit Code" not in output and "Runtime installation" not in output, output[-4000:]
    check_outputs(REPO_ROOT / "results" / "flwr", default_model_names(), num_rounds=3)
    # the example's ServerApp prints its final accuracy per model
    assert re.search(r"(iris|wine): accuracy \d\.\d{3} after round 5", output), output[-3000:]
