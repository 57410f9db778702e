"""The ``celeba-*`` kinds: one binary CelebA attribute each (paper 002's nine
attributes, which include paper 004's two), e.g. ``celeba-smiling``, read from
``data_root`` (:func:`~mmfl_flwr.tasks.datasets.load_celeba`) as 3x32x32 images,
trained with the small CNN (:class:`~mmfl_flwr.tasks.zoo.CNN`).

Binary labels leave no room for a label skew: the training split is shared out
IID among the eligible clients by flwr-datasets' ``IidPartitioner``
(:func:`~mmfl_flwr.tasks.partitions.iid_partition`); local test sets are empty
and the whole test split is the server's.
"""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Any

import numpy as np

from mmfl_flwr.tasks.celeba_files import PAPER002_ATTRIBUTES
from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.registry import register_task
from mmfl_flwr.tasks.spec import Built, KindSpec, TaskBuild

SPEC = KindSpec(num_classes=2, input_shape=(3, 32, 32), model="cnn")

#: CelebA attribute of each ``celeba-*`` kind (paper 002's nine).
CELEBA_ATTRIBUTE = {"celeba-" + a.lower(): a for a in PAPER002_ATTRIBUTES}


@lru_cache(maxsize=16)
def load_split(kind: str, root: str) -> tuple[Dataset, Dataset]:
    """(train, test) of a ``celeba-*`` kind (cached per process)."""
    from mmfl_flwr.tasks import datasets as D  # imported with the data, not at validation

    attr = CELEBA_ATTRIBUTE[kind]
    return (
        D.load_celeba(root, "train", (attr,))[attr],
        D.load_celeba(root, "test", (attr,))[attr],
    )


def build_iid(
    train: Dataset, test: Dataset, num_clients: int, seed: int, copy: int, eligible: np.ndarray
) -> tuple[list[tuple[Dataset, Dataset]], Dataset]:
    """IID split of ``train`` among the eligible clients (flwr-datasets'
    ``IidPartitioner`` on a random order of the examples, imported on first use);
    the whole test split is the server's."""
    from mmfl_flwr.tasks.partitions import iid_partition

    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 6161, int(copy)]))
    members = np.flatnonzero(eligible)
    parts = iid_partition(len(train), len(members), rng)
    empty = train.subset(np.zeros(0, dtype=np.int64))
    clients = [(empty, empty)] * num_clients
    for j, cid in enumerate(members):
        clients[int(cid)] = (train.subset(parts[j]), empty)
    return clients, test


def _model() -> Any:
    """A fresh CNN for 3x32x32 images and two classes."""
    from mmfl_flwr.tasks.zoo import CNN

    c, h, w = SPEC.input_shape
    return CNN(c, (h, w), SPEC.num_classes)


def _build(kind: str, req: TaskBuild) -> Built:
    """One copy of a ``celeba-*`` task."""
    train, test = load_split(kind, req.data_root)
    clients, server = build_iid(train, test, req.num_clients, req.seed, req.copy, req.eligible)
    return clients, server, req.eligible


for _kind, _attr in CELEBA_ATTRIBUTE.items():
    register_task(
        _kind,
        model_fn=_model,
        build=partial(_build, _kind),
        spec=SPEC,
        description=f"CelebA attribute {_attr} (binary), read from data_root",
        builtin=True,
    )
