"""Behaviour lock for refactors: seven presets (one or more per algorithm family)
run on the in-process engine with a fixed seed, and each run's ``metrics.csv``
and ``assignments.csv`` must be byte-equal to the reference committed in
``tests/reference/`` before the refactor of the strategy (issue 13).

A deliberate change of behaviour regenerates the references, and says so in
its commit message:

    python tests/test_reference_runs.py --write
"""

from __future__ import annotations

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


def run_into(name: str, out: Path) -> None:
    runner.run(Settings(**RUNS[name], output_dir=str(out)), engine="inprocess")


@pytest.mark.parametrize("name", sorted(RUNS))
def test_run_matches_reference(name, tmp_path):
    run_into(name, tmp_path)
    for f in FILES:
        ref = REFERENCE / name / f
        assert ref.exists(), f"no reference {ref}; run `python {__file__} --write`"
        assert (tmp_path / f).read_bytes() == ref.read_bytes(), f"{name}/{f} changed"


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
