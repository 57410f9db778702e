"""Behaviour lock for refactors: seven presets (one or more per algorithm family)
run on the in-process engine with a fixed seed, and each run's ``metrics.csv``
and ``assignments.csv`` must be byte-equal to the reference committed in
``tests/reference/`` before the refactor of the strategy (issue 13).

A deliberate change of behaviour regenerates the references, and says so in
its commit message:

    python tests/test_reference_runs.py --write

``metrics.csv`` may hold columns added after its reference was written, if
they are listed in :data:`ADDED_COLUMNS`: then every column of the reference
must still be there, in the same order, with every cell (the text as written)
equal, row by row; only the added columns are not compared. Regenerating the
references makes the comparison byte-for-byte again.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import pytest

from mmfl_flwr import runner
from mmfl_flwr.config import Settings

REFERENCE = Path(__file__).resolve().parent / "reference"
COMMON = dict(tasks="digits,synthetic", num_clients=10, num_rounds=3, local_epochs=1,
              batch_size=16, seed=3)
RUNS: dict[str, dict] = {
    "mfa-rr": dict(COMMON, strategy="mfa-rr"),
    "lvr": dict(COMMON, strategy="lvr", budget_fraction=0.3),
    "stalevr": dict(COMMON, strategy="stalevr", budget_fraction=0.3),
    "stalevre": dict(COMMON, strategy="stalevre", budget_fraction=0.3),
    "scaffold": dict(COMMON, strategy="scaffold", budget_fraction=0.3),
    "pareto-ucb": dict(COMMON, strategy="pareto-ucb", clients_per_round=3),
    "group": dict(COMMON, strategy="group", tasks="digits,digits", num_clients=12,
                  profile="clusters-consistent", group_participation=0.5),
}
FILES = ("metrics.csv", "assignments.csv")
#: metrics.csv columns newer than some references (issue 16: ``coef_sum``).
ADDED_COLUMNS = ("coef_sum",)


def run_into(name: str, out: Path) -> None:
    runner.run(Settings(**RUNS[name], output_dir=str(out)), engine="inprocess")


@pytest.mark.parametrize("name", sorted(RUNS))
def test_run_matches_reference(name, tmp_path):
    run_into(name, tmp_path)
    for f in FILES:
        ref = REFERENCE / name / f
        assert ref.exists(), f"no reference {ref}; run `python {__file__} --write`"
        got, want = (tmp_path / f).read_bytes(), ref.read_bytes()
        if f == "metrics.csv" and got != want:
            assert_same_old_columns(got, want, f"{name}/{f}")
        else:
            assert got == want, f"{name}/{f} changed"


def assert_same_old_columns(got: bytes, want: bytes, what: str) -> None:
    """``got`` is ``want`` with only :data:`ADDED_COLUMNS` added: the same
    rows, and every reference column present, in order, cell for cell."""
    new = list(csv.reader(io.StringIO(got.decode())))
    ref = list(csv.reader(io.StringIO(want.decode())))
    added = [c for c in new[0] if c not in ref[0]]
    assert all(c in ADDED_COLUMNS for c in added), f"{what}: unexpected new columns {added}"
    assert [c for c in new[0] if c in ref[0]] == ref[0], f"{what}: columns changed"
    assert len(new) == len(ref), f"{what}: {len(new) - 1} rows, reference {len(ref) - 1}"
    keep = [new[0].index(c) for c in ref[0]]
    for k, (row, old) in enumerate(zip(new[1:], ref[1:]), start=1):
        assert [row[j] for j in keep] == old, f"{what}: row {k} changed"
    assert got.endswith(b"\n") == want.endswith(b"\n"), f"{what}: line ending changed"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python {sys.argv[0]} --write")
    import shutil
    import tempfile

    for name in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            run_into(name, Path(tmp))
            (REFERENCE / name).mkdir(parents=True, exist_ok=True)
            for f in FILES:
                shutil.copy(Path(tmp) / f, REFERENCE / name / f)
        print("wrote", REFERENCE / name)
