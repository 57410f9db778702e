"""A quickstart-style ClientApp through ``client_app_from_functions`` on Flower's
simulation engine (slow): ``flwr run tests/quickstart_app --stream`` on a
private local SuperLink, 4 virtual SuperNodes on Ray, LVR over two models."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from e2e_utils import REPO_ROOT, flower_exe, run_isolated

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="clean-up reads /proc"),
]


def test_quickstart_app_runs_on_the_simulation_engine(tmp_path: Path) -> None:
    cmd = [
        flower_exe("flwr"),
        "run",
        str(REPO_ROOT / "tests" / "quickstart_app"),
        "--stream",
        "--run-config",
        "num-rounds=3 strategy='lvr'",
        "--federation-config",
        "num-supernodes=4 client-resources-num-cpus=1",
    ]
    rc, output = run_isolated(cmd, tmp_path, cwd=tmp_path, timeout=600)
    assert rc == 0, output[-6000:]
    found = dict(re.findall(r"\[quickstart\] lvr (\w+): accuracy (\d\.\d+) after round 3", output))
    assert set(found) == {"blobs", "rings"}, output[-6000:]
    assert float(found["blobs"]) > 0.55 and float(found["rings"]) > 0.7, found
    assert "No query function registered" not in output
