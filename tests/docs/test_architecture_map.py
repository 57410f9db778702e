"""docs/explanation/architecture.md maps every module of the package.

The rule: each ``.py`` file under ``mmfl_flwr/`` (``__init__.py`` files too) is
named by its path relative to ``mmfl_flwr/``, with forward slashes, in backticks
(``core/policy.py``, ``flower_app/launch.py``, ``__init__.py`` for the package
root), as the first thing on one list line of the page's "Modules" section:
``- `core/policy.py` — what it is for``. A module added without its line fails
here, and so does a line for a module that no longer exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mmfl_flwr"
PAGE = ROOT / "docs" / "explanation" / "architecture.md"
#: a list line of the module map: the module's path in backticks, then what it is for
ENTRY = re.compile(r"^- `([^`]+\.py)` — \S")


def package_modules(package: Path = PACKAGE) -> set[str]:
    """Every module of ``package`` as its path relative to it."""
    return {p.relative_to(package).as_posix() for p in package.rglob("*.py")}


def mapped_modules(text: str) -> list[str]:
    """The modules the "Modules" section of ``text`` lists, in order."""
    parts = re.split(r"(?m)^## Modules\n", text, maxsplit=1)
    section = re.split(r"(?m)^## ", parts[1], maxsplit=1)[0] if len(parts) == 2 else ""
    return [m.group(1) for line in section.splitlines() if (m := ENTRY.match(line))]


def map_problems(text: str, modules: set[str]) -> list[str]:
    """What the page's module map lacks, lists twice or lists in vain."""
    listed = mapped_modules(text)
    problems = [f"{m}: no line in the module map" for m in sorted(modules - set(listed))]
    problems += [f"{m}: listed but not a module" for m in sorted(set(listed) - modules)]
    problems += [f"{m}: listed twice" for m in sorted({m for m in listed if listed.count(m) > 1})]
    return problems


def test_the_architecture_page_maps_every_module():
    problems = map_problems(PAGE.read_text(), package_modules())
    assert not problems, "\n".join(problems)


def test_the_map_check_finds_a_missing_a_stale_and_a_repeated_line():
    page = (
        "# A\n\n## Modules\n\n- `a.py` — one\n- `pkg/b.py` — two\n- `pkg/b.py` — again\n"
        "- `gone.py` — removed\n\n## Next\n\n- `c.py` — outside the section\n"
    )
    problems = map_problems(page, {"a.py", "pkg/b.py", "c.py"})
    assert problems == [
        "c.py: no line in the module map",
        "gone.py: listed but not a module",
        "pkg/b.py: listed twice",
    ]


def test_a_line_without_what_the_module_is_for_does_not_count():
    assert mapped_modules("## Modules\n\n- `a.py` —\n- `b.py` — the b module\n") == ["b.py"]
