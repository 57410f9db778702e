"""The bounds' false-positive rate: how many honest updates the default bounds (or another
configuration's, ``--defences``) touch, and what that costs (issue 60 item 4).

    python benchmarks/honest_false_positives.py --seeds 0-5 \\
        --profiles uniform,paper003,clusters-consistent,clusters-inconsistent \\
        --cache docs/results/honest_false_positives_runs.jsonl \\
        --markdown docs/results/honest_false_positives.md \\
        --json docs/results/honest_false_positives.json

Every client honest. Each preset runs on each profile twice per seed: with its defaults
(or with one of ``hostile_clients.py``'s defence configurations that keep the aggregator,
``--defences``) and with
``--defences off`` (every bound off), paired by seed (the same seed gives both
runs the same federation, initial weights and data). Per preset and profile: the
fraction of the updates received that some bound rejected or scaled (each update once,
``summary.json``'s ``defence_events.updates_touched``), the events per kind, and the
final accuracy (mean over the models) with the defaults (or the ``--defences``
configuration) minus with every bound off,
paired over the seeds with its 95% t interval and a paired TOST against ``--margin``.
MMFL-Group (``group``) needs clustered clients: a profile without clusters is replaced
by ``clusters-consistent`` for it (each profile once).

Under the table: where the bounds acted (events per model and kind, over every run and
over the rows above the 2% target) and, for every clipped update, its client's examples
of that model against the model's median count. The page for the presets with a row above
the target (``docs/results/honest_false_positives_where.md``):

    python benchmarks/honest_false_positives.py \
        --presets scaffold,mfa-rand,mfa-rr,multi-fedavg,ranklist-ucb,pareto-ucb,group \
        --profiles paper003,clusters-inconsistent --seeds 0-5 \
        --cache docs/results/honest_false_positives_where_runs.jsonl \
        --markdown docs/results/honest_false_positives_where.md \
        --json docs/results/honest_false_positives_where.json

The same rows under the looser clip and reversed-update bound (``--defences loose``),
against the same runs with every bound off, for the trade-off on the defences page:

    python benchmarks/honest_false_positives.py --defences loose \
        --presets scaffold,mfa-rand,mfa-rr,multi-fedavg,ranklist-ucb,pareto-ucb,group \
        --profiles paper003,clusters-inconsistent --seeds 0-5 \
        --cache docs/results/honest_false_positives_where_runs.jsonl \
        --markdown docs/results/honest_false_positives_loose.md \
        --json docs/results/honest_false_positives_loose.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from _evidence import (
    Parser,
    check_output_files,
    command,
    equivalence,
    int_list,
    machine,
    margin_arg,
    name_list,
    paired_ci,
    write_outputs,
)
from hostile_clients import AGGREGATOR_DEFENCES, DEFENCES, reusable

CLUSTERED = ("clusters-consistent", "clusters-inconsistent")


def profile_for(preset: str, profile: str) -> str:
    """The profile a preset runs on: MMFL-Group's clusters need a clustered profile."""
    if preset == "group" and not profile.startswith("clusters"):
        return "clusters-consistent"
    return profile


def profiles_of(preset: str, profiles: list[str]) -> list[str]:
    """The profiles ``preset`` runs on, each once, in the order given."""
    return list(dict.fromkeys(profile_for(preset, p) for p in profiles))


def _run(job: tuple[str, str, int, bool, int, int, int, str]) -> dict[str, Any]:
    """One honest in-process run; ``on``: with the bounds of ``defence`` (one of
    ``hostile_clients.DEFENCES``; "default": the preset's defaults), else every bound off."""
    preset, profile, seed, on, clients, rounds, epochs, defence = job
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run_inprocess
    from mmfl_flwr.strategy import events as E

    s = Settings(
        strategy=preset,
        profile=profile,
        num_clients=clients,
        num_rounds=rounds,
        local_epochs=epochs,
        seed=seed,
        output_dir="",
        **(DEFENCES[defence] if on else {"defences": "off"}),
    )
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.ERROR)
    sizes: dict[str, dict[str, int]] = {}

    def record_sizes(spec: Any) -> Any:
        sizes[spec.client_id] = {t: int(tr.num_examples) for t, tr in spec.trainers.items()}
        return spec

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            result = run_inprocess(s, client_hook=record_sizes)
    finally:
        logger.setLevel(level)
    events = list(result.events)
    received = sum(sum(v.values()) for v in result.received.values())
    kinds: dict[str, int] = {}
    for e in events:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    return {
        "preset": preset,
        "profile": profile,
        "seed": seed,
        # True: with bounds (the defaults or ``defence``'s); False: every bound off
        "defaults": on,
        **({"defence": defence} if on and defence != "default" else {}),
        **({"bounds": DEFENCES[defence]} if on else {}),
        "accuracy": {t: r["accuracy"] for t, r in result.final().items()},
        "touched": len(E.touched_updates(events)),
        "received": received,
        "by_kind": kinds,
        **where(events, sizes),
    }


def where(events: list[Any], sizes: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Where a run's bound actions fell: ``by_task`` (model -> kind -> events) and
    ``clipped_sizes``: for every clipped update, its client's examples of that model
    over the median of the model's holders (1: a typical client; the ``paper003``
    profile's high-data clients hold about ten times the others')."""
    by_task: dict[str, dict[str, int]] = {}
    for e in events:
        kinds = by_task.setdefault(e.task, {})
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    medians = {}
    for task in {t for held in sizes.values() for t in held}:
        medians[task] = float(np.median([held[task] for held in sizes.values() if task in held]))
    clipped = [
        sizes[e.client][e.task] / medians[e.task]
        for e in events
        if e.kind == "clipped" and e.task in sizes.get(e.client, {}) and medians.get(e.task)
    ]
    return {"by_task": by_task, "clipped_sizes": [round(x, 4) for x in clipped]}


def _key(r: dict[str, Any]) -> tuple[str, str, int, str]:
    """A run's cache key: preset, profile, seed and its bounds ("off", or the defence
    configuration it ran with; runs recorded before ``--defences`` ran with "default")."""
    bounds = r.get("defence", "default") if r["defaults"] else "off"
    return (r["preset"], r["profile"], r["seed"], bounds)


def _reusable(r: dict[str, Any]) -> bool:
    """Whether a cached run may stand for its key's configuration today: one with every
    bound off always; one with bounds only if the settings it ran with (``bounds``; a
    run recorded before they were ran with the defaults, ``{}``) are still those of its
    configuration's name, so that a configuration retuned under the same name is run
    again rather than read from runs made with its old settings."""
    if not r["defaults"]:
        return True
    # the field's rule (hostile_clients.reusable), with this page's record of the defaults
    return reusable({**r, "defence": r.get("defence", "default"), "bounds": r.get("bounds", {})})


def _job_key(job: tuple[str, str, int, bool, int, int, int, str]) -> tuple[str, str, int, str]:
    return (job[0], job[1], job[2], job[7] if job[3] else "off")


def _check(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    for name, value in (
        ("--num-clients", a.num_clients),
        ("--num-rounds", a.num_rounds),
        ("--local-epochs", a.local_epochs),
        ("--workers", a.workers),
    ):
        if value < 1:
            p.error(f"{name} must be >= 1")
    check_output_files(p, (("--json", a.json), ("--markdown", a.markdown), ("--cache", a.cache)))


def _table(
    presets: list[str],
    profiles: list[str],
    seeds: list[int],
    done: dict[tuple[str, str, int, str], dict[str, Any]],
    margin: float,
    defence: str = "default",
) -> tuple[list[str], list[dict[str, Any]]]:
    on_name = "defaults" if defence == "default" else defence
    lines = [
        "| preset | profile | updates touched (of received) | fraction | events by kind "
        f"| {on_name} - off [95% CI] | TOST at +-{margin:g} [90% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = []
    for pr in presets:
        for prof in profiles_of(pr, profiles):

            def acc(bounds: str, pr: str = pr, prof: str = prof) -> dict[int, float]:
                out = {}
                for s in seeds:
                    a = done[(pr, prof, s, bounds)]["accuracy"]
                    out[s] = sum(a.values()) / len(a)
                return out

            runs = [done[(pr, prof, s, defence)] for s in seeds]
            touched = sum(r["touched"] for r in runs)
            received = sum(r["received"] for r in runs)
            kinds: dict[str, int] = {}
            for r in runs:
                for k, n in r["by_kind"].items():
                    kinds[k] = kinds.get(k, 0) + n
            on, off = acc(defence), acc("off")
            d, eq = paired_ci(on, off), equivalence(on, off, margin)
            fraction = touched / received if received else float("nan")
            rows.append(
                {
                    "preset": pr,
                    "profile": prof,
                    "touched": touched,
                    "received": received,
                    "fraction": fraction,
                    "by_kind": kinds,
                    "difference": d,
                    "equivalence": eq,
                }
            )
            lines.append(
                f"| {pr} | {prof} | {touched} of {received} | {fraction:.3%} | "
                + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none")
                + f" | {d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] | {eq['verdict']} "
                f"[{eq['lo']:+.3f}, {eq['hi']:+.3f}] |"
            )
    return lines, rows


def placement(
    runs: list[dict[str, Any]], over: set[tuple[str, str]], on_name: str = "the defaults"
) -> tuple[dict[str, Any], list[str]]:
    """Where the bounds acted in the runs with the defaults (``on_name``: what the
    bounds were, for the page): events per model and kind,
    over every row and over the rows above the target (``over``: their (preset,
    profile)); and the clipped updates' clients' example counts against their model's
    median (from each run's :func:`where`; runs cached before it was recorded are
    counted as such)."""
    recorded = [r for r in runs if "by_task" in r]
    if not recorded:
        # nothing to place: one line, not an empty table
        return {"by_task": {}, "clipped": None, "clipped_high_data": None}, [
            f"Where the bounds acted is not recorded in these runs (all {len(runs)} were "
            "cached before it was)."
        ]
    table: dict[str, dict[str, list[int]]] = {}
    for r in recorded:
        hot = (r["preset"], r["profile"]) in over
        for task, kinds in r["by_task"].items():
            for kind, n in kinds.items():
                cell = table.setdefault(task, {}).setdefault(kind, [0, 0])
                cell[0] += n
                cell[1] += n if hot else 0
    ratios = sorted(x for r in recorded for x in r["clipped_sizes"])
    kinds = sorted({k for row in table.values() for k in row})
    lines = [
        f"Where the bounds acted, per model (events in every run with {on_name}; in "
        "brackets, in the rows above the target):",
        "",
        "| model | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for task in sorted(table):
        cells = [table[task].get(k, [0, 0]) for k in kinds]
        lines.append(f"| {task} | " + " | ".join(f"{a} ({b})" for a, b in cells) + " |")
    high = sum(x >= 2 for x in ratios)
    lines += [
        "",
        f"Clipped updates: {len(ratios)}; their clients hold "
        + (
            f"{ratios[0]:.2g} to {ratios[-1]:.3g} times their model's median example count "
            f"(median {float(np.median(ratios)):.2f}); {high} of {len(ratios)} hold at least "
            "twice it (the `paper003` profile's high-data clients hold about ten times)."
            if ratios
            else "none."
        ),
    ]
    if len(recorded) < len(runs):
        lines.append(f"({len(runs) - len(recorded)} runs were cached before this was recorded.)")
    out = {"by_task": table, "clipped": len(ratios), "clipped_high_data": high}
    return out, lines


#: The project's target for honest runs (issue 60): at most this share of the
#: updates touched by any default bound.
TOUCHED_TARGET = 0.02


def summary(rows: list[dict[str, Any]], margin: float) -> tuple[dict[str, Any], str]:
    """The rows against the targets: how many have more than
    :data:`TOUCHED_TARGET` of their honest updates touched (and the highest),
    how many a paired interval excluding 0 (a cost or a gain shown), and how many
    are not shown equivalent within ``margin``; as a dict and as the sentence
    the page prints under its table."""
    over = [r for r in rows if r["fraction"] > TOUCHED_TARGET]
    shown = [r for r in rows if r["difference"]["lo"] > 0 or r["difference"]["hi"] < 0]
    unsure = [r for r in rows if r["equivalence"]["verdict"] != "equivalent"]
    top = max(rows, key=lambda r: r["fraction"]) if rows else None
    # a lower bound on the rows the clip's touches alone do not explain: an update
    # touched by several bounds counts once in ``touched``, so the touched updates less
    # the clipped ones are at most the updates some other bound touched
    stays = []
    for r in over:
        rest = (r["touched"] - r["by_kind"].get("clipped", 0)) / r["received"]
        if rest > TOUCHED_TARGET:
            stays.append({"preset": r["preset"], "profile": r["profile"], "at_least": rest})
    out = {
        "rows": len(rows),
        "over_target": len(over),
        "target": TOUCHED_TARGET,
        "interval_excludes_0": len(shown),
        "not_shown_equivalent": len(unsure),
        "highest": {k: top[k] for k in ("preset", "profile", "fraction")} if top else None,
        "over_target_without_clip": stays,
    }
    text = (
        f"Against the targets: {len(over)} of {len(rows)} rows have more than "
        f"{TOUCHED_TARGET:.0%} of their honest updates touched"
        + (
            f" (the highest: {top['preset']} on {top['profile']}, {top['fraction']:.3%})"
            if top
            else ""
        )
        + f"; {len(shown)} of {len(rows)} paired intervals exclude 0; {len(unsure)} of "
        f"{len(rows)} rows are not shown equivalent within +-{margin:g}."
    )
    if over:
        text += (
            f" In these runs at least {len(stays)} of the {len(over)} have more than "
            f"{TOUCHED_TARGET:.0%} of their honest updates touched by a bound other than "
            "the norm clip"
            + (
                " ("
                + "; ".join(
                    f"{x['preset']} on {x['profile']}, at least {x['at_least']:.3%}" for x in stays
                )
                + ": a row's touched updates less its clipped ones)"
                if stays
                else ""
            )
            + "."
        )
    return out, text


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="", help="comma-separated presets (default: all)")
    p.add_argument(
        "--profiles",
        default="uniform,paper003,clusters-consistent,clusters-inconsistent",
        help="comma-separated data profiles",
    )
    p.add_argument("--num-clients", type=int, default=20)
    p.add_argument("--num-rounds", type=int, default=10)
    p.add_argument("--local-epochs", type=int, default=2)
    p.add_argument("--seeds", default="0-5", help="seeds, e.g. 0-5 (at least two)")
    p.add_argument("--margin", default="0.02", help="the paired TOST's margin, in accuracy")
    p.add_argument(
        "--workers", type=int, default=min(2, os.cpu_count() or 1), help="runs in parallel"
    )
    p.add_argument(
        "--defences",
        default="default",
        help="the bounds of the runs set against every bound off: 'default' (the presets' "
        "defaults) or another of hostile_clients.py's configurations that keeps the "
        f"aggregator ({', '.join(d for d in DEFENCES if d not in AGGREGATOR_DEFENCES)})",
    )
    p.add_argument("--cache", default="", help="JSON-lines file of finished runs (reused)")
    p.add_argument("--json", default="", help="write the runs and the rows here")
    p.add_argument("--markdown", default="", help="write the table here")
    a = p.parse_args(argv)
    from mmfl_flwr.presets import PRESETS
    from mmfl_flwr.tasks.federation import PROFILES

    presets = name_list(p, "--presets", a.presets, PRESETS) if a.presets else list(PRESETS)
    profiles = name_list(p, "--profiles", a.profiles, PROFILES)
    seeds = int_list(p, "--seeds", a.seeds, low=0)
    if len(seeds) < 2:
        p.error("--seeds needs at least two seeds (the differences are paired by seed)")
    margin = margin_arg(p, a.margin)
    if a.defences not in DEFENCES or a.defences in AGGREGATOR_DEFENCES or a.defences == "off":
        p.error(
            "--defences takes one configuration of "
            + ", ".join(d for d in DEFENCES if d not in AGGREGATOR_DEFENCES)
            + f" (got {a.defences!r}; the aggregator ones do not apply to every preset)"
        )
    _check(p, a)
    shape = (a.num_clients, a.num_rounds, a.local_epochs)
    jobs = [
        (pr, prof, s, on, *shape, a.defences)
        for pr in presets
        for prof in profiles_of(pr, profiles)
        for s in seeds
        for on in (True, False)
    ]
    done: dict[tuple[str, str, int, str], dict[str, Any]] = {}
    cache = Path(a.cache) if a.cache else None
    if cache and cache.exists():
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            if tuple(r.get("shape", ())) == shape and _reusable(r):
                done[_key(r)] = r
    todo = [j for j in jobs if _job_key(j) not in done]
    print(f"{len(jobs)} runs, {len(todo)} to do", flush=True)
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(a.workers) as ex:
        for r in ex.map(_run, todo):
            r["shape"] = list(shape)
            done[_key(r)] = r
            if cache:
                with cache.open("a") as f:
                    f.write(json.dumps(r) + "\n")
            print(
                f"  {r['preset']} {r['profile']} seed {r['seed']} "
                f"{_key(r)[3]}: touched {r['touched']} of "
                f"{r['received']}",
                flush=True,
            )
    lines, rows = _table(presets, profiles, seeds, done, margin, a.defences)
    counts, sentence = summary(rows, margin)
    over = {(r["preset"], r["profile"]) for r in rows if r["fraction"] > TOUCHED_TARGET}
    on_runs = [done[_job_key(j)] for j in jobs if j[3]]
    on_words = (
        "the defaults"
        if a.defences == "default"
        else f"`{a.defences}` ("
        + ", ".join(f"{k} {v:g}" for k, v in DEFENCES[a.defences].items())
        + ", the other bounds at their defaults)"
    )
    placed, where_lines = placement(on_runs, over, on_words)
    text = [
        f"`{command('honest_false_positives', argv)}`",
        "",
        f"Machine: {machine()}.",
        "",
        f"Every client honest; {a.num_clients} clients, {a.num_rounds} rounds, "
        f"{a.local_epochs} local epochs, default tasks, in-process engine, seeds "
        f"{', '.join(map(str, seeds))}; {len(jobs) // 2} runs with {on_words} and as many "
        "with every bound off. Accuracy: final, mean over the models. MMFL-Group runs on "
        "clustered profiles only (its clusters need them).",
        "",
        *lines,
        "",
        sentence,
        "",
        *where_lines,
    ]
    print("\n".join(text))
    payload = {
        "rows": rows,
        "summary": counts,
        "where": placed,
        "runs": [done[_job_key(j)] for j in jobs],
        "seeds": seeds,
        "margin": margin,
        "defence": a.defences,
    }
    write_outputs(a.json, a.markdown, payload, "\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
