"""The ``shakespeare`` kind: LEAF's next-character prediction (80 characters),
read from ``data_root`` (:func:`~mmfl_flwr.tasks.datasets.load_leaf_shakespeare`),
trained with a character LSTM (:class:`~mmfl_flwr.tasks.zoo.CharLSTM`).

LEAF's natural split: one speaking role per client, ``num_clients`` roles drawn
(seeded) from all of them (our code, as LEAF's files are already split per user,
see :mod:`mmfl_flwr.tasks.partitions`); a client's local test set is its role's
test lines, and the server tests on those of every chosen role.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from mmfl_flwr.tasks.data import Dataset, concat_datasets
from mmfl_flwr.tasks.registry import register_task
from mmfl_flwr.tasks.spec import Built, KindSpec, TaskBuild

SPEC = KindSpec(num_classes=80, input_shape=(80,), model="lstm")


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


def _model() -> Any:
    """A fresh character LSTM."""
    from mmfl_flwr.tasks.zoo import CharLSTM

    return CharLSTM(SPEC.num_classes)


def _build(req: TaskBuild) -> Built:
    """One copy of the shakespeare task (every copy the same roles)."""
    clients, server = build_shakespeare(req.num_clients, req.seed, req.data_root, req.eligible)
    return clients, server, req.eligible


register_task(
    "shakespeare",
    model_fn=_model,
    build=_build,
    spec=SPEC,
    description="LEAF Shakespeare, one speaking role per client, read from data_root",
    builtin=True,
)
