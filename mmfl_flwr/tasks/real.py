"""The papers' real datasets as task kinds, read from a local data root.

numpy only (the loaders in :mod:`mmfl_flwr.tasks.datasets` need no torch). The
kinds are declared by their modules in :mod:`mmfl_flwr.tasks.builtin`
(``images``: the labelled image datasets, partitioned like the embedded digits
task; ``shakespeare``: LEAF's natural split; ``celeba``: CelebA attributes split
IID); this module keeps their names importable from here and fetches the data
of the kinds that can download it.
"""

from __future__ import annotations

from mmfl_flwr.tasks.builtin.celeba import CELEBA_ATTRIBUTE, build_iid
from mmfl_flwr.tasks.builtin.celeba import load_split as _celeba_split
from mmfl_flwr.tasks.builtin.images import IMAGE_KINDS
from mmfl_flwr.tasks.builtin.images import load_split as _image_split
from mmfl_flwr.tasks.builtin.shakespeare import build_shakespeare, load_shakespeare
from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.registry import builtin_kinds, get_task, task_kinds

__all__ = [
    "CELEBA_ATTRIBUTE",
    "DOWNLOADABLE",
    "REAL_KINDS",
    "build_iid",
    "build_shakespeare",
    "download_datasets",
    "load_shakespeare",
    "load_split",
]

#: kind -> (number of classes, input shape, model) of the real-data kinds.
REAL_KINDS: dict[str, tuple[int, tuple[int, ...], str]] = {
    k: (s.num_classes, s.input_shape, s.model)
    for k, s in builtin_kinds().items()
    if k in (*IMAGE_KINDS, "shakespeare", *CELEBA_ATTRIBUTE)
}

#: The kinds whose data can be fetched (``download``; torchvision's).
DOWNLOADABLE = tuple(k for k in task_kinds() if getattr(get_task(k), "download", None))


def download_datasets(kinds: list[str], root: str) -> list[str]:
    """Fetch the missing data of every kind in ``kinds`` that can download it
    (:data:`DOWNLOADABLE`) into ``root``; returns those kinds. Raises
    FileNotFoundError (one line) when a download fails, e.g. offline."""
    done = []
    for kind in dict.fromkeys(kinds):
        definition = get_task(kind)
        if definition is not None and definition.download is not None:
            definition.download(root)
            done.append(kind)
    return done


def load_split(kind: str, root: str) -> tuple[Dataset, Dataset]:
    """(train, test) of an image kind (cached per process)."""
    if kind in IMAGE_KINDS:
        return _image_split(kind, root)
    if kind in CELEBA_ATTRIBUTE:
        return _celeba_split(kind, root)
    raise KeyError(kind)
