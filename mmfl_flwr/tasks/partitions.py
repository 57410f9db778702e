"""The standard ways of splitting one dataset among clients (numpy only).

* :func:`iid_partition`: a uniformly random split into equal shares;
* :func:`dirichlet_partition`: Dirichlet label skew (Hsu et al. 2019): for every
  class, the class's examples are shared among the clients in proportions drawn from
  ``Dir(alpha)``; small ``alpha`` gives clients few labels, large ``alpha`` tends to
  IID;
* :func:`natural_partition`: a naturally federated dataset (LEAF's per-user
  Shakespeare split), one client per user.

The index partitions return, per client, the sorted indices it holds; together they
cover ``range(n)`` exactly once (as :func:`mmfl_flwr.tasks.federation.label_skew_partition`
does). Everything is a deterministic function of the ``numpy.random.Generator`` passed.
"""

from __future__ import annotations

from typing import Mapping, TypeVar

import numpy as np

__all__ = ["iid_partition", "dirichlet_partition", "natural_partition"]

D = TypeVar("D")


def iid_partition(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Split ``range(n)`` uniformly at random into ``num_clients`` near-equal shares.

    Parameters
    ----------
    n : int
        Number of examples.
    num_clients : int
        Number of clients (``1 <= num_clients``; clients get nothing when
        ``num_clients > n``).
    rng : np.random.Generator
        Source of randomness.

    Returns
    -------
    list of np.ndarray
        Per client, sorted int64 indices; sizes differ by at most one.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    perm = rng.permutation(int(n)).astype(np.int64)
    return [np.sort(part) for part in np.array_split(perm, int(num_clients))]


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 1,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Dirichlet label-skew partition.

    For every class ``c`` (in sorted order), draw ``p_c ~ Dir(alpha, ..., alpha)``
    over the clients, shuffle the examples of ``c`` and give client ``k`` the chunk
    ``[floor(P_{k-1} n_c), floor(P_k n_c))`` where ``P`` is the cumulative sum of
    ``p_c``. The whole draw is repeated until every client holds at least
    ``min_size`` examples (the usual rejection step of the NIID-Bench code).

    Parameters
    ----------
    labels : np.ndarray
        Label of every example, shape ``(n,)`` (any integer values).
    num_clients : int
        Number of clients.
    alpha : float
        Concentration (> 0); smaller means more skew.
    rng : np.random.Generator
        Source of randomness; the same generator state gives the same partition.
    min_size : int, default 1
        Minimum examples per client; ``min_size * num_clients`` must not exceed ``n``.
    max_tries : int, default 1000
        Draws attempted before giving up with ``RuntimeError``.

    Returns
    -------
    list of np.ndarray
        Per client, sorted int64 indices; together ``range(n)`` exactly once.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    n = labels.shape[0]
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if min_size < 0 or min_size * num_clients > n:
        raise ValueError(
            f"cannot give each of {num_clients} clients {min_size} of {n} examples"
        )
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == c) for c in classes]
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            idx = idx[rng.permutation(idx.shape[0])]
            p = rng.dirichlet(np.full(num_clients, float(alpha)))
            cuts = (np.cumsum(p)[:-1] * idx.shape[0]).astype(np.int64)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        out = [np.sort(np.concatenate(ps)).astype(np.int64) for ps in parts]
        if min(o.shape[0] for o in out) >= min_size:
            return out
    raise RuntimeError(
        f"no Dirichlet(alpha={alpha}) draw in {max_tries} tries gave every one of "
        f"{num_clients} clients at least {min_size} of {n} examples; lower min_size or "
        "the number of clients, or raise alpha"
    )


def natural_partition(
    user_datasets: Mapping[str, D],
    num_clients: int | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[list[str], list[D]]:
    """One client per user of a naturally federated dataset (LEAF's users).

    Parameters
    ----------
    user_datasets : mapping of str to Dataset
        Per-user data, e.g. the first value returned by
        :func:`mmfl_flwr.tasks.datasets.load_leaf_shakespeare`.
    num_clients : int, optional
        Keep only this many users, drawn uniformly without replacement with ``rng``
        (paper 003 takes 120 of Shakespeare's 1,146); all users by default.
    rng : np.random.Generator, optional
        Needed with ``num_clients``.

    Returns
    -------
    user_ids : list of str
        The kept users in sorted order; client ``i`` is ``user_ids[i]``.
    datasets : list
        ``user_datasets[user_ids[i]]`` for every client ``i`` (the same objects).
    """
    users = sorted(user_datasets)
    if num_clients is not None:
        if not 1 <= num_clients <= len(users):
            raise ValueError(f"need 1 <= num_clients <= {len(users)}, got {num_clients}")
        if rng is None:
            raise ValueError("natural_partition needs rng to sample num_clients users")
        pick = rng.choice(len(users), size=int(num_clients), replace=False)
        users = [users[i] for i in np.sort(pick)]
    return users, [user_datasets[u] for u in users]
