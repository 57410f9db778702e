"""The collusion check: updates of a model that are far more alike than the
round's updates usually are (colluders sending one crafted update: ALIE,
inner-product manipulation) count together as one client's
(:func:`check_collusion`, documented there)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.strategy.bounds import observe
from mmfl_flwr.strategy.events import DefenceLog, act

#: The check reads a model's round once it has at least this many updates.
COLLUSION_MIN_UPDATES = 3


def _unit_rows(us: Sequence[Update]) -> tuple[np.ndarray, list[int]]:
    """The updates' flattened directions (unit rows, float64) and the indices
    of the updates they belong to (an update of norm 0 or not finite has no
    direction and is left out)."""
    rows, keep = [], []
    for i, u in enumerate(us):
        v = np.concatenate([np.asarray(d, dtype=np.float64).ravel() for d in u.delta])
        n = float(np.linalg.norm(v))
        if n > 0 and np.isfinite(n):
            rows.append(v / n)
            keep.append(i)
    return (np.stack(rows) if rows else np.zeros((0, 0))), keep


def _components(n: int, edges: list[tuple[int, int]]) -> list[list[int]]:
    """The connected components of ``n`` nodes with at least two nodes."""
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in edges:
        parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(root(i), []).append(i)
    return [g for g in groups.values() if len(g) >= 2]


def check_collusion(
    updates: dict[str, list[Update]],
    factor: float | None,
    events: DefenceLog | None = None,
) -> None:
    """(Off by default: ``collusion_factor``.) Count the updates of a model
    that are far more alike than its round's
    updates usually are as one client's: each update of such a group of ``k``
    is scaled by ``1 / k`` in place (its direction kept), and logged with the
    client id, the model, the other members and the numbers; nothing is
    rejected.

    Per model with at least :data:`COLLUSION_MIN_UPDATES` updates this round:
    the cosine distance ``1 - cos`` of every pair of updates, and ``m``, the
    median over the pairs. Two updates are *alike* when their distance is
    below ``m / factor``; a group is a connected set of alike updates (two or
    more). Scale-free: only directions matter, so a colluder cannot leave a
    group by sending a larger or smaller copy.

    Why: colluders that craft one update from what they know (A Little Is
    Enough sends the mean minus ``z`` standard deviations, inner-product
    manipulation minus a multiple of the mean) send nearly the same direction,
    round after round, so together they weigh as many clients as they are and
    can outvote the honest updates of a round, while each alone looks like an
    honest update (the norm bounds and the direction check, which compare one
    update with the round's, leave them alone when they are a third of a round
    or more). Honest clients train on their own data from the same model: their
    updates differ by their data and their SGD noise, so the distance of two
    honest updates stays near the round's typical distance; where every
    client's data are alike (IID) the typical distance is small too, and only
    updates closer still are grouped. Counting a group once leaves its
    direction in the aggregate at one client's weight, which costs a group of
    honest clients that happen to send near copies (the same data) the weight
    of all but one of them. Where honest clients hold alike data (on the
    embedded tasks' label-skewed partitions, clients with the same labels),
    their updates are as alike as colluders' and are grouped round after
    round, which is why the check is off unless asked for. Runs first among
    the bounds on updates, before the norm bounds read the round's norms.
    """
    if factor is None:
        return
    for task, us in updates.items():
        if len(us) < COLLUSION_MIN_UPDATES:
            continue
        units, keep = _unit_rows(us)
        if len(keep) < COLLUSION_MIN_UPDATES:
            continue
        distance = 1.0 - np.clip(units @ units.T, -1.0, 1.0)
        upper = distance[np.triu_indices(len(keep), k=1)]
        m = float(np.median(upper))
        observe("collusion", task, [float(x) for x in upper], m)
        if not m > 0:
            continue
        limit = m / factor
        edges = [
            (a, b)
            for a in range(len(keep))
            for b in range(a + 1, len(keep))
            if distance[a, b] < limit
        ]
        for group in _components(len(keep), edges):
            members = [us[keep[g]] for g in group]
            inside = [float(distance[a, b]) for a in group for b in group if a < b]
            k = len(group)
            for u in members:
                others = ", ".join(v.cid for v in members if v is not u)
                act(
                    events,
                    "collusion",
                    u.cid,
                    task,
                    float(k),
                    1.0,
                    "Client %s: clipped update for task %r: it and the updates of clients "
                    "%s are nearly alike (cosine distances %.3f to %.3f among them, under "
                    "%.3f = the round's median distance %.3f / %g): counted as one client's, "
                    "update scaled by 1/%d",
                    u.cid,
                    task,
                    others,
                    min(inside),
                    max(inside),
                    limit,
                    m,
                    factor,
                    k,
                )
                u.delta = [d / k for d in u.delta]
