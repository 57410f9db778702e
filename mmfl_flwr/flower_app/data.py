"""The federation a run's settings describe, built once per process and shared by
the ServerApp (initial weights, server-side test sets), the ClientApp (each
node's data) and the CLI (which loads the data before writing anything), each
building only the part it needs where it runs alone (a shard node its clients'
data, the server the test sets); and the
upload budget computed from it (``budget-fraction`` 0 = auto, the warning for a
budget that leaves a model too few uploads)."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable
from logging import WARNING
from typing import Any

from flwr.common.logger import log

from mmfl_flwr.config import Settings
from mmfl_flwr.core.card import presets_taking
from mmfl_flwr.core.policy import MIN_UPLOADS_PER_MODEL
from mmfl_flwr.tasks.federation import Federation, build_federation
from mmfl_flwr.tasks.registry import get_task

#: settings key -> {part: federation}; part None is the whole federation, else
#: (the clients whose data is built, whether the server test sets are)
_FEDERATIONS: OrderedDict[tuple[Any, ...], dict[Any, Federation]] = OrderedDict()
#: federations of this many settings are kept (the least recently used go first)
_KEEP = 8


def federation_for(
    settings: Settings, clients: Iterable[int] | None = None, server_tests: bool = True
) -> Federation:
    """The (cached) federation described by ``settings`` (with ``download``, the
    missing real datasets are fetched first).

    ``clients`` and ``server_tests`` say what this process needs (see
    :func:`~mmfl_flwr.tasks.federation.build_federation`): a node hosting a
    shard asks for its clients without the test sets, the server for none of
    the clients' data (``clients=()``) with the test sets. Where the whole
    federation is already built in this process (the in-process engines build
    it first), it serves every request. Of the shards' parts, the last one
    built is kept (the ClientApp keeps each node's clients, and so their data,
    once built)."""
    if settings.download:
        from mmfl_flwr.tasks.real import download_datasets

        download_datasets(list(settings.task_kinds), settings.data_root)
    key = (
        tuple(settings.task_kinds),
        settings.num_clients,
        settings.data_seed_used,
        settings.labels_per_client,
        settings.synthetic_max_samples,
        settings.profile,
        settings.data_root,
        # the registered definition of each kind (None for a built-in one):
        # re-registering a user task with replace=True must not serve the old
        # task's data
        tuple(get_task(k) for k in settings.task_kinds),
    )
    part = None
    if clients is not None:
        ids = frozenset(int(k) for k in clients)
        if len(ids) < settings.num_clients or not server_tests:
            part = (ids, bool(server_tests))
    variants = _FEDERATIONS.get(key)
    if variants is not None:
        _FEDERATIONS.move_to_end(key)
        if None in variants:
            return variants[None]
        if part in variants:
            return variants[part]
    else:
        variants = _FEDERATIONS[key] = {}
        while len(_FEDERATIONS) > _KEEP:
            _FEDERATIONS.popitem(last=False)
    if part is not None and part[0]:  # one shard's part at a time
        for other in [p for p in variants if p is not None and p[0]]:
            del variants[other]
    fed = build_federation(
        list(key[0]),
        key[1],
        key[2],
        labels_per_client=key[3],
        max_synthetic_samples=key[4] or None,
        profile=key[5],
        data_root=key[6],
        clients=None if part is None else part[0],
        server_tests=True if part is None else part[1],
    )
    if part is None:
        variants.clear()  # the whole federation serves every request from now on
    variants[part] = fed
    return fed


def upload_budget(
    settings: Settings, federation: Federation | None = None
) -> tuple[float, int, int, int]:
    """``(m, V, N, M)`` of a budgeted run: the expected uploads per round ``m``,
    computed as the policies compute it (:func:`~mmfl_flwr.core.policy.resolve_budget`
    of ``budget_fraction`` and ``V``), the total processors ``V`` of the clients
    holding a task, the clients ``N`` and the models ``M`` (once every client and
    model has arrived). ``federation`` defaults to the run's
    (:func:`federation_for`, which loads its data)."""
    from mmfl_flwr.core.policy import resolve_budget

    if federation is None:
        federation = federation_for(settings, clients=(), server_tests=True)
    holds = sum(federation.eligible[t].astype(int) for t in federation.tasks) > 0
    v = int(federation.processors[holds].sum())
    m = resolve_budget(None, settings.budget_fraction, v)
    return m, v, int(federation.num_clients), len(federation.tasks)


def auto_budget_fraction(settings: Settings, federation: Federation | None = None) -> float:
    """``budget-fraction 0`` (auto): the smallest hundredth ``f`` with ``f x V``
    at least :data:`~mmfl_flwr.core.policy.MIN_UPLOADS_PER_MODEL` expected uploads
    per model and round, at most 1."""
    _, v, _, models = upload_budget(dataclasses.replace(settings, budget_fraction=1.0), federation)
    if v == 0:
        return 1.0
    return min(1.0, -(-100 * MIN_UPLOADS_PER_MODEL * models // v) / 100)


def resolved_budget(settings: Settings, federation: Federation | None = None) -> Settings:
    """``settings`` with ``budget_fraction`` 0 (auto) replaced by
    :func:`auto_budget_fraction` (the same settings otherwise, and for the presets
    without a budget)."""
    if settings.budget_fraction or settings.strategy not in presets_taking("budget_fraction"):
        return settings
    return dataclasses.replace(settings, budget_fraction=auto_budget_fraction(settings, federation))


def effective_settings(settings: Settings, federation: Federation | None = None) -> dict[str, Any]:
    """The value the run uses for every automatic setting of its preset, by
    run-config key: each card parameter left at its "automatic" value (``0``):
    ``budget-fraction`` as :func:`resolved_budget` resolves it, values an
    ``auto`` rule computes (the UCB presets' ``clients-per-round``) as numbers,
    and the others by what 0 means for the preset (``"all clients"``,
    ``"2 x the picks per model"``, ...). Written to ``config.json`` and
    ``summary.json`` next to the typed values, and shown in the plot's title."""
    from mmfl_flwr.core.card import card

    try:
        algorithm = card(settings.strategy)
    except (KeyError, ValueError):
        return {}
    values = dataclasses.asdict(settings)
    out: dict[str, Any] = {}
    for p in algorithm.parameters:
        if p.unset is None or values.get(p.field) != p.unset:
            continue
        if p.field == "budget_fraction":
            out[p.key] = resolved_budget(settings, federation).budget_fraction
        elif p.auto is not None:
            out[p.key] = p.auto(values)
        elif p.zero:
            out[p.key] = p.zero
    return out


def budget_warning(settings: Settings, federation: Federation | None = None) -> str | None:
    """The warning for a budgeted preset whose ``budget_fraction`` expects fewer
    than :data:`~mmfl_flwr.core.policy.MIN_UPLOADS_PER_MODEL` uploads per model and
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
        return (
            f"{what}. Even --budget-fraction 1 (run-config budget-fraction=1) gives only "
            f"{v / models:.2g} per model: use it with more clients (num-clients) or "
            "fewer models"
        )
    fraction = -(-100 * need // v) / 100  # the smallest hundredth with fraction * V >= need
    return (
        f"{what}. Use --budget-fraction {fraction:g} or more (run-config budget-fraction="
        f"{fraction:g}: m = {fraction * v:g}, {fraction * v / models:.3g} per model)"
    )


def warn_if_few_uploads(settings: Settings, federation: Federation | None = None) -> str | None:
    """Log :func:`budget_warning` with Flower's logger (WARNING), once per call;
    returns it. The ServerApp calls it once, before the first round."""
    message = budget_warning(settings, federation)
    if message:
        log(WARNING, message)
    return message
