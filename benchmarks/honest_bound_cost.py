"""What the bound on reversed updates (``reversed-influence-factor``, on by
default) costs honest federations: every client honest, each preset run once
with the defaults and once with ``--reversed-influence-factor 0``, paired by
seed, on a data profile where honest clients differ (paper 003's by default:
skewed data sizes and label subsets):

    python benchmarks/honest_bound_cost.py --profile paper003 --num-clients 20 \\
        --num-rounds 10 --local-epochs 3 --seeds 1-6 \\
        --markdown docs/results/reversed_bound_cost_paper003.md

Per preset: how many scalings the bound logged per run (with the defaults; under
the oracle StaleVR one update can be held on the expected step, the counted step
and the read of its stale weight, a line each) and the most it scaled one down
(the update's influence over its bound; 1.0x: none), and the final accuracy with the
bound and without it: the mean over the models, per seed, and their difference (with
minus without) paired over seeds, with its 95% t interval and a paired TOST against
``--margin``. The bound's scalings are read from the log lines that name an update
pointing against the others (``mmfl_flwr.strategy.validation.InfluenceBound``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import re
import sys
from typing import Any

from _evidence import (
    Parser,
    check_output_files,
    command,
    equivalence,
    int_list,
    machine,
    margin_arg,
    mean_ci,
    name_list,
    paired_ci,
    write_outputs,
)
from hostile_clients import _Tap

#: What the bound's log lines say (and no other bound's).
MARK = "points against the model's other updates"
#: ``... = <influence>) exceeds <bound>`` in the step and expected-step lines;
#: ``... = <influence>) exceeds the round's influence bound <bound>`` in the
#: fresh-update lines (the oracle StaleVR's reads).
RATIO = re.compile(r"= ([0-9.e+-]+)\) exceeds (?:the round's influence bound )?([0-9.e+-]+)")


def _run(job: tuple[str, int, bool, str, int, int, int]) -> dict[str, Any]:
    """One honest in-process run; ``on``: with the bound (the defaults)."""
    preset, seed, on, profile, clients, rounds, epochs = job
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run_inprocess

    if preset == "group" and profile == "uniform":
        profile = "clusters-consistent"  # MMFL-Group needs clustered clients
    s = Settings(
        strategy=preset,
        profile=profile,
        num_clients=clients,
        num_rounds=rounds,
        local_epochs=epochs,
        seed=seed,
        output_dir="",
        reversed_influence_factor=4.0 if on else 0.0,
    )
    logger = logging.getLogger("flwr")
    level, quiet = logger.level, [(h, h.level) for h in logger.handlers]
    logger.setLevel(logging.WARNING)
    for h, _ in quiet:  # the console stays quiet; the tap reads the log
        h.setLevel(logging.ERROR)
    tap = _Tap()
    logger.addHandler(tap)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            result = run_inprocess(s)
    finally:
        logger.removeHandler(tap)
        logger.setLevel(level)
        for h, lvl in quiet:
            h.setLevel(lvl)
    tap.add_actions(result)
    acted = [m for m in tap.lines if MARK in m]
    found = [RATIO.search(m) for m in acted]
    trims = [float(f.group(1)) / float(f.group(2)) for f in found if f]
    return {
        "preset": preset,
        "seed": seed,
        "bound": on,
        "accuracy": {t: r["accuracy"] for t, r in result.final().items()},
        "scalings": len(acted),
        "largest_trim": max(trims, default=1.0),
    }


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="", help="comma-separated presets (default: all)")
    p.add_argument("--profile", default="paper003", help="the federation's data profile")
    p.add_argument("--num-clients", type=int, default=20)
    p.add_argument("--num-rounds", type=int, default=10)
    p.add_argument("--local-epochs", type=int, default=3)
    p.add_argument("--seeds", default="1-3", help="seeds, e.g. 1-3 (at least two)")
    p.add_argument(
        "--margin",
        default="0.05",
        help="the equivalence margin of the paired TOST, in accuracy (0, 1)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="runs in parallel (processes)",
    )
    p.add_argument("--json", default="", help="write the runs and the rows here")
    p.add_argument("--markdown", default="", help="write the table here")
    a = p.parse_args(argv)
    from mmfl_flwr.presets import PRESETS
    from mmfl_flwr.tasks.federation import PROFILES

    presets = name_list(p, "--presets", a.presets, PRESETS) if a.presets else list(PRESETS)
    if a.profile not in PROFILES:
        p.error(f"--profile: choose from {', '.join(PROFILES)}; got {a.profile!r}")
    seeds = int_list(p, "--seeds", a.seeds, low=0)
    if len(seeds) < 2:
        p.error("--seeds needs at least two seeds (the differences are paired by seed)")
    margin = margin_arg(p, a.margin)
    for name, value in (
        ("--num-clients", a.num_clients),
        ("--num-rounds", a.num_rounds),
        ("--local-epochs", a.local_epochs),
        ("--workers", a.workers),
    ):
        if value < 1:
            p.error(f"{name} must be >= 1")
    check_output_files(p, (("--json", a.json), ("--markdown", a.markdown)))
    jobs = [
        (pr, s, on, a.profile, a.num_clients, a.num_rounds, a.local_epochs)
        for pr in presets
        for s in seeds
        for on in (True, False)
    ]
    print(f"{len(jobs)} runs", flush=True)
    from concurrent.futures import ProcessPoolExecutor

    done: dict[tuple[str, int, bool], dict[str, Any]] = {}
    with ProcessPoolExecutor(a.workers) as ex:
        for r in ex.map(_run, jobs):
            done[(r["preset"], r["seed"], r["bound"])] = r
            print(
                f"  {r['preset']} seed {r['seed']} {'with' if r['bound'] else 'without'} the "
                f"bound: scalings {r['scalings']}, accuracy "
                + " ".join(f"{t} {v:.3f}" for t, v in r["accuracy"].items()),
                flush=True,
            )
    table = [
        f"`{command('honest_bound_cost', argv)}`",
        "",
        f"Machine: {machine()}.",
        "",
        f"Every client honest; profile `{a.profile}`, {a.num_clients} clients, "
        f"{a.num_rounds} rounds, {a.local_epochs} local epochs, in-process engine, seeds "
        f"{', '.join(map(str, seeds))}. Accuracy: final, mean over the models.",
        "",
        "| preset | scalings per run | largest trim | accuracy with the bound | without "
        f"| with - without [95% CI] | TOST at +-{margin:g} [90% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = []
    for pr in presets:

        def mean_acc(on: bool, pr: str = pr) -> dict[int, float]:
            return {
                s: sum(done[(pr, s, on)]["accuracy"].values()) / len(done[(pr, s, on)]["accuracy"])
                for s in seeds
            }

        with_, without = mean_acc(True), mean_acc(False)
        d, eq = paired_ci(with_, without), equivalence(with_, without, margin)
        scalings = [done[(pr, s, True)]["scalings"] for s in seeds]
        trim = max(done[(pr, s, True)]["largest_trim"] for s in seeds)
        rows.append(
            {
                "preset": pr,
                "with": with_,
                "without": without,
                "difference": d,
                "equivalence": eq,
                "scalings": scalings,
                "largest_trim": trim,
            }
        )
        table.append(
            f"| {pr} | {sum(scalings) / len(seeds):.1f} | {trim:.1f}x | "
            f"{mean_ci(list(with_.values()))[0]:.3f} | "
            f"{mean_ci(list(without.values()))[0]:.3f} | {d['mean']:+.3f} "
            f"[{d['lo']:+.3f}, {d['hi']:+.3f}] | {eq['verdict']} "
            f"[{eq['lo']:+.3f}, {eq['hi']:+.3f}] |"
        )
    print("\n".join(table))
    payload = {"rows": rows, "runs": list(done.values()), "seeds": seeds, "margin": margin}
    write_outputs(a.json, a.markdown, payload, "\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
