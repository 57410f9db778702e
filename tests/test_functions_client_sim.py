"""A quickstart-style ClientApp through ``client_app_from_functions`` on Flower's
simulation engine (slow): ``flwr run tests/quickstart_app --stream`` on a
private local SuperLink, 4 virtual SuperNodes on Ray, LVR over two models."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_utils import (
    REPO_ROOT,
    ProcessTracker,
    flower_env,
    flower_exe,
    free_ports,
    new_marker,
    tail,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="clean-up reads /proc"),
]


def test_quickstart_app_runs_on_the_simulation_engine(tmp_path: Path) -> None:
    http_port, control_port = free_ports(2)
    marker = new_marker()
    env = flower_env(tmp_path / "home", marker, {
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
    })
    log = tmp_path / "flwr-run.log"
    cmd = [flower_exe("flwr"), "run", str(REPO_ROOT / "tests" / "quickstart_app"), "--stream",
           "--run-config", "num-rounds=3 strategy='lvr'",
           "--federation-config", "num-supernodes=4 client-resources-num-cpus=1"]
    with ProcessTracker(marker) as procs:
        procs.watch_superlink_port(http_port)
        proc = procs.popen(cmd, env=env, cwd=tmp_path, log_path=log)
        try:
            rc = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            procs.cleanup()
            pytest.fail(f"flwr run did not finish in 600 s:\n{tail(log)}")
    output = log.read_text(errors="replace")
    assert rc == 0, output[-6000:]
    found = dict(re.findall(r"\[quickstart\] lvr (\w+): accuracy (\d\.\d+) after round 3", output))
    assert set(found) == {"blobs", "rings"}, output[-6000:]
    assert float(found["blobs"]) > 0.55 and float(found["rings"]) > 0.7, found
    assert "No query function registered" not in output
