"""Seconds the end-of-run outputs take at large N (issue 59): ``write_outputs``
(metrics.csv, summary.json, assignments.csv, accuracy.png, assignments.png,
training.png) and ``report.html``, without training anything.

A run's result is made up of ``--num-clients`` clients, ``--models`` models and
``--rounds`` rounds, as the end of a run hands it over: per round every client
trains every model (``--share 1``, the most picks a round can hold, as
``mfa-rr`` with every client), or a random share of them (``--share 0.01``, as
LVR's budget), a rejected part every 97 picks, and the history rows of every
model and round. The outputs go to a temporary folder; the script prints the
seconds of each part and their sum. Issue 59 asks for at most 10 s at
N = 100,000 (``mmfl run --engine vectorized --tasks synthetic,synthetic
--strategy lvr --num-clients 100000 --local-epochs 1 --num-rounds 2``).

Example::

    python benchmarks/bench_end_of_run.py --num-clients 100000 --models 2 --rounds 2
    python benchmarks/bench_end_of_run.py --num-clients 100000 --share 0.01

A measurement, not a check: exits 0.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-clients", type=int, default=100_000, help="N (default 100000)")
    p.add_argument("--models", type=int, default=2, help="models (default 2)")
    p.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    p.add_argument(
        "--share", type=float, default=1.0, help="share of the clients picked per round and model"
    )
    args = p.parse_args(argv)
    for name in ("num_clients", "models", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 < args.share <= 1:
        p.error("--share must be in (0, 1]")
    return args


def made_up_result(args: argparse.Namespace):
    from mmfl_flwr.strategy import MultiModelResult

    rng = random.Random(0)
    models = ["synthetic"] + [f"synthetic_{i + 1}" for i in range(1, args.models)]
    assignments, rejections, history = {}, {}, []
    for rnd in range(args.rounds + 1):
        picks = []
        if rnd:
            for m in models:
                k = max(1, int(args.num_clients * args.share))
                ids = (
                    range(args.num_clients)
                    if k == args.num_clients
                    else rng.sample(range(args.num_clients), k)
                )
                picks += [(str(c), m, 1) for c in ids]
            assignments[rnd] = picks
            rejections[rnd] = [(c, m) for c, m, _ in picks[::97]]
        for m in models:
            n = sum(1 for _, t, _ in picks if t == m)
            history.append(
                {
                    "round": rnd,
                    "task": m,
                    "accuracy": rng.random(),
                    "loss": rng.random() * 2,
                    "uploads": n,
                    "assigned": n,
                    "rejected": len(rejections.get(rnd, [])) // len(models),
                    "train_loss": rng.random() if rnd else math.nan,
                    "step_l1": rng.random(),
                    **({"round_step_l1": 1.0, "coef_sum": 1.0, "seconds": 1.0} if rnd else {}),
                }
            )
    return MultiModelResult(history=history, assignments=assignments, rejections=rejections)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from mmfl_flwr.config import Settings
    from mmfl_flwr.flower_app.server_app import _report
    from mmfl_flwr.results import write_outputs

    result = made_up_result(args)
    picks = sum(len(p) for p in result.assignments.values())
    print(
        f"[bench] N = {args.num_clients}, {args.models} models, {args.rounds} rounds, "
        f"{picks} picks",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        s = Settings(
            tasks=",".join(["synthetic"] * args.models),
            strategy="lvr",
            num_clients=args.num_clients,
            num_rounds=args.rounds,
            output_dir=tmp,
        )
        s.save(str(Path(tmp) / "config.json"))
        t0 = time.perf_counter()
        write_outputs(result, s, tmp)
        t1 = time.perf_counter()
        _report(s)
        t2 = time.perf_counter()
        size = (Path(tmp) / "report.html").stat().st_size
    print(
        f"[bench] write_outputs {t1 - t0:.2f} s, report.html {t2 - t1:.2f} s "
        f"({size / 1e6:.2f} MB); end of run {t2 - t0:.2f} s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
