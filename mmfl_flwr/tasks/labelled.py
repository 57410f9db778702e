"""Labelled tasks split among clients: the builder of the labelled image kinds
(:func:`build_labelled`: digits, mnist, mnist-5k, fashion-mnist, emnist,
cifar10) and the partitions it uses (our :func:`label_skew_partition`, the label
clusters, and the flwr-datasets ones of :mod:`mmfl_flwr.tasks.partitions`).

numpy only (no torch).
"""

from __future__ import annotations

import numpy as np

from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.spec import KindSpec, TaskBuild

__all__ = ["build_labelled", "cluster_labels", "label_skew_partition"]

#: Fourth word of the seed sequence of :attr:`Profile.low_data_samples`' draw (the
#: partition's own stream, :func:`stream_seed`, has three words).
_DRAW_STREAM = 12
#: Fourth word of the seed sequence of :attr:`Profile.client_samples`' draw.
_SIZES_STREAM = 13


def stream_seed(seed: int, stream: int, copy: int) -> np.random.SeedSequence:
    """Seed sequence of copy ``copy`` (0-based) of the task kind whose own
    stream number is ``stream`` (a fixed integer per kind, so that the random
    streams of different kinds never coincide)."""
    return np.random.SeedSequence([int(seed), int(stream), int(copy)])


def empty_like(spec: KindSpec) -> Dataset:
    """An empty dataset of a kind's input shape."""
    return Dataset(np.zeros((0, *spec.input_shape), np.float32), np.zeros(0, np.int64))


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

    _cover_labels(held_sets, np.unique(labels), num_classes, rng)
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


def _cover_labels(
    held_sets: list[set[int]], present: np.ndarray, num_classes: int, rng: np.random.Generator
) -> None:
    """Hand every label of ``present`` that no client drew to a client, in place
    (see :func:`label_skew_partition`)."""
    num_clients = len(held_sets)

    def holders_of(label: int) -> list[int]:
        return [i for i in range(num_clients) if label in held_sets[i]]

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


def cluster_labels(
    num_clients: int, clusters: int, num_classes: int, rng: np.random.Generator
) -> tuple[np.ndarray, list[np.ndarray]]:
    """A balanced random client-to-cluster map and a random split of the labels
    into ``clusters`` equal groups (each cluster holds ``1/clusters`` of them)."""
    cluster_of = rng.permutation(np.arange(num_clients) % clusters)
    label_groups = np.array_split(rng.permutation(num_classes), clusters)
    return cluster_of, [np.sort(g) for g in label_groups]


def build_labelled(
    req: TaskBuild, spec: KindSpec, stream: int, train: Dataset, test: Dataset
) -> tuple[list[tuple[Dataset, Dataset]], Dataset]:
    """Per-client data and server test set for one copy of a labelled image task
    (``train`` and ``test`` of a kind described by ``spec``; ``stream`` is the
    kind's own stream number); the training examples are shared out among the
    eligible clients only. With the profile's ``clusters``, client ``i`` holds
    the labels of cluster ``req.cluster_of[i]``; otherwise the profile's
    ``partition`` (see :attr:`Profile.partition`) splits them, each client
    holding ``max(1, round(labels_per_client * C))`` labels;
    ``low_data_samples`` (with high-data clients) draws the pool down first
    (:attr:`Profile.low_data_samples`); ``client_samples`` cuts each client's
    part to its size afterwards (:attr:`Profile.client_samples`). A client's
    local test set is the test examples of the labels it holds, split among
    their holders; the whole test split is the server's."""
    profile, seed, copy, weights = req.profile, req.seed, req.copy, req.weights
    rng = np.random.default_rng(stream_seed(seed, stream, copy))
    num_classes = spec.num_classes
    per = max(1, int(round(req.labels_per_client * num_classes)))
    members = np.flatnonzero(req.eligible)
    if profile.low_data_samples > 0 and weights is not None and members.size:
        want = int(round(profile.low_data_samples * float(weights[members].sum())))
        if want < train.y.shape[0]:
            # its own stream: the partition's stream draws as it would on the pool
            draw = np.random.default_rng(
                np.random.SeedSequence([int(seed), int(stream), int(copy), _DRAW_STREAM])
            )
            train = train.subset(np.sort(draw.choice(train.y.shape[0], want, replace=False)))
    if profile.clusters:
        assert req.cluster_of is not None
        _, label_groups = cluster_labels(req.num_clients, profile.clusters, num_classes, rng)
        held = [label_groups[int(req.cluster_of[i])] for i in members]
        train_parts = _split_by_holders(train.y, held, rng)
    elif profile.partition != "label-skew":
        train_parts, held = _fds_partition(
            profile.partition, train.y, members.shape[0], per, profile.dirichlet_alpha, rng
        )
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
    if profile.client_samples[1] > 0:
        cut = np.random.default_rng(
            np.random.SeedSequence([int(seed), int(stream), int(copy), _SIZES_STREAM])
        )
        lo, hi = profile.client_samples
        for j, part in enumerate(train_parts):
            size = int(cut.integers(lo, hi + 1))
            if part.shape[0] > size:
                train_parts[j] = np.sort(part[cut.choice(part.shape[0], size, replace=False)])
    clients = [(empty_like(spec), empty_like(spec))] * req.num_clients
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
