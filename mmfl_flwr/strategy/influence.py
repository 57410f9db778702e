"""The influence bounds: how far updates may move their model.

An update's influence is its weight in the aggregate times its norm
(:func:`bound_influence`); under an aggregator that reads every client's fresh
update (the oracle StaleVR), also its data share times its norm, on the
expected step (:func:`bound_expected_influence`) and in the stale terms read
from the fresh updates (:func:`bound_fresh_influence`). :class:`InfluenceBound`
says which updates are held and at which factor: every one at
``influence_clip_factor`` (off by default), the reversed ones at
``reversed_influence_factor``; :func:`bound_reversed_pull` holds the reversed
ones of a model together, so that a coalition pulls it back by at most a few
typical clients' push.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO

import numpy as np
from flwr.common.logger import log

from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.strategy.bounds import l2_norm, observe
from mmfl_flwr.strategy.directions import DIRECTION_AGREEMENT, DIRECTION_MIN_CLIENTS
from mmfl_flwr.strategy.events import DefenceLog, act

#: An update is reversed when its cosine with the median of its model's other
#: updates, this round and on average over its client's recent rounds, is below
#: minus this (:func:`is_reversed`).
REVERSED_MIN_COSINE = 0.1


def is_reversed(cosine: tuple[float, float, int]) -> bool:
    """Whether an update of (cosine this round, its client's mean cosine,
    rounds) points against its model's other updates: both cosines below
    ``-REVERSED_MIN_COSINE``. On heterogeneous data (Synthetic(1,1)) honest
    updates lie nearly orthogonal to the others' median, round after round
    (mean cosines of -0.02 to -0.09 in the README's main job), which moves the
    model back by almost nothing; a flipped or IPM update points against the
    others with a good part of its size (-0.2 to -1)."""
    return cosine[0] < -REVERSED_MIN_COSINE and cosine[1] < -REVERSED_MIN_COSINE


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
    covers (:func:`~.directions.check_directions`' ``cosines``), for the updates whose
    cosine and mean are both below ``-REVERSED_MIN_COSINE`` (:func:`is_reversed`):
    reversed this round and on average. Requiring both keeps at its weight an
    honest client that disagrees in one round after agreeing before, or
    disagreed earlier (where honest clients disagree on a direction, their mean
    cosines lie around 0 and many of them fall below it in some round); a
    client that flips its updates is below in both. The mean includes this
    round's cosine, so on a client's first cosine of a model one cosine below
    the threshold is enough. This holds each reversed update alone, wherever
    the clients stand; :func:`bound_reversed_pull` holds them together where
    the clients agree."""

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
        (:func:`~.directions.check_directions`) that are reversed."""
        rev = (
            {k: v for k, v in (cosines or {}).items() if is_reversed(v)}
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
    """``factor`` as an :class:`InfluenceBound` (one factor: every update at it)."""
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
    holds a large share of a round's data carries a large weight in the
    aggregate: its update, flipped and clipped to ``update_clip_factor``
    reference norms, can still outweigh the other clients together (as in
    ``benchmarks/hostile_clients.py --field``), and where the clients disagree
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
        observe(kind, task, influence, ref)
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
    every round, through its stale term (as a sign-flipping client with a
    large data share does in ``benchmarks/hostile_clients.py --field``).
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


#: The reversed updates of a model together pull it back by at most this share
#: of the push of the updates that agree (:func:`bound_reversed_pull`).
REVERSED_PULL_SHARE = 0.5


def bound_reversed_pull(
    updates: dict[str, list[Update]],
    step_weights: Callable[[Sequence[Update]], list[float] | None],
    factor: float | None,
    cosines: Mapping[tuple[str, str], tuple[float, float, int]] | None,
    events: DefenceLog | None = None,
    step: str = "step",
) -> None:
    """Hold, together, the updates of each model that point against its other
    updates (``reversed_influence_factor``): however many clients send them,
    they pull the model back by at most ``factor`` typical clients' push, and by
    at most :data:`REVERSED_PULL_SHARE` of what the agreeing updates push. Each
    update it scales is scaled in place (its direction kept) and logged with
    the client id, the model and the numbers; nothing is rejected.

    ``cosines`` (:func:`~.directions.check_directions`) gives each update's
    cosine ``c`` with the coordinate-wise median of the model's other updates
    of the round and its client's mean cosine over its recent rounds. An
    update is *reversed* when both are below ``-REVERSED_MIN_COSINE``
    (:func:`is_reversed`). Its *pull* is ``|w| ||G|| |c|`` with
    ``w`` its weight in the step (``step_weights``, the aggregator's own; the
    data shares on the oracle StaleVR's expected step): how far it moves the
    model against the direction the others agree on. An update with ``c > 0``
    *pushes* by ``|w| ||G|| c``. With ``P`` the reversed updates' summed pull,
    ``r`` the lower median of the pushes and ``S`` their sum, every reversed
    update is scaled by ``min(factor r, REVERSED_PULL_SHARE S) / P`` where
    ``P`` exceeds that. Only where the model's clients agree on a direction:
    the median of the mean cosines of the round's updates at least
    :data:`~.directions.DIRECTION_AGREEMENT` (near a heterogeneous model's
    optimum honest updates sum to about zero, so each points against the
    others' median and "reversed" means nothing; there
    :class:`InfluenceBound` still holds each reversed update alone), and with
    at least :data:`~.directions.DIRECTION_MIN_CLIENTS` updates this round
    (with fewer, each one's reference, the median of the others, is two or
    three updates: one disagreeing honest client of three would be held). A
    model with no push, or whose aggregator gives no weights (a coordinate-wise
    rule: the median, the trimmed mean), is left as it is.

    Why the sum: a coalition (inner-product manipulation, label flippers, a
    sign flip by several clients) pulls with every member; bounding each
    update alone lets three reversed updates at the bound outweigh nine honest
    ones (as inner-product manipulation by 3 of 12 does in
    ``benchmarks/hostile_clients.py --field``). Why ``|c|``: an update moves
    the model against the others' direction by its size times its cosine, so
    a large update at a small angle past the perpendicular pulls little and a
    flipped or IPM one (cosines down to -1) pulls with its whole size. Runs after the norm bounds
    and the direction check, and after a select-after-training policy (GVR,
    StaleVR) has drawn which updates count, so the weights are the ones the
    aggregate applies.
    """
    if factor is None or not cosines:
        return
    for task, us in updates.items():
        if len(us) < DIRECTION_MIN_CLIENTS:
            continue
        got = [cosines.get((task, u.cid)) for u in us]
        rev = [i for i, c in enumerate(got) if c is not None and is_reversed(c)]
        means = [c[1] for c in got if c is not None]
        if not rev or float(np.median(means)) < DIRECTION_AGREEMENT:
            continue
        weights = step_weights(us)
        if weights is None or len(weights) != len(us):
            continue
        norms = [l2_norm(u.delta) for u in us]
        along = [
            abs(w) * n * c[0] if c is not None else 0.0 for w, n, c in zip(weights, norms, got)
        ]
        if any(x > 0 for x in along) and all(math.isfinite(x) for x in along):
            _hold_pull(task, us, got, rev, along, norms, factor, step, events)


def _hold_pull(
    task: str,
    us: list[Update],
    got: Sequence[tuple[float, float, int] | None],
    rev: list[int],
    along: list[float],
    norms: list[float],
    factor: float,
    step: str,
    events: DefenceLog | None,
) -> None:
    """Scale the reversed updates ``rev`` of one model together where their
    summed pull exceeds what :func:`bound_reversed_pull` allows, logging each."""
    pushes = [x for x in along if x > 0]
    ref = float(np.percentile(pushes, 50, method="lower"))
    allowed = min(factor * ref, REVERSED_PULL_SHARE * sum(pushes))
    pull = -sum(along[i] for i in rev)
    if not pull > allowed:
        return
    scale = allowed / pull
    for i in rev:
        u, c = us[i], got[i]
        assert c is not None
        act(
            events,
            "reversed",
            u.cid,
            task,
            -along[i],
            -along[i] * scale,
            "Client %s: clipped update for task %r: it points against the model's "
            "other updates (cosine %.3f with their median this round, mean %.3f over "
            "its last %d rounds); the %d such updates of this round together pull the "
            "%s back by %.4g (weight x norm x |cosine|), above %.4g (the lower of %g x "
            "the reference push %.4g, the lower median of weight x norm x cosine over "
            "the %d updates that agree, and %g of their sum %.4g); update norm %.4g "
            "scaled to %.4g",
            u.cid,
            task,
            c[0],
            c[1],
            c[2],
            len(rev),
            step,
            pull,
            allowed,
            factor,
            ref,
            len(pushes),
            REVERSED_PULL_SHARE,
            sum(pushes),
            norms[i],
            norms[i] * scale,
        )
        u.delta = [d * scale for d in u.delta]
