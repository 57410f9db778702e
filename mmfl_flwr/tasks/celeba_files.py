"""CelebA's binary attribute tasks read from the official files
(:func:`load_celeba`). Importable from :mod:`mmfl_flwr.tasks.datasets`.

numpy and the standard library only (Pillow for the JPEG images, imported when
one is read).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np

from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.files import (
    DatasetNotFound,
    PathLike,
    _check_split,
    _try_torchvision_download,
)

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

    ids, names, values, rows = _celeba_rows(attr_file, part_file, split, attributes, limit)
    x = _celeba_images([ids[r] for r in rows], img_dir, attr_file, image_size)
    out: dict[str, Dataset] = {}
    for a in attributes:
        col = names.index(a)
        out[a] = Dataset(x, (values[rows, col] == 1).astype(np.int64))
    return out


def _celeba_rows(
    attr_file: Path, part_file: Path, split: str, attributes: Sequence[str], limit: int | None
) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """The attribute file's ids, names and values, and the rows of ``split``
    (the first ``limit``)."""
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
    return ids, names, values, rows


def _celeba_images(
    image_ids: list[str], img_dir: Path, attr_file: Path, image_size: int | tuple[int, int] | None
) -> np.ndarray:
    """The images of ``image_ids`` as float32 ``(n, 3, h, w)`` in [0, 1]."""
    size: tuple[int, int] | None = None
    if image_size is not None:
        size = (
            (image_size, image_size)
            if isinstance(image_size, int)
            else cast(tuple[int, int], tuple(image_size))
        )
    paths: list[Path] = []
    absent_imgs: list[Path] = []
    for image_id in image_ids:
        jpg = img_dir / image_id
        npy = img_dir / (image_id + ".npy")
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
    return x
