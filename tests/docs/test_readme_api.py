"""Every public name the README and the pages it moved to show is importable as they show it.

Parses README.md and the docs pages that took its sections (issue 57): the
imports of their Python snippets are executed, every
``mmfl_flwr.<name>`` it mentions must resolve, and every call shown in inline
code (``stalevr(...)``, ``MultiModelStrategy(policy=MFARand(8), ...)``) must
name something importable from the top-level package. The package ships
``py.typed`` (PEP 561).
"""

from __future__ import annotations

import builtins
import importlib
import re
import tomllib
from pathlib import Path

import pytest

import mmfl_flwr

ROOT = Path(__file__).resolve().parents[2]
#: The README and the docs pages its sections moved to (issue 57).
PAGES = [
    ROOT / "README.md",
    ROOT / "docs" / "getting-started.md",
    ROOT / "docs" / "benchmarks.md",
    *sorted((ROOT / "docs").glob("tutorials/*.md")),
    *sorted((ROOT / "docs").glob("how-to/*.md")),
    *sorted((ROOT / "docs").glob("explanation/*.md")),
    ROOT / "docs" / "reference" / "outputs.md",
    ROOT / "docs" / "reference" / "environment.md",
]
README = "\n\n".join(p.read_text() for p in PAGES)


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def _imports() -> list[tuple[str, list[str]]]:
    out = []
    for block in _python_blocks():
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            m = re.match(r"from\s+(mmfl_flwr[\w.]*)\s+import\s+(.+)", line)
            if m:
                names = [n.strip().split(" as ")[0] for n in m.group(2).strip("()").split(",")]
                out.append((m.group(1), [n for n in names if n]))
            m = re.match(r"import\s+(mmfl_flwr[\w.]*)", line)
            if m:
                out.append((m.group(1), []))
    return out


def _inline_code() -> list[str]:
    text = re.sub(r"```.*?```", "", README, flags=re.S)
    return re.findall(r"`([^`\n]+)`", text)


def test_readme_has_python_imports_to_check():
    assert any(mod == "mmfl_flwr" for mod, _ in _imports())


@pytest.mark.parametrize("module, names", _imports(), ids=lambda v: str(v))
def test_snippet_imports_resolve(module, names):
    mod = importlib.import_module(module)
    for name in names:
        assert hasattr(mod, name), f"README imports {name} from {module}, which lacks it"


def test_dotted_package_names_resolve():
    dotted = set(re.findall(r"\bmmfl_flwr\.([A-Za-z_]\w*)", README))
    assert dotted, "the README mentions no mmfl_flwr.<name>"
    for name in dotted:
        if importlib.util.find_spec(f"mmfl_flwr.{name}") is not None:
            continue  # a submodule
        assert hasattr(mmfl_flwr, name), f"README mentions mmfl_flwr.{name}"


def test_calls_in_inline_code_are_exported():
    called: set[str] = set()
    for span in _inline_code():
        # identifiers followed by "(" and not preceded by "." (methods, other packages)
        for m in re.finditer(r"(?<![\w.])([A-Za-z_]\w*)\(", span):
            called.add(m.group(1))
    called -= set(dir(builtins))
    assert {"stalevr", "MultiModelStrategy", "FixedRates"} <= called
    classes = [getattr(mmfl_flwr, n) for n in mmfl_flwr.__all__ if n[:1].isupper()]
    missing = sorted(
        n
        for n in called
        # an exported name, or a method of an exported class (the contract tables)
        if not hasattr(mmfl_flwr, n) and not any(hasattr(c, n) for c in classes)
    )
    assert not missing, f"README shows calls of names mmfl_flwr does not export: {missing}"


def test_all_exports_import():
    for name in mmfl_flwr.__all__:
        assert getattr(mmfl_flwr, name) is not None


def test_ships_py_typed():
    assert (ROOT / "mmfl_flwr" / "py.typed").is_file()
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in cfg["tool"]["setuptools"]["package-data"]["mmfl_flwr"]
