"""records' fast Array encoding and decoding give exactly Flower's bytes and arrays."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from mmfl_flwr.records import array_to_numpy, arrays_to_numpy, numpy_to_array, numpy_to_arrays

_RNG = np.random.default_rng(0)
CASES = [
    np.array(3.5),  # 0-d stays 0-d (batch-norm counters)
    np.array(7, dtype=np.int64),
    _RNG.normal(size=(16, 1, 3, 3)).astype(np.float32),
    _RNG.normal(size=(0, 4)),
    np.arange(10, dtype=np.float16),
    _RNG.normal(size=(3, 4)).T,  # not C-ordered
    np.array([True, False]),
    _RNG.normal(size=(2, 2)).astype(">f4"),  # big-endian
]


def _flower(a: np.ndarray) -> Array:
    return Array(a if a.flags.c_contiguous else a.copy(order="C"))


@pytest.mark.parametrize("a", CASES, ids=lambda a: f"{a.dtype}{a.shape}")
def test_encoding_is_flowers_and_decoding_round_trips(a):
    ref = _flower(a)
    mine = numpy_to_array(a)
    assert (mine.data, mine.dtype, tuple(mine.shape), mine.stype) == (
        ref.data,
        ref.dtype,
        tuple(ref.shape),
        ref.stype,
    )
    back = array_to_numpy(ref)
    np.testing.assert_array_equal(back, ref.numpy())
    assert back.dtype == ref.numpy().dtype and back.shape == ref.numpy().shape
    assert back.flags.writeable


def test_a_header_that_does_not_match_takes_flowers_path():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    good = _flower(a)
    # declared shape disagrees with the bytes: not the fast path; Flower's own
    # decoder reads what the bytes say
    odd = Array(dtype=good.dtype, shape=(3, 2), stype=good.stype, data=good.data)
    assert array_to_numpy(odd).shape == (2, 3)
    # corrupt bytes fail as Flower's decoder fails
    bad = Array(dtype=good.dtype, shape=(2, 3), stype=good.stype, data=b"garbage")
    with pytest.raises(ValueError):
        array_to_numpy(bad)


def test_records_round_trip():
    w = {f"k{i}": a for i, a in enumerate(CASES)}
    back = arrays_to_numpy(numpy_to_arrays(w))
    assert list(back) == list(w)
    for k in w:
        np.testing.assert_array_equal(back[k], w[k])
