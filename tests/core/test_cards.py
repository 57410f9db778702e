"""Algorithm cards: every algorithm declared once, and everything built from or
held to the cards (presets, Settings, --help, run-config keys, exports, the
README's strategy table); validation on the card, without data; no import
cycle in the package."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import mmfl_flwr
from mmfl_flwr import presets
from mmfl_flwr.config import Settings, options
from mmfl_flwr.core.card import AGGREGATORS, card, cards, setting_parameters

ROOT = Path(__file__).resolve().parents[2]


def test_every_card_is_complete_and_unique():
    names = [c.name for c in cards()]
    functions = [c.function for c in cards()]
    assert len(set(names)) == len(names) and len(set(functions)) == len(functions)
    for c in cards():
        assert c.title and c.paper and c.section and c.summary and c.rule, c.name
        for p in c.parameters:
            assert p.help and p.type in (int, float, str), (c.name, p.name)
            assert isinstance(p.default, p.type), (c.name, p.name)
            assert p.to in ("policy", "aggregator")
            # the parameter is a keyword of the constructor it goes to
            target = c.policy if p.to == "policy" else c.aggregator
            assert p.name in inspect.signature(target).parameters, (c.name, p.name)


def test_presets_and_exports_are_the_cards():
    assert list(presets.PRESETS) == [c.name for c in cards()]
    for c in cards():
        fn = getattr(mmfl_flwr, c.function)
        assert fn is presets.PRESETS[c.name] is getattr(presets, c.function)
        assert c.function in mmfl_flwr.__all__  # exported from the card, no list to edit
        assert getattr(mmfl_flwr, c.policy.__name__) is c.policy
        assert getattr(mmfl_flwr, c.aggregator.__name__) is c.aggregator
        strategy = presets.make_strategy(c.name)
        assert isinstance(strategy.policy, c.policy)
        assert isinstance(strategy.aggregator, c.aggregator)


def test_every_card_parameter_is_a_setting_with_its_default_and_help():
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    defaults = Settings()
    for fld, users in setting_parameters().items():
        param = users[0][1]
        assert fld in fields, fld
        assert getattr(defaults, fld) == param.default
        assert options()[fld].help.startswith(param.help)


def test_pyproject_keys_are_the_settings_and_hold_the_cards_defaults():
    with open(ROOT / "pyproject.toml", "rb") as f:
        cfg = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
    missing = {p.key: p.default for c in cards() for p in c.parameters}.items() - cfg.items()
    assert not missing, (
        f"pyproject.toml's [tool.flwr.app.config] lacks or differs in {sorted(missing)}: "
        "add `key = default` for each"
    )


def test_readme_strategy_table_is_written_from_the_cards():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- strategy-table")
    body = readme[readme.index("\n", start) + 1 : readme.index("<!-- /strategy-table -->")]
    assert body.strip() == presets.strategy_table(), (
        "README's strategy table differs from the cards: replace it with "
        "python -c 'from mmfl_flwr.presets import strategy_table; print(strategy_table())'"
    )


def test_setting_aggregators_follow_the_cards():
    for c in cards():
        accepted = c.accepted_aggregators()
        for name in AGGREGATORS:
            s = Settings(strategy=c.name, aggregator=name)
            if name in accepted:
                s.validate()
            else:
                with pytest.raises(ValueError, match=c.name):
                    s.validate()


def test_a_setting_of_another_algorithm_is_refused():
    with pytest.raises(ValueError, match="candidates=3 is not used by strategy 'lvr'"):
        Settings(strategy="lvr", candidates=3).validate()
    Settings(strategy="power-of-choice", candidates=3).validate()


def test_validation_builds_no_strategy_and_loads_no_data():
    code = (
        "import sys\n"
        "from mmfl_flwr.config import Settings\n"
        "from mmfl_flwr.core.card import cards\n"
        "for c in cards():\n"
        "    Settings(strategy=c.name).validate()\n"
        "bad = [m for m in ('mmfl_flwr.flower_app.server_app', 'mmfl_flwr.flower_app.data',\n"
        "                   'mmfl_flwr.presets', 'mmfl_flwr.tasks.datasets', 'torch')\n"
        "       if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_unknown_strategy_lists_the_cards():
    with pytest.raises(ValueError, match="power-of-choice"):
        card("nope")


# ------------------------------------------------------------------ import graph
def _imports(path: Path) -> list[str]:
    """Every mmfl_flwr name ``path`` imports (``module.name`` for ``from module
    import name``), at module level or inside a function, except under
    ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            skip.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmfl_flwr"):
            out += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("mmfl_flwr")]
    return out


def import_graph() -> dict[str, set[str]]:
    modules = {}
    for p in (ROOT / "mmfl_flwr").rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m, p in modules.items():
        for name in _imports(p):
            if name in modules and name != m:
                graph[m].add(name)
            elif name.rpartition(".")[0] in modules and name.rpartition(".")[0] != m:
                graph[m].add(name.rpartition(".")[0])
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    assert sys.getrecursionlimit() >= 1000
    assert cycles(import_graph()) == []


def test_config_imports_neither_the_apps_nor_the_presets():
    graph = import_graph()
    assert not graph["mmfl_flwr.config"] & {
        "mmfl_flwr.flower_app.server_app",
        "mmfl_flwr.flower_app.data",
        "mmfl_flwr.presets",
    }
    assert not any(m.startswith("mmfl_flwr.flower_app") for m in graph["mmfl_flwr.presets"])
