"""MkDocs hook: pages generated at build time from the package itself, so the docs
cannot drift from the code.

- ``algorithms/<family>.md``: one page per algorithm family (the module of
  :mod:`mmfl_flwr.core` that declares the cards), each card's paper, section,
  rule, components, accepted aggregators and parameters with their ranges;
- ``algorithms/index.md``: the table of every card;
- ``algorithms/aggregators.md``: the aggregator cards and the presets that take each;
- ``reference/run-config.md``: every setting of :func:`mmfl_flwr.config.options`
  (the table ``mmfl run --help`` and ``Settings.validate`` use): its flag,
  run-config key, type, default and allowed values;
- ``reference/cli.md``: ``mmfl --help`` and each subcommand's ``--help`` as the
  parser prints them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

FAMILY_TITLES = {
    "random_allocation": "Random allocation and full participation",
    "mfa": "MFA-Rand, MFA-RR and Multi-FedAvg",
    "lvr": "MMFL-LVR, GVR and round-robin GVR",
    "stalevr": "MMFL-StaleVR and StaleVRE",
    "stale": "Stale-update baselines: FedVARP, FedStale, MIFA",
    "scaffold": "SCAFFOLD",
    "ucb": "Ranklist- and Pareto-Multi-UCB",
    "group": "MMFL-Group sampling",
    "power_of_choice": "Power-of-choice",
}


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _families() -> dict[str, list[Any]]:
    """Family (the module of :mod:`mmfl_flwr.core` whose ``CARDS`` declare them) ->
    its cards, in the order :func:`~mmfl_flwr.core.card.cards` finds them."""
    import importlib

    from mmfl_flwr.core.card import cards

    out: dict[str, list[Any]] = {}
    for card in cards():
        for family in FAMILY_TITLES:
            module = importlib.import_module(f"mmfl_flwr.core.{family}")
            if card in getattr(module, "CARDS", ()):
                out.setdefault(family, []).append(card)
                break
        else:
            out.setdefault("registered", []).append(card)  # a user's register_card
    return out


def _cite(paper: str) -> str:
    return f"paper {paper}" if paper[:1].isdigit() else paper


def algorithm_page(family: str, family_cards: list[Any]) -> str:
    title = FAMILY_TITLES.get(family, family.replace("_", " ").capitalize())
    lines = [
        f"# {title}",
        "",
        "*Generated from the algorithm cards in "
        f"`mmfl_flwr/core/{family}.py`; a card change changes this page.*",
        "",
    ]
    for card in family_cards:
        aggs = (
            "its aggregator is part of the algorithm"
            if card.fixed_aggregator
            else "`aggregator=` one of " + ", ".join(f"`{a}`" for a in card.accepted_aggregators())
        )
        lines += [
            f"## {card.title} (`{card.name}`)",
            "",
            f"{card.summary}.",
            "",
            f"- **Paper**: {_cite(card.paper)}, {card.section}",
            f"- **Rule**: {card.rule}",
            f"- **Policy**: `{card.policy.__name__}`; **default aggregator**: "
            f"`{getattr(card.aggregator, '__name__', card.aggregator)}`; {aggs}",
            f"- **Python**: `mmfl_flwr.{card.function}(...)`; **CLI**: "
            f'`mmfl run --strategy {card.name}`; **run config**: `strategy = "{card.name}"`',
            "",
        ]
        if card.parameters:
            lines += [
                "| parameter | setting | type | default | allowed | what it does |",
                "|---|---|---|---|---|---|",
            ]
            for p in card.parameters:
                lines.append(
                    f"| `{p.name}` | `{p.key}` | {p.type.__name__} | `{p.default!r}` "
                    f"| {_cell(p.allowed())} | {_cell(p.help)} |"
                )
            lines.append("")
        else:
            lines += ["No parameters of its own.", ""]
    return "\n".join(lines)


def algorithms_index(families: dict[str, list[Any]]) -> str:
    lines = [
        "# Algorithms",
        "",
        "Every preset is an *algorithm card* (`mmfl_flwr.core.card.AlgorithmCard`): a policy",
        "that decides who trains which model, an aggregator that combines each model's",
        "updates, and the parameters they take. This table and the family pages are",
        "generated from the cards.",
        "",
        "| preset | algorithm | paper | family |",
        "|---|---|---|---|",
    ]
    for family, family_cards in families.items():
        for card in family_cards:
            lines.append(
                f"| `{card.name}` | {_cell(card.title)} | {_cite(card.paper)}, "
                f"{_cell(card.section)} | [{FAMILY_TITLES.get(family, family)}]({family}.md) |"
            )
    return "\n".join(lines) + "\n"


def aggregators_page() -> str:
    from mmfl_flwr.core.card import aggregator_cards, cards

    lines = [
        "# Aggregators",
        "",
        "*Generated from the aggregator cards (`AGGREGATOR_CARDS` in `mmfl_flwr/core`).*",
        "The names are the values of `--aggregator` (run-config `aggregator`, a preset's",
        "`aggregator=`); a preset whose aggregator is part of the algorithm takes none.",
        "",
        "| aggregator | class | what it computes | per-model DP | presets that take it |",
        "|---|---|---|---|---|",
    ]
    takers = {c.name: c.accepted_aggregators() for c in cards()}
    for agg in aggregator_cards():
        users = [name for name, accepted in takers.items() if agg.name in accepted]
        lines.append(
            f"| `{agg.name}` | `{agg.factory.__name__}` | {_cell(agg.summary)} "
            f"| {'yes' if agg.private else 'no'} | {', '.join(f'`{u}`' for u in users)} |"
        )
    return "\n".join(lines) + "\n"


def run_config_page() -> str:
    from mmfl_flwr.config import Settings, options

    defaults = Settings()
    types = {f.name: f.type for f in dataclasses.fields(Settings)}
    lines = [
        "# Run configuration",
        "",
        "*Generated from `mmfl_flwr.config.options()`, the table that `mmfl run --help`,",
        "`Settings.validate()` and the run-config checks use.*",
        "",
        "Each setting is a field of `mmfl_flwr.Settings`, a flag of `mmfl run`",
        "(`--num-clients`), and a run-config key of the Flower app",
        '(`flwr run . --run-config "num-clients=10"`, `[tool.flwr.app.config]`).',
        "",
        "| setting | flag / run-config key | type | default | allowed | what it does |",
        "|---|---|---|---|---|---|",
    ]
    for name, opt in options().items():
        key = name.replace("_", "-")
        default = getattr(defaults, name)
        lines.append(
            f"| `{name}` | `--{key}` / `{key}` | {_cell(types.get(name, ''))} "
            f"| `{default!r}` | {_cell(opt.allowed())} | {_cell(opt.help)} |"
        )
    return "\n".join(lines) + "\n"


def _help_of(argv: list[str]) -> str:
    from mmfl_flwr import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        cli.build_parser().parse_args([*argv, "--help"])
    return out.getvalue()


def _subcommands() -> list[str]:
    import argparse

    from mmfl_flwr import cli

    parser = cli.build_parser()
    for action in parser._actions:  # argparse keeps its subparsers here
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def cli_page() -> str:
    sub = _subcommands()
    lines = [
        "# Command line",
        "",
        "*Generated from the parser of `mmfl` (`mmfl_flwr.cli`); each setting's text comes",
        "from the same option table as [the run configuration](run-config.md).*",
        "",
        "```text",
        _help_of([]).rstrip(),
        "```",
        "",
    ]
    for name in sub:
        lines += [f"## `mmfl {name}`", "", "```text", _help_of([name]).rstrip(), "```", ""]
    return "\n".join(lines)


RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def evidence_page(fragment: Path) -> str:
    """A published result (``docs/results/<name>.md``, written by its benchmark script
    and assembled into RESULTS.md at the repository's root) as a page: its links,
    written relative to the root, made relative to the page."""
    text = fragment.read_text()
    return re.sub(r"\]\(docs/results/", "](../results/", text)


def on_files(files: Files, config: Any) -> Files:
    families = _families()
    pages = {f"algorithms/{fam}.md": algorithm_page(fam, cs) for fam, cs in families.items()}
    pages["algorithms/index.md"] = algorithms_index(families)
    pages["algorithms/aggregators.md"] = aggregators_page()
    pages["reference/run-config.md"] = run_config_page()
    pages["reference/cli.md"] = cli_page()
    for fragment in sorted(RESULTS.glob("*.md")):
        pages[f"evidence/{fragment.name}"] = evidence_page(fragment)
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files
