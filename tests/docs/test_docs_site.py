"""The documentation site builds with ``mkdocs build --strict`` (no broken link, no
unresolved reference, every API page rendered), and its generated pages follow the
code: every algorithm card has a section, and the run-config reference is the option
table (change a help string and the page changes)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")


def _hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "tools/mkdocs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_strictly(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    site = tmp_path / "site"
    for page in ("index.html", "reference/cli/index.html", "reference/api/index.html"):
        assert (site / page).is_file(), page
    api = (site / "reference/api/index.html").read_text()
    assert "MultiModelStrategy" in api and "NodeLayout" in api  # mkdocstrings rendered


def test_every_card_has_a_generated_section():
    from mmfl_flwr.core.card import cards

    hooks = _hooks()
    families = hooks._families()
    pages = {fam: hooks.algorithm_page(fam, cs) for fam, cs in families.items()}
    index = hooks.algorithms_index(families)
    for card in cards():
        assert sum(f"(`{card.name}`)" in page for page in pages.values()) == 1, card.name
        assert f"| `{card.name}` |" in index
        for p in card.parameters:
            assert any(f"| `{p.key}` |" in page for page in pages.values()), (card.name, p.key)
    from mmfl_flwr.core.card import aggregator_cards

    aggs = hooks.aggregators_page()
    for agg in aggregator_cards():
        assert f"| `{agg.name}` | `{agg.factory.__name__}` |" in aggs
    nav = (ROOT / "mkdocs.yml").read_text()
    for family in families:
        assert f"algorithms/{family}.md" in nav, family


def test_the_run_config_page_is_the_option_table(monkeypatch):
    from mmfl_flwr import config

    hooks = _hooks()
    table = config.options()
    page = hooks.run_config_page()
    for name in table:
        assert f"| `{name}` | `--{name.replace('_', '-')}` / `{name.replace('_', '-')}` |" in page
    changed = dict(table)
    changed["lr"] = dataclasses.replace(table["lr"], help="a help text changed by the test")
    monkeypatch.setattr(config, "options", lambda: changed)
    assert "a help text changed by the test" in hooks.run_config_page()


def test_the_cli_page_shows_every_subcommands_help():
    hooks = _hooks()
    page = hooks.cli_page()
    for sub in hooks._subcommands():
        assert f"## `mmfl {sub}`" in page
    assert "--num-clients" in page and "usage: mmfl run" in page
