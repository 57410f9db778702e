"""Seconds a shard node takes to answer one message of K clients (issue 24,
per-round cost at scale), without Flower's transport.

    python benchmarks/bench_shard_reply.py [--clients 50000] [--num-clients 100000]
        [--type query.losses|evaluate] [--repeats 3]

Builds the node's clients the way a simulation shard node does (LVR over
``synthetic,synthetic``, Synthetic(1,1) clients of at most 20 samples, the
clients ``0 .. K-1`` of a federation of ``--num-clients``), makes the message
the server sends such a node (the two models' weights once and one
``config@<id>`` per client) and times :meth:`ShardComputer.reply` on it,
``--repeats`` times (the first call also builds the batched model). Prints the
seconds of each reply, per client, and the process's resident size.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time


def _rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=50_000, help="clients of the node (K)")
    ap.add_argument("--num-clients", type=int, default=100_000, help="clients of the federation")
    ap.add_argument("--type", default="query.losses", choices=("query.losses", "evaluate"))
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    if not 1 <= a.clients <= a.num_clients:
        print(f"--clients must be in [1, --num-clients], got {a.clients}", file=sys.stderr)
        return 2
    if a.repeats < 1:
        print(f"--repeats must be >= 1, got {a.repeats}", file=sys.stderr)
        return 2

    import torch
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

    from mmfl_flwr import protocol as P
    from mmfl_flwr.client.shard import ShardComputer
    from mmfl_flwr.config import Settings
    from mmfl_flwr.flower_app.client_app import client_spec
    from mmfl_flwr.grid import ensure_task_identity
    from mmfl_flwr.records import numpy_to_arrays
    from mmfl_flwr.tasks.models import make_model

    s = Settings(
        strategy="lvr",
        tasks="synthetic,synthetic",
        num_clients=a.num_clients,
        synthetic_max_samples=20,
        local_epochs=1,
    )
    t0 = time.perf_counter()
    node_ctx = Context(
        run_id=1,
        node_id=1,
        node_config={"clients": f"0-{a.clients - 1}"},
        state=RecordDict(),
        run_config={},
    )
    specs = client_spec(node_ctx, s)  # what a SuperNode started with clients="0-(K-1)" builds
    built = time.perf_counter() - t0
    content = RecordDict()
    for task, kind in zip(s.model_names, s.task_kinds):
        with torch.random.fork_rng(devices=[]):
            model = make_model(kind)
        content[P.arrays_key(task)] = numpy_to_arrays(
            {k: v.detach().numpy() for k, v in model.state_dict().items()}
        )
    for q in range(a.clients):
        content[P.client_key(P.CONFIG_KEY, str(q))] = ConfigRecord(
            {P.CFG_TASKS: s.model_names, P.CFG_ROUND: 1}
        )
    ensure_task_identity()
    mtype = P.QUERY_LOSSES if a.type == "query.losses" else MessageType.EVALUATE
    msg = Message(content, dst_node_id=1, message_type=mtype, group_id="1")
    node = ShardComputer()
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {a.clients} clients "
        f"of {a.num_clients} (built in {built:.1f} s); {a.type}"
    )
    for i in range(a.repeats):
        gc.collect()
        t0 = time.perf_counter()
        reply = node.reply(specs, msg, ctx, None)  # type: ignore[arg-type]
        dt = time.perf_counter() - t0
        print(
            f"reply {i + 1}: {dt:.2f} s ({dt / a.clients * 1e6:.1f} us a client), "
            f"{len(reply)} records, resident {_rss_gb():.2f} GB"
        )
        del reply
    return 0


if __name__ == "__main__":
    sys.exit(main())
