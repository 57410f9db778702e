"""The checks that run before the tests: the README's test command (which .ci/run runs
verbatim) runs ruff check, ruff format --check and mypy before pytest, from the pinned
`dev` extra, and the pre-commit hooks run the same commands."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ["ruff check .", "ruff format --check .", "mypy"]


def readme_test_command() -> str:
    """The shell line after the test-command marker, read as .ci/run reads it."""
    lines = (ROOT / "README.md").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "<!-- test-command -->" in line)
    return lines[at + 2]


def test_the_test_command_runs_every_check_before_pytest_and_stops_on_a_finding():
    steps = [s.strip() for s in readme_test_command().split("&&")]
    assert steps[-1] == "pytest", steps
    for check in CHECKS:
        assert check in steps, (check, steps)
        assert steps.index(check) < steps.index("pytest")
    # joined by && only: a failing check stops the command with its exit code
    assert ";" not in readme_test_command() and "||" not in readme_test_command()
    install = next(s for s in steps if s.startswith("pip install"))
    assert re.search(r'-e "\.\[[^"]*\bdev\b[^"]*\]"', install), install


def test_ci_runs_the_readme_command_and_fails_with_it():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in ci and 'bash -c "$cmd"' in ci
    assert 'exit "$rc"' in ci


def test_the_dev_extra_pins_the_tools():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pins = {re.split(r"[=<>!~ ]", r)[0]: r for r in extras["dev"]}
    assert "==" in pins["ruff"] and "==" in pins["mypy"], pins


def test_pre_commit_runs_the_same_tools_from_the_local_environment():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [h for repo in config["repos"] for h in repo["hooks"]]
    assert all(repo["repo"] == "local" for repo in config["repos"])
    assert all(h["language"] == "system" for h in hooks)
    entries = [h["entry"].split(" --force-exclude")[0] for h in hooks]
    assert entries == ["ruff check", "ruff format --check", "mypy"], entries
