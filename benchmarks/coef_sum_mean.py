#!/usr/bin/env python
"""Check E[||H_tau,s||_1] = 1 (paper 003, Eq. 16) on a long run of the paper-003 federation.

    python benchmarks/coef_sum_mean.py --strategy random --num-rounds 300 --seed 11
    python benchmarks/coef_sum_mean.py --policy-only 0-7 --num-rounds 4000 --window 40

Runs the strategy on the paper-003 profile (120 clients, 3 digits models, m = 0.1 V) with a
tiny learning rate (the models barely move, so the rounds are nearly exchangeable draws of
the sampling) and prints the mean of the per-model ``coef_sum`` over all (round, model)
pairs with its standard error and z = (mean - 1) / se. The sampling, not the training, is
what is checked; the unit tests (tests/core/test_coef_sum.py, tests/core/test_rr_gvr.py) check the
same expectation on fixed tables by Monte Carlo.

``--defences off`` (the default) runs the strategy as paper 003 states it, every bound
off (the reproduction mode); ``--defences default`` runs it with the project's defences
on, a sensitivity run. The header line printed before the run names the mode.
``--policy-only`` trains nothing, so no bound acts there and the switch changes nothing.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _evidence as E  # noqa: E402


def policy_only(seeds: list[int], rounds: int, window: int) -> None:
    """Random allocation's draws alone (no training) on the paper-003 federation of
    each seed, with the strategy's random stream (its first rounds are the runs'
    draws): the mean coef_sum over the first ``window`` rounds and over all
    ``rounds``, with the standard error of the latter over rounds. Nothing is trained
    and no update is aggregated, so no bound of the defences acts here: ``--defences``
    changes nothing (the federation's ``Settings`` only build the clients' data)."""
    import numpy as np

    from mmfl_flwr.config import Settings
    from mmfl_flwr.core import ClientInfo, ClientTable, UnbiasedAggregator, Update
    from mmfl_flwr.core.random_allocation import RandomAllocation
    from mmfl_flwr.flower_app.data import federation_for

    one = [np.ones(1, dtype=np.float32)]
    for seed in seeds:
        f = federation_for(
            Settings(
                strategy="random",
                tasks="digits,digits,digits",
                profile="paper003",
                num_clients=120,
                seed=seed,
            )
        )
        table = ClientTable()
        for c in range(f.num_clients):
            table.upsert(
                ClientInfo(
                    cid=str(c),
                    num_examples=dict(f.num_examples(c)),
                    processors=int(f.processors[c]),
                )
            )
        tasks = list(f.tasks)
        policy, agg = RandomAllocation(budget_fraction=0.1), UnbiasedAggregator()
        shares = {t: table.data_share(t) for t in tasks}
        procs = {c.cid: c.processors for c in table.clients()}
        rng = np.random.default_rng(seed)  # the strategy's stream (MultiModelStrategy)
        sums = np.empty((rounds, len(tasks)))
        for r in range(rounds):
            ups: dict[str, list[Update]] = {t: [] for t in tasks}
            for pk in policy.assign(table, tasks, r + 1, rng):
                ups[pk.task].append(
                    Update(
                        pk.cid, one, 1, shares[pk.task][pk.cid], procs[pk.cid], pk.prob, pk.count
                    )
                )
            for j, t in enumerate(tasks):
                sums[r, j] = agg.coefficient_sum(t, ups[t], shares=shares[t])
        per_round = sums.mean(axis=1)
        se = per_round.std(ddof=1) / math.sqrt(rounds)
        print(
            f"seed {seed}: rounds 1-{window} {sums[:window].mean():.4f}; rounds 1-{rounds} "
            f"{sums.mean():.4f} (se {se:.4f}, z = {(sums.mean() - 1) / se:+.2f})",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = E.Parser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", default="random", choices=("random", "lvr", "gvr"))
    p.add_argument("--num-rounds", type=int, default=300)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--engine", default="inprocess", choices=("inprocess", "vectorized"))
    p.add_argument(
        "--policy-only",
        metavar="SEEDS",
        default="",
        help="no training: draw --num-rounds rounds of random allocation on the "
        "federation of each seed (e.g. 0-7) and print the mean coef_sum of "
        "the first --window rounds and of all",
    )
    p.add_argument(
        "--window",
        type=int,
        default=40,
        help="with --policy-only: the first rounds read apart (default 40)",
    )
    E.defences_arg(p)
    a = p.parse_args(argv)
    if a.num_rounds < 1:
        p.error(f"--num-rounds must be >= 1; got {a.num_rounds}")
    if a.policy_only:
        if a.strategy != "random":
            p.error("--policy-only draws random allocation only")
        if not 1 <= a.window <= a.num_rounds:
            p.error(f"--window must be in [1, --num-rounds]; got {a.window}")
        # draws only: no training, no aggregation, so no bound acts whatever --defences says
        print(
            f"random allocation's draws on the paper-003 federation, {a.num_rounds} rounds "
            "a seed: nothing trained, no bound acts (--defences changes nothing)",
            flush=True,
        )
        policy_only(E.int_list(p, "--policy-only", a.policy_only, low=0), a.num_rounds, a.window)
        return 0
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run

    s = Settings(
        **E.with_defences(
            dict(
                E.PAPER003_FEDERATION,
                strategy=a.strategy,
                num_rounds=a.num_rounds,
                lr=0.001,
                seed=a.seed,
            ),
            a.defences,
        )
    )
    status = E.run_status(E.recorded_settings(s.defences, s.bounds()))
    print(
        f"{a.strategy} on the paper-003 federation, {a.num_rounds} rounds, seed {a.seed}, "
        f"engine {a.engine}. {E.defences_text(status)}",
        flush=True,
    )
    res = run(s, engine=a.engine)
    v = [
        float(r["coef_sum"])
        for r in res.history
        if r["round"] >= 1 and r["coef_sum"] not in ("", None)
    ]
    mean, se = statistics.fmean(v), statistics.stdev(v) / math.sqrt(len(v))
    print(
        f"{a.strategy}: {len(v)} (round, model) values, mean coef_sum {mean:.4f}, "
        f"se {se:.4f}, z = {(mean - 1) / se:+.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
