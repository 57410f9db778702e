"""Evaluation: server-side per model (``evaluate_fn``) and, on a fraction of the
clients, client-side on their local test data (``evaluate`` messages)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, MetricRecord
from flwr.common.logger import log

from mmfl_flwr import protocol as P
from mmfl_flwr.core.clients import MAX_NUM_EXAMPLES
from mmfl_flwr.records import InvalidReply, check_count, check_loss
from mmfl_flwr.strategy.replies import client_replies
from mmfl_flwr.strategy.result import EvaluateFn, MultiModelResult
from mmfl_flwr.strategy.state import HookError, RunState


def evaluation_messages(
    run_state: RunState, server_round: int, config: ConfigRecord, fraction: float
) -> list[Message]:
    """``evaluate`` messages to a ``fraction`` of the online clients, each with
    every active model it holds."""
    if fraction <= 0:
        return []
    ids = run_state.table.ids()
    k = max(1, int(round(fraction * len(ids)))) if ids else 0
    chosen = sorted(run_state.eval_rng.choice(len(ids), size=k, replace=False)) if k else []
    active = set(run_state.tasks)
    parts = []
    for j in chosen:
        cid = ids[int(j)]
        tasks, content = run_state.models_for(cid, active)
        if not tasks:
            continue
        cfg = ConfigRecord(dict(config))
        cfg[P.CFG_ROUND] = server_round
        cfg[P.CFG_TASKS] = tasks
        content[P.CONFIG_KEY] = cfg
        parts.append((cid, content))
    return run_state.messages(parts, MessageType.EVALUATE, server_round)


def client_metrics(
    run_state: RunState,
    replies: Iterable[Message],
    max_loss: float,
    server_round: int | None = None,
) -> MetricRecord | None:
    """Example-weighted mean of the clients' loss and accuracy, per task
    (``<task>.loss``, ``<task>.accuracy``); None without a usable reply."""
    sums: dict[str, list[float]] = {}
    active = set(run_state.tasks)
    for cid, reply in client_replies(
        run_state.node_to_cid,
        replies,
        "evaluation",
        server_round=server_round,
        lacking=run_state.lacking,
        shards=run_state.shards,
        shard_asked=run_state.addressed.get(MessageType.EVALUATE),
    ):
        sent = [t for t in run_state.table[cid].tasks if t in active]
        for key in reply.content.metric_records:
            if P.task_of(key, P.METRICS_PREFIX) not in sent:
                log(
                    WARNING,
                    "Client %s: rejected evaluation record %r (model not sent to it)",
                    cid,
                    key,
                )
        for task in sent:
            m = reply.content.metric_records.get(P.metrics_key(task))
            if m is None:
                continue
            try:
                n = check_count(m.get(P.NUM_EXAMPLES), P.NUM_EXAMPLES, MAX_NUM_EXAMPLES)
                loss = check_loss(m.get(P.LOSS), P.LOSS, max_loss)
                acc = check_loss(m.get(P.ACCURACY), P.ACCURACY, 1.0)
            except InvalidReply as err:
                log(WARNING, "Client %s: rejected evaluation of %r: %s", cid, task, err)
                continue
            s = sums.setdefault(task, [0.0, 0.0, 0.0])
            s[0] += n * loss
            s[1] += n * acc
            s[2] += n
    if not sums:
        return None
    out = MetricRecord()
    for task, (l_sum, a_sum, total) in sums.items():
        out[f"{task}.loss"] = l_sum / total
        out[f"{task}.accuracy"] = a_sum / total
    return out


def server_eval(
    evaluate_fn: EvaluateFn | None,
    run_state: RunState,
    rnd: int,
    task: str,
    result: MultiModelResult,
) -> dict[str, float]:
    """``accuracy`` and ``loss`` of ``task``'s global model from ``evaluate_fn``
    (NaN without one); the full metrics go to ``result``."""
    if evaluate_fn is None:
        return {"accuracy": math.nan, "loss": math.nan}
    res = evaluate_fn(rnd, task, run_state.arrays[task])
    if res is None:
        return {"accuracy": math.nan, "loss": math.nan}
    if isinstance(res, MetricRecord):
        rec = res
    else:
        problem = "" if isinstance(res, Mapping) else "not a mapping"
        if not problem:
            try:
                rec = MetricRecord(dict(res))
            except (TypeError, ValueError) as err:
                problem = str(err).splitlines()[0] if str(err) else type(err).__name__
        if problem:
            raise HookError(
                f"evaluate_fn (round {rnd}, model {task!r}) returned {type(res).__name__} "
                f"{res!r} ({problem}): expected a MetricRecord, a mapping of metric name to "
                "number (accuracy, loss) or None"
            )
    result.evaluate_metrics_serverapp.setdefault(rnd, {})[task] = rec
    return {
        "accuracy": float(rec.get("accuracy", math.nan)),  # type: ignore[arg-type]
        "loss": float(rec.get("loss", math.nan)),  # type: ignore[arg-type]
    }


def round_rows(
    run_state: RunState,
    server_round: int,
    rows: dict[str, dict[str, Any]],
    evaluated: bool,
    evaluate_fn: EvaluateFn | None,
    client_eval: MetricRecord | None,
    result: MultiModelResult,
    seconds: float,
) -> list[dict[str, Any]]:
    """The history rows of a round: the training rows of every active task with
    ``round_step_l1`` (their summed ``step_l1``: the total size of the weight
    changes, not paper 003's ``||H||_1``), ``coef_sum`` last among the training
    columns (the sum of the aggregation coefficients, paper 003's
    ``||H_{tau,s}||_1``), and the evaluations."""
    round_l1 = sum(r["step_l1"] for r in rows.values())
    out = []
    for task in run_state.tasks:
        train = dict(rows[task])
        coef_sum = train.pop("coef_sum", math.nan)
        row = {
            "round": server_round,
            "task": task,
            **train,
            "round_step_l1": round_l1,
            "coef_sum": coef_sum,
        }
        row.update(
            server_eval(evaluate_fn, run_state, server_round, task, result)
            if evaluated
            else {"accuracy": math.nan, "loss": math.nan}
        )
        if client_eval is not None:
            row["client_accuracy"] = client_eval.get(f"{task}.accuracy", math.nan)
            row["client_loss"] = client_eval.get(f"{task}.loss", math.nan)
        row["seconds"] = seconds
        out.append(row)
        log(INFO, "  %-12s %s uploads %d", task, _evaluation_text(row), row["uploads"])
    return out


def _evaluation_text(row: dict[str, Any]) -> str:
    """The evaluation part of a round's log line: the server-side accuracy and
    loss, else the clients' (``client acc``), else ``not evaluated``."""
    if not math.isnan(row["accuracy"]):
        return f"acc {row['accuracy']:.4f} loss {row['loss']:.4f}"
    client = row.get("client_accuracy", math.nan)
    if not math.isnan(client):
        return f"client acc {client:.4f} loss {row.get('client_loss', math.nan):.4f}"
    return "not evaluated"


def initial_rows(
    run_state: RunState, evaluate_fn: EvaluateFn | None, result: MultiModelResult
) -> list[dict[str, Any]]:
    """Round 0 of the history: the evaluation of the initial weights."""
    return [
        {
            "round": 0,
            "task": t,
            "uploads": 0,
            "assigned": 0,
            "rejected": 0,
            "train_loss": math.nan,
            "step_l1": 0.0,
            **server_eval(evaluate_fn, run_state, 0, t, result),
        }
        for t in run_state.tasks
    ]
