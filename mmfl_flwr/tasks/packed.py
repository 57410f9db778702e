"""The clients' data of one task packed into a few contiguous arrays
(:class:`PackedUsers`), optionally mapped from files shared by the processes of
one machine (:func:`shared_array`).

numpy only (no torch).
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import os
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any, overload

import numpy as np

from mmfl_flwr.tasks.data import Dataset

__all__ = ["PackedUsers", "SHARED_DATA_ENV", "shared_array", "trim_heap"]


class PackedUsers(Sequence[tuple[Dataset, Dataset]]):
    """Every client's ``(train, local_test)`` of one task, where the held users'
    data lie in four contiguous arrays (train inputs, train labels, test inputs,
    test labels), each user's rows after the previous user's: one allocation per
    array instead of four per user (100,000 small arrays fragment the heap), and
    a node that evaluates its users one after another reads them without a copy
    (:func:`mmfl_flwr.client.trainer` shares the rows). A user's datasets are
    views made when asked for (a node hosting 50,000 clients of two tasks held
    0.11 GB of dataset objects otherwise); a client holding none gets ``empty``.
    """

    def __init__(
        self,
        num_clients: int,
        held: list[int],
        packed: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
        empty: tuple[Dataset, Dataset],
    ) -> None:
        """``packed``: for train and test, ``(inputs, labels, ends)`` of the ``held``
        users one after another (``ends``: cumulative row counts); the arrays go
        through :func:`shared_array`."""
        self._n = int(num_clients)
        self._empty = empty
        self._pos = np.full(self._n, -1, dtype=np.int64)
        self._pos[np.asarray(held, dtype=np.int64)] = np.arange(len(held))
        self._arrays = [
            (shared_array(xs), shared_array(ys), np.asarray(ends, dtype=np.int64))
            for xs, ys, ends in packed
        ]

    @classmethod
    def from_users(
        cls,
        num_clients: int,
        held: list[int],
        users: list[tuple[Dataset, Dataset]],
        empty: tuple[Dataset, Dataset],
    ) -> PackedUsers:
        """The ``held`` users' datasets (``users``, in that order) packed."""
        packed = []
        for side in (0, 1):  # train, test
            xs = np.concatenate([u[side].x for u in users]) if users else empty[side].x
            ys = np.concatenate([u[side].y for u in users]) if users else empty[side].y
            packed.append((xs, ys, np.cumsum([len(u[side]) for u in users], dtype=np.int64)))
        return cls(num_clients, held, packed, empty)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, k: int) -> tuple[Dataset, Dataset]: ...

    @overload
    def __getitem__(self, k: slice) -> list[tuple[Dataset, Dataset]]: ...

    def __getitem__(self, k: int | slice) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._n))]
        i = operator.index(k)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"client {k} out of range [0, {self._n})")
        p = int(self._pos[i])
        if p < 0:
            return self._empty
        out = []
        for xs, ys, ends in self._arrays:
            a, b = (int(ends[p - 1]) if p else 0), int(ends[p])
            out.append(Dataset(xs[a:b], ys[a:b]))
        return out[0], out[1]


#: Environment variable naming a directory through which the processes of one
#: machine share the packed data of the clients they host (set by ``mmfl run
#: --engine simulation``): see :func:`shared_array`.
SHARED_DATA_ENV = "MMFL_SHARED_DATA"
_SHARE_FAILED: set[str] = set()


def shared_array(a: np.ndarray) -> np.ndarray:
    """``a``, or, where :data:`SHARED_DATA_ENV` names a directory, an array of
    the same values mapped (copy-on-write) from a file there named by its
    content, so that processes building the same clients' data map one copy of
    it. A Flower Ray worker keeps the clients of every node it has served, and
    Flower hands a message to any idle worker, so with two shard nodes each of
    two workers may come to hold both shards: mapped, their data is in memory
    once (a page read by two processes is one page). Arrays under 1 MiB are
    left as they are.

    The file is written once: to a temporary name, then linked to its own name,
    which fails where another process got there first (both then map the one
    file). A file whose content is not ``a``'s (changed by someone else) is not
    used. Where the directory cannot be written, ``a`` itself is returned, with
    one warning per directory and process."""
    where = os.environ.get(SHARED_DATA_ENV, "").strip()
    if not where or a.nbytes < (1 << 20) or where in _SHARE_FAILED:
        return a
    a = np.ascontiguousarray(a)
    digest = hashlib.blake2b(memoryview(a.data).cast("B"), digest_size=16).hexdigest()
    shape = "x".join(str(d) for d in a.shape)
    path = os.path.join(where, f"{digest}-{a.dtype.str.strip('<>|=')}-{shape}.npy")
    if not os.path.exists(path):
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=where, suffix=".part")
            with os.fdopen(fd, "wb") as f:
                np.save(f, a)
            with contextlib.suppress(FileExistsError):  # another process was first
                os.link(tmp, path)
        except OSError as err:
            _SHARE_FAILED.add(where)
            warnings.warn(
                f"{SHARED_DATA_ENV}={where}: clients' data not shared ({err})",
                RuntimeWarning,
                stacklevel=2,
            )
            return a
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
    try:
        mapped = np.asarray(np.load(path, mmap_mode="c"))  # views of it have it as base
    except (OSError, ValueError):  # a damaged file: this array is not shared
        return a
    # the name says the content; the content is checked all the same
    if (
        mapped.shape != a.shape
        or mapped.dtype != a.dtype
        or not mapped.flags.c_contiguous
        or not _same_bytes(mapped, a)
    ):
        return a
    return mapped


def _same_bytes(x: np.ndarray, y: np.ndarray, block: int = 1 << 24) -> bool:
    """Whether two C-contiguous arrays of one size hold the same bytes (NaN
    equals itself), compared 16 MiB at a time (no temporary of their size)."""
    bx, by = x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)
    return bx.shape == by.shape and all(
        np.array_equal(bx[i : i + block], by[i : i + block]) for i in range(0, bx.shape[0], block)
    )


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``;
    nothing elsewhere): the small arrays a federation is generated in are freed
    once packed, between long-lived ones, where the heap cannot shrink alone."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (ImportError, OSError, AttributeError):
        pass
