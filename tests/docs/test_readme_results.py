"""The README's headline results agree with RESULTS.md: every claim of the table between
the ``headline-results`` markers is a claim of RESULTS.md's summary, its verdict is that
claim's verdict there, and its link is a committed results page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def headline_rows() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    start = text.index("<!-- headline-results")
    body = text[text.index("\n", start) + 1 : text.index("<!-- /headline-results -->")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in body.splitlines()]
    return [r for r in rows[2:] if r != [""]]


def summary_rows() -> list[list[str]]:
    text = (ROOT / "RESULTS.md").read_text()
    table = text[text.index("| section: claim | paper | found | verdict |") :]
    table = table[: table.index("\n\n")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_headline_claims_carry_their_verdicts_from_results_md():
    rows = headline_rows()
    assert len(rows) >= 5, rows
    summary = summary_rows()
    for paper, claim, verdict, link in rows:
        # the first summary row of that claim (the embedded data's, before mnist-5k's)
        match = next((s for s in summary if s[0].endswith(claim)), None)
        assert match, f"RESULTS.md's summary has no claim ending {claim!r}"
        assert paper.split("/")[0] in match[0], (paper, match[0])
        assert match[-1] == verdict, (claim, verdict, match[-1])
        target = re.fullmatch(r"\[[^]]+\]\((docs/results/[\w.]+\.md)\)", link)
        assert target and (ROOT / target.group(1)).is_file(), link
