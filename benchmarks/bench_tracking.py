"""What the trackers cost a run (issue 59): seconds per round with TensorBoard,
MLflow and Weights & Biases logging vs without, on the paper-003 round at N = 120.

The workload is bench_engines.py's ``paper003`` preset (``--strategy lvr --profile
paper003 --tasks digits,digits,digits --local-epochs 5 --budget-fraction 0.1
--batch-size 10000``): each round a loss query of every client-model pair, the
LVR picks, their training and the server-side evaluation. A run's seconds per
round are measured from the first round callback (after round 0) to the last,
divided by the rounds: the trackers' logging of every round but the last falls
inside, as do the run's per-round files; the start-up (imports, a tracker's
first connection, the data) does not. Runs alternate (without, with, without,
with, ...), ``--repeats`` times each, after one warm-up run, every run in a
fresh temporary output folder; the medians are compared.

W&B runs offline (``WANDB_MODE=offline`` unless set), MLflow writes its local
store in the output folder unless ``MLFLOW_TRACKING_URI`` is set.

Example::

    python benchmarks/bench_tracking.py                      # N = 120, 5 rounds, 3 repeats
    python benchmarks/bench_tracking.py --num-rounds 10 --repeats 5 --engine vectorized

Prints one line per run and the ratio ``with / without``, and the seconds the
loggers' per-round calls took (``LoggerHub``'s ``log_round`` and ``log_clients``,
timed directly: the part of the ratio that is not noise); exits 0 (a
measurement, not a check).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORKLOAD = dict(
    strategy="lvr",
    profile="paper003",
    tasks="digits,digits,digits",
    local_epochs=5,
    budget_fraction=0.1,
    batch_size=10000,
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-clients", type=int, default=120, help="N (default 120)")
    p.add_argument("--num-rounds", type=int, default=5, help="rounds per run (default 5)")
    p.add_argument("--repeats", type=int, default=3, help="runs with and without (default 3)")
    p.add_argument(
        "--engine", choices=("inprocess", "vectorized"), default="inprocess", help="the engine"
    )
    p.add_argument(
        "--loggers",
        default="tensorboard,mlflow,wandb",
        help="the trackers of the runs with logging (default all three)",
    )
    p.add_argument("--seed", type=int, default=0, help="the runs' seed (default 0)")
    args = p.parse_args(argv)
    for name in ("num_clients", "num_rounds", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


#: seconds spent in the loggers' log_round / log_clients calls, per run
IN_LOGGERS: list[float] = []


def _time_the_loggers() -> None:
    """Count the seconds of the trackers' per-round calls (LoggerHub._call)."""
    from mmfl_flwr.tracking import LoggerHub

    inner = LoggerHub._call

    def timed(self, method, *args):
        t0 = time.perf_counter()
        try:
            return inner(self, method, *args)
        finally:
            if method in ("log_round", "log_clients") and IN_LOGGERS:
                IN_LOGGERS[-1] += time.perf_counter() - t0

    LoggerHub._call = timed  # type: ignore[method-assign]


def seconds_per_round(args: argparse.Namespace, loggers: str, rounds: int) -> float:
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run
    from mmfl_flwr.tracking import RunLogger

    IN_LOGGERS.append(0.0)

    class Clock(RunLogger):
        name = "clock"

        def __init__(self) -> None:
            self.times: dict[int, float] = {}

        def log_round(self, rnd, metrics, rows):
            self.times[rnd] = time.perf_counter()

    clock = Clock()
    with tempfile.TemporaryDirectory() as tmp:
        s = Settings(
            **WORKLOAD,
            num_clients=args.num_clients,
            num_rounds=rounds,
            seed=args.seed,
            output_dir=str(Path(tmp) / "run"),
            log_to=loggers,
            no_progress=True,
            no_report=True,
        )
        run(s, engine=args.engine, loggers=[clock])
    return (clock.times[rounds] - clock.times[0]) / rounds


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    from mmfl_flwr.tracking import check_installed, parse_log_to

    try:
        names = parse_log_to(args.loggers)
        check_installed(names)
    except ValueError as err:
        print(f"bench_tracking.py: error: {err}", file=sys.stderr)
        return 2
    print(
        f"[bench] paper-003 round, N = {args.num_clients}, {args.num_rounds} rounds, "
        f"engine {args.engine}, trackers {','.join(names) or 'none'}",
        flush=True,
    )
    _time_the_loggers()
    seconds_per_round(args, args.loggers, 1)  # warm-up: imports, data caches
    plain, tracked, spent = [], [], []
    for i in range(args.repeats):
        plain.append(seconds_per_round(args, "", args.num_rounds))
        print(f"[bench] run {i + 1} without trackers: {plain[-1]:.3f} s/round", flush=True)
        tracked.append(seconds_per_round(args, args.loggers, args.num_rounds))
        spent.append(IN_LOGGERS[-1] / (args.num_rounds + 1))  # rounds 0..R
        print(
            f"[bench] run {i + 1} with {args.loggers}: {tracked[-1]:.3f} s/round, of which "
            f"{spent[-1] * 1000:.1f} ms in the loggers' per-round calls",
            flush=True,
        )
    a, b = statistics.median(plain), statistics.median(tracked)
    print(
        f"[bench] median s/round: without {a:.3f}, with {b:.3f}; ratio with/without "
        f"{b / a:.3f} ({(b / a - 1) * 100:+.1f}%); the loggers' per-round calls "
        f"{statistics.median(spent) * 1000:.1f} ms a round "
        f"({statistics.median(spent) / a * 100:.2f}% of a round without them)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
