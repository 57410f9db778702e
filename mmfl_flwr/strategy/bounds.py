"""The bounds on what clients report, and :class:`Limits`, which holds them.

- Update norms are bounded against the model's reference norm
  (:func:`bound_update_norms`): rejected above ``update_norm_factor`` times
  it, scaled down to ``update_clip_factor`` times it.
- Sample counts are bounded against the task's median count
  (:func:`apply_count_cap`).
- Reported losses (loss queries and the training losses a policy observes)
  are capped against the task's reference loss, the largest 90th percentile
  reported so far (:func:`loss_cap`, :func:`cap_train_losses`).

The direction check is in :mod:`.directions`, the influence bounds in
:mod:`.influence`; :mod:`.validation` checks each reply part and re-exports
them all. Every action of a bound is a defence event (:mod:`.events`):
recorded where it happens (the ``events`` a bound is given, the run's
:class:`~.events.DefenceLog`), with its own line at DEBUG.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.core.clients import ClientTable
from mmfl_flwr.strategy.events import DefenceLog, act
from mmfl_flwr.strategy.state import RunState, TrainOutcome


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


def observe(kind: str, task: str, values: list[float], reference: float) -> None:
    """Hand one bound check's measurements to every :data:`BOUND_OBSERVERS`."""
    for observer in BOUND_OBSERVERS:
        observer(kind, task, list(values), reference)


#: The default ``update_clip_factor``: see :class:`Limits`.
UPDATE_CLIP_FACTOR = 3.0
#: The factor ``influence_clip_factor`` is measured at (docs/how-to/defences.md):
#: the bound is off by default (:func:`~.influence.bound_influence` says why).
INFLUENCE_CLIP_FACTOR = 4.0
#: The default ``reversed_influence_factor``: the influence bound held on updates
#: that point against their model's other updates (:class:`~.influence.InfluenceBound`).
REVERSED_INFLUENCE_FACTOR = 4.0
#: The factor ``collusion_factor`` is measured at (two updates of a model are alike
#: when their cosine distance is under the round's median distance divided by it:
#: :func:`~.collusion.check_collusion`): off by default, as honest clients that
#: share their data send such updates too (docs/explanation/defences.md).
COLLUSION_FACTOR = 4.0
#: The default ``direction_factor``: see :class:`Limits` and
#: :func:`~.directions.check_directions`.
DIRECTION_FACTOR = 3.0


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
        clients agree on a direction (:func:`~.directions.check_directions`; None: no
        direction check).
    influence_clip_factor : float or None
        An update whose influence on its model's step (its weight in the
        aggregate times its norm) exceeds this multiple of the round's
        reference influence (the lower median over the model's updates) is
        scaled down to it (:func:`~.influence.bound_influence`; None, the
        default: no influence bound; :data:`INFLUENCE_CLIP_FACTOR`, 4, is the
        factor docs/how-to/defences.md measures).
        Under an aggregator that reads every client's fresh update (the oracle
        StaleVR) it also bounds each fresh update's influence on the expected
        step, data share times norm (:func:`~.influence.bound_expected_influence`).
    reversed_influence_factor : float or None
        The same bound, held by default (:data:`REVERSED_INFLUENCE_FACTOR`, 4)
        on the updates that point against their model's other updates: whose
        cosine with the coordinate-wise median of the round's other updates is
        below -0.1 this round and on average over the client's recent rounds of
        the model (:func:`~.directions.check_directions` reads the cosines;
        :class:`~.influence.InfluenceBound`); and, where the model's clients
        agree on a direction, on those updates together, so that a coalition
        pulls the model back by at most this many typical clients' push
        (:func:`~.influence.bound_reversed_pull`). An update the clients agree
        with keeps its weight, so honest runs keep the papers' weighting
        wherever clients do not disagree (None: off).
    collusion_factor : float or None
        Updates of a model whose cosine distance (1 - cosine) is under the
        round's median distance divided by this are alike; each group of alike
        updates counts as one client's (each scaled by 1 / the group's size:
        :func:`~.collusion.check_collusion`; None, the default: off;
        :data:`COLLUSION_FACTOR`, 4, is the factor the attack field measures).
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
    collusion_factor: float | None = None

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
        if self.collusion_factor is not None and not self.collusion_factor > 1:
            raise ValueError(
                "collusion_factor must be > 1 (a divisor of the median distance) or None"
            )
        if self.count_cap is not None and not self.count_cap >= 1:
            raise ValueError("count_cap must be >= 1 (a multiple of the median) or None")


#: How many recent accepted update norms per model enter the reference norm.
NORM_HISTORY = 64
#: A round with fewer than this many updates of a model takes the model's
#: recent accepted norms into its reference pool too (see :func:`bound_update_norms`).
#: Chosen on the false-positive and single-attacker benchmarks (paper003 profile,
#: 6 seeds): at 8, MFA-RR's rounds of six updates were pooled too, and a x50 attacker
#: moved the digits model further (the history holds earlier, larger norms); at 4,
#: MFA-Rand's and SCAFFOLD's honest updates were clipped as often as before.
MIN_ROUND_NORMS = 6


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
    observed honest norm while fewer than half of the updates are hostile);
    a round with fewer than :data:`MIN_ROUND_NORMS` updates of the model adds
    the model's last :data:`NORM_HISTORY` accepted norms (``history``, updated
    here with the norms after clipping) to the pool: honest norms on
    unbalanced data spread over a factor of ten or more (a client with a few
    samples, or whose data the model already fits, moves it very little), and
    a small round's lower median is one or two of them; pooled, it is a median
    of dozens, and a lone huge update cannot set its own bound. A lone update with no
    history yet (a model's first round with one trainer) is measured against
    the norm of the model it started from (``model_norm(task)``, over the
    trainable entries): no honest local training moves a model by ``factor``
    times its own size (a model initialised at zero has no such reference,
    and its first lone update is accepted as it is). A round of
    :data:`MIN_ROUND_NORMS` updates or more is measured on its own, so honest
    clients correct a perturbed model at full size. Scale-free: only ratios
    of norms matter.

    Rejecting keeps a garbage direction out of the model altogether; clipping
    bounds what a scaled or flipped honest-looking update can do: one update
    moves its model at most ``clip_factor`` reference steps (times its
    coefficient in the aggregate), instead of the ``factor`` times that
    rejection alone allows.
    """
    rejected: list[tuple[str, str]] = []
    for task, us in updates.items():
        norms = [l2_norm(u.delta) for u in us]
        pool = norms if len(norms) >= MIN_ROUND_NORMS else norms + history.get(task, [])
        if (factor is None and clip_factor is None) or not pool:
            continue
        if len(pool) == 1 and model_norm is not None:
            ref, what = model_norm(task), "the norm of the model it started from"
        else:
            ref, what = float(np.percentile(pool, 50, method="lower")), "the reference norm"
        observe("update-norm", task, norms, ref)
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
    observe(kind, task, values, ref)
    return factor * ref if ref > 0 else math.inf


def cap_train_losses(run_state: RunState, outcome: TrainOutcome, factor: float | None) -> None:
    """Cap the training losses a policy observes (UCB's index) at ``factor``
    times the task's reference loss, as the loss query's reports are
    (:func:`loss_cap`), logging the client id. The round's
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
