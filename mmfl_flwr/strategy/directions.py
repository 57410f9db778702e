"""The direction check: updates that point, round after round, against their
model's other updates (a sign flip, inner-product manipulation) are shrunk to
the round's reference norm (:func:`check_directions`, documented there).

Its cosines are also what :class:`~.influence.InfluenceBound` reads to find
the reversed updates, so they are computed whether or not the check is on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.strategy.bounds import l2_norm, observe
from mmfl_flwr.strategy.events import DefenceLog, act

#: :func:`check_directions` judges a client of a model once it has this many cosines ...
DIRECTION_MIN_ROUNDS = 2
#: ... while at least this many clients of the model have as many ...
DIRECTION_MIN_CLIENTS = 5
#: ... and their median mean cosine is at least this (the clients agree on a direction).
DIRECTION_AGREEMENT = 0.1
#: The cosines kept per (model, client): the most recent ones.
DIRECTION_HISTORY = 20
#: Up to this many updates of a model in a round, each one's reference leaves it out.
DIRECTION_LEAVE_ONE_OUT = 16


def _cosine(a: np.ndarray, b: np.ndarray) -> float | None:
    """The cosine of two vectors; None where either norm is 0 or not finite."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if not (na > 0 and nb > 0 and math.isfinite(na) and math.isfinite(nb)):
        return None
    return float(a @ b) / (na * nb)


#: :func:`_median_rows` takes the median of at most this many numbers at a time.
MEDIAN_BLOCK = 1 << 22


def _median_rows(rows: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """The coordinate-wise median of several flattened updates, each given as its
    1-D pieces (same sizes in every row): equal to ``np.median(np.stack([
    np.concatenate(r) for r in rows]), axis=0)``, number for number, but computed a
    block of coordinates at a time (about :data:`MEDIAN_BLOCK` numbers), so that
    no stacked copy of every update is held: with the float64 deltas the
    validation makes, the server keeps one copy of each client's update (the
    aggregator's), not three."""
    sizes = [int(piece.size) for piece in rows[0]]
    out = np.empty(sum(sizes))
    step = max(1, MEDIAN_BLOCK // len(rows))
    start = 0
    for j, size in enumerate(sizes):
        for lo in range(0, size, step):
            hi = min(size, lo + step)
            block = np.stack([row[j][lo:hi] for row in rows])
            out[start + lo : start + hi] = np.median(block, axis=0, overwrite_input=True)
        start += size
    return out


def check_directions(
    updates: dict[str, list[Update]],
    history: dict[str, dict[str, list[float]]],
    factor: float | None,
    cosines: dict[tuple[str, str], tuple[float, float, int]] | None = None,
    events: DefenceLog | None = None,
) -> list[tuple[str, str]]:
    """Shrink the updates of clients whose updates of a model point, round after
    round, against the other clients' (a sign flip, inner-product manipulation)
    to the round's reference norm, where the model's clients agree enough on a
    direction for that to mean something. Each such update is scaled down in
    place (its direction kept) and logged with the client id, the model and the
    numbers; nothing is rejected (returns ``[]``, the signature of the other
    bounds).

    Each round, each update of a model with at least two updates gets the
    cosine between it and the coordinate-wise median of the model's other
    updates of the round (up to :data:`DIRECTION_LEAVE_ONE_OUT` updates; above,
    the median of all of them, which one update barely moves); ``history``
    keeps a client's last :data:`DIRECTION_HISTORY` cosines per model. A
    client's score is the mean of its cosines. Among the clients with at least
    :data:`DIRECTION_MIN_ROUNDS` cosines (at least
    :data:`DIRECTION_MIN_CLIENTS` of them), with ``m`` the median score and
    ``s`` 1.4826 times the median absolute deviation of the scores, a client
    is suspect when its score is negative and below ``m - factor s``, provided
    ``m >= DIRECTION_AGREEMENT``. A suspect's update of this round whose norm
    exceeds the reference norm (the lower median of the round's update norms,
    as :func:`bound_update_norms`) is scaled down to it.

    Why shrink rather than reject: a direction cannot tell a flipper from an
    honest client with unusual data. Honest clients of some federations score
    as low as a flipper does, round after round, several robust deviations
    below the median (docs/how-to/defences.md has the scores measured).
    Shrinking a suspect to the reference norm makes a flipped x10 update act
    as a flipped x1 one, and costs an honest suspect only the part of its
    update above the median size. Where the clients do not agree (median below
    :data:`DIRECTION_AGREEMENT`, as where their data differ much and they
    train many local epochs) nobody is a suspect: there a flipped update looks
    like an honest one. Runs after the norm bounds, on the clipped updates.

    ``cosines``, when given, receives each update's cosine of this round, its
    client's score and the number of cosines the score averages, keyed by
    ``(task, client id)`` (what :class:`~.influence.InfluenceBound` reads); they are
    computed (and ``history`` kept) even when ``factor`` is None.
    """
    if factor is None and cosines is None:
        return []
    for task, us in updates.items():
        if len(us) < 2:
            continue
        past = history.setdefault(task, {})
        _record_cosines(task, us, past, cosines)
        if factor is not None:
            _shrink_suspects(task, us, past, factor, events)
    return []


def _record_cosines(
    task: str,
    us: list[Update],
    past: dict[str, list[float]],
    cosines: dict[tuple[str, str], tuple[float, float, int]] | None,
) -> None:
    """Add each update's cosine with the median of the model's other updates to
    its client's history ``past`` (and to ``cosines``, with the client's score)."""
    rows = [[np.asarray(d, dtype=np.float64).ravel() for d in u.delta] for u in us]
    whole = None if len(us) <= DIRECTION_LEAVE_ONE_OUT else _median_rows(rows)
    for i, u in enumerate(us):
        ref = whole if whole is not None else _median_rows(rows[:i] + rows[i + 1 :])
        c = _cosine(np.concatenate(rows[i]), ref)
        if c is not None:
            past[u.cid] = (past.get(u.cid, []) + [c])[-DIRECTION_HISTORY:]
            if cosines is not None:
                cosines[(task, u.cid)] = (c, float(np.mean(past[u.cid])), len(past[u.cid]))


def _shrink_suspects(
    task: str,
    us: list[Update],
    past: dict[str, list[float]],
    factor: float,
    events: DefenceLog | None,
) -> None:
    """Scale the updates of the model's suspects (scores in ``past``) above the
    round's reference norm down to it, where the clients agree on a direction."""
    scores = {cid: float(np.mean(v)) for cid, v in past.items() if len(v) >= DIRECTION_MIN_ROUNDS}
    if len(scores) < DIRECTION_MIN_CLIENTS:
        return
    values = np.array(list(scores.values()))
    m = float(np.median(values))
    s = 1.4826 * float(np.median(np.abs(values - m)))
    observe("direction", task, [scores[u.cid] for u in us if u.cid in scores], m)
    if m < DIRECTION_AGREEMENT:
        return
    bound = m - factor * s
    norms = [l2_norm(u.delta) for u in us]
    ref_norm = float(np.percentile(norms, 50, method="lower"))
    for u, norm in zip(us, norms):
        score = scores.get(u.cid)
        if score is None or not (score < 0 and score < bound) or not norm > ref_norm:
            continue
        act(
            events,
            "direction",
            u.cid,
            task,
            norm,
            ref_norm,
            "Client %s: clipped update for task %r: its updates point against the "
            "other clients' (mean cosine %.3f over its last %d rounds; the clients' median "
            "%.3f, bound %.3f = median - %g x robust deviation %.3f); update norm %.4g "
            "scaled to the reference norm %.4g",
            u.cid,
            task,
            score,
            len(past[u.cid]),
            m,
            bound,
            factor,
            s,
            norm,
            ref_norm,
        )
        u.delta = [d * (ref_norm / norm) for d in u.delta]
