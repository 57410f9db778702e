"""The fast paths with one other CPU-bound process on the machine (issue 24).

    python benchmarks/bench_contention.py [--num-clients 120] [--num-rounds 4] \
        [--engines vectorized,inprocess,sim-half] [--json out.json]

Runs ``benchmarks/bench_engines.py --workload paper003`` twice on the same
engines: on an idle machine, then while one other process spins on the CPU
(``while True: pass``, not pinned: the scheduler places it), and prints each
engine's mean seconds per round (rounds 2..R) in both, and their ratio. The
vectorized engine's torch threads are ``--threads auto``: the cores other
processes leave free, checked before every round trip.

It also measures the machine's own floor: two fixed single-threaded workloads
(``torch`` matrix products with one thread, and a pure-Python loop), each timed
three times on the idle machine and three times beside the same spinning
process (median of each). A single thread has a core of its own on a machine
whose cores are independent, so its ratio is near 1; a ratio well above 1 says
the machine's CPUs share hardware (SMT siblings, or a hypervisor placing both
virtual CPUs on one core), and no engine can stay closer to its idle time than
that floor (about 30 s of the run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def bench(engines: str, n: int, rounds: int, out: str) -> dict:
    cmd = [
        sys.executable,
        os.path.join(HERE, "bench_engines.py"),
        "--workload",
        "paper003",
        "--num-clients",
        str(n),
        "--num-rounds",
        str(rounds),
        "--engines",
        engines,
        "--json",
        out,
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


#: The floor's workloads: each prints its own seconds (one thread each).
FLOORS = {
    "torch, 1 thread": "import time, torch\ntorch.set_num_threads(1)\n"
    "a = torch.randn(384, 384)\nt = time.perf_counter()\n"
    "for _ in range(1500):\n    a @ a\nprint(time.perf_counter() - t)",
    "python loop": "import time\nt = time.perf_counter()\nx = 0\n"
    "for i in range(20_000_000):\n    x += i\nprint(time.perf_counter() - t)",
}


def floor(repeats: int = 3) -> dict[str, float]:
    """Median seconds of each floor workload over ``repeats`` runs."""
    out = {}
    for name, code in FLOORS.items():
        times = sorted(
            float(
                subprocess.run(
                    [sys.executable, "-c", code], check=True, capture_output=True, text=True
                ).stdout.split()[-1]
            )
            for _ in range(repeats)
        )
        out[name] = times[len(times) // 2]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--num-clients", type=int, default=120)
    p.add_argument("--num-rounds", type=int, default=4)
    p.add_argument("--engines", default="vectorized,inprocess,sim-half")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    if a.num_rounds < 2 or a.num_clients < 1:
        p.error("--num-rounds >= 2 and --num-clients >= 1")
    with tempfile.TemporaryDirectory(prefix="bench_contention_") as tmp:
        print("idle machine ...", flush=True)
        idle_floor = floor()
        idle = bench(a.engines, a.num_clients, a.num_rounds, os.path.join(tmp, "idle.json"))
        print("with one other CPU-bound process ...", flush=True)
        spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            busy_floor = floor()
            busy = bench(a.engines, a.num_clients, a.num_rounds, os.path.join(tmp, "busy.json"))
        finally:
            spin.kill()
            spin.wait()
    engines = [e for e in a.engines.split(",") if e in idle["engines"]]
    print(
        f"\n{os.cpu_count()} CPUs; paper-003 round, N = {a.num_clients}, mean s/round over "
        f"rounds 2..{a.num_rounds}"
    )
    print(f"{'engine':<12}{'idle':>9}{'contended':>11}{'ratio':>8}")
    rows = {}
    for e in engines:
        i = idle["engines"][e]["mean_excl_round1"]
        b = busy["engines"][e]["mean_excl_round1"]
        rows[e] = {"idle": i, "contended": b, "ratio": b / i}
        print(f"{e:<12}{i:>9.3f}{b:>11.3f}{b / i:>8.2f}")
    print(
        "\nthe machine's floor: one thread's seconds, median of 3, idle and beside the same process"
    )
    floors = {}
    for name in FLOORS:
        i, b = idle_floor[name], busy_floor[name]
        floors[name] = {"idle": i, "contended": b, "ratio": b / i}
        print(f"{name:<18}{i:>9.3f}{b:>11.3f}{b / i:>8.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "num_clients": a.num_clients,
                    "num_rounds": a.num_rounds,
                    "cpus": os.cpu_count(),
                    "engines": rows,
                    "floor": floors,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
