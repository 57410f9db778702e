#!/usr/bin/env python
"""Regenerate the papers' evidence: run every experiment script and rebuild RESULTS.md.

    python benchmarks/reproduce.py --quick     # minutes on 2 cores
    python benchmarks/reproduce.py --smoke     # seconds: every step at the smallest scale
                                               # (a slow test runs it)
    python benchmarks/reproduce.py --full      # the scale RESULTS.md reports (hours), then
                                               # the investigations' runs as it shows them

Each script in :data:`EXPERIMENTS` runs in its own process with the same mode, engine and
output folder; each writes its CSV, PNG and a Markdown fragment ``<name>.md`` into the
output folder (``docs/results`` by default). RESULTS.md is then assembled from the
fragments, in the order of :data:`EXPERIMENTS`, under a header that names the mode, the
engine, the machine and the command. A script that fails is reported in RESULTS.md and
makes the exit code 1; the others still run.

``--assemble`` runs nothing and rebuilds RESULTS.md from the fragments already in the
output folder (e.g. after running the scripts one by one, on several machines: each
fragment names the command, engine and machine that produced it). Besides the
fragments, RESULTS.md gets a summary table of every section's verdict (its
``Verdict:`` lines) and, last, the hand-written ``investigations.md`` of the output
folder if there is one (what was varied where a claim does not hold).

``--only NAME[,NAME]`` runs a subset (the other fragments already in the folder are kept
and assembled too); ``--results PATH`` writes RESULTS.md elsewhere (default: the
repository's RESULTS.md for the default output folder, else ``<out>/RESULTS.md``).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import _evidence as E

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
    "docs/results/mnist5k/defence_cost_runs.jsonl",
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
    # Table 1 on mnist-5k: its 30 runs measured 13.5 hours of summed run time, one core a
    # run (full participation, StaleVR and GVR train every client: 44-58 minutes a run on
    # today's code, 60-83 minutes for the seed-0 runs on older code; StaleVR peaks at about
    # 9 GiB). Into docs/results it only re-reads its cache; under another --out the cache
    # moves too, so every run is made again (hours)
    "python benchmarks/paper003_table1.py --full --tasks mnist-5k,mnist-5k,mnist-5k "
    "--methods full,random,lvr,gvr,stalevr,stalevre,fedvarp,mifa,scaffold,mifa-uploaded "
    "--seeds 0,1,2 --num-rounds 40 --engine inprocess --out docs/results/mnist5k/table1 "
    "--cache docs/results/mnist5k/table1/runs.jsonl",
    # Table 1 on mnist-5k at paper 003's data sizes (profile paper003-sizes): its 30 runs
    # measured 7.4 hours of summed run time, one core a run, two runs at a time (full
    # participation, StaleVR and GVR 30-35 minutes a run; StaleVR peaks at about 9 GiB).
    # Into docs/results it only re-reads its cache (hours under another --out)
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
#: a section's own where they exist: Table 1 and papers 000/001 on real handwritten digits
#: (`mnist-5k`) beside the stand-in, each scenario of papers 000/001 at the most seeds it
#: has.
EXTRA_FRAGMENTS: dict[str, list[str]] = {
    "paper003_table1": ["mnist5k/table1/paper003_table1", "mnist5k/table1_sizes/paper003_table1"],
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

HEADER = (
    """# Results: the papers' claims, reproduced

This file is generated by `python benchmarks/reproduce.py --{mode}` (do not edit it by
hand; the text of each section comes from its script in `benchmarks/`). Every number is
a mean over seeds; an interval is a two-sided 95% t interval unless its cell says
otherwise (size claims: one-sided 95% bounds; equivalence claims: 90% intervals).
Differences between methods are paired per seed (the same seed gives both methods the
same federation, initial weights and data).

- mode: `--{mode}`; engine: `{engine}`; machine: {machine}
- generated {date}; wall time {wall}

"""
    + RULES
    + "\n"
)

ASSEMBLED = (
    """# Results: the papers' claims, reproduced

This file is generated by `python benchmarks/reproduce.py --assemble` from the fragments
that the experiment scripts wrote into `{out}` (do not edit it by hand; the text of each
section comes from its script in `benchmarks/`, the investigations from
`{out}/investigations.md`). Each section names the command, the scale, the engine and the
machine that produced it. Every number is a mean over seeds; an interval is a two-sided
95% t interval unless its cell says otherwise (size claims: one-sided 95% bounds;
equivalence claims: 90% intervals). Differences between methods are paired per seed (the
same seed gives both methods the same federation, initial weights and data). Two 2-core
machines of this project are both named "AMD EPYC, 2 cores" and rounded float32 differently
(investigations, mnist-5k); sections recorded since the machine line names torch's vector
kernels say which ("AVX512 kernels": the second machine), older ones do not. Every run
here predates the bound on reversed updates (`reversed-influence-factor`, on by default
since 2026-12-03; README, *Hostile clients*): it ran without it, as with
`--reversed-influence-factor 0`.
{code}
- generated {date}

"""
    + RULES
    + "\n"
)


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


def verdicts(text: str) -> list[tuple[str, str, str, str]]:
    """``(section heading: claim, verdict, found, paper)`` for every ``Verdict:``
    paragraph of a fragment, under the nearest ``###`` heading above it. The verdict
    is the paragraph's first sentence; ``found`` and ``paper`` are its sentences that
    start with ``Found:`` and ``Paper:`` ("" where there is none)."""
    out: list[tuple[str, str, str, str]] = []
    heading = ""
    lines = text.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("### "):
            heading = line[4:].strip()
        elif line.startswith("Verdict:") or line.startswith("Verdict ("):
            para = [line]
            for nxt in lines[k + 1 :]:
                if not nxt.strip():
                    break
                para.append(nxt.strip())
            label, _, rest = (
                " ".join(para).partition("):")
                if line.startswith("Verdict (")
                else ("Verdict", "", " ".join(para)[len("Verdict:") :])
            )
            claim = label[len("Verdict (") :].strip() if label.startswith("Verdict (") else ""
            parts = [x.strip() for x in re.split(r"\.\s+(?=(?:Found|Paper):)", rest.strip())]
            verdict = parts[0].split(". ")[0].rstrip(".")
            found = next(
                (x[len("Found:") :].strip().rstrip(".") for x in parts if x.startswith("Found:")),
                "",
            )
            paper = next(
                (x[len("Paper:") :].strip().rstrip(".") for x in parts if x.startswith("Paper:")),
                "",
            )
            out.append((f"{heading}: {claim}" if claim else heading, verdict, found, paper))
    return out


def summary(parts: list[str]) -> str:
    rows = ["## Summary", "", "| section: claim | paper | found | verdict |", "|---|---|---|---|"]
    for part in parts:
        for heading, verdict, found, paper in verdicts(part):
            cells = [heading, paper, found, verdict]
            rows.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(rows) + "\n"


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


def main(argv: list[str] | None = None) -> int:
    parser = E.Parser(description=__doc__.splitlines()[0])
    # each script's own engine and workers unless given: --full reruns exactly the
    # commands RESULTS.md shows
    E.mode_args(parser, None, "", "default: each script's own")
    parser.set_defaults(workers=None)
    parser.add_argument("--only", default="", help="comma-separated script names")
    parser.add_argument("--results", default="", help="where RESULTS.md goes")
    parser.add_argument(
        "--assemble",
        action="store_true",
        help="run nothing: rebuild RESULTS.md from the fragments in --out",
    )
    args = parser.parse_args(argv)
    names = [n for n, _ in EXPERIMENTS]
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in only if n not in names]
    if unknown:
        print(
            f"reproduce.py: unknown experiment(s) {unknown}; choose from {names}", file=sys.stderr
        )
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    failed: dict[str, str] = {}
    failed_investigations: list[str] = []
    for name, _ in EXPERIMENTS:
        if (only and name not in only) or args.assemble:
            continue
        cmd = command(name, args)
        print(f"[reproduce] {' '.join(cmd[1:])}", flush=True)
        t1 = time.monotonic()
        proc = subprocess.run(cmd, check=False)
        print(
            f"[reproduce] {name}: exit {proc.returncode} after {time.monotonic() - t1:.0f} s",
            flush=True,
        )
        if proc.returncode != 0:
            failed[name] = f"exit code {proc.returncode}"
    if args.mode == "full" and not args.assemble and not only:
        # the investigations' runs, as RESULTS.md shows them (hours more)
        for line in INVESTIGATIONS:
            cmd = investigation_command(line, out)
            print(f"[reproduce] {line}", flush=True)
            t1 = time.monotonic()
            proc = subprocess.run(cmd, check=False, cwd=E.REPO)
            print(
                f"[reproduce] exit {proc.returncode} after {time.monotonic() - t1:.0f} s",
                flush=True,
            )
            if proc.returncode != 0:
                failed_investigations.append(line)
    wall = time.monotonic() - t0
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.assemble:
        shown = out.resolve()
        try:
            shown = shown.relative_to(E.REPO)
        except ValueError:
            pass
        head = ASSEMBLED.format(out=shown, date=date, code=code_note())
    else:
        head = HEADER.format(
            mode=args.mode,
            engine=args.engine or "each script's own (its section names it)",
            machine=E.machine(),
            date=date,
            wall=f"{wall / 60:.1f} min",
        )
    parts: list[str] = []
    for name, fragments in EXPERIMENTS:
        if name in failed:
            parts.append(
                f"### {name}\n\n**Failed** ({failed[name]}): rerun "
                f"`python benchmarks/{name}.py --{args.mode}`.\n"
            )
            continue
        for frag in fragments:
            path = out / f"{frag}.md"
            if path.is_file():
                parts.append(path.read_text())
            else:
                parts.append(
                    f"### {frag}\n\nNo results yet: run "
                    f"`python benchmarks/{name}.py --{args.mode}`.\n"
                )
        # the investigations' fragments are full-scale runs: not in a --quick/--smoke file
        for frag in EXTRA_FRAGMENTS.get(name, []) if args.mode == "full" or args.assemble else []:
            if (out / f"{frag}.md").is_file():
                parts.append((out / f"{frag}.md").read_text())
    notes = out / "investigations.md"
    body = parts + ([notes.read_text()] if notes.is_file() else [])
    parts = [head, summary(parts)] + body
    if args.results:
        results = Path(args.results)
    elif out.resolve() == E.DEFAULT_OUT.resolve():
        results = E.REPO / "RESULTS.md"
    else:
        results = out / "RESULTS.md"
    results.write_text("\n".join(p.rstrip() + "\n" for p in parts))
    for line in failed_investigations:
        print(f"[reproduce] failed: {line}", file=sys.stderr)
    print(
        f"[reproduce] wrote {results} ({len(failed) + len(failed_investigations)} failed)",
        flush=True,
    )
    return 1 if failed or failed_investigations else 0


if __name__ == "__main__":
    sys.exit(main())
