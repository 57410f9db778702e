"""The client table: what the server knows about each client.

Framework-free (numpy only). Clients are keyed by a *stable* id that the client
reports itself (the partition id in simulation, a node-config key in deployment),
never by Flower's node id, which changes every run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

#: A client may declare at most this many examples for one task. Anything larger is
#: treated as an absurd (hostile or buggy) report and rejected at registration.
MAX_NUM_EXAMPLES = 10**9
#: Upper bound on the processors a client may declare.
MAX_PROCESSORS = 1024


class InvalidClientInfo(ValueError):
    """A client's self-description (tasks, sample counts, processors) is invalid."""


def client_sort_key(cid: str) -> tuple[int, int, str]:
    """Order client ids naturally: numeric ids by value, then the others by name."""
    numeric = cid.isascii() and cid.isdigit()
    return (0, int(cid), cid) if numeric else (1, 0, cid)


@dataclass
class ClientInfo:
    """One client as the server sees it.

    Parameters
    ----------
    cid : str
        Stable client id.
    num_examples : dict[str, int]
        ``n_{i,s}``: training examples per task the client holds data for. Its keys
        are the client's eligible tasks ``S_i``.
    processors : int
        ``B_i``: how many model updates the client can train and upload per round.
    losses : dict[str, float]
        Latest reported loss per task (``f_{i,s}``).
    loss_round : dict[str, int]
        Round in which each loss was reported.
    online : bool
        Whether the client's node answered at the last check.
    declared : dict[str, int]
        The sample counts the client declared (``num_examples`` may be capped
        below them by :meth:`ClientTable.cap_counts`); empty = ``num_examples``.
    """

    cid: str
    num_examples: dict[str, int]
    processors: int = 1
    losses: dict[str, float] = field(default_factory=dict)
    loss_round: dict[str, int] = field(default_factory=dict)
    online: bool = True
    declared: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.declared:
            self.declared = dict(self.num_examples)

    @property
    def tasks(self) -> list[str]:
        """The client's eligible tasks, in declaration order."""
        return list(self.num_examples)


def validate_client_info(
    cid: str,
    num_examples: Mapping[str, int],
    processors: int,
    known_tasks: Iterable[str] | None = None,
) -> tuple[dict[str, int], list[str]]:
    """Check a client's declaration and return its usable tasks.

    Returns the validated ``{task: n}`` restricted to ``known_tasks`` and the list of
    declared tasks that were dropped because the server does not know them.
    Raises :class:`InvalidClientInfo` for anything that cannot be used at all.
    """
    if not isinstance(cid, str) or not cid:
        raise InvalidClientInfo(f"client id must be a non-empty string, got {cid!r}")
    if (
        isinstance(processors, bool)
        or not isinstance(processors, (int, np.integer))
        or not 1 <= processors <= MAX_PROCESSORS
    ):
        raise InvalidClientInfo(
            f"client {cid}: processors must be an integer in [1, {MAX_PROCESSORS}], "
            f"got {processors!r}"
        )
    known = None if known_tasks is None else set(known_tasks)
    usable: dict[str, int] = {}
    unknown: list[str] = []
    for task, n in num_examples.items():
        if (
            isinstance(n, bool)
            or not isinstance(n, (int, np.integer))
            or not 0 < n <= MAX_NUM_EXAMPLES
        ):
            raise InvalidClientInfo(
                f"client {cid}: num-examples for task {task!r} must be an integer in "
                f"[1, {MAX_NUM_EXAMPLES}], got {n!r}"
            )
        if known is not None and task not in known:
            unknown.append(task)
            continue
        usable[task] = int(n)
    return usable, unknown


class ClientTable:
    """All registered clients, ordered by stable id."""

    def __init__(self) -> None:
        self._clients: dict[str, ClientInfo] = {}

    def __len__(self) -> int:
        return len(self._clients)

    def __contains__(self, cid: object) -> bool:
        return cid in self._clients

    def __getitem__(self, cid: str) -> ClientInfo:
        return self._clients[cid]

    def upsert(self, info: ClientInfo) -> None:
        """Add a client, or replace its declaration (keeping its latest losses)."""
        old = self._clients.get(info.cid)
        if old is not None and not info.losses:
            info.losses = {t: v for t, v in old.losses.items() if t in info.num_examples}
            info.loss_round = {t: v for t, v in old.loss_round.items() if t in info.num_examples}
        self._clients[info.cid] = info

    def ids(self, online_only: bool = True) -> list[str]:
        """Client ids in natural order (the order every policy sees)."""
        ids = [c.cid for c in self._clients.values() if c.online or not online_only]
        return sorted(ids, key=client_sort_key)

    def clients(self, online_only: bool = True) -> list[ClientInfo]:
        """Clients in natural id order."""
        return [self._clients[c] for c in self.ids(online_only)]

    def set_online(self, online: Iterable[str]) -> None:
        """Mark exactly the given client ids as online."""
        on = set(online)
        for c in self._clients.values():
            c.online = c.cid in on

    def eligible(self, task: str, online_only: bool = True) -> list[str]:
        """Ids of the clients that hold data for ``task``."""
        return [c.cid for c in self.clients(online_only) if task in c.num_examples]

    def data_share(self, task: str, online_only: bool = True) -> dict[str, float]:
        """``d_{i,s} = n_{i,s} / sum_j n_{j,s}`` over the eligible clients."""
        counts = {
            c.cid: c.num_examples[task] for c in self.clients(online_only) if task in c.num_examples
        }
        total = float(sum(counts.values()))
        if total <= 0:
            return {}
        return {cid: n / total for cid, n in counts.items()}

    def cap_counts(self, factor: float | None) -> list[tuple[str, str, int, int]]:
        """Bound every client's share of a task's data: ``n_{i,s}`` is at most
        ``factor`` times the median declared count of that task over the
        registered clients (None: no bound). Recomputed from the declared counts
        each call (the median moves as clients register).

        Returns the ``(client, task, declared, used)`` pairs whose count changed.
        """
        changed = []
        by_task: dict[str, list[int]] = {}
        for c in self._clients.values():
            for t, n in c.declared.items():
                by_task.setdefault(t, []).append(n)
        # one median per task (not per client): this runs every round
        bounds = {
            t: None if factor is None else max(1, int(factor * np.median(ns)))
            for t, ns in by_task.items()
        }
        for c in self._clients.values():
            for t, n in c.declared.items():
                bound = bounds[t]
                used = n if bound is None else min(n, bound)
                if c.num_examples.get(t) != used:
                    changed.append((c.cid, t, n, used))
                    c.num_examples[t] = used
        return changed

    def set_loss(self, cid: str, task: str, loss: float, server_round: int) -> None:
        """Record the latest loss of ``cid`` on ``task``."""
        c = self._clients[cid]
        c.losses[task] = float(loss)
        c.loss_round[task] = int(server_round)

    def matrices(
        self, tasks: list[str], online_only: bool = True
    ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """Dense views for vectorised policies.

        Returns ``(ids, n, processors, losses)`` with ``n`` and ``losses`` of shape
        (S, N) (0 and NaN where a client is ineligible or has no loss yet) and
        ``processors`` of shape (N,).
        """
        clients = self.clients(online_only)
        ids = [c.cid for c in clients]
        n = np.zeros((len(tasks), len(ids)), dtype=np.float64)
        losses = np.full((len(tasks), len(ids)), np.nan)
        for j, c in enumerate(clients):
            for s, t in enumerate(tasks):
                if t in c.num_examples:
                    n[s, j] = c.num_examples[t]
                    if t in c.losses:
                        losses[s, j] = c.losses[t]
        procs = np.array([c.processors for c in clients], dtype=np.int64)
        return ids, n, procs, losses

    def state_dict(self) -> dict[str, object]:
        """Plain-data snapshot (JSON-friendly)."""
        return {
            cid: {
                "num_examples": dict(c.num_examples),
                "processors": c.processors,
                "losses": dict(c.losses),
                "loss_round": dict(c.loss_round),
                "online": c.online,
                "declared": dict(c.declared),
            }
            for cid, c in self._clients.items()
        }

    def load_state_dict(self, state: Mapping[str, Mapping[str, object]]) -> None:
        """Restore a snapshot made by :meth:`state_dict`."""
        self._clients = {}
        for cid, d in state.items():
            self._clients[cid] = ClientInfo(
                cid=cid,
                num_examples=dict(d["num_examples"]),  # type: ignore[call-overload]
                processors=int(d["processors"]),  # type: ignore[call-overload]
                losses=dict(d["losses"]),  # type: ignore[call-overload]
                loss_round=dict(d["loss_round"]),  # type: ignore[call-overload]
                online=bool(d["online"]),
                declared=dict(d.get("declared", {})),  # type: ignore[call-overload]
            )
