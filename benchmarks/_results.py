"""Build RESULTS.md's one-page summary and the per-paper Results pages from the fragments.

The experiment scripts write one Markdown fragment per section into ``docs/results``
(``paper003_table1.md``, ``mnist5k/table1/paper003_table1.md``, ...); each holds the
section's tables, its ``Verdict:`` paragraphs, its figures and a line with the command
and the scale it ran at. This module reads them back:

- :func:`verdicts` finds each claim's verdict, found number and paper number;
- :func:`scale_of` reads the data and horizon a fragment records (task, examples a
  model, clients, rounds, seeds) and the paper's own setting, so that every summary row
  names what it ran on;
- :func:`summary_tables` gives RESULTS.md's tables, one per paper;
- :func:`paper_page` gives a paper's Results page: its claims table first, the figures
  next, then each section's detail and the investigations about that paper.

Nothing here holds a number of its own: every number comes from a fragment.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

#: (key, title, page file name) of each paper, in the order of the summary
PAPERS: list[tuple[str, str, str]] = [
    ("002", "Paper 002: the gain of multi-model FL, MFA-Rand and MFA-RR", "paper-002.md"),
    (
        "003",
        "Paper 003: heterogeneous client sampling (MMFL-LVR, GVR, StaleVR, StaleVRE)",
        "paper-003.md",
    ),
    ("000/001", "Papers 000/001: group-based client sampling (MMFL-Group)", "papers-000-001.md"),
    ("004", "Paper 004: Multi-FedAvg and the bandit policies", "paper-004.md"),
]

#: The papers' own settings, as the papers state them (paper 002 Sections 6.2 and 7.1;
#: paper 003 Section 6 and Fig. 5; papers 000/001 Section III, Figs. 4 and 6; paper 004
#: Section V) and as the fragments' claim paragraphs quote them.
PAPER_SETTINGS: dict[str, str] = {
    "Paper 002": "Synthetic(1,1), N = 100 clients, T1 = 70 (Section 7.1); "
    "the spread over 20 sample runs (Section 6.2)",
    "Paper 003, Table 1": "3 Fashion-MNIST models, 120 clients, clients holding about 12 "
    "and about 120 examples; rounds not stated",
    "Paper 003, Fig. 2": "3 Fashion-MNIST models, 120 clients (Table 1's runs)",
    "Paper 003, Fig. 4": "3 Fashion-MNIST models, 120 clients (Table 1's runs)",
    "Paper 003, Fig. 5": "EMNIST, 1 model, 40 clients in two halves (4% and 16% participation)",
    "Papers 000/001": "MNIST/FMNIST/CIFAR/EMNIST models, 30 clients (24 static + 36 "
    "arriving in (c)), 30-40 examples a client and model, (c) read at round 500",
    "Paper 004": "Synthetic(1,1) and Synthetic-IID (figures only, no horizon in the text)",
}


@dataclass
class Row:
    """One claim of a fragment: where it is, its verdict, what was found and the
    paper's number, and the data and horizon it ran on."""

    heading: str
    claim: str
    verdict: str
    found: str
    paper: str
    scale: str = ""


def verdicts(text: str) -> list[tuple[str, str, str, str]]:
    """``(section heading: claim, verdict, found, paper)`` for every ``Verdict:``
    paragraph of a fragment, under the nearest ``###`` heading above it. The verdict
    is the paragraph's first sentence; ``found`` and ``paper`` are its sentences that
    start with ``Found:`` and ``Paper:`` ("" where there is none)."""
    return [(_label(r.heading, r.claim), r.verdict, r.found, r.paper) for r in rows_of(text)]


def _label(heading: str, claim: str) -> str:
    """The summary's historic ``heading: claim`` label."""
    return f"{heading}: {claim}" if claim else heading


def rows_of(text: str) -> list[Row]:
    """Every ``Verdict:`` paragraph of a fragment as a :class:`Row` (no scale yet)."""
    out: list[Row] = []
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
            out.append(Row(heading, claim, verdict, found, paper))
    return out


def paper_key(heading: str) -> str:
    """The paper a section heading names (``"003"``, ``"000/001"``; "" if none)."""
    m = re.match(r"Papers? (\d{3}(?:/\d{3})?)", heading)
    return m.group(1) if m else ""


def _flat(text: str) -> str:
    """The text with its line breaks and runs of spaces as single spaces."""
    return " ".join(text.split())


def _seeds(spec: str) -> int:
    """The number of seeds of ``[0, 1, 2]`` / ``0,1,2`` / ``0..19`` / ``0-8``."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:\.\.|-)\s*(\d+)\s*", spec)
    if m:
        return int(m.group(2)) - int(m.group(1)) + 1
    return len([s for s in re.split(r"[,\s]+", spec.strip("[] ")) if s])


def _num(n: int | str) -> str:
    """A whole number with a thousands separator."""
    return f"{int(n):,}"


def task_pools(fragments: list[str]) -> dict[str, int]:
    """Task -> the training examples a model's clients hold in all, as Table 1's
    fragments record them (runs without a data-size profile)."""
    pools: dict[str, int] = {}
    for text in fragments:
        flat = _flat(text)
        held = re.search(r"A model's clients hold (\d+) training samples in all", flat)
        tasks = re.search(r"scale: \d+ clients \(profile paper003\), tasks `([\w-]+)", flat)
        if held and tasks:
            pools.setdefault(tasks.group(1), int(held.group(1)))
    return pools


def _group_scale(flat: str, claim: str, pools: dict[str, int]) -> str:
    """Papers 000/001's data and horizon for one claim (its scenario, if it names one)."""
    rounds = re.search(r"(\d+) clients \((\d+) in \(c\)\), (\d+) rounds", flat)
    seeds = re.search(r"(\d+) seeds \(", flat)
    task = "mnist-5k" if "`mnist-5k`" in flat else "digits"
    if not (rounds and seeds):
        return ""
    scen = re.match(r"\(([a-d])\)", claim)
    clients = (
        rounds.group(2 if scen.group(1) == "c" else 1)
        if scen
        else f"{rounds.group(1)} ({rounds.group(2)} in (c))"
    )
    sizes = dict((s, m) for m, s in re.findall(r"(\d+) \(\d+-\d+\) in \(([a-d])\)", flat))
    median = sizes.get(scen.group(1)) if scen else None
    share = "each model's whole training pool is shared out" in flat
    pool = pools.get(task)
    data = f"{_num(pool)} examples a model" if share and pool else "examples a model: see the page"
    if "at the papers' data sizes" in flat[:300] or not share:
        low_high = re.search(r"median of (\d+) \((\d+-\d+)\)", flat)
        data = (
            f"{low_high.group(2)} examples a client and model" if low_high else data
        )  # the papers' sizes: each client keeps 30-40 a model
    elif median:
        data += f", median {median} a client"
    horizon = f"{rounds.group(3)} rounds"
    if "mid-training" in claim:
        window = re.search(
            r"Mid-training: mean accuracy (?:of the arriving models, )?[^:]*?"
            r"over rounds (\d+-\d+)",
            flat,
        )
        if scen and scen.group(1) == "d":
            window = re.search(r"over rounds (\d+-\d+) and `[^`]+` over rounds (\d+-\d+)", flat)
        if window:
            horizon += " (read over rounds " + " and ".join(window.groups()) + ")"
    return f"{task}; {data}; {clients} clients; {horizon}; {seeds.group(1)} seeds"


def scale_of(heading: str, claim: str, fragment: str, pools: dict[str, int]) -> str:
    """The data and horizon a claim ran on, as its fragment records them: task, examples
    a model, clients, rounds, seeds; then the paper's setting where it differs ("" when
    the fragment records no scale this module can read)."""
    flat = _flat(fragment)
    key = paper_key(heading)
    found = ""
    if key == "002":
        m = re.search(
            r"scale: (\d+) clients, T1 = (\d+), M in \{([\d, ]+)\}, M-model runs of M·T1 \+ "
            r"(\d+) rounds, (\d+) seeds",
            flat,
        )
        cap = re.search(r"at most (\d+) samples per Synthetic user", flat)
        if m:
            ms = [int(x) for x in m.group(3).split(",")]
            t1, extra = int(m.group(2)), int(m.group(4))
            found = (
                f"M copies of Synthetic(1,1), M = {ms[0]}-{ms[-1]}; at most "
                f"{cap.group(1) if cap else '?'} examples a user; {m.group(1)} clients; "
                f"M·{t1} + {extra} rounds ({min(ms) * t1 + extra}-{max(ms) * t1 + extra}); "
                f"{m.group(5)} seeds"
            )
        setting = PAPER_SETTINGS["Paper 002"]
    elif key == "003" and "Fig. 5" in heading:
        m = re.search(
            r"scale: task `([\w-]+)` \((\d+) model\), (\d+) clients, .*? (\d+) rounds, .*?"
            r"seeds \[([\d, ]+)\]",
            flat,
        )
        pool = pools.get(m.group(1)) if m else None
        if m:
            found = (
                f"{m.group(1)}, {m.group(2)} model; "
                f"{_num(pool) + ' examples a model' if pool else 'examples a model: see the page'}"
                f"; {m.group(3)} clients; {m.group(4)} rounds; {_seeds(m.group(5))} seeds"
            )
        setting = PAPER_SETTINGS["Paper 003, Fig. 5"]
    elif key == "003":
        m = re.search(
            r"scale: (\d+) clients \(profile ([\w-]+)\), tasks `([^`]+)` \((\d+) models\), "
            r"(\d+) rounds, .*?seeds \[([\d, ]+)\]",
            flat,
        )
        held = re.search(r"A model's clients hold (\d+) training samples in all", flat)
        if m:
            task = m.group(3).split(",")[0]
            rounds = f"{m.group(5)} rounds"
            part = re.match(r"Paper 003, (Fig\. \d|Table 1)", heading)
            section = _section_text(fragment, heading)
            if part and part.group(1) == "Fig. 2":
                seen = re.search(r"rounds 1-(\d+)", _flat(section))
                rounds = f"{seen.group(1)} rounds" if seen else rounds
            elif part and part.group(1) == "Table 1":
                read = re.search(r"read here at ([\d, and]+) rounds", flat)
                if read and read.group(1) != m.group(5):
                    rounds += f" (read at {read.group(1)})"
            seeds = _seeds(m.group(6))
            over = re.search(r"over (\d+) seeds", claim + " " + _flat(section))
            if part and part.group(1) == "Fig. 2" and over:
                seeds = int(over.group(1))
            found = (
                f"{m.group(4)} × {task}"
                + (f" (profile `{m.group(2)}`)" if m.group(2) != "paper003" else "")
                + f"; {_num(held.group(1)) if held else '?'} examples a model; "
                f"{m.group(1)} clients; {rounds}; {seeds} seeds"
            )
        part = re.match(r"Paper 003, (Fig\. \d|Table 1)", heading)
        setting = PAPER_SETTINGS.get(f"Paper 003, {part.group(1) if part else 'Table 1'}", "")
    elif key == "000/001":
        found = _group_scale(flat, claim, pools)
        setting = PAPER_SETTINGS["Papers 000/001"]
    elif key == "004":
        m = re.search(
            r"(\w+) logistic-regression models, (\d+) clients, rounds K=(\d+): (\d+), "
            r"K=(\d+): (\d+), .*?capped at (\d+) samples, (\d+) seeds",
            flat,
        )
        if m:
            found = (
                f"Synthetic(1,1) and Synthetic-IID, {m.group(1)} models; at most "
                f"{m.group(7)} examples a user; {m.group(2)} clients (K = {m.group(3)} or "
                f"{m.group(5)} a round); {m.group(4)} rounds (K = {m.group(3)}), "
                f"{m.group(6)} rounds (K = {m.group(5)}); {m.group(8)} seeds"
            )
        setting = PAPER_SETTINGS["Paper 004"]
    else:
        setting = ""
    if not found:
        return ""
    if "mid-training" in claim and "read over rounds" not in found:
        window = re.search(r"[Mm]id-training [^.]*?over rounds (\d+-\d+)", flat)
        if window:
            found = re.sub(
                r"; (\d+) rounds;", rf"; \1 rounds (read over rounds {window.group(1)});", found
            )
    return f"{found}. Paper: {setting}" if setting else found


def _section_text(fragment: str, heading: str) -> str:
    """The part of a fragment under ``### heading`` (up to the next ``###``)."""
    start = fragment.find(f"### {heading}")
    if start < 0:
        return ""
    end = fragment.find("\n### ", start + 4)
    return fragment[start : end if end > 0 else len(fragment)]


def rounds_of(scale: str, claim: str) -> str:
    """The horizon a verdict was reached at, from a row's scale ("" if it names one
    of several horizons or none): ``"20 rounds"``, or the mid-training window."""
    window = re.search(r"\(read over rounds ([^)]+)\)", scale)
    if "mid-training" in claim and window:
        return f"over rounds {window.group(1)}"
    per_k = re.findall(r"(\d+) rounds \((K = \d+)\)", scale)
    if per_k:
        return "at " + " and ".join(f"{n} ({k})" for n, k in per_k) + " rounds"
    m = re.search(r"; (\d+) rounds(?: \(read at [^)]*\))?;", scale)
    if m and "read at" not in m.group(0):
        return f"at {m.group(1)} rounds"
    return ""


def qualified(verdict: str, horizon: str) -> str:
    """A verdict that does not hold or is not resolved, with the horizon it was reached
    at (``does not hold at 20 rounds``): a longer run could change it. Verdicts that
    already name their rounds, and those that hold, are kept as they are."""
    if not horizon or "round" in verdict:
        return verdict
    m = re.match(r"(does not hold|not resolved)\b", verdict)
    if not m:
        return verdict
    return f"{m.group(1)} {horizon}{verdict[m.end() :]}"


def _short(heading: str, claim: str) -> str:
    """A row's claim without its paper: ``Table 1, on `mnist-5k`: MMFL-LVR above
    MMFL-GVR``."""
    m = re.match(r"Papers? [\d/]+(?:, ([^:]+))?:\s*(.*)$", heading)
    if not m:
        return _label(heading, claim)
    part, rest = m.group(1) or "", m.group(2)
    variant = re.search(r", (on `.*)$", rest)
    where = ", ".join(x for x in (part, variant.group(1) if variant else "") if x)
    if not claim:
        return ", ".join(x for x in (part, rest) if x)
    return f"{where}: {claim}" if where else claim


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def collect(fragments: list[str]) -> dict[str, list[Row]]:
    """Paper key -> its rows, each with its scale, in the fragments' order."""
    pools = task_pools(fragments)
    out: dict[str, list[Row]] = {}
    for text in fragments:
        for row in rows_of(text):
            row.scale = scale_of(row.heading, row.claim, text, pools)
            horizon = rounds_of(row.scale, row.claim)
            row.verdict = qualified(row.verdict, horizon)
            out.setdefault(paper_key(row.heading), []).append(row)
    return out


TABLE_HEAD = "| claim | data and horizon | found | paper | verdict |\n|---|---|---|---|---|"


def claims_table(rows: list[Row]) -> str:
    """A paper's claims: claim, data and horizon, found, paper, verdict."""
    lines = [TABLE_HEAD]
    for r in rows:
        cells = [_short(r.heading, r.claim), r.scale, r.found, r.paper, r.verdict]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def paper_title(key: str) -> tuple[str, str]:
    """(title, page file name) of a paper key; unknown keys get a title of their own."""
    for k, title, page in PAPERS:
        if k == key:
            return title, page
    name = key.replace("/", "-") or "other"
    return (f"Paper {key}" if key else "Other sections"), f"paper-{name}.md"


def ordered(keys: list[str]) -> list[str]:
    """Paper keys in :data:`PAPERS` order, unknown ones after."""
    known = [k for k, _, _ in PAPERS if k in keys]
    return known + [k for k in keys if k not in known]


def summary_tables(fragments: list[str], pages: Path, results: Path) -> str:
    """RESULTS.md's summary: for each paper, a heading linking its Results page (in
    ``pages``, the link relative to ``results``'s folder) and its claims table."""
    rows = collect(fragments)
    out = []
    for key in ordered(list(rows)):
        title, page = paper_title(key)
        link = os.path.relpath(pages / page, results.parent)
        out += [
            f"## {title}",
            "",
            f"Evidence (claims, figures, each section's detail, investigations): [{title}]"
            f"({Path(link).as_posix()}).",
            "",
            claims_table(rows[key]),
            "",
        ]
    return "\n".join(out)


_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def _relink(text: str, repo: Path, page_dir: Path) -> str:
    """Links written relative to the repository root (``docs/results/x.png``) made
    relative to the page's folder."""

    def fix(m: re.Match[str]) -> str:
        target = m.group(1)
        if target.startswith(("http", "#", "../", "./")) or not (repo / target).exists():
            return m.group(0)
        return m.group(0).replace(
            f"]({target})", f"]({Path(os.path.relpath(repo / target, page_dir)).as_posix()})"
        )

    return re.sub(r"!?\[[^\]]*\]\(([^)\s]+)\)", fix, text)


def sections(text: str) -> list[tuple[str, str]]:
    """``(heading, body)`` for each ``###`` section of a Markdown text."""
    parts = re.split(r"(?m)^### ", text)
    return [(p.splitlines()[0].strip(), p) for p in parts[1:] if p.strip()]


def paper_page(
    key: str,
    fragments: list[str],
    investigations: str,
    repo: Path,
    page_dir: Path,
    rules_page: str,
) -> str:
    """A paper's Results page: its claims table, then the figures (with the section
    each belongs to), then each section's text without its figures, then the
    investigations whose heading names this paper."""
    title, _ = paper_title(key)
    mine = [t for t in fragments if any(paper_key(h) == key for h, _ in sections(t))]
    rows = collect(fragments).get(key, [])
    out = [
        f"# {title}",
        "",
        "*Generated by `python benchmarks/reproduce.py --assemble` from the fragments the "
        "experiment scripts wrote into `docs/results` (do not edit by hand). How each "
        f"verdict is reached: [the rules]({rules_page}).*",
        "",
        "## Claims",
        "",
        claims_table(rows),
        "",
        "## Figures",
        "",
    ]
    for text in mine:
        for heading, body in sections(text):
            images = _IMAGE.findall(body)
            if images:
                out += [f"**{heading}**", ""]
                out += [" ".join(f"![{alt}]({src})" for alt, src in images), ""]
    out += ["## Details", ""]
    for text in mine:
        out += [_IMAGE.sub("", text).rstrip(), ""]
    notes = [body for heading, body in sections(investigations) if paper_key(heading) == key]
    if notes:
        out += ["## Investigations", ""]
        out += ["### " + body.rstrip() + "\n" for body in notes]
    return _relink("\n".join(out).rstrip() + "\n", repo, page_dir)
