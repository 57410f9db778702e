"""How heterogeneous the clients of a federation are: :class:`Profile` and the
named profiles (:data:`PROFILES`) that ``profile=`` / ``--profile`` take.

No imports of numpy or the rest of the package: the builder, the task builders
and the settings read it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Profile", "PROFILES", "PARTITIONS"]


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
