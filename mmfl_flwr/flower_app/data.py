"""The federation a run's settings describe, built once per process and shared by
the ServerApp (initial weights, server-side test sets), the ClientApp (each
node's data) and the CLI (which loads the data before writing anything)."""

from __future__ import annotations

from functools import lru_cache

from mmfl_flwr.config import Settings
from mmfl_flwr.tasks.federation import Federation, build_federation
from mmfl_flwr.tasks.registry import TaskDefinition, get_task


@lru_cache(maxsize=8)
def _federation(
    kinds: tuple[str, ...],
    num_clients: int,
    seed: int,
    labels: float,
    max_synth: int,
    profile: str,
    data_root: str,
    definitions: tuple[TaskDefinition | None, ...],
) -> Federation:
    # ``definitions`` (the registered definition of each kind, None for a
    # built-in one) is part of the cache key only: re-registering a user task
    # with replace=True must not serve the old task's data.
    return build_federation(
        list(kinds),
        num_clients,
        seed,
        labels_per_client=labels,
        max_synthetic_samples=max_synth or None,
        profile=profile,
        data_root=data_root,
    )


def federation_for(settings: Settings) -> Federation:
    """The (cached) federation described by ``settings`` (with ``download``, the
    missing real datasets are fetched first)."""
    if settings.download:
        from mmfl_flwr.tasks.real import download_datasets

        download_datasets(list(settings.task_kinds), settings.data_root)
    return _federation(
        tuple(settings.task_kinds),
        settings.num_clients,
        settings.seed,
        settings.labels_per_client,
        settings.synthetic_max_samples,
        settings.profile,
        settings.data_root,
        tuple(get_task(k) for k in settings.task_kinds),
    )
