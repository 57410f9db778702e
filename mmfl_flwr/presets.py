"""Named presets: each paper algorithm as one line, built from its card.

Every algorithm declares itself once, in an :class:`~mmfl_flwr.core.card.AlgorithmCard`
next to its code (``CARDS`` of its :mod:`mmfl_flwr.core` module). This module
turns the cards into the presets: :data:`PRESETS` (preset name -> factory),
:func:`make_strategy`, and one factory per card under the card's ``function``
name (``lvr``, ``mfa_rr``, ``power_of_choice``, ...; each also exported from
:mod:`mmfl_flwr`).

A factory takes the card's parameters and the other keywords of its policy's and
aggregator's constructors (``budget``, ``floor``, ...), ``aggregator`` where the
card accepts one (a name of :data:`AGGREGATORS` or an
:class:`~mmfl_flwr.core.aggregators.Aggregator`), and every
:class:`~mmfl_flwr.strategy.MultiModelStrategy` keyword (``local_epochs``,
``lr``, ``seed``, ``fraction_evaluate``, ...).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mmfl_flwr.core.card import (
    AGGREGATORS,
    AlgorithmCard,
    card,
    cards,
    check_unused_settings,
    presets_taking,
)
from mmfl_flwr.strategy import MultiModelStrategy

__all__ = [
    "AGGREGATORS",
    "PRESETS",
    "UCB_PRESETS",
    "make_strategy",
    "preset_kwargs",
    "preset_settings",
    "presets_taking",
    "takes_aggregator",
]


def build(algorithm: AlgorithmCard, **kwargs: Any) -> MultiModelStrategy:
    """The strategy of a card: its policy and aggregator
    (:meth:`~mmfl_flwr.core.card.AlgorithmCard.components`, from the card's
    keywords in ``kwargs`` and ``aggregator``) in a
    :class:`~mmfl_flwr.strategy.MultiModelStrategy` that takes every other
    keyword (``local_epochs``, ``lr``, ``seed``, ...)."""
    from mmfl_flwr.config import check_option

    # the card's parameters and the seed (used here, before MultiModelStrategy checks
    # its keywords) by the option table of mmfl run: one message on every surface
    for p in algorithm.parameters:
        if p.name in kwargs:
            check_option(p.field, kwargs[p.name])
    if "seed" in kwargs:
        check_option("seed", kwargs["seed"])
    takes = algorithm.keywords()
    mine = {k: kwargs.pop(k) for k in list(kwargs) if k in takes}
    aggregator = kwargs.pop("aggregator", None)
    policy, agg = algorithm.components(aggregator, int(kwargs.get("seed", 0)), **mine)
    return MultiModelStrategy(policy, agg, **kwargs)


def factory(algorithm: AlgorithmCard) -> Callable[..., MultiModelStrategy]:
    """The preset function of a card (``mmfl_flwr.lvr``): :func:`build`, with
    a signature (the components' keywords, ``aggregator`` where the card takes
    one, ``**kwargs`` for the strategy) and a docstring written from the card."""

    def preset(**kwargs: Any) -> MultiModelStrategy:
        return build(algorithm, **kwargs)

    takes = algorithm.keywords()
    params = []
    for to, make in (("policy", algorithm.policy), ("aggregator", algorithm.aggregator)):
        for name, p in inspect.signature(make).parameters.items():
            if takes.get(name) == to:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
    if not algorithm.fixed_aggregator:
        params.append(inspect.Parameter("aggregator", inspect.Parameter.KEYWORD_ONLY, default=None))
    params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    preset.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    preset.__name__ = preset.__qualname__ = algorithm.function
    preset.__module__ = __name__
    preset.__doc__ = algorithm.docstring()
    return preset


def _factories() -> dict[str, Callable[..., MultiModelStrategy]]:
    out = {}
    for c in cards():
        fn = factory(c)
        out[c.name] = fn
        globals()[c.function] = fn
        __all__.append(c.function)
    return out


#: Preset name (as used by ``mmfl run --strategy`` and ``--run-config strategy=``)
#: -> factory, one per built-in card (a card added later with
#: :func:`~mmfl_flwr.core.card.register_card` is found by :func:`make_strategy`).
PRESETS: dict[str, Callable[..., MultiModelStrategy]] = _factories()

#: The presets whose ``K`` (``clients_per_round``) 0 is computed from the run
#: (:func:`~mmfl_flwr.core.ucb.default_ucb_clients`) instead of "all clients".
UCB_PRESETS = tuple(
    c.name for c in cards() for p in c.parameters if p.field == "clients_per_round" and p.auto
)


def __getattr__(name: str) -> Any:
    for c in cards():  # a registered card's factory
        if c.function == name:
            return factory(c)
    raise AttributeError(f"module 'mmfl_flwr.presets' has no attribute {name!r}")


def preset_settings(name: str, fields: Iterable[str]) -> list[str]:
    """The settings among ``fields`` that preset ``name`` takes (its card's
    parameters)."""
    mine = {p.field for p in card(name).parameters}
    return [f for f in fields if f in mine]


def takes_aggregator(name: str) -> bool:
    """Whether preset ``name`` takes an ``aggregator`` to override its pairing."""
    return not card(name).fixed_aggregator


def preset_kwargs(
    name: str, values: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """The parameters of preset ``name`` that the settings ``values`` (field ->
    value) give (:meth:`~mmfl_flwr.core.card.AlgorithmCard.settings_values`: a
    parameter at its ``unset`` value, e.g. ``clients-per-round`` 0, is left to
    the policy's default or computed by the card).

    Raises ValueError for a setting that only other presets take, set to a value
    other than its default (``defaults``): it would be silently dropped."""
    check_unused_settings(card(name), values, defaults)
    return card(name).settings_values({**defaults, **values})


def make_strategy(name: str, **kwargs: Any) -> MultiModelStrategy:
    """Build a preset by name; unknown names raise a ValueError listing the choices."""
    return build(card(name), **kwargs)


def strategy_table() -> str:
    """The README's strategy table (Markdown), written from the cards: preset,
    factory with the card's parameters at their Python defaults, policy,
    aggregator, paper and section."""
    rows = ["| `--strategy` | Python | policy | aggregator | paper |", "|---|---|---|---|---|"]
    for c in cards():
        sig = inspect.signature(factory(c)).parameters
        args = ", ".join(f"{p.name}={sig[p.name].default!r}" for p in c.parameters)
        rows.append(
            f"| `{c.name}` | `{c.function}({args})` | {c.title}: {c.summary} | "
            f"{c.rule} | {c.paper}, {c.section} |"
        )
    return "\n".join(rows)
