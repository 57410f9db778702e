"""The repository as a Flower App: what ``flwr run .`` packages.

The app's ``pyproject.toml`` declares what Flower needs (``check_app_pyproject``),
and the FAB that ``flwr run`` builds from the repository stays small (results,
caches and virtual environments are left out). Running it: docs/how-to/flwr-run.md's ``flwr
run`` commands (tests/docs/test_flwr_run_readme.py, the local SuperLink's
simulation, streamed) and the loopback deployments (tests/deploy/, detached runs
polled to ``finished:completed``).
"""

from __future__ import annotations

from e2e_utils import (
    FAB_MAX_BYTES,
    REPO_ROOT,
    check_app_pyproject,
    fab_file_names,
    fab_size_report,
)


def test_the_repository_is_a_flower_app_whose_fab_stays_small() -> None:
    check_app_pyproject(REPO_ROOT)
    size, largest = fab_size_report(REPO_ROOT)
    assert size < FAB_MAX_BYTES, f"the FAB would be {size} bytes; largest files {largest}"


def test_the_fab_leaves_the_published_results_out() -> None:
    """docs/results/ holds the published runs' caches (megabytes of JSONL that
    grow with every investigation); the apps never read them, so the FAB leaves
    them out (``fab-include`` in pyproject.toml lists what the FAB holds) and stays far
    from Flower's 10 MB limit however many results are published."""
    names = fab_file_names(REPO_ROOT)
    assert any(n.startswith("mmfl_flwr/") for n in names)
    published = [n for n in names if n.startswith("docs/results/")]
    assert not published, f"{len(published)} result files in the FAB, e.g. {published[:3]}"
