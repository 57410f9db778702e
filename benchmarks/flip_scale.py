"""How much of a reversed update does the damage: one client's update flipped
at a fraction of its norm, against the defences.

The attack field (``hostile_clients.py --field``) leaves reversed updates on the
``synthetic`` model not contained under MFA-RR and StaleVR. This probe asks
whether any bound on an update's size could contain them: client 3 sends
``scale x`` its honest update every round (``0`` sends a zero update, ``-0.1``
its update reversed at a tenth of its norm, ``-1`` the sign flip), on the field
benchmark's settings (tasks ``digits,synthetic``, 12 clients, 8 rounds, 5 local
epochs, in-process engine), with the honest and the attacker-absent runs (client
3 fails every training) as references, paired by seed:

    python benchmarks/flip_scale.py --presets mfa-rr,stalevr \\
        --defences default,influence-clip --scales 0,-0.1,-0.3,-1 --seeds 0-5 \\
        --markdown docs/results/flip_scale.md

It prints each model's drop of final accuracy against the honest run, per seed
and as a mean with its 95% interval, the same drop on the other clients' local
test data (on ``synthetic``, the server's test set without client 3's own users:
:func:`others_accuracy`), and what the direction check saw in the last round it
scored a model (:func:`mmfl_flwr.strategy.validation.check_directions`,
read through ``BOUND_OBSERVERS``): the lowest and second lowest score of that
round's uploaders (a client's score is its mean cosine with the other clients'
median update) and the median over every scored client, the check's ``m``. The
scores carry no client ids. Under StaleVR every client uploads every model every
round, so the attacker's score is among the uploaders'; under MFA-RR it is only
when client 3 trained that model in that round.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
from collections.abc import Collection
from typing import Any

from _evidence import (
    Parser,
    check_output_files,
    command,
    int_list,
    machine,
    mean_ci,
    paired_ci,
    write_outputs,
)
from hostile_clients import DEFENCES, HOSTILE, _field_attack, field_settings


def _attack(scale: float | None) -> Any:
    """The client-app wrapper of a run: None is the honest run, NaN the absent one
    (the field benchmark's: client 3 fails every training)."""
    from mmfl_flwr.testing import hostile as H

    if scale is None:
        return None
    if scale != scale:
        return _field_attack("absent")
    return H.scaled_update(HOSTILE, scale)


def others_accuracy(
    settings: Any, arrays: Any, excluded: str | Collection[str]
) -> dict[str, float]:
    """Each model's accuracy on the local test data of every client eligible for
    it but ``excluded`` (one id, or several: a coalition's). On ``synthetic`` the
    server's test set is every user's test split, so under a profile where every
    client holds the task this is the server's test set without the excluded
    clients' own users. On ``digits`` the clients' local test sets split the global
    test set among the holders of each label, so it leaves out only the excluded
    clients' share of their labels' test examples. The federation is the cached
    one of ``settings`` (built once per process)."""
    from mmfl_flwr.client.trainer import evaluate_arrays
    from mmfl_flwr.flower_app.data import federation_for
    from mmfl_flwr.records import arrays_to_numpy
    from mmfl_flwr.tasks.data import concat_datasets
    from mmfl_flwr.tasks.models import make_model

    fed = federation_for(settings)
    left_out = {excluded} if isinstance(excluded, str) else set(excluded)
    out = {}
    for task, record in arrays.items():
        parts = [
            fed.client_data(k, task)[1]
            for k in range(fed.num_clients)
            if str(k) not in left_out and bool(fed.eligible[task][k])
        ]
        data = concat_datasets([d for d in parts if len(d)])
        _, out[task] = evaluate_arrays(
            lambda k=fed.kinds[task]: make_model(k), arrays_to_numpy(record), data
        )
    return out


def _run(job: tuple[str, str, float | None, int, int]) -> dict[str, Any]:
    preset, defence, scale, seed, rounds = job
    from mmfl_flwr.runner import run_inprocess
    from mmfl_flwr.strategy.validation import BOUND_OBSERVERS

    logger = logging.getLogger("flwr")
    saved = (logger.level, [(h, h.level) for h in logger.handlers])
    scores: dict[str, list[float]] = {}

    def observe(kind: str, task: str, values: list[float], reference: float) -> None:
        if kind == "direction":
            # the round's uploaders' scores, sorted, then the median over every scored
            # client; each round replaces the one before
            scores[task] = sorted(values) + [reference]

    BOUND_OBSERVERS.append(observe)
    try:
        logger.setLevel(logging.WARNING)  # quiet runs; the process's logging comes back after
        for h in logger.handlers:
            h.setLevel(logging.ERROR)
        settings = field_settings(preset, defence, seed, rounds)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            result = run_inprocess(settings, wrap_client_app=_attack(scale))
    finally:
        BOUND_OBSERVERS.remove(observe)
        logger.setLevel(saved[0])
        for h, level in saved[1]:
            h.setLevel(level)
    return {
        "preset": preset,
        "defence": defence,
        "scale": scale,
        "seed": seed,
        "accuracy": {t: r["accuracy"] for t, r in result.final().items()},
        "others": others_accuracy(settings, result.arrays, HOSTILE),
        "scores": scores,
    }


def _label(scale: float | None) -> str:
    if scale is None:
        return "honest"
    if scale != scale:
        return "absent"
    return f"{scale:g} x"


def _scores_text(s: list[float] | None) -> str:
    """``lowest / second lowest / median`` of an observation (``-`` where the check
    never scored the model, or the round had one scored uploader)."""
    if not s:
        return "-"
    values, median = s[:-1], s[-1]
    low = [f"{v:+.2f}" for v in values[:2]] + ["-"] * (2 - len(values[:2]))
    return f"{low[0]} / {low[1]} / {median:+.2f}"


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="mfa-rr,stalevr", help="comma-separated presets")
    p.add_argument(
        "--defences",
        default="default,influence-clip",
        help="comma-separated defence configurations of hostile_clients.py --field",
    )
    p.add_argument(
        "--scales",
        default="0,-0.1,-0.3,-1",
        help="multiples of client 3's honest update it sends (0: a zero update); "
        "write --scales=-1,-0.1 when the first is negative",
    )
    p.add_argument("--seeds", default="0-5", help="seeds, e.g. 0-5 or 0,2,4 (at least two)")
    p.add_argument("--num-rounds", type=int, default=8)
    p.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="runs in parallel (processes; default 2, or 1 on a one-core machine)",
    )
    p.add_argument("--json", default="", help="write the rows and the scores here")
    p.add_argument("--markdown", default="", help="write the tables here")
    a = p.parse_args(argv)
    seeds = int_list(p, "--seeds", a.seeds, low=0)  # refuses repeats too
    if len(seeds) < 2:
        p.error("--seeds needs at least two seeds (the intervals pair runs by seed)")
    if a.workers < 1:
        p.error("--workers must be >= 1")
    if a.num_rounds < 1:
        p.error("--num-rounds must be >= 1")
    try:
        scales = [float(x) for x in a.scales.split(",")]
    except ValueError:
        p.error(f"--scales takes comma-separated numbers, got {a.scales!r}")
    if not scales or any(not abs(x) < float("inf") for x in scales):
        p.error(f"--scales takes finite numbers, got {a.scales!r}")
    if len({_label(x) for x in scales}) < len(scales):
        p.error(
            f"--scales: give each value once (values equal to 6 significant digits "
            f"count as one), got {a.scales!r}"
        )
    check_output_files(p, (("--json", a.json), ("--markdown", a.markdown)))
    from mmfl_flwr.presets import PRESETS, takes_aggregator

    presets, defences = a.presets.split(","), a.defences.split(",")
    if any(x not in PRESETS for x in presets):
        p.error(f"--presets takes some of {list(PRESETS)}")
    if any(d not in DEFENCES for d in defences):
        p.error(f"--defences takes some of {list(DEFENCES)}")
    if len(set(presets)) < len(presets) or len(set(defences)) < len(defences):
        p.error("--presets and --defences: give each name once")
    pairs = [
        (pr, d)
        for pr in presets
        for d in defences
        if d not in ("median", "centered-clip") or takes_aggregator(pr)
    ]
    if not pairs:
        p.error(
            "nothing to run: the median and centered-clip defences take a preset with "
            "a replaceable aggregator"
        )
    for pr in presets:
        for d in defences:
            if (pr, d) not in pairs:
                print(f"note: {pr} has its own aggregator; the {d} defence is not run for it")
    runs = [None, float("nan")] + scales
    jobs = [(pr, d, x, s, a.num_rounds) for pr, d in pairs for x in runs for s in seeds]
    print(f"{len(jobs)} runs", flush=True)
    from concurrent.futures import ProcessPoolExecutor

    done: dict[tuple, dict[str, Any]] = {}
    with ProcessPoolExecutor(a.workers) as ex:
        for r in ex.map(_run, jobs):
            done[(r["preset"], r["defence"], _label(r["scale"]), r["seed"])] = r
            print(
                f"  {r['preset']} {r['defence']} {_label(r['scale'])} seed {r['seed']}: "
                + " ".join(f"{t} {v:.3f}" for t, v in r["accuracy"].items()),
                flush=True,
            )
    table = [
        f"`{command('flip_scale', argv)}`",
        "",
        f"Machine: {machine()}.",
        "",
        "| preset | defence | model | client 3 sends | accuracy | drop vs honest [95% CI] "
        f"| drop per seed ({', '.join(map(str, seeds))}) | drop on the other clients' "
        "test data [95% CI] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for pr, d in pairs:
        tasks = sorted(done[(pr, d, "honest", seeds[0])]["accuracy"])
        for t in tasks:
            acc = {
                lab: {s: done[(pr, d, lab, s)]["accuracy"][t] for s in seeds}
                for lab in map(_label, runs)
            }
            oth = {
                lab: {s: done[(pr, d, lab, s)]["others"][t] for s in seeds}
                for lab in map(_label, runs)
            }
            for lab in map(_label, runs[1:]):
                drop = paired_ci(acc["honest"], acc[lab])
                drop_others = paired_ci(oth["honest"], oth[lab])
                per = [acc["honest"][s] - acc[lab][s] for s in seeds]
                rows.append(
                    {
                        "preset": pr,
                        "defence": d,
                        "model": t,
                        "sent": lab,
                        "accuracy": mean_ci(list(acc[lab].values()))[0],
                        "drop": drop,
                        "per_seed": dict(zip(seeds, per)),
                        "honest": acc["honest"],
                        "attacked": acc[lab],
                        "drop_others": drop_others,
                        "honest_others": oth["honest"],
                        "attacked_others": oth[lab],
                    }
                )
                table.append(
                    f"| {pr} | {d} | {t} | {lab} | {rows[-1]['accuracy']:.3f} | "
                    f"{drop['mean']:+.3f} [{drop['lo']:+.3f}, {drop['hi']:+.3f}] | "
                    + " ".join(f"{x:+.3f}" for x in per)
                    + " | "
                    f"{drop_others['mean']:+.3f} [{drop_others['lo']:+.3f}, "
                    f"{drop_others['hi']:+.3f}] |"
                )
    flip = _label(-1.0) if -1.0 in scales else None
    which = "honest run" + (f" and client 3 sending {flip}" if flip else "")
    table += [
        "",
        "Direction scores in the last round the check scored the model: the "
        "lowest / second lowest score of that round's uploaders (mean cosines; no client "
        f"ids) / the median over every scored client, {which}:",
        "",
        "| preset | defence | model | seed | honest | " + (f"{flip} |" if flip else ""),
        "|---|---|---|---|---|" + ("---|" if flip else ""),
    ]
    for pr, d in pairs:
        for t in sorted(done[(pr, d, "honest", seeds[0])]["accuracy"]):
            for s in seeds:
                h = _scores_text(done[(pr, d, "honest", s)]["scores"].get(t))
                f = _scores_text(done[(pr, d, flip, s)]["scores"].get(t)) if flip else ""
                table.append(f"| {pr} | {d} | {t} | {s} | {h} | " + (f"{f} |" if flip else ""))
    print("\n".join(table))
    scores = [
        {
            "preset": r["preset"],
            "defence": r["defence"],
            "sent": _label(r["scale"]),
            "seed": r["seed"],
            "scores": r["scores"],
        }
        for r in done.values()
    ]
    write_outputs(
        a.json,
        a.markdown,
        {"rows": rows, "seeds": seeds, "scales": scales, "direction_scores": scores},
        "\n".join(table),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
