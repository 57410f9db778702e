"""Run an MMFL job on an engine: Flower's simulation engine or the in-process one.

Both engines run the same ServerApp code (:func:`server_main`) and the same
ClientApp; only the Grid differs (Flower's Ray-backed simulation vs
:class:`~mmfl_flwr.grid.InProcessGrid`).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

from flwr.app import Context, RecordDict

from mmfl_flwr.config import Settings
from mmfl_flwr.strategy import MultiModelResult, MultiModelStrategy

ENGINES = ("simulation", "inprocess")


def node_configs(settings: Settings) -> list[dict[str, Any]]:
    """The node configs of the simulated federation, one per client."""
    n = settings.num_clients
    return [{"partition-id": i, "num-partitions": n} for i in range(n)]


def _single_thread_torch() -> None:
    """Small models train fastest on one thread, and one thread per client is what
    the simulation engine gives each ClientApp (``num_cpus=1``)."""
    import torch

    torch.set_num_threads(1)


def run_inprocess(
    settings: Settings,
    strategy: MultiModelStrategy | None = None,
    wrap_client_app: Callable[[Any], Any] | None = None,
) -> MultiModelResult:
    """Run on :class:`~mmfl_flwr.grid.InProcessGrid` (no Ray, no SuperLink).

    ``strategy`` replaces the preset named by the settings (for custom pairings
    of policy and aggregator on the embedded tasks); ``wrap_client_app(app)``
    replaces the ClientApp callable (fault injection, hostile clients:
    :mod:`mmfl_flwr.testing.hostile`)."""
    from mmfl_flwr.flower_app.client_app import build_client_app
    from mmfl_flwr.flower_app.server_app import server_main
    from mmfl_flwr.grid import InProcessGrid

    _single_thread_torch()
    run_config = settings.to_run_config()
    app = build_client_app(settings)
    grid = InProcessGrid(
        wrap_client_app(app) if wrap_client_app else app, node_configs(settings), run_config,
        seed=settings.seed,
    )
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    return server_main(grid, ctx, settings, strategy)


def run_simulation_engine(
    settings: Settings, num_cpus: int | None = None, verbose: bool = False
) -> MultiModelResult:
    """Run on Flower's Ray-backed simulation engine, one virtual SuperNode per
    client, each ClientApp with one CPU."""
    from flwr.simulation import run_simulation

    from mmfl_flwr.flower_app.client_app import build_client_app
    from mmfl_flwr.flower_app.server_app import build_server_app

    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    holder: dict[str, Any] = {}
    cpus = num_cpus or os.cpu_count() or 1
    backend_config = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {
            "num_cpus": cpus,
            "logging_level": "ERROR",
            "log_to_driver": verbose,
        },
    }
    flwr_logger = logging.getLogger("flwr")
    old_level = flwr_logger.level
    if not verbose:
        flwr_logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_simulation(
                server_app=build_server_app(settings, holder),
                client_app=build_client_app(settings),
                num_supernodes=settings.num_clients,
                backend_config=backend_config,  # type: ignore[arg-type]
                verbose_logging=verbose,
            )
    finally:
        flwr_logger.setLevel(old_level)
    if "result" not in holder:
        raise RuntimeError(
            "the simulation ended without a result; run with --verbose to see "
            "Flower's and Ray's logs"
        )
    return holder["result"]  # type: ignore[no-any-return]


def run(
    settings: Settings, engine: str = "simulation", num_cpus: int | None = None,
    verbose: bool = False,
) -> MultiModelResult:
    """Run ``settings`` on ``engine`` (``simulation`` or ``inprocess``)."""
    settings.validate()
    if engine == "simulation":
        return run_simulation_engine(settings, num_cpus=num_cpus, verbose=verbose)
    if engine == "inprocess":
        flwr_logger = logging.getLogger("flwr")
        old_level = flwr_logger.level
        if not verbose:
            flwr_logger.setLevel(logging.WARNING)
        try:
            return run_inprocess(settings)
        finally:
            flwr_logger.setLevel(old_level)
    raise ValueError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
