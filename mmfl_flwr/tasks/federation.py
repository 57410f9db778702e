"""The simulated federation: which client holds which data for which task.

numpy only (no torch). Everything is a deterministic function of the seed, so every
simulated client process can rebuild the same federation cheaply.

Every task kind, built-in or the user's, is a registration in
:mod:`mmfl_flwr.tasks.registry`: :func:`build_federation` draws the clients'
heterogeneity (:mod:`mmfl_flwr.tasks.profiles`) and asks each task's ``build``
for its data (a user task given by ``data_fn`` or ``dataset`` and
``partitioner`` is built here).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.kinds import KINDS, KindSpec
from mmfl_flwr.tasks.labelled import cluster_labels, label_skew_partition
from mmfl_flwr.tasks.packed import SHARED_DATA_ENV, PackedUsers, shared_array
from mmfl_flwr.tasks.profiles import PARTITIONS, PROFILES, Profile
from mmfl_flwr.tasks.registry import get_task, task_kinds
from mmfl_flwr.tasks.spec import Built, TaskBuild

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

# importable from here as before the split into modules
_MOVED = (cluster_labels, shared_array, SHARED_DATA_ENV)


def known_kinds() -> list[str]:
    """Built-in task kinds and the ones registered with
    :func:`~mmfl_flwr.tasks.registry.register_task`."""
    return task_kinds()


def _build_user(req: TaskBuild) -> Built:
    """Data of a user task given by ``data_fn`` or ``dataset`` and
    ``partitioner``: per client data, server test set, and the eligible
    clients that got training data."""
    kind, num_clients, seed, copy = req.kind, req.num_clients, req.seed, req.copy
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
    return out, server, req.eligible & eligible


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
        Task kinds, each a registered kind (:func:`known_kinds`).

    Returns
    -------
    list of str
        One name per entry of ``kinds``, e.g.
        ``["digits", "synthetic", "digits"] -> ["digits", "synthetic", "digits_2"]``.
    """
    counts: dict[str, int] = {}
    names: list[str] = []
    for kind in kinds:
        if get_task(kind) is None:
            raise ValueError(f"unknown task kind {kind!r}; known: {sorted(known_kinds())}")
        counts[kind] = counts.get(kind, 0) + 1
        names.append(kind if counts[kind] == 1 else f"{kind}_{counts[kind]}")
    return names


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
        Task name -> task kind (a registered kind, :func:`known_kinds`).
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


def _profile(profile: str | Profile) -> Profile:
    """The profile named or given, checked."""
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
    return profile


def _cluster_maps(
    num_clients: int, num_tasks: int, seed: int, profile: Profile
) -> list[np.ndarray]:
    """Per task, its client-to-cluster map under a profile with label clusters
    (used with ``consistent``: the first one for every task); none without."""
    if not profile.clusters:
        return []
    crng = np.random.default_rng(np.random.SeedSequence([int(seed), 77]))
    return [crng.permutation(np.arange(num_clients) % profile.clusters) for _ in range(num_tasks)]


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

    Each task's data comes from its registration
    (:func:`~mmfl_flwr.tasks.registry.register_task`), every copy of a kind
    from its own random stream; the built-in kinds are described by their
    modules in :mod:`mmfl_flwr.tasks.builtin` (``digits``: label skew among
    the eligible clients; ``synthetic*``: FedProx's Synthetic users; the real
    datasets read from ``data_root``).

    Parameters
    ----------
    kinds : list of str
        Task kinds, one per model (repeats allowed; see :func:`task_names`).
    num_clients : int
        Number of clients.
    seed : int
        Seed of everything.
    labels_per_client : float, default 0.3
        Fraction of the labels of a labelled image task each client holds.
    max_synthetic_samples : int or None, default 500
        Cap on the samples per synthetic user.
    profile : str or Profile, default "uniform"
        Client heterogeneity: a :data:`PROFILES` name or a :class:`Profile`
        (``"uniform"``: all clients hold all tasks with one processor and
        label-skewed but equal-weight data; ``"paper003"``: paper 003's setting).
    data_root : str, default "data"
        Where the real datasets are; see :mod:`mmfl_flwr.tasks.datasets` for
        the layout each loader expects.
    clients : iterable of int or None, default None
        The clients whose data this process needs (a node hosting a shard of a
        big federation; ``()`` for the server, which needs the test sets and
        the clients' eligibility and processors only):
        :meth:`Federation.client_data` refuses the others, and the synthetic
        tasks keep no data for them. What is built is exactly what the whole
        federation holds. None: every client.
    server_tests : bool, default True
        Build the server-side test sets.

    Returns
    -------
    Federation
        The federation.
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    profile = _profile(profile)
    names = task_names(list(kinds))
    eligible, high, processors = _heterogeneity(num_clients, len(names), seed, profile)
    maps = _cluster_maps(num_clients, len(names), seed, profile)
    keep = None if clients is None else frozenset(int(k) for k in clients)
    if keep is not None and any(not 0 <= k < num_clients for k in keep):
        raise ValueError(f"clients must be ids in [0, {num_clients})")
    copies: dict[str, int] = {}
    data: dict[str, Sequence[tuple[Dataset, Dataset]]] = {}
    tests: dict[str, Dataset] = {}
    for s, (name, kind) in enumerate(zip(names, kinds)):
        copy = copies.get(kind, 0)
        copies[kind] = copy + 1
        request = TaskBuild(
            kind=kind,
            num_clients=num_clients,
            seed=seed,
            copy=copy,
            eligible=eligible[s],
            profile=profile,
            high=high[s] if profile.high_data_fraction > 0 else None,
            cluster_of=maps[0 if profile.consistent else s] if maps else None,
            labels_per_client=labels_per_client,
            max_synthetic_samples=max_synthetic_samples,
            data_root=data_root,
            clients=keep,
            server_tests=server_tests,
        )
        definition = get_task(kind)
        assert definition is not None  # task_names checked every kind
        data[name], tests[name], eligible[s] = (definition.build or _build_user)(request)
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
