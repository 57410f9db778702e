"""ClientApp of the Flower App: the embedded default tasks, one trainer per task.

A node's identity and resources come from its ``node_config``:

- ``partition-id`` (int, required): which client of the federation this node is;
  Flower's simulation engine sets it, a SuperNode gets it from ``--node-config``;
- ``client-id`` (str, optional): stable id reported to the server (default: the
  partition id);
- ``processors`` (int, optional): ``B_i``, overriding the federation's value;
- ``tasks`` (str, optional): comma-separated model names this node trains (a
  subset of the ones its partition holds data for);
- ``clients`` (str, optional): instead of ``partition-id``, the node hosts a shard
  of the federation's clients, e.g. ``"0-499"`` or ``"0,3,7"`` (their client ids
  are their partition ids; docs/protocol.md, multi-client nodes);
- with run config ``clients-per-node`` K > 1 (``auto``: ``ceil(num-clients /
  num-partitions)``), node ``partition-id`` p hosts clients ``p K`` to
  ``p K + K - 1``: this is how Flower's simulation engine runs shard nodes;
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
from mmfl_flwr.nodes import NodeLayout
from mmfl_flwr.tasks.registry import get_task, load_snapshot, registered_tasks, restore

CLIENT_TOKEN = P.CLIENT_TOKEN


def client_token(node_config: Mapping[str, Any]) -> str | None:
    """This node's ``client-token`` (None when the node config has none)."""
    token = node_config.get(CLIENT_TOKEN)
    return None if token is None or str(token) == "" else str(token)


def parse_clients(raw: object, num_clients: int) -> list[int]:
    """The partition ids of a node config ``clients`` value: ranges and ids
    separated by commas (``"0-499"``, ``"0,3,7"``, ``"0-9,20-29"``), each in
    ``[0, num_clients)``, none twice; a ValueError naming the value otherwise."""
    text = str(raw).strip()
    ids: list[int] = []
    try:
        for item in text.split(","):
            first, dash, last = item.strip().partition("-")
            lo, hi = int(first), int(last if dash else first)
            if hi < lo:
                raise ValueError
            if not (lo >= 0 and hi < num_clients):
                raise IndexError(hi if lo >= 0 else lo)
            ids.extend(range(lo, hi + 1))
    except ValueError:
        raise ValueError(
            f"node_config clients={text!r}: expected partition ids or ranges "
            "separated by commas, e.g. '0-499' or '0,3,7'"
        ) from None
    except IndexError as err:
        raise ValueError(
            f"node_config clients={text!r}: {err.args[0]} is outside the "
            f"federation of num-clients={num_clients}"
        ) from None
    if len(set(ids)) != len(ids):
        raise ValueError(f"node_config clients={text!r} names a client twice")
    return ids


def client_spec(
    context: Context, settings: Settings | None = None
) -> ClientSpec | list[ClientSpec]:
    """Build this node's :class:`ClientSpec` from its node config and the settings;
    with ``clients`` in the node config (``"0-499"``), the node hosts that shard of
    the federation's clients: one ClientSpec per partition id."""
    s = settings if settings is not None else Settings.from_run_config(context.run_config)
    cfg = context.node_config
    if "clients" in cfg:
        for key in ("partition-id", "client-id", CLIENT_TOKEN):
            if key in cfg:
                raise ValueError(
                    f"node_config has both 'clients' and {key!r}: a node hosting "
                    "a shard names its clients by 'clients' only (their ids are "
                    "their partition ids; pin them with key pins)"
                )
        ids = parse_clients(cfg["clients"], s.num_clients)
        fed = federation_for(s, clients=ids, server_tests=False)  # this shard's data only
        return [_one_client(s, fed, pid, cfg, str(pid), None) for pid in ids]
    if "partition-id" not in cfg:
        raise ValueError(
            "node_config has no 'partition-id'; start the SuperNode with "
            '--node-config "partition-id=<i> num-partitions=<N>"'
        )
    pid = int(cfg["partition-id"])
    k = clients_per_node(s, cfg)
    if k > 1:
        return _partition_shard(s, cfg, pid, k)
    if not 0 <= pid < s.num_clients:
        raise ValueError(
            f"partition-id={pid} is outside the federation of num-clients={s.num_clients} "
            "(set --run-config num-clients to the number of partitions)"
        )
    return _one_client(
        s, federation_for(s), pid, cfg, str(cfg.get("client-id", pid)), client_token(cfg)
    )


def clients_per_node(s: Settings, node_config: Mapping[str, Any]) -> int:
    """How many clients a node with a ``partition-id`` hosts: the run config's
    ``clients-per-node``; with ``auto``, ``ceil(num-clients / num-partitions)``
    from the node config (Flower's simulation engine sets ``num-partitions`` to
    its number of virtual nodes), 1 without ``num-partitions``."""
    return NodeLayout.for_node(s.num_clients, s.clients_per_node_count(), node_config).per_node


def _partition_shard(s: Settings, cfg: Mapping[str, Any], pid: int, k: int) -> list[ClientSpec]:
    """The clients of node ``partition-id`` = ``pid`` when each node hosts ``k``:
    ``pid k`` to ``pid k + k - 1`` (the last node the rest)."""
    for key in ("client-id", CLIENT_TOKEN):
        if key in cfg:
            raise ValueError(
                f"node_config has {key!r}, but partition-id={pid} hosts "
                f"{k} clients (clients-per-node): their ids are their "
                "partition ids; pin them with key pins"
            )
    ids = NodeLayout(s.num_clients, k).clients_of(pid)
    fed = federation_for(s, clients=ids, server_tests=False)  # this shard's data only
    return [_one_client(s, fed, q, cfg, str(q), None) for q in ids]


#: task kind -> (its registered definition, its model builder)
_MODEL_FNS: dict[str, tuple[Any, Callable[[], Any]]] = {}


def _model_fn(kind: str) -> Callable[[], Any]:
    """The model builder of a task kind, one per process and registration: the
    clients of a shard share it (and the model built once to learn its dtype
    and trainable keys); a kind registered again gets a new one."""
    from mmfl_flwr.tasks.models import make_model

    definition = get_task(kind)
    known = _MODEL_FNS.get(kind)
    if known is None or known[0] is not definition:

        def model_fn(k: str = kind) -> Any:
            return make_model(k)

        known = _MODEL_FNS[kind] = (definition, model_fn)
    return known[1]


def _one_client(
    s: Settings, fed: Any, pid: int, cfg: Mapping[str, Any], cid: str, token: str | None
) -> ClientSpec:
    """The ClientSpec of partition ``pid`` (node-config ``tasks`` and
    ``processors`` apply to every client of the node)."""
    from mmfl_flwr.client.trainer import TorchTrainer

    tasks = fed.client_tasks(pid)
    if "tasks" in cfg:
        declared = [t.strip() for t in str(cfg["tasks"]).split(",") if t.strip()]
        unknown = [t for t in declared if t not in fed.tasks]
        if unknown:
            raise ValueError(
                f"node_config tasks {unknown} are not models of this run ({', '.join(fed.tasks)})"
            )
        tasks = [t for t in tasks if t in declared]
    trainers = {}
    for task in tasks:
        train, test = fed.client_data(pid, task)
        kind = fed.kinds[task]
        definition = get_task(kind)
        model_fn = _model_fn(kind)
        if definition is not None and definition.trainer_fn is not None:
            trainers[task] = definition.trainer_fn(model_fn, train, test, s.batch_size)
        else:
            trainers[task] = TorchTrainer(model_fn, train, test, s.batch_size)
    processors = int(cfg.get("processors", int(fed.processors[pid])))
    return ClientSpec(client_id=cid, trainers=trainers, processors=processors, client_token=token)


def node_spec_fn(
    settings: Settings | None = None,
) -> Callable[[Context], ClientSpec | list[ClientSpec]]:
    """``context -> ClientSpec`` of the embedded tasks (not cached).

    The user tasks registered in this process travel with it (a snapshot of the
    registry), so simulated clients in other processes know them too.
    """
    snapshot = registered_tasks()

    def spec(ctx: Context) -> ClientSpec | list[ClientSpec]:
        restore(snapshot)
        load_snapshot(ctx.run_config)  # tasks registered by the process that started the run
        return client_spec(ctx, settings)

    return spec


def build_client_app(
    settings: Settings | None = None,
    client_hook: Callable[[ClientSpec], ClientSpec] | None = None,
    chunk: int | None = None,
    threads: str | int = "auto",
) -> ClientApp:
    """The ClientApp; with ``settings`` given, ``run_config`` is not read.

    The user tasks registered in this process travel with the app (a snapshot
    of the registry), so simulated clients in other processes know them too.
    The node's ``client-token`` (node config) goes into its info reply. A node
    hosting a shard computes it with the cores other processes leave free, at
    most the CPUs its worker was given (``threads="auto"``). ``client_hook(spec)``
    gives the ClientSpec each client runs with, from the one built here
    (poisoned data in tests: :func:`mmfl_flwr.testing.hostile.label_flipping`).
    ``chunk`` and ``threads``: :func:`~mmfl_flwr.client.app.make_client_app`'s.
    """
    specs = node_spec_fn(settings)
    if client_hook is None:
        return make_client_app(specs, chunk=chunk, threads=threads)

    def hooked(ctx: Context) -> ClientSpec | list[ClientSpec]:
        got = specs(ctx)
        return [client_hook(c) for c in got] if isinstance(got, list) else client_hook(got)

    return make_client_app(hooked, chunk=chunk, threads=threads)


app = build_client_app()
