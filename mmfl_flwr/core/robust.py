"""Robust aggregators, per model: coordinate-wise median and trimmed mean, and
centered clipping (with FedAvg's or the unbiased rule's weights).

Framework-free (numpy only). Both are the coordinate-wise statistics of Yin et
al. 2018 ("Byzantine-Robust Distributed Learning: Towards Optimal Statistical
Rates", ICML), as Flower's ``FedMedian`` and ``FedTrimmedAvg`` apply them to one
model; here they apply to each model of a multi-model run, over the updates of
that model's clients only.

Both are translation-equivariant, so taking the statistic of the updates
``G_k = w - w_k`` and stepping, ``w - stat_k(G_k)``, equals taking the statistic
of the returned local models, ``stat_k(w_k)``. Both are unweighted (they ignore
``num_examples``, like Flower's strategies), **not unbiased** (with
heterogeneous data they converge to a different point than FedAvg) and not part
of the MMFL papers: an option for federations where some clients may be hostile.
They cover the trainable entries only; the strategy still averages the
non-trainable state (batch-norm statistics, :attr:`Update.state`) by samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from mmfl_flwr.core.aggregator_card import AggregatorCard
from mmfl_flwr.core.aggregators import (
    Aggregator,
    UnbiasedAggregator,
    Update,
    Weights,
    apply_step,
)


def _check_shapes(weights: Weights, updates: Sequence[Update]) -> None:
    for u in updates:
        d = u.delta
        if len(d) != len(weights) or any(a.shape != w.shape for a, w in zip(d, weights)):
            raise ValueError(f"update of client {u.cid} does not match the shapes of the weights")


def _stacked(updates: Sequence[Update], j: int) -> np.ndarray:
    """Entry ``j`` of every update, stacked along a new axis 0, in float64."""
    return np.stack([np.asarray(u.delta[j], dtype=np.float64) for u in updates])


class _CoordinateWise(Aggregator):
    """Shared: a coordinate-wise statistic of the updates, not a weighted sum."""

    def coefficients(self, updates: Sequence[Update]) -> list[float]:
        """Not used: a coordinate-wise statistic is not a weighted sum of the updates."""
        raise NotImplementedError(
            f"{type(self).__name__} is a coordinate-wise statistic, not a weighted sum "
            "of the updates: it has no coefficients (use aggregate)"
        )

    def _statistic(self, stacked: np.ndarray) -> np.ndarray:
        """The statistic along axis 0 of the ``(K, *shape)`` float64 stack."""
        raise NotImplementedError

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
        """Return ``w - stat_k(G_k)`` per coordinate (unchanged copies when there
        is no update); ``shares`` and ``fresh`` are not used."""
        if not updates:
            return [w.copy() for w in weights]
        _check_shapes(weights, updates)
        steps = [self._statistic(_stacked(updates, j)) for j in range(len(weights))]
        return apply_step(weights, [steps], [1.0])  # w - step, in float64


class MedianAggregator(_CoordinateWise):
    """Coordinate-wise median of the updates (Yin et al. 2018), per model.

    ``w <- w - median_k(G_k)`` in every coordinate, which equals the
    coordinate-wise median of the returned local models ``median_k(w_k)`` (for an
    even ``K`` the mean of the two middle values, as ``np.median``). Unweighted,
    as Flower's ``FedMedian``. Not unbiased and not in the MMFL papers.

    Robustness: with ``f`` hostile clients among ``K`` reports and ``f < K/2``
    (e.g. one among at least 3), every coordinate of the result lies within the
    range of the honest clients' values, however large (finite) the hostile ones
    are. With ``K <= 2`` the median is the mean and protects nothing.
    """

    name = "median"

    def _statistic(self, stacked: np.ndarray) -> np.ndarray:
        median: np.ndarray = np.median(stacked, axis=0)
        return median


class TrimmedMeanAggregator(_CoordinateWise):
    """Coordinate-wise trimmed mean of the updates (Yin et al. 2018), per model.

    Per coordinate, sort the ``K`` values of ``G_k``, drop ``c = int(beta * K)``
    of them from each end and average the ``K - 2c`` others:
    ``w <- w - mean(sorted(G)[c : K - c])`` (equal to the same trimmed mean of
    the returned local models). The cut is that of Flower's ``FedTrimmedAvg``
    and ``scipy.stats.trim_mean``; ``beta = 0`` is the plain mean. Unweighted,
    not unbiased and not in the MMFL papers.

    Robustness: with ``f <= int(beta * K)`` hostile clients every coordinate of
    the result lies within the range of the honest clients' values. With
    ``int(beta * K) = 0`` (few clients, small ``beta``) it protects nothing.

    Parameters
    ----------
    beta : float
        Fraction cut from each end, in ``[0, 0.5)`` (default 0.2).
    """

    name = "trimmed-mean"

    def __init__(self, beta: float = 0.2) -> None:
        if isinstance(beta, bool) or not isinstance(beta, (int, float)):
            raise ValueError(  # noqa: TRY004 (one error type for every bad beta)
                f"trimmed-mean beta must be a number in [0, 0.5), got {beta!r}"
            )
        if not 0.0 <= float(beta) < 0.5:  # NaN fails too
            raise ValueError(
                f"trimmed-mean beta must be in [0, 0.5) (the fraction cut from each end), "
                f"got {beta!r}"
            )
        self.beta = float(beta)

    def config(self) -> dict[str, Any]:
        return {"beta": self.beta}

    def _statistic(self, stacked: np.ndarray) -> np.ndarray:
        k = stacked.shape[0]
        cut = int(self.beta * k)  # beta < 0.5, so at least one value is kept
        if cut == 0:
            mean: np.ndarray = stacked.mean(axis=0)
            return mean
        ordered = np.sort(stacked, axis=0)
        trimmed: np.ndarray = ordered[cut : k - cut].mean(axis=0)
        return trimmed


class CenteredClipAggregator(Aggregator):
    """Centered clipping (Karimireddy, He and Jaggi 2021, "Learning from History
    for Byzantine Robust Optimization", ICML), one clipping pass per round, per
    model, keeping the weights of a base rule.

    The center ``v`` is the model's previous step (0 in its first round). Each
    update ``G_k`` is moved to ``v + (G_k - v) min(1, tau / ||G_k - v||)``, with
    ``tau`` the lower median of the round's distances ``||G_k - v||``: an
    honest distance while fewer than half of the updates are hostile, even with
    two updates (where the median of two is their mean and protects nothing).
    The step is the base rule's weighted sum of the moved updates: FedAvg's
    ``n_k / sum n`` here, paper 003's ``d / (B p)`` in
    :class:`UnbiasedCenteredClipAggregator`, so an update within ``tau`` of the
    center counts exactly as under the base rule, and with nothing clipped the
    step is the base rule's.

    Robustness: one update moves the step at most ``c_k (||v|| + tau)`` away
    from the center, whatever its norm or direction; a scaled, flipped or noisy
    update counts as one at an honest distance. Not unbiased once something is
    clipped (with heterogeneous data, honest updates far from the consensus are
    clipped too), and not part of the MMFL papers. Covers the trainable entries
    (the strategy averages the state entries). Keeps the previous step of each
    model (checkpointed).
    """

    name = "centered-clip"

    def __init__(self) -> None:
        self._center: dict[str, list[np.ndarray]] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"center": {t: [a.copy() for a in v] for t, v in self._center.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._center = {
            str(t): [np.asarray(a, dtype=np.float64).copy() for a in v]
            for t, v in state.get("center", {}).items()
        }

    def base_coefficients(self, updates: Sequence[Update]) -> list[float]:
        total = float(sum(u.num_examples for u in updates))
        return [u.num_examples / total for u in updates]

    def coefficients(self, updates: Sequence[Update]) -> list[float]:
        """The base rule's weights (applied to the clipped updates)."""
        return self.base_coefficients(updates)

    def clipped(self, task: str, weights: Weights, updates: Sequence[Update]) -> list[Weights]:
        """Each update moved to within ``tau`` of the center (float64)."""
        center = self._center.get(task)
        if (
            center is None
            or len(center) != len(weights)
            or any(c.shape != w.shape for c, w in zip(center, weights))
        ):
            center = [np.zeros(w.shape, dtype=np.float64) for w in weights]
        diffs = [
            [np.asarray(d, dtype=np.float64) - c for d, c in zip(u.delta, center)] for u in updates
        ]
        dist = [float(np.sqrt(sum(float(np.square(x).sum()) for x in d))) for d in diffs]
        tau = float(np.percentile(dist, 50, method="lower"))
        out = []
        for d, r in zip(diffs, dist):
            scale = min(1.0, tau / r) if r > 0 else 1.0
            out.append([c + scale * x for c, x in zip(center, d)])
        return out

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
        """``w - sum_k c_k (v + clip(G_k - v, tau))``; the step becomes the next
        center. Unchanged copies (and the center kept) without updates."""
        if not updates:
            return [w.copy() for w in weights]
        _check_shapes(weights, updates)
        moved = self.clipped(task, weights, updates)
        coeffs = self.coefficients(updates)
        # updates is not empty, so each sum is an array (never the start value 0)
        step = [
            cast(np.ndarray, sum(c * m[j] for c, m in zip(coeffs, moved)))
            for j in range(len(weights))
        ]
        if all(np.isfinite(s).all() for s in step):
            self._center[task] = [np.asarray(s, dtype=np.float64) for s in step]
        return apply_step(weights, [step], [1.0])


class UnbiasedCenteredClipAggregator(CenteredClipAggregator):
    """:class:`CenteredClipAggregator` with paper 003's weights ``d_{i,s} l /
    (B_i p_{s|(i,b)})`` (:class:`~mmfl_flwr.core.aggregators.UnbiasedAggregator`):
    the robust rule for LVR-style policies, whose picks carry inclusion
    probabilities; with nothing clipped it is the unbiased step."""

    name = "unbiased-centered-clip"
    needs_inclusion_probabilities = True

    def base_coefficients(self, updates: Sequence[Update]) -> list[float]:
        return UnbiasedAggregator().coefficients(updates)


AGGREGATOR_CARDS = (
    AggregatorCard("median", MedianAggregator, "the coordinate-wise median of the updates"),
    AggregatorCard(
        "trimmed-mean",
        TrimmedMeanAggregator,
        "the coordinate-wise mean without each coordinate's beta largest and smallest values",
    ),
    AggregatorCard(
        "centered-clip",
        CenteredClipAggregator,
        "FedAvg of the updates clipped around the previous round's step (centered clipping)",
    ),
    AggregatorCard(
        "unbiased-centered-clip",
        UnbiasedCenteredClipAggregator,
        "the unbiased rule on updates clipped around the previous round's step",
    ),
)
