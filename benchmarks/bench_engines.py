"""Time one MMFL workload on every engine and on a plain PyTorch loop, and check
they agree.

(a) Flower's simulation engine (Ray):  ``mmfl_flwr.runner.run(s, engine="simulation")``
    with one client per virtual node (``clients-per-node 1``: one Flower message
    and one ClientApp call per client, as before issue 24); ``sim-half`` and
    ``sim-all`` are the same engine with shard nodes: K = ceil(N / 2) clients on
    each of 2 nodes, and K = N on 1 node, each node computing its clients per
    model at once (``mmfl_flwr.client.shard``)
(b) the in-process engine:             ``mmfl_flwr.runner.run(s, engine="inprocess")``
(c) the vectorised engine:             ``mmfl_flwr.runner.run(s, engine="vectorized")``
    (per model, one batched ``torch.func`` computation for all clients; torch on
    every core, or CUDA when available / ``MMFL_DEVICE``)
(d) a plain PyTorch loop, no Flower:   the SAME client work, sequentially, on one
    thread. Every round: for ``--strategy lvr``, the loss of every (client, model)
    pair (``TorchTrainer.loss``, a no-grad forward over the client's training
    data, as a loss query does); then the (client, task) picks of an engine run
    (the in-process one, else the vectorised one, else the simulation), each
    trained with ``TorchTrainer.train`` from the current global weights with the
    same epochs / lr / batch size / seed (``training_seed(seed, round, client,
    task)``); then the aggregation per model and the server-side evaluation of
    every model. The aggregation is FedAvg (data-weighted mean, as
    ``FedAvgAggregator``), or for ``lvr`` the unbiased ``d * l / (B p)`` rule of
    paper 003 with ``p`` computed from the loop's own losses by
    ``lvr_probabilities`` (as the LVR policy does). Other strategies are timed
    with FedAvg, so their weights are not expected to agree.

Each engine runs in its own subprocess (this script re-invokes itself with
``--_engine NAME --_json FILE``), so Ray is torn down with its process and every
engine pays its own imports. ``--engines`` picks a subset (Ray at N = 1000 on
2 cores is very slow). Nothing is written unless ``--json PATH`` is given.

Workload presets (``--workload NAME``): a preset fills every workload option not
given on the command line; ``--num-clients`` / ``--num-rounds`` still choose N and
the rounds.

``paper003``
    issue #14's LVR workload: ``--strategy lvr --profile paper003 --tasks
    digits,digits,digits --local-epochs 5 --budget-fraction 0.1 --batch-size
    10000``: each round a loss query of every client-model pair (N x 3, less
    one pair for each of the 10% of clients that lack one task) and about
    ``m = 0.1 V`` full-batch trainings of 5 epochs (``V``: the clients'
    processors, 1 to 3 each under paper003).

Usage::

    python benchmarks/bench_engines.py [--num-clients 10 --num-rounds 5 \
        --tasks digits,synthetic,digits --strategy mfa-rr --seed 0] [--json out.json]
    python benchmarks/bench_engines.py --workload paper003 --num-clients 120 \
        --num-rounds 3 --engines inprocess,vectorized,plain

A round's time is the span from its start to the end of the server evaluation of
its last model (round 0, the initial evaluation, is excluded). For (b) and (c) it
comes from the strategy's timing hook (``mmfl_flwr.strategy.timing.PHASE_OBSERVERS``,
which only reads clocks); the strategy's own ``seconds`` in the history stop before
the server evaluation. For (a), whose ServerApp runs in another process, the history's
``seconds`` are all there is: its rounds lack the server evaluation (small: see
the phases of (b)). The plain loop times the same span as (b) and (c). Round 1
includes the warm-up (client registration, data building, actor start for Ray),
so means are given with and without it. "run() wall" is the whole call,
start-up included (Ray start and shutdown for (a)); "process wall" adds the
Python imports.

"torch threads" is ``torch.get_num_threads()`` in the process that computes the
clients' work: 1 for (b) and (d), every usable core for (c) (the engine sets it;
``--vector-threads K`` pins the vectorised process to K CPUs, hence K threads),
1 per ClientApp for (a) with up to one actor per CPU. On a machine where another
process keeps a core busy, several torch threads can be much slower than one
(threads wait for each other at every operation), so the load averages before
and after are printed too.

For (b), (c) and (d) the round is also split into phases (client registration,
loss query, planning and train messages, train round trip, aggregation, server
evaluation); the "round trip" rows are the Grid's ``send_and_receive`` (the
clients' work plus message handling on their side).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

ENGINES = ("simulation", "sim-half", "sim-all", "inprocess", "vectorized", "plain")
#: engines run through mmfl_flwr.runner.run, in the order whose assignments the
#: plain loop prefers to replay
FLOWER_ENGINES = ("inprocess", "vectorized", "simulation", "sim-half", "sim-all")
#: Flower simulation variants: engine name -> nodes (clients per node = ceil(N / nodes));
#: None is one client per node
SIM_NODES: dict[str, int | None] = {"simulation": None, "sim-half": 2, "sim-all": 1}

#: ``--workload`` presets: option name -> value (filled where not given)
WORKLOADS: dict[str, dict[str, Any]] = {
    "paper003": {
        "strategy": "lvr",
        "profile": "paper003",
        "tasks": "digits,digits,digits",
        "local_epochs": 5,
        "budget_fraction": 0.1,
        "batch_size": 10000,
    },
}
#: defaults of the workload options when neither the command line nor a preset sets them
DEFAULTS: dict[str, Any] = {"strategy": "mfa-rr", "tasks": "digits,synthetic,digits"}
#: workload options passed on to the engine subprocesses when set
PASSED = ("local_epochs", "lr", "batch_size", "clients_per_round", "profile", "budget_fraction")

#: phases of a round, in print order: (key, label); keys starting with "  " are
#: parts of the phase above them
PHASES = (
    ("registration", "client registration (info)"),
    ("loss_query", "loss query (all pairs)"),
    ("rt:query.losses", "  of which round trip"),
    ("plan", "plan + train messages"),
    ("rt:train", "train round trip"),
    ("aggregate", "aggregation"),
    ("server_eval", "server evaluation"),
    ("other", "other (round - phases above)"),
)


# ---------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Time an MMFL workload on Flower's simulation engine, the "
        "in-process engine, the vectorised engine and a plain PyTorch loop."
    )
    p.add_argument(
        "--workload",
        default="",
        choices=list(WORKLOADS),
        help="preset of the workload options not given explicitly; "
        "paper003 = --strategy lvr --profile paper003 --tasks "
        "digits,digits,digits --local-epochs 5 --budget-fraction 0.1 "
        "--batch-size 10000",
    )
    p.add_argument("--num-clients", type=int, default=10)
    p.add_argument("--num-rounds", type=int, default=5)
    p.add_argument("--tasks", default=None, help=f"default: {DEFAULTS['tasks']}")
    p.add_argument("--strategy", default=None, help=f"default: {DEFAULTS['strategy']}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default=None, help="default: the Settings default")
    p.add_argument(
        "--budget-fraction",
        type=float,
        default=None,
        help="default: the Settings default (0 = auto)",
    )
    p.add_argument("--local-epochs", type=int, default=None, help="default: the Settings default")
    p.add_argument("--lr", type=float, default=None, help="default: the Settings default")
    p.add_argument("--batch-size", type=int, default=None, help="default: the Settings default")
    p.add_argument(
        "--clients-per-round",
        type=int,
        default=None,
        help="default: the Settings default (0 = all)",
    )
    p.add_argument(
        "--vector-chunk",
        type=int,
        default=None,
        help="clients per batched training call of the vectorised engine "
        "(default: the engine's own)",
    )
    p.add_argument(
        "--vector-threads",
        type=int,
        default=None,
        help="pin the vectorised engine's process to this many CPUs (its "
        "torch threads); default: every usable CPU, as the engine does",
    )
    p.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help="comma-separated subset of " + ",".join(ENGINES) + " (plain "
        "needs one of inprocess, vectorized, simulation: it replays its "
        "assignments)",
    )
    p.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds allowed per engine subprocess"
    )
    p.add_argument(
        "--json", default="", metavar="PATH", help="write the measured numbers to this JSON file"
    )
    p.add_argument(
        "--show-logs",
        action="store_true",
        help="print each engine's own output (progress lines, Ray logs)",
    )
    # Internal: one engine in this process.
    p.add_argument("--_engine", default="", help=argparse.SUPPRESS)
    p.add_argument("--_json", default="", help=argparse.SUPPRESS)
    p.add_argument("--_assignments", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, value in WORKLOADS.get(args.workload, {}).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def make_settings(args: argparse.Namespace) -> Any:
    from mmfl_flwr.config import Settings

    kwargs: dict[str, Any] = {
        "strategy": args.strategy,
        "tasks": args.tasks,
        "num_clients": args.num_clients,
        "num_rounds": args.num_rounds,
        "seed": args.seed,
        "output_dir": "",
    }
    for name in PASSED:
        value = getattr(args, name)
        if value is not None:
            kwargs[name] = value
    s = Settings(**kwargs)
    s.validate()
    return s


# ------------------------------------------------------------------ child: engines
def _round_seconds(history: list[dict[str, Any]]) -> dict[int, float]:
    """Wall time of each round >= 1: the largest ``seconds`` of its rows (the
    last task's row, taken after every task's server evaluation)."""
    out: dict[int, float] = {}
    for row in history:
        rnd = int(row["round"])
        if rnd >= 1 and "seconds" in row:
            out[rnd] = max(out.get(rnd, 0.0), float(row["seconds"]))
    return out


def _accuracies(history: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for row in history:
        out.setdefault(int(row["round"]), {})[row["task"]] = float(row["accuracy"])
    return out


class PhaseClock:
    """Seconds per round and phase, from the strategy's timing hook
    (:data:`mmfl_flwr.strategy.timing.PHASE_OBSERVERS`)."""

    def __init__(self) -> None:
        self.seconds: dict[int, dict[str, float]] = {}
        #: per round: registration start to the end of its last server evaluation
        self.round_seconds: dict[int, float] = {}
        self.grid: Any = None

    def __call__(self, t: Any) -> None:
        if t.phase == "round":
            self.round_seconds[t.round] = t.seconds
            return
        if t.grid is not None:
            self.grid = t.grid
        per = self.seconds.setdefault(t.round, {})
        per[t.phase] = per.get(t.phase, 0.0) + t.seconds


def _install_phase_clock() -> PhaseClock:
    from mmfl_flwr.strategy.timing import PHASE_OBSERVERS

    clock = PhaseClock()
    PHASE_OBSERVERS.append(clock)
    return clock


def child_flower(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """Run ``engine`` through mmfl_flwr.runner.run and report times and results."""
    import numpy as np
    import torch

    from mmfl_flwr.records import arrays_to_numpy
    from mmfl_flwr.runner import run

    settings = make_settings(args)
    run_engine = engine
    if engine in SIM_NODES:
        nodes = SIM_NODES[engine]
        k = 1 if nodes is None else -(-settings.num_clients // nodes)
        settings.clients_per_node = str(k)
        run_engine = "simulation"
    if engine == "vectorized" and args.vector_threads:
        # run_vectorized sets torch's threads to the CPUs this process may use
        cpus = sorted(os.sched_getaffinity(0))[: args.vector_threads]
        os.sched_setaffinity(0, cpus)
    clock = _install_phase_clock() if engine in ("inprocess", "vectorized") else None
    kwargs: dict[str, Any] = {}
    if engine == "vectorized" and args.vector_chunk is not None:
        kwargs["vector_chunk"] = args.vector_chunk
    t0 = time.perf_counter()
    result = run(settings, engine=run_engine, **kwargs)
    wall = time.perf_counter() - t0
    weights_file = args._json + ".weights.npz"
    flat = {
        f"{task}/{k}": v
        for task, rec in result.arrays.items()
        for k, v in arrays_to_numpy(rec).items()
    }
    np.savez(weights_file, **flat)
    if engine in SIM_NODES:
        cores = os.cpu_count() or 1
        nodes = SIM_NODES[engine]
        if nodes is None:
            threads = f"1/actor x {cores}"  # num_cpus=1 per ClientApp
        else:  # mmfl run gives each node its share of the CPUs
            threads = f"{max(1, cores // nodes)}/node x {min(nodes, cores)}"
    else:
        threads = str(torch.get_num_threads())  # what run() set for the engine
    out: dict[str, Any] = {
        "engine": engine,
        "run_wall": wall,
        "round_seconds": _round_seconds(result.history),
        "accuracy": _accuracies(result.history),
        "assignments": {
            int(r): [[c, t, int(n)] for c, t, n in picks] for r, picks in result.assignments.items()
        },
        "weights_file": weights_file,
        "flwr_imported": "flwr" in sys.modules,
        "threads": threads,
    }
    if clock is not None:
        # The history's seconds stop before the server evaluation: time the
        # round up to the end of its last server evaluation instead.
        out["history_round_seconds"] = out["round_seconds"]
        out["round_seconds"] = {r: t for r, t in clock.round_seconds.items() if r >= 1}
        out["phases"] = clock.seconds
        counts = getattr(clock.grid, "counts", None)
        if counts:
            out["message_counts"] = dict(counts)
    return out


def child_plain(args: argparse.Namespace) -> dict[str, Any]:
    """The same client work as the engines, as a plain sequential PyTorch loop."""
    import numpy as np
    import torch

    from mmfl_flwr.client.trainer import TorchTrainer, evaluate_arrays, initial_weights
    from mmfl_flwr.core.aggregators import apply_step
    from mmfl_flwr.core.lvr import lvr_probabilities
    from mmfl_flwr.core.policy import data_shares, resolve_budget
    from mmfl_flwr.flower_app.data import resolved_budget
    from mmfl_flwr.seeding import task_seed, training_seed
    from mmfl_flwr.tasks.federation import build_federation
    from mmfl_flwr.tasks.models import make_model

    torch.set_num_threads(1)  # as the in-process engine does
    s = make_settings(args)
    with open(args._assignments) as f:
        assignments = {int(r): picks for r, picks in json.load(f).items()}
    rule = "lvr" if s.strategy == "lvr" else "fedavg"

    t_start = time.perf_counter()
    fed = build_federation(
        s.task_kinds,
        s.num_clients,
        s.seed,
        labels_per_client=s.labels_per_client,
        max_synthetic_samples=s.synthetic_max_samples or None,
        profile=s.profile,
        data_root=s.data_root,
    )
    s = resolved_budget(s, fed)
    # Seeded initial weights, as the ServerApp makes them (seed and model name).
    weights: dict[str, dict[str, np.ndarray]] = {
        task: initial_weights(lambda k=fed.kinds[task]: make_model(k), task_seed(s.seed, task))
        for task in fed.tasks
    }
    tasks = list(fed.tasks)
    row = {t: i for i, t in enumerate(tasks)}
    procs = np.asarray(fed.processors, dtype=np.float64)

    def evaluate(task: str) -> float:
        kind = fed.kinds[task]
        _, acc = evaluate_arrays(lambda: make_model(kind), weights[task], fed.server_test(task))
        return float(acc)

    trainers: dict[tuple[int, str], TorchTrainer] = {}  # built on first use, as clients do

    def trainer(cid: int, task: str) -> TorchTrainer:
        key = (cid, task)
        if key not in trainers:
            train, test = fed.client_data(cid, task)
            kind = fed.kinds[task]
            trainers[key] = TorchTrainer(lambda k=kind: make_model(k), train, test, s.batch_size)
        return trainers[key]

    accuracy: dict[int, dict[str, float]] = {0: {t: evaluate(t) for t in tasks}}
    round_seconds: dict[int, float] = {}
    phases: dict[int, dict[str, float]] = {}
    for rnd in range(1, s.num_rounds + 1):
        t0 = time.perf_counter()
        ph = phases.setdefault(rnd, {})
        prob = None
        if rule == "lvr":
            # Loss query: the loss of every (client, model) pair on the client's
            # training data, then Eq. 13's probabilities as the LVR policy computes them.
            n = np.zeros((len(tasks), s.num_clients))
            losses = np.full((len(tasks), s.num_clients), np.nan)
            for cid in range(s.num_clients):
                for task in fed.client_tasks(cid):
                    tr = trainer(cid, task)
                    n[row[task], cid] = tr.num_examples
                    losses[row[task], cid] = tr.loss(weights[task])
            t1 = time.perf_counter()
            ph["loss_query"] = t1 - t0
            keep = n.sum(axis=0) > 0
            m = resolve_budget(None, s.budget_fraction, int(procs[keep].sum()))
            prob = np.zeros_like(n)
            prob[:, keep] = lvr_probabilities(
                losses[:, keep], data_shares(n[:, keep]), procs[keep], m
            )
            share = data_shares(n)
            ph["plan"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        picks = assignments.get(rnd, [])
        # Per task, the local models in the order the strategy receives them:
        # clients in order of first pick, each client's tasks in pick order.
        by_client: dict[str, list[tuple[str, int]]] = {}
        for cid, task, count in picks:
            by_client.setdefault(str(cid), []).append((task, int(count)))
        local: dict[str, list[tuple[dict[str, np.ndarray], int, float]]] = {t: [] for t in tasks}
        for cid, mine in by_client.items():
            for task, count in mine:
                new, n_i, _loss = trainer(int(cid), task).train(
                    weights[task],
                    s.local_epochs,
                    s.lr,
                    training_seed(s.seed, rnd, cid, task),
                    s.batch_size,
                )
                if prob is not None:
                    i, j = row[task], int(cid)
                    coeff = share[i, j] * count / (procs[j] * prob[i, j])
                else:
                    coeff = float(n_i)
                local[task].append((new, int(n_i), coeff))
        t2 = time.perf_counter()
        ph["rt:train"] = t2 - t1
        # w <- w - sum_k c_k (w - w_k) in float64; FedAvg: c_k = n_k / sum n.
        for task, ups in local.items():
            if not ups:
                continue
            keys = list(weights[task])
            old = [weights[task][k] for k in keys]
            deltas = [[w.astype(np.float64) - lw[k] for w, k in zip(old, keys)] for lw, _, _ in ups]
            if prob is not None:
                coeffs = [c for _, _, c in ups]
            else:
                total = float(sum(c for _, _, c in ups))
                coeffs = [c / total for _, _, c in ups]
            weights[task] = dict(zip(keys, apply_step(old, deltas, coeffs)))
        t3 = time.perf_counter()
        ph["aggregate"] = t3 - t2
        accuracy[rnd] = {t: evaluate(t) for t in tasks}
        t4 = time.perf_counter()
        ph["server_eval"] = t4 - t3
        round_seconds[rnd] = t4 - t0
    wall = time.perf_counter() - t_start
    weights_file = args._json + ".weights.npz"
    np.savez(weights_file, **{f"{t}/{k}": v for t, w in weights.items() for k, v in w.items()})
    return {
        "engine": "plain",
        "run_wall": wall,
        "round_seconds": round_seconds,
        "accuracy": accuracy,
        "assignments": assignments,
        "weights_file": weights_file,
        "flwr_imported": "flwr" in sys.modules,
        "threads": str(torch.get_num_threads()),
        "phases": phases,
        "rule": rule,
    }


def child_main(args: argparse.Namespace) -> None:
    out = child_plain(args) if args._engine == "plain" else child_flower(args, args._engine)
    with open(args._json, "w") as f:
        json.dump(out, f)


# ------------------------------------------------------------------- parent side
def run_child(
    args: argparse.Namespace, engine: str, workdir: str, extra: list[str]
) -> dict[str, Any]:
    """Run one engine in a fresh Python process; returns its report + process wall."""
    out_json = os.path.join(workdir, f"{engine}.json")
    log_file = os.path.join(workdir, f"{engine}.log")
    # The resolved workload options, passed on explicitly (never the parent's --json).
    clean = [
        "--num-clients",
        str(args.num_clients),
        "--num-rounds",
        str(args.num_rounds),
        "--tasks",
        args.tasks,
        "--strategy",
        args.strategy,
        "--seed",
        str(args.seed),
    ]
    for name in (*PASSED, "vector_chunk", "vector_threads"):
        value = getattr(args, name)
        if value is not None:
            clean += ["--" + name.replace("_", "-"), str(value)]
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        *clean,
        "--_engine",
        engine,
        "--_json",
        out_json,
        *extra,
    ]
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    env.setdefault("FLWR_HOME", os.path.join(workdir, "flwr_home"))
    env["PYTHONUNBUFFERED"] = "1"
    print(f"running {engine:<10} ...", end=" ", flush=True)
    t0 = time.perf_counter()
    with open(log_file, "w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=None if args.show_logs else log,
            stderr=subprocess.STDOUT if not args.show_logs else None,
            env=env,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the group of the process started above
            proc.wait()
            rc = None
    wall = time.perf_counter() - t0
    if rc != 0 or not os.path.exists(out_json):
        print(f"FAILED ({'timeout' if rc is None else f'exit {rc}'}) after {wall:.1f}s")
        if not args.show_logs:
            with open(log_file) as f:
                tail = f.read().splitlines()[-40:]
            print("  last lines of its output:")
            for line in tail:
                print("  | " + line)
        raise SystemExit(1)
    print(f"done in {wall:.1f}s", flush=True)
    with open(out_json) as f:
        rep = json.load(f)
    rep["round_seconds"] = {int(k): v for k, v in rep["round_seconds"].items()}
    rep["accuracy"] = {int(k): v for k, v in rep["accuracy"].items()}
    rep["assignments"] = {int(k): v for k, v in rep["assignments"].items()}
    if "phases" in rep:
        rep["phases"] = {int(k): v for k, v in rep["phases"].items()}
    rep["process_wall"] = wall
    return rep


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _fmt(x: float | None, width: int = 11, prec: int = 3) -> str:
    return (
        f"{'-':>{width}}"
        if x is None or (isinstance(x, float) and math.isnan(x))
        else f"{x:>{width}.{prec}f}"
    )


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


#: the rows of the time table: (label, key of the engine's stats)
TIME_ROWS = (
    ("mean per round, excl. round 1", "mean_excl_round1"),
    ("mean per round, incl. round 1", "mean_incl_round1"),
    ("total run() wall incl. start-up", "run_wall"),
    ("total process wall incl. imports", "process_wall"),
)


def _phase_means(
    phases: dict[int, dict[str, float]], rounds: list[int], round_seconds: dict[int, float]
) -> dict[str, float]:
    """Mean seconds per round of every phase over ``rounds`` (0 where a round
    has none); ``other`` is the round's time minus its top-level phases."""
    out: dict[str, float] = {}
    for key, _ in PHASES:
        if key == "other":
            continue
        out[key] = _mean([phases.get(r, {}).get(key, 0.0) for r in rounds])
    top = [k for k, label in PHASES if not label.startswith(" ") and k != "other"]
    out["other"] = _mean(
        [
            round_seconds.get(r, math.nan) - sum(phases.get(r, {}).get(k, 0.0) for k in top)
            for r in rounds
        ]
    )
    return out


def summarize(reps: dict[str, dict[str, Any]], num_rounds: int) -> dict[str, Any]:
    stats: dict[str, dict[str, Any]] = {}
    later = list(range(2, num_rounds + 1)) or [1]
    for eng, rep in reps.items():
        rs = rep["round_seconds"]
        per = [rs.get(r, math.nan) for r in range(1, num_rounds + 1)]
        stats[eng] = {
            "round_seconds": per,
            "mean_excl_round1": _mean([rs.get(r, math.nan) for r in range(2, num_rounds + 1)]),
            "mean_incl_round1": _mean(per),
            "run_wall": rep["run_wall"],
            "process_wall": rep["process_wall"],
            "flwr_imported": rep.get("flwr_imported"),
            "threads": rep.get("threads", "?"),
        }
        if "phases" in rep:
            stats[eng]["phases_mean_excl_round1"] = _phase_means(rep["phases"], later, rs)
            stats[eng]["phases_round1"] = _phase_means(rep["phases"], [1], rs)
        if "message_counts" in rep:
            stats[eng]["message_counts"] = rep["message_counts"]
    ratios: dict[str, dict[str, float]] = {}
    for base in ("plain", "inprocess", "vectorized"):
        if base not in stats:
            continue
        for _, metric in TIME_ROWS:
            for eng in stats:
                ratios.setdefault(f"to_{base}", {}).setdefault(metric, {})[eng] = _ratio(
                    stats[eng][metric], stats[base][metric]
                )
    return {"engines": stats, "ratios": ratios}


def _norm_assignments(a: dict[int, list[list[Any]]]) -> dict[int, list[tuple[str, str, int]]]:
    return {int(r): sorted((str(c), str(t), int(n)) for c, t, n in p) for r, p in a.items()}


def compare(reps: dict[str, dict[str, Any]], num_rounds: int, source: str | None) -> dict[str, Any]:
    import numpy as np

    out: dict[str, Any] = {}
    engines = [e for e in ENGINES if e in reps]
    tasks = list(next(iter(reps.values()))["accuracy"][0]) if reps else []
    out["tasks"] = tasks
    out["final_accuracy"] = {
        e: {t: reps[e]["accuracy"].get(num_rounds, {}).get(t, math.nan) for t in tasks}
        for e in engines
    }
    pairs = [(a, b) for i, a in enumerate(engines) for b in engines[i + 1 :]]
    out["max_abs_diff_final_accuracy"] = {}
    out["max_abs_diff_accuracy_all_rounds"] = {}
    out["max_abs_diff_final_weights"] = {}
    for a, b in pairs:
        key = f"{a} vs {b}"
        fa, fb = out["final_accuracy"][a], out["final_accuracy"][b]
        out["max_abs_diff_final_accuracy"][key] = max(abs(fa[t] - fb[t]) for t in tasks)
        diffs = [
            abs(reps[a]["accuracy"][r][t] - reps[b]["accuracy"][r][t])
            for r in range(num_rounds + 1)
            for t in tasks
            if r in reps[a]["accuracy"] and r in reps[b]["accuracy"]
        ]
        out["max_abs_diff_accuracy_all_rounds"][key] = max(diffs) if diffs else math.nan
        wa = np.load(reps[a]["weights_file"])
        wb = np.load(reps[b]["weights_file"])
        if set(wa.files) == set(wb.files):
            out["max_abs_diff_final_weights"][key] = float(
                max(np.max(np.abs(wa[k].astype(np.float64) - wb[k])) for k in wa.files)
            )
        else:
            out["max_abs_diff_final_weights"][key] = math.nan
    if len(engines) >= 2:
        all_final = [[out["final_accuracy"][e][t] for e in engines] for t in tasks]
        out["max_abs_diff_final_accuracy_all"] = max(max(v) - min(v) for v in all_final)
    # Assignments of every Flower engine against the first one run (inprocess if run).
    flower = [e for e in FLOWER_ENGINES if e in reps]
    out["same_assignments"] = {}
    out["first_differing_round"] = {}
    for other in flower[1:]:
        a = _norm_assignments(reps[flower[0]]["assignments"])
        b = _norm_assignments(reps[other]["assignments"])
        key = f"{other} vs {flower[0]}"
        out["same_assignments"][key] = a == b
        differ = [r for r in sorted(set(a) | set(b)) if a.get(r) != b.get(r)]
        out["first_differing_round"][key] = differ[0] if differ else None
    out["plain_replays"] = source
    return out


def machine_info() -> dict[str, Any]:
    """CPU model, cores, versions and the device the clients compute on."""
    import platform

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        from importlib.metadata import version

        info["versions"] = {p: version(p) for p in ("flwr", "torch", "ray", "numpy")}
    except Exception:  # noqa: BLE001 - informative only
        info["versions"] = {}
    try:
        from mmfl_flwr.client.trainer import default_device

        info["device"] = str(default_device())
    except Exception as err:  # noqa: BLE001 - informative only
        info["device"] = f"unknown ({type(err).__name__})"
    if info["device"].startswith("cuda"):
        import torch

        info["device"] += f" ({torch.cuda.get_device_name(0)})"
    return info


def print_report(
    settings: Any,
    summary: dict[str, Any],
    cmp: dict[str, Any],
    load: tuple[tuple[float, ...], tuple[float, ...]],
    machine: dict[str, Any],
    workload: str,
) -> None:
    st = summary["engines"]
    engines = [e for e in ENGINES if e in st]
    R = settings.num_rounds
    w = 12
    lw = 36
    v = machine.get("versions", {})
    print()
    print(
        f"machine: {machine['cpu']}, {machine['cpus']} CPUs ({machine['affinity']} usable); "
        f"torch {v.get('torch', '?')}, flwr {v.get('flwr', '?')}, ray {v.get('ray', '?')}, "
        f"python {machine['python']}; device {machine['device']}"
    )
    print(
        f"load average (1/5/15 min) before {'/'.join(f'{x:.2f}' for x in load[0])}, "
        f"after {'/'.join(f'{x:.2f}' for x in load[1])}"
    )
    print(
        f"workload{f' ({workload})' if workload else ''}: strategy={settings.strategy} "
        f"profile={settings.profile} tasks={settings.tasks} "
        f"num-clients={settings.num_clients} num-rounds={R} "
        f"local-epochs={settings.local_epochs} lr={settings.lr} "
        f"batch-size={settings.batch_size} budget-fraction={settings.budget_fraction} "
        f"clients-per-round={settings.clients_per_round} seed={settings.seed}"
    )
    if "plain" in st:
        print(
            f"plain loop: replays the {cmp['plain_replays']} run's picks; "
            "aggregation rule "
            + (
                "unbiased d*l/(B p), p from its own loss query"
                if st["plain"].get("rule", "") == "lvr"
                else "as run"
            )
        )
    print()
    print("Per-round wall time (s); round 0 (initial evaluation) excluded")
    print(f"{'':<{lw}}" + "".join(f"{e:>{w}}" for e in engines))
    print(f"{'torch threads':<{lw}}" + "".join(f"{st[e]['threads']!s:>{w}}" for e in engines))
    for r in range(1, R + 1):
        label = f"round {r}" + (" (warm-up)" if r == 1 else "")
        print(f"{label:<{lw}}" + "".join(_fmt(st[e]["round_seconds"][r - 1], w) for e in engines))
    print("-" * (lw + w * len(engines)))
    for label, key in TIME_ROWS:
        print(f"{label:<{lw}}" + "".join(_fmt(st[e][key], w) for e in engines))
    for base, ratios in summary["ratios"].items():
        print("-" * (lw + w * len(engines)))
        name = base.removeprefix("to_")
        for label, key in TIME_ROWS[:2]:
            lab = f"ratio to {name}, " + label.split(", ", 1)[1]
            print(
                f"{lab:<{lw}}" + "".join(_fmt(ratios[key].get(e, math.nan), w, 2) for e in engines)
            )
        for label, key in TIME_ROWS[2:]:
            lab = f"ratio to {name}, " + label.split(" incl.")[0].removeprefix("total ")
            print(
                f"{lab:<{lw}}" + "".join(_fmt(ratios[key].get(e, math.nan), w, 2) for e in engines)
            )
    with_phases = [e for e in engines if "phases_mean_excl_round1" in st[e]]
    if with_phases:
        print()
        later = "rounds 2.." + str(R) if R >= 2 else "round 1"
        print(f"Phases, mean seconds per round over {later} (round 1 in brackets)")
        pw = 20
        print(f"{'':<{lw}}" + "".join(f"{e:>{pw}}" for e in with_phases))
        for key, label in PHASES:
            cells = []
            for e in with_phases:
                a = st[e]["phases_mean_excl_round1"].get(key, math.nan)
                b = st[e]["phases_round1"].get(key, math.nan)
                cells.append(f"{_fmt(a, 9)} ({_fmt(b, 0)})".rjust(pw))
            print(f"{label:<{lw}}" + "".join(cells))
        for e in with_phases:
            if "message_counts" in st[e]:
                c = st[e]["message_counts"]
                print(
                    f"  {e}: {c.get('vectorized', 0)} messages served in batches, "
                    f"{c.get('per-client', 0)} through the ClientApp"
                )
    print()
    print(f"Final server-side accuracy (round {R})")
    print(f"{'task':<{lw}}" + "".join(f"{e:>{w}}" for e in engines))
    for t in cmp["tasks"]:
        print(f"{t:<{lw}}" + "".join(_fmt(cmp["final_accuracy"][e][t], w, 4) for e in engines))
    if len(engines) >= 2:
        print()
        print("Agreement")
        for key, val in cmp["max_abs_diff_final_accuracy"].items():
            print(
                f"  {key:<24} max |d final acc| = {val:.3g}   "
                f"max |d acc| over rounds 0..{R} = "
                f"{cmp['max_abs_diff_accuracy_all_rounds'][key]:.3g}   "
                f"max |d final weights| = {cmp['max_abs_diff_final_weights'][key]:.3g}"
            )
        print(
            f"  max abs difference of final accuracy across all engines: "
            f"{cmp['max_abs_diff_final_accuracy_all']:.3g}"
        )
        for key, same in cmp["same_assignments"].items():
            a, b = key.split(" vs ")
            extra = "" if same else f" (first differing round {cmp['first_differing_round'][key]})"
            print(f"  {a} made the same assignments as {b}: {'yes' if same else 'NO'}{extra}")
        if "plain" in st:
            if st["plain"]["flwr_imported"]:
                print("  plain process imported flwr: yes (no Flower code runs in the loop)")
            else:
                print("  plain process imported flwr: no")
    print()
    if any(e in st for e in SIM_NODES):
        print(
            "Note: the simulation's rounds are the strategy's own seconds, which stop "
            "before the server evaluation (its ServerApp runs in another process); the "
            "other engines' rounds include it."
        )
    print(
        "Note: one measurement per engine, wall clock; on a shared machine other processes "
        "(e.g. test runs) may compete for the CPUs (see the load averages), so treat the "
        "numbers as noisy."
    )


def parent_main(args: argparse.Namespace) -> None:
    settings = make_settings(args)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise SystemExit(f"unknown engines {unknown}; choose from {', '.join(ENGINES)}")
    source = next((e for e in FLOWER_ENGINES if e in engines), None)
    if "plain" in engines and source is None:
        raise SystemExit(
            "the plain loop replays an engine run's assignments: include "
            "inprocess, vectorized or simulation in --engines"
        )
    machine = machine_info()
    load_before = os.getloadavg()
    reps: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_engines_") as workdir:
        # The engine whose picks the plain loop replays runs first.
        order = [source] if source else []
        order += [e for e in ("plain", *FLOWER_ENGINES) if e in engines and e not in order]
        for eng in order:
            extra: list[str] = []
            if eng == "plain":
                path = os.path.join(workdir, "assignments.json")
                with open(path, "w") as f:
                    json.dump(reps[source]["assignments"], f)
                extra = ["--_assignments", path]
            reps[eng] = run_child(args, eng, workdir, extra)
        load_after = os.getloadavg()
        summary = summarize(reps, settings.num_rounds)
        cmp = compare(reps, settings.num_rounds, source if "plain" in engines else None)
    if "plain" in reps:
        summary["engines"]["plain"]["rule"] = reps["plain"].get("rule", "")
    print_report(settings, summary, cmp, (load_before, load_after), machine, args.workload)
    if args.json:
        data = {
            "settings": settings.to_run_config(),
            "workload": args.workload,
            "machine": {**machine, "loadavg_before": load_before, "loadavg_after": load_after},
            **summary,
            "agreement": dict(cmp),
        }
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2, default=str)
        print(f"numbers written to {os.path.abspath(args.json)}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args._engine:
        child_main(args)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()
