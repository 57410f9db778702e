"""Aggregators: turn one model's accepted client updates into new global weights.

Framework-free (numpy only). An update is ``G_{i,s} = w_global - w_local`` (not
divided by the learning rate); the global step size is 1, as in paper 003.
Arithmetic is done in float64 and cast back to each array's dtype.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mmfl_flwr.core.aggregator_card import AggregatorCard
from mmfl_flwr.core.component import Component

Weights = list[np.ndarray]


@dataclass
class Update:
    """One client's update for one model, with what the aggregators need.

    Parameters
    ----------
    cid : str
        Stable client id.
    delta : list[np.ndarray]
        ``G_{i,s} = w_global - w_local``, one array per model tensor.
    num_examples : int
        ``n_{i,s}``, the client's training examples for this task.
    data_share : float
        ``d_{i,s}``: ``n_{i,s}`` over the total of all eligible clients.
    processors : int
        ``B_i``.
    prob : float
        ``p_{s|(i,b)}``, probability that one processor of the client trains the
        task this round.
    count : int
        Processors of the client that drew this task (paper 003, Remark 1).
    control : list[np.ndarray], optional
        The client's new SCAFFOLD control variate ``c_{i,s}``.
    state : list[np.ndarray], optional
        The client's values of the model's non-trainable entries (batch-norm
        running statistics, counters), which are not part of ``G``; the
        strategy averages them (aggregators never see them).
    """

    cid: str
    delta: Weights
    num_examples: int
    data_share: float
    processors: int = 1
    prob: float = 1.0
    count: int = 1
    control: Weights | None = None
    state: Weights | None = None


def apply_step(weights: Weights, deltas: Sequence[Weights], coeffs: Sequence[float]) -> Weights:
    """Return ``w - sum_k coeffs[k] * deltas[k]`` computed in float64."""
    if len(deltas) != len(coeffs):
        raise ValueError(f"{len(deltas)} deltas but {len(coeffs)} coefficients")
    for k, d in enumerate(deltas):
        if len(d) != len(weights) or any(a.shape != w.shape for a, w in zip(d, weights)):
            raise ValueError(f"delta {k} does not match the shapes of the weights")
    out = []
    for j, w in enumerate(weights):
        step = np.zeros(w.shape, dtype=np.float64)
        for d, c in zip(deltas, coeffs):
            step += c * d[j].astype(np.float64, copy=False)
        with np.errstate(over="ignore"):  # the strategy detects a non-finite result
            out.append((w.astype(np.float64) - step).astype(w.dtype, copy=False))
    return out


class Aggregator(Component, ABC):
    """Base class: new global weights of one model from its updates.

    This is the whole contract with :class:`~mmfl_flwr.strategy.MultiModelStrategy`:
    :meth:`aggregate` every round for every model, plus the capabilities below,
    each with a default that suits a rule that is a weighted sum of the round's
    fresh updates (FedAvg). The strategy checks the pairing with the policy in
    its constructor.
    """

    name: ClassVar[str] = "aggregator"
    #: True when the rule divides by the picks' inclusion probabilities
    #: (``d/(B p)``): it is then unbiased only with a policy whose picks carry
    #: true inclusion probabilities (:attr:`Policy.inclusion_probabilities`).
    needs_inclusion_probabilities: ClassVar[bool] = False
    #: True when :meth:`aggregate` needs ``fresh``, every eligible client's fresh
    #: update of the round (MMFL-StaleVR's optimal beta): the policy must train
    #: every pair (:attr:`Policy.trains_every_pair`).
    needs_fresh: ClassVar[bool] = False
    #: True for SCAFFOLD: train messages carry :meth:`server_control` and replies
    #: a client control variate (``Update.control``).
    needs_control: ClassVar[bool] = False
    #: True when :meth:`residual_norm` is available (the ``stale-residual``
    #: selection signal of :class:`~mmfl_flwr.core.stalevr.StaleVRSampling`).
    has_residual: ClassVar[bool] = False
    #: What the aggregator keeps per (client, model) between rounds, for logs:
    #: ``""`` (nothing), ``"stale updates"`` or ``"control variates"``.
    keeps_per_client: ClassVar[str] = ""

    def server_control(self, task: str, weights: Weights) -> Weights:
        """SCAFFOLD's server control variate ``c_s`` of ``task`` (shaped like
        ``weights``), sent with every train message when :attr:`needs_control`."""
        raise NotImplementedError(f"{type(self).__name__} has no control variates")

    def residual_norm(self, task: str, cid: str, fresh: Sequence[np.ndarray]) -> float:
        """``||G - beta h||`` of a pair's fresh update against its stale one, when
        :attr:`has_residual`."""
        raise NotImplementedError(f"{type(self).__name__} keeps no stale updates")

    @abstractmethod
    def coefficients(self, updates: Sequence[Update]) -> list[float]:
        """Weight of each update in the global step ``sum_k c_k G_k``."""

    def step_weights(self, updates: Sequence[Update]) -> list[float] | None:
        """Each fresh update's weight in this round's step of its model, for the
        influence bound (:func:`~mmfl_flwr.strategy.validation.bound_influence`):
        :meth:`coefficients` for a weighted sum; None where the rule is no
        weighted sum of the fresh updates (a coordinate-wise statistic) or its
        coefficients cannot be formed (the unbiased rule with a probability that
        is not positive)."""
        try:
            return [float(c) for c in self.coefficients(updates)]
        except (NotImplementedError, ValueError, ZeroDivisionError):
            return None

    def coefficient_sum(
        self,
        task: str,
        updates: Sequence[Update],
        *,
        shares: Mapping[str, float] | None = None,
    ) -> float:
        """The ``coef_sum`` metric of a round: the sum of the coefficients that
        :meth:`aggregate` applied to the round's fresh (aggregated) updates
        ``updates`` of ``task``.

        For the unbiased rule of paper 003 (Eq. 3) this is ``||H_{tau,s}||_1 =
        sum_{(i,b) in A_s} d_{i,s} / (B_i p_{s|(i,b)})`` (a client whose ``l``
        processors drew the task counts ``l`` times), whose expectation over
        the sampling is 1 (Eq. 16, Fig. 2); for FedAvg and the plain mean it is
        1 by construction. 0.0 without updates (no step). The default is
        ``sum(coefficients(updates))``, NaN when :meth:`coefficients` raises
        NotImplementedError (a rule that is not a weighted sum of the updates,
        e.g. the coordinate-wise median); rules with their own
        :meth:`aggregate` override it (the stale-update rules: the coefficients
        of the fresh updates ``G``, not of the stale ones)."""
        if not updates:
            return 0.0
        try:
            return float(math.fsum(self.coefficients(updates)))
        except NotImplementedError:
            return math.nan

    def aggregate(
        self,
        task: str,
        weights: Weights,
        updates: Sequence[Update],
        server_round: int,
        *,
        shares: Mapping[str, float] | None = None,
        fresh: Mapping[str, Weights] | None = None,
    ) -> Weights:
        """Return the new global weights (unchanged when there is no update).

        Parameters
        ----------
        task : str
            The model.
        weights : list of arrays
            Its current global weights.
        updates : sequence of Update
            The accepted (sampled) updates of this round.
        server_round : int
            The round.
        shares : mapping, optional
            ``d_{i,s}`` of every eligible online client (stale-update rules sum
            over all of them, not only the sampled ones).
        fresh : mapping, optional
            Every eligible client's fresh update this round, when all clients
            trained (MMFL-StaleVR's optimal ``beta`` needs it).
        """
        if not updates:
            return [w.copy() for w in weights]
        return apply_step(weights, [u.delta for u in updates], self.coefficients(updates))


class FedAvgAggregator(Aggregator):
    """FedAvg per model over the clients that trained it, weights ``n_{i,s}``.

    ``w <- w - sum_i n_i G_i / sum_i n_i`` over the received updates: the
    data-weighted mean of the returned local models. Used by MFA-Rand, MFA-RR,
    Multi-FedAvg and full participation.
    """

    name = "fedavg"

    def coefficients(self, updates: Sequence[Update]) -> list[float]:
        total = float(sum(u.num_examples for u in updates))
        return [u.num_examples / total for u in updates]


class MeanAggregator(Aggregator):
    """Plain mean of the received local models (every update weight ``1/K``), as
    Algorithm 1 of the MMFL-Group paper aggregates."""

    name = "mean"

    def coefficients(self, updates: Sequence[Update]) -> list[float]:
        return [1.0 / len(updates)] * len(updates)


class UnbiasedAggregator(Aggregator):
    """Paper 003, Eq. 3: ``w <- w - sum d_{i,s} * l / (B_i p_{s|(i,b)}) * G_{i,s}``.

    With the true inclusion probabilities its expectation over the sampling equals
    the full-participation update ``sum_i d_{i,s} G_{i,s}``.
    """

    name = "unbiased"
    needs_inclusion_probabilities = True

    def coefficients(self, updates: Sequence[Update]) -> list[float]:
        coeffs = []
        for u in updates:
            if not u.prob > 0 or u.processors < 1:
                raise ValueError(
                    f"client {u.cid}: the unbiased rule needs prob > 0 and "
                    f"processors >= 1, got prob={u.prob}, processors={u.processors}"
                )
            coeffs.append(u.data_share * u.count / (u.processors * u.prob))
        return coeffs


AGGREGATOR_CARDS = (
    AggregatorCard(
        "fedavg", FedAvgAggregator, "the data-weighted mean of the returned models", private=True
    ),
    AggregatorCard(
        "unbiased",
        UnbiasedAggregator,
        "paper 003's unbiased rule, each update weighted d l / (B p) (Eq. 3)",
        private=True,
    ),
    AggregatorCard("mean", MeanAggregator, "the plain mean of the returned models", private=True),
)
