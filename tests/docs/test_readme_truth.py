"""The docs stay true to the code: the output-file table (docs/reference/outputs.md)
lists every file a run writes (MMFL-Group's cluster records included), the README's
introduction does not call an implemented algorithm "roadmap", and the algorithm notes
(docs/explanation/algorithm-notes.md) state the deviations from the papers that the code
makes."""

from __future__ import annotations

import re
from pathlib import Path

from mmfl_flwr import runner
from mmfl_flwr.config import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
OUTPUTS = (ROOT / "docs" / "reference" / "outputs.md").read_text()
NOTES = (ROOT / "docs" / "explanation" / "algorithm-notes.md").read_text()


def _output_table_patterns() -> list[re.Pattern[str]]:
    """File names in the first column of the output-file table (docs/reference/outputs.md), and of
    docs/tracking.md's (the files of issue 59: report.html; events.csv)
    (``<r>``-style placeholders match any text)."""
    names = []
    for text in (OUTPUTS, (ROOT / "docs" / "tracking.md").read_text()):
        start = text.index("| file | content |")
        table = text[start : text.index("\n\n", start)]
        names += re.findall(r"^\| `([^`]+)` \|", table, flags=re.M)
    return [
        re.compile(
            re.sub(r"<[^>]+>", ".+", re.escape(n).replace(r"\<", "<").replace(r"\>", ">")) + "$"
        )
        for n in names
    ]


def test_output_table_lists_every_file_of_a_group_run(tmp_path):
    s = Settings(
        strategy="group",
        tasks="digits,digits,digits",
        profile="clusters-consistent",
        num_clients=12,
        num_rounds=2,
        local_epochs=1,
        output_dir=str(tmp_path),
    )
    runner.run(s, engine="inprocess")
    written = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert "clusters.csv" in written and any(n.startswith("clusters_round_") for n in written)
    patterns = _output_table_patterns()
    documented = {"config.json", "checkpoint.pkl"}  # described in the sentence above it
    missing = [n for n in written if n not in documented and not any(p.match(n) for p in patterns)]
    assert not missing, f"files a run writes but docs/reference/outputs.md's table omits: {missing}"


def test_introduction_calls_no_implemented_algorithm_roadmap():
    intro = README.split("## The two commands")[0]
    assert "MMFL-Group" in intro
    assert "roadmap" not in intro.lower()


def test_algorithm_notes_state_the_deviations():
    assert NOTES.startswith("# Where the implementation settles or departs from the papers")
    notes = NOTES
    for phrase in (
        "trainable",  # G over trainable parameters, BN state averaged
        "clipped to `[0, b0]`",  # StaleVRE's clipping of beta
        "max(Δ_t − 1, 1)",  # StaleVRE's guard
        "loss query",  # UCB's initialisation
        "`N_t`",  # UCB's counting
        "re-sampled every round",  # MFA-RR with K < N
        "(s + τ) mod L",  # pseudo-models rotate
        "`mifa-start`",  # MIFA's start (zero, the rule as stated, or uploaded)
        "fdu_no_wait",  # what MIFA's published code does
    ):
        assert phrase in notes, phrase
