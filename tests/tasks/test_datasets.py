"""The real-dataset loaders, read back from tiny files written in the real formats.

Nothing is mocked away: every test writes files the way the official distributions
store them (idx, raw or gzip; CIFAR's pickled batches; LEAF JSON; CelebA's attribute
and partition lists plus JPEG images) and runs the loader on them.
"""

from __future__ import annotations

import pickle
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from data_files import (
    CELEBA_NAMES,
    write_celeba,
    write_cifar_batch,
    write_idx,
    write_leaf_json,
)

from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.datasets import (
    EMNIST_NUM_CLASSES,
    LEAF_SHAKESPEARE_VOCAB,
    PAPER002_ATTRIBUTES,
    PAPER004_ATTRIBUTES,
    DatasetNotFound,
    TokenDataset,
    celeba_attribute_names,
    encode_chars,
    load_celeba,
    load_cifar10,
    load_emnist,
    load_leaf_shakespeare,
    load_mnist,
    read_idx,
)

# ----------------------------------------------------------------- format writers


def block_torchvision(monkeypatch) -> None:
    """Make ``import torchvision`` fail, whether or not it is installed."""
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)


# ------------------------------------------------------------------------- idx


def test_read_idx_raw_and_gz_agree(tmp_path):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, size=(3, 5, 7), dtype=np.uint8)
    raw = write_idx(tmp_path / "a" / "x-idx3-ubyte", arr)
    gz = write_idx(tmp_path / "b" / "x-idx3-ubyte", arr, gz=True)
    assert gz.name.endswith(".gz")
    np.testing.assert_array_equal(read_idx(raw, expected_magic=2051), arr)
    np.testing.assert_array_equal(read_idx(gz, expected_magic=2051), arr)


def test_read_idx_rejects_wrong_magic_and_truncation(tmp_path):
    labels = write_idx(tmp_path / "labels-idx1-ubyte", np.arange(4))
    with pytest.raises(ValueError, match="2051"):
        read_idx(labels, expected_magic=2051)
    bad = tmp_path / "short-idx3-ubyte"
    bad.write_bytes(labels.read_bytes()[:-1])
    with pytest.raises(ValueError, match="header says"):
        read_idx(bad)


# ------------------------------------------------------------------ MNIST family


def _mnist_like(rng, n):
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n)


def test_load_mnist_raw_files(tmp_path):
    rng = np.random.default_rng(1)
    images, labels = _mnist_like(rng, 6)
    raw = tmp_path / "MNIST" / "raw"
    write_idx(raw / "train-images-idx3-ubyte", images)
    write_idx(raw / "train-labels-idx1-ubyte", labels)
    ds = load_mnist(tmp_path, "train")
    assert isinstance(ds, Dataset)
    assert ds.x.shape == (6, 1, 28, 28) and ds.x.dtype == np.float32
    assert ds.y.dtype == np.int64
    np.testing.assert_allclose(ds.x[:, 0], images / 255.0, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(ds.y, labels)
    assert ds.x.min() >= 0.0 and ds.x.max() <= 1.0


def test_load_fashion_mnist_gz_test_split(tmp_path):
    rng = np.random.default_rng(2)
    images, labels = _mnist_like(rng, 4)
    raw = tmp_path / "FashionMNIST" / "raw"
    write_idx(raw / "t10k-images-idx3-ubyte", images, gz=True)
    write_idx(raw / "t10k-labels-idx1-ubyte", labels, gz=True)
    ds = load_mnist(tmp_path, "test", kind="fashion-mnist")
    np.testing.assert_array_equal(np.round(ds.x[:, 0] * 255).astype(np.uint8), images)
    np.testing.assert_array_equal(ds.y, labels)
    # The MNIST folder is a different dataset: not found there.
    with pytest.raises(DatasetNotFound):
        load_mnist(tmp_path, "test", kind="mnist")


def test_load_mnist_count_mismatch_is_an_error(tmp_path):
    rng = np.random.default_rng(3)
    images, labels = _mnist_like(rng, 4)
    raw = tmp_path / "MNIST" / "raw"
    write_idx(raw / "train-images-idx3-ubyte", images)
    write_idx(raw / "train-labels-idx1-ubyte", labels[:3])
    with pytest.raises(ValueError, match="4 images"):
        load_mnist(tmp_path)


def test_load_mnist_missing_lists_paths_and_howto(tmp_path):
    with pytest.raises(DatasetNotFound) as info:
        load_mnist(tmp_path / "nowhere", "train")
    err = info.value
    assert isinstance(err, FileNotFoundError)
    msg = str(err)
    expected = tmp_path / "nowhere" / "MNIST" / "raw" / "train-images-idx3-ubyte"
    assert str(expected) in msg and str(expected) + ".gz" in msg
    assert str(expected) in err.paths
    assert "torchvision.datasets.MNIST" in msg and "download=True" in msg
    # the error survives pickling (Ray / multiprocessing carry exceptions)
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == msg


def test_load_emnist_balanced_fixes_orientation(tmp_path):
    # An upright, asymmetric glyph: a bar on the top rows and one down the left side.
    glyph = np.zeros((28, 28), dtype=np.uint8)
    glyph[2:5, 4:20] = 255
    glyph[2:25, 4:7] = 200
    images = np.stack([glyph, np.flipud(glyph), np.fliplr(glyph)])
    labels = np.array([0, 23, 46])
    raw = tmp_path / "EMNIST" / "raw"
    # EMNIST stores every image transposed.
    write_idx(raw / "emnist-balanced-train-images-idx3-ubyte", images.transpose(0, 2, 1), gz=True)
    write_idx(raw / "emnist-balanced-train-labels-idx1-ubyte", labels, gz=True)
    ds = load_emnist(tmp_path, "train")
    assert ds.x.shape == (3, 1, 28, 28) and ds.x.dtype == np.float32
    np.testing.assert_array_equal(np.round(ds.x[:, 0] * 255).astype(np.uint8), images)
    np.testing.assert_array_equal(ds.y, labels)
    assert EMNIST_NUM_CLASSES["balanced"] == 47


def test_load_emnist_missing(tmp_path):
    with pytest.raises(DatasetNotFound) as info:
        load_emnist(tmp_path, "test")
    msg = str(info.value)
    assert str(tmp_path / "EMNIST" / "raw" / "emnist-balanced-test-images-idx3-ubyte") in msg
    assert "torchvision.datasets.EMNIST" in msg and "nist.gov" in msg


# -------------------------------------------------------------------- CIFAR-10


def test_load_cifar10_train_and_test(tmp_path):
    rng = np.random.default_rng(4)
    folder = tmp_path / "cifar-10-batches-py"
    datas, labels = [], []
    for b in range(1, 6):
        d = rng.integers(0, 256, size=(2, 3072), dtype=np.uint8)
        lab = [int(v) for v in rng.integers(0, 10, 2)]
        write_cifar_batch(folder / f"data_batch_{b}", d, lab)
        datas.append(d)
        labels += lab
    test_data = rng.integers(0, 256, size=(3, 3072), dtype=np.uint8)
    write_cifar_batch(folder / "test_batch", test_data, [7, 8, 9])

    train = load_cifar10(tmp_path, "train")
    assert train.x.shape == (10, 3, 32, 32) and train.x.dtype == np.float32
    assert train.y.dtype == np.int64
    np.testing.assert_array_equal(train.y, labels)
    all_data = np.concatenate(datas)
    # channel-major: the first 1024 bytes are the red plane, row by row
    np.testing.assert_allclose(train.x[3, 0], all_data[3, :1024].reshape(32, 32) / 255.0, atol=1e-7)
    np.testing.assert_allclose(train.x[3, 2], all_data[3, 2048:].reshape(32, 32) / 255.0, atol=1e-7)
    test = load_cifar10(tmp_path, "test")
    np.testing.assert_array_equal(test.y, [7, 8, 9])
    np.testing.assert_array_equal(np.round(test.x * 255).astype(np.uint8).reshape(3, -1), test_data)


def test_load_cifar10_missing_batch(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    for b in range(1, 5):  # data_batch_5 missing
        write_cifar_batch(folder / f"data_batch_{b}", np.zeros((1, 3072)), [0])
    with pytest.raises(DatasetNotFound) as info:
        load_cifar10(tmp_path, "train")
    msg = str(info.value)
    assert str(folder / "data_batch_5") in msg
    assert "torchvision.datasets.CIFAR10" in msg and "cifar-10-python.tar.gz" in msg


# ---------------------------------------------------------- download=True paths


@pytest.mark.parametrize(
    "call",
    [
        lambda r: load_mnist(r, download=True),
        lambda r: load_mnist(r, kind="fashion-mnist", download=True),
        lambda r: load_emnist(r, download=True),
        lambda r: load_cifar10(r, download=True),
        lambda r: load_celeba(r, download=True),
    ],
    ids=["mnist", "fashion-mnist", "emnist", "cifar10", "celeba"],
)
def test_download_without_torchvision_is_a_clear_error(tmp_path, monkeypatch, call):
    block_torchvision(monkeypatch)
    with pytest.raises(DatasetNotFound) as info:
        call(tmp_path)
    msg = str(info.value)
    assert "download=True needs torchvision" in msg
    assert str(tmp_path) in msg and "How to get it" in msg


def _fake_torchvision(monkeypatch, datasets_module: types.ModuleType) -> None:
    tv = types.ModuleType("torchvision")
    tv.datasets = datasets_module
    monkeypatch.setitem(sys.modules, "torchvision", tv)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", datasets_module)


def test_download_failure_is_reported(tmp_path, monkeypatch):
    """A torchvision that cannot reach the network (as here) gives a clear error."""
    tvd = types.ModuleType("torchvision.datasets")

    class MNIST:
        def __init__(self, root, train=True, download=False):
            raise OSError("Name or service not known")

    tvd.MNIST = MNIST
    _fake_torchvision(monkeypatch, tvd)
    with pytest.raises(DatasetNotFound, match="torchvision download failed.*service not known"):
        load_mnist(tmp_path, download=True)


def test_download_then_read(tmp_path, monkeypatch):
    """After a successful torchvision download the loader reads the new files."""
    rng = np.random.default_rng(5)
    images, labels = _mnist_like(rng, 2)
    calls = []
    tvd = types.ModuleType("torchvision.datasets")

    class FashionMNIST:  # writes what torchvision's downloader writes
        def __init__(self, root, train=True, download=False):
            calls.append((root, train, download))
            raw = Path(root) / "FashionMNIST" / "raw"
            write_idx(raw / "train-images-idx3-ubyte", images)
            write_idx(raw / "train-labels-idx1-ubyte", labels)

    tvd.FashionMNIST = FashionMNIST
    _fake_torchvision(monkeypatch, tvd)
    ds = load_mnist(tmp_path, kind="fashion-mnist", download=True)
    assert calls == [(str(tmp_path), True, True)]
    np.testing.assert_array_equal(ds.y, labels)
    # present files are never downloaded again
    load_mnist(tmp_path, kind="fashion-mnist", download=True)
    assert len(calls) == 1


# ------------------------------------------------------------ LEAF Shakespeare


def test_leaf_vocabulary_constant():
    assert len(LEAF_SHAKESPEARE_VOCAB) == 80
    assert LEAF_SHAKESPEARE_VOCAB[:2] == "\n " and LEAF_SHAKESPEARE_VOCAB[-1] == "}"
    np.testing.assert_array_equal(encode_chars(LEAF_SHAKESPEARE_VOCAB), np.arange(80))
    assert encode_chars("é")[0] == LEAF_SHAKESPEARE_VOCAB.index(" ")
    with pytest.raises(ValueError, match="outside"):
        encode_chars("aé", unknown=None)


def _seq(rng, length=80):
    return "".join(rng.choice(list(LEAF_SHAKESPEARE_VOCAB), size=length))


def test_load_leaf_shakespeare_per_user(tmp_path):
    rng = np.random.default_rng(6)
    data_dir = tmp_path / "shakespeare" / "data"
    a = ([_seq(rng) for _ in range(3)], ["a", "B", "\n"])
    b1 = ([_seq(rng) for _ in range(2)], ["}", "0"])
    b2 = ([_seq(rng)], ["?"])
    c = ([_seq(rng)], ["z"])
    write_leaf_json(
        data_dir / "train" / "all_data_0_train.json",
        {"THE_TEMPEST_MIRANDA": a, "HAMLET_OPHELIA": b1},
    )
    write_leaf_json(data_dir / "train" / "all_data_1_train.json", {"HAMLET_OPHELIA": b2})
    write_leaf_json(data_dir / "test" / "all_data_0_test.json", {"KING_LEAR_FOOL": c})

    users, vocab_size = load_leaf_shakespeare(tmp_path, "train")
    assert vocab_size == 80
    assert list(users) == ["HAMLET_OPHELIA", "THE_TEMPEST_MIRANDA"]
    ham = users["HAMLET_OPHELIA"]
    assert isinstance(ham, TokenDataset) and isinstance(ham, Dataset)
    assert ham.x.shape == (3, 80) and ham.x.dtype == np.int64 and ham.y.dtype == np.int64
    decode = lambda row: "".join(LEAF_SHAKESPEARE_VOCAB[i] for i in row)  # noqa: E731
    assert [decode(r) for r in ham.x] == b1[0] + b2[0]
    assert decode(ham.y) == "}0?"
    mir = users["THE_TEMPEST_MIRANDA"]
    assert [decode(r) for r in mir.x] == a[0] and decode(mir.y) == "aB\n"
    sub = mir.subset(np.array([2, 0]))
    assert isinstance(sub, TokenDataset) and sub.x.dtype == np.int64
    assert decode(sub.y) == "\na"

    test_users, _ = load_leaf_shakespeare(tmp_path, "test")
    assert list(test_users) == ["KING_LEAR_FOOL"]


def test_load_leaf_shakespeare_missing(tmp_path):
    with pytest.raises(DatasetNotFound) as info:
        load_leaf_shakespeare(tmp_path, "train")
    msg = str(info.value)
    assert str(tmp_path / "shakespeare" / "data" / "train" / "*.json") in msg
    assert "TalwalkarLab/leaf" in msg and "preprocess.sh" in msg
    with pytest.raises(DatasetNotFound, match="cannot be downloaded automatically"):
        load_leaf_shakespeare(tmp_path, "train", download=True)


def test_load_leaf_shakespeare_rejects_ragged(tmp_path):
    write_leaf_json(
        tmp_path / "shakespeare" / "data" / "train" / "x.json", {"u": (["abc", "ab"], ["d", "c"])}
    )
    with pytest.raises(ValueError, match="different lengths"):
        load_leaf_shakespeare(tmp_path)


# ---------------------------------------------------------------------- CelebA

ROWS = [  # image id, values of CELEBA_NAMES, official split
    ("000001.jpg", [-1, 1, 1, -1], 0),
    ("000002.jpg", [1, -1, -1, 1], 0),
    ("000003.jpg", [-1, -1, 1, 1], 1),
    ("000004.jpg", [-1, 1, -1, -1], 2),
    ("000005.jpg", [1, 1, 1, 1], 0),
]
COLORS = [(250, 10, 10), (10, 250, 10), (10, 10, 250), (128, 128, 128), (200, 100, 50)]


def test_paper_attribute_constants():
    assert len(PAPER002_ATTRIBUTES) == 9 and len(set(PAPER002_ATTRIBUTES)) == 9
    assert PAPER004_ATTRIBUTES == ("Smiling", "Eyeglasses")
    assert set(PAPER004_ATTRIBUTES) <= set(PAPER002_ATTRIBUTES)


def test_load_celeba_jpeg(tmp_path):
    pytest.importorskip("PIL")
    write_celeba(tmp_path, ROWS, COLORS, size=(12, 10))
    assert celeba_attribute_names(tmp_path) == CELEBA_NAMES
    tasks = load_celeba(tmp_path, "train", attributes=("Smiling", "Eyeglasses"), image_size=None)
    assert list(tasks) == ["Smiling", "Eyeglasses"]
    smiling, glasses = tasks["Smiling"], tasks["Eyeglasses"]
    # train = images 1, 2 and 5; 1 -> 1, -1 -> 0
    np.testing.assert_array_equal(smiling.y, [0, 1, 1])
    np.testing.assert_array_equal(glasses.y, [1, 0, 1])
    assert smiling.y.dtype == np.int64
    assert smiling.x.shape == (3, 3, 12, 10) and smiling.x.dtype == np.float32
    assert smiling.x is glasses.x  # one shared image array
    for i, color in zip(range(3), [COLORS[0], COLORS[1], COLORS[4]]):
        # solid colours survive JPEG compression up to a few levels
        np.testing.assert_allclose(
            smiling.x[i].mean(axis=(1, 2)), np.array(color) / 255.0, atol=4 / 255
        )

    resized = load_celeba(tmp_path, "test", attributes=("Male",), image_size=8)
    assert resized["Male"].x.shape == (1, 3, 8, 8)
    np.testing.assert_array_equal(resized["Male"].y, [0])
    np.testing.assert_allclose(resized["Male"].x[0], 128 / 255.0, atol=4 / 255)

    everything = load_celeba(
        tmp_path, "all", attributes=PAPER004_ATTRIBUTES, image_size=(6, 4), limit=4
    )
    assert everything["Smiling"].x.shape == (4, 3, 6, 4)
    np.testing.assert_array_equal(everything["Smiling"].y, [0, 1, 1, 0])

    with pytest.raises(ValueError, match="unknown CelebA attributes"):
        load_celeba(tmp_path, attributes=PAPER002_ATTRIBUTES)


def test_load_celeba_npy_images_are_exact(tmp_path):
    write_celeba(tmp_path, ROWS, COLORS, size=(4, 4), fmt="npy")
    tasks = load_celeba(tmp_path, "valid", attributes=("Smiling",), image_size=4)
    x = tasks["Smiling"].x
    assert x.shape == (1, 3, 4, 4)
    np.testing.assert_allclose(x[0, :, 0, 0], np.array(COLORS[2]) / 255.0, atol=1e-7)
    np.testing.assert_array_equal(tasks["Smiling"].y, [1])


def test_load_celeba_without_pillow_names_the_package(tmp_path, monkeypatch):
    pytest.importorskip("PIL")
    write_celeba(tmp_path, ROWS[:1], COLORS[:1])
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ModuleNotFoundError, match="Pillow"):
        load_celeba(tmp_path, "train")


def test_load_celeba_missing(tmp_path):
    with pytest.raises(DatasetNotFound) as info:
        load_celeba(tmp_path, "train")
    msg = str(info.value)
    base = tmp_path / "celeba"
    for p in ("list_attr_celeba.txt", "list_eval_partition.txt", "img_align_celeba"):
        assert str(base / p) in msg
    assert "mmlab.ie.cuhk.edu.hk" in msg


def test_load_celeba_missing_image(tmp_path):
    write_celeba(tmp_path, ROWS, COLORS, fmt="npy", size=(4, 4))
    (tmp_path / "celeba" / "img_align_celeba" / "000002.jpg.npy").unlink()
    with pytest.raises(DatasetNotFound) as info:
        load_celeba(tmp_path, "train", image_size=4)
    assert str(tmp_path / "celeba" / "img_align_celeba" / "000002.jpg") in str(info.value)
