"""Every measured number in the docs traces to a committed output file (issue 57).

The hand-written pages (README.md and docs/ outside the committed outputs in docs/results/
and the Results pages docs/papers/ that reproduce.py builds from them)
may quote a measurement only if the number appears in an output file the page links: a
file or folder under docs/results/ (``../results/x.md``, ``docs/results/x``) or a generated
evidence page (``evidence/x.md``, built from ``docs/results/x.md``). Numbers in code
(fenced blocks and inline code spans) are inputs, not measurements, and software versions
(``torch 2.13``, ``flwr 1.42``) are not measured; they are skipped. The few other decimal
numbers in prose that are not measurements (a goal, a paper's section number, a constant of
a formula) are listed in :data:`NOT_MEASURED` with the reason, per page; a new measurement
typed into a page makes this test fail until the page links the file that holds it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
NUMBER = re.compile(r"(?<![\w.])[+\-−]?\d*\.\d+(?:e[-+−]?\d+)?(?![\w.])")
VERSION = re.compile(
    r"(?:Python|flwr|Flower|torch|PyTorch|Ray|mkdocs|numpy|CUDA)\s*(?:>=|==|=)?\s*\d+\.\d+(?:\.\d+)*"
)
LINK = re.compile(r"(?:\.\./)*(?:docs/)?(results|evidence)/([\w./-]+)")
TEXT_SUFFIXES = {".md", ".csv", ".json", ".jsonl", ".txt"}

#: page -> {number: why it is not a measurement}
NOT_MEASURED: dict[str, dict[str, str]] = {
    "README.md": {"4.2": "a section number of paper 003"},
    "docs/benchmarks.md": {
        "0.1": "the benchmark's budget fraction, an input",
        "1.2": "the project's goal for the in-process engine, not a measurement",
    },
    "docs/explanation/algorithm-notes.md": {"7.1": "a section number of paper 002"},
    "docs/explanation/shard-nodes.md": {"1.3": "issue 24's target, not a measurement"},
    "docs/explanation/server-memory.md": {
        "2.24": "arithmetic on the stated sizes (120 · 5 · 10^6 · 4 bytes in GiB)",
    },
    "docs/how-to/defences.md": {
        "1.4826": "the constant that turns a median absolute deviation into a deviation",
        "0.1": "the cosine thresholds REVERSED_MIN_COSINE and DIRECTION_AGREEMENT, constants",
    },
    "docs/defence-events.md": {
        "0.1": "REVERSED_MIN_COSINE, the cosine a reversed update is below, a constant",
    },
}


def pages() -> list[Path]:
    generated = {"results", "papers"}  # committed outputs and the pages built from them
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md")) if not generated & set(p.parts)]
    return [ROOT / "README.md", *docs]


def linked_outputs(text: str) -> list[Path]:
    """The committed output files a page links (folders give every text file in them)."""
    found: list[Path] = []
    for _kind, rel in LINK.findall(text):
        path = RESULTS / rel.rstrip(".)")
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(p for p in sorted(path.rglob("*")) if p.is_file())
    return [p for p in found if p.suffix in TEXT_SUFFIXES]


def quoted_numbers(text: str) -> set[str]:
    """Decimal numbers of the prose, signs dropped (code and software versions removed)."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = re.sub(r"`[^`]*`", "", prose)
    prose = VERSION.sub("", prose)
    return {m.group(0).replace("−", "-").lstrip("+-") for m in NUMBER.finditer(prose)}


def spellings(number: str) -> set[str]:
    out = {number}
    if number.startswith("0."):
        out.add(number[1:])
    if number.startswith("."):
        out.add("0" + number)
    return out


def untraced(page: Path) -> list[str]:
    text = page.read_text()
    corpus = "\n".join(p.read_text(errors="ignore") for p in linked_outputs(text))
    key = page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name
    allowed = NOT_MEASURED.get(key, {})
    return sorted(
        n
        for n in quoted_numbers(text)
        if n not in allowed and not any(s in corpus for s in spellings(n))
    )


def test_the_checker_finds_a_typed_measurement(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("The run ended at 0.8123 after `--budget-fraction 0.3` on torch 2.13.\n")
    assert untraced(page) == ["0.8123"]


def test_every_number_in_the_pages_traces_to_an_output_file():
    missing = {
        page.relative_to(ROOT).as_posix(): nums for page in pages() if (nums := untraced(page))
    }
    assert not missing, (
        "numbers in the docs that no linked output file holds (link the committed output "
        f"that has them, or drop them): {missing}"
    )


def test_every_exemption_is_still_needed():
    """An exemption whose number left the page is stale: remove it."""
    stale = {
        page: [n for n in numbers if n not in quoted_numbers((ROOT / page).read_text())]
        for page, numbers in NOT_MEASURED.items()
    }
    assert not {p: n for p, n in stale.items() if n}, stale
