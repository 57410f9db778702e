"""Measurements leave the prose (issue 57): the README and the hand-written docs pages
carry no dated machine anecdotes ("on 2026-12-01 that session's machine ran ..."). A
measured number lives in a committed output file (docs/results/, which records its command,
machine and date), which the pages link or include."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def pages() -> list[Path]:
    """README.md and every page under docs/ except the committed outputs (docs/results/)
    and the Results pages that ``reproduce.py --assemble`` builds from them (docs/papers/)."""
    docs = [
        p
        for p in sorted((ROOT / "docs").rglob("*.md"))
        if "results" not in p.parts and "papers" not in p.parts
    ]
    return [ROOT / "README.md", *docs]


def test_the_pages_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in pages()}
    assert {"README.md", "docs/explanation/shard-nodes.md", "docs/benchmarks.md"} <= names


def test_no_page_dates_a_measurement():
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for p in pages()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if DATE.search(line)
    ]
    assert not found, "dated anecdotes (move the number into a committed output file):\n" + (
        "\n".join(found)
    )
