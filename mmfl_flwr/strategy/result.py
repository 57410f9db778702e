"""What a run returns, and the callback types of :class:`MultiModelStrategy`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, MetricRecord

from mmfl_flwr.strategy.events import DefenceEvent

#: Server-side evaluation: ``(server_round, task, arrays) -> metrics or None``.
EvaluateFn = Callable[[int, str, ArrayRecord], MetricRecord | Mapping[str, float] | None]
#: Called after every round with that round's history rows.
RoundCallback = Callable[[int, list[dict[str, Any]]], None]


@dataclass
class MultiModelResult:
    """What :meth:`MultiModelStrategy.start` returns.

    Attributes
    ----------
    arrays : dict[str, ArrayRecord]
        Final global weights, one ArrayRecord per task.
    history : list[dict]
        One row per (round, task): ``round``, ``task``, ``accuracy``, ``loss``
        (server-side evaluation, NaN without ``evaluate_fn``), ``uploads``
        (accepted updates), ``assigned`` (clients assigned), ``rejected``,
        ``train_loss``, ``step_l1`` (``||w_old - w_new||_1`` over the trainable
        entries: the size of the model's weight change), ``round_step_l1``
        (the sum of ``step_l1`` over the round's tasks; a weight-change size,
        not paper 003's ``||H||_1``), ``coef_sum`` (the sum of the coefficients
        the aggregator applied to the round's aggregated updates of the task:
        paper 003's ``||H_{tau,s}||_1 = sum_{(i,b) in A_s} d_{i,s} / (B_i
        p_{s|(i,b)})`` for the unbiased rules, expectation 1, and the same sum
        over the fresh updates for FedVARP, FedStale, StaleVR and StaleVRE
        (their stale terms not counted); 1 for FedAvg and the plain mean; the
        trained clients' ``d_{i,s}`` for MIFA; NaN for the median and trimmed
        mean; 0 without updates), and with
        client-side evaluation ``client_accuracy`` and ``client_loss``.
        Round 0 holds the evaluation of the initial weights (``uploads``,
        ``assigned``, ``rejected`` and ``step_l1`` 0; no ``round_step_l1`` or
        ``coef_sum``).
    assignments : dict[int, list[tuple[str, str, int]]]
        Per round, the ``(client id, task, count)`` picks of the policy.
    rejections : dict[int, list[tuple[str, str]]]
        Per round, the ``(client id, task)`` parts that were assigned but did
        not reach the aggregate (rejected by a check, failed, or missing).
    events : list[DefenceEvent]
        Every action of the server's bounds, in order (``events.csv``;
        :mod:`mmfl_flwr.strategy.events`).
    received : dict[str, dict[str, int]]
        Model -> client id -> the updates received from it (assigned parts of
        train replies that arrived, before any check): what ``summary.json``'s
        ``defence_events`` fractions divide by.
    privacy : dict[str, dict[str, float]]
        With a differential-privacy wrapper (:mod:`mmfl_flwr.privacy`): per
        model, the privacy spent so far (``epsilon`` at ``delta``, ``releases``,
        ``noise_multiplier``, ``clipping_norm``), updated every round.
    """

    arrays: dict[str, ArrayRecord] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    assignments: dict[int, list[tuple[str, str, int]]] = field(default_factory=dict)
    rejections: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    train_metrics_clientapp: dict[int, dict[str, MetricRecord]] = field(default_factory=dict)
    evaluate_metrics_clientapp: dict[int, dict[str, MetricRecord]] = field(default_factory=dict)
    evaluate_metrics_serverapp: dict[int, dict[str, MetricRecord]] = field(default_factory=dict)
    privacy: dict[str, dict[str, float]] = field(default_factory=dict)
    events: list[DefenceEvent] = field(default_factory=list)
    received: dict[str, dict[str, int]] = field(default_factory=dict)

    def final(self) -> dict[str, dict[str, Any]]:
        """The last history row of each task."""
        out: dict[str, dict[str, Any]] = {}
        for row in self.history:
            out[row["task"]] = row
        return out
