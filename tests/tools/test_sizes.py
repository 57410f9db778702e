"""The package's size convention (issue 58), read with ``ast`` from the source of
every module of ``mmfl_flwr/``:

- no function or method is longer than :data:`MAX_FUNCTION_LINES` lines, counted
  from its ``def`` line (decorators not included) to its last line
  (``end_lineno - lineno + 1``);
- a module longer than :data:`MAX_MODULE_LINES` lines says why it is one module:
  its module docstring holds a paragraph that begins with the exact words
  :data:`MARKER`;
- ``strategy/orchestrator.py`` is at most :data:`MAX_ORCHESTRATOR_LINES` lines.

Each failure names the file, the line and the length, so the list is what is left
to split."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mmfl_flwr"
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 600
MAX_ORCHESTRATOR_LINES = 350
MARKER = "Why one module:"


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """``(name, line, length)`` of every function or method (nested ones too)
    longer than ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                out.append((node.name, node.lineno, length))
    return sorted(out, key=lambda f: f[1])


def says_why_one_module(source: str) -> bool:
    """Whether the module docstring has a paragraph beginning with :data:`MARKER`."""
    doc = ast.get_docstring(ast.parse(source)) or ""
    paragraphs = [p.strip() for p in doc.split("\n\n")]
    return any(p.startswith(MARKER) for p in paragraphs)


def module_lines(source: str) -> int:
    """The module's length in lines."""
    return len(source.splitlines())


def size_problems(package: Path = PACKAGE) -> list[str]:
    """Every breach of the convention in ``package``, one line each."""
    problems = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        source = path.read_text()
        for name, line, length in long_functions(source):
            problems.append(
                f"{rel}:{line}: {name} is {length} lines (at most {MAX_FUNCTION_LINES})"
            )
        n = module_lines(source)
        if n > MAX_MODULE_LINES and not says_why_one_module(source):
            problems.append(
                f"{rel}: {n} lines (over {MAX_MODULE_LINES}) and no '{MARKER}' "
                "paragraph in its docstring"
            )
        if rel == "strategy/orchestrator.py" and n > MAX_ORCHESTRATOR_LINES:
            problems.append(f"{rel}: {n} lines (at most {MAX_ORCHESTRATOR_LINES})")
    return problems


def test_the_package_keeps_the_size_convention():
    problems = size_problems()
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------ the checks themselves


def _function(lines: int, name: str = "f", indent: str = "") -> str:
    """Source of a function of exactly ``lines`` lines."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))
    return f"{indent}def {name}():\n{body}"


def test_a_function_of_101_lines_is_too_long_and_one_of_100_is_not():
    assert long_functions(_function(100)) == []
    assert long_functions(_function(101)) == [("f", 1, 101)]


def test_methods_and_nested_functions_are_measured_too():
    method = "class C:\n" + _function(101, "m", indent="    ")
    assert long_functions(method) == [("m", 2, 101)]
    nested = "def outer():\n" + _function(101, "inner", indent="    ")
    assert [name for name, _, _ in long_functions(nested)] == ["outer", "inner"]


def test_decorators_do_not_count_towards_a_functions_length():
    assert long_functions("@staticmethod\n@other\n" + _function(100)) == []


def test_only_a_paragraph_beginning_with_the_marker_says_why():
    assert says_why_one_module('"""Title.\n\nWhy one module: one class."""\n')
    assert says_why_one_module('"""Title.\n\n    Why one module: indented."""\n')
    assert not says_why_one_module('"""Title.\n\nIt says Why one module: inside."""\n')
    assert not says_why_one_module('"""Title."""\n# Why one module: a comment\n')
    assert not says_why_one_module("x = 1\n")


def test_a_long_module_without_the_paragraph_is_reported(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "strategy").mkdir(parents=True)
    filler = "".join(f"x{i} = {i}\n" for i in range(MAX_MODULE_LINES))
    (pkg / "long.py").write_text('"""A long module."""\n' + filler)
    why = '"""A long module.\n\nWhy one module: it is one table."""\n'
    (pkg / "why.py").write_text(why + filler)
    (pkg / "short.py").write_text('"""Short."""\n' + _function(101))
    (pkg / "strategy" / "orchestrator.py").write_text(
        '"""Orchestrator.\n\nWhy one module: does not exempt it."""\n'
        + "".join(f"x{i} = {i}\n" for i in range(MAX_ORCHESTRATOR_LINES))
    )
    problems = size_problems(pkg)
    assert len(problems) == 3, problems
    assert problems[0].startswith("long.py: 601 lines")
    assert problems[1].startswith("short.py:2: f is 101 lines")
    assert problems[2].startswith("strategy/orchestrator.py: 353 lines")
