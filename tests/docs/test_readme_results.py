"""The README's headline results agree with RESULTS.md: every claim of the table between
the ``headline-results`` markers is a claim of RESULTS.md's table for that paper, its
verdict is that claim's verdict there, and its link is a committed results page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAD = "| claim | data and horizon | found | paper | verdict |"


def headline_rows() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    start = text.index("<!-- headline-results")
    body = text[text.index("\n", start) + 1 : text.index("<!-- /headline-results -->")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in body.splitlines()]
    return [r for r in rows[2:] if r != [""]]


def summary_rows(text: str | None = None) -> dict[str, list[list[str]]]:
    """RESULTS.md's claims tables: the paper a ``## `` heading names (``003``,
    ``000/001``) -> its rows (claim, data and horizon, found, paper, verdict)."""
    text = (ROOT / "RESULTS.md").read_text() if text is None else text
    out: dict[str, list[list[str]]] = {}
    for part in re.split(r"(?m)^## ", text)[1:]:
        key = re.match(r"Papers? (\d{3}(?:/\d{3})?)", part)
        if not key or HEAD not in part:
            continue
        table = part[part.index(HEAD) :]
        table = table[: table.index("\n\n")] if "\n\n" in table else table
        out[key.group(1)] = [
            [c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]
        ]
    return out


def check(readme: list[list[str]], summary: dict[str, list[list[str]]]) -> None:
    """Each README row's claim is in its paper's table with the same verdict."""
    assert len(readme) >= 5, readme
    for paper, claim, verdict, link in readme:
        rows = summary.get(paper)
        assert rows, f"RESULTS.md has no table for paper {paper}"
        # the first row of that claim (the embedded data's, before mnist-5k's)
        match = next((s for s in rows if s[0].endswith(claim)), None)
        assert match, f"RESULTS.md's paper {paper} table has no claim ending {claim!r}"
        assert match[-1] == verdict, (claim, verdict, match[-1])
        target = re.fullmatch(r"\[[^]]+\]\((docs/[\w./-]+\.md)\)", link)
        assert target and (ROOT / target.group(1)).is_file(), link


def test_headline_claims_carry_their_verdicts_from_results_md():
    check(headline_rows(), summary_rows())


def test_a_verdict_that_disagrees_with_results_md_fails():
    readme = headline_rows()
    summary = summary_rows()
    paper, claim, verdict, link = readme[0]
    changed = [[paper, claim, "does not hold" if verdict != "does not hold" else "holds", link]]
    try:
        check(changed + readme[1:], summary)
    except AssertionError:
        pass
    else:
        raise AssertionError("a README verdict other than RESULTS.md's was accepted")
