"""The collusion check: updates of a model that are far more alike than the
round's updates usually are (colluders sending one crafted update: ALIE,
inner-product manipulation) count together as one client's
(:func:`check_collusion`, documented there)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.strategy.directions import _cosine, _median_rows
from mmfl_flwr.strategy.events import DefenceLog, act
from mmfl_flwr.strategy.influence import REVERSED_MIN_COSINE

#: The check reads a model's round once it has at least this many updates.
COLLUSION_MIN_UPDATES = 3
#: A group is judged against the other updates of its model's round (a reversed
#: coalition is rejected) when at least this many updates are outside it.
COLLUSION_MIN_OTHERS = 2


#: :func:`_cosines` stacks at most about this many numbers at a time.
GRAM_BLOCK = 1 << 22


def _cosines(us: Sequence[Update]) -> tuple[np.ndarray, list[int]]:
    """The cosines of every pair of the updates that have a direction (norm
    positive and finite), as a matrix, and the indices of those updates. The
    Gram matrix is summed a block of coordinates at a time (about
    :data:`GRAM_BLOCK` numbers), so no stacked copy of every update is held:
    memory grows with the square of the number of updates, not with their size."""
    n = len(us)
    gram = np.zeros((n, n))
    if n == 0:
        return gram, []
    sizes = [int(np.asarray(d).size) for d in us[0].delta]
    step = max(1, GRAM_BLOCK // n)
    flat = [[np.asarray(d, dtype=np.float64).ravel() for d in u.delta] for u in us]
    for j, size in enumerate(sizes):
        for lo in range(0, size, step):
            block = np.stack([row[j][lo : lo + step] for row in flat])
            gram += block @ block.T
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    keep = [i for i in range(n) if norms[i] > 0 and np.isfinite(norms[i])]
    sub = gram[np.ix_(keep, keep)] / np.outer(norms[keep], norms[keep])
    return np.clip(sub, -1.0, 1.0), keep


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


def _against_the_others(members: Sequence[Update], others: Sequence[Update]) -> float | None:
    """The cosine of a group's mean update with the coordinate-wise median of the
    other updates of the round; None with fewer than :data:`COLLUSION_MIN_OTHERS`
    others or without a direction."""
    if len(others) < COLLUSION_MIN_OTHERS:
        return None
    mean = np.concatenate(
        [
            np.mean([np.asarray(u.delta[j], dtype=np.float64).ravel() for u in members], axis=0)
            for j in range(len(members[0].delta))
        ]
    )
    rows = [[np.asarray(d, dtype=np.float64).ravel() for d in u.delta] for u in others]
    return _cosine(mean, _median_rows(rows))


class _Alike(NamedTuple):
    """Why a group's updates are alike: the smallest and largest cosine distance
    among them, the limit they are under, the round's median distance and the factor."""

    lo: float
    hi: float
    limit: float
    median: float
    factor: float


def _log_members(
    events: DefenceLog | None,
    kind: str,
    task: str,
    members: Sequence[Update],
    value: float,
    bound: float,
    alike: _Alike,
    verdict: str,
    *verdict_args: object,
) -> None:
    """One event per member of an alike group, naming the others and why they are
    alike, then ``verdict`` (a format string) with ``verdict_args``."""
    for u in members:
        act(
            events,
            kind,
            u.cid,
            task,
            value,
            bound,
            "Client %s: %s update for task %r: it and the updates of clients %s are nearly "
            "alike (cosine distances %.3f to %.3f among them, under %.3f = the round's "
            "median distance %.3f / %g)" + verdict,
            u.cid,
            "rejected" if kind == "rejected" else "clipped",
            task,
            ", ".join(v.cid for v in members if v is not u),
            *alike,
            *verdict_args,
        )


def _reject_coalition(
    task: str,
    members: Sequence[Update],
    alike: _Alike,
    against: float,
    events: DefenceLog | None,
) -> list[tuple[str, str]]:
    """Log every member of a reversed coalition as rejected (``against``: the cosine
    of their mean with the others' median); returns their ``(task, client id)`` pairs."""
    _log_members(
        events,
        "rejected",
        task,
        members,
        -against,
        REVERSED_MIN_COSINE,
        alike,
        " and their mean points against the round's other updates (cosine %.3f with "
        "their median, below -%g): a reversed coalition",
        against,
        REVERSED_MIN_COSINE,
    )
    return [(task, u.cid) for u in members]


def _count_as_one(
    task: str, members: Sequence[Update], alike: _Alike, events: DefenceLog | None
) -> None:
    """Scale every member of a group of ``k`` alike updates by ``1 / k`` in place and
    log it."""
    k = len(members)
    _log_members(
        events,
        "collusion",
        task,
        members,
        float(k),
        1.0,
        alike,
        ": counted as one client's, update scaled by 1/%d",
        k,
    )
    for u in members:
        u.delta = [d / k for d in u.delta]


def check_collusion(
    updates: dict[str, list[Update]],
    factor: float | None,
    events: DefenceLog | None = None,
) -> list[tuple[str, str]]:
    """(Off by default: ``collusion_factor``.) Count the updates of a model
    that are far more alike than its round's
    updates usually are as one client's: each update of such a group of ``k``
    is scaled by ``1 / k`` in place (its direction kept), and logged with the
    client id, the model, the other members and the numbers. A group whose mean
    update points against the round's other updates (cosine with their
    coordinate-wise median below ``-REVERSED_MIN_COSINE``, the others at least
    as many as the group and at least :data:`COLLUSION_MIN_OTHERS`) is a
    *reversed coalition*
    (inner-product manipulation by several clients): every member is rejected,
    removed from ``updates`` in place, logged, and returned as a ``(task,
    client id)`` pair.

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
    round, which is why the check is off unless asked for. Honest clients with
    alike data still move their model the way the others do, so a group of
    them is scaled, not rejected; a group sent to undo the others' progress is
    left out, as the bound on reversed updates alone would leave half of it in
    (it lets reversed updates pull back up to half the others' push). Runs
    first among the bounds on updates, before the norm bounds read the round's
    norms.
    """
    rejected: list[tuple[str, str]] = []
    if factor is None:
        return rejected
    for task, us in updates.items():
        if len(us) < COLLUSION_MIN_UPDATES:
            continue
        cosine, keep = _cosines(us)
        if len(keep) < COLLUSION_MIN_UPDATES:
            continue
        distance = 1.0 - cosine
        m = float(np.median(distance[np.triu_indices(len(keep), k=1)]))
        if not m > 0:
            continue
        limit = m / factor
        edges = [(int(a), int(b)) for a, b in np.argwhere(np.triu(distance < limit, k=1))]
        out: set[int] = set()
        for group in _components(len(keep), edges):
            members = [us[keep[g]] for g in group]
            inside = [float(distance[a, b]) for a in group for b in group if a < b]
            k = len(group)
            alike = _Alike(min(inside), max(inside), limit, m, factor)
            ids = {id(u) for u in members}
            rest = [u for u in us if id(u) not in ids]
            # judged only where the others are at least as many: their median is then
            # not a minority's (a coalition that is most of a round is not caught here)
            against = _against_the_others(members, rest) if k <= len(rest) else None
            if against is not None and against < -REVERSED_MIN_COSINE:
                out |= ids
                rejected += _reject_coalition(task, members, alike, against, events)
                continue
            _count_as_one(task, members, alike, events)
        if out:
            updates[task] = [u for u in us if id(u) not in out]
    return rejected
