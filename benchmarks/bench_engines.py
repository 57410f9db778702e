#!/usr/bin/env python
"""Time one small MMFL workload on three engines and check they agree.

(a) Flower's simulation engine (Ray):  ``mmfl_flwr.runner.run(s, engine="simulation")``
(b) the in-process engine:             ``mmfl_flwr.runner.run(s, engine="inprocess")``
(c) a plain PyTorch loop, no Flower:   the SAME local training, sequentially, on one
    thread: for every round, the (client, task) picks the in-process run made, each
    trained with ``TorchTrainer.train`` from the current global weights with the
    same epochs / lr / batch size / seed (``training_seed(seed, round, client,
    task)``), then FedAvg per task (data-weighted mean, computed like
    ``FedAvgAggregator``) and the server-side evaluation of every task.

Each engine runs in its own subprocess (this script re-invokes itself with
``--_engine NAME --_json FILE``), so Ray is torn down with its process and every
engine pays its own imports. Nothing is written unless ``--json PATH`` is given.

Usage::

    python benchmarks/bench_engines.py [--num-clients 10 --num-rounds 5 \
        --tasks digits,synthetic,digits --strategy mfa-rr --seed 0] [--json out.json]

Per-round times of (a) and (b) are the ``seconds`` of the strategy's history rows
(wall time from the start of the round to the end of the server evaluation of the
last task; round 0, the initial evaluation, is excluded). Round 1 includes the
warm-up (client registration, data building, actor start for Ray), so means are
given with and without it. "run() wall" is the whole call, start-up included
(Ray start and shutdown for (a)); "process wall" adds the Python imports.
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

ENGINES = ("simulation", "inprocess", "plain")
SHORT = {"simulation": "sim", "inprocess": "inproc", "plain": "plain"}


# ---------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Time an MMFL workload on Flower's simulation engine, the "
        "in-process engine and a plain PyTorch loop."
    )
    p.add_argument("--num-clients", type=int, default=10)
    p.add_argument("--num-rounds", type=int, default=5)
    p.add_argument("--tasks", default="digits,synthetic,digits")
    p.add_argument("--strategy", default="mfa-rr")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--local-epochs", type=int, default=None,
                   help="default: the Settings default")
    p.add_argument("--lr", type=float, default=None, help="default: the Settings default")
    p.add_argument("--batch-size", type=int, default=None,
                   help="default: the Settings default")
    p.add_argument("--clients-per-round", type=int, default=None,
                   help="default: the Settings default (0 = all)")
    p.add_argument("--engines", default=",".join(ENGINES),
                   help="comma-separated subset of simulation,inprocess,plain "
                   "(plain needs inprocess: it replays its assignments)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds allowed per engine subprocess")
    p.add_argument("--json", default="", metavar="PATH",
                   help="write the measured numbers to this JSON file")
    p.add_argument("--show-logs", action="store_true",
                   help="print each engine's own output (progress lines, Ray logs)")
    # Internal: one engine in this process.
    p.add_argument("--_engine", default="", help=argparse.SUPPRESS)
    p.add_argument("--_json", default="", help=argparse.SUPPRESS)
    p.add_argument("--_assignments", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


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
    for name in ("local_epochs", "lr", "batch_size", "clients_per_round"):
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


def child_flower(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """Run ``engine`` through mmfl_flwr.runner.run and report times and results."""
    import numpy as np

    from mmfl_flwr.records import arrays_to_numpy
    from mmfl_flwr.runner import run

    settings = make_settings(args)
    t0 = time.perf_counter()
    result = run(settings, engine=engine)
    wall = time.perf_counter() - t0
    weights_file = args._json + ".weights.npz"
    flat = {
        f"{task}/{k}": v
        for task, rec in result.arrays.items()
        for k, v in arrays_to_numpy(rec).items()
    }
    np.savez(weights_file, **flat)
    return {
        "engine": engine,
        "run_wall": wall,
        "round_seconds": _round_seconds(result.history),
        "accuracy": _accuracies(result.history),
        "assignments": {
            int(r): [[c, t, int(n)] for c, t, n in picks]
            for r, picks in result.assignments.items()
        },
        "weights_file": weights_file,
        "flwr_imported": "flwr" in sys.modules,
    }


def child_plain(args: argparse.Namespace) -> dict[str, Any]:
    """The same local training as the engines, as a plain sequential PyTorch loop."""
    import numpy as np
    import torch

    from mmfl_flwr.seeding import task_seed, training_seed
    from mmfl_flwr.client.trainer import TorchTrainer, evaluate_arrays, initial_weights
    from mmfl_flwr.tasks.federation import build_federation
    from mmfl_flwr.tasks.models import make_model

    torch.set_num_threads(1)  # as the in-process engine does
    s = make_settings(args)
    with open(args._assignments) as f:
        assignments = {int(r): picks for r, picks in json.load(f).items()}

    t_start = time.perf_counter()
    fed = build_federation(
        s.task_kinds, s.num_clients, s.seed,
        labels_per_client=s.labels_per_client,
        max_synthetic_samples=s.synthetic_max_samples or None,
    )
    # Seeded initial weights, as the ServerApp makes them (seed and model name).
    weights: dict[str, dict[str, np.ndarray]] = {
        task: initial_weights(lambda k=fed.kinds[task]: make_model(k), task_seed(s.seed, task))
        for task in fed.tasks
    }

    def evaluate(task: str) -> float:
        kind = fed.kinds[task]
        _, acc = evaluate_arrays(lambda: make_model(kind), weights[task], fed.server_test(task))
        return float(acc)

    accuracy: dict[int, dict[str, float]] = {0: {t: evaluate(t) for t in fed.tasks}}
    trainers: dict[tuple[str, str], TorchTrainer] = {}  # built on first use, as clients do
    round_seconds: dict[int, float] = {}
    for rnd in range(1, s.num_rounds + 1):
        t0 = time.perf_counter()
        picks = assignments.get(rnd, [])
        # Per task, the local models in the order the strategy receives them:
        # clients in order of first pick, each client's tasks in pick order.
        by_client: dict[str, list[str]] = {}
        for cid, task, _count in picks:
            by_client.setdefault(str(cid), []).append(task)
        local: dict[str, list[tuple[dict[str, np.ndarray], int]]] = {t: [] for t in fed.tasks}
        for cid, tasks in by_client.items():
            for task in tasks:
                key = (cid, task)
                if key not in trainers:
                    train, test = fed.client_data(int(cid), task)
                    kind = fed.kinds[task]
                    trainers[key] = TorchTrainer(
                        lambda k=kind: make_model(k), train, test, s.batch_size
                    )
                new, n, _loss = trainers[key].train(
                    weights[task], s.local_epochs, s.lr,
                    training_seed(s.seed, rnd, cid, task), s.batch_size,
                )
                local[task].append((new, int(n)))
        # FedAvg per task: w <- w - sum_i (n_i / sum n) (w - w_i), in float64.
        for task, ups in local.items():
            if not ups:
                continue
            total = float(sum(n for _, n in ups))
            old = weights[task]
            new_w = {}
            for k, w in old.items():
                step = np.zeros(w.shape, dtype=np.float64)
                for lw, n in ups:
                    step += (n / total) * (w.astype(np.float64) - lw[k])
                new_w[k] = (w.astype(np.float64) - step).astype(w.dtype, copy=False)
            weights[task] = new_w
        accuracy[rnd] = {t: evaluate(t) for t in fed.tasks}
        round_seconds[rnd] = time.perf_counter() - t0
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
    }


def child_main(args: argparse.Namespace) -> None:
    if args._engine == "plain":
        out = child_plain(args)
    else:
        out = child_flower(args, args._engine)
    with open(args._json, "w") as f:
        json.dump(out, f)


# ------------------------------------------------------------------- parent side
def run_child(
    args: argparse.Namespace, engine: str, workdir: str, extra: list[str]
) -> dict[str, Any]:
    """Run one engine in a fresh Python process; returns its report + process wall."""
    out_json = os.path.join(workdir, f"{engine}.json")
    log_file = os.path.join(workdir, f"{engine}.log")
    # The workload options, passed on explicitly (never the parent's --json).
    clean = [
        "--num-clients", str(args.num_clients), "--num-rounds", str(args.num_rounds),
        "--tasks", args.tasks, "--strategy", args.strategy, "--seed", str(args.seed),
    ]
    for name in ("local_epochs", "lr", "batch_size", "clients_per_round"):
        value = getattr(args, name)
        if value is not None:
            clean += ["--" + name.replace("_", "-"), repr(value)]
    cmd = [sys.executable, os.path.abspath(__file__), *clean,
           "--_engine", engine, "--_json", out_json, *extra]
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    env.setdefault("FLWR_HOME", os.path.join(workdir, "flwr_home"))
    env["PYTHONUNBUFFERED"] = "1"
    print(f"running {engine:<10} ...", end=" ", flush=True)
    t0 = time.perf_counter()
    with open(log_file, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=None if args.show_logs else log,
            stderr=subprocess.STDOUT if not args.show_logs else None,
            env=env, start_new_session=True,
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
    print(f"done in {wall:.1f}s")
    with open(out_json) as f:
        rep = json.load(f)
    rep["round_seconds"] = {int(k): v for k, v in rep["round_seconds"].items()}
    rep["accuracy"] = {int(k): v for k, v in rep["accuracy"].items()}
    rep["assignments"] = {int(k): v for k, v in rep["assignments"].items()}
    rep["process_wall"] = wall
    return rep


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _fmt(x: float, width: int = 11, prec: int = 3) -> str:
    return f"{'-':>{width}}" if x is None or (isinstance(x, float) and math.isnan(x)) \
        else f"{x:>{width}.{prec}f}"


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def summarize(reps: dict[str, dict[str, Any]], num_rounds: int) -> dict[str, Any]:
    stats: dict[str, dict[str, Any]] = {}
    for eng, rep in reps.items():
        rs = rep["round_seconds"]
        per = [rs.get(r, math.nan) for r in range(1, num_rounds + 1)]
        stats[eng] = {
            "round_seconds": per,
            "mean_excl_round1": _mean([x for r, x in zip(range(1, num_rounds + 1), per)
                                       if r >= 2]),
            "mean_incl_round1": _mean(per),
            "run_wall": rep["run_wall"],
            "process_wall": rep["process_wall"],
            "flwr_imported": rep.get("flwr_imported"),
        }
    ratios: dict[str, dict[str, float]] = {}
    pairs = [("simulation", "plain"), ("inprocess", "plain"), ("simulation", "inprocess")]
    for metric in ("mean_excl_round1", "mean_incl_round1", "run_wall", "process_wall"):
        ratios[metric] = {}
        for a, b in pairs:
            if a in stats and b in stats:
                ratios[metric][f"{a}/{b}"] = _ratio(stats[a][metric], stats[b][metric])
    return {"engines": stats, "ratios": ratios}


def compare(reps: dict[str, dict[str, Any]], num_rounds: int) -> dict[str, Any]:
    import numpy as np

    out: dict[str, Any] = {}
    engines = list(reps)
    tasks = list(next(iter(reps.values()))["accuracy"][0]) if reps else []
    out["tasks"] = tasks
    out["final_accuracy"] = {
        e: {t: reps[e]["accuracy"].get(num_rounds, {}).get(t, math.nan) for t in tasks}
        for e in engines
    }
    pairs = [(a, b) for i, a in enumerate(engines) for b in engines[i + 1:]]
    out["max_abs_diff_final_accuracy"] = {}
    out["max_abs_diff_accuracy_all_rounds"] = {}
    out["max_abs_diff_final_weights"] = {}
    for a, b in pairs:
        key = f"{a} vs {b}"
        fa, fb = out["final_accuracy"][a], out["final_accuracy"][b]
        out["max_abs_diff_final_accuracy"][key] = max(abs(fa[t] - fb[t]) for t in tasks)
        diffs = [
            abs(reps[a]["accuracy"][r][t] - reps[b]["accuracy"][r][t])
            for r in range(0, num_rounds + 1) for t in tasks
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
    if "simulation" in reps and "inprocess" in reps:
        def norm(a: dict[int, list[list[Any]]]) -> dict[int, list[tuple[str, str, int]]]:
            return {int(r): sorted((str(c), str(t), int(n)) for c, t, n in p)
                    for r, p in a.items()}
        out["same_assignments_simulation_inprocess"] = norm(
            reps["simulation"]["assignments"]) == norm(reps["inprocess"]["assignments"])
    return out


def print_report(settings: Any, summary: dict[str, Any], cmp: dict[str, Any],
                 load: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    st = summary["engines"]
    engines = [e for e in ENGINES if e in st]
    R = settings.num_rounds
    w = 12
    print()
    print(f"workload: strategy={settings.strategy} tasks={settings.tasks} "
          f"num-clients={settings.num_clients} num-rounds={R} "
          f"local-epochs={settings.local_epochs} lr={settings.lr} "
          f"batch-size={settings.batch_size} clients-per-round={settings.clients_per_round} "
          f"seed={settings.seed}")
    print(f"machine: {os.cpu_count()} CPUs; load average (1/5/15 min) before "
          f"{'/'.join(f'{x:.2f}' for x in load[0])}, after "
          f"{'/'.join(f'{x:.2f}' for x in load[1])}")
    print()
    print("Per-round wall time (s); round 0 (initial evaluation) excluded")
    print(f"{'':<34}" + "".join(f"{e:>{w}}" for e in engines))
    for r in range(1, R + 1):
        label = f"round {r}" + (" (warm-up)" if r == 1 else "")
        print(f"{label:<34}" + "".join(_fmt(st[e]["round_seconds"][r - 1], w) for e in engines))
    rows = [
        ("mean per round, excl. round 1", "mean_excl_round1"),
        ("mean per round, incl. round 1", "mean_incl_round1"),
        ("total run() wall incl. start-up", "run_wall"),
        ("total process wall incl. imports", "process_wall"),
    ]
    print("-" * (34 + w * len(engines)))
    for label, key in rows:
        print(f"{label:<34}" + "".join(_fmt(st[e][key], w) for e in engines))
    ratios = summary["ratios"]
    cols = [c for c in ("simulation/plain", "inprocess/plain", "simulation/inprocess")
            if any(c in ratios[m] for m in ratios)]
    if cols:
        print()
        print("Ratios")
        print(f"{'':<34}" + "".join(f"{c:>22}" for c in cols))
        for label, key in rows:
            print(f"{label:<34}" + "".join(_fmt(ratios[key].get(c, math.nan), 22, 2)
                                           for c in cols))
    print()
    print(f"Final server-side accuracy (round {R})")
    print(f"{'task':<34}" + "".join(f"{e:>{w}}" for e in engines))
    for t in cmp["tasks"]:
        print(f"{t:<34}" + "".join(_fmt(cmp["final_accuracy"][e][t], w, 4) for e in engines))
    if len(engines) >= 2:
        print()
        print("Agreement")
        for key, val in cmp["max_abs_diff_final_accuracy"].items():
            print(f"  {key:<24} max |d final acc| = {val:.3g}   "
                  f"max |d acc| over rounds 0..{R} = {cmp['max_abs_diff_accuracy_all_rounds'][key]:.3g}   "
                  f"max |d final weights| = {cmp['max_abs_diff_final_weights'][key]:.3g}")
        print(f"  max abs difference of final accuracy across all engines: "
              f"{cmp['max_abs_diff_final_accuracy_all']:.3g}")
        if "same_assignments_simulation_inprocess" in cmp:
            print("  simulation made the same assignments as inprocess: "
                  f"{'yes' if cmp['same_assignments_simulation_inprocess'] else 'NO'}")
        if "plain" in st:
            if st["plain"]["flwr_imported"]:
                print("  plain process imported flwr: yes (no Flower code runs in the loop)")
            else:
                print("  plain process imported flwr: no")
    print()
    print("Note: wall-clock numbers on a shared 2-core machine; other processes (e.g. test "
          "runs) may be competing for the CPUs, so treat them as noisy.")


def parent_main(args: argparse.Namespace) -> None:
    settings = make_settings(args)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise SystemExit(f"unknown engines {unknown}; choose from {', '.join(ENGINES)}")
    if "plain" in engines and "inprocess" not in engines:
        raise SystemExit("the plain loop replays the in-process run's assignments: "
                         "include 'inprocess' in --engines")
    load_before = os.getloadavg()
    reps: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_engines_") as workdir:
        # In-process first: the plain loop replays its assignments.
        for eng in [e for e in ("inprocess", "plain", "simulation") if e in engines]:
            extra: list[str] = []
            if eng == "plain":
                path = os.path.join(workdir, "assignments.json")
                with open(path, "w") as f:
                    json.dump(reps["inprocess"]["assignments"], f)
                extra = ["--_assignments", path]
            reps[eng] = run_child(args, eng, workdir, extra)
        load_after = os.getloadavg()
        summary = summarize(reps, settings.num_rounds)
        cmp = compare(reps, settings.num_rounds)
    print_report(settings, summary, cmp, (load_before, load_after))
    if args.json:
        import platform

        try:
            from importlib.metadata import version

            versions = {p: version(p) for p in ("flwr", "torch", "ray", "numpy")}
        except Exception:  # noqa: BLE001 - informative only
            versions = {}
        data = {
            "settings": settings.to_run_config(),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version(), "versions": versions,
                        "loadavg_before": load_before, "loadavg_after": load_after},
            **summary,
            "agreement": {k: v for k, v in cmp.items()},
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
