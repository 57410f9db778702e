"""Your tasks: two unrelated models on two datasets (scikit-learn's iris and wine).

Each client holds a slice of both datasets. Nothing here is specific to
mmfl-flwr except ``TorchTrainer``, which does local SGD on numpy data; any object
with the same four methods works.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_iris, load_wine
from sklearn.preprocessing import StandardScaler

from mmfl_flwr.tasks.data import Dataset

TASKS = ("iris", "wine")


def make_model(task: str) -> torch.nn.Module:
    """A model per task: logistic regression for iris, a small MLP for wine."""
    if task == "iris":
        return torch.nn.Linear(4, 3)
    if task == "wine":
        return torch.nn.Sequential(torch.nn.Linear(13, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    raise KeyError(task)


def load(task: str) -> tuple[np.ndarray, np.ndarray]:
    """Standardised features and labels of a task."""
    x, y = (load_iris if task == "iris" else load_wine)(return_X_y=True)
    return StandardScaler().fit_transform(x).astype(np.float32), y.astype(np.int64)


def partition(task: str, pid: int, num_partitions: int) -> tuple[Dataset, Dataset]:
    """IID split: every 5th example is the test set; the rest is shared out."""
    x, y = load(task)
    order = np.random.default_rng(42).permutation(len(y))
    test, train = order[::5], np.setdiff1d(order, order[::5])
    mine = np.array_split(train, num_partitions)[pid]
    mine_test = np.array_split(test, num_partitions)[pid]
    return Dataset(x[mine], y[mine]), Dataset(x[mine_test], y[mine_test])


def server_test(task: str) -> Dataset:
    """The held-out examples of a task (all partitions' test splits)."""
    x, y = load(task)
    order = np.random.default_rng(42).permutation(len(y))
    return Dataset(x[order[::5]], y[order[::5]])
