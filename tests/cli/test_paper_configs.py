"""Every paper configuration in configs/ starts on tiny data written in the real
on-disk formats (idx, CIFAR pickles, LEAF JSON, CelebA lists + images): a smoke run
of one round on the in-process engine, through the real loaders, partitions and
models."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import numpy as np
import pytest
from data_files import write_cifar_batch, write_idx, write_leaf_json

from mmfl_flwr.cli import main as cli_main
from mmfl_flwr.config import Settings
from mmfl_flwr.runner import run
from mmfl_flwr.tasks.datasets import PAPER002_ATTRIBUTES

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))


def _images(rng: np.random.Generator, n: int, classes: int, shape=(28, 28)):
    y = np.arange(n) % classes
    x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    return x, y.astype(np.uint8)


def write_tiny_data(root: Path) -> None:
    """A few examples of every real dataset the configs use."""
    rng = np.random.default_rng(0)
    for folder, prefix in (("MNIST", ""), ("FashionMNIST", "")):
        raw = root / folder / "raw"
        for split, n in (("train", 80), ("t10k", 20)):
            x, y = _images(rng, n, 10)
            write_idx(raw / f"{prefix}{split}-images-idx3-ubyte", x)
            write_idx(raw / f"{prefix}{split}-labels-idx1-ubyte", y)
    raw = root / "EMNIST" / "raw"
    for split, n in (("train", 94), ("test", 47)):
        x, y = _images(rng, n, 47)
        write_idx(raw / f"emnist-balanced-{split}-images-idx3-ubyte", x)
        write_idx(raw / f"emnist-balanced-{split}-labels-idx1-ubyte", y)
    cifar = root / "cifar-10-batches-py"
    for name, n in [(f"data_batch_{i}", 8) for i in range(1, 6)] + [("test_batch", 10)]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        write_cifar_batch(cifar / name, data, [int(v) for v in np.arange(n) % 10])
    text = "To be, or not to be, that is the question: whether 'tis nobler in the mind "
    for split, count in (("train", 12), ("test", 4)):
        users = {}
        for u in range(8):
            xs = [(text * 3)[i + u : i + u + 80] for i in range(count)]
            ys = [(text * 3)[i + u + 80] for i in range(count)]
            users[f"ROLE_{u}"] = (xs, ys)
        write_leaf_json(root / "shakespeare" / "data" / split / "all.json", users)
    # CelebA: the attribute list with paper 002's nine attributes (+ one more),
    # the split file, and images as .npy (no Pillow needed)
    base = root / "celeba"
    (base / "img_align_celeba").mkdir(parents=True, exist_ok=True)
    names = ["5_o_Clock_Shadow", *PAPER002_ATTRIBUTES]
    lines = ["24", " ".join(names)]
    parts = []
    for i in range(24):
        image_id = f"{i:06d}.jpg"
        values = [1 if (i + j) % 2 else -1 for j in range(len(names))]
        lines.append(image_id + " " + " ".join(f"{v:2d}" for v in values))
        parts.append(f"{image_id} {0 if i < 16 else 2}\n")
        np.save(
            base / "img_align_celeba" / (image_id + ".npy"),
            rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8),
        )
    (base / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    (base / "list_eval_partition.txt").write_text("".join(parts))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_tiny_data(root)
    return root


def test_there_are_configs_for_every_paper() -> None:
    names = {p.stem for p in CONFIGS}
    assert {
        "paper003-3task",
        "paper003-5task",
        "paper001-5task",
        "paper002-synthetic",
        "paper002-celeba",
        "paper004-synthetic",
        "paper004-celeba",
    } <= names


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_paper_config_starts_on_tiny_data(config: Path, data_root: Path) -> None:
    with open(config, "rb") as f:
        cfg = tomllib.load(f)
    s = Settings.from_run_config(cfg)
    assert not s.extra, s.extra
    s.data_root = str(data_root)
    s.num_rounds = 1
    s.num_clients = 6
    s.local_epochs = 1
    s.output_dir = ""
    if s.clients_per_round:
        s.clients_per_round = min(s.clients_per_round, 3)
    s.validate()
    result = run(s, engine="inprocess")
    rows = [r for r in result.history if r["round"] == 1]
    assert {r["task"] for r in rows} == set(s.model_names)
    assert all(math.isfinite(r["accuracy"]) and math.isfinite(r["loss"]) for r in rows)
    # the papers' experiments page names the command and the data of every config
    readme = (ROOT / "docs" / "how-to" / "papers-experiments.md").read_text()
    assert f"configs/{config.name}" in readme


def test_cli_config_flag_and_overrides(data_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc = cli_main(
        [
            "run",
            "--engine",
            "inprocess",
            "--config",
            str(ROOT / "configs" / "paper002-synthetic.toml"),
            "--num-rounds",
            "1",
            "--num-clients",
            "5",
            "--output-dir",
            str(out),
        ]
    )
    assert rc == 0
    saved = Settings.load(str(out / "config.json"))
    assert saved.tasks == "synthetic,synthetic-b" and saved.strategy == "mfa-rr"
    assert saved.num_rounds == 1 and saved.num_clients == 5


def test_missing_data_says_where_it_looked(tmp_path: Path) -> None:
    s = Settings(
        tasks="fashion-mnist",
        num_clients=2,
        num_rounds=1,
        output_dir="",
        data_root=str(tmp_path / "nothing"),
    )
    with pytest.raises(FileNotFoundError, match="nothing"):
        run(s, engine="inprocess")
