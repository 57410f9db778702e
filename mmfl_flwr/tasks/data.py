"""Datasets used by the MMFL tasks (numpy and scikit-learn only, no torch).

Two sources are provided:

* the scikit-learn ``digits`` images (8x8 grey-scale, 10 classes), split once into a
  global train and test set;
* the FedProx ``Synthetic(alpha, beta)`` generator (and its IID variant), one
  independent generator per user so that user ``k`` is the same no matter how many
  users are requested.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "Dataset",
    "load_digits_data",
    "synthetic_users",
    "packed_synthetic_users",
    "concat_datasets",
]

#: Stream index of the generator that draws the parameters shared by all users in
#: Synthetic-IID (kept apart from every per-user stream ``[seed, k]``).
_SHARED_STREAM = 2**31 - 1


@dataclass
class Dataset:
    """A labelled set of examples.

    Attributes
    ----------
    x : np.ndarray
        Inputs, float32, first axis indexes examples.
    y : np.ndarray
        Integer class labels, int64, shape ``(n,)``.
    """

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        self.x = np.asarray(self.x, dtype=np.float32)
        self.y = np.asarray(self.y, dtype=np.int64)
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x has {self.x.shape[0]} examples but y has {self.y.shape[0]}")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices: np.ndarray) -> Dataset:
        """Return the examples at ``indices`` (a copy).

        Parameters
        ----------
        indices : np.ndarray
            Integer indices into this dataset.

        Returns
        -------
        Dataset
            A new dataset holding copies of the selected examples.
        """
        idx = np.asarray(indices, dtype=np.int64)
        return Dataset(self.x[idx], self.y[idx])


def concat_datasets(parts: list[Dataset]) -> Dataset:
    """Concatenate datasets along the example axis.

    Parameters
    ----------
    parts : list of Dataset
        Datasets with identical input shapes; must not be empty.

    Returns
    -------
    Dataset
        All examples of ``parts`` in order.
    """
    if not parts:
        raise ValueError("cannot concatenate an empty list of datasets")
    return Dataset(
        np.concatenate([p.x for p in parts], axis=0),
        np.concatenate([p.y for p in parts], axis=0),
    )


#: The digits data file inside scikit-learn's package (what ``load_digits`` reads).
_DIGITS_FILE = ("datasets", "data", "digits.csv.gz")


def _sklearn_digits_file() -> str | None:
    """The path of scikit-learn's ``digits.csv.gz``, found without importing
    scikit-learn (None when the installed version keeps it elsewhere)."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, *_DIGITS_FILE)
        if os.path.isfile(path):
            return path
    return None


@functools.lru_cache(maxsize=1)
def _raw_digits() -> tuple[np.ndarray, np.ndarray]:
    """Load the sklearn digits once, scaled to [0, 1] and shaped (n, 1, 8, 8).

    The file scikit-learn ships (1,797 rows of 64 pixel values 0-16 and the
    label) is read directly: importing scikit-learn costs about 3 s of CPU per
    process, paid by every Ray actor and SuperNode process that holds digits
    clients. Falls back to ``sklearn.datasets.load_digits`` where the file is
    not found; ``tests/tasks/test_tasks_data.py`` checks both give the same arrays."""
    path = _sklearn_digits_file()
    if path is not None:
        table = np.loadtxt(path, delimiter=",", dtype=np.float64)
        data, target = table[:, :-1], table[:, -1]
    else:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        data, target = bunch.data, bunch.target
    x = (np.asarray(data, dtype=np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = np.asarray(target, dtype=np.int64)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def cache_dir() -> Path | None:
    """Where mmfl-flwr keeps files it can recompute (the digits splits):
    ``$MMFL_CACHE_DIR``, else ``$XDG_CACHE_HOME/mmfl-flwr``, else
    ``~/.cache/mmfl-flwr``. ``MMFL_CACHE_DIR=""`` (empty) turns the cache off
    (returns None). Nothing in it changes a result: deleting it only costs time."""
    import os

    env = os.environ.get("MMFL_CACHE_DIR")
    if env is not None:
        return Path(env) if env.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mmfl-flwr"


def _valid_split(train: np.ndarray, test: np.ndarray, y: np.ndarray, n_test: int) -> bool:
    """A cached split is used only if it is a stratified-size partition of the
    examples: every index once, ``n_test`` of them in the test part."""
    if train.ndim != 1 or test.ndim != 1 or test.shape[0] != n_test:
        return False
    both = np.concatenate([train, test])
    return both.shape[0] == y.shape[0] and bool(
        np.array_equal(np.sort(both), np.arange(y.shape[0]))
    )


def _sklearn_split(y: np.ndarray, seed: int, test_fraction: float):
    from sklearn.model_selection import train_test_split

    idx = np.arange(y.shape[0])
    train_idx, test_idx = train_test_split(
        idx, test_size=test_fraction, random_state=seed, stratify=y, shuffle=True
    )
    return np.asarray(train_idx, dtype=np.int64), np.asarray(test_idx, dtype=np.int64)


def _write_split(path: Path, train: np.ndarray, test: np.ndarray) -> None:
    """Write a split beside ``path`` under a unique name and rename it over
    ``path`` (several processes may write the same file at once; a reader sees
    a whole file or none). A cache that cannot be written is skipped."""
    import os
    import tempfile

    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, train=train, test=test)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


@functools.lru_cache(maxsize=32)
def _digits_split_indices(seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Stratified train/test indices of the digits data for ``seed``: scikit-learn's
    ``train_test_split`` (stratified, shuffled, ``random_state=seed``), computed
    once per (scikit-learn version, seed, fraction) and kept in :func:`cache_dir`
    so that other processes need not import scikit-learn (cached per process
    too). A cache file that cannot be read or is not a partition of the
    examples is ignored and rewritten; one that cannot be written is skipped."""
    import math
    from importlib.metadata import PackageNotFoundError, version

    _, y = _raw_digits()
    n_test = math.ceil(test_fraction * y.shape[0])
    try:
        sk_version = version("scikit-learn")
    except PackageNotFoundError:  # pragma: no cover - sklearn is a dependency
        sk_version = "unknown"
    root = cache_dir()
    path = (
        None
        if root is None
        else root / (f"digits-split-sklearn{sk_version}-seed{seed}-test{test_fraction!r}.npz")
    )
    split = None
    if path is not None and path.is_file():
        try:
            with np.load(path) as f:
                train_idx = np.asarray(f["train"], dtype=np.int64)
                test_idx = np.asarray(f["test"], dtype=np.int64)
            if _valid_split(train_idx, test_idx, y, n_test):
                split = train_idx, test_idx
        except Exception:  # unreadable: recomputed and rewritten below
            split = None
    if split is None:
        split = _sklearn_split(y, seed, test_fraction)
        if path is not None:
            _write_split(path, *split)
    train_idx, test_idx = split
    train_idx.setflags(write=False)
    test_idx.setflags(write=False)
    return train_idx, test_idx


def load_digits_data(seed: int, test_fraction: float = 0.2) -> tuple[Dataset, Dataset]:
    """Load the scikit-learn digits as a stratified train/test split.

    Pixel values are divided by 16 so they lie in [0, 1]. The split depends only on
    ``seed`` and ``test_fraction``; the (cheap) index computation and the raw load are
    cached, and fresh array copies are returned on every call.

    Parameters
    ----------
    seed : int
        Seed of the stratified split.
    test_fraction : float, default 0.2
        Fraction of the examples placed in the test set, in (0, 1).

    Returns
    -------
    tuple of Dataset
        ``(train, test)``; ``x`` is float32 of shape ``(n, 1, 8, 8)``, ``y`` is int64.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    x, y = _raw_digits()
    train_idx, test_idx = _digits_split_indices(int(seed), float(test_fraction))
    return (
        Dataset(x[train_idx].copy(), y[train_idx].copy()),
        Dataset(x[test_idx].copy(), y[test_idx].copy()),
    )


def _split_user(x: np.ndarray, y: np.ndarray) -> tuple[Dataset, Dataset]:
    """90/10 train/test split of one user's samples (first 90% train, as FedProx)."""
    n_train = int(0.9 * y.shape[0])
    return Dataset(x[:n_train], y[:n_train]), Dataset(x[n_train:], y[n_train:])


def _num_samples(rng: np.random.Generator, max_samples: int | None) -> int:
    """Samples of one user: floor(lognormal(4, 2)) + 50, optionally capped."""
    n = int(np.floor(rng.lognormal(4.0, 2.0))) + 50
    if max_samples is not None:
        n = min(n, int(max_samples))
    return n


def synthetic_users(
    alpha: float,
    beta: float,
    num_users: int,
    dim: int = 60,
    num_classes: int = 5,
    seed: int = 0,
    iid: bool = False,
    max_samples: int | None = None,
    ids: Iterable[int] | None = None,
) -> list[tuple[Dataset, Dataset]]:
    """Generate the FedProx ``Synthetic(alpha, beta)`` users.

    For each user ``k`` (its own generator ``np.random.default_rng([seed, k])``)::

        u_k ~ N(0, alpha),  B_k ~ N(0, beta)          (alpha, beta standard deviations)
        W_k ~ N(u_k, 1)  (dim x C),  b_k ~ N(u_k, 1)  (C)
        v_k ~ N(B_k, 1)  (dim)
        n_k = floor(lognormal(4, 2)) + 50              (capped at ``max_samples``)
        x ~ N(v_k, diag(j^-1.2)), j = 1..dim           (diagonal covariance)
        y = argmax softmax(x W_k + b_k)

    With ``iid=True`` (FedProx's Synthetic-IID) a single ``W, b ~ N(0, 1)`` is drawn
    from ``np.random.default_rng([seed, 2**31 - 1])`` and shared by all users, and
    ``x ~ N(0, diag(j^-1.2))``; ``alpha`` and ``beta`` are then unused.

    Each user's samples are split 90/10 into train and test (the first
    ``int(0.9 n_k)`` samples are train; samples are i.i.d. within a user).

    Parameters
    ----------
    alpha : float
        Standard deviation of the per-user model mean ``u_k`` (>= 0).
    beta : float
        Standard deviation of the per-user input mean ``B_k`` (>= 0).
    num_users : int
        Number of users to generate.
    dim : int, default 60
        Input dimension.
    num_classes : int, default 5
        Number of classes ``C``.
    seed : int, default 0
        Base seed; user ``k`` depends only on ``(seed, k)`` (and the shared stream
        for the IID variant), not on ``num_users``.
    iid : bool, default False
        Generate Synthetic-IID instead of Synthetic(alpha, beta).
    max_samples : int or None, default None
        Upper bound on the samples per user (before the train/test split).
    ids : iterable of int or None, default None
        Generate only these users (each exactly as in the whole population, in
        the order given; a node hosting a shard of a big federation builds its
        own clients only); ``None``: users ``0 .. num_users - 1``.

    Returns
    -------
    list of tuple of Dataset
        ``[(train_k, test_k) for k in ids]`` (``ids`` defaults to ``range(num_users)``);
        ``x`` float32 ``(n, dim)``, ``y`` int64.
    """
    draws = _SyntheticDraws(alpha, beta, num_users, dim, num_classes, seed, iid, max_samples)
    users: list[tuple[Dataset, Dataset]] = []
    for k in range(num_users) if ids is None else ids:
        x, y = draws.samples(k)
        users.append(_split_user(x.astype(np.float32), y.astype(np.int64)))
    return users


class _SyntheticDraws:
    """The draws of :func:`synthetic_users`' users, one user's generator at a time."""

    def __init__(
        self,
        alpha: float,
        beta: float,
        num_users: int,
        dim: int,
        num_classes: int,
        seed: int,
        iid: bool,
        max_samples: int | None,
    ) -> None:
        if num_users < 0:
            raise ValueError(f"num_users must be >= 0, got {num_users}")
        if alpha < 0 or beta < 0:
            raise ValueError("alpha and beta are standard deviations and must be >= 0")
        if max_samples is not None and max_samples < 2:
            raise ValueError("max_samples must be >= 2 so that train and test are non-empty")
        self.alpha, self.beta, self.num_users = alpha, beta, num_users
        self.dim, self.num_classes, self.iid, self.max_samples = dim, num_classes, iid, max_samples
        self.seed = int(seed)
        # Diagonal covariance j^-1.2 -> per-coordinate standard deviation j^-0.6.
        self.x_std = np.power(np.arange(1, dim + 1, dtype=np.float64), -0.6)
        self.shared_w = self.shared_b = None
        if iid:
            shared_rng = np.random.default_rng([self.seed, _SHARED_STREAM])
            self.shared_w = shared_rng.normal(0.0, 1.0, size=(dim, num_classes))
            self.shared_b = shared_rng.normal(0.0, 1.0, size=num_classes)

    def _start(self, k: int) -> tuple[np.random.Generator, Any, Any, Any, int]:
        """User ``k``'s generator after its model and size draws: ``(rng, w, b, v, n_k)``."""
        k = int(k)
        if not 0 <= k < self.num_users:
            raise ValueError(f"user id {k} is outside [0, {self.num_users})")
        rng = np.random.default_rng([self.seed, k])
        if self.iid:
            w, b, v = self.shared_w, self.shared_b, np.zeros(self.dim)
        else:
            u_k = rng.normal(0.0, self.alpha)
            big_b_k = rng.normal(0.0, self.beta)
            w = rng.normal(u_k, 1.0, size=(self.dim, self.num_classes))
            b = rng.normal(u_k, 1.0, size=self.num_classes)
            v = rng.normal(big_b_k, 1.0, size=self.dim)
        return rng, w, b, v, _num_samples(rng, self.max_samples)

    def size(self, k: int) -> int:
        """User ``k``'s number of samples (train and test)."""
        return self._start(k)[4]

    def samples(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """User ``k``'s inputs (float64) and labels."""
        rng, w, b, v, n_k = self._start(k)
        x = v + rng.standard_normal(size=(n_k, self.dim)) * self.x_std
        # argmax of softmax(z) == argmax of z (softmax is monotone).
        return x, np.argmax(x @ w + b, axis=1)


def packed_synthetic_users(
    alpha: float,
    beta: float,
    num_users: int,
    ids: Iterable[int],
    dim: int = 60,
    num_classes: int = 5,
    seed: int = 0,
    iid: bool = False,
    max_samples: int | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The users ``ids`` of :func:`synthetic_users` (the same values), packed:
    ``((x_train, y_train, train_ends), (x_test, y_test, test_ends))``, each
    user's train (test) rows after the previous user's, ``ends`` the cumulative
    row counts. Two passes over the users' generators (their sizes, then their
    samples written in place) instead of arrays per user and a concatenation: a
    node generating 50,000 users held 0.5 GB more while it did."""
    draws = _SyntheticDraws(alpha, beta, num_users, dim, num_classes, seed, iid, max_samples)
    ids = list(ids)  # read twice (an iterator would be used up by the first pass)
    sizes = np.array([draws.size(k) for k in ids], dtype=np.int64)
    n_train = np.array([int(0.9 * int(n)) for n in sizes], dtype=np.int64)  # as _split_user
    ends = (np.cumsum(n_train), np.cumsum(sizes - n_train))
    out = [
        (
            np.empty((int(e[-1]) if len(e) else 0, dim), np.float32),
            np.empty(int(e[-1]) if len(e) else 0, np.int64),
        )
        for e in ends
    ]
    (xtr, ytr), (xte, yte) = out
    a = c = 0
    for k, ntr, n in zip(ids, n_train.tolist(), sizes.tolist()):
        x, y = draws.samples(k)
        xtr[a : a + ntr] = x[:ntr]
        ytr[a : a + ntr] = y[:ntr]
        xte[c : c + n - ntr] = x[ntr:]
        yte[c : c + n - ntr] = y[ntr:]
        a += ntr
        c += n - ntr
    return (xtr, ytr, ends[0]), (xte, yte, ends[1])
