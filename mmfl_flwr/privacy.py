"""Differential privacy per model: Flower 1.42's four DP wrappers, for
:class:`~mmfl_flwr.strategy.MultiModelStrategy`.

Flower's ``DifferentialPrivacy{Server,Client}Side{Fixed,Adaptive}Clipping``
clip and noise one model (one ArrayRecord per message), so they cannot wrap a
strategy that trains several (constructing one around a MultiModelStrategy
raises a TypeError that names the class here). The wrappers of this module take
the same parameters and act per model:

- every (client, model) update ``Delta = w_client - w_global`` is clipped to the
  model's clipping norm ``C`` over the model's **trainable** entries: on the
  server (``ServerSide``), or on the client (``ClientSide``: the train config
  carries ``clipping_norm.<model>``, which ``make_client_app`` honours; the
  server re-clips any update above the norm, logged, so the bound holds
  against a client that ignores it). Under DP the trainable entries are every
  floating-point entry unless the operator pins ``trainable_keys`` (clients'
  declarations are ignored); the other entries keep their values (their
  average over the clients would not be private);
- after the wrapped strategy aggregates, every model assigned in the round gets
  Gaussian noise of standard deviation ``noise_multiplier * C /
  num_sampled_clients`` on its trainable entries (also when no update
  survived), drawn from the operating system's entropy unless ``noise_seed``
  makes it reproducible (and then not private against whoever knows it);
- adaptive clipping (Andrew et al., 2021, "Differentially private learning with
  adaptive clipping") moves each model's norm geometrically towards the
  quantile where a fraction ``target_clipped_quantile`` of its updates is
  clipped: ``C <- C * exp(clip_norm_lr * (clipped - target))``, ``clipped``
  released as the sum of the centred bits ``b - 1/2`` of the round's accepted
  updates plus noise of std ``clipped_count_stddev`` (default
  ``num_sampled_clients / 20``), over ``m``, plus 1/2; the update noise
  multiplier becomes ``(z^-2 - (2 sigma_b)^-2)^-1/2`` so that the two releases
  together have noise multiplier ``z``, as in the paper;
- each model's privacy spent so far is computed by Google's ``dp-accounting``
  (its RDP accountant; ``pip install "flwr[dp]"``): one Gaussian release with
  noise multiplier ``z`` per round in which the model was assigned, amplified
  by Poisson subsampling at rate ``q = num_sampled_clients / clients holding
  the model`` when ``amplification`` is on (the default). Amplification assumes
  every client is in a round's sample independently with probability ``q``:
  true of uniform policies (random allocation, MFA-Rand) only approximately,
  and not of the loss- or norm-based ones (LVR, GVR, UCB, Power-of-Choice pick
  clients by what they report); pass ``amplification=False`` for the bound
  that does not rely on it. ``epsilon`` at ``delta`` is logged every round and
  kept in ``result.privacy`` (the runner writes it to summary.json). It covers
  one model's weights; a client holding K models takes part in up to K
  releases a round, and the metrics (losses, counts, assignments) go out
  without noise.

The guarantee is the one of DP-FedAvg: per round, each model's aggregate moves
by at most ``C / num_sampled_clients`` per client when the wrapped aggregator
averages the clipped updates with weights ``1 / num_sampled_clients``; with
other weights (sample counts, the unbiased ``d / (B p)`` estimators) the
sensitivity is the largest coefficient times ``C``, and the noise scale above
does not account for it. Aggregators whose releases the noise does not cover
are refused (SCAFFOLD's control variates, the stale-update rules, the median
and trimmed mean). The project's own update-norm bound (``update_norm_factor``)
acts on the clipped updates and composes: it only rejects updates, never
enlarges one.

Why one module: the four public wrappers are one class, ``_PerModelDP`` (the
per-model clipping, noise and accounting every wrapper does), configured: the
fixed ones differ only in where the update is clipped (``server_clips``), and
the adaptive ones add the noise split between the update and the clipped count
(their constructor) and the norm update (``_adapt``, a hook of the base class).
The docstring above states the guarantee of all four together; splitting the
subclasses or the accountant (:func:`epsilon`) from the base class would put
the code that defines what one wrapper releases in two places.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from mmfl_flwr import protocol as P
from mmfl_flwr.core.clipping import KEY_CLIPPING_NORM, clip_update, update_norm
from mmfl_flwr.records import arrays_to_numpy, numpy_to_arrays
from mmfl_flwr.strategy import MultiModelResult, MultiModelStrategy
from mmfl_flwr.strategy.result import EvaluateFn

__all__ = [
    "DifferentialPrivacyClientSideAdaptiveClipping",
    "DifferentialPrivacyClientSideFixedClipping",
    "DifferentialPrivacyServerSideAdaptiveClipping",
    "DifferentialPrivacyServerSideFixedClipping",
    "KEY_CLIPPING_NORM",
    "clip_update",
    "update_norm",
]


def _check_aggregator(strategy: MultiModelStrategy) -> None:
    """The wrappers' noise covers the aggregators whose card says ``private``: those
    that combine the round's clipped updates only (FedAvg, the plain mean and the
    unbiased ``d / (B p)`` rule among the built-in ones)."""
    from mmfl_flwr.core.card import aggregator_card_of, aggregator_cards

    agg = strategy.aggregator
    found = aggregator_card_of(agg)
    if found is not None and found.private:
        return
    supported = ", ".join(c.name for c in aggregator_cards() if c.private)
    from mmfl_flwr.core.stale import StaleAggregator

    why = (
        "sends control variates, which are neither clipped nor noised"
        if agg.needs_control
        else "reuses stored updates in later rounds, whose releases this accounting does not cover"
        if isinstance(agg, StaleAggregator)
        else "has a sensitivity the noise std z C / m is not calibrated for"
    )
    raise ValueError(
        f"differential privacy per model supports the aggregators {supported}; "
        f"{type(agg).__name__} {why}"
    )


def _positive_counts(value: int | Mapping[str, int], name: str) -> int | dict[str, int]:
    if isinstance(value, Mapping):
        out = {str(t): int(v) for t, v in value.items()}
        bad = {t: v for t, v in out.items() if v < 1}
        if bad or not out:
            raise ValueError(f"{name} must map each model to a positive count, got {dict(value)}")
        return out
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(
            f"{name} must be a positive integer (or a mapping model -> one), got {value!r}"
        )
    return int(value)


class _PerModelDP(Strategy):
    """What the four wrappers share: the hooks, noise, accounting and state."""

    server_clips = True

    def __init__(
        self,
        strategy: MultiModelStrategy,
        noise_multiplier: float,
        clipping_norm: float,
        num_sampled_clients: int | Mapping[str, int],
        *,
        delta: float = 1e-5,
        amplification: bool = True,
        noise_seed: int | None = None,
    ) -> None:
        if not isinstance(strategy, MultiModelStrategy):
            raise TypeError(
                f"{type(self).__name__} wraps a mmfl_flwr MultiModelStrategy, got "
                f"{type(strategy).__name__}; for a Flower strategy use flwr's own wrapper"
            )
        _check_aggregator(strategy)
        if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
            raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
        if not (clipping_norm > 0 and math.isfinite(clipping_norm)):
            raise ValueError(f"the clipping norm must be positive, got {clipping_norm}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.strategy = strategy
        self.noise_multiplier = float(noise_multiplier)
        self.update_noise_multiplier = float(noise_multiplier)
        self.initial_clipping_norm = float(clipping_norm)
        self.num_sampled_clients = _positive_counts(num_sampled_clients, "num_sampled_clients")
        self.delta = float(delta)
        self.amplification = bool(amplification)
        if noise_seed is not None and (isinstance(noise_seed, bool) or int(noise_seed) < 0):
            raise ValueError(f"noise_seed must be None or an integer >= 0, got {noise_seed!r}")
        self.noise_seed = None if noise_seed is None else int(noise_seed)
        self._reset()

    def _reset(self) -> None:
        #: model -> its clipping norm now
        self.clipping_norms: dict[str, float] = {}
        #: model -> the (sampling rate) of every release so far
        self.releases: dict[str, list[float]] = {}
        self._checked = False
        self._frozen_warned: set[str] = set()
        # the noise: fresh entropy from the OS unless noise_seed makes it reproducible
        self._noise = np.random.default_rng(
            np.random.SeedSequence() if self.noise_seed is None else [self.noise_seed, 0xD1FF]
        )

    def prepare_run(self, run_state: Any) -> None:
        """Before the first round (called by the wrapped strategy's start()): the
        clients' declarations of trainable keys are ignored under DP (a client
        could otherwise exempt most of a model from clipping and noise); every
        floating-point entry is trainable unless the operator pinned
        ``trainable_keys``."""
        run_state.trust_declared_trainable = False

    # the wrapped strategy's state reads through (weights, result, table, policy,
    # ...); its round callback and checkpoint path are set through
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)

    on_round_end = property(
        lambda self: self.strategy.on_round_end,
        lambda self, f: setattr(self.strategy, "on_round_end", f),
        doc="The wrapped strategy's round callback.",
    )
    checkpoint_path = property(
        lambda self: self.strategy.checkpoint_path,
        lambda self, p: setattr(self.strategy, "checkpoint_path", p),
        doc="The wrapped strategy's checkpoint path.",
    )

    # ---------------------------------------------------------------- settings
    def sampled(self, task: str) -> int:
        """``num_sampled_clients`` of ``task``."""
        m = self.num_sampled_clients
        if isinstance(m, dict):
            if task not in m:
                raise ValueError(
                    f"num_sampled_clients names no count for model {task!r} (it names {sorted(m)})"
                )
            return m[task]
        return m

    def norm(self, task: str) -> float:
        """The clipping norm of ``task`` now."""
        return self.clipping_norms.setdefault(task, self.initial_clipping_norm)

    def stdv(self, task: str) -> float:
        """The standard deviation of the noise on ``task``'s aggregate."""
        return self.update_noise_multiplier * self.norm(task) / self.sampled(task)

    def wrapper_config(self) -> dict[str, Any]:
        """The parameters a resumed run must share."""
        m = self.num_sampled_clients
        return {
            "noise_multiplier": self.noise_multiplier,
            "clipping_norm": self.initial_clipping_norm,
            "num_sampled_clients": sorted(m.items()) if isinstance(m, dict) else m,
            "delta": self.delta,
            "amplification": self.amplification,
            "noise_seed": self.noise_seed,
        }

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.wrapper_config().items())
        return f"{type(self).__name__}({self.strategy!r}, {args})"

    def summary(self) -> None:
        """Log the DP settings, then the wrapped strategy's."""
        log(INFO, "\t├──> Per-model DP (%s):", type(self).__name__)
        for name, value in self.wrapper_config().items():
            log(INFO, "\t│\t├── %s: %s", name, value)
        self.strategy.summary()

    # ------------------------------------------------------------------- run
    def start(  # type: ignore[override]
        self,
        grid: Grid,
        initial_arrays: Mapping[str, ArrayRecord],
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
        resume_from: str | None = None,
    ) -> MultiModelResult:
        """Run the wrapped strategy's rounds through this wrapper's hooks
        (:meth:`MultiModelStrategy.start`'s arguments)."""
        self._reset()
        return self.strategy._drive(
            self,
            grid,
            initial_arrays,
            num_rounds,
            timeout,
            train_config,
            evaluate_config,
            evaluate_fn,
            resume_from,
        )

    def check_resumable(self, path: str) -> dict[str, Any]:
        """The wrapped strategy's check, with this wrapper's identity: a
        checkpoint written under another wrapper (or none) is refused."""
        return self.strategy.check_resumable(path, self)

    def wrapper_state(self) -> dict[str, Any]:
        """The accountant's releases and the clipping norms (for checkpoints); with
        ``noise_seed`` also the noise generator's state (fresh OS noise is never
        written down: a resumed run draws fresh noise)."""
        state: dict[str, Any] = {
            "clipping_norms": dict(self.clipping_norms),
            "releases": {t: list(v) for t, v in self.releases.items()},
        }
        if self.noise_seed is not None:
            state["noise"] = self._noise.bit_generator.state
        return state

    def load_wrapper_state(self, state: Mapping[str, Any], result: MultiModelResult) -> None:
        """Continue from :meth:`wrapper_state` (a resumed run)."""
        self.clipping_norms = {t: float(v) for t, v in state.get("clipping_norms", {}).items()}
        self.releases = {t: [float(q) for q in v] for t, v in state.get("releases", {}).items()}
        if self.noise_seed is not None and "noise" in state:
            self._noise.bit_generator.state = state["noise"]
        for task in self.releases:
            result.privacy[task] = self.spent(task)

    # ----------------------------------------------------------------- hooks
    def configure_loss_query(
        self, server_round: int, arrays: RecordDict, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_loss_query(server_round, arrays, config, grid)

    def aggregate_loss_query(
        self, server_round: int, replies: Iterable[Message]
    ) -> RecordDict | None:
        return self.strategy.aggregate_loss_query(server_round, replies)

    def configure_evaluate(
        self, server_round: int, arrays: Any, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def configure_train(
        self, server_round: int, arrays: Any, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's train messages; checks ``num_sampled_clients``
        against the clients that hold each model (once)."""
        run_state = self.strategy.run_state
        if not self._checked:
            for task in run_state.all_tasks:
                self.sampled(task)  # a mapping must name every model, also late ones
            for task in run_state.tasks:
                holders = sum(
                    1 for c in run_state.table.clients(online_only=False) if task in c.num_examples
                )
                if self.sampled(task) > holders:
                    raise ValueError(
                        f"num_sampled_clients = {self.sampled(task)} for model {task!r} is "
                        f"more than the {holders} clients that hold it (if more join "
                        "later, raise min_available_clients so that the first round waits "
                        "for them)"
                    )
            self._checked = True
        msgs = list(self.strategy.configure_train(server_round, arrays, config, grid))
        if not self.server_clips:  # config, or config@<id> per client of a shard node
            for m in msgs:
                for key, cfg in m.content.config_records.items():
                    if P.split_client_key(key)[0] != P.CONFIG_KEY:
                        continue
                    for task in [str(t) for t in cast(list[Any], cfg.get(P.CFG_TASKS, []))]:
                        cfg[f"{KEY_CLIPPING_NORM}.{task}"] = self.norm(task)
        return msgs

    def aggregate_train(  # type: ignore[override]  # several models: as MultiModelStrategy
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[RecordDict | None, MetricRecord | None]:
        """Clip every (client, model) update, let the wrapped strategy aggregate,
        then add the noise to (and account a release of) every model assigned in
        the round, whatever the aggregate; state entries keep their values."""
        replies = list(replies)
        run_state = self.strategy.run_state
        plan = self.strategy._plans.get(server_round)
        assigned = sorted({p.task for p in plan.picks}) if plan is not None else []
        bits = self._clip(server_round, replies, plan.expected() if plan is not None else {})
        models, metrics = self.strategy.aggregate_train(server_round, replies)
        for pair in run_state.rejected_parts:  # only accepted updates count for adaptation
            bits.pop(pair, None)
        if models is None:
            models = RecordDict()
        if not isinstance(models, RecordDict):
            return models, metrics  # left for start()'s checks
        out = RecordDict()
        for task, rec in models.items():
            if task not in assigned:
                out[task] = rec
        for task in assigned:
            got = models.get(task)
            old = run_state.weights[task]
            if got is None:  # left unchanged by the wrapped strategy: still a release
                new = {k: v.copy() for k, v in old.items()}
            elif isinstance(got, ArrayRecord):
                new = arrays_to_numpy(got)
                if list(new) != list(old):
                    out[task] = got  # left for start()'s checks
                    continue
            else:
                out[task] = got
                continue
            keys = run_state.split_keys(task)[0]
            frozen = [k for k in old if k not in keys]
            for k in frozen:  # not clipped, so not released: the server's values stay
                new[k] = old[k]
            if frozen and task not in self._frozen_warned:
                self._frozen_warned.add(task)
                log(
                    WARNING,
                    "DP: model %r: %d entries outside its trainable keys (%s...) "
                    "keep their values (their average over clients is not private)",
                    task,
                    len(frozen),
                    frozen[0],
                )
            std = self.stdv(task)
            uploads = metrics.get(f"{task}.uploads") if metrics is not None else None
            if isinstance(uploads, int) and uploads < self.sampled(task):
                log(
                    WARNING,
                    "DP: model %r aggregated %d updates, fewer than "
                    "num_sampled_clients = %d: its noise (std %.4g) is set for %d",
                    task,
                    uploads,
                    self.sampled(task),
                    std,
                    self.sampled(task),
                )
            for k in keys:
                noise = self._noise.normal(0.0, std, size=new[k].shape) if std > 0 else 0.0
                new[k] = (np.asarray(new[k], dtype=np.float64) + noise).astype(new[k].dtype)
            out[task] = numpy_to_arrays(new)
            self._account(task)
            if metrics is not None:
                metrics[f"{task}.dp-noise-std"] = std
        self._adapt(bits, assigned)
        result = self.strategy.result
        for task in self.releases:
            spent = self.spent(task)
            if result is not None:
                result.privacy[task] = spent
            log(
                INFO,
                "DP: model %r: epsilon %.4g at delta %g after %d releases "
                "(noise multiplier %g, clipping norm %.4g)",
                task,
                spent["epsilon"],
                self.delta,
                len(self.releases[task]),
                self.noise_multiplier,
                self.norm(task),
            )
        return out, metrics

    # ------------------------------------------------------------- internals
    def _clip(
        self, server_round: int, replies: list[Message], expected: Mapping[str, Mapping[str, Any]]
    ) -> dict[tuple[str, str], bool]:
        """Clip the update of every reply part in place (an update whose norm is
        not finite is removed: the validation then rejects it); returns, for each
        (client, model) part assigned this round (first reply only), whether its
        update was above the model's norm."""
        run_state = self.strategy.run_state
        bits: dict[tuple[str, str], bool] = {}
        for reply in replies:
            if reply.has_error():
                continue
            node = reply.metadata.src_node_id
            shard = run_state.shards.get(node)
            hosted = set(shard) if shard is not None else None
            own = reply.metadata.group_id == str(server_round)
            records = reply.content.array_records  # one view: it is rebuilt on each access
            for key in list(records.keys()):
                if hosted is None:
                    base, cid = key, run_state.node_to_cid.get(node, "?")
                else:  # a multi-client node: arrays.<task>@<client id>
                    base, part_of = P.split_client_key(key)
                    if part_of is None or part_of not in hosted:
                        continue
                    cid = part_of
                task = P.task_of(base, P.ARRAYS_PREFIX)
                if task is None or task not in run_state.weights:
                    continue
                old = run_state.weights[task]
                try:
                    new = arrays_to_numpy(records[key])
                except Exception:  # noqa: BLE001 - malformed: the validation rejects it
                    continue
                if list(new) != list(old) or any(new[k].shape != old[k].shape for k in old):
                    continue
                keys = run_state.split_keys(task)[0]
                limit = self.norm(task)
                clipped, norm, was = clip_update(new, old, keys, limit)
                if not math.isfinite(norm):
                    log(
                        WARNING,
                        "DP: client %s sent model %r with an update of non-finite norm; removed",
                        cid,
                        task,
                    )
                    del reply.content[key]
                    continue
                above = norm > limit * (1 + 1e-5)
                if not self.server_clips and above:
                    log(
                        WARNING,
                        "DP: client %s sent model %r with an update of norm %.4g "
                        "above the clipping norm %.4g (client-side clipping not applied); "
                        "clipped on the server",
                        cid,
                        task,
                        norm,
                        limit,
                    )
                pair = (cid, task)
                if own and task in expected.get(cid, {}) and pair not in bits:
                    # a client-clipped update has norm C (up to rounding)
                    bits[pair] = was if self.server_clips else norm >= limit * (1 - 1e-5)
                if was:
                    reply.content[key] = numpy_to_arrays(clipped)
        return bits

    def _adapt(self, bits: Mapping[tuple[str, str], bool], assigned: list[str]) -> None:
        """Fixed clipping: nothing."""

    def _account(self, task: str) -> None:
        run_state = self.strategy.run_state
        holders = sum(
            1 for c in run_state.table.clients(online_only=False) if task in c.num_examples
        )
        q = min(1.0, self.sampled(task) / holders) if holders else 1.0
        self.releases.setdefault(task, []).append(q if self.amplification else 1.0)

    def spent(self, task: str) -> dict[str, float]:
        """``epsilon`` at ``delta`` of ``task``'s releases so far (RDP accountant of
        Google's dp-accounting), with ``releases``, ``noise_multiplier``,
        ``clipping_norm`` and ``delta``."""
        rates = self.releases.get(task, [])
        return {
            "epsilon": epsilon(self.noise_multiplier, rates, self.delta),
            "delta": self.delta,
            "releases": len(rates),
            "noise_multiplier": self.noise_multiplier,
            "clipping_norm": self.norm(task),
        }


def epsilon(noise_multiplier: float, rates: list[float], delta: float) -> float:
    """``epsilon`` at ``delta`` after one Gaussian release per entry of ``rates``
    (its Poisson sampling rate; 1 = no amplification), from dp-accounting's RDP
    accountant; infinite without noise, 0 without releases."""
    if not rates:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    try:
        from dp_accounting import dp_event, rdp
    except ImportError as err:  # pragma: no cover - flwr[dp] is a dependency
        raise ImportError('privacy accounting needs dp-accounting: pip install "flwr[dp]"') from err
    # dp-accounting warns through absl about RDP orders it leaves out, which puts a
    # handler on Python's root logger (and then every flwr line prints twice): keep
    # those warnings quiet and the root logger as it was
    import logging

    root_handlers, absl = list(logging.root.handlers), logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        acc = rdp.RdpAccountant()
        counts: dict[float, int] = {}
        for q in rates:
            counts[q] = counts.get(q, 0) + 1
        for q, n in counts.items():
            gauss = dp_event.GaussianDpEvent(noise_multiplier)
            event = gauss if q >= 1.0 else dp_event.PoissonSampledDpEvent(q, gauss)
            acc.compose(event, n)
        return float(acc.get_epsilon(delta))
    finally:
        absl.setLevel(level)
        logging.root.handlers[:] = root_handlers


class DifferentialPrivacyServerSideFixedClipping(_PerModelDP):
    """Central DP with fixed clipping on the server, per model.

    Parameters
    ----------
    strategy : MultiModelStrategy
        The strategy whose models are trained privately.
    noise_multiplier : float
        ``z``: the noise on a model's aggregate has std ``z * C / m``.
    clipping_norm : float
        ``C``: every (client, model) update's trainable entries are clipped to it.
    num_sampled_clients : int or mapping
        ``m``: the clients sampled per round for each model (one count, or model
        -> count); at most the clients holding the model.
    delta : float, keyword
        The ``delta`` at which ``epsilon`` is reported (default 1e-5).
    amplification : bool, keyword
        Account with Poisson subsampling at ``m / clients holding the model``
        (default True; see the module docstring for when this holds).
    """


class DifferentialPrivacyClientSideFixedClipping(_PerModelDP):
    """Central DP with fixed clipping on the clients, per model: the train config
    carries ``clipping_norm.<model>`` (``make_client_app`` clips each model's
    update to it); the server re-clips an update above the norm (logged) and
    adds the noise. Parameters as :class:`DifferentialPrivacyServerSideFixedClipping`."""

    server_clips = False


class _Adaptive(_PerModelDP):
    def __init__(
        self,
        strategy: MultiModelStrategy,
        noise_multiplier: float,
        num_sampled_clients: int | Mapping[str, int],
        initial_clipping_norm: float = 0.1,
        target_clipped_quantile: float = 0.5,
        clip_norm_lr: float = 0.2,
        clipped_count_stddev: float | None = None,
        *,
        delta: float = 1e-5,
        amplification: bool = True,
        noise_seed: int | None = None,
    ) -> None:
        super().__init__(
            strategy,
            noise_multiplier,
            initial_clipping_norm,
            num_sampled_clients,
            delta=delta,
            amplification=amplification,
            noise_seed=noise_seed,
        )
        if not 0.0 <= target_clipped_quantile <= 1.0:
            raise ValueError(
                f"target_clipped_quantile must be in [0, 1], got {target_clipped_quantile}"
            )
        if not (clip_norm_lr > 0 and math.isfinite(clip_norm_lr)):
            raise ValueError(f"clip_norm_lr must be positive, got {clip_norm_lr}")
        if clipped_count_stddev is not None and not clipped_count_stddev >= 0:
            raise ValueError(f"clipped_count_stddev must be >= 0, got {clipped_count_stddev}")
        self.target_clipped_quantile = float(target_clipped_quantile)
        self.clip_norm_lr = float(clip_norm_lr)
        m = self.num_sampled_clients
        smallest = min(m.values()) if isinstance(m, dict) else m
        z = self.noise_multiplier
        if z > 0:
            sigma_b = smallest / 20 if clipped_count_stddev is None else clipped_count_stddev
            if z >= 2 * sigma_b:
                raise ValueError(
                    f"noise_multiplier {z} needs clipped_count_stddev > {z / 2} (it is "
                    f"{sigma_b}"
                    f"{' = num_sampled_clients / 20' if clipped_count_stddev is None else ''}"
                    "): the count's noise would use up the whole budget"
                )
            self.update_noise_multiplier = (z**-2 - (2 * sigma_b) ** -2) ** -0.5
        else:
            sigma_b = 0.0 if clipped_count_stddev is None else clipped_count_stddev
        self.clipped_count_stddev = float(sigma_b)

    def wrapper_config(self) -> dict[str, Any]:
        return {
            **super().wrapper_config(),
            "target_clipped_quantile": self.target_clipped_quantile,
            "clip_norm_lr": self.clip_norm_lr,
            "clipped_count_stddev": self.clipped_count_stddev,
        }

    def _adapt(self, bits: Mapping[tuple[str, str], bool], assigned: list[str]) -> None:
        """``C <- C exp(lr (clipped fraction - target))`` for every model assigned
        in the round (the norm of the next round). The fraction is released as
        Andrew et al. do: the centred bits ``b - 1/2`` (sensitivity 1/2) summed
        over the round's accepted updates, plus noise of std
        ``clipped_count_stddev``, over ``m``, plus 1/2."""
        for task in assigned:
            centred = sum(float(b) - 0.5 for (_, t), b in bits.items() if t == task)
            if self.clipped_count_stddev > 0:
                centred += float(self._noise.normal(0.0, self.clipped_count_stddev))
            fraction = centred / self.sampled(task) + 0.5
            self.clipping_norms[task] = self.norm(task) * math.exp(
                self.clip_norm_lr * (fraction - self.target_clipped_quantile)
            )


class DifferentialPrivacyServerSideAdaptiveClipping(_Adaptive):
    """Central DP with adaptive clipping on the server, per model (each model
    has its own clipping norm, moved every round towards the quantile
    ``target_clipped_quantile`` of its update norms; see the module docstring).

    Parameters: ``strategy``, ``noise_multiplier``, ``num_sampled_clients``,
    ``initial_clipping_norm`` (0.1), ``target_clipped_quantile`` (0.5),
    ``clip_norm_lr`` (0.2), ``clipped_count_stddev`` (``num_sampled_clients /
    20``), as Flower's; ``delta`` and ``amplification`` as
    :class:`DifferentialPrivacyServerSideFixedClipping`."""


class DifferentialPrivacyClientSideAdaptiveClipping(_Adaptive):
    """Adaptive clipping on the clients, per model: the train config carries each
    model's current norm (``clipping_norm.<model>``); the server counts an
    update of norm ``C`` (up to rounding) as clipped, re-clips one above it
    (logged), and adds the noise."""

    server_clips = False
