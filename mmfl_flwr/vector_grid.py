"""VectorizedGrid: the vectorized engine's transport, one in-process node hosting
every client.

The strategy and the message protocol are those of every engine. The Grid
holds a single node that hosts all clients of the federation (a multi-client
node, docs/protocol.md), so the server sends one message per round trip, and
the node's ClientApp (:func:`~mmfl_flwr.client.app.make_client_app`) answers it
with :class:`~mmfl_flwr.client.shard.ShardComputer`: per model, one batched
computation for every client that holds it (:mod:`mmfl_flwr.client.vectorized`).
That is the same code a shard node runs under Flower's simulation engine or on a
SuperNode (``clients="0-499"``); here it has no transport but a copy in memory.

What cannot be vectorised takes the per-client path on the same node in the
same round, with one log line per reason: a task whose trainer does not
implement :class:`~mmfl_flwr.client.contract.VectorizableTrainer`, SCAFFOLD's
corrected training and every other message type (``query.info``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flwr.app import Context, RecordDict
from flwr.clientapp import ClientApp

from mmfl_flwr.client.app import ClientSpec, SpecFn, cache_specs, make_client_app
from mmfl_flwr.grid import InProcessGrid

__all__ = ["VectorizedGrid"]


class VectorizedGrid(InProcessGrid):
    """An :class:`~mmfl_flwr.grid.InProcessGrid` with one node that hosts the
    clients of ``node_configs`` (one ClientSpec each, from ``spec_fn``) and
    answers every round trip with the batched shard ClientApp.

    Parameters
    ----------
    spec_fn : callable
        ``spec_fn(context) -> ClientSpec`` of one client, called once per entry
        of ``node_configs`` with that node config.
    node_configs : sequence of mappings
        One node config per client (e.g. ``{"partition-id": i, ...}``).
    run_config, seed, run_id
        As :class:`~mmfl_flwr.grid.InProcessGrid`.
    chunk : int, optional
        Clients per batched training call (default: sized from free memory on a
        GPU, 64 on the CPU).
    """

    def __init__(
        self,
        spec_fn: SpecFn,
        node_configs: Iterable[Mapping[str, Any]],
        run_config: Mapping[str, Any] | None = None,
        seed: int = 0,
        run_id: int = 1,
        chunk: int | None = None,
    ) -> None:
        if isinstance(spec_fn, ClientApp) or not callable(spec_fn):
            raise TypeError(
                "VectorizedGrid(spec_fn, node_configs, ...) takes the clients' "
                "spec function, not a ClientApp: the node's ClientApp is built "
                "from it (make_client_app with a list of specs)"
            )
        configs = [dict(c) for c in node_configs]

        def shard(ctx: Context) -> list[ClientSpec]:
            specs = []
            for cfg in configs:
                spec = spec_fn(
                    Context(
                        run_id=ctx.run_id,
                        node_id=ctx.node_id,
                        node_config=dict(cfg),
                        state=RecordDict(),
                        run_config=dict(ctx.run_config),
                    )
                )
                if not isinstance(spec, ClientSpec):
                    raise TypeError(
                        "VectorizedGrid's spec_fn returns one ClientSpec per "
                        f"node config, got {type(spec).__name__}"
                    )
                specs.append(spec)
            return specs

        self.spec_fn = cache_specs(shard)
        app = make_client_app(self.spec_fn, cached=True, chunk=chunk)
        super().__init__(
            app, [{"clients": f"0-{len(configs) - 1}"}], run_config, seed=seed, run_id=run_id
        )

    @property
    def counts(self) -> dict[str, int]:
        """Client parts served in batches and on the per-client path."""
        return self.client_app.shard().counts  # type: ignore[attr-defined]
