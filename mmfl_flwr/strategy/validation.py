"""Phase 5 of a round, and every bound on what clients report, in one place.

- Each (client, task) part of a train reply is checked on its own and becomes
  an :class:`~mmfl_flwr.core.aggregators.Update`, or is rejected with the
  reason, logged with the client id (:func:`collect_updates`,
  :func:`validate_train_part`).
- Update norms are bounded against the model's reference norm
  (:func:`bound_update_norms`), sample counts against the task's median count
  (:func:`apply_count_cap`), and reported losses (loss queries and the training
  losses a policy observes) against the task's reference loss, the largest 90th
  percentile reported so far (:func:`loss_cap`, :func:`cap_train_losses`).
:class:`Limits` holds the bounds.

Every action of a bound is a defence event (:mod:`.events`): recorded where it
happens (the ``events`` a bound is given, the run's
:class:`~.events.DefenceLog`), with its own line at DEBUG; a reply that fails a
check (malformed, failed, missing) is still logged at WARNING.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING

import numpy as np
from flwr.app import Message, RecordDict
from flwr.common.logger import log

from mmfl_flwr import protocol as P
from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.core.clients import MAX_NUM_EXAMPLES, ClientInfo, ClientTable
from mmfl_flwr.core.policy import Pick
from mmfl_flwr.records import InvalidReply, NumpyWeights, check_count, check_loss, check_weights
from mmfl_flwr.strategy.events import DefenceLog, act
from mmfl_flwr.strategy.replies import client_replies
from mmfl_flwr.strategy.state import RoundPlan, RunState


def l2_norm(arrays: Iterable[np.ndarray]) -> float:
    """``sqrt(sum of squares)`` over several arrays, scaled so it cannot overflow
    for finite inputs (inf only if the true norm exceeds the float range)."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    scale = max((float(np.abs(a).max()) for a in arrays if a.size), default=0.0)
    if scale == 0.0:
        return 0.0
    return scale * float(np.sqrt(sum(float(np.square(a / scale).sum()) for a in arrays)))


#: ``f(kind, task, values, reference)``, called at every bound check with what
#: was measured against the reference (``kind``: ``"update-norm"``,
#: ``"query-loss"``, ``"train-loss"``, ``"influence"`` (each update's weight x
#: norm, when the influence bound is on), ``"expected-influence"`` (under the
#: oracle StaleVR with the influence bound on: each fresh update's data share x
#: norm), or ``"direction"``: this round's
#: clients' mean cosines against the median of all scores): a hook for measurements
#: (``benchmarks/honest_spread.py`` records how close honest clients come to
#: each bound). Observers must not
#: change what they are given; none are registered by default.
BOUND_OBSERVERS: list[Callable[[str, str, list[float], float], None]] = []


def _observe(kind: str, task: str, values: list[float], reference: float) -> None:
    for observer in BOUND_OBSERVERS:
        observer(kind, task, list(values), reference)


#: The default ``update_clip_factor``: see :class:`Limits`.
UPDATE_CLIP_FACTOR = 3.0
#: The factor ``influence_clip_factor`` is measured at (docs/how-to/defences.md):
#: the bound is off by default (:func:`bound_influence` says why).
INFLUENCE_CLIP_FACTOR = 4.0
#: The default ``reversed_influence_factor``: the influence bound held on updates
#: that point against their model's other updates (:class:`InfluenceBound`).
REVERSED_INFLUENCE_FACTOR = 4.0
#: The default ``direction_factor``: see :class:`Limits` and :func:`check_directions`.
DIRECTION_FACTOR = 3.0
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


@dataclass(frozen=True)
class Limits:
    """What a reply may contain.

    Attributes
    ----------
    max_loss : float
        Reported losses above this are rejected as absurd.
    loss_cap : float or None
        Reported losses (loss queries, and the training losses a policy
        observes) above this multiple of the task's reference loss, the largest
        90th percentile reported so far (:func:`loss_cap`), are capped.
    max_update_norm : float or None
        Updates whose L2 norm (over the trainable entries) exceeds this are
        rejected (an absolute bound; None: none).
    update_norm_factor : float or None
        Updates whose norm exceeds this multiple of the model's reference norm
        (the lower median of this round's and the recent rounds' update norms)
        are rejected (None: no relative bound).
    count_cap : float or None
        A client's sample count of a task is used up to this multiple of the
        task's median declared count (None: no bound).
    update_clip_factor : float or None
        Updates whose norm exceeds this multiple of the model's reference norm
        (the same reference as ``update_norm_factor``) are scaled down to it:
        one update then moves its model at most this many honest steps (None:
        no clipping).
    direction_factor : float or None
        A client whose updates of a model point, on average over its recent
        rounds, against the other clients' has its updates of that model scaled
        down to the round's reference norm when its (negative) mean cosine lies
        this many robust deviations below the clients' median, while the
        clients agree on a direction (:func:`check_directions`; None: no
        direction check).
    influence_clip_factor : float or None
        An update whose influence on its model's step (its weight in the
        aggregate times its norm) exceeds this multiple of the round's
        reference influence (the lower median over the model's updates) is
        scaled down to it (:func:`bound_influence`; None, the default: no
        influence bound; :data:`INFLUENCE_CLIP_FACTOR`, 4, is the measured one).
        Under an aggregator that reads every client's fresh update (the oracle
        StaleVR) it also bounds each fresh update's influence on the expected
        step, data share times norm (:func:`bound_expected_influence`).
    reversed_influence_factor : float or None
        The same bound, held by default (:data:`REVERSED_INFLUENCE_FACTOR`, 4)
        on the updates that point against their model's other updates: whose
        cosine with the coordinate-wise median of the round's other updates is
        negative this round and on average over the client's recent rounds of
        the model (:func:`check_directions` reads the cosines;
        :class:`InfluenceBound`). An update the clients agree with keeps its
        weight, so honest runs keep the papers' weighting wherever clients do
        not disagree (None: off).
    """

    max_loss: float = 1e6
    loss_cap: float | None = 10.0
    max_update_norm: float | None = None
    update_norm_factor: float | None = 100.0
    count_cap: float | None = 200.0
    update_clip_factor: float | None = UPDATE_CLIP_FACTOR
    direction_factor: float | None = DIRECTION_FACTOR
    influence_clip_factor: float | None = None
    reversed_influence_factor: float | None = REVERSED_INFLUENCE_FACTOR

    def __post_init__(self) -> None:
        if self.loss_cap is not None and not self.loss_cap > 1:
            raise ValueError("loss_cap must be > 1 (a multiple of the reference loss) or None")
        if self.max_update_norm is not None and not self.max_update_norm > 0:
            raise ValueError("max_update_norm must be > 0 or None")
        if self.update_norm_factor is not None and not self.update_norm_factor > 1:
            raise ValueError(
                "update_norm_factor must be > 1 (a multiple of the reference norm) or None"
            )
        if self.update_clip_factor is not None and not self.update_clip_factor >= 1:
            raise ValueError(
                "update_clip_factor must be >= 1 (a multiple of the reference norm) or None"
            )
        if self.direction_factor is not None and not self.direction_factor > 0:
            raise ValueError(
                "direction_factor must be > 0 (a multiple of the robust deviation) or None"
            )
        if self.influence_clip_factor is not None and not self.influence_clip_factor >= 1:
            raise ValueError(
                "influence_clip_factor must be >= 1 (a multiple of the reference influence) or None"
            )
        if self.reversed_influence_factor is not None and not self.reversed_influence_factor >= 1:
            raise ValueError(
                "reversed_influence_factor must be >= 1 (a multiple of the "
                "reference influence) or None"
            )
        if self.count_cap is not None and not self.count_cap >= 1:
            raise ValueError("count_cap must be >= 1 (a multiple of the median) or None")


def validate_train_part(
    content: RecordDict,
    task: str,
    pick: Pick,
    info: ClientInfo,
    glob: NumpyWeights,
    keys: tuple[list[str], list[str]],
    data_share: float,
    limits: Limits,
    needs_control: bool,
) -> tuple[Update, float | None]:
    """Check one trained model of a reply against the global weights ``glob``.

    ``keys`` is the model's ``(trainable, state)`` split. Returns the update
    (``G = w_global - w_local`` over the trainable entries; the state entries
    as received) and the reported training loss (None if absent); raises
    :class:`~mmfl_flwr.records.InvalidReply` saying what is wrong.
    """
    train_keys, state_keys = keys
    if P.arrays_key(task) not in content.array_records:
        raise InvalidReply("no weights returned")
    local = check_weights(content[P.arrays_key(task)], glob)
    if limits.max_update_norm is not None:
        norm = l2_norm(glob[k].astype(np.float64) - local[k] for k in train_keys)
        if not norm <= limits.max_update_norm:
            raise InvalidReply(
                f"update norm {norm:.4g} exceeds max_update_norm {limits.max_update_norm:g}"
            )
    metrics = content.metric_records.get(P.metrics_key(task))
    if metrics is None:
        raise InvalidReply(f"no '{P.metrics_key(task)}' MetricRecord")
    n = check_count(metrics.get(P.NUM_EXAMPLES), P.NUM_EXAMPLES, MAX_NUM_EXAMPLES)
    if n > info.declared.get(task, n):
        raise InvalidReply(
            f"num-examples {n} exceeds the {info.declared[task]} it registered for this task"
        )
    control = None
    if needs_control:
        if P.control_key(task) not in content.array_records:
            raise InvalidReply("no SCAFFOLD control variate returned")
        c = check_weights(content[P.control_key(task)], {k: glob[k] for k in train_keys})
        control = [c[k] for k in train_keys]
    tl = metrics.get(P.TRAIN_LOSS)
    train_loss = None if tl is None else check_loss(tl, P.TRAIN_LOSS, limits.max_loss)
    update = Update(
        cid=info.cid,
        delta=[glob[k].astype(np.float64) - local[k] for k in train_keys],
        num_examples=info.num_examples[task],
        data_share=data_share,
        processors=info.processors,
        prob=pick.prob,
        count=pick.count,
        control=control,
        state=[local[k] for k in state_keys],
    )
    return update, train_loss


#: How many recent accepted update norms per model enter the reference norm.
NORM_HISTORY = 64


def bound_update_norms(
    updates: dict[str, list[Update]],
    history: dict[str, list[float]],
    factor: float | None,
    model_norm: Callable[[str], float] | None = None,
    clip_factor: float | None = None,
    events: DefenceLog | None = None,
) -> list[tuple[str, str]]:
    """Reject every update whose norm exceeds ``factor`` times its model's
    reference norm, and scale every remaining update whose norm exceeds
    ``clip_factor`` times it down to that norm. A rejected update is removed
    from ``updates`` (in place), logged with the client id and the model, and
    returned as a ``(task, client id)`` pair; a clipped one is replaced (in
    place) by the same direction at the bound, and logged with the client id
    and the model.

    The reference is the lower median of this round's update norms (an
    observed honest norm while fewer than half of the updates are hostile, even
    with two updates); with a single update this round, the model's last
    :data:`NORM_HISTORY` accepted norms (``history``, updated here with the
    norms after clipping) join it, so a lone huge update cannot set its own
    bound. A lone update with no history yet (a model's first round with one
    trainer) is measured against the norm of the model it started from
    (``model_norm(task)``, over the trainable entries): no honest local
    training moves a model by ``factor`` times its own size (a model
    initialised at zero has no such reference, and its first lone update is
    accepted as it is). Taking the current round first lets honest clients
    correct a perturbed model at full size. Scale-free: only ratios of norms
    matter.

    Rejecting keeps a garbage direction out of the model altogether; clipping
    bounds what a scaled or flipped honest-looking update can do: one update
    moves its model at most ``clip_factor`` reference steps (times its
    coefficient in the aggregate), instead of the ``factor`` times that
    rejection alone allows.
    """
    rejected: list[tuple[str, str]] = []
    for task, us in updates.items():
        norms = [l2_norm(u.delta) for u in us]
        pool = norms if len(norms) >= 2 else norms + history.get(task, [])
        if (factor is None and clip_factor is None) or not pool:
            continue
        if len(pool) == 1 and model_norm is not None:
            ref, what = model_norm(task), "the norm of the model it started from"
        else:
            ref, what = float(np.percentile(pool, 50, method="lower")), "the reference norm"
        _observe("update-norm", task, norms, ref)
        kept, kept_norms = [], []
        for u, norm in zip(us, norms):
            if factor is not None and ref > 0 and not norm <= factor * ref:
                act(
                    events,
                    "rejected",
                    u.cid,
                    task,
                    norm,
                    factor * ref,
                    "Client %s: rejected update for task %r: update norm %.4g exceeds "
                    "%.4g (%g x %s, %.4g)",
                    u.cid,
                    task,
                    norm,
                    factor * ref,
                    factor,
                    what,
                    ref,
                )
                rejected.append((task, u.cid))
                continue
            if clip_factor is not None and ref > 0 and norm > clip_factor * ref:
                bound = clip_factor * ref
                act(
                    events,
                    "clipped",
                    u.cid,
                    task,
                    norm,
                    bound,
                    "Client %s: clipped update for task %r: update norm %.4g exceeds "
                    "%.4g (%g x %s, %.4g); scaled to it",
                    u.cid,
                    task,
                    norm,
                    bound,
                    clip_factor,
                    what,
                    ref,
                )
                u.delta = [d * (bound / norm) for d in u.delta]
                norm = bound
            kept.append(u)
            kept_norms.append(norm)
        updates[task] = kept
        history[task] = (history.get(task, []) + kept_norms)[-NORM_HISTORY:]
    return rejected


def _cosine(a: np.ndarray, b: np.ndarray) -> float | None:
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
    honest client with unusual data. Averaged over rounds, a client that flips
    its updates scores -0.1 to -0.45 on ``digits``; honest clients of some
    federations score as low, round after round (-0.12 over 8 rounds on
    ``digits``, -0.29 over 5 on ``synthetic``; up to 5.5 robust deviations
    below the median). Shrinking a suspect to the reference norm makes a
    flipped x10 update act as a flipped x1 one, and costs an honest suspect
    only the part of its update above the median size. Where the clients do
    not agree (median below :data:`DIRECTION_AGREEMENT`, as on Synthetic(1,1)
    with 5 local epochs) nobody is a suspect: there a flipped update looks like
    an honest one. Runs after the norm bounds, on the clipped updates.

    ``cosines``, when given, receives each update's cosine of this round, its
    client's score and the number of cosines the score averages, keyed by
    ``(task, client id)`` (what :class:`InfluenceBound` reads); they are
    computed (and ``history`` kept) even when ``factor`` is None.
    """
    if factor is None and cosines is None:
        return []
    for task, us in updates.items():
        if len(us) < 2:
            continue
        rows = [[np.asarray(d, dtype=np.float64).ravel() for d in u.delta] for u in us]
        whole = None if len(us) <= DIRECTION_LEAVE_ONE_OUT else _median_rows(rows)
        past = history.setdefault(task, {})
        for i, u in enumerate(us):
            ref = whole if whole is not None else _median_rows(rows[:i] + rows[i + 1 :])
            c = _cosine(np.concatenate(rows[i]), ref)
            if c is not None:
                past[u.cid] = (past.get(u.cid, []) + [c])[-DIRECTION_HISTORY:]
                if cosines is not None:
                    cosines[(task, u.cid)] = (c, float(np.mean(past[u.cid])), len(past[u.cid]))
        if factor is None:
            continue
        scores = {
            cid: float(np.mean(v)) for cid, v in past.items() if len(v) >= DIRECTION_MIN_ROUNDS
        }
        if len(scores) < DIRECTION_MIN_CLIENTS:
            continue
        values = np.array(list(scores.values()))
        m = float(np.median(values))
        s = 1.4826 * float(np.median(np.abs(values - m)))
        _observe("direction", task, [scores[u.cid] for u in us if u.cid in scores], m)
        if m < DIRECTION_AGREEMENT:
            continue
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
    return []


@dataclass(frozen=True)
class InfluenceBound:
    """Which updates the influence bound holds, and at how many times the
    round's reference influence: every update at ``factor``
    (``influence_clip_factor``; None: none), and the updates that point against
    their model's other updates at ``reversed_factor``
    (``reversed_influence_factor``); the lower of the two where both apply.

    ``reversed`` maps ``(task, client id)`` to the update's cosine with the
    coordinate-wise median of the round's other updates, its client's mean
    cosine over its recent rounds of the model, and how many rounds that mean
    covers (:func:`check_directions`' ``cosines``), for the updates whose
    cosine and mean are both negative: reversed this round and on average.
    Requiring both keeps at its weight an honest client that disagrees in one
    round after agreeing before, or disagreed earlier (Synthetic(1,1)'s honest
    clients score about 0 on average, half of them below in a round); a client
    that flips its updates is below 0 in both. The mean includes this round's
    cosine, so on a client's first cosine of a model one negative cosine is
    enough."""

    factor: float | None = None
    reversed_factor: float | None = None
    reversed: Mapping[tuple[str, str], tuple[float, float, int]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        factor: float | None,
        reversed_factor: float | None = None,
        cosines: Mapping[tuple[str, str], tuple[float, float, int]] | None = None,
    ) -> InfluenceBound:
        """The bound of ``Limits`` factors, with the updates of ``cosines``
        (:func:`check_directions`) that are reversed."""
        rev = (
            {k: v for k, v in (cosines or {}).items() if v[0] < 0 and v[1] < 0}
            if reversed_factor is not None
            else {}
        )
        return cls(factor, reversed_factor, rev)

    def factor_for(self, task: str, cid: str) -> float | None:
        """The factor that holds client ``cid``'s update of ``task``, or None."""
        rev = self.reversed_factor if (task, cid) in self.reversed else None
        if rev is None or (self.factor is not None and self.factor <= rev):
            return self.factor
        return rev

    def why(self, task: str, cid: str) -> str:
        """What the log adds where the reversed factor is the one that holds."""
        if self.factor_for(task, cid) == self.factor:
            return ""
        c, mean, n = self.reversed[(task, cid)]
        return (
            f"; it points against the model's other updates (cosine {c:.3f} with their "
            f"median this round, mean {mean:.3f} over its last {n} rounds)"
        )


def _as_bound(factor: float | InfluenceBound | None) -> InfluenceBound:
    return factor if isinstance(factor, InfluenceBound) else InfluenceBound(factor)


def bound_influence(
    updates: dict[str, list[Update]],
    step_weights: Callable[[Sequence[Update]], list[float] | None],
    factor: float | InfluenceBound | None,
    events: DefenceLog | None = None,
) -> dict[str, float]:
    """Scale down every update whose influence on its model's step exceeds
    its factor times the round's reference influence, in place, logging the
    client id, the model and the numbers; nothing is rejected. ``factor``: one
    factor for every update, or an :class:`InfluenceBound` (every update at
    ``influence_clip_factor``, the updates that point against the others at
    ``reversed_influence_factor``). Returns each bounded model's reference
    influence, which :func:`bound_fresh_influence` reads for the fresh updates
    the oracle StaleVR reads.

    A client's influence is ``|c_k| ||G_k||``: its weight in the aggregate
    (``step_weights``, the aggregator's own: ``n_k / sum n`` for FedAvg, ``d /
    (B p)`` for the unbiased and stale rules) times its update's norm, i.e. how
    far its update alone moves the model. The reference is the lower median of
    the positive influences of the model's updates this round (at least two;
    an observed honest influence while fewer than half are hostile). Runs after
    the norm bounds and the direction check, and after a select-after-training
    policy (GVR, StaleVR) has drawn which updates count, so the weights are the
    ones the aggregate applies (``d l / (B p)`` with the drawn ``p``). A model
    whose weights are unknown (``step_weights`` returns None) or not finite,
    or with fewer than two positive influences, is left as it is, logged once
    per round when it has updates to bound.

    Why: the norm clip bounds an update's size, not its weight. A client that
    holds a large share of a round's data (0.4 of a round's examples on
    Synthetic(1,1), seed 5 of ``benchmarks/hostile_clients.py --field``) sends
    an honest update 4x the reference norm; flipped, and clipped to 3x, it
    still outweighs the other clients together, and where the clients disagree
    on a direction nothing tells it from an honest one. Bounding influence
    makes one update move its model at most ``factor`` typical clients' worth.
    The cost: an honest client with much more data than the others (or, under
    the unbiased rule, a rare pick with a large ``d / (B p)``) counts for less
    than its weight when its influence exceeds the bound (the step is then no
    longer unbiased); docs/how-to/defences.md has the measured cost, which is
    why the bound on every update is off unless ``influence_clip_factor`` is
    given. Held only on the updates that point against the others (by default,
    ``reversed_influence_factor`` 4), it leaves alone the large honest updates
    the clients agree with, and holds a reversed one (a sign flip, IPM) however
    the clients disagree otherwise.
    """
    rule = _as_bound(factor)
    refs: dict[str, float] = {}
    if rule.factor is None and rule.reversed_factor is None:
        return refs
    for task, us in updates.items():
        if len(us) < 2:
            continue
        ref = _scale_influences(
            task,
            us,
            step_weights(us),
            rule,
            "influence",
            ("Influence bound", "weight", "weight", "step", "reference influence"),
            events,
        )
        if ref is not None:
            refs[task] = ref
    return refs


def _scale_influences(
    task: str,
    us: list[Update],
    weights: Sequence[float] | None,
    rule: InfluenceBound,
    kind: str,
    words: tuple[str, str, str, str, str],
    events: DefenceLog | None = None,
) -> float | None:
    """The shared step of :func:`bound_influence` and
    :func:`bound_expected_influence`: each update's influence ``|weight| x
    norm``; the model's reference, the lower median of the positive ones; every
    update above its factor (``rule``) times the reference scaled down to it in
    place and logged. Returns the reference (read while the rule is on, so
    that :func:`bound_fresh_influence` can hold the fresh updates too), or None
    where the rule is off or no reference can be read (logged at INFO, with
    why, when an update has a factor).
    ``words``: the bound's name, the weight's name in the warning and in the
    INFO line, the step it moves, and the reference's name."""
    if rule.factor is None and rule.reversed_factor is None:
        return None
    factors = [rule.factor_for(task, u.cid) for u in us]
    name, weight_name, weight_word, step, ref_name = words
    norms = [l2_norm(u.delta) for u in us]
    influence = (
        [abs(w) * n for w, n in zip(weights, norms)]
        if weights is not None and len(weights) == len(us)
        else []
    )
    positive = [x for x in influence if x > 0]
    why = (
        "its aggregator gives no weights"
        if not influence
        else f"a {weight_word} or norm is not finite"
        if not all(math.isfinite(x) for x in influence)
        else "fewer than two updates with a positive influence"
        if len(positive) < 2
        else ""
    )
    if why:
        # a coordinate-wise rule (median, trimmed mean) has no weights to bound: said only
        # when the bound on every update was asked for, not for the default reversed one
        if any(f is not None for f in factors) and (rule.factor is not None or influence):
            log(INFO, "%s: task %r not bounded this round (%s)", name, task, why)
        return None
    ref = float(np.percentile(positive, 50, method="lower"))
    if rule.factor is not None:  # what honest_spread.py reads: every update's ratio
        _observe(kind, task, influence, ref)
    for u, w, norm, x, f in zip(us, weights or [], norms, influence, factors):
        if f is None or not x > f * ref:
            continue
        bound = f * ref
        scale = bound / x
        why = rule.why(task, u.cid)
        act(
            events,
            "reversed" if why else "influence",
            u.cid,
            task,
            x,
            bound,
            "Client %s: clipped update for task %r: its influence on the %s "
            "(%s %.4g x update norm %.4g = %.4g) exceeds %.4g (%g x the round's "
            "%s, %.4g)%s; update norm scaled to %.4g",
            u.cid,
            task,
            step,
            weight_name,
            abs(w),
            norm,
            x,
            bound,
            f,
            ref_name,
            ref,
            why,
            norm * scale,
        )
        u.delta = [d * scale for d in u.delta]
    return ref


def bound_expected_influence(
    updates: dict[str, list[Update]],
    factor: float | InfluenceBound | None,
    events: DefenceLog | None = None,
) -> None:
    """For an aggregator that reads every eligible client's fresh update (the
    oracle StaleVR: every client trains every model each round), scale down in
    place every fresh update whose influence on the *expected* step exceeds
    ``factor`` times the round's reference, logging the client id, the model
    and the numbers; nothing is rejected.

    Over the sampling, the step of Eq. 18 is ``E[Delta] = sum_i d_{i,s} G_i``
    (paper 003), so a client's influence on it is ``d_{i,s} ||G_i||`` whether
    it is sampled or not: its stale term ``d beta h`` (``beta h`` is the
    projection of ``G`` on ``h``) enters every round at its data share ``d``.
    The reference is the lower median of the positive ``d ||G||`` of the
    model's fresh updates this round (at least two). Runs before the policy
    draws which updates count, so the draw, the counted updates, the stored
    ``h`` and ``beta`` all read the bounded update.

    Why: :func:`bound_influence` bounds the weights a counted update carries
    in this round's step, ``d l / (B p)``; with small inclusion probabilities
    those are many times ``d``, so its bound leaves a client with a large data
    share free to move the expected step by several typical clients' worth in
    every round, through its stale term (a sign-flipping client holding 0.2 of
    Synthetic(1,1)'s data did in ``benchmarks/hostile_clients.py --field``).
    Held on every update only when ``influence_clip_factor`` is given (it
    trims honest clients with large data shares too); on the reversed ones
    (``factor`` an :class:`InfluenceBound`) by default."""
    rule = _as_bound(factor)
    for task, us in updates.items():
        if len(us) >= 2:
            _scale_influences(
                task,
                us,
                [u.data_share for u in us],
                rule,
                "expected-influence",
                (
                    "Expected-step influence bound",
                    "data share",
                    "share",
                    "expected step",
                    "reference",
                ),
                events,
            )


def bound_fresh_influence(
    fresh: dict[str, list[Update]],
    counted: dict[str, list[Update]],
    refs: Mapping[str, float],
    factor: float | InfluenceBound | None,
    events: DefenceLog | None = None,
) -> dict[str, dict[str, list[np.ndarray]]]:
    """The fresh updates an aggregator that reads every eligible client's fresh
    update (the oracle StaleVR's Eq. 20 ``beta = <G, h> / ||h||^2``) gets, with
    the influence bound of :func:`bound_influence` applied to them too. A
    pair's stale term ``z = beta h`` is the projection of ``G`` on the stale
    ``h`` and enters the step with the weight ``d_{i,s}`` (Eq. 18), so ``d ||G||``
    bounds its influence: an update that counts this round is read as bounded
    (and, where its ``d`` exceeds its weight ``d l / (B p)``, held to
    ``d ||G|| <= bound`` as well); one that does not count is held to
    ``d ||G|| <= bound``. Each scaling is logged with client and model. Without
    this, a client whose update was bounded when it counted moves its model
    through ``beta`` by its full unbounded norm in every later round. A model
    without a bound this round (:func:`bound_influence` logged why) is read as
    its updates came. ``refs``: each model's reference influence
    (:func:`bound_influence`'s result); ``factor``: its factor or rule, so an
    update is held to its factor times the reference."""
    rule = _as_bound(factor)
    out: dict[str, dict[str, list[np.ndarray]]] = {}
    for task, us in fresh.items():
        kept = {u.cid: u.delta for u in counted.get(task, [])}
        ref = refs.get(task)
        got: dict[str, list[np.ndarray]] = {}
        for u in us:
            delta = kept.get(u.cid, u.delta)
            f = rule.factor_for(task, u.cid)
            if ref is None or f is None:
                got[u.cid] = delta
                continue
            bound = f * ref
            norm = l2_norm(delta)
            x = abs(u.data_share) * norm
            if x > bound:
                scale = bound / x
                why = rule.why(task, u.cid)
                act(
                    events,
                    "reversed" if why else "influence",
                    u.cid,
                    task,
                    x,
                    bound,
                    "Client %s: clipped update for task %r: the fresh update its "
                    "stale update's weight is read from (data share %.4g x update norm "
                    "%.4g = %.4g) exceeds the round's influence bound %.4g%s; update norm "
                    "scaled to %.4g",
                    u.cid,
                    task,
                    abs(u.data_share),
                    norm,
                    x,
                    bound,
                    why,
                    norm * scale,
                )
                delta = [d * scale for d in delta]
            got[u.cid] = delta
        out[task] = got
    return out


def apply_count_cap(
    table: ClientTable, factor: float | None, events: DefenceLog | None = None
) -> None:
    """Bound each client's sample counts at ``factor`` times the task's median
    declared count (:meth:`~mmfl_flwr.core.clients.ClientTable.cap_counts`),
    logging every client whose count is capped."""
    for cid, task, declared, used in table.cap_counts(factor):
        if used < declared:
            act(
                events,
                "count",
                cid,
                task,
                declared,
                used,
                "Client %s: declared %d examples of task %r; %d are used (%g x the median count)",
                cid,
                declared,
                task,
                used,
                factor,
            )


def loss_cap(
    run_state: RunState,
    task: str,
    values: list[float],
    factor: float | None,
    kind: str = "query-loss",
) -> float:
    """The largest loss of ``task`` the server uses: ``factor`` times the task's
    reference loss, the largest 90th percentile (the lower one: an observed
    value) of the reported losses so far (this round's reports plus the
    clients' latest ones, kept in ``run.loss_reference``). Losses fall as
    training goes on, so honest reports stay below it even when most clients
    fit their local data almost perfectly (a median would then be tiny), while
    one client among ten or more cannot raise it on its own. Infinite without a
    factor or a positive reference. ``kind`` (``"query-loss"`` or
    ``"train-loss"``) names the check for :data:`BOUND_OBSERVERS`."""
    if factor is None:
        return math.inf
    pool = values + [c.losses[task] for c in run_state.table.clients() if task in c.losses]
    high = float(np.percentile(pool, 90, method="lower")) if pool else 0.0
    ref = max(high, run_state.loss_reference.get(task, 0.0))
    run_state.loss_reference[task] = ref
    _observe(kind, task, values, ref)
    return factor * ref if ref > 0 else math.inf


def cap_train_losses(run_state: RunState, outcome: TrainOutcome, factor: float | None) -> None:
    """Cap the training losses a policy observes (UCB's index) at ``factor``
    times the task's reference loss, as the loss query's reports are
    (:func:`~.loss_query.loss_cap`), logging the client id. The round's
    ``train_loss`` metric keeps the reported values."""
    for task, reports in outcome.train_losses.items():
        cap = loss_cap(run_state, task, [v for v, _, _ in reports], factor, "train-loss")
        for value, _, cid in reports:
            if value > cap:
                act(
                    run_state.defence,
                    "loss",
                    cid,
                    task,
                    value,
                    cap,
                    "Client %s: training loss %.4g on task %r capped at %.4g "
                    "(%g x the reference loss)",
                    cid,
                    value,
                    task,
                    cap,
                    factor,
                )
                outcome.observed[(cid, task)] = cap


@dataclass
class TrainOutcome:
    """The validated result of one round's train replies, per task."""

    updates: dict[str, list[Update]]
    #: task -> (training loss, examples, client) of every accepted update reporting one
    train_losses: dict[str, list[tuple[float, int, str]]]
    rejected: dict[str, int]
    #: (client, task) -> training loss of every accepted update (for the policy)
    observed: dict[tuple[str, str], float] = field(default_factory=dict)
    #: (client, task) of every assigned part that did not reach the aggregate
    rejected_parts: list[tuple[str, str]] = field(default_factory=list)


def collect_updates(
    run_state: RunState,
    plan: RoundPlan,
    replies: Iterable[Message],
    shares: dict[str, dict[str, float]],
    limits: Limits,
    needs_control: bool,
) -> TrainOutcome:
    """Validate every (client, task) part of every reply on its own; each
    rejection is logged with the client id and the rest becomes updates."""
    expected = plan.expected()
    out = TrainOutcome(
        updates={t: [] for t in plan.tasks},
        train_losses={t: [] for t in plan.tasks},
        rejected={t: 0 for t in plan.tasks},
    )
    split = {t: run_state.split_keys(t) for t in plan.tasks}
    answered: set[str] = set()
    events = run_state.defence

    def failed(cid: str, reply: Message) -> None:
        answered.add(cid)
        log(
            WARNING,
            "Client %s failed to train %s (error %s: %s); its updates are missing "
            "from the aggregate",
            cid,
            sorted(expected[cid]),
            reply.error.code,
            reply.error.reason,
        )
        for t in expected[cid]:
            events.record(
                "missing",
                cid,
                t,
                f"failed to train (error {reply.error.code}: {reply.error.reason})",
            )
            out.rejected[t] += 1
            out.rejected_parts.append((cid, t))

    for cid, reply in client_replies(
        run_state.node_to_cid,
        replies,
        "train",
        expected,
        failed,
        plan.server_round,
        lacking=run_state.lacking,
        shards=run_state.shards,
        shard_asked=set(expected),
    ):
        answered.add(cid)
        asked = expected[cid]
        content = reply.content
        for key in content.array_records:
            task = P.task_of(key, P.ARRAYS_PREFIX)
            if task is None and needs_control:
                task = P.task_of(key, P.CONTROL_PREFIX)
            if task not in asked:
                events.act(
                    "ignored",
                    cid,
                    task or key,
                    math.nan,
                    math.nan,
                    "Client %s: rejected arrays under %r (task not assigned to it this round)",
                    cid,
                    key,
                    level=WARNING,
                )
        info = run_state.table[cid]
        for task, pick in asked.items():
            events.receive(cid, task)
            try:
                update, train_loss = validate_train_part(
                    content,
                    task,
                    pick,
                    info,
                    run_state.weights[task],
                    split[task],
                    shares[task].get(cid, 0.0),
                    limits,
                    needs_control,
                )
            except InvalidReply as err:
                events.act(
                    "rejected",
                    cid,
                    task,
                    math.nan,
                    math.nan,
                    "Client %s: rejected update for task %r: %s",
                    cid,
                    task,
                    err,
                    level=WARNING,
                )
                out.rejected[task] += 1
                out.rejected_parts.append((cid, task))
                continue
            out.updates[task].append(update)
            if train_loss is not None:
                out.train_losses[task].append((train_loss, update.num_examples, cid))
                out.observed[(cid, task)] = train_loss
    for cid, asked in expected.items():
        if cid not in answered:
            log(
                WARNING,
                "Client %s sent no train reply this round (tasks %s); its updates "
                "are missing from the aggregate",
                cid,
                sorted(asked),
            )
            for t in asked:
                events.record("missing", cid, t, "sent no train reply this round")
                out.rejected[t] += 1
                out.rejected_parts.append((cid, t))
    return out
