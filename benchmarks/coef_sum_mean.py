#!/usr/bin/env python
"""Check E[||H_tau,s||_1] = 1 (paper 003, Eq. 16) on a long run of the paper-003 federation.

    python benchmarks/coef_sum_mean.py --strategy random --num-rounds 300 --seed 11

Runs the strategy on the paper-003 profile (120 clients, 3 digits models, m = 0.1 V) with a
tiny learning rate (the models barely move, so the rounds are nearly exchangeable draws of
the sampling) and prints the mean of the per-model ``coef_sum`` over all (round, model)
pairs with its standard error and z = (mean - 1) / se. The sampling, not the training, is
what is checked; the unit tests (tests/core/test_coef_sum.py, tests/core/test_rr_gvr.py) check the
same expectation on fixed tables by Monte Carlo.
"""

from __future__ import annotations

import argparse
import math
import statistics


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", default="random", choices=("random", "lvr", "gvr"))
    p.add_argument("--num-rounds", type=int, default=300)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--engine", default="inprocess", choices=("inprocess", "vectorized"))
    a = p.parse_args(argv)
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run

    s = Settings(strategy=a.strategy, tasks="digits,digits,digits", profile="paper003",
                 num_clients=120, num_rounds=a.num_rounds, local_epochs=1, lr=0.001,
                 batch_size=16, budget_fraction=0.1, output_dir="", seed=a.seed)
    res = run(s, engine=a.engine)
    v = [float(r["coef_sum"]) for r in res.history
         if r["round"] >= 1 and r["coef_sum"] not in ("", None)]
    mean, se = statistics.fmean(v), statistics.stdev(v) / math.sqrt(len(v))
    print(f"{a.strategy}: {len(v)} (round, model) values, mean coef_sum {mean:.4f}, "
          f"se {se:.4f}, z = {(mean - 1) / se:+.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
