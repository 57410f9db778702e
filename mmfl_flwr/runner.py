"""Run an MMFL job on an engine: Flower's simulation engine, the in-process one or
the vectorised one.

All engines run the same ServerApp code (:func:`server_main`), the same strategy
and the same message protocol; only the Grid differs (Flower's Ray-backed
simulation, or :class:`~mmfl_flwr.grid.InProcessGrid` with one node per client
(the in-process engine, the reference) or one node hosting every client, whose
ClientApp computes a round trip's replies per model for all clients at once
(the vectorized engine).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

from flwr.app import Context, RecordDict

from mmfl_flwr.config import Settings
from mmfl_flwr.engine_options import ENGINES, EngineOptions
from mmfl_flwr.strategy import MultiModelResult, MultiModelStrategy
from mmfl_flwr.tracking import RunLogger


def node_configs(settings: Settings, engine: str = "inprocess") -> list[dict[str, Any]]:
    """The node configs of the simulated federation: ``ceil(N / K)`` nodes with
    ``partition-id`` p hosting clients ``p K`` to ``p K + K - 1``, as Flower's
    simulation engine numbers its virtual nodes (K = ``clients_per_node``;
    ``auto`` is 1, one node per client, on the in-process engine and N, one node
    for every client, on the vectorized one)."""
    from mmfl_flwr.nodes import NodeLayout

    layout = NodeLayout.for_engine(settings.num_clients, settings.clients_per_node_count(), engine)
    return layout.node_configs()


def run_inprocess(
    settings: Settings,
    strategy: MultiModelStrategy | None = None,
    wrap_client_app: Callable[[Any], Any] | None = None,
    client_hook: Callable[[Any], Any] | None = None,
    loggers: Sequence[RunLogger] = (),
) -> MultiModelResult:
    """Run on :class:`~mmfl_flwr.grid.InProcessGrid` (no Ray, no SuperLink), one
    node per client (with ``clients_per_node`` K > 1: ``ceil(N / K)`` shard nodes),
    torch on one thread (what the simulation engine gives each ClientApp).

    ``strategy`` replaces the preset named by the settings (for custom pairings
    of policy and aggregator on the embedded tasks); ``wrap_client_app(app)``
    replaces the ClientApp callable (fault injection, hostile clients:
    :mod:`mmfl_flwr.testing.hostile`); ``client_hook(spec)`` returns the
    :class:`~mmfl_flwr.client.app.ClientSpec` a client runs with, given the one
    built from the settings (poisoned data:
    :func:`~mmfl_flwr.testing.hostile.label_flipping`); ``loggers``: your
    :class:`~mmfl_flwr.tracking.RunLogger` objects, called besides the
    trackers of ``settings.log_to``."""
    return _run_on_inprocess_grid(
        settings, "inprocess", strategy, wrap_client_app, client_hook, None, "auto", loggers
    )


def run_vectorized(
    settings: Settings,
    strategy: MultiModelStrategy | None = None,
    chunk: int | None = None,
    threads: str | int = "auto",
    wrap_client_app: Callable[[Any], Any] | None = None,
    client_hook: Callable[[Any], Any] | None = None,
    loggers: Sequence[RunLogger] = (),
) -> MultiModelResult:
    """Run on one in-process node that hosts every client (``clients_per_node``
    K: ``ceil(N / K)`` nodes), whose ClientApp computes each round trip per model
    for all its clients at once (:class:`~mmfl_flwr.client.shard.ShardComputer`:
    ``torch.func``; CUDA when available or ``MMFL_DEVICE``): the shard code of
    Flower's engines without a transport. ``chunk`` bounds the clients trained
    in one batched call. ``threads``: torch's threads, ``"auto"`` the cores
    other processes leave free, checked before every round trip
    (:class:`~mmfl_flwr.client.threads.CoreWatch`; at most ``OMP_NUM_THREADS``
    where it is set), or a number. ``strategy``, ``wrap_client_app``,
    ``client_hook`` and ``loggers`` as in :func:`run_inprocess`."""
    return _run_on_inprocess_grid(
        settings, "vectorized", strategy, wrap_client_app, client_hook, chunk, threads, loggers
    )


def _run_on_inprocess_grid(
    settings: Settings,
    engine: str,
    strategy: MultiModelStrategy | None,
    wrap_client_app: Callable[[Any], Any] | None,
    client_hook: Callable[[Any], Any] | None,
    chunk: int | None,
    threads: str | int,
    loggers: Sequence[RunLogger] = (),
) -> MultiModelResult:
    """The in-process engines' one path: the nodes of ``engine``'s
    :class:`~mmfl_flwr.nodes.NodeLayout` on an :class:`~mmfl_flwr.grid.InProcessGrid`,
    the ClientApp of :func:`~mmfl_flwr.flower_app.client_app.build_client_app`, and
    the ServerApp's :func:`~mmfl_flwr.flower_app.server_app.server_main`."""
    from mmfl_flwr.client.threads import apply_engine_threads
    from mmfl_flwr.flower_app.client_app import build_client_app
    from mmfl_flwr.flower_app.data import federation_for
    from mmfl_flwr.flower_app.server_app import server_main
    from mmfl_flwr.grid import InProcessGrid

    apply_engine_threads(engine, threads)
    federation_for(settings)  # the whole federation: the server and every node share it
    run_config = settings.to_run_config()
    app = build_client_app(settings, client_hook, chunk=chunk, threads=threads)
    grid = InProcessGrid(
        wrap_client_app(app) if wrap_client_app else app,
        node_configs(settings, engine),
        run_config,
        seed=settings.seed,
    )
    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    return server_main(grid, ctx, settings, strategy, engine=engine, loggers=loggers)


def run_simulation_engine(
    settings: Settings,
    num_cpus: int | None = None,
    verbose: bool = False,
    **ray: Any,
) -> MultiModelResult:
    """Run on Flower's Ray-backed simulation runtime the way ``flwr run`` does:
    a private SuperLink with ``--simulation`` and ``ceil(N / K)`` virtual
    SuperNodes, each hosting ``clients_per_node`` = K clients (``auto``: one
    node per CPU Ray sees; :mod:`mmfl_flwr.flower_app.launch`). The result
    is read back from the run's checkpoint in its output folder (a temporary
    one when ``output_dir`` is empty). Interrupted (KeyboardInterrupt), it
    leaves the output folder as the in-process engines do
    (:func:`~mmfl_flwr.flower_app.run_files.files_after_a_stop`)."""
    from mmfl_flwr.checkpoint import CHECKPOINT_FILE, load_checkpoint
    from mmfl_flwr.flower_app.launch import run_on_superlink
    from mmfl_flwr.flower_app.run_files import files_after_a_stop
    from mmfl_flwr.records import numpy_to_arrays

    try:
        out = run_on_superlink(settings, num_cpus=num_cpus, verbose=verbose, **ray)
    except KeyboardInterrupt:  # the processes are ended, the ServerApp's never saw it
        files_after_a_stop(settings)
        raise
    state = load_checkpoint(out / CHECKPOINT_FILE)
    from mmfl_flwr.strategy.events import DefenceLog

    defence = DefenceLog()
    defence.load_state_dict(state.get("defence", {}))
    result = MultiModelResult(
        arrays={t: numpy_to_arrays(w) for t, w in state["weights"].items()},
        history=list(state["history"]),
        assignments=dict(state["assignments"]),
        events=defence.events,
        received=defence.received,
    )
    if not settings.output_dir:
        shutil.rmtree(out.parent, ignore_errors=True)
    return result


def run(
    settings: Settings,
    engine: str = "simulation",
    num_cpus: int | None = None,
    verbose: bool = False,
    vector_chunk: int | None = None,
    num_gpus_per_client: float | None = None,
    ray_address: str | None = None,
    num_gpus_per_node: float | None = None,
    threads: str | int | None = None,
    loggers: Sequence[RunLogger | str] | None = None,
) -> MultiModelResult:
    """Run ``settings`` on ``engine`` (``simulation``, ``inprocess`` or
    ``vectorized``; ``vector_chunk``: clients per batched training call of the
    vectorised engine, default sized from free memory; ``threads``: its torch
    threads, default ``"auto"``, the cores other processes leave free). An
    output folder that cannot be written (a file, no permission, a read-only
    file system) is a ValueError before any data is loaded or engine started.

    ``loggers``: trackers by name (``"tensorboard"``, ``"mlflow"``,
    ``"wandb"``, added to ``settings.log_to``; every engine) and your own
    :class:`~mmfl_flwr.tracking.RunLogger` objects (the in-process engines:
    the simulation engine's ServerApp runs in another process). A tracker whose
    package is missing is a ValueError naming the ``pip install`` to run,
    before the run starts."""
    from mmfl_flwr.flower_app.server_app import check_output_location
    from mmfl_flwr.tracking import check_installed, parse_log_to

    names = [lg for lg in loggers or () if isinstance(lg, str)]
    objects = [lg for lg in loggers or () if not isinstance(lg, str)]
    if names:
        settings = dataclasses.replace(
            settings, log_to=",".join(parse_log_to(",".join([settings.log_to, *names])))
        )
    settings.validate()
    check_output_location(settings.output_dir)
    check_installed(parse_log_to(settings.log_to))
    for lg in objects:
        if not isinstance(lg, RunLogger):
            raise ValueError(
                f"loggers: {lg!r} is neither a tracker name nor a mmfl_flwr.tracking.RunLogger"
            )
    if objects and engine == "simulation":
        raise ValueError(
            "loggers: RunLogger objects run in this process; the simulation engine's "
            "ServerApp runs in another one. Use engine='inprocess' or 'vectorized', or "
            "name the built-in trackers (log-to)"
        )
    options = EngineOptions(
        engine, vector_chunk, threads, num_gpus_per_client, num_gpus_per_node, ray_address
    )
    options.check()
    ray: dict[str, Any] = options.ray_options()
    if engine == "simulation":
        return run_simulation_engine(settings, num_cpus=num_cpus, verbose=verbose, **ray)
    if engine in ("inprocess", "vectorized"):
        from mmfl_flwr.flower_app.server_app import VERBOSE_ENV

        flwr_logger = logging.getLogger("flwr")
        old_level = flwr_logger.level
        old_verbose = os.environ.get(VERBOSE_ENV)
        if not verbose:
            flwr_logger.setLevel(logging.WARNING)
        else:  # every defence action's line at INFO (the console shows INFO)
            os.environ[VERBOSE_ENV] = "1"
        try:
            if engine == "vectorized":
                return run_vectorized(
                    settings,
                    chunk=vector_chunk,
                    threads="auto" if threads is None else threads,
                    loggers=objects,
                )
            return run_inprocess(settings, loggers=objects)
        finally:
            flwr_logger.setLevel(old_level)
            if verbose:
                if old_verbose is None:
                    os.environ.pop(VERBOSE_ENV, None)
                else:
                    os.environ[VERBOSE_ENV] = old_verbose
    raise ValueError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
