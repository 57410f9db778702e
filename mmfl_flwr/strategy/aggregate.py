"""Phase 6 of a round: which updates count (policies that select after
training), the new global model of every task, and the round's metrics rows."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from logging import ERROR
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log

from mmfl_flwr.core.aggregators import Aggregator, Update
from mmfl_flwr.core.policy import Policy
from mmfl_flwr.records import NumpyWeights, arrays_to_numpy
from mmfl_flwr.strategy.state import HookError, RoundPlan, RunState
from mmfl_flwr.strategy.validation import (
    InfluenceBound,
    Limits,
    TrainOutcome,
    bound_expected_influence,
    bound_fresh_influence,
    bound_influence,
    bound_reversed_pull,
    bound_update_norms,
    cap_train_losses,
    check_collusion,
    check_directions,
    collect_updates,
    l2_norm,
)


def average_state(old: list[np.ndarray], updates: Sequence[Update]) -> list[np.ndarray]:
    """Non-trainable model state (batch-norm running statistics, counters) of the
    new global model: the sample-weighted mean of the aggregated clients' values
    (``n_{i,s}`` weights), in float64, cast back to each entry's dtype (integer
    counters rounded to the nearest integer). Unchanged without updates."""
    received = [u for u in updates if u.state is not None]
    if not old or not received:
        return [a.copy() for a in old]
    total = float(sum(u.num_examples for u in received))
    out = []
    for j, a in enumerate(old):
        mean = np.zeros(a.shape, dtype=np.float64)
        for u in received:
            assert u.state is not None
            mean += (u.num_examples / total) * np.asarray(u.state[j], dtype=np.float64)
        if a.dtype.kind in "iub":
            mean = np.rint(mean)
        out.append(mean.astype(a.dtype).reshape(a.shape))
    return out


def _data_shares(us: Sequence[Update]) -> list[float]:
    """The weights of the oracle StaleVR's expected step: each update's data share."""
    return [u.data_share for u in us]


def aggregate_train_replies(
    run_state: RunState,
    policy: Policy,
    aggregator: Aggregator,
    plan: RoundPlan,
    replies: Iterable[Message],
    limits: Limits,
) -> tuple[dict[str, dict[str, Any]], dict[str, NumpyWeights]]:
    """After the train round trip: validate the replies, let the policy observe
    the training losses (and select, GVR-style), and aggregate every model;
    returns the metrics row of each task and its new global weights (installed
    by :func:`install_models`; the rejected (client, task) parts go to
    ``run_state.rejected_parts``)."""
    shares = {t: run_state.table.data_share(t) for t in plan.tasks}
    outcome = collect_updates(run_state, plan, replies, shares, limits, aggregator.needs_control)
    run_state.rejected_parts = outcome.rejected_parts

    def model_norm(task: str) -> float:
        return l2_norm(run_state.weights[task][k] for k in run_state.split_keys(task)[0])

    rejected = check_collusion(outcome.updates, limits.collusion_factor, run_state.defence)
    rejected += bound_update_norms(
        outcome.updates,
        run_state.norm_history,
        limits.update_norm_factor,
        model_norm,
        limits.update_clip_factor,
        run_state.defence,
    )
    # each update's cosine with the others', for the bound on reversed updates
    cosines: dict[tuple[str, str], tuple[float, float, int]] | None = (
        {} if limits.reversed_influence_factor is not None else None
    )
    check_directions(
        outcome.updates,
        run_state.direction_history,
        limits.direction_factor,
        cosines,
        run_state.defence,
    )
    for task, cid in rejected:
        outcome.rejected[task] += 1
        outcome.rejected_parts.append((cid, task))
        outcome.observed.pop((cid, task), None)
        outcome.train_losses[task] = [r for r in outcome.train_losses[task] if r[2] != cid]
    if policy.observes_losses:
        cap_train_losses(run_state, outcome, limits.loss_cap)
    policy.observe(plan.server_round, outcome.observed, plan.picks)
    rule = InfluenceBound.of(
        limits.influence_clip_factor, limits.reversed_influence_factor, cosines
    )
    together = limits.reversed_influence_factor
    if aggregator.needs_fresh:  # every client trained: bound the expected step too
        bound_reversed_pull(
            outcome.updates, _data_shares, together, cosines, run_state.defence, "expected step"
        )
        bound_expected_influence(outcome.updates, rule, run_state.defence)
    updates = outcome.updates
    if policy.selects_after_training:
        updates = select_after_training(run_state, policy, aggregator, plan.server_round, updates)
    # after any selection: the weights are the ones the aggregate applies
    bound_reversed_pull(updates, aggregator.step_weights, together, cosines, run_state.defence)
    refs = bound_influence(updates, aggregator.step_weights, rule, run_state.defence)
    fresh = (
        bound_fresh_influence(outcome.updates, updates, refs, rule, run_state.defence)
        if aggregator.needs_fresh
        else None
    )
    return aggregate_round(run_state, aggregator, plan, outcome, updates, shares, fresh)


def select_after_training(
    run_state: RunState,
    policy: Policy,
    aggregator: Aggregator,
    server_round: int,
    updates: dict[str, list[Update]],
) -> dict[str, list[Update]]:
    """GVR-style policies: every pair trained; the policy draws which updates
    count, on each update's norm ``||G||``, with the ``stale-residual`` signal
    on ``||G - beta h||`` (the pairing was checked at construction), or with the
    ``loss`` signal on the losses the policy reads from the client table (each
    trained pair is marked with 0.0: no norm is computed)."""
    kind = policy.selection_signal

    def value(task: str, u: Update) -> float:
        if kind == "loss":
            return 0.0
        if kind == "stale-residual":
            return aggregator.residual_norm(task, u.cid, u.delta)
        return l2_norm(u.delta)

    signal = {(u.cid, task): value(task, u) for task, us in updates.items() for u in us}
    chosen = {
        (p.cid, p.task): p
        for p in policy.select(
            run_state.table, run_state.tasks, signal, server_round, run_state.rng
        )
    }
    return {
        task: [
            dataclasses.replace(
                u, prob=chosen[(u.cid, task)].prob, count=chosen[(u.cid, task)].count
            )
            for u in us
            if (u.cid, task) in chosen
        ]
        for task, us in updates.items()
    }


def aggregate_round(
    run_state: RunState,
    aggregator: Aggregator,
    plan: RoundPlan,
    outcome: TrainOutcome,
    updates: dict[str, list[Update]],
    shares: dict[str, dict[str, float]],
    fresh: Mapping[str, Mapping[str, list[np.ndarray]]] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, NumpyWeights]]:
    """Aggregate every active model: its metrics row of the round and its new
    global weights (not installed: :func:`install_models` does that).

    ``updates`` are the updates to aggregate (after any selection); ``fresh``
    (per task, client id -> delta), for an aggregator that reads every fresh
    update, overrides the validated ones (:func:`bound_fresh_influence`); the
    trainable entries go through the aggregator, the state entries are
    averaged (:func:`average_state`). A non-finite result leaves the model
    unchanged (logged).

    Per task the row holds ``coef_sum``
    (:meth:`Aggregator.coefficient_sum`: the sum of the coefficients applied to
    the round's aggregated updates, paper 003's ``||H_{tau,s}||_1 = sum d/(B p)``
    for the unbiased rules; computed as the aggregator applied them, also in a
    round whose non-finite result was discarded)."""
    rows: dict[str, dict[str, Any]] = {}
    models: dict[str, NumpyWeights] = {}
    for task in plan.tasks:
        old = run_state.weights[task]
        train_keys, state_keys = run_state.split_keys(task)
        new_train = aggregator.aggregate(
            task,
            [old[k] for k in train_keys],
            updates[task],
            plan.server_round,
            shares=shares[task],
            fresh=(
                (
                    fresh[task]
                    if fresh is not None and task in fresh
                    else {u.cid: u.delta for u in outcome.updates[task]}
                )
                if aggregator.needs_fresh
                else None
            ),
        )
        coef_sum = aggregator.coefficient_sum(task, updates[task], shares=shares[task])
        new_state = average_state([old[k] for k in state_keys], updates[task])
        if not all(np.isfinite(a).all() for a in new_train + new_state if a.dtype.kind in "fc"):
            log(
                ERROR,
                "Task %r: aggregation produced NaN/inf (overflow); the global model "
                "is left unchanged this round",
                task,
            )
            new_train = [old[k] for k in train_keys]
            new_state = [old[k] for k in state_keys]
        new_values = dict(zip(train_keys + state_keys, new_train + new_state))
        models[task] = {k: new_values[k] for k in old}
        tl = outcome.train_losses[task]
        rows[task] = {
            "uploads": len(updates[task]),
            "assigned": sum(1 for p in plan.picks if p.task == task),
            "rejected": outcome.rejected[task],
            "train_loss": (
                float(sum(v * n for v, n, _ in tl) / sum(n for _, n, _ in tl)) if tl else math.nan
            ),
            "step_l1": math.nan,  # set when the model is installed
            "coef_sum": coef_sum,
        }
    return rows, models


def checked_models(
    run_state: RunState,
    models: object,
    hook: str,
    produced: Mapping[str, tuple[ArrayRecord, NumpyWeights]] | None = None,
) -> dict[str, NumpyWeights]:
    """The new global models ``hook`` returned (a RecordDict: task -> ArrayRecord),
    as numpy weights, after checking that each is an active model with the
    keys, shapes and dtypes of the current one and finite values; any problem
    is one :class:`HookError` naming ``hook``. ``produced`` holds the records
    the base implementation built with their numpy weights: a record returned
    unchanged (the same Array objects) is used without decoding."""
    if models is None:
        return {}
    if not isinstance(models, RecordDict):
        raise HookError(
            f"{hook} returned {type(models).__name__} as the models: expected a "
            "RecordDict of one ArrayRecord per model (or None)"
        )
    active = set(run_state.tasks)
    out: dict[str, NumpyWeights] = {}
    for task, rec in models.items():
        if task not in active or not isinstance(rec, ArrayRecord):
            raise HookError(
                f"{hook} returned {type(rec).__name__} {task!r}: expected one "
                f"ArrayRecord per active model {sorted(active)}"
            )
        made = (produced or {}).get(task)
        if (
            made is not None
            and list(made[0].keys()) == list(rec.keys())
            and all(a is b for a, b in zip(made[0].values(), rec.values()))
        ):
            out[task] = made[1]
            continue
        new = arrays_to_numpy(rec)
        old = run_state.weights[task]
        if list(new) != list(old):
            raise HookError(
                f"{hook} returned model {task!r} with keys {list(new)[:4]}...: "
                f"expected the model's keys {list(old)[:4]}..."
            )
        for k, v in new.items():
            if v.shape != old[k].shape or v.dtype != old[k].dtype:
                raise HookError(
                    f"{hook} returned {task!r}[{k!r}] of shape {v.shape} "
                    f"{v.dtype}: expected {old[k].shape} {old[k].dtype}"
                )
            if v.dtype.kind in "fc" and not np.isfinite(v).all():
                raise HookError(f"{hook} returned {task!r}[{k!r}] with NaN or inf")
        out[task] = new
    return out


def install_models(
    run_state: RunState, models: Mapping[str, NumpyWeights], rows: dict[str, dict[str, Any]]
) -> None:
    """Make ``models`` (task -> weights, checked by the caller) the global models
    and set each task's ``step_l1 = ||w_old - w_new||_1`` over its trainable
    entries (the size of the weight change; 0 for a task left unchanged)."""
    for task, row in rows.items():
        new = models.get(task)
        if new is None:
            row["step_l1"] = 0.0
            continue
        old = run_state.weights[task]
        train_keys = run_state.split_keys(task)[0]
        row["step_l1"] = float(
            sum(np.abs(new[k].astype(np.float64) - old[k]).sum() for k in train_keys)
        )
        run_state.set_weights(task, new)


def train_metrics(rows: dict[str, dict[str, Any]]) -> MetricRecord:
    """``<task>.uploads`` and ``<task>.train-loss`` of a round, for Flower's logs."""
    metrics = MetricRecord()
    for task, row in rows.items():
        metrics[f"{task}.uploads"] = row["uploads"]
        if not math.isnan(row["train_loss"]):
            metrics[f"{task}.train-loss"] = row["train_loss"]
    return metrics
