"""How the federation's clients are laid out on Flower nodes: :class:`NodeLayout`.

A Flower node (a SuperNode, a virtual node of the simulation engine, or a node of
the in-process grid) hosts K clients: node ``partition-id`` p hosts clients ``p K``
to ``p K + K - 1`` (the last node the rest), and there are ``ceil(N / K)`` nodes
for N clients. K is the setting ``clients-per-node``: a whole number, or ``auto``,
whose meaning depends on where the nodes run:

=====================  ====================================================
engine                 ``auto`` means
=====================  ====================================================
``inprocess``          K = 1: one node per client
``vectorized``         K = N: one node hosts every client (batched training)
``simulation``         one node per ClientApp Ray can run at once (its CPUs,
                       or GPU shares with ``--num-gpus-per-node``), the
                       clients then spread evenly over those nodes; K = 1
                       with ``--num-gpus-per-client``
a deployed node        ``ceil(N / num-partitions)`` from the node's own
                       config (1 without ``num-partitions``)
=====================  ====================================================

Every engine, the Flower apps and the deployment read K from here: this module is
the one place that divides clients among nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Engines whose nodes this module lays out before they start.
ENGINES = ("inprocess", "vectorized", "simulation")


def ceil_div(n: int, k: int) -> int:
    """``ceil(n / k)`` for whole numbers ``n >= 0``, ``k >= 1``."""
    return -(-n // k)


@dataclass(frozen=True)
class NodeLayout:
    """``num_clients`` clients, ``per_node`` (K) on each node, in partition order.

    Attributes
    ----------
    num_clients : int
        N, the clients of the federation.
    per_node : int
        K, the most clients one node hosts (>= 1; above N, one node hosts all).
    why : str
        How K was chosen (for the console and ``config.json``).
    """

    num_clients: int
    per_node: int
    why: str = "clients-per-node"

    def __post_init__(self) -> None:
        if self.num_clients < 1:
            raise ValueError(f"a layout needs at least one client, got {self.num_clients}")
        if self.per_node < 1:
            raise ValueError(f"clients per node must be >= 1, got {self.per_node}")

    @property
    def num_nodes(self) -> int:
        """``ceil(N / K)``."""
        return ceil_div(self.num_clients, self.per_node)

    def clients_of(self, partition_id: int) -> range:
        """The client ids (as numbers) node ``partition_id`` hosts; ValueError for a
        partition id outside ``0 .. num_nodes - 1``."""
        if not 0 <= partition_id < self.num_nodes:
            raise ValueError(
                f"partition-id={partition_id} hosts no client: with clients-per-node="
                f"{self.per_node} the federation of num-clients={self.num_clients} needs "
                f"partition ids 0 to {self.num_nodes - 1} (num-supernodes={self.num_nodes})"
            )
        k = self.per_node
        return range(partition_id * k, min(self.num_clients, (partition_id + 1) * k))

    def node_configs(self) -> list[dict[str, Any]]:
        """The node configs Flower's simulation engine gives its virtual nodes, and
        the in-process grid its nodes: ``partition-id`` and ``num-partitions``."""
        n = self.num_nodes
        return [{"partition-id": p, "num-partitions": n} for p in range(n)]

    def spread_evenly(self) -> NodeLayout:
        """The same number of nodes with the clients spread as evenly as the
        partition order allows: K = ``ceil(N / num_nodes)`` (what a node whose run
        config says ``auto`` computes from ``num-partitions``)."""
        return NodeLayout(self.num_clients, ceil_div(self.num_clients, self.num_nodes), self.why)

    @classmethod
    def for_engine(
        cls,
        num_clients: int,
        clients_per_node: int | None,
        engine: str,
        slots: int | None = None,
        per_client_gpus: bool = False,
        unit: str = "CPU",
    ) -> NodeLayout:
        """The layout an engine starts its nodes with.

        Parameters
        ----------
        num_clients : int
            N.
        clients_per_node : int or None
            The setting as a number, None for ``auto`` (see the module docstring).
        engine : str
            ``inprocess``, ``vectorized`` or ``simulation``.
        slots : int, optional
            ``simulation``: the ClientApps Ray can run at once (required there
            with ``auto``).
        per_client_gpus : bool
            ``simulation``: ``--num-gpus-per-client`` was given (one client per node).
        unit : str
            What one slot is, for :attr:`why` (``CPU`` or ``GPU share``).
        """
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
        if per_client_gpus and clients_per_node is not None and clients_per_node > 1:
            raise ValueError(
                f"--num-gpus-per-client applies to one client per node, not to "
                f"--clients-per-node {clients_per_node}: give each node's share with "
                "--num-gpus-per-node"
            )
        if clients_per_node is not None:
            return cls(num_clients, min(clients_per_node, num_clients))
        if engine == "inprocess":
            return cls(num_clients, 1, "auto: one node per client")
        if engine == "vectorized":
            return cls(num_clients, num_clients, "auto: one node for every client")
        if per_client_gpus:
            return cls(num_clients, 1, "one node per client (--num-gpus-per-client)")
        if slots is None:
            raise ValueError("the simulation engine's auto layout needs Ray's slots")
        workers = max(1, min(num_clients, slots))
        return cls(
            num_clients,
            ceil_div(num_clients, workers),
            f"auto: one node per {unit} Ray sees ({slots})",
        )

    @classmethod
    def for_node(
        cls, num_clients: int, clients_per_node: int | None, node_config: Mapping[str, Any]
    ) -> NodeLayout:
        """The layout as a node with ``node_config`` sees it (a SuperNode, a
        simulated node): an explicit ``clients-per-node`` as it is; ``auto``:
        ``ceil(N / num-partitions)`` from the node config, 1 without it."""
        if clients_per_node is not None:
            return cls(num_clients, clients_per_node)
        parts = node_config.get("num-partitions")
        try:
            n_parts = int(parts) if parts is not None else 0
        except (TypeError, ValueError):
            raise ValueError(
                f"node_config num-partitions={parts!r} is not a whole number"
            ) from None
        if n_parts < 1:
            return cls(num_clients, 1, "auto: one client per node (no num-partitions)")
        return cls(
            num_clients,
            max(1, ceil_div(num_clients, n_parts)),
            f"auto: num-partitions={n_parts}",
        )
