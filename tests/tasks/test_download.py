"""``download`` (``mmfl run --download``): the missing real datasets that
torchvision can fetch are fetched into ``data-root`` before the run; where that
fails (offline, no torchvision) the run stops with one line and exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mmfl_flwr.config import Settings
from mmfl_flwr.tasks import datasets as D
from mmfl_flwr.tasks.real import DOWNLOADABLE, download_datasets


def test_download_asks_every_downloadable_kind_once_for_both_splits(monkeypatch):
    calls = []
    monkeypatch.setattr(
        D,
        "load_mnist",
        lambda root, split, kind, download: calls.append((kind, split, root, download)),
    )
    monkeypatch.setattr(
        D,
        "load_emnist",
        lambda root, split, download: calls.append(("emnist", split, root, download)),
    )
    monkeypatch.setattr(
        D,
        "load_cifar10",
        lambda root, split, download: calls.append(("cifar10", split, root, download)),
    )
    done = download_datasets(
        ["mnist", "digits", "cifar10", "mnist", "shakespeare", "fashion-mnist", "emnist"], "/data"
    )
    assert done == ["mnist", "cifar10", "fashion-mnist", "emnist"]
    assert set(done) == set(DOWNLOADABLE)
    assert calls == [(k, s, "/data", True) for k in done for s in ("train", "test")]


def test_the_federation_downloads_only_when_asked(monkeypatch):
    from mmfl_flwr.flower_app import data

    asked = []
    monkeypatch.setattr(
        "mmfl_flwr.tasks.real.download_datasets", lambda kinds, root: asked.append((kinds, root))
    )
    data.federation_for(Settings(num_clients=3))
    assert asked == []
    data.federation_for(Settings(num_clients=3, download=True, data_root="/x"))
    assert asked == [(["digits", "synthetic", "digits"], "/x")]


def test_a_failed_download_is_one_line_and_exit_2(tmp_path):
    """Here torchvision is missing or the network is off: either way the
    download fails, and ``mmfl run`` says so in one line."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmfl_flwr.cli",
            "run",
            "--engine",
            "inprocess",
            "--tasks",
            "mnist",
            "--download",
            "--data-root",
            str(tmp_path / "data"),
            "--output-dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parents[2]),
            "NO_PROXY": "*",
            "HTTPS_PROXY": "http://127.0.0.1:9",
            "HTTP_PROXY": "http://127.0.0.1:9",
        },
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("mmfl run: error: MNIST"), proc.stderr
    assert "download" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--download"])
def test_the_flag_is_a_switch_with_help(flag):
    out = subprocess.run(
        [sys.executable, "-m", "mmfl_flwr.cli", "run", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    ).stdout
    assert flag in out and "torchvision" in out
