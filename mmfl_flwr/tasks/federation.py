"""The simulated federation: which client holds which data for which task.

numpy only (no torch). Everything is a deterministic function of the seed, so every
simulated client process can rebuild the same federation cheaply.
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import os
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, overload

import numpy as np

from mmfl_flwr.tasks.data import (
    Dataset,
    concat_datasets,
    load_digits_data,
    packed_synthetic_users,
    synthetic_users,
)
from mmfl_flwr.tasks.kinds import KINDS, SYNTHETIC_KINDS, KindSpec
from mmfl_flwr.tasks.real import REAL_KINDS
from mmfl_flwr.tasks.registry import get_task, registered_tasks

__all__ = [
    "KindSpec",
    "KINDS",
    "known_kinds",
    "task_names",
    "Federation",
    "PackedUsers",
    "build_federation",
    "label_skew_partition",
    "Profile",
    "PROFILES",
    "PARTITIONS",
]


#: Synthetic(alpha, beta) parameters of the ``"synthetic"`` kind.
SYNTHETIC_ALPHA = 1.0
SYNTHETIC_BETA = 1.0

# Fixed integers mixed into seed sequences so that the random streams of the
# different task kinds never coincide.
_KIND_STREAM = {
    "digits": 1,
    "synthetic": 2,
    "synthetic-b": 3,
    "synthetic-iid": 4,
    "synthetic-iid-b": 5,
    "mnist": 6,
    "fashion-mnist": 7,
    "emnist": 8,
    "cifar10": 9,
    "shakespeare": 10,
    "celeba-smiling": 11,
    "celeba-eyeglasses": 12,
    "mnist-5k": 13,
}
_KIND_STREAM.update({k: 100 + i for i, k in enumerate(sorted(REAL_KINDS)) if k not in _KIND_STREAM})


def known_kinds() -> list[str]:
    """Built-in task kinds and the ones registered with
    :func:`~mmfl_flwr.tasks.registry.register_task`."""
    return list(KINDS) + [k for k in registered_tasks() if k not in KINDS]


def _build_registered(
    kind: str, num_clients: int, seed: int, copy: int
) -> tuple[list[tuple[Dataset, Dataset]], Dataset, np.ndarray]:
    """Data of a user task: per client data, server test set, eligibility."""
    definition = get_task(kind)
    assert definition is not None
    if definition.partitioner is not None:
        clients, server = _build_partitioned(kind, num_clients, seed, copy)
    else:
        assert definition.data_fn is not None
        clients, server = definition.data_fn(num_clients, seed, copy)
    if len(clients) != num_clients:
        raise ValueError(
            f"task {kind!r}: data_fn returned {len(clients)} clients, expected {num_clients}"
        )
    out: list[tuple[Dataset, Dataset]] = []
    eligible = np.zeros(num_clients, dtype=bool)
    for i, pair in enumerate(clients):
        if pair is None or len(pair[0]) == 0:
            empty = Dataset(np.zeros((0,), np.float32), np.zeros(0, np.int64))
            out.append((empty, empty))
        else:
            out.append((pair[0], pair[1]))
            eligible[i] = True
    if not eligible.any():
        raise ValueError(f"task {kind!r}: data_fn gave no client any training data")
    return out, server, eligible


def _build_partitioned(
    kind: str, num_clients: int, seed: int, copy: int
) -> tuple[list[tuple[Dataset, Dataset] | None], Dataset]:
    """A user task's ``dataset`` split by its flwr-datasets ``partitioner`` (see
    :func:`~mmfl_flwr.tasks.registry.register_task`): partition ``i`` is client
    ``i``'s training set, local test sets are empty, the server tests on ``test``."""
    import zlib

    from mmfl_flwr.tasks.partitions import LABEL, make_partitioner, partitioner_indices

    definition = get_task(kind)
    assert definition is not None and definition.dataset is not None
    got = definition.dataset(int(seed))
    if not isinstance(got, (tuple, list)) or len(got) not in (2, 3):
        raise TypeError(
            f"task {kind!r}: dataset(seed) must return (train, test) or (train, test, "
            f"columns), got {type(got).__name__}"
        )
    train, test = got[0], got[1]
    if not isinstance(train, Dataset) or not isinstance(test, Dataset):
        raise TypeError(
            f"task {kind!r}: dataset's train and test must be mmfl_flwr.tasks.data.Dataset"
        )
    columns = {str(k): np.asarray(v) for k, v in (got[2] if len(got) == 3 else {}).items()}
    if LABEL in columns:
        raise ValueError(f"task {kind!r}: the column name {LABEL!r} is the builder's (train.y)")
    # the task's own stream: run seed, task name, copy
    stream = np.random.SeedSequence([int(seed), zlib.crc32(kind.encode()), int(copy)])
    part_seed, order_seed, pick_seed = stream.spawn(3)
    partitioner = make_partitioner(
        definition.partitioner, num_clients, int(part_seed.generate_state(1)[0])
    )
    parts = partitioner_indices(
        partitioner,
        {LABEL: train.y, **columns},
        order=np.random.default_rng(order_seed).permutation(len(train)),
        num_clients=num_clients,
        rng=np.random.default_rng(pick_seed),
    )
    empty = test.subset(np.zeros(0, dtype=np.int64))
    return [(train.subset(ix), empty) for ix in parts], test


def task_names(kinds: list[str]) -> list[str]:
    """Unique model names for a list of task kinds.

    The first occurrence of a kind keeps the kind's name; the ``c``-th repeat
    (``c >= 2``) is named ``f"{kind}_{c}"``.

    Parameters
    ----------
    kinds : list of str
        Task kinds, each a key of :data:`KINDS`.

    Returns
    -------
    list of str
        One name per entry of ``kinds``, e.g.
        ``["digits", "synthetic", "digits"] -> ["digits", "synthetic", "digits_2"]``.
    """
    counts: dict[str, int] = {}
    names: list[str] = []
    for kind in kinds:
        if kind not in KINDS and get_task(kind) is None:
            raise ValueError(f"unknown task kind {kind!r}; known: {sorted(known_kinds())}")
        counts[kind] = counts.get(kind, 0) + 1
        names.append(kind if counts[kind] == 1 else f"{kind}_{counts[kind]}")
    return names


#: Fourth word of the seed sequence of :attr:`Profile.low_data_samples`' draw (the
#: partition's own stream, :func:`_stream_seed`, has three words).
_DRAW_STREAM = 12
#: Fourth word of the seed sequence of :attr:`Profile.client_samples`' draw.
_SIZES_STREAM = 13


def _stream_seed(seed: int, kind: str, copy: int) -> np.random.SeedSequence:
    """Seed sequence of copy ``copy`` (0-based) of task ``kind``."""
    return np.random.SeedSequence([int(seed), _KIND_STREAM[kind], int(copy)])


def label_skew_partition(
    labels: np.ndarray,
    num_clients: int,
    labels_per_client: int,
    rng: np.random.Generator,
    num_classes: int,
    weights: np.ndarray | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Partition examples among clients so that each client holds few labels.

    Each client draws ``labels_per_client`` distinct labels uniformly at random. A
    label that no client drew is handed to a random client: if some label is held by
    two or more clients, one such redundant holding of a random client is replaced
    by the uncovered label (so nobody exceeds ``labels_per_client``); only when that
    is impossible (``num_clients * labels_per_client < num_classes``) is the label
    added on top. The examples of every label are shuffled and split as evenly as
    possible among its holders (in random order). Finally every client left with no
    example (only possible when a label has more holders than examples) takes one
    random example from the currently largest client, and its held labels become
    that example's label.

    This is our own code, not flwr-datasets' ``PathologicalPartitioner`` (which
    draws the labels the same way, see
    :func:`~mmfl_flwr.tasks.partitions.pathological_partition`): no flwr-datasets
    partitioner weights clients (paper 003's high-data clients, ``weights``),
    the pathological one drops labels no client drew and raises where a client
    would be empty instead of repairing both, and none returns the labels each
    client holds, from which the builder cuts the local test sets. It is the
    builder's partition for the uniform profile too, so that every profile splits
    by the same rule (and the reference runs of the default federations stay
    byte-identical).

    Parameters
    ----------
    labels : np.ndarray
        Label of every example, shape ``(n,)``.
    num_clients : int
        Number of clients; must not exceed ``n``.
    labels_per_client : int
        Labels drawn per client (clipped to ``num_classes``).
    rng : np.random.Generator
        Source of randomness.
    num_classes : int
        Number of classes.
    weights : np.ndarray, optional
        Per-client weights: a label's examples are split among its holders in
        proportion to them (paper 003's high/low-data clients); equal by default.

    Returns
    -------
    indices : list of np.ndarray
        Per client, the sorted example indices it holds; together a partition of
        ``range(n)``.
    held : list of np.ndarray
        Per client, the sorted labels assigned to it (a superset of the labels it
        actually has examples of).
    """
    labels = np.asarray(labels)
    n = labels.shape[0]
    if num_clients < 1 or num_clients > n:
        raise ValueError(f"need 1 <= num_clients <= {n}, got {num_clients}")
    per = int(min(max(1, labels_per_client), num_classes))
    held_sets: list[set[int]] = [
        set(int(c) for c in rng.choice(num_classes, size=per, replace=False))
        for _ in range(num_clients)
    ]

    def holders_of(label: int) -> list[int]:
        return [i for i in range(num_clients) if label in held_sets[i]]

    present = np.unique(labels)
    uncovered = [int(c) for c in present if not holders_of(int(c))]
    rng.shuffle(uncovered)
    for label in uncovered:
        counts = np.zeros(num_classes, dtype=np.int64)
        for s in held_sets:
            for c in s:
                counts[c] += 1
        # (client, label) pairs whose label is held by >= 2 clients.
        candidates = [
            (i, c) for i in range(num_clients) for c in sorted(held_sets[i]) if counts[c] >= 2
        ]
        if candidates:
            i, c = candidates[int(rng.integers(len(candidates)))]
            held_sets[i].remove(c)
            held_sets[i].add(label)
        else:
            held_sets[int(rng.integers(num_clients))].add(label)

    held = [np.array(sorted(s), dtype=np.int64) for s in held_sets]
    indices = _split_by_holders(labels, held, rng, weights)
    for i in range(num_clients):
        if indices[i].shape[0] == 0:
            donor = int(np.argmax([ix.shape[0] for ix in indices]))
            take = int(rng.integers(indices[donor].shape[0]))
            indices[i] = indices[donor][take : take + 1].copy()
            indices[donor] = np.delete(indices[donor], take)
            # The client holds no example of its drawn labels; its only label is now
            # the one of the example it took.
            held[i] = np.array([int(labels[indices[i][0]])], dtype=np.int64)
    indices = [np.sort(ix) for ix in indices]
    return indices, held


def _weighted_chunks(
    idx: np.ndarray, weights: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Split ``idx`` into ``len(weights)`` consecutive chunks with sizes
    proportional to ``weights`` (largest-remainder rounding, ties at random)."""
    share = weights / weights.sum() * idx.shape[0]
    sizes = np.floor(share).astype(np.int64)
    left = idx.shape[0] - int(sizes.sum())
    if left > 0:
        frac = share - sizes + rng.random(share.shape[0]) * 1e-9
        sizes[np.argsort(-frac)[:left]] += 1
    return np.split(idx, np.cumsum(sizes)[:-1])


def _split_by_holders(
    labels: np.ndarray,
    held: list[np.ndarray],
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Split examples of each label (at random) among the clients holding it,
    evenly or, with ``weights``, in proportion to the holders' weights.

    Labels that no client holds are dropped; clients may end up with nothing.
    """
    num_clients = len(held)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in np.unique(labels):
        holders = np.array([i for i in range(num_clients) if label in held[i]], dtype=np.int64)
        if holders.shape[0] == 0:
            continue
        idx = np.flatnonzero(labels == label)
        idx = idx[rng.permutation(idx.shape[0])]
        holders = holders[rng.permutation(holders.shape[0])]
        if weights is None:
            chunks = np.array_split(idx, holders.shape[0])
        else:
            chunks = _weighted_chunks(idx, np.asarray(weights, dtype=np.float64)[holders], rng)
        for client, chunk in zip(holders, chunks):
            parts[int(client)].append(chunk)
    return [
        np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, dtype=np.int64)
        for p in parts
    ]


@dataclass
class Federation:
    """A simulated federation of clients holding data for several tasks.

    Attributes
    ----------
    seed : int
        Seed the federation was built from.
    num_clients : int
        Number of clients ``N``; client ids are ``0 .. N-1``.
    tasks : list of str
        Model (task) names, unique.
    kinds : dict of str to str
        Task name -> task kind (a key of :data:`KINDS`).
    processors : np.ndarray
        Shape ``(N,)`` int, processors ``B_i >= 1`` of each client.
    eligible : dict of str to np.ndarray
        Task name -> bool array ``(N,)``, whether the client holds data for the task.
    data : dict of str to sequence of tuple of Dataset
        Task name -> per client ``(train, local_test)`` (a list, or for the
        synthetic tasks a :class:`PackedUsers`, which makes them when asked);
        ``None`` entries are not allowed for eligible clients.
    server_tests : dict of str to Dataset
        Task name -> held-out server-side test set.
    hosted : frozenset of int or None
        The clients whose data was built (``build_federation(clients=...)``: a
        node hosting a shard, or the server, which holds none); None: all.
    has_server_tests : bool
        Whether the server-side test sets were built.
    """

    seed: int
    num_clients: int
    tasks: list[str]
    kinds: dict[str, str]
    processors: np.ndarray
    eligible: dict[str, np.ndarray]
    data: dict[str, Sequence[tuple[Dataset, Dataset]]] = field(default_factory=dict, repr=False)
    server_tests: dict[str, Dataset] = field(default_factory=dict, repr=False)
    hosted: frozenset[int] | None = None
    has_server_tests: bool = True

    def _check_cid(self, cid: int) -> int:
        cid = int(cid)
        if not 0 <= cid < self.num_clients:
            raise KeyError(f"client id {cid} out of range [0, {self.num_clients})")
        return cid

    def client_data(self, cid: int, task: str) -> tuple[Dataset, Dataset]:
        """Training data and local test data of client ``cid`` for ``task``.

        Parameters
        ----------
        cid : int
            Client id.
        task : str
            Task (model) name.

        Returns
        -------
        tuple of Dataset
            ``(train, local_test)``. The local test set may be empty (digits clients
            get the global test examples of their labels split among the holders).

        Raises
        ------
        KeyError
            If the task is unknown, the id is out of range or the client is not
            eligible for the task.
        """
        cid = self._check_cid(cid)
        if task not in self.eligible:
            raise KeyError(f"unknown task {task!r}")
        if not bool(self.eligible[task][cid]):
            raise KeyError(f"client {cid} is not eligible for task {task!r}")
        if self.hosted is not None and cid not in self.hosted:
            raise KeyError(
                f"client {cid}'s data was not built here: this federation holds "
                f"the data of {len(self.hosted)} of its {self.num_clients} clients "
                "(build_federation(clients=...))"
            )
        return self.data[task][cid]

    def client_tasks(self, cid: int) -> list[str]:
        """Tasks client ``cid`` is eligible for, in the order of :attr:`tasks`.

        Parameters
        ----------
        cid : int
            Client id.

        Returns
        -------
        list of str
            Eligible task names.
        """
        cid = self._check_cid(cid)
        return [t for t in self.tasks if bool(self.eligible[t][cid])]

    def num_examples(self, cid: int) -> dict[str, int]:
        """Training sample count of client ``cid`` per eligible task.

        Parameters
        ----------
        cid : int
            Client id.

        Returns
        -------
        dict of str to int
            Task name -> number of training examples (always > 0).
        """
        return {t: len(self.client_data(cid, t)[0]) for t in self.client_tasks(cid)}

    def server_test(self, task: str) -> Dataset:
        """Held-out server-side test set of ``task``.

        Parameters
        ----------
        task : str
            Task (model) name.

        Returns
        -------
        Dataset
            Digits: the global test split. Synthetic: the union of all users' test
            splits.
        """
        if task not in self.eligible:
            raise KeyError(f"unknown task {task!r}")
        if not self.has_server_tests:
            raise KeyError(
                f"the server-side test set of {task!r} was not built here "
                "(build_federation(server_tests=False))"
            )
        return self.server_tests[task]


@dataclass(frozen=True)
class Profile:
    """How heterogeneous the clients of a federation are.

    Attributes
    ----------
    high_data_fraction : float
        Fraction of the clients that are "high-data" for a task, drawn
        independently per task (0: all clients alike).
    high_data_ratio : float
        How many times more samples a high-data client gets than the others.
    partial_fraction : float
        Fraction of the clients that hold data for only ``S - 1`` tasks (one
        random task dropped); the rest hold all ``S``.
    processors : str
        ``"one"`` (``B_i = 1``) or ``"paper003"``: 25% of the clients get
        ``|S_i|``, 50% ``ceil(|S_i| / 2)`` and 25% one processor.
    clusters : int
        Ground-truth label clusters per digits task (papers 000/001: 5, each
        holding 20% of the labels); clients are split evenly among them and hold
        the labels of their cluster. 0: the label-skew partition instead.
    consistent : bool
        With ``clusters``: one client-to-cluster map for all tasks (consistent
        structure) or an independent map per task (inconsistent).
    partition : str
        How the training examples of the labelled image tasks (digits, mnist,
        fashion-mnist, emnist, cifar10) are split among a task's eligible
        clients: ``"label-skew"`` (the default, our
        :func:`label_skew_partition`, which the high-data clients and the
        clusters need), or a flwr-datasets partitioner (only without clusters
        and high-data clients, which they cannot express):
        ``"pathological"`` (``max(1, round(labels_per_client * C))`` labels per
        client, :func:`~mmfl_flwr.tasks.partitions.pathological_partition`),
        ``"dirichlet"`` (``Dir(dirichlet_alpha)`` label skew, at least one
        example per client, :func:`~mmfl_flwr.tasks.partitions.dirichlet_partition`)
        or ``"iid"`` (:func:`~mmfl_flwr.tasks.partitions.iid_partition`). A
        client's local test set is the global test examples of the labels it
        holds, split among their holders.
    dirichlet_alpha : float
        Concentration of ``partition="dirichlet"``.
    low_data_samples : int
        With high-data clients, on the labelled image tasks (digits, mnist,
        mnist-5k, fashion-mnist, emnist, cifar10; not celeba, shakespeare or the
        synthetic tasks): draw each copy's training pool down (uniformly, without
        replacement, from its own stream) to ``low_data_samples`` per unit of the
        eligible clients' data weights, so that under the label-skew partition a
        low-data client holds about that many examples and a high-data one about
        ``high_data_ratio`` times as many (paper 003: about 12 and about 120; with
        ``clusters`` the pool is drawn down the same, but the cluster split does
        not follow the weights). A pool smaller than that is shared out whole.
        0: the whole pool, always.
    client_samples : tuple of int
        ``(low, high)``, on the labelled image tasks: after the partition, each
        eligible client keeps a uniform random subset of its training examples,
        of a size drawn uniformly from ``low..high`` (both included; from its own
        stream, so the partition and the test sets are those without it); a client
        holding fewer keeps all it holds (papers 000/001: "30 clients, each with
        30-40 data samples per model"). ``(0, 0)``: every client keeps its part.
    """

    high_data_fraction: float = 0.0
    high_data_ratio: float = 10.0
    partial_fraction: float = 0.0
    processors: str = "one"
    clusters: int = 0
    consistent: bool = True
    partition: str = "label-skew"
    dirichlet_alpha: float = 0.5
    low_data_samples: int = 0
    client_samples: tuple[int, int] = (0, 0)


#: Values of :attr:`Profile.partition`; all but ``label-skew`` run flwr-datasets.
PARTITIONS = ("label-skew", "pathological", "dirichlet", "iid")


#: Named profiles: ``uniform`` (every client alike, one processor, all tasks),
#: ``paper003`` (paper 003's heterogeneous setting, Section 6; the image tasks' whole
#: training pool is shared out), ``paper003-sizes`` (the same with paper 003's data
#: sizes, about 12 / 120 examples, where the pool is large enough), and
#: ``clusters-consistent`` / ``clusters-inconsistent`` (papers 000/001: 5 label
#: clusters per task, one client map for all tasks or one per task), and their
#: ``-sizes`` variants with papers 000/001's data sizes (30-40 examples a client and
#: task, :attr:`Profile.client_samples`).
_PAPER003 = Profile(
    high_data_fraction=0.1, high_data_ratio=10.0, partial_fraction=0.1, processors="paper003"
)
PROFILES: dict[str, Profile] = {
    "uniform": Profile(),
    "paper003": _PAPER003,
    "paper003-sizes": replace(_PAPER003, low_data_samples=12),
    "clusters-consistent": Profile(clusters=5, consistent=True),
    "clusters-inconsistent": Profile(clusters=5, consistent=False),
    "clusters-consistent-sizes": Profile(clusters=5, consistent=True, client_samples=(30, 40)),
    "clusters-inconsistent-sizes": Profile(clusters=5, consistent=False, client_samples=(30, 40)),
}


def _empty(kind: str) -> Dataset:
    spec = KINDS[kind]
    return Dataset(np.zeros((0, *spec.input_shape), np.float32), np.zeros(0, np.int64))


def cluster_labels(
    num_clients: int, clusters: int, num_classes: int, rng: np.random.Generator
) -> tuple[np.ndarray, list[np.ndarray]]:
    """A balanced random client-to-cluster map and a random split of the labels
    into ``clusters`` equal groups (each cluster holds ``1/clusters`` of them)."""
    cluster_of = rng.permutation(np.arange(num_clients) % clusters)
    label_groups = np.array_split(rng.permutation(num_classes), clusters)
    return cluster_of, [np.sort(g) for g in label_groups]


def _build_digits(
    num_clients: int,
    seed: int,
    copy: int,
    labels_per_client: float,
    eligible: np.ndarray,
    weights: np.ndarray | None,
    cluster_of: np.ndarray | None = None,
    clusters: int = 0,
    kind: str = "digits",
    data: tuple[Dataset, Dataset] | None = None,
    partition: str = "label-skew",
    alpha: float = 0.5,
    low_data_samples: int = 0,
    client_samples: tuple[int, int] = (0, 0),
) -> tuple[list[tuple[Dataset, Dataset]], Dataset]:
    """Per-client data and server test set for one copy of a labelled image task
    (the embedded digits, or ``data`` of a real ``kind``); the training examples
    are shared out among the eligible clients only. With ``clusters``, client
    ``i`` holds the labels of cluster ``cluster_of[i]``; otherwise ``partition``
    (see :attr:`Profile.partition`) splits them; ``low_data_samples`` (with
    ``weights``) draws the pool down first (:attr:`Profile.low_data_samples`);
    ``client_samples`` cuts each client's part to its size afterwards
    (:attr:`Profile.client_samples`)."""
    train, test = data if data is not None else load_digits_data(seed)
    rng = np.random.default_rng(_stream_seed(seed, kind, copy))
    num_classes = KINDS[kind].num_classes
    per = max(1, int(round(labels_per_client * num_classes)))
    members = np.flatnonzero(eligible)
    if low_data_samples > 0 and weights is not None and members.size:
        want = int(round(low_data_samples * float(weights[members].sum())))
        if want < train.y.shape[0]:
            # its own stream: the partition's stream draws as it would on the pool
            draw = np.random.default_rng(
                np.random.SeedSequence([int(seed), _KIND_STREAM[kind], int(copy), _DRAW_STREAM])
            )
            train = train.subset(np.sort(draw.choice(train.y.shape[0], want, replace=False)))
    if clusters:
        assert cluster_of is not None
        _, label_groups = cluster_labels(num_clients, clusters, num_classes, rng)
        held = [label_groups[int(cluster_of[i])] for i in members]
        train_parts = _split_by_holders(train.y, held, rng)
    elif partition != "label-skew":
        train_parts, held = _fds_partition(partition, train.y, members.shape[0], per, alpha, rng)
    else:
        train_parts, held = label_skew_partition(
            train.y,
            members.shape[0],
            per,
            rng,
            num_classes,
            None if weights is None else weights[members],
        )
    test_parts = _split_by_holders(test.y, held, rng)
    if client_samples[1] > 0:
        cut = np.random.default_rng(
            np.random.SeedSequence([int(seed), _KIND_STREAM[kind], int(copy), _SIZES_STREAM])
        )
        lo, hi = client_samples
        for j, part in enumerate(train_parts):
            size = int(cut.integers(lo, hi + 1))
            if part.shape[0] > size:
                train_parts[j] = np.sort(part[cut.choice(part.shape[0], size, replace=False)])
    clients = [(_empty(kind), _empty(kind))] * num_clients
    for j, cid in enumerate(members):
        clients[int(cid)] = (train.subset(train_parts[j]), test.subset(test_parts[j]))
    return clients, test


def _fds_partition(
    partition: str,
    labels: np.ndarray,
    num_clients: int,
    per: int,
    alpha: float,
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A flwr-datasets partition of an image task's training labels: per client
    its indices and the labels it holds."""
    from mmfl_flwr.tasks import partitions as P

    if not 1 <= num_clients <= labels.shape[0]:
        raise ValueError(f"need 1 <= clients <= {labels.shape[0]}, got {num_clients}")
    if partition == "pathological":
        return P.pathological_partition(labels, num_clients, per, rng)
    if partition == "dirichlet":
        parts = P.dirichlet_partition(labels, num_clients, alpha, rng, min_size=1)
    elif partition == "iid":
        parts = P.iid_partition(labels.shape[0], num_clients, rng)
    else:  # pragma: no cover - build_federation validated it
        raise ValueError(f"unknown partition {partition!r}")
    return parts, [np.unique(labels[ix]).astype(np.int64) for ix in parts]


class PackedUsers(Sequence[tuple[Dataset, Dataset]]):
    """Every client's ``(train, local_test)`` of one task, where the held users'
    data lie in four contiguous arrays (train inputs, train labels, test inputs,
    test labels), each user's rows after the previous user's: one allocation per
    array instead of four per user (100,000 small arrays fragment the heap), and
    a node that evaluates its users one after another reads them without a copy
    (:func:`mmfl_flwr.client.trainer` shares the rows). A user's datasets are
    views made when asked for (a node hosting 50,000 clients of two tasks held
    0.11 GB of dataset objects otherwise); a client holding none gets ``empty``.
    """

    def __init__(
        self,
        num_clients: int,
        held: list[int],
        packed: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
        empty: tuple[Dataset, Dataset],
    ) -> None:
        """``packed``: for train and test, ``(inputs, labels, ends)`` of the ``held``
        users one after another (``ends``: cumulative row counts); the arrays go
        through :func:`shared_array`."""
        self._n = int(num_clients)
        self._empty = empty
        self._pos = np.full(self._n, -1, dtype=np.int64)
        self._pos[np.asarray(held, dtype=np.int64)] = np.arange(len(held))
        self._arrays = [
            (shared_array(xs), shared_array(ys), np.asarray(ends, dtype=np.int64))
            for xs, ys, ends in packed
        ]

    @classmethod
    def from_users(
        cls,
        num_clients: int,
        held: list[int],
        users: list[tuple[Dataset, Dataset]],
        empty: tuple[Dataset, Dataset],
    ) -> PackedUsers:
        """The ``held`` users' datasets (``users``, in that order) packed."""
        packed = []
        for side in (0, 1):  # train, test
            xs = np.concatenate([u[side].x for u in users]) if users else empty[side].x
            ys = np.concatenate([u[side].y for u in users]) if users else empty[side].y
            packed.append((xs, ys, np.cumsum([len(u[side]) for u in users], dtype=np.int64)))
        return cls(num_clients, held, packed, empty)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, k: int) -> tuple[Dataset, Dataset]: ...

    @overload
    def __getitem__(self, k: slice) -> list[tuple[Dataset, Dataset]]: ...

    def __getitem__(self, k: int | slice) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._n))]
        i = operator.index(k)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"client {k} out of range [0, {self._n})")
        p = int(self._pos[i])
        if p < 0:
            return self._empty
        out = []
        for xs, ys, ends in self._arrays:
            a, b = (int(ends[p - 1]) if p else 0), int(ends[p])
            out.append(Dataset(xs[a:b], ys[a:b]))
        return out[0], out[1]


#: Environment variable naming a directory through which the processes of one
#: machine share the packed data of the clients they host (set by ``mmfl run
#: --engine simulation``): see :func:`shared_array`.
SHARED_DATA_ENV = "MMFL_SHARED_DATA"
_SHARE_FAILED: set[str] = set()


def shared_array(a: np.ndarray) -> np.ndarray:
    """``a``, or, where :data:`SHARED_DATA_ENV` names a directory, an array of
    the same values mapped (copy-on-write) from a file there named by its
    content, so that processes building the same clients' data map one copy of
    it. A Flower Ray worker keeps the clients of every node it has served, and
    Flower hands a message to any idle worker, so with two shard nodes each of
    two workers may come to hold both shards: mapped, their data is in memory
    once (a page read by two processes is one page). Arrays under 1 MiB are
    left as they are.

    The file is written once: to a temporary name, then linked to its own name,
    which fails where another process got there first (both then map the one
    file). A file whose content is not ``a``'s (changed by someone else) is not
    used. Where the directory cannot be written, ``a`` itself is returned, with
    one warning per directory and process."""
    where = os.environ.get(SHARED_DATA_ENV, "").strip()
    if not where or a.nbytes < (1 << 20) or where in _SHARE_FAILED:
        return a
    a = np.ascontiguousarray(a)
    digest = hashlib.blake2b(memoryview(a.data).cast("B"), digest_size=16).hexdigest()
    shape = "x".join(str(d) for d in a.shape)
    path = os.path.join(where, f"{digest}-{a.dtype.str.strip('<>|=')}-{shape}.npy")
    if not os.path.exists(path):
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=where, suffix=".part")
            with os.fdopen(fd, "wb") as f:
                np.save(f, a)
            with contextlib.suppress(FileExistsError):  # another process was first
                os.link(tmp, path)
        except OSError as err:
            _SHARE_FAILED.add(where)
            warnings.warn(
                f"{SHARED_DATA_ENV}={where}: clients' data not shared ({err})",
                RuntimeWarning,
                stacklevel=2,
            )
            return a
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
    try:
        mapped = np.asarray(np.load(path, mmap_mode="c"))  # views of it have it as base
    except (OSError, ValueError):  # a damaged file: this array is not shared
        return a
    # the name says the content; the content is checked all the same
    if (
        mapped.shape != a.shape
        or mapped.dtype != a.dtype
        or not mapped.flags.c_contiguous
        or not _same_bytes(mapped, a)
    ):
        return a
    return mapped


def _same_bytes(x: np.ndarray, y: np.ndarray, block: int = 1 << 24) -> bool:
    """Whether two C-contiguous arrays of one size hold the same bytes (NaN
    equals itself), compared 16 MiB at a time (no temporary of their size)."""
    bx, by = x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)
    return bx.shape == by.shape and all(
        np.array_equal(bx[i : i + block], by[i : i + block]) for i in range(0, bx.shape[0], block)
    )


def _build_synthetic(
    kind: str,
    num_clients: int,
    seed: int,
    copy: int,
    max_samples: int | None,
    eligible: np.ndarray,
    high: np.ndarray | None,
    ratio: float,
    keep: frozenset[int] | None = None,
    server: bool = True,
) -> tuple[PackedUsers, Dataset]:
    """Per-client data and server test set for one copy of the synthetic task.
    With ``high`` given, the other (low-data) users keep ``1 / ratio`` of their
    training samples.

    ``keep`` (client ids, None for all) and ``server`` choose what is built: the
    other clients get the shared empty dataset, and without ``server`` the
    server test set is empty. Every user depends only on ``(seed, k)``, so a
    shard generates its own users only; the server's test set (every user's
    test split) and the low-data subsets (one stream drawn user after user) take
    a pass over all users that keeps only what is asked for."""
    spec = KINDS[kind]
    stream = _stream_seed(seed, kind, copy)
    gen_seed = int(stream.generate_state(1, dtype=np.uint32)[0])
    options: dict[str, Any] = dict(
        dim=spec.input_shape[0],
        num_classes=spec.num_classes,
        seed=gen_seed,
        iid=kind.startswith("synthetic-iid"),
        max_samples=max_samples,
    )
    empty = _empty(kind)
    sizes: list[int] = []  # every user's training-set size, for the low-data subsets
    if keep is None:
        users = synthetic_users(SYNTHETIC_ALPHA, SYNTHETIC_BETA, num_clients, **options)
        server_test = concat_datasets([te for _, te in users])
        sizes = [len(tr) for tr, _ in users]
    elif not server and (high is None or not keep):  # no pass over the others needed
        # generated straight into the packed arrays (no arrays per user)
        ids = sorted(k for k in keep if eligible[k])
        packed = packed_synthetic_users(
            SYNTHETIC_ALPHA, SYNTHETIC_BETA, num_clients, ids, **options
        )
        return PackedUsers(num_clients, ids, packed, (empty, empty)), empty
    else:  # one pass over every user, keeping what is asked for
        users = [(empty, empty)] * num_clients
        tests: list[Dataset] = []
        for k in range(num_clients):
            ((tr, te),) = synthetic_users(
                SYNTHETIC_ALPHA, SYNTHETIC_BETA, num_clients, ids=[k], **options
            )
            if server:
                tests.append(Dataset(te.x.copy(), te.y.copy()))
            if k in keep:
                users[k] = (tr, te)
            sizes.append(len(tr))
        server_test = concat_datasets(tests) if server else empty
    if high is not None and (keep is None or keep):
        rng = np.random.default_rng(stream.spawn(1)[0])
        for k in range(num_clients):
            if not high[k]:
                keep_n = max(1, int(np.ceil(sizes[k] / ratio)))
                order = np.sort(rng.permutation(sizes[k])[:keep_n])
                if keep is None or k in keep:
                    tr, te = users[k]
                    users[k] = (tr.subset(order), te)
    held = (
        [k for k in sorted(keep) if eligible[k]]
        if keep is not None
        else [k for k in range(num_clients) if eligible[k]]
    )
    return (
        PackedUsers.from_users(num_clients, held, [users[k] for k in held], (empty, empty)),
        server_test,
    )


def _trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``;
    nothing elsewhere): the small arrays a federation is generated in are freed
    once packed, between long-lived ones, where the heap cannot shrink alone."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (ImportError, OSError, AttributeError):
        pass


def _heterogeneity(
    num_clients: int, num_tasks: int, seed: int, profile: Profile
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eligibility (S, N), high-data flags (S, N) and processors (N,) of a profile."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 99]))
    eligible = np.ones((num_tasks, num_clients), dtype=bool)
    if profile.partial_fraction > 0 and num_tasks >= 2:
        k = int(round(profile.partial_fraction * num_clients))
        for cid in rng.choice(num_clients, size=k, replace=False):
            eligible[int(rng.integers(num_tasks)), int(cid)] = False
    high = np.zeros((num_tasks, num_clients), dtype=bool)
    if profile.high_data_fraction > 0:
        for s in range(num_tasks):
            members = np.flatnonzero(eligible[s])
            k = max(1, int(round(profile.high_data_fraction * members.shape[0])))
            high[s, rng.choice(members, size=min(k, members.shape[0]), replace=False)] = True
    sizes = eligible.sum(axis=0)
    processors = np.ones(num_clients, dtype=np.int64)
    if profile.processors == "paper003":
        order = rng.permutation(num_clients)
        a = int(round(0.25 * num_clients))
        b = a + int(round(0.5 * num_clients))
        processors[order[:a]] = sizes[order[:a]]
        processors[order[a:b]] = np.ceil(sizes[order[a:b]] / 2).astype(np.int64)
    elif profile.processors != "one":
        raise ValueError(f"unknown processors rule {profile.processors!r}; use 'one' or 'paper003'")
    return eligible, high, np.maximum(processors, 1)


def build_federation(
    kinds: list[str],
    num_clients: int,
    seed: int,
    labels_per_client: float = 0.3,
    max_synthetic_samples: int | None = 500,
    profile: str | Profile = "uniform",
    data_root: str = "data",
    clients: Iterable[int] | None = None,
    server_tests: bool = True,
) -> Federation:
    """Build the simulated federation deterministically from ``seed``.

    * ``"digits"``: the global train split of :func:`load_digits_data` is partitioned
      among the task's eligible clients with a label skew
      (:func:`label_skew_partition`), each client holding
      ``max(1, round(labels_per_client * 10))`` labels (split in proportion to the
      clients' data weights under a heterogeneous profile). Every copy of the task
      draws its own partition from its own stream. All training examples are used
      exactly once per copy and every eligible client gets at least one. A
      client's local test set is the global test examples of its labels, split
      evenly among the holders.
    * ``"synthetic"``: client ``k`` is FedProx Synthetic(1, 1) user ``k`` (60 dims,
      5 classes); each copy uses a different generator seed. ``"synthetic-b"`` is
      the same with 30 dims and 10 classes (paper 004's second model), and
      ``"synthetic-iid"`` / ``"synthetic-iid-b"`` are FedProx's Synthetic-IID. Under a profile with
      high-data clients, the low-data users keep ``1 / high_data_ratio`` of their
      training samples.

    Parameters
    ----------
    kinds : list of str
        Task kinds, one per model (repeats allowed; see :func:`task_names`).
    num_clients : int
        Number of clients.
    seed : int
        Seed of everything.
    labels_per_client : float, default 0.3
        Fraction of the digits labels each client holds.
    max_synthetic_samples : int or None, default 500
        Cap on the samples per synthetic user.
    data_root : str, default "data"
        Where the real datasets are (``mnist``, ``fashion-mnist``, ``emnist``,
        ``cifar10``, ``shakespeare``, ``celeba-*``); see
        :mod:`mmfl_flwr.tasks.datasets` for the layout each loader expects.
    profile : str or Profile, default "uniform"
        Client heterogeneity: a :data:`PROFILES` name or a :class:`Profile`
        (``"uniform"``: all clients hold all tasks with one processor and
        label-skewed but equal-weight data; ``"paper003"``: paper 003's setting).
    clients : iterable of int or None, default None
        The clients whose data this process needs (a node hosting a shard of a
        big federation; ``()`` for the server, which needs the test sets and
        the clients' eligibility and processors only):
        :meth:`Federation.client_data` refuses the others, and the synthetic
        tasks keep no data for them (they generate only these users, unless the
        server's test sets or the low-data subsets need a pass over all of
        them). What is built is exactly what the whole federation holds. None:
        every client.
    server_tests : bool, default True
        Build the server-side test sets.

    Returns
    -------
    Federation
        The federation.
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r}; choose from {', '.join(PROFILES)}")
        profile = PROFILES[profile]
    if profile.partition not in PARTITIONS:
        raise ValueError(
            f"unknown partition {profile.partition!r}; choose from {', '.join(PARTITIONS)}"
        )
    lo, hi = profile.client_samples
    if (lo, hi) != (0, 0) and not 1 <= lo <= hi:
        raise ValueError(
            f"client_samples {profile.client_samples!r}: give (low, high) with 1 <= low <= "
            "high, or (0, 0) to keep every client's part"
        )
    if profile.partition != "label-skew" and (profile.clusters or profile.high_data_fraction > 0):
        raise ValueError(
            f"partition {profile.partition!r} (a flwr-datasets partitioner) cannot express "
            "label clusters or high-data clients (no flwr-datasets partitioner weights "
            "clients or maps them to label groups); use partition='label-skew'"
        )
    names = task_names(list(kinds))
    eligible, high, processors = _heterogeneity(num_clients, len(names), seed, profile)
    heterogeneous_data = profile.high_data_fraction > 0
    maps: list[np.ndarray] = []
    if profile.clusters:
        crng = np.random.default_rng(np.random.SeedSequence([int(seed), 77]))
        maps = [
            rng_map
            for rng_map in (
                crng.permutation(np.arange(num_clients) % profile.clusters)
                for _ in range(len(names))
            )
        ]
    keep = None if clients is None else frozenset(int(k) for k in clients)
    if keep is not None and any(not 0 <= k < num_clients for k in keep):
        raise ValueError(f"clients must be ids in [0, {num_clients})")
    copies: dict[str, int] = {}
    data: dict[str, Sequence[tuple[Dataset, Dataset]]] = {}
    tests: dict[str, Dataset] = {}
    for s, (name, kind) in enumerate(zip(names, kinds)):
        copy = copies.get(kind, 0)
        copies[kind] = copy + 1
        if kind == "digits":
            weights = (
                np.where(high[s], profile.high_data_ratio, 1.0) if heterogeneous_data else None
            )
            data[name], tests[name] = _build_digits(
                num_clients,
                seed,
                copy,
                labels_per_client,
                eligible[s],
                weights,
                maps[0 if profile.consistent else s] if profile.clusters else None,
                profile.clusters,
                partition=profile.partition,
                alpha=profile.dirichlet_alpha,
                low_data_samples=profile.low_data_samples,
                client_samples=profile.client_samples,
            )
        elif kind in SYNTHETIC_KINDS:
            data[name], tests[name] = _build_synthetic(
                kind,
                num_clients,
                seed,
                copy,
                max_synthetic_samples,
                eligible[s],
                high[s] if heterogeneous_data else None,
                profile.high_data_ratio,
                keep=keep,
                server=server_tests,
            )
        elif kind == "shakespeare":
            from mmfl_flwr.tasks.real import build_shakespeare

            data[name], tests[name] = build_shakespeare(num_clients, seed, data_root, eligible[s])
        elif kind.startswith("celeba-"):
            from mmfl_flwr.tasks.real import build_iid, load_split

            train, test = load_split(kind, data_root)
            data[name], tests[name] = build_iid(train, test, num_clients, seed, copy, eligible[s])
        elif kind in REAL_KINDS:
            from mmfl_flwr.tasks.real import load_split

            weights = (
                np.where(high[s], profile.high_data_ratio, 1.0) if heterogeneous_data else None
            )
            data[name], tests[name] = _build_digits(
                num_clients,
                seed,
                copy,
                labels_per_client,
                eligible[s],
                weights,
                maps[0 if profile.consistent else s] if profile.clusters else None,
                profile.clusters,
                kind=kind,
                data=load_split(kind, data_root),
                partition=profile.partition,
                alpha=profile.dirichlet_alpha,
                low_data_samples=profile.low_data_samples,
                client_samples=profile.client_samples,
            )
        elif get_task(kind) is not None:
            data[name], tests[name], user_eligible = _build_registered(
                kind, num_clients, seed, copy
            )
            eligible[s] &= user_eligible
        else:  # pragma: no cover - task_names already validated the kinds
            raise ValueError(f"unknown task kind {kind!r}")
    if any(kind in SYNTHETIC_KINDS for kind in kinds):
        _trim_heap()
    return Federation(
        seed=int(seed),
        num_clients=int(num_clients),
        tasks=names,
        kinds=dict(zip(names, kinds)),
        processors=processors,
        eligible={name: eligible[s].copy() for s, name in enumerate(names)},
        data=data,
        server_tests=tests if server_tests else {},
        hosted=keep,
        has_server_tests=server_tests,
    )
