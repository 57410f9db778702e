"""Seconds per round and peak memory of big federations (issue 24, item 7).

    python benchmarks/bench_scale.py --num-clients 1000 10000 100000 \
        --engines vectorized,simulation [--rounds 3] [--clients-per-node K] [--json out.json]

Workload: ``--strategy lvr --tasks synthetic,synthetic --local-epochs 1`` (the
default budget), clients of Synthetic(1,1) with tiny data (``synthetic-max-samples``
caps each client's samples, default 20 here). Every round queries the loss of
every (client, model) pair and trains the picked pairs.

- ``vectorized``: one process, one in-process node hosting every client.
- ``simulation``: Flower's simulation engine through a private SuperLink, with
  shard nodes (``clients-per-node auto``: one node per CPU Ray sees; ``K``: K
  clients per node, ``K = N`` one node with every CPU). The ServerApp builds the
  test sets and none of the clients' data; each node builds its own clients'
  data (a worker keeps the clients of every node it has served: Flower's Ray
  backend hands a message to any idle worker; their packed data is mapped from
  one file per shard, ``MMFL_SHARED_DATA``, so it is in memory once).
- ``inprocess``: one node per client (the reference; slow beyond 10,000).

Each (engine, N) runs in a fresh subprocess. Memory is the peak resident set
size: for ``vectorized`` and ``inprocess`` the process's own peak
(``getrusage``); for ``simulation`` the largest sum, sampled every 0.2 s, of the
resident sizes of the process and all its descendants (SuperLink, ServerApp,
Ray workers), and also the largest single process of that tree, with the
processes' sizes at that peak. A sum of resident sizes counts a shared page
(Ray's object store, the libraries every worker maps) once per process: the
``PSS GB`` column is the largest sum of proportional set sizes over the same
tree (each shared page split among the processes mapping it), the memory the
run takes from the machine. Seconds per
round: the strategy's own round time (``seconds`` of the history; round 1 holds
the registration of every client and is shown apart).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ENGINES = ("vectorized", "simulation", "inprocess")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(name))
    return tree


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _pss(pid: int) -> int:
    """Proportional set size (shared pages split among the processes mapping
    them), from ``/proc/<pid>/smaps_rollup``; 0 where unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not args:
        return "?"
    words = [os.path.basename(args[0])] + [a for a in args[1:3] if not a.startswith("-")]
    return " ".join(w[:40] for w in words)


class TreeSampler(threading.Thread):
    """Largest total and largest single RSS of ``pid`` and its descendants, the
    largest total PSS (shared pages counted once), and the processes' sizes at
    that total."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.peak_total = self.peak_single = self.peak_pss = 0
        self.at_peak: list[tuple[str, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            tree = _children()
            pids, todo = [], [self.pid]
            while todo:
                p = todo.pop()
                pids.append(p)
                todo.extend(tree.get(p, ()))
            sizes = [_rss(p) for p in pids]
            if sum(sizes) > self.peak_total:
                self.at_peak = sorted(
                    ((_name(p), r) for p, r in zip(pids, sizes)), key=lambda x: -x[1]
                )
            self.peak_total = max(self.peak_total, sum(sizes))
            self.peak_single = max(self.peak_single, max(sizes, default=0))
            self.peak_pss = max(self.peak_pss, sum(_pss(p) for p in pids))
            self.stop.wait(self.every)


def child(
    engine: str, n: int, rounds: int, max_samples: int, out: str, per_node: str = "auto"
) -> None:
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run

    s = Settings(
        strategy="lvr",
        tasks="synthetic,synthetic",
        num_clients=n,
        num_rounds=rounds,
        local_epochs=1,
        synthetic_max_samples=max_samples,
        output_dir="",
        seed=0,
        clients_per_node=per_node,
    )
    t0 = time.perf_counter()
    result = run(s, engine=engine)
    wall = time.perf_counter() - t0
    seconds: dict[int, float] = {}
    for row in result.history:
        r = int(row["round"])
        if r >= 1 and "seconds" in row:
            seconds[r] = max(seconds.get(r, 0.0), float(row["seconds"]))
    final = {t: round(float(v["accuracy"]), 4) for t, v in result.final().items()}
    uploads = sum(len(p) for p in result.assignments.values())
    with open(out, "w") as f:
        json.dump(
            {
                "wall": wall,
                "seconds": seconds,
                "final": final,
                "uploads": uploads,
                "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            },
            f,
        )


def measure(
    engine: str, n: int, rounds: int, max_samples: int, timeout: float, per_node: str = "auto"
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as tmp:
        out = os.path.join(tmp, "out.json")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--_child",
            engine,
            str(n),
            str(rounds),
            str(max_samples),
            out,
            per_node,
        ]
        with open(os.path.join(tmp, "log"), "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            sampler = TreeSampler(proc.pid)
            sampler.start()
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = None
            sampler.stop.set()
            sampler.join()
        if rc != 0 or not os.path.exists(out):
            with open(os.path.join(tmp, "log")) as f:
                tail = f.read().splitlines()[-15:]
            return {"engine": engine, "n": n, "error": f"exit {rc}", "tail": tail}
        with open(out) as f:
            rep = json.load(f)
    rep.update(
        engine=engine,
        n=n,
        peak_tree=sampler.peak_total,
        peak_single=sampler.peak_single,
        peak_pss=sampler.peak_pss,
        at_peak=sampler.at_peak,
    )
    return rep


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--_child":
        engine, n, rounds, max_samples, out, per_node = sys.argv[2:8]
        child(engine, int(n), int(rounds), int(max_samples), out, per_node)
        return 0
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--num-clients", type=int, nargs="+", default=[1000, 10000, 100000])
    p.add_argument("--engines", default="vectorized,simulation")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--max-samples",
        type=int,
        default=20,
        help="synthetic-max-samples: training samples per client at most",
    )
    p.add_argument(
        "--clients-per-node",
        default="auto",
        help="clients-per-node of the simulation and vectorized engines: "
        "auto (one node per CPU Ray sees; one node for vectorized) or K",
    )
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad or a.rounds < 2 or min(a.num_clients) < 1:
        p.error(f"engines from {', '.join(ENGINES)}, --rounds >= 2, clients >= 1")
    per = a.clients_per_node.strip()
    if per != "auto" and not (per.isdigit() and int(per) >= 1):
        p.error(f"--clients-per-node {per!r}: expected auto or a whole number >= 1")
    print(
        f"machine: {os.cpu_count()} CPUs; workload: lvr, synthetic,synthetic, local "
        f"epochs 1, synthetic-max-samples {a.max_samples}, {a.rounds} rounds, "
        f"clients-per-node {per}",
        flush=True,
    )
    head = (
        f"{'engine':<11}{'N':>8}{'round 1 s':>11}{'later s/round':>15}"
        f"{'peak GB':>9}{'PSS GB':>8}{'largest proc GB':>17}{'uploads':>9}  final accuracy"
    )
    print(head, flush=True)
    reps = []
    for n in a.num_clients:
        for engine in engines:
            rep = measure(engine, n, a.rounds, a.max_samples, a.timeout, a.clients_per_node)
            reps.append(rep)
            if "error" in rep:
                print(
                    f"{engine:<11}{n:>8}  FAILED ({rep['error']}): " + " | ".join(rep["tail"][-3:]),
                    flush=True,
                )
                continue
            sec = {int(k): v for k, v in rep["seconds"].items()}
            later = [v for k, v in sec.items() if k >= 2]
            peak = rep["maxrss"] if engine != "simulation" else rep["peak_tree"]
            single = rep["maxrss"] if engine != "simulation" else rep["peak_single"]
            print(
                f"{engine:<11}{n:>8}{sec.get(1, float('nan')):>11.2f}"
                f"{sum(later) / len(later):>15.2f}{peak / 1e9:>9.2f}{rep['peak_pss'] / 1e9:>8.2f}"
                f"{single / 1e9:>17.2f}{rep['uploads']:>9}  {rep['final']}",
                flush=True,
            )
            if engine == "simulation":
                print(
                    "           at the peak (RSS): "
                    + ", ".join(f"{name} {size / 1e9:.2f}" for name, size in rep["at_peak"][:8]),
                    flush=True,
                )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(reps, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
