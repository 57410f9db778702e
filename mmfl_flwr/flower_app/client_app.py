"""ClientApp of the Flower App: the embedded default tasks, one trainer per task.

A node's identity and resources come from its ``node_config``:

- ``partition-id`` (int, required): which client of the federation this node is;
  Flower's simulation engine sets it, a SuperNode gets it from ``--node-config``;
- ``client-id`` (str, optional): stable id reported to the server (default: the
  partition id);
- ``processors`` (int, optional): ``B_i``, overriding the federation's value;
- ``tasks`` (str, optional): comma-separated model names this node trains (a
  subset of the ones its partition holds data for);
- ``client-token`` (str, optional): a secret proving the client id, sent in the
  info reply under ``client-token``; the server checks it against its pin of
  the id (``token:<sha256 hex>``, see :mod:`mmfl_flwr.strategy.registration`).
  Keep it off the command line: ``--node-config node.toml``, a file readable by
  the SuperNode only, holding e.g. ``client-id = "3"`` and
  ``client-token = "..."``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import Context
from flwr.clientapp import ClientApp

from mmfl_flwr import protocol as P
from mmfl_flwr.client.app import ClientSpec, make_client_app
from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app.data import federation_for
from mmfl_flwr.tasks.registry import get_task, load_snapshot, registered_tasks, restore

CLIENT_TOKEN = P.CLIENT_TOKEN


def client_token(node_config: Mapping[str, Any]) -> str | None:
    """This node's ``client-token`` (None when the node config has none)."""
    token = node_config.get(CLIENT_TOKEN)
    return None if token is None or str(token) == "" else str(token)


def client_spec(context: Context, settings: Settings | None = None) -> ClientSpec:
    """Build this node's :class:`ClientSpec` from its node config and the settings."""
    from mmfl_flwr.client.trainer import TorchTrainer
    from mmfl_flwr.tasks.models import make_model

    s = settings if settings is not None else Settings.from_run_config(context.run_config)
    cfg = context.node_config
    if "partition-id" not in cfg:
        raise ValueError(
            "node_config has no 'partition-id'; start the SuperNode with "
            "--node-config \"partition-id=<i> num-partitions=<N>\""
        )
    pid = int(cfg["partition-id"])
    if not 0 <= pid < s.num_clients:
        raise ValueError(
            f"partition-id={pid} is outside the federation of num-clients={s.num_clients} "
            "(set --run-config num-clients to the number of partitions)"
        )
    fed = federation_for(s)
    tasks = fed.client_tasks(pid)
    if "tasks" in cfg:
        declared = [t.strip() for t in str(cfg["tasks"]).split(",") if t.strip()]
        unknown = [t for t in declared if t not in fed.tasks]
        if unknown:
            raise ValueError(
                f"node_config tasks {unknown} are not models of this run "
                f"({', '.join(fed.tasks)})"
            )
        tasks = [t for t in tasks if t in declared]
    trainers = {}
    for task in tasks:
        train, test = fed.client_data(pid, task)
        kind = fed.kinds[task]
        definition = get_task(kind)
        model_fn = lambda k=kind: make_model(k)  # noqa: E731
        if definition is not None and definition.trainer_fn is not None:
            trainers[task] = definition.trainer_fn(model_fn, train, test, s.batch_size)
        else:
            trainers[task] = TorchTrainer(model_fn, train, test, s.batch_size)
    processors = int(cfg.get("processors", int(fed.processors[pid])))
    return ClientSpec(
        client_id=str(cfg.get("client-id", pid)), trainers=trainers, processors=processors,
        client_token=client_token(cfg),
    )


def node_spec_fn(settings: Settings | None = None) -> Callable[[Context], ClientSpec]:
    """``context -> ClientSpec`` of the embedded tasks (not cached).

    The user tasks registered in this process travel with it (a snapshot of the
    registry), so simulated clients in other processes know them too.
    """
    snapshot = registered_tasks()

    def spec(ctx: Context) -> ClientSpec:
        restore(snapshot)
        load_snapshot(ctx.run_config)  # tasks registered by the process that started the run
        return client_spec(ctx, settings)

    return spec


def build_client_app(settings: Settings | None = None) -> ClientApp:
    """The ClientApp; with ``settings`` given, ``run_config`` is not read.

    The user tasks registered in this process travel with the app (a snapshot
    of the registry), so simulated clients in other processes know them too.
    The node's ``client-token`` (node config) goes into its info reply.
    """
    return make_client_app(node_spec_fn(settings))


app = build_client_app()
