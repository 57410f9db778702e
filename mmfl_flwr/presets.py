"""Named presets: each paper algorithm as one line.

A preset pairs a policy with the aggregator its paper uses. Every preset takes the
:class:`~mmfl_flwr.strategy.MultiModelStrategy` keyword arguments too
(``local_epochs``, ``lr``, ``seed``, ``fraction_evaluate``, ...). Most take an
``aggregator`` to override the pairing; the presets whose aggregator is the
algorithm itself (the stale ones and SCAFFOLD) do not (see
:func:`takes_aggregator`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from logging import WARNING
from typing import TYPE_CHECKING, Any

from flwr.common.logger import log

from mmfl_flwr.config import MIN_UPLOADS_PER_MODEL
from mmfl_flwr.core.aggregators import (
    Aggregator,
    FedAvgAggregator,
    MeanAggregator,
    UnbiasedAggregator,
)
from mmfl_flwr.core.group import GroupSampling
from mmfl_flwr.core.lvr import GVR, LVR, RoundRobinGVR
from mmfl_flwr.core.mfa import MFARand, MFARoundRobin, MultiFedAvg
from mmfl_flwr.core.random_allocation import FullParticipation, RandomAllocation
from mmfl_flwr.core.robust import MedianAggregator, TrimmedMeanAggregator
from mmfl_flwr.core.scaffold import ScaffoldAggregator
from mmfl_flwr.core.stale import (
    FedStaleAggregator,
    FedVARPAggregator,
    MIFAAggregator,
    StaleVRAggregator,
    StaleVREAggregator,
    StaleVRSampling,
)
from mmfl_flwr.core.ucb import ParetoMultiUCB, RanklistMultiUCB
from mmfl_flwr.strategy import MultiModelStrategy

if TYPE_CHECKING:
    from mmfl_flwr.config import Settings
    from mmfl_flwr.tasks.federation import Federation

AGGREGATORS: dict[str, Callable[[], Aggregator]] = {
    "fedavg": FedAvgAggregator,
    "unbiased": UnbiasedAggregator,
    "mean": MeanAggregator,
    "median": MedianAggregator,
    "trimmed-mean": TrimmedMeanAggregator,
}


def _aggregator(agg: Aggregator | str | None, default: Callable[[], Aggregator]) -> Aggregator:
    if agg is None:
        return default()
    if isinstance(agg, Aggregator):
        return agg
    if agg not in AGGREGATORS:
        raise ValueError(f"unknown aggregator {agg!r}; choose from {sorted(AGGREGATORS)}")
    return AGGREGATORS[agg]()


def random_allocation(
    budget: float | None = None,
    budget_fraction: float = 0.1,
    aggregator: Aggregator | str | None = None,
    **kwargs: Any,
) -> MultiModelStrategy:
    """Paper 003's random baseline: processor-level random allocation with
    budget ``m`` (default ``0.1 V``), unbiased ``d/(B p)`` aggregation."""
    return MultiModelStrategy(
        RandomAllocation(budget=budget, budget_fraction=budget_fraction),
        _aggregator(aggregator, UnbiasedAggregator),
        **kwargs,
    )


def full_participation(
    aggregator: Aggregator | str | None = None, **kwargs: Any
) -> MultiModelStrategy:
    """Every client trains every task it holds every round; FedAvg per model
    (equal to ``w - sum_i d_{i,s} G_{i,s}``)."""
    return MultiModelStrategy(
        FullParticipation(), _aggregator(aggregator, FedAvgAggregator), **kwargs
    )


def mfa_rand(
    clients_per_round: int | None = None,
    aggregator: Aggregator | str | None = None,
    **kwargs: Any,
) -> MultiModelStrategy:
    """MFA-Rand (paper 002): random near-equal groups each round; FedAvg."""
    return MultiModelStrategy(
        MFARand(clients_per_round), _aggregator(aggregator, FedAvgAggregator), **kwargs
    )


def mfa_rr(
    clients_per_round: int | None = None,
    aggregator: Aggregator | str | None = None,
    **kwargs: Any,
) -> MultiModelStrategy:
    """MFA-RR (paper 002): groups fixed per frame of M rounds, models rotate;
    FedAvg."""
    return MultiModelStrategy(
        MFARoundRobin(clients_per_round), _aggregator(aggregator, FedAvgAggregator), **kwargs
    )


def multi_fedavg(
    clients_per_round: int | None = None,
    aggregator: Aggregator | str | None = None,
    **kwargs: Any,
) -> MultiModelStrategy:
    """Multi-FedAvg (paper 004): K random clients, a random model each; FedAvg."""
    return MultiModelStrategy(
        MultiFedAvg(clients_per_round), _aggregator(aggregator, FedAvgAggregator), **kwargs
    )


def lvr(
    budget: float | None = None,
    budget_fraction: float = 0.1,
    floor: float = 1e-4,
    aggregator: Aggregator | str | None = None,
    **kwargs: Any,
) -> MultiModelStrategy:
    """MMFL-LVR (paper 003, Algorithm 1): loss query every round, optimal
    loss-based probabilities (Eq. 13), unbiased ``d/(B p)`` aggregation."""
    return MultiModelStrategy(
        LVR(budget=budget, budget_fraction=budget_fraction, floor=floor),
        _aggregator(aggregator, UnbiasedAggregator),
        **kwargs,
    )


def gvr(
    budget: float | None = None,
    budget_fraction: float = 0.1,
    floor: float = 1e-4,
    aggregator: Aggregator | str | None = None,
    **kwargs: Any,
) -> MultiModelStrategy:
    """MMFL-GVR (paper 003, Section 4.2): every client trains every task, the
    server samples updates with probabilities from their norms (Eq. 13 with
    ``||G||``), unbiased ``d/(B p)`` aggregation."""
    return MultiModelStrategy(
        GVR(budget=budget, budget_fraction=budget_fraction, floor=floor),
        _aggregator(aggregator, UnbiasedAggregator),
        **kwargs,
    )


def rr_gvr(
    budget: float | None = None,
    budget_fraction: float = 0.1,
    floor: float = 1e-4,
    aggregator: Aggregator | str | None = None,
    **kwargs: Any,
) -> MultiModelStrategy:
    """RoundRobin-GVR (paper 003, Fig. 4 baseline): one model per round in rotation,
    every client holding it trains it, the server samples the updates with
    gradient-norm optimal client sampling (Eq. 13 with one model and one processor
    per client, the same budget ``m`` as MMFL-GVR), unbiased ``d/q`` aggregation."""
    return MultiModelStrategy(
        RoundRobinGVR(budget=budget, budget_fraction=budget_fraction, floor=floor),
        _aggregator(aggregator, UnbiasedAggregator),
        **kwargs,
    )


def stalevr(
    budget: float | None = None,
    budget_fraction: float = 0.1,
    floor: float = 1e-4,
    signal: str = "loss",
    storage: str = "float32",
    **kwargs: Any,
) -> MultiModelStrategy:
    """MMFL-StaleVR (paper 003, Section 5): every client trains every task, LVR
    probabilities (Eq. 13) pick which updates count, and stale updates are reused
    with the per-pair optimal ``beta`` of Eq. 20 (Eq. 18). ``signal`` may be
    ``"stale-residual"`` (``||G - beta h||``, as the authors' code samples)."""
    return MultiModelStrategy(
        StaleVRSampling(budget, budget_fraction, floor, signal),
        StaleVRAggregator(storage=storage),
        **kwargs,
    )


def stalevre(
    budget: float | None = None,
    budget_fraction: float = 0.1,
    floor: float = 1e-4,
    b0: float = 1.0,
    storage: str = "float32",
    **kwargs: Any,
) -> MultiModelStrategy:
    """MMFL-StaleVRE: LVR sampling (only sampled clients train) and stale updates
    weighted by the linear-decay estimate of the optimal ``beta`` (Eq. 21)."""
    return MultiModelStrategy(
        LVR(budget=budget, budget_fraction=budget_fraction, floor=floor),
        StaleVREAggregator(b0=b0, storage=storage),
        **kwargs,
    )


def fedvarp(
    budget: float | None = None,
    budget_fraction: float = 0.1,
    storage: str = "float32",
    **kwargs: Any,
) -> MultiModelStrategy:
    """FedVARP for MMFL: random allocation, Eq. 17 with ``beta = 1``."""
    return MultiModelStrategy(
        RandomAllocation(budget=budget, budget_fraction=budget_fraction),
        FedVARPAggregator(storage=storage),
        **kwargs,
    )


def fedstale(
    beta: float = 0.8,
    budget: float | None = None,
    budget_fraction: float = 0.1,
    storage: str = "float32",
    **kwargs: Any,
) -> MultiModelStrategy:
    """FedStale for MMFL: random allocation, Eq. 17 with a fixed ``beta``."""
    return MultiModelStrategy(
        RandomAllocation(budget=budget, budget_fraction=budget_fraction),
        FedStaleAggregator(beta=beta, storage=storage),
        **kwargs,
    )


def mifa(
    budget: float | None = None,
    budget_fraction: float = 0.1,
    storage: str = "float32",
    **kwargs: Any,
) -> MultiModelStrategy:
    """MIFA for MMFL: random allocation; every eligible client's latest update
    is averaged (fresh where it trained, stale elsewhere)."""
    return MultiModelStrategy(
        RandomAllocation(budget=budget, budget_fraction=budget_fraction),
        MIFAAggregator(storage=storage),
        **kwargs,
    )


def scaffold(
    budget: float | None = None,
    budget_fraction: float = 0.1,
    storage: str = "float32",
    **kwargs: Any,
) -> MultiModelStrategy:
    """SCAFFOLD for MMFL: random allocation, per-task server control variates,
    per-client control variates in the ClientApp's ``context.state``, corrected
    local steps, unbiased aggregation."""
    return MultiModelStrategy(
        RandomAllocation(budget=budget, budget_fraction=budget_fraction),
        ScaffoldAggregator(storage=storage),
        **kwargs,
    )


def ranklist_ucb(
    clients_per_round: int = 2,
    gamma: float = 0.9,
    init: str = "loss-query",
    aggregator: Aggregator | str | None = None,
    **kwargs: Any,
) -> MultiModelStrategy:
    """Ranklist-Multi-UCB (paper 004, Algorithm 3): K clients by per-model rank
    lists of the discounted-loss UCB index; FedAvg per model. (From settings,
    ``clients-per-round`` 0 gives :func:`default_ucb_clients`.)"""
    return MultiModelStrategy(
        RanklistMultiUCB(clients_per_round, gamma, init),
        _aggregator(aggregator, FedAvgAggregator),
        **kwargs,
    )


def pareto_ucb(
    clients_per_round: int = 2,
    gamma: float = 0.9,
    init: str = "loss-query",
    aggregator: Aggregator | str | None = None,
    **kwargs: Any,
) -> MultiModelStrategy:
    """Pareto-Multi-UCB (paper 004, Algorithm 4): K clients from the Pareto
    front of the UCB score vectors, each on its best-rank model; FedAvg. (From
    settings, ``clients-per-round`` 0 gives :func:`default_ucb_clients`.)"""
    return MultiModelStrategy(
        ParetoMultiUCB(clients_per_round, gamma, init),
        _aggregator(aggregator, FedAvgAggregator),
        **kwargs,
    )


def group_sampling(
    participation: float = 1 / 6,
    variant: str = "consistent",
    max_clusters: int | None = None,
    aggregator: Aggregator | str | None = None,
    **kwargs: Any,
) -> MultiModelStrategy:
    """MMFL-Group Sampling (papers 000/001): C-step (K-means on loss vectors, k by
    silhouette, ``variant="modified"`` clusters on one rotating model), T-step
    round-robin of models over groups with pseudo-models; plain mean per model
    (``aggregator="fedavg"`` for data-weighted)."""
    seed = int(kwargs.get("seed", 0))
    return MultiModelStrategy(
        GroupSampling(participation, variant, max_clusters, seed=seed),
        _aggregator(aggregator, MeanAggregator),
        **kwargs,
    )


#: Preset name (as used by ``mmfl run --strategy`` and ``--run-config strategy=``)
#: -> factory.
PRESETS: dict[str, Callable[..., MultiModelStrategy]] = {
    "random": random_allocation,
    "full": full_participation,
    "mfa-rand": mfa_rand,
    "mfa-rr": mfa_rr,
    "multi-fedavg": multi_fedavg,
    "lvr": lvr,
    "gvr": gvr,
    "rr-gvr": rr_gvr,
    "stalevr": stalevr,
    "stalevre": stalevre,
    "fedvarp": fedvarp,
    "fedstale": fedstale,
    "mifa": mifa,
    "scaffold": scaffold,
    "ranklist-ucb": ranklist_ucb,
    "pareto-ucb": pareto_ucb,
    "group": group_sampling,
}


#: The presets whose ``K`` (``clients_per_round``) is required by the algorithm:
#: ``clients-per-round`` 0 gives them :func:`default_ucb_clients` instead of
#: "all clients".
UCB_PRESETS = ("ranklist-ucb", "pareto-ucb")


def default_ucb_clients(num_clients: int, num_models: int) -> int:
    """The ``K`` of the UCB presets when the settings leave it 0:
    ``min(num_clients, MIN_UPLOADS_PER_MODEL * num_models)``, so that each model
    expects :data:`~mmfl_flwr.config.MIN_UPLOADS_PER_MODEL` (5) trainers per
    round (each chosen client trains one model). 15 for the default job (20
    clients, 3 models); 10 for paper 004's two models, the paper's "large
    number of clients (10) per round" (it gives no single default: 2, 10 or 64).
    """
    return max(1, min(int(num_clients), MIN_UPLOADS_PER_MODEL * max(1, int(num_models))))


#: Settings fields (run-config keys with ``_``) whose preset parameter has
#: another name; every other preset parameter is named like its setting.
SETTING_PARAMETER = {
    "stale_storage": "storage",
    "stale_beta": "beta",
    "stalevr_signal": "signal",
    "stalevre_b0": "b0",
    "ucb_gamma": "gamma",
    "ucb_init": "init",
    "group_participation": "participation",
    "group_variant": "variant",
    "group_max_clusters": "max_clusters",
}


def _explicit_parameters(fn: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    return {
        n: p for n, p in inspect.signature(fn).parameters.items()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    }


#: Preset -> its own parameters (read once from the factories' signatures).
PRESET_PARAMETERS: dict[str, dict[str, inspect.Parameter]] = {
    name: _explicit_parameters(fn) for name, fn in PRESETS.items()
}


def preset_settings(name: str, fields: Iterable[str]) -> list[str]:
    """The settings among ``fields`` that preset ``name`` takes (each maps to one
    of its parameters, see :data:`SETTING_PARAMETER`)."""
    params = PRESET_PARAMETERS[name]
    return [f for f in fields if SETTING_PARAMETER.get(f, f) in params]


def presets_taking(field: str) -> list[str]:
    """The presets that take setting ``field``."""
    param = SETTING_PARAMETER.get(field, field)
    return [name for name, params in PRESET_PARAMETERS.items() if param in params]


def takes_aggregator(name: str) -> bool:
    """Whether preset ``name`` has an ``aggregator`` parameter to override its
    pairing (read from the preset function's signature)."""
    return "aggregator" in PRESET_PARAMETERS[name]


def preset_kwargs(
    name: str, values: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """The parameters of preset ``name`` that the settings ``values`` (field ->
    value) give. A value of 0 or ``""`` for a parameter whose default is None
    means "the preset's default" (``clients-per-round 0`` = all clients,
    ``group-max-clusters 0`` = S + 4, ``aggregator ""`` = the preset's own).
    For the :data:`UCB_PRESETS`, ``clients-per-round 0`` gives
    :func:`default_ucb_clients` of the settings' ``num_clients`` and number of
    ``tasks``.

    Raises ValueError for a setting that only other presets take, set to a value
    other than its default (``defaults``): it would be silently dropped."""
    params = PRESET_PARAMETERS[name]
    mine = set(preset_settings(name, values))
    for field, value in values.items():
        users = presets_taking(field)
        if users and field not in mine and value != defaults.get(field, value):
            raise ValueError(
                f"{field.replace('_', '-')}={value!r} is not used by strategy {name!r} "
                f"(strategies that use it: {', '.join(users)})"
            )
    out: dict[str, Any] = {}
    known = {**defaults, **values}
    for field in preset_settings(name, values):
        param = params[SETTING_PARAMETER.get(field, field)]
        value = values[field]
        if (field == "clients_per_round" and name in UCB_PRESETS and value == 0
                and "num_clients" in known and "tasks" in known):
            models = [t for t in str(known["tasks"]).split(",") if t.strip()]
            value = default_ucb_clients(known["num_clients"], len(models))
        if param.default is None and value in (0, ""):
            continue
        out[param.name] = value
    return out


def make_strategy(name: str, **kwargs: Any) -> MultiModelStrategy:
    """Build a preset by name; unknown names raise a ValueError listing the choices."""
    if name not in PRESETS:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name](**kwargs)


def upload_budget(
    settings: Settings, federation: Federation | None = None
) -> tuple[float, int, int, int]:
    """``(m, V, N, M)`` of a budgeted run: the expected uploads per round ``m``,
    computed as the policies compute it (:func:`~mmfl_flwr.core.policy.resolve_budget`
    of ``budget_fraction`` and ``V``), the total processors ``V`` of the clients
    holding a task, the clients ``N`` and the models ``M`` (once every client and
    model has arrived). ``federation`` defaults to the run's
    (:func:`~mmfl_flwr.flower_app.data.federation_for`, which loads its data)."""
    from mmfl_flwr.core.policy import resolve_budget

    if federation is None:
        from mmfl_flwr.flower_app.data import federation_for

        federation = federation_for(settings)
    holds = sum(federation.eligible[t].astype(int) for t in federation.tasks) > 0
    v = int(federation.processors[holds].sum())
    m = resolve_budget(None, settings.budget_fraction, v)
    return m, v, int(federation.num_clients), len(federation.tasks)


def auto_budget_fraction(settings: Settings, federation: Federation | None = None) -> float:
    """``budget-fraction 0`` (auto): the smallest hundredth ``f`` with ``f x V``
    at least :data:`~mmfl_flwr.config.MIN_UPLOADS_PER_MODEL` expected uploads
    per model and round, at most 1."""
    _, v, _, models = upload_budget(dataclasses.replace(settings, budget_fraction=1.0),
                                    federation)
    if v == 0:
        return 1.0
    return min(1.0, -(-100 * MIN_UPLOADS_PER_MODEL * models // v) / 100)


def resolved_budget(settings: Settings, federation: Federation | None = None) -> Settings:
    """``settings`` with ``budget_fraction`` 0 (auto) replaced by
    :func:`auto_budget_fraction` (the same settings otherwise, and for the presets
    without a budget)."""
    if settings.budget_fraction or settings.strategy not in presets_taking("budget_fraction"):
        return settings
    return dataclasses.replace(settings,
                               budget_fraction=auto_budget_fraction(settings, federation))


def budget_warning(settings: Settings, federation: Federation | None = None) -> str | None:
    """The warning for a budgeted preset whose ``budget_fraction`` expects fewer
    than :data:`~mmfl_flwr.config.MIN_UPLOADS_PER_MODEL` uploads per model and
    round (None otherwise, and for the presets without a budget). It states
    ``m``, ``V``, the clients and models, and the smallest budget-fraction (in
    hundredths) that gives that many."""
    if settings.strategy not in presets_taking("budget_fraction"):
        return None
    settings = resolved_budget(settings, federation)
    m, v, n, models = upload_budget(settings, federation)
    if v == 0 or m / models >= MIN_UPLOADS_PER_MODEL - 1e-9:  # (float error of fraction x V)
        return None
    need = MIN_UPLOADS_PER_MODEL * models
    what = (
        f"strategy {settings.strategy}: budget-fraction={settings.budget_fraction:g} gives "
        f"m = {settings.budget_fraction:g} x V = {m:g} expected uploads per round (V = {v} "
        f"processors of {n} clients) for {models} model{'s' if models > 1 else ''}, "
        f"{m / models:.2g} per model, fewer than {MIN_UPLOADS_PER_MODEL}; with so few "
        "uploads a model may not learn at all"
    )
    if need > v:
        return (f"{what}. Even --budget-fraction 1 (run-config budget-fraction=1) gives only "
                f"{v / models:.2g} per model: use it with more clients (num-clients) or "
                "fewer models")
    fraction = -(-100 * need // v) / 100  # the smallest hundredth with fraction * V >= need
    return (f"{what}. Use --budget-fraction {fraction:g} or more (run-config budget-fraction="
            f"{fraction:g}: m = {fraction * v:g}, {fraction * v / models:.3g} per model)")


def warn_if_few_uploads(
    settings: Settings, federation: Federation | None = None
) -> str | None:
    """Log :func:`budget_warning` with Flower's logger (WARNING), once per call;
    returns it. The ServerApp calls it once, before the first round."""
    message = budget_warning(settings, federation)
    if message:
        log(WARNING, message)
    return message
