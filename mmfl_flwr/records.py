"""Conversions between Flower records and numpy, and reply validation helpers.

No torch here: the server side runs where torch is absent.
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.common.constant import SType

NumpyWeights = dict[str, np.ndarray]


class InvalidReply(ValueError):
    """Part of a client's reply cannot be used; the message says why."""


@functools.lru_cache(maxsize=512)
def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header ``np.save`` writes for a C-ordered array of ``dtype`` and
    ``shape`` (what Flower's ``Array`` holds in front of the raw bytes)."""
    buf = io.BytesIO()
    np.save(buf, np.empty(shape, dtype=np.dtype(dtype)), allow_pickle=False)
    data = buf.getvalue()
    return data[: len(data) - int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize]


def array_to_numpy(arr: Array) -> np.ndarray:
    """``arr.numpy()``, without parsing the ``.npy`` header when it is exactly the
    header ``np.save`` writes for the array's declared dtype and shape (then the
    rest of the bytes is the data); anything else goes through ``arr.numpy()``.
    Returns a writable copy."""
    try:
        if arr.stype == SType.NUMPY and arr.dtype != "object":
            shape = tuple(int(d) for d in arr.shape)
            header = _npy_header(str(arr.dtype), shape)
            data = arr.data
            dtype = np.dtype(arr.dtype)
            n = int(np.prod(shape, dtype=np.int64))
            if len(data) == len(header) + n * dtype.itemsize and data.startswith(header):
                return (
                    np.frombuffer(data, dtype=dtype, count=n, offset=len(header))
                    .reshape(shape)
                    .copy()
                )
    except (TypeError, ValueError):  # an odd dtype or shape: the general path decides
        pass
    return arr.numpy()


def numpy_to_array(value: np.ndarray) -> Array:
    """``Array(value)`` with the same bytes Flower writes (``np.save`` of a C-ordered
    array), the header built once per dtype and shape."""
    a = np.asarray(value)
    if a.dtype.hasobject or not a.flags.c_contiguous:
        return Array(a if a.flags.c_contiguous else a.copy(order="C"))
    shape = tuple(int(d) for d in a.shape)
    header = _npy_header(str(a.dtype), shape)
    return Array(dtype=str(a.dtype), shape=shape, stype=SType.NUMPY, data=header + a.tobytes())


def arrays_to_numpy(record: ArrayRecord) -> NumpyWeights:
    """ArrayRecord -> ``{key: ndarray}`` in record order (fast path:
    :func:`array_to_numpy`)."""
    return {k: array_to_numpy(v) for k, v in record.items()}


class DecodeCache:
    """Decoded ArrayRecords, keyed by a digest of their bytes: the weights the server
    sends in a round are the same for every client, and a process that serves many
    clients (the in-process engines, a Ray actor of the simulation engine) decodes
    them once. Hashing costs about a tenth of decoding (Flower's ``Array.numpy``
    parses an ``.npy`` header per array). Every call returns fresh copies, so a
    trainer may modify what it gets."""

    def __init__(self, size: int = 8) -> None:
        self.size = int(size)
        self._entries: dict[bytes, NumpyWeights] = {}
        # byte strings of recently decoded records and their digests: a record whose
        # arrays hold these very objects (bytes are immutable; in-process copies
        # share them) has the same digest without hashing. The strings are kept
        # alive here, so their ids cannot be reused by other objects.
        self._seen: dict[tuple[int, ...], tuple[list[bytes], bytes]] = {}

    @staticmethod
    def digest(record: ArrayRecord) -> bytes:
        """A digest of the record's keys, types, shapes and bytes."""
        h = hashlib.blake2b(digest_size=20)
        for key, arr in record.items():
            h.update(repr((key, arr.stype, arr.dtype, tuple(arr.shape))).encode())
            h.update(len(arr.data).to_bytes(8, "little"))
            h.update(arr.data)
        return h.digest()

    def _key(self, record: ArrayRecord) -> bytes:
        datas = [arr.data for arr in record.values()]
        ids = tuple(id(d) for d in datas)
        seen = self._seen.get(ids)
        if seen is not None and all(a is b for a, b in zip(datas, seen[0])):
            return seen[1]
        key = self.digest(record)
        if len(self._seen) >= self.size:
            self._seen.pop(next(iter(self._seen)))
        self._seen[ids] = (datas, key)
        return key

    def decode(self, record: ArrayRecord) -> NumpyWeights:
        """``arrays_to_numpy(record)``, from the cache when the bytes were seen."""
        key = self._key(record)
        hit = self._entries.pop(key, None)
        if hit is None:
            hit = arrays_to_numpy(record)
            if len(self._entries) >= self.size:
                self._entries.pop(next(iter(self._entries)))
        self._entries[key] = hit  # most recent last
        return {k: v.copy() for k, v in hit.items()}


def numpy_to_arrays(weights: Mapping[str, np.ndarray]) -> ArrayRecord:
    """``{key: ndarray}`` -> ArrayRecord, keeping key order."""
    # np.ascontiguousarray would turn 0-d arrays (e.g. BatchNorm's
    # num_batches_tracked) into 1-d ones; keep their shape.
    out = {}
    for k, v in weights.items():
        out[k] = numpy_to_array(np.asarray(v))  # numpy scalars (0-d) back to arrays
    return ArrayRecord(out)


def check_weights(record: object, reference: Mapping[str, np.ndarray]) -> NumpyWeights:
    """Decode a client's ArrayRecord and check it against the global weights.

    The keys must be exactly the reference's, every array must have the
    reference's shape and dtype, and every value must be finite. Returns the
    arrays in the reference's key order; raises :class:`InvalidReply` otherwise.
    """
    if not isinstance(record, ArrayRecord):
        raise InvalidReply(f"expected an ArrayRecord, got {type(record).__name__}")
    keys, ref_keys = set(record.keys()), set(reference.keys())
    if keys != ref_keys:
        missing = sorted(ref_keys - keys)[:3]
        extra = sorted(keys - ref_keys)[:3]
        raise InvalidReply(f"array keys differ (missing {missing}, unexpected {extra})")
    out: NumpyWeights = {}
    for k, ref in reference.items():
        arr = record[k]
        try:
            value = array_to_numpy(arr)
        except Exception as err:  # corrupt bytes, wrong stype, ...
            raise InvalidReply(f"array {k!r} cannot be decoded: {err}") from err
        if value.shape != ref.shape:
            raise InvalidReply(f"array {k!r} has shape {value.shape}, expected {ref.shape}")
        if value.dtype != ref.dtype:
            raise InvalidReply(f"array {k!r} has dtype {value.dtype}, expected {ref.dtype}")
        if value.dtype.kind in "fc" and not np.isfinite(value).all():
            raise InvalidReply(f"array {k!r} contains NaN or inf")
        out[k] = value
    return out


def check_count(value: object, name: str, maximum: int) -> int:
    """A positive integer-valued count no larger than ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidReply(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value != int(value) or not 0 < value <= maximum:
        raise InvalidReply(f"{name} must be an integer in [1, {maximum}], got {value!r}")
    return int(value)


def check_loss(value: object, name: str, maximum: float) -> float:
    """A finite, non-negative loss no larger than ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidReply(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or not 0 <= value <= maximum:
        raise InvalidReply(f"{name} must be finite and in [0, {maximum}], got {value!r}")
    return float(value)
