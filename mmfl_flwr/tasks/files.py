"""What the dataset loaders share: the not-found error that says where a loader
looked and how to get the data, the split check, and torchvision's downloader
as a fallback.

numpy and the standard library only.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

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
