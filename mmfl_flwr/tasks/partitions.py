"""The standard ways of splitting one dataset among clients.

Where a `flwr-datasets <https://flower.ai/docs/datasets/>`_ partitioner expresses a
partition, the functions here run that partitioner on a local, in-memory
``datasets.Dataset`` built from our numpy arrays (offline: nothing is downloaded):

* :func:`iid_partition`: a uniformly random split into equal shares
  (``IidPartitioner`` on the examples in a random order; exactly the partition
  ``np.array_split(rng.permutation(n), num_clients)``);
* :func:`dirichlet_partition`: Dirichlet label skew (Hsu et al. 2019;
  ``DirichletPartitioner``): for every class, the class's examples are shared
  among the clients in proportions drawn from ``Dir(alpha)``; small ``alpha``
  gives clients few labels, large ``alpha`` tends to IID;
* :func:`pathological_partition`: ``k`` labels per client
  (``PathologicalPartitioner``, NIID-Bench's "#C=k");
* :func:`natural_id_partition`: one client per value of an id column
  (``NaturalIdPartitioner``), e.g. the writer of each example;
* :func:`partitioner_indices`: any flwr-datasets ``Partitioner`` (the hook behind
  user tasks, see :func:`mmfl_flwr.tasks.registry.register_task`).

Two partitions stay our own code, because no flwr-datasets partitioner expresses them:

* :func:`natural_partition`: LEAF data that is *already* split per user (a mapping
  user -> Dataset). ``NaturalIdPartitioner`` would need the per-user data flattened
  into one Arrow table with an id column, only to group it back by a pure-Python loop
  over every row (slow for millions of rows), and it cannot pair a user's train and
  test data; both give the same users in the same (sorted) order, so choosing users
  with the same generator gives the same clients.
* :func:`mmfl_flwr.tasks.federation.label_skew_partition`, the builder's
  k-labels-per-client partition of the image tasks: it weights clients (paper 003's
  high-data clients get ~10x the examples of each of their labels), it hands labels
  no client drew to a client so that every example is used (``PathologicalPartitioner``
  drops them), it repairs clients left empty (flwr-datasets raises) and it returns
  the labels each client holds, from which the clients' local test sets are cut.
  The label clusters of papers 000/001 (clients split evenly among groups holding
  disjoint label sets) and the eligibility masks of paper 003 are no flwr-datasets
  partitioner either; the builder partitions among the eligible clients only.

Every index partition returns, per client, the sorted int64 indices it holds.
Everything is a deterministic function of the ``numpy.random.Generator`` passed.

flwr-datasets (and ``datasets``, pandas, matplotlib, ...) is imported on first use
only: the import costs a few seconds per process, and the default federations
(digits, synthetic) never need it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from flwr_datasets.partitioner import Partitioner

__all__ = [
    "LABEL",
    "dirichlet_partition",
    "iid_partition",
    "make_partitioner",
    "natural_id_partition",
    "natural_partition",
    "partitioner_indices",
    "pathological_partition",
]

D = TypeVar("D")

#: Column holding the labels in the ``datasets.Dataset`` a partitioner sees.
LABEL = "label"
#: Column holding each example's row index (how partitions are read back).
_ROW = "__mmfl_row__"

#: ``factory(num_partitions, seed) -> Partitioner``
PartitionerFactory = Callable[[int, int], "Partitioner"]


def _fds() -> Any:
    """``flwr_datasets.partitioner``, imported on first use (a few seconds: it
    loads ``datasets``, pyarrow, pandas, matplotlib and seaborn)."""
    import flwr_datasets.partitioner as fds

    return fds


def _hf_dataset(columns: dict[str, np.ndarray]) -> Any:
    """An in-memory ``datasets.Dataset`` of ``columns`` (nothing downloaded or cached)."""
    import datasets

    return datasets.Dataset.from_dict(columns)


def _seed(rng: np.random.Generator) -> int:
    """A partitioner seed drawn from ``rng``."""
    return int(rng.integers(0, 2**63 - 1))


def partitioner_indices(
    partitioner: Partitioner,
    columns: Mapping[str, np.ndarray] | None = None,
    n: int | None = None,
    order: np.ndarray | None = None,
    num_clients: int | None = None,
    rng: np.random.Generator | None = None,
) -> list[np.ndarray]:
    """Run a flwr-datasets partitioner on local columns and return, per partition,
    the row indices it holds.

    The partitioner gets an in-memory ``datasets.Dataset`` with the given columns
    plus a row-index column (read back from each partition), so only the columns a
    partitioner partitions by need to be converted, never the inputs.

    Parameters
    ----------
    partitioner : flwr_datasets.partitioner.Partitioner
        A partitioner without a dataset (a dataset can be assigned only once).
    columns : mapping of str to np.ndarray, optional
        Per-example columns (1-D, ``n`` rows each), e.g. ``{"label": y}``.
    n : int, optional
        Number of rows (needed when ``columns`` is empty).
    order : np.ndarray, optional
        A permutation of ``range(n)``: the partitioner sees the rows in this order.
        The IID, size and Dirichlet partitioners cut the dataset in its order, so a
        random order is what makes them random.
    num_clients : int, optional
        How many partitions to return (default: all ``num_partitions``). With fewer
        than the partitioner has (e.g. ``NaturalIdPartitioner``, which makes one per
        id), ``num_clients`` of them are drawn with ``rng`` and returned in
        increasing partition id; more raises ``ValueError``.
    rng : np.random.Generator, optional
        Needed to draw partitions (see ``num_clients``).

    Returns
    -------
    list of np.ndarray
        Per returned partition, the sorted int64 row indices (into the original,
        unpermuted rows).
    """
    if not isinstance(partitioner, _fds().Partitioner):
        raise TypeError(
            f"expected a flwr_datasets.partitioner.Partitioner, got {type(partitioner).__name__}"
        )
    if partitioner.is_dataset_assigned():
        raise ValueError(
            f"this {type(partitioner).__name__} already has a dataset (flwr-datasets "
            "assigns one only once); pass a fresh partitioner or a factory"
        )
    cols = {k: np.asarray(v) for k, v in (columns or {}).items()}
    sizes = {v.shape[0] for v in cols.values()} | ({int(n)} if n is not None else set())
    if len(sizes) != 1:
        raise ValueError(f"columns (and n) disagree on the number of rows: {sorted(sizes)}")
    rows = sizes.pop()
    if _ROW in cols:
        raise ValueError(f"column name {_ROW!r} is reserved")
    perm = np.arange(rows, dtype=np.int64) if order is None else np.asarray(order, np.int64)
    if perm.shape != (rows,) or not np.array_equal(np.sort(perm), np.arange(rows)):
        raise ValueError(f"order must be a permutation of range({rows})")
    table = {k: v[perm] for k, v in cols.items()}
    table[_ROW] = perm
    partitioner.dataset = _hf_dataset(table)
    total = int(partitioner.num_partitions)
    ids: Sequence[int] = range(total)
    if num_clients is not None and num_clients != total:
        if num_clients > total:
            raise ValueError(
                f"the {type(partitioner).__name__} made {total} partitions, fewer than the "
                f"{num_clients} clients"
            )
        if rng is None:
            raise ValueError("partitioner_indices needs rng to draw num_clients partitions")
        ids = np.sort(rng.choice(total, size=int(num_clients), replace=False)).tolist()
    out = []
    for pid in ids:
        part = partitioner.load_partition(int(pid))
        rows_of = np.asarray(part.with_format("numpy", columns=[_ROW])[:][_ROW], dtype=np.int64)
        out.append(np.sort(rows_of))
    return out


def make_partitioner(
    spec: Partitioner | PartitionerFactory, num_partitions: int, seed: int
) -> Partitioner:
    """A fresh, dataset-less partitioner from a user's ``spec``.

    Parameters
    ----------
    spec : Partitioner or callable
        A flwr-datasets partitioner without a dataset (deep-copied, so that it can
        serve every copy of a task), or a factory
        ``spec(num_partitions, seed) -> Partitioner``.
    num_partitions : int
        The clients to partition among (passed to a factory; an instance must have
        at least this many partitions).
    seed : int
        Passed to a factory.
    """
    import copy

    Partitioner = _fds().Partitioner
    if isinstance(spec, Partitioner):
        if spec.is_dataset_assigned():
            raise ValueError(
                f"the {type(spec).__name__} passed as partitioner already has a dataset; "
                "pass one without a dataset, or a factory fn(num_partitions, seed)"
            )
        return copy.deepcopy(spec)
    if not callable(spec):
        raise TypeError(
            "partitioner must be a flwr_datasets.partitioner.Partitioner or a factory "
            f"fn(num_partitions, seed) -> Partitioner, got {type(spec).__name__}"
        )
    made = spec(int(num_partitions), int(seed))
    if not isinstance(made, Partitioner):
        raise TypeError(
            "the partitioner factory must return a flwr_datasets.partitioner.Partitioner, "
            f"got {type(made).__name__}"
        )
    return made


def iid_partition(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Split ``range(n)`` uniformly at random into ``num_clients`` near-equal shares.

    flwr-datasets' ``IidPartitioner`` cuts the dataset into contiguous shards of
    ``np.array_split`` sizes and does not shuffle, so it runs on the examples in the
    order ``rng.permutation(n)``. The result is exactly
    ``[np.sort(p) for p in np.array_split(rng.permutation(n), num_clients)]``.

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
    # IidPartitioner needs a row per shard; with more clients than examples the
    # first n clients get one example each, as np.array_split gives them.
    shards = min(int(num_clients), int(n))
    parts: list[np.ndarray] = []
    if shards:
        parts = partitioner_indices(_fds().IidPartitioner(shards), n=int(n), order=perm)
    return parts + [np.zeros(0, np.int64) for _ in range(int(num_clients) - shards)]


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 1,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Dirichlet label-skew partition (flwr-datasets' ``DirichletPartitioner``).

    For every class ``c`` (in sorted order), draw ``p_c ~ Dir(alpha, ..., alpha)``
    over the clients and give client ``k`` the chunk
    ``[floor(P_{k-1} n_c), floor(P_k n_c))`` of the class's examples, where ``P`` is
    the cumulative sum of ``p_c``; the examples are in a random order
    (``rng.permutation``), so the chunks are random. The draw is repeated until every
    client holds at least ``min_size`` examples (the rejection step of the NIID-Bench
    code). The partitioner runs with ``self_balancing=False`` (plain Dirichlet); its
    own default ``min_partition_size=10`` is replaced by ``min_size``, and its limit
    of 11 draws by ``max_tries``: a fresh partitioner (new seed from ``rng``) is
    started for every batch of 11 draws.

    Parameters
    ----------
    labels : np.ndarray
        Label of every example, shape ``(n,)`` (any integer values).
    num_clients : int
        Number of clients (at most ``n``: flwr-datasets refuses more partitions than
        examples).
    alpha : float
        Concentration (> 0); smaller means more skew.
    rng : np.random.Generator
        Source of randomness; the same generator state gives the same partition.
    min_size : int, default 1
        Minimum examples per client; ``min_size * num_clients`` must not exceed ``n``.
    max_tries : int, default 1000
        Draws attempted (in batches of 11, rounded up) before giving up with
        ``RuntimeError``.

    Returns
    -------
    list of np.ndarray
        Per client, sorted int64 indices; together ``range(n)`` exactly once.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    n = labels.shape[0]
    if num_clients < 1 or num_clients > n:
        raise ValueError(f"need 1 <= num_clients <= {n} (the examples), got {num_clients}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if min_size < 0 or min_size * num_clients > n:
        raise ValueError(f"cannot give each of {num_clients} clients {min_size} of {n} examples")
    perm = rng.permutation(n).astype(np.int64)
    per_partitioner = 11  # DirichletPartitioner draws at most 11 times
    tries = 0
    while tries < max_tries:
        tries += per_partitioner
        part = _fds().DirichletPartitioner(
            int(num_clients),
            LABEL,
            float(alpha),
            min_partition_size=int(min_size),
            self_balancing=False,
            shuffle=False,
            seed=_seed(rng),
        )
        try:
            with warnings.catch_warnings():
                # one warning per rejected draw; the rejection is ours to report
                warnings.filterwarnings("ignore", message="The specified min_partition_size")
                return partitioner_indices(part, {LABEL: labels}, order=perm)
        except ValueError as err:
            if "max number of attempts" not in str(err):
                raise
    raise RuntimeError(
        f"no Dirichlet(alpha={alpha}) draw in {tries} tries gave every one of "
        f"{num_clients} clients at least {min_size} of {n} examples; lower min_size or "
        "the number of clients, or raise alpha"
    )


def pathological_partition(
    labels: np.ndarray,
    num_clients: int,
    labels_per_client: int,
    rng: np.random.Generator,
    mode: str = "random",
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``labels_per_client`` labels per client (flwr-datasets' ``PathologicalPartitioner``).

    Each client draws ``labels_per_client`` distinct labels (of those present)
    uniformly at random (``mode="random"``; or ``"first-deterministic"``:
    client ``i``'s first label is the ``i % C``-th, which covers every label when
    ``num_clients >= C``; or ``"deterministic"``: labels ``i .. i+k-1 (mod C)``), and
    the examples of each label are split evenly among its holders, in a random order.

    Unlike :func:`mmfl_flwr.tasks.federation.label_skew_partition` (the builder's),
    a label that no client drew is **dropped** (flwr-datasets warns), nothing is
    weighted, and a label with more holders than examples raises ``ValueError``.

    Parameters
    ----------
    labels : np.ndarray
        Label of every example, shape ``(n,)``.
    num_clients : int
        Number of clients (at most ``n``).
    labels_per_client : int
        Labels per client (clipped to the number of labels present).
    rng : np.random.Generator
        Source of randomness.
    mode : str, default "random"
        flwr-datasets' ``class_assignment_mode``.

    Returns
    -------
    indices : list of np.ndarray
        Per client, sorted int64 indices (disjoint; every example of a held label).
    held : list of np.ndarray
        Per client, the sorted labels it holds (each with at least one example).
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    n = labels.shape[0]
    if num_clients < 1 or num_clients > n:
        raise ValueError(f"need 1 <= num_clients <= {n}, got {num_clients}")
    k = int(min(max(1, labels_per_client), np.unique(labels).shape[0]))
    perm = rng.permutation(n).astype(np.int64)
    part = _fds().PathologicalPartitioner(
        int(num_clients),
        LABEL,
        k,
        class_assignment_mode=mode,
        shuffle=False,
        seed=_seed(rng),
    )
    indices = partitioner_indices(part, {LABEL: labels}, order=perm)
    held = [np.unique(labels[ix]).astype(np.int64) for ix in indices]
    return indices, held


def natural_id_partition(
    ids: np.ndarray,
    num_clients: int | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[list[Any], list[np.ndarray]]:
    """One client per natural id (flwr-datasets' ``NaturalIdPartitioner``).

    For data in one table with an id column (e.g. the writer of each example);
    data already split per user is :func:`natural_partition`'s.

    Parameters
    ----------
    ids : np.ndarray
        The id of every example, shape ``(n,)`` (ints or strings).
    num_clients : int, optional
        Keep only this many ids, drawn uniformly without replacement with ``rng``;
        all ids by default.
    rng : np.random.Generator, optional
        Needed with ``num_clients``.

    Returns
    -------
    natural_ids : list
        The kept ids in sorted order; client ``i`` is ``natural_ids[i]``.
    indices : list of np.ndarray
        Per client, the sorted int64 indices of its examples.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be 1-D, got shape {ids.shape}")
    # (NaturalIdPartitioner groups the rows in a Python loop with a tqdm bar)
    part = _fds().NaturalIdPartitioner(partition_by="natural_id")
    part.dataset = _hf_dataset({"natural_id": ids, _ROW: np.arange(ids.shape[0], dtype=np.int64)})
    total = part.num_partitions
    pick = np.arange(total)
    if num_clients is not None:
        if not 1 <= num_clients <= total:
            raise ValueError(f"need 1 <= num_clients <= {total} (the ids), got {num_clients}")
        if rng is None:
            raise ValueError("natural_id_partition needs rng to sample num_clients ids")
        pick = np.sort(rng.choice(total, size=int(num_clients), replace=False))
    indices = []
    for pid in pick:
        rows = part.load_partition(int(pid)).with_format("numpy", columns=[_ROW])[:][_ROW]
        indices.append(np.sort(np.asarray(rows, dtype=np.int64)))
    names = [part.partition_id_to_natural_id[int(pid)] for pid in pick]
    return [x.item() if isinstance(x, np.generic) else x for x in names], indices


def natural_partition(
    user_datasets: Mapping[str, D],
    num_clients: int | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[list[str], list[D]]:
    """One client per user of a naturally federated dataset already split per user
    (LEAF's users); our code, see the module docstring for why.

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
