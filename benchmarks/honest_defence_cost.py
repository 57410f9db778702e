"""What the default defences cost honest runs where they act most: papers
000/001's label-clustered federations (``benchmarks/paper001_group.py``'s
scenarios and methods), every client honest, each run once with the default
bounds and once with a defence configuration changed, paired by seed.

On real MNIST (``mnist-5k``) with label clusters, the default update clip
(3 x the round's reference norm) acts on honest clients: 35 times over the 9
published runs of scenario (a) (3 seeds), some at 6x the bound. This measures
whether those clips cost accuracy::

    python benchmarks/honest_defence_cost.py --task mnist-5k --scenarios consistent \\
        --seeds 0-8 --num-rounds 20 --defences no-clip \\
        --cache docs/results/mnist5k/defence_cost_runs.jsonl \\
        --markdown docs/results/mnist5k/defence_cost.md

Defence configurations (against the defaults): ``no-clip`` (neither the update
clip, the direction check nor the bound on reversed updates; the rejection
bounds stay), ``no-direction`` (the clip alone), ``influence-clip`` (the defaults plus the
influence bound at its measured factor). The runs with the defaults have the
same keys as ``paper001_group.py``'s, so a cache of its runs can be reused
(copy its lines into ``--cache``).

Per scenario and method: final accuracy (mean of the last 5 rounds, over the
models) with the defaults and with the configuration, the paired difference
(configuration - defaults) with its 95% t interval over seeds, and a paired
TOST at +-``--margin`` (default 0.05, the issue's tolerance: equivalent when
the 90% interval lies inside the margin). The row ``all methods`` averages the
methods within each seed first (the methods of one seed share its federation
and initial weights, so their pairs are not independent) and pairs the seeds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import _evidence as E
import paper001_group as G

NAME = "honest_defence_cost"
#: the strategy bounds each configuration changes (the others stay at their defaults)
DEFENCES: dict[str, dict[str, Any]] = {
    "no-clip": {
        "update_clip_factor": None,
        "direction_factor": None,
        "reversed_influence_factor": None,
    },
    "no-direction": {"direction_factor": None, "reversed_influence_factor": None},
    "influence-clip": {"influence_clip_factor": 4.0},  # validation.INFLUENCE_CLIP_FACTOR
}


def _one(job: tuple[Any, ...]) -> list[dict[str, Any]]:
    """One run: ``paper001_group``'s job (scenario, method, seed, rounds, engine,
    task), plus the defence configuration when it is not the defaults."""
    if len(job) < 7:
        return G._one(job)
    scenario, method, seed, num_rounds, engine, task, defence = job
    s, strategy, _ = G.build(scenario, method, seed, num_rounds, task, DEFENCES[defence])
    result = G.quiet_run(s, strategy, engine)
    return [
        {
            "scenario": scenario,
            "method": method,
            "seed": seed,
            **{k: v for k, v in r.items() if k != "seconds"},
        }
        for r in result.history
    ]


def _task_suffix(task: str) -> tuple[str, ...]:
    """What paper001_group.py appends to a job's key for a task kind (none for digits)."""
    return () if task == "digits" else (task,)


def _row(name: str, base: dict[int, float], other: dict[int, float], margin: float) -> str:
    d = E.paired_ci(other, base)
    eq = E.equivalence(other, base, margin)
    return (
        f"| {name} | {E.mean_ci(list(base.values()))[0]:.3f} | "
        f"{E.mean_ci(list(other.values()))[0]:.3f} | {E.signed(d['mean'])} "
        f"[{E.signed(d['lo'])}, {E.signed(d['hi'])}] | {eq['verdict']} "
        f"[{E.signed(eq['lo'])}, {E.signed(eq['hi'])}] |"
    )


def table(
    rows_by: dict[str, list[dict[str, Any]]], scenario: str, defence: str, margin: float
) -> list[str]:
    """Per method, and for the methods averaged within each seed: final
    accuracy with the defaults and with ``defence``, their paired difference
    and TOST."""
    base = E.final_values([r for r in rows_by["default"] if r["scenario"] == scenario], last=G.LAST)
    other = E.final_values([r for r in rows_by[defence] if r["scenario"] == scenario], last=G.LAST)
    out = [
        f"| method | defaults | {defence} | {defence} - defaults [95% CI] | "
        f"TOST +-{margin:g} (90% CI) |",
        "|---|---|---|---|---|",
    ]
    for m in G.METHODS:
        out.append(_row(m, base[m], other[m], margin))
    seeds = sorted(set.intersection(*(set(base[m]) & set(other[m]) for m in G.METHODS)))
    per_seed = [
        {sd: sum(v[m][sd] for m in G.METHODS) / len(G.METHODS) for sd in seeds}
        for v in (base, other)
    ]
    out.append(_row(f"all methods (averaged per seed, {len(seeds)} seeds)", *per_seed, margin))
    return out


def jobs_for(
    task: str, scenarios: list[str], seeds: list[int], rounds: int, engine: str, defences: list[str]
) -> dict[str, list[tuple[Any, ...]]]:
    """The runs of each configuration: the defaults' keys are
    ``paper001_group.py``'s own (its caches serve them), a changed
    configuration's add the task kind and the configuration's name."""
    extra = _task_suffix(task)
    return {
        d: [
            (sc, m, sd, rounds, engine, *extra)
            if d == "default"
            else (sc, m, sd, rounds, engine, task, d)
            for sd in seeds
            for sc in scenarios
            for m in G.METHODS
        ]
        for d in ["default", *defences]
    }


def main(argv: list[str] | None = None) -> int:
    p = E.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="mnist-5k", choices=G.TASK_KINDS)
    p.add_argument("--scenarios", default="consistent")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--num-rounds", default="20")
    p.add_argument(
        "--defences",
        default="no-clip",
        help=f"configurations compared with the defaults: some of {list(DEFENCES)}",
    )
    p.add_argument("--margin", default="0.05", help="equivalence margin (accuracy)")
    p.add_argument("--engine", default="inprocess", choices=("inprocess", "vectorized"))
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--cache", default="", help="JSON-lines file of finished runs (reused)")
    p.add_argument("--markdown", default="", help="write the tables here")
    a = p.parse_args(argv)
    seeds = E.int_list(p, "--seeds", a.seeds)
    rounds = E.int_list(p, "--num-rounds", a.num_rounds, low=1)
    if len(rounds) != 1:
        p.error(f"--num-rounds: give one value; got {a.num_rounds!r}")
    margin = E.margin_arg(p, a.margin)
    scenarios = [x for x in a.scenarios.split(",") if x]
    unknown = [x for x in scenarios if x not in G.LABELS]
    if not scenarios or unknown:
        p.error(f"--scenarios: choose from {list(G.LABELS)}; got {a.scenarios!r}")
    defences = [x for x in a.defences.split(",") if x]
    if not defences or any(d not in DEFENCES for d in defences):
        p.error(f"--defences: choose from {list(DEFENCES)}; got {a.defences!r}")
    if a.workers < 1:
        p.error(f"--workers must be >= 1; got {a.workers}")
    if a.markdown and Path(a.markdown).is_dir():
        p.error(f"--markdown {a.markdown}: a folder; give a file name")
    if a.task == "mnist-5k":
        from mmfl_flwr.tasks.datasets import DatasetNotFound, mnist_5k_path

        try:
            mnist_5k_path()
        except DatasetNotFound as err:
            p.error(f"--task mnist-5k: {err}".splitlines()[0])
    R = rounds[0]
    jobs = jobs_for(a.task, scenarios, seeds, R, a.engine, defences)
    every = [j for js in jobs.values() for j in js]
    E.check_cache(a.cache, every)
    print(
        f"{NAME}: {len(every)} runs ({R} rounds, seeds {seeds}, task {a.task}, "
        f"{a.workers} workers)",
        flush=True,
    )
    before = set(E._load_cache(Path(a.cache) if a.cache else None)[0])
    t0 = time.monotonic()
    results = E.map_cached(
        _one,
        every,
        a.workers,
        a.cache,
        label=lambda j: f"{j[0]} {j[1]} seed {j[2]} {j[6] if len(j) > 6 else 'default'}",
    )
    by_job = dict(zip(map(E._key, every), results))
    rows_by = {d: [r for j in js for r in by_job[E._key(j)]] for d, js in jobs.items()}
    cached = sum(1 for j in every if E._key(j) in before)
    lines = [
        f"Command: `{E.command(NAME, argv)}` (runs: {E.machines_used()}; this "
        f"invocation ran {len(every) - cached} of the {len(every)} runs in "
        f"{time.monotonic() - t0:.0f} s, the others came from its cache).",
        "",
    ]
    for sc in scenarios:
        for d in defences:
            lines += [
                f"**{G.LABELS[sc]}, {a.task}, {R} rounds, seeds "
                f"{','.join(map(str, seeds))}: {d} against the defaults**",
                "",
            ]
            lines += table(rows_by, sc, d, margin) + [""]
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        Path(a.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(a.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
