#!/usr/bin/env python
"""Regenerate the papers' evidence: run every experiment script and rebuild RESULTS.md.

    python benchmarks/reproduce.py --quick     # minutes on 2 cores
    python benchmarks/reproduce.py --smoke     # seconds: every step at the smallest scale
                                               # (a slow test runs it)
    python benchmarks/reproduce.py --full      # the scale RESULTS.md reports (hours), then
                                               # the investigations' runs as the pages show them
    python benchmarks/reproduce.py --full --dry-run   # list those commands, with the time
                                               # each took when its results were recorded

Each script in :data:`EXPERIMENTS` runs in its own process with the same mode, engine and
output folder; each writes its CSV, PNG and a Markdown fragment ``<name>.md`` into the
output folder (``docs/results`` by default). A script that fails is reported in
RESULTS.md and makes the exit code 1; the others still run.

From the fragments it then writes (``_results.py`` builds both):

- RESULTS.md, a one-page summary: a short header (the stand-in data, the defences the
  runs had, how long a full rerun takes) and per paper a table of each claim with the
  data and horizon it ran on, what was found, the paper's number and the verdict;
- one Results page per paper (``docs/papers/`` for the default output folder, else
  ``<out>/papers/``): the claims table, the figures, each section's detail and the
  investigations about that paper (from ``investigations.md`` of the output folder),
  and a page with the rules every verdict follows.

``--assemble`` runs nothing and rebuilds them from the fragments already in the output
folder (e.g. after running the scripts one by one, on several machines: each fragment
names the command, engine and machine that produced it).

``--full`` also reruns the investigations' commands (:data:`INVESTIGATIONS`). Their run
caches (``--cache FILE``) are ignored, so every run is made again, unless
``--reuse-cache`` is given; it says which for each command.

``--full`` measures each command it runs (CPU seconds of its processes, wall seconds,
machine, commit) into the output folder's ``reproduce_times.json``; ``--dry-run`` reads the
published folder's where a command's fragment and run cache record no run time.

``--only NAME[,NAME]`` runs a subset: sections by name and, with ``--full``, the
investigation commands of a script no section runs by that script's name (the other
fragments already in the folder are kept and assembled too); ``--results PATH`` writes
RESULTS.md elsewhere (default: the repository's RESULTS.md for the default output folder,
else ``<out>/RESULTS.md``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import _evidence as E
import _results as R

HERE = Path(__file__).resolve().parent

#: (script name without .py, fragment names it writes), in RESULTS.md order
EXPERIMENTS: list[tuple[str, list[str]]] = [
    ("paper002_gain", ["paper002_gain"]),
    ("paper003_table1", ["paper003_table1"]),
    ("paper003_fig5", ["paper003_fig5"]),
    ("paper001_group", ["paper001_group"]),
    ("paper004_ucb", ["paper004_ucb"]),
]

#: The investigations' runs (docs/results/investigations.md), exactly as RESULTS.md shows
#: them: ``--full`` reruns them after the sections (their paths under docs/results are
#: moved to ``--out`` when it is another folder). A test checks that every command
#: RESULTS.md shows is a section's, one of these, or in :data:`SUGGESTED`.
INVESTIGATIONS: list[str] = [
    "python benchmarks/paper003_table1.py --full --tasks synthetic,synthetic,synthetic "
    "--methods lvr,gvr --seeds 0,1,2 --num-rounds 40 --out docs/results/synthetic_fig2",
    # Table 1 on the harder stand-in (issue 61): Synthetic(1,1), where full participation
    # stays far below the ceiling, at the papers' 150 rounds and 8 seeds; its 80 runs
    # measured 3.6 hours of summed run time, one core a run
    "python benchmarks/paper003_table1.py --full --tasks synthetic,synthetic,synthetic "
    "--methods full,random,lvr,gvr,stalevr,stalevre,fedvarp,mifa,scaffold,mifa-uploaded "
    "--seeds 0,1,2,3,4,5,6,7 --num-rounds 150 --lengths 40,80,150 --out "
    "docs/results/synthetic_table1",
    "python benchmarks/coef_sum_mean.py --policy-only 0-7 --num-rounds 4000 --window 40",
    "python benchmarks/coef_sum_mean.py --strategy random --num-rounds 300 --seed 11",
    "python benchmarks/mifa_seen_share.py",
    "python benchmarks/table1_details.py --csv docs/results/paper003_table1.csv --methods "
    "lvr,gvr,stalevr,stalevre,scaffold --at 40,80,100,120,150",
    "python benchmarks/stalevre_dips.py --seeds 0-7 --workers 2",
    "python benchmarks/stalevre_dips.py --seeds 0-7 --workers 2 --b0 0.5",
    "python benchmarks/paper001_group.py --full --scenarios clients-static --seeds 0,1,2,3,4 "
    "--out docs/results/clients_static",
    "python benchmarks/paper001_group.py --full --scenarios clients-static-p12 --seeds "
    "0,1,2,3,4 --out docs/results/clients_static_p12",
    "python benchmarks/group_cstep_quality.py --scenarios consistent,clients-static,clients "
    "--seeds 0,1,2",
    "python benchmarks/paper001_group.py --task mnist-5k --scenarios "
    "consistent,inconsistent,clients,tasks --seeds 0,1,2 --num-rounds 20 --out "
    "docs/results/mnist5k --cache docs/results/mnist5k/paper001_group_runs.jsonl",
    "python benchmarks/paper001_group.py --task mnist-5k --scenarios clients --seeds "
    "0,1,2,3,4,5,6,7,8 --num-rounds 20 --out docs/results/mnist5k/clients_9seeds --cache "
    "docs/results/mnist5k/clients_9seeds/runs.jsonl",
    "python benchmarks/paper001_group.py --task mnist-5k --scenarios consistent --seeds "
    "0,1,2,3,4,5,6,7,8 --num-rounds 20 --out docs/results/mnist5k/consistent_9seeds --cache "
    "docs/results/mnist5k/consistent_9seeds/runs.jsonl",
    "python benchmarks/paper001_group.py --task mnist-5k --scenarios inconsistent --seeds "
    "0,1,2,3,4,5,6,7,8 --num-rounds 20 --out docs/results/mnist5k/inconsistent_9seeds "
    "--cache docs/results/mnist5k/inconsistent_9seeds/runs.jsonl",
    "python benchmarks/paper001_group.py --task mnist-5k --scenarios tasks --seeds "
    "0,1,2,3,4,5,6,7,8 --num-rounds 20 --out docs/results/mnist5k/tasks_9seeds --cache "
    "docs/results/mnist5k/tasks_9seeds/runs.jsonl",
    # papers 000/001's scenarios on mnist-5k at the papers' data sizes (30-40 examples a
    # client and model): 108 runs in 41 minutes on the 2-core machine, two at a time
    "python benchmarks/paper001_group.py --task mnist-5k --sizes paper --scenarios "
    "consistent,inconsistent,clients,tasks --seeds 0,1,2,3,4,5,6,7,8 --num-rounds 20 --out "
    "docs/results/mnist5k/group_sizes --cache docs/results/mnist5k/group_sizes/runs.jsonl",
    "python benchmarks/honest_defence_cost.py --task mnist-5k --scenarios consistent --seeds "
    "0-8 --num-rounds 20 --defences no-clip --cache docs/results/mnist5k/defence_cost_runs.jsonl "
    "--markdown docs/results/mnist5k/defence_cost.md",
    # Table 1 on mnist-5k: its 30 runs measured 9.6 hours of summed run time, one core a
    # run, two runs at a time (full participation, StaleVR and GVR train every client:
    # 34-51 minutes a run; StaleVR peaks at about 9 GiB). --full drops its cache and makes
    # every run again (hours); --reuse-cache re-reads it
    "python benchmarks/paper003_table1.py --full --tasks mnist-5k,mnist-5k,mnist-5k "
    "--methods full,random,lvr,gvr,stalevr,stalevre,fedvarp,mifa,scaffold,mifa-uploaded "
    "--seeds 0,1,2 --num-rounds 40 --engine inprocess --out docs/results/mnist5k/table1 "
    "--cache docs/results/mnist5k/table1/runs.jsonl",
    # Table 1 on mnist-5k at paper 003's data sizes (profile paper003-sizes): its 30 runs
    # measured 8.7 hours of summed run time, one core a run, two runs at a time (full
    # participation, StaleVR and GVR 32-56 minutes a run; StaleVR peaks at about 9 GiB).
    # --full drops its cache (hours); --reuse-cache re-reads it
    "python benchmarks/paper003_table1.py --full --tasks mnist-5k,mnist-5k,mnist-5k "
    "--profile paper003-sizes --methods "
    "full,random,lvr,gvr,stalevr,stalevre,fedvarp,mifa,scaffold,mifa-uploaded --seeds 0,1,2 "
    "--num-rounds 40 --engine inprocess --out docs/results/mnist5k/table1_sizes --cache "
    "docs/results/mnist5k/table1_sizes/runs.jsonl",
]

#: Commands RESULTS.md shows as a way to go further, whose results it does not report
#: (not rerun; none at present). The re-analyses of a section's own CSV that RESULTS.md
#: shows (``--from-csv``) are not listed or rerun either: they run nothing and give the
#: numbers of the CSV that the section's own rerun writes.
SUGGESTED: list[str] = []


def investigation_command(line: str, out: Path) -> list[str]:
    """An :data:`INVESTIGATIONS` line as an argv for this Python, with its paths under
    docs/results moved to ``out``, and ``--out out`` added to a script that writes into
    docs/results by default, when ``out`` is another folder."""
    import shlex

    words = shlex.split(line)[1:]  # without "python"
    default = E.DEFAULT_OUT.resolve()
    moved = out.resolve() != default
    argv = []
    for w in words:
        if moved and w.startswith("docs/results"):
            w = str(out.resolve() / Path(w).relative_to("docs/results"))
        argv.append(w)
    if (
        moved
        and "--out" not in argv
        and "--markdown" not in argv
        and Path(argv[0]).name in ("group_cstep_quality.py",)
    ):
        argv += ["--out", str(out.resolve())]
    argv[0] = str(E.REPO / argv[0])
    return [sys.executable, *argv]


#: Fragments of investigations (:data:`INVESTIGATIONS`, ``--full`` only) assembled after
#: a section's own where they exist: Table 1 on the harder stand-in (Synthetic(1,1), 150
#: rounds), Table 1 and papers 000/001 on real handwritten digits (`mnist-5k`) beside the
#: stand-in, each scenario of papers 000/001 at the most seeds it has.
EXTRA_FRAGMENTS: dict[str, list[str]] = {
    "paper003_table1": [
        "synthetic_table1/paper003_table1",
        "mnist5k/table1/paper003_table1",
        "mnist5k/table1_sizes/paper003_table1",
    ],
    "paper001_group": [
        "mnist5k/consistent_9seeds/paper001_group",
        "mnist5k/inconsistent_9seeds/paper001_group",
        "mnist5k/clients_9seeds/paper001_group",
        "mnist5k/tasks_9seeds/paper001_group",
        "mnist5k/group_sizes/paper001_group",
    ],
}

#: How every verdict is reached: stated once, at the top of RESULTS.md.
RULES = """How a verdict is reached (the same rules in every section):

- *Direction* claims ("A above B"): the 95% t interval of the paired per-seed difference.
  **holds** when every interval the claim names lies above 0, **does not hold** when one
  lies below 0, **not resolved** otherwise. A difference whose interval covers 0 is
  *level* in the tables: absence of evidence, not equivalence.
- *Equivalence* claims ("A level with B"): TOST, two one-sided paired t tests at 5% each,
  against a margin stated in the claim's own units. **holds** when the 90% interval of
  the paired difference lies inside the margin, **does not hold** when it lies wholly
  beyond it, **not resolved** otherwise (`equivalence_verdict` in benchmarks/_evidence.py).
- *Size* claims ("more than 10%", "at least 6%"): the one-sided 95% bound of the paired
  difference against the claimed size, reported apart from the direction. The outcomes
  are **size shown** (lower bound above the size), **smaller than claimed** (upper bound
  below it) and **size not resolved**, per baseline; a claim over several baselines
  **holds** when the size is shown over each, **does not hold** when it is smaller than
  claimed over one, **not resolved** otherwise, naming each baseline's outcome. Where the
  paper does not say whether a percentage is points of accuracy or a relative gain, both
  readings are tested; a relative gain is the geometric mean over the seeds of the
  ratio, minus 1 (paired on the log scale).
- *Widening* claims: per seed, the least-squares slope of the gap against the target.
  **widening** (the claim **holds**) when the 95% interval of the mean slope lies above
  0, **narrowing** (**does not hold**) when it lies below, **not resolved** otherwise. A
  gap to a target that was never reached is a lower bound; each section counts them.
- *Variance* claims ("A fluctuates more than B"): **holds** when the test shows the
  claimed direction, **does not hold** when it shows the opposite one, **not resolved**
  otherwise; the section states the test, its assumptions and what was held fixed.
  Paper 002's spread: one-sided Brown-Forsythe tests at 5% (p < 0.05; `spread_verdict`
  in benchmarks/_evidence.py: Welch's t on the absolute deviations from the medians, two
  independent samples, robust to non-normal data) on runs with the data and initial
  weights held fixed. Paper 003's Fig. 2: the paired 95% interval of
  the per-seed difference in variance over rounds, read as a direction claim.

The summary gives what was found next to the paper's own number. Where a section has no
*Found* or *Paper* sentence yet, the cell is empty and the section holds the numbers."""

HEADER = """# Results: the papers' claims, reproduced

This file is generated by `python benchmarks/reproduce.py {how}` (do not edit it by hand)
from the fragments the experiment scripts wrote into `{out}`: mode `{mode}`, engine
{engine}, generated {date}{wall}. Per paper, a table gives each claim, the data and
horizon it ran on (with the paper's own where it differs), what was found, the paper's
number and the verdict; each paper's Results page (linked) holds the claims table, the
figures, each section's detail and the investigations.

**Verdicts.** Every number is a mean over seeds; differences between methods are paired
per seed. A direction claim ("A above B") **holds** when the paired 95% t interval lies
above 0, **does not hold** when it lies below, **not resolved** otherwise; equivalence,
size, widening and variance claims have rules of their own: [the rules]({rules}). A
verdict that does not hold or is not resolved names the rounds it was reached at: a
longer run may change it.

**Data.** {data}

**Defences.** {defences}

**Rerunning.** {rerun}
"""

#: What the published runs that record no settings had of the project's defences: every
#: such run CSV and cache under docs/results was last written before the reversed-update
#: bound existed (951c268) and after the update clip, the direction check and the capped
#: floor became defaults (:data:`BEFORE_DEFAULT_DEFENCES` is empty).
OLD_DEFENCES = (
    "ran with the project's default bounds on client updates of the day they were made, "
    "not as the papers state the algorithms: the update clip (`update-clip-factor` 3), the "
    "direction check (`direction-factor` 3) and the loss-based policies' capped floor were "
    "on, and the clip and the direction check act on honest clients too; the bound on "
    "reversed updates (`reversed-influence-factor`) did not (every such run predates it)"
)


def defences_note(fragments: list[str]) -> str:
    """The header's statement of the defences each published section ran with, read from
    the sections' ``Defences:`` lines (written by the scripts from what each run
    recorded): reproduction mode, the project's defaults as a sensitivity section, or not
    recorded (runs made before the settings were recorded)."""
    groups: dict[str, list[str]] = {"off": [], "default": [], "old": []}
    for text in fragments:
        for heading, body in R.sections(text):
            if not R.paper_key(heading):
                continue
            if re.search(r"(?m)^(?:- )?Defences: off\b", body):
                groups["off"].append(heading)
            elif re.search(r"(?m)^(?:- )?Defences: the project's defaults", body):
                groups["default"].append(heading)
            else:
                groups["old"].append(heading)

    def names(hs: list[str]) -> str:
        return "; ".join(f"*{h}*" for h in dict.fromkeys(hs))

    parts = []
    if groups["off"]:
        parts.append(
            "In the papers' reproduction mode (`--defences off`: every bound off, the "
            "algorithms as the papers state them): " + names(groups["off"]) + "."
        )
    if groups["default"]:
        parts.append(
            "With the project's default bounds, as labelled sensitivity sections: "
            + names(groups["default"])
            + "."
        )
    if groups["old"]:
        parts.append(
            "Not yet rerun in the reproduction mode (no settings recorded; "
            "`python benchmarks/check_reproduction.py` lists them): "
            + names(groups["old"])
            + ". These "
            + OLD_DEFENCES
            + "."
        )
    if parts:
        parts.append(
            "What the project's defaults cost honest clients on mnist-5k (the same runs with "
            "and without the update clip) is on the papers 000/001 page."
        )
    return " ".join(parts)


def data_note(fragments: list[str]) -> str:
    """The header's statement of the stand-in data, with the sizes the fragments record."""
    pools = R.task_pools(fragments)
    flat = " ".join(" ".join(fragments).split())
    mnist = re.search(r"`mnist-5k` \(([\d,]+) real MNIST images, ([\d,]+) for training\)", flat)
    digits = pools.get("digits")
    parts = []
    if digits:
        parts.append(
            f"`digits` is the stand-in for the papers' image data: copies of scikit-learn's "
            f"8x8 handwritten digits, {R._num(digits)} training images a model (three models "
            "in Table 1 and papers 000/001), not the papers' Fashion-MNIST, EMNIST, "
            "CIFAR-10 or MNIST."
        )
    if mnist:
        parts.append(
            f"`mnist-5k` is {mnist.group(1)} real MNIST images, {mnist.group(2)} for "
            "training, shared out among each model's clients, trained with the papers' "
            "Fashion-MNIST/EMNIST CNN."
        )
    parts.append(
        "Papers 002 and 004 run on Synthetic(1,1) (and Synthetic-IID), as the papers "
        "do. Every row names its task, examples, clients, rounds and seeds."
    )
    return " ".join(parts)


#: Published runs made before the defences made default from 2026-11-28 on (update clip
#: b32233e, direction check c66d8c0, capped floor 1d665db): (what they are, the commit
#: their CSVs were written at, before any move: ``git log --follow``, and those CSVs under
#: docs/results). Their commands, rerun
#: on today's code, apply those defaults; an entry goes once its runs are made again.
BEFORE_DEFAULT_DEFENCES: list[tuple[str, str, tuple[str, ...]]] = []


def code_note() -> str:
    """The header's paragraph on the runs made by older code ("" when none)."""
    if not BEFORE_DEFAULT_DEFENCES:
        return ""
    held = "; ".join(f"{what} (CSV of {commit})" for what, commit, _ in BEFORE_DEFAULT_DEFENCES)
    return (
        "\nSome published runs were made by the code of 2026-11-26/27, before the "
        "defences made default from 2026-11-28 on (the update clip, update-clip-factor "
        "3; the direction check, direction-factor 3; the loss-based policies' capped "
        "floor): " + held + ". Their commands rerun on today's code apply those "
        "defaults, so their numbers change wherever a default acts on an honest "
        "client (for paper 002 the earlier code reran its runs bit for bit and "
        "today's code did not; its section was then rerun); investigations that "
        "re-read these CSVs inherit it. Every other published run was made with "
        "today's defaults.\n"
    )


#: Kept under its historic name for callers that read verdicts from here.
verdicts = R.verdicts


def command(name: str, args: argparse.Namespace) -> list[str]:
    """The command that runs experiment ``name``: its script with the mode and the
    output folder, and ``--engine`` / ``--workers`` only where given here; else
    each script keeps its own defaults, the ones its published section used
    (paper001_group and paper004_ucb run the in-process engine)."""
    cmd = [sys.executable, str(HERE / f"{name}.py"), f"--{args.mode}"]
    if args.engine is not None:
        cmd += ["--engine", args.engine]
    if args.workers is not None:
        cmd += ["--workers", str(args.workers)]
    return cmd + ["--out", str(args.out)]


def without_cache(argv: list[str], reuse: bool) -> tuple[list[str], str]:
    """An investigation's argv without its ``--cache FILE`` unless ``reuse``, and a line
    saying which: a cache holds finished runs that the script would read back instead of
    making them again."""
    if "--cache" not in argv:
        return argv, "no run cache"
    k = argv.index("--cache")
    path = argv[k + 1]
    if reuse:
        return argv, f"reusing the run cache {path} (--reuse-cache): its runs are not made again"
    return argv[:k] + argv[k + 2 :], f"ignoring the run cache {path}: every run is made again"


def _cache_seconds(path: Path) -> float | None:
    """The summed ``run_seconds`` of a run cache (each run once), None if it records none."""
    import json

    total, seen = 0.0, False
    for line in path.read_text().splitlines():
        try:
            result = json.loads(line).get("result")
        except ValueError:
            continue
        rows = result if isinstance(result, list) else []
        times = [r["run_seconds"] for r in rows if isinstance(r, dict) and "run_seconds" in r]
        if times:
            total, seen = total + float(times[0]), True
    return total if seen else None


#: reproduce.py's own measurements of the commands ``--full`` ran as published (no
#: ``--engine``/``--workers``/``--reuse-cache`` given, exit code 0): per section name or
#: investigation line, the CPU seconds (user + system) of the command's processes, its
#: wall seconds, the machine and the code. CPU seconds are close to, not the same as, the
#: fragments' summed run times (one core a run): they also count a script's own analysis
#: and plotting, and every torch thread of a run. Written into reproduce's ``--out``;
#: ``--dry-run`` reads the published folder's where a command's fragment and run cache
#: record no run time.
TIMES_NAME = "reproduce_times.json"
PUBLISHED_TIMES = E.DEFAULT_OUT / TIMES_NAME


def _times(path: Path) -> dict[str, Any]:
    """A :data:`TIMES_NAME` file's entries ({} if it is missing or not such a file)."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _measured(key: str, measured: dict[str, Any]) -> tuple[float | None, str]:
    """What ``--full`` measured for ``key`` (a section name or an investigation line),
    from ``measured`` (:data:`PUBLISHED_TIMES`' entries)."""
    entry = measured.get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("cpu_seconds"), (int, float)):
        return None, ""
    return float(entry["cpu_seconds"]), (
        f"CPU time measured by reproduce.py --full on {entry.get('machine', '?')}, code "
        f"{entry.get('commit', '?')}, wall {float(entry.get('wall_seconds', 0)):.0f} s"
    )


def record_time(folder: Path, key: str, cpu: float, wall: float) -> None:
    """Add (or replace) ``key``'s measurement in ``folder``'s :data:`TIMES_NAME`
    (written to a temporary file and moved into place, so a stopped run leaves the old
    file whole)."""
    import json

    path = folder / TIMES_NAME
    data = _times(path)
    data[key] = {
        "cpu_seconds": round(cpu, 1),
        "wall_seconds": round(wall, 1),
        "machine": E.machine(),
        "commit": E.code_commit(),
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _run(cmd: list[str], cwd: Path | None) -> int:
    """Run one command (the seam the tests replace); its exit code."""
    return subprocess.run(cmd, check=False, cwd=cwd).returncode


def _fragment_seconds(path: Path) -> float | None:
    """The ``summed run time N s`` a fragment records (None if it records none)."""
    if not path.is_file():
        return None
    m = re.search(r"summed run time (\d+) s", path.read_text())
    return float(m.group(1)) if m else None


def recorded_seconds(
    words: list[str], fragments: list[str], key: str = "", measured: dict[str, Any] | None = None
) -> tuple[float | None, str]:
    """The recorded run time of a command (one core a run, summed over its runs) and
    where it was read: a fragment's "summed run time" (the sections', or the fragment in
    the command's ``--out`` folder), else its run cache's ``run_seconds``, else what
    ``--full`` measured for ``key`` (``measured``: :data:`PUBLISHED_TIMES`' entries, read
    once by the caller)."""
    repo = E.REPO
    candidates = [repo / E.DEFAULT_OUT.relative_to(repo) / f"{f}.md" for f in fragments]
    if "--out" in words:
        folder = repo / words[words.index("--out") + 1]
        candidates += [folder / f"{Path(words[1]).stem}.md"]
    for path in candidates:
        seconds = _fragment_seconds(path)
        if seconds is not None:
            return seconds, f"recorded in {path.relative_to(repo)}"
    if "--cache" in words:
        cache = repo / words[words.index("--cache") + 1]
        seconds = _cache_seconds(cache) if cache.is_file() else None
        if seconds is not None:
            return seconds, f"recorded in {cache.relative_to(repo)}"
    if key and measured:
        seconds, where = _measured(key, measured)
        if seconds is not None:
            return seconds, where
    return None, "unknown: no recorded run time"


def _script(line: str) -> str:
    """The script name (no ``.py``) of an :data:`INVESTIGATIONS` line."""
    return Path(line.split()[1]).stem


def investigation_scripts() -> list[str]:
    """The scripts of :data:`INVESTIGATIONS` that no section runs (``--only`` names them)."""
    sections = {n for n, _ in EXPERIMENTS}
    return [s for s in dict.fromkeys(map(_script, INVESTIGATIONS)) if s not in sections]


class Step(NamedTuple):
    """One command :func:`plan` would run."""

    shown: str  #: the line printed (and shown on the pages)
    argv: list[str]
    seconds: float | None  #: its recorded run time, None if none is
    where: str  #: where that time was read
    note: str  #: what is done with its run cache
    key: str  #: the key its cost is recorded under in :data:`TIMES_NAME`
    section: bool  #: a section's command (else an investigation's)


def plan(args: argparse.Namespace) -> list[Step]:
    """Every command ``args`` would run, in order. ``--only`` selects sections by name,
    and the investigations of a script no section runs by that script's name."""
    import shlex

    out = Path(args.out)
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    measured = _times(PUBLISHED_TIMES)  # read once, not once per command
    steps: list[Step] = []
    for name, fragments in EXPERIMENTS:
        if only and name not in only:
            continue
        cmd = command(name, args)
        shown = " ".join(["python", f"benchmarks/{name}.py", *cmd[2:]])
        seconds, where = (
            recorded_seconds(["python", f"benchmarks/{name}.py"], fragments, name, measured)
            if args.mode == "full"
            else (None, "unknown: run times are recorded for --full only")
        )
        steps.append(Step(shown, cmd, seconds, where, "no run cache", name, True))
    if args.mode == "full":
        # a section's name selects the section only, never the investigations that use
        # its script (hours of mnist-5k runs)
        chosen = set(investigation_scripts()) & set(only)
        for line in INVESTIGATIONS:
            if only and _script(line) not in chosen:
                continue
            argv, note = without_cache(investigation_command(line, out), args.reuse_cache)
            seconds, where = recorded_seconds(shlex.split(line), [], line, measured)
            steps.append(Step(line, argv, seconds, where, note, line, False))
    return steps


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def rerun_note() -> str:
    """The header's sentence on how long ``--full`` takes, from the recorded run times."""
    args = argparse.Namespace(
        mode="full", engine=None, workers=None, out=str(E.DEFAULT_OUT), only="", reuse_cache=False
    )
    steps = plan(args)
    known = [s.seconds for s in steps if s.seconds is not None]
    unknown = len(steps) - len(known)
    total = sum(known)
    missing = f"{unknown} more {'has' if unknown == 1 else 'have'} no recorded time"
    return (
        f"`python benchmarks/reproduce.py --full` runs {len(steps)} commands (the sections', "
        f"then the investigations'; `--dry-run` lists them) and makes every run again: the "
        f"{len(known)} whose run time is recorded (in their fragments and run caches, or "
        f"as CPU seconds in `{TIMES_NAME}`, what `--full` measured) sum "
        f"to {_hours(total)} of one core a run; {missing}. The "
        "commands are independent processes (only `table1_details.py` reads the CSV "
        "that `paper003_table1.py` writes), so on 2 cores two can run at a time: at "
        f"least {_hours(total / 2)} of wall time for the recorded ones, memory allowing "
        "(a StaleVR run on mnist-5k peaks at about 9 GiB)."
    )


def dry_run(args: argparse.Namespace) -> int:
    """Print every command ``args`` would run with its recorded time; run nothing."""
    total = 0.0
    steps = plan(args)
    for step in steps:
        took = _hours(step.seconds) if step.seconds is not None else "unknown"
        total += step.seconds or 0.0
        print(f"[dry-run] {step.shown}\n          estimate {took} ({step.where}); {step.note}")
    print(
        f"[dry-run] {len(steps)} commands; recorded run time {_hours(total)} of one core a "
        "run; nothing was run"
    )
    return 0


def gather(args: argparse.Namespace, failed: dict[str, str]) -> list[str]:
    """The fragments RESULTS.md and the pages are built from, in :data:`EXPERIMENTS`
    order: a section's own, then its investigations' (``--full``/``--assemble``); a
    failed or missing one as a line that says so."""
    out = Path(args.out)
    fragments: list[str] = []
    for name, names in EXPERIMENTS:
        if name in failed:
            fragments.append(
                f"### {name}\n\n**Failed** ({failed[name]}): rerun "
                f"`python benchmarks/{name}.py --{args.mode}`.\n"
            )
            continue
        for frag in names:
            path = out / f"{frag}.md"
            fragments.append(
                path.read_text()
                if path.is_file()
                else f"### {frag}\n\nNo results yet: run "
                f"`python benchmarks/{name}.py --{args.mode}`.\n"
            )
        # the investigations' fragments are full-scale runs: not in a --quick/--smoke file
        for frag in EXTRA_FRAGMENTS.get(name, []) if args.mode == "full" or args.assemble else []:
            if (out / f"{frag}.md").is_file():
                fragments.append((out / f"{frag}.md").read_text())
    return fragments


def assemble(args: argparse.Namespace, failed: dict[str, str], wall: str) -> Path:
    """Write RESULTS.md and the per-paper Results pages from the fragments in ``--out``."""
    out = Path(args.out)
    default = out.resolve() == E.DEFAULT_OUT.resolve()
    if args.results:
        results = Path(args.results)
    elif default:
        results = E.REPO / "RESULTS.md"
    else:
        results = out / "RESULTS.md"
    pages = (E.REPO / "docs" / "papers") if default else out / "papers"
    pages.mkdir(parents=True, exist_ok=True)
    fragments = gather(args, failed)
    notes_path = out / "investigations.md"
    notes = notes_path.read_text() if notes_path.is_file() else ""
    rules = pages / "verdict-rules.md"
    rules.write_text(
        "# How a verdict is reached\n\n*Generated by `python benchmarks/reproduce.py` "
        "(the rules every section of the papers' Results pages follows).*\n\n"
        + RULES.split("\n", 1)[1].lstrip()
        + "\n"
    )
    keys = R.ordered(
        list(dict.fromkeys(R.paper_key(h) for t in fragments for h, _ in R.sections(t)))
    )
    for key in [k for k in keys if k]:
        _, page = R.paper_title(key)
        (pages / page).write_text(
            R.paper_page(key, fragments, notes, E.REPO, pages.resolve(), rules.name)
        )
    shown = out.resolve()
    try:
        shown = shown.relative_to(E.REPO)
    except ValueError:
        pass
    head = HEADER.format(
        how="--assemble" if args.assemble else f"--{args.mode}",
        out=shown,
        mode="--assemble" if args.assemble else f"--{args.mode}",
        engine=f"`{args.engine}`" if args.engine else "each script's own (its section names it)",
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        wall=wall,
        rules=Path(os.path.relpath(rules, results.resolve().parent)).as_posix(),
        data=data_note(fragments),
        defences=defences_note(fragments) + code_note(),
        rerun=rerun_note(),
    )
    body = R.summary_tables(fragments, pages.resolve(), results.resolve())
    missing = [t.strip().split("\n\n", 1)[1] for t in fragments if not R.paper_key(t[4:])]
    if missing:  # a failed script or a fragment not written yet: said, not hidden
        body += "\n## Sections without results\n\n" + "\n".join(f"- {m}" for m in missing)
    results.write_text(head.rstrip() + "\n\n" + body.rstrip() + "\n")
    return results


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children and theirs."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = E.Parser(description=__doc__.splitlines()[0])
    # each script's own engine and workers unless given: --full reruns exactly the
    # commands the pages show
    E.mode_args(parser, None, "", "default: each script's own")
    parser.set_defaults(workers=None)
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated script names: sections (paper002_gain, ...) and, with --full, "
        "the scripts of investigations that no section runs (stalevre_dips, ...)",
    )
    parser.add_argument("--results", default="", help="where RESULTS.md goes")
    parser.add_argument(
        "--assemble",
        action="store_true",
        help="run nothing: rebuild RESULTS.md and the Results pages from the fragments in --out",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="list every command this would run, with the run time recorded for it, and exit",
    )
    parser.add_argument(
        "--reuse-cache",
        action="store_true",
        help="--full: let the investigations read back their run caches (default: ignore "
        "them and make every run again)",
    )
    args = parser.parse_args(argv)
    names = [n for n, _ in EXPERIMENTS]
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    allowed = names + (investigation_scripts() if args.mode == "full" else [])
    unknown = [n for n in only if n not in allowed]
    if unknown:
        print(
            f"reproduce.py: unknown experiment(s) {unknown}; choose from {names} or, with "
            f"--full, the investigations' {investigation_scripts()}",
            file=sys.stderr,
        )
        return 2
    if args.dry_run:
        return dry_run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    failed: dict[str, str] = {}
    failed_investigations: list[str] = []
    steps = [] if args.assemble else plan(args)
    # only the published commands' costs are recorded (no --engine/--workers of one's own)
    measure = (
        args.mode == "full"
        and args.engine is None
        and args.workers is None
        and not args.reuse_cache  # a cache re-read costs nothing like the runs
    )
    for step in steps:
        print(f"[reproduce] {step.shown}", flush=True)
        if not step.section:
            print(f"[reproduce] {step.note}", flush=True)
        t1, before = time.monotonic(), _children_cpu()
        code = _run(step.argv, None if step.section else E.REPO)
        took, cpu = time.monotonic() - t1, _children_cpu() - before
        print(f"[reproduce] exit {code} after {took:.0f} s (CPU {cpu:.0f} s)", flush=True)
        if measure and code == 0:
            record_time(out, step.key, cpu, took)
        if code != 0:
            if step.section:
                failed[Path(step.argv[1]).stem] = f"exit code {code}"
            else:
                failed_investigations.append(step.shown)
    wall = "" if args.assemble else f"; wall time {(time.monotonic() - t0) / 60:.1f} min"
    results = assemble(args, failed, wall)
    for line in failed_investigations:
        print(f"[reproduce] failed: {line}", file=sys.stderr)
    print(
        f"[reproduce] wrote {results} ({len(failed) + len(failed_investigations)} failed)",
        flush=True,
    )
    return 1 if failed or failed_investigations else 0


if __name__ == "__main__":
    sys.exit(main())
