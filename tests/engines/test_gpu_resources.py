"""GPUs per client and Ray clusters on the simulation engine (issue #14, item 3),
checked without starting Ray.

- ``--num-gpus-per-client F`` is checked like Ray checks it (in [0, 1] or a whole
  number) and becomes ``client-resources-num-gpus=F`` of the federation config,
  which Flower's own parser accepts;
- how many clients run at a time is Flower's own count
  (``pool_size_from_resources``, called here on fake Ray nodes);
- GPUs asked for where Ray sees none, an unreachable ``--ray-address``, and
  ``--num-cpus`` with ``--ray-address`` are one-line errors with exit code 2,
  before anything starts; so are the two flags with another engine;
- with a cluster, ``init-args-num-cpus`` is left out (Ray refuses ``num_cpus``
  when it joins a cluster) and the address travels as ``RAY_ADDRESS``.

The cluster itself runs in the slow test ``test_ray_cluster.py``.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mmfl_flwr import cli
from mmfl_flwr.flower_app import launch
from mmfl_flwr.flower_app.launch import (
    RayPlan,
    _slots,
    check_num_gpus_per_client,
    federation_config,
    plan_ray,
)

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--num-clients", "4", "--num-rounds", "1", "--local-epochs", "1", "--tasks", "synthetic"]


def _closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def _no_ambient_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RAY_ADDRESS of the caller's shell, no GPU (also where one exists)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(launch, "local_gpus", lambda: 0)


# ------------------------------------------------------------------- GPU share
@pytest.mark.parametrize("value", [0, 0.0, 0.1, 0.25, 0.5, 1, 1.0, 2, 8.0])
def test_a_share_of_one_gpu_or_whole_gpus_is_valid(value):
    assert check_num_gpus_per_client(value) == float(value)


@pytest.mark.parametrize("value", [-0.25, 1.5, 2.5, math.nan, math.inf, "many"])
def test_other_gpu_shares_are_refused_in_one_line(value):
    with pytest.raises(ValueError, match="--num-gpus-per-client") as err:
        check_num_gpus_per_client(value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "nodes, gpus",
    [
        (((2.0, 0.0),), 0.0),
        (((2.0, 0.0),), 0.25),  # no GPU: no client fits
        (((16.0, 1.0),), 0.25),  # GPU-bound: 4
        (((2.0, 1.0),), 0.25),  # CPU-bound: 2
        (((16.0, 1.0),), 0.3),  # 3 (not 3.33)
        (((16.0, 2.0),), 1.0),
        (((16.0, 1.0),), 2.0),  # one GPU is not enough for 2
        (((4.0, 0.0), (4.0, 1.0)), 0.5),  # only the GPU node counts
        (((1.0, 0.0), (1.0, 0.0)), 0.0),  # the two-node test cluster: 2
        (((0.0, 0.0), (3.0, 0.0)), 0.0),  # a head that runs no tasks
    ],
)
def test_clients_at_a_time_is_flowers_own_count(monkeypatch, nodes, gpus):
    """``_slots`` against Flower's ``pool_size_from_resources`` on fake Ray nodes."""
    from flwr.simulation.ray_transport import ray_actor

    fake = [{"Resources": {"CPU": c, **({"GPU": g} if g else {})}} for c, g in nodes]
    monkeypatch.setattr(ray_actor.ray, "nodes", lambda: fake)
    resources = {"num_cpus": 1, "num_gpus": gpus}
    try:
        expected = ray_actor.pool_size_from_resources(resources)
    except ValueError:  # "ActorPool is empty"
        expected = 0
    assert _slots(nodes, gpus) == expected


# ----------------------------------------------------------- federation config
def _parsed(federation: str) -> dict[str, object]:
    """The federation config the way ``flwr run --federation-config`` reads it."""
    from flwr.common.config import parse_config_args
    from flwr.supercore.utils import simulation_config_from_json

    keys = {k.replace("-", "_"): v for k, v in parse_config_args([federation]).items()}
    simulation_config_from_json(keys)  # raises on a key Flower does not know
    return keys


def test_the_local_federation_config_caps_ray_and_asks_for_gpus():
    plan = RayPlan(address=None, nodes=((8.0, 1.0),), num_gpus_per_client=0.25, slots=4)
    federation, env = federation_config(6, plan, num_cpus=8)
    assert env == {}
    assert _parsed(federation) == {
        "num_supernodes": 6,
        "client_resources_num_cpus": 1,
        "client_resources_num_gpus": 0.25,
        "init_args_num_cpus": 8,
        "init_args_logging_level": "ERROR",
        "init_args_log_to_driver": False,
    }


def test_without_gpus_the_federation_config_asks_for_none():
    plan = RayPlan(address=None, nodes=((2.0, 0.0),), num_gpus_per_client=0.0, slots=2)
    federation, _ = federation_config(4, plan, num_cpus=None)
    assert "client_resources_num_gpus" not in _parsed(federation)


def test_a_cluster_gets_ray_address_and_no_num_cpus():
    plan = RayPlan(
        address="10.1.2.3:6379", nodes=((4.0, 1.0), (4.0, 1.0)), num_gpus_per_client=1.0, slots=2
    )
    federation, env = federation_config(10, plan, num_cpus=None)
    keys = _parsed(federation)
    assert env == {"RAY_ADDRESS": "10.1.2.3:6379"}
    assert "init_args_num_cpus" not in keys and "init_args_num_gpus" not in keys
    assert keys["client_resources_num_gpus"] == 1.0
    assert "2 nodes, 8 CPUs, 2 GPUs; 1 GPU and 1 CPU per client, up to 2 clients" in (
        plan.describe()
    )


# -------------------------------------------------------------------- plan_ray
def test_gpus_where_ray_sees_none_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match=r"Ray sees no GPU on this machine; leave") as err:
        plan_ray(0.25)
    assert "\n" not in str(err.value)


def test_a_local_gpu_gives_clients_at_a_time(monkeypatch):
    monkeypatch.setattr(launch, "local_gpus", lambda: 1)
    assert plan_ray(0.25, num_cpus=16).slots == 4
    assert plan_ray(0.25, num_cpus=2).slots == 2
    with pytest.raises(ValueError, match="no node of this machine has that many GPUs"):
        plan_ray(2, num_cpus=16)


def test_gpus_on_a_cluster_count_its_gpu_nodes(monkeypatch):
    monkeypatch.setattr(
        launch, "_probe_cluster", lambda address: ("10.1.2.3:6379", ((8.0, 0.0), (8.0, 1.0)))
    )
    plan = plan_ray(0.5, "head.example:6379")
    assert (plan.address, plan.slots) == ("10.1.2.3:6379", 2)
    monkeypatch.setattr(
        launch, "_probe_cluster", lambda address: ("10.1.2.3:6379", ((8.0, 0.0), (8.0, 0.0)))
    )
    with pytest.raises(ValueError, match=r"Ray sees no GPU on the Ray cluster at head"):
        plan_ray(0.5, "head.example:6379")


def test_an_unreachable_or_malformed_address_is_one_line():
    port = _closed_port()
    with pytest.raises(
        ValueError, match=f"--ray-address 127.0.0.1:{port}: no Ray cluster answers there"
    ):
        plan_ray(0.0, f"127.0.0.1:{port}")
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        plan_ray(0.0, "head-without-port")


def test_num_cpus_and_a_ray_address_exclude_each_other():
    with pytest.raises(ValueError, match="exclude each other"):
        plan_ray(0.0, "127.0.0.1:6379", num_cpus=2)


def test_ray_address_of_the_environment_is_checked_too(monkeypatch):
    port = _closed_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    # --num-cpus with an ambient RAY_ADDRESS is not an error (it is ignored, said so)
    with pytest.raises(ValueError, match=f"^RAY_ADDRESS=127.0.0.1:{port}: no Ray cluster"):
        plan_ray(0.0, num_cpus=2)
    monkeypatch.setenv("RAY_ADDRESS", "local")  # Ray's word for a new local instance
    assert plan_ray(0.0, num_cpus=2).address is None


# ------------------------------------------------------------------------- CLI
def _cli_error(argv: list[str], capsys: pytest.CaptureFixture[str], out: Path) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", *SMALL, *argv, "--output-dir", str(out)])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmfl run: error: "), lines
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["--num-gpus-per-client", "0.25"],
            "--num-gpus-per-client 0.25: Ray sees no GPU on this machine",
        ),
        (["--num-gpus-per-client", "1.5"], "must be in [0, 1]"),
        (["--num-gpus-per-client", "lots"], "--num-gpus-per-client: invalid float value"),
        (
            ["--engine", "inprocess", "--num-gpus-per-client", "0.5"],
            "--num-gpus-per-client applies to --engine simulation (Flower's Ray engine) only",
        ),
        (
            ["--engine", "inprocess", "--ray-address", "auto"],
            "--ray-address applies to --engine simulation",
        ),
        (
            ["--ray-address", "127.0.0.1:{port}"],
            "--ray-address 127.0.0.1:{port}: no Ray cluster answers there",
        ),
        (["--ray-address", "127.0.0.1:{port}", "--num-cpus", "2"], "exclude each other"),
    ],
)
def test_cli_refuses_in_one_line_with_exit_2(argv, expected, capsys, tmp_path):
    port = _closed_port()
    line = _cli_error([a.format(port=port) for a in argv], capsys, tmp_path / "out")
    assert expected.format(port=port) in line


def test_cli_gpu_request_without_gpu_has_no_traceback(tmp_path):
    """The whole command, as a user runs it: Ray's own GPU detection (no GPU is
    visible: CUDA_VISIBLE_DEVICES is empty), one line, exit code 2, fast."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmfl_flwr.cli",
            "run",
            *SMALL,
            "--num-gpus-per-client",
            "0.25",
            "--output-dir",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Ray sees no GPU on this machine" in lines[0], proc.stderr
    assert not out.exists()
