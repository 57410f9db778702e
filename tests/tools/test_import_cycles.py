"""The package's modules import one another without a circle: read with ``ast`` from
the source, every import at a module's top level (``if TYPE_CHECKING:`` blocks too: a
type-only circle is still two modules that each need the other), resolved to the
package's own modules. Imports inside functions run later, on demand, and are not
edges here."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mmfl_flwr"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(body: list[ast.stmt]):
    """The import statements at a module's top level (in if/try/with blocks too)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            yield from _top_level_imports(node.body)
            yield from _top_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _top_level_imports(block)
            for handler in node.handlers:
                yield from _top_level_imports(handler.body)
        elif isinstance(node, ast.With):
            yield from _top_level_imports(node.body)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports when it is loaded."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges: set[str] = set()
        for node in _top_level_imports(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                needed = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")
                    anchor = anchor if is_pkg else anchor[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # "from P import n": the submodule P.n if there is one, else a name of P
                needed = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    needed.append(sub if sub in modules else base)
                    if sub not in modules and base in modules and base != name:
                        edges.add(base)
            for target in needed:
                # loading a.b.c runs a and a.b first; the importer's own packages are
                # already being loaded (Python loads a package before its modules)
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    mod = ".".join(parts[:i])
                    if mod in modules and mod != name and mod not in own_packages:
                        edges.add(mod)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (its modules in import order, the first repeated at
    the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_circle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_check_finds_a_planted_circle(tmp_path):
    pkg = tmp_path / "mmfl_flwr"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("from mmfl_flwr.core.b import x\n")
    (pkg / "core" / "b.py").write_text("def f():\n    from mmfl_flwr.core import a\nx = 1\n")
    assert find_cycle(import_graph(pkg)) is None  # an import inside a function is fine
    for back in (
        "from . import a\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mmfl_flwr.core.a import y\n",
    ):
        (pkg / "core" / "b.py").write_text(back + "x = 1\n")
        cycle = find_cycle(import_graph(pkg))
        assert cycle is not None and set(cycle) == {"mmfl_flwr.core.a", "mmfl_flwr.core.b"}
