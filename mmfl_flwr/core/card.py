"""Algorithm cards: every algorithm declares itself once, next to its code.

A card (:class:`AlgorithmCard`) names an algorithm (its preset name and the
factory exported from :mod:`mmfl_flwr`), cites its paper and section, and says
which policy and default aggregator it pairs, which aggregators it accepts and
which parameters it takes (:class:`Parameter`: name, type, allowed values,
default, help). Everything else is built from the cards:

- :mod:`mmfl_flwr.presets` (``PRESETS``, ``make_strategy`` and the factories
  ``lvr``, ``mfa_rr``, ...: :meth:`AlgorithmCard.components` wrapped in a
  :class:`~mmfl_flwr.strategy.MultiModelStrategy`);
- the algorithm parameters of :class:`~mmfl_flwr.config.Settings` (one field,
  one run-config key and one ``mmfl run`` flag per parameter), their help text
  and their range checks;
- the pairing checks of ``Settings.validate()``, run on the card (they build the
  policy and aggregator objects, never a strategy, and load no data).

A test holds ``pyproject.toml``'s run-config keys, the README's strategy table
and :mod:`mmfl_flwr`'s exports to the cards.

The cards are found without a list to edit: every module of
:mod:`mmfl_flwr.core` that defines ``CARDS`` (a tuple of cards) contributes
them, and :func:`register_card` adds a user's own. Framework-free (no flwr, no
torch): the strategy is built in :mod:`mmfl_flwr.presets`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmfl_flwr.core.aggregator_card import AggregatorCard
from mmfl_flwr.core.aggregators import Aggregator
from mmfl_flwr.core.pairing import check_pairing
from mmfl_flwr.core.parameter import Option as Option
from mmfl_flwr.core.parameter import Parameter as Parameter

if TYPE_CHECKING:
    from mmfl_flwr.core.policy import Policy


class _AggregatorTable(Mapping[str, Callable[[], Aggregator]]):
    """Aggregator name -> factory, read from the aggregator cards when first used
    (the built-in ones, module by module, then the registered ones)."""

    def _table(self) -> dict[str, Callable[[], Aggregator]]:
        return {c.name: c.factory for c in aggregator_cards()}

    def __getitem__(self, name: str) -> Callable[[], Aggregator]:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return f"AGGREGATORS({', '.join(self._table())})"


#: Aggregator name (``aggregator=`` of a preset, ``--aggregator``) -> factory, from
#: the aggregator cards (:class:`~mmfl_flwr.core.aggregator_card.AggregatorCard`).
AGGREGATORS: Mapping[str, Callable[[], Aggregator]] = _AggregatorTable()


@dataclass(frozen=True)
class AlgorithmCard:
    """One algorithm: what it is, where it comes from, what it pairs and takes.

    Attributes
    ----------
    name : str
        The preset name (``mmfl run --strategy``, run-config ``strategy``).
    function : str
        The factory's name, exported from :mod:`mmfl_flwr` (``power_of_choice``).
    title : str
        The algorithm's name as its paper writes it.
    paper : str
        The paper (``"003"`` for ``shared/papers``' numbering, or a citation).
    section : str
        Where in the paper (``"Algorithm 1, Eq. 13"``).
    summary : str
        What the policy does, in one sentence (no final period).
    rule : str
        What the default aggregator does, in a few words.
    policy : callable
        Builds the policy from the policy parameters (usually the class).
    aggregator : callable
        Builds the default aggregator from the aggregator parameters.
    aggregators : tuple of str, optional
        Names in :data:`AGGREGATORS` that may replace the default; ``()`` when
        the aggregator is part of the algorithm (stale updates, SCAFFOLD); None
        (the default): every registered aggregator that pairs with the policy
        (:func:`~mmfl_flwr.core.pairing.check_pairing`).
    parameters : tuple of Parameter
        The parameters a run configuration sets.
    seeded : bool
        The policy takes the run's ``seed`` too (MMFL-Group's K-means).
    """

    name: str
    function: str
    title: str
    paper: str
    section: str
    summary: str
    rule: str
    policy: Callable[..., Policy]
    aggregator: Callable[..., Aggregator]
    aggregators: tuple[str, ...] | None = None
    parameters: tuple[Parameter, ...] = ()
    seeded: bool = False

    # -- what it takes --------------------------------------------------------
    def keywords(self) -> dict[str, str]:
        """Every keyword the factory passes on to a component (constructor
        keyword -> ``"policy"`` or ``"aggregator"``), read from the
        constructors' signatures: the card's parameters and the constructors'
        other keywords (``budget``, ``floor``, ``directory``, ...)."""
        out: dict[str, str] = {}
        for to, build in (("aggregator", self.aggregator), ("policy", self.policy)):
            for name, p in inspect.signature(build).parameters.items():
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                    out[name] = to
        if self.seeded:
            out.pop("seed", None)  # the strategy's seed, passed to both
        return out

    @property
    def fixed_aggregator(self) -> bool:
        """Whether the aggregator is part of the algorithm (no ``aggregator=``)."""
        return self.aggregators == ()

    def accepted_aggregators(self) -> list[str]:
        """The aggregator names that may replace the default."""
        if self.aggregators is not None:
            return list(self.aggregators)
        policy = self.policy()
        out = []
        for name, make in AGGREGATORS.items():
            try:
                check_pairing(policy, make())
            except ValueError:
                continue
            out.append(name)
        return out

    def settings_values(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The component keywords that settings ``values`` (Settings field ->
        value) give: a parameter at its ``unset`` value is left out (its
        constructor's default applies) unless its ``auto`` gives one."""
        out: dict[str, Any] = {}
        for p in self.parameters:
            if p.field not in values:
                continue
            value = values[p.field]
            if p.unset is not None and value == p.unset:
                if p.auto is None:
                    continue
                value = p.auto(values)
            out[p.name] = value
        return out

    # -- building -------------------------------------------------------------
    def components(
        self,
        aggregator: Aggregator | str | None = None,
        seed: int = 0,
        **values: Any,
    ) -> tuple[Policy, Aggregator]:
        """The policy and aggregator, built from ``values`` (constructor
        keywords) and checked as a pair. Raises ValueError for an aggregator
        the card does not accept, a keyword no component takes, or a value a
        constructor refuses."""
        takes = self.keywords()
        unknown = sorted(set(values) - set(takes))
        if unknown:
            raise ValueError(
                f"strategy {self.name!r} takes no parameter {', '.join(map(repr, unknown))} "
                f"(its parameters: {', '.join(sorted(takes)) or 'none'})"
            )
        policy_kw = {k: v for k, v in values.items() if takes[k] == "policy"}
        agg_kw = {k: v for k, v in values.items() if takes[k] == "aggregator"}
        if self.seeded:
            policy_kw["seed"] = seed
        policy = self.policy(**policy_kw)
        if aggregator is None:
            agg = self.aggregator(**agg_kw)
        else:
            if self.fixed_aggregator:
                raise ValueError(
                    f"aggregator={_describe(aggregator)} cannot be used with strategy "
                    f"{self.name!r}: its aggregator is part of the algorithm (strategies "
                    "that take one: "
                    + ", ".join(c.name for c in cards() if not c.fixed_aggregator)
                    + ")"
                )
            if isinstance(aggregator, str):
                accepted = self.accepted_aggregators()
                if aggregator not in AGGREGATORS:
                    raise ValueError(
                        f"unknown aggregator {aggregator!r}; choose from {', '.join(AGGREGATORS)}"
                    )
                if aggregator not in accepted:
                    detail = ""
                    try:
                        check_pairing(policy, AGGREGATORS[aggregator]())
                    except ValueError as err:
                        detail = f": {err}"
                    raise ValueError(
                        f"aggregator {aggregator!r} does not pair with strategy "
                        f"{self.name!r} (it accepts {', '.join(accepted)}){detail}"
                    )
                agg = AGGREGATORS[aggregator]()
            else:
                agg = aggregator
        check_pairing(policy, agg)
        return policy, agg

    def docstring(self) -> str:
        """The factory's docstring."""
        aggs = (
            "its aggregator is part of the algorithm"
            if self.fixed_aggregator
            else f"``aggregator=`` one of {', '.join(self.accepted_aggregators())}"
        )
        lines = [
            f"{self.title} ({_cite(self.paper)}, {self.section}): {self.summary}.",
            "",
            f"Policy {_name(self.policy)}, default aggregator {_name(self.aggregator)}; "
            f"{aggs}. Every other keyword goes to "
            ":class:`~mmfl_flwr.strategy.MultiModelStrategy`.",
            "",
        ]
        if self.parameters:
            lines += ["Parameters", "----------"]
            for p in self.parameters:
                lines += [
                    f"{p.name} : {p.type.__name__}",
                    f"    {p.help} (setting ``{p.key}``: {p.allowed()}; default {p.default!r}).",
                ]
        return "\n".join(lines)


def _cite(paper: str) -> str:
    return f"paper {paper}" if paper[:1].isdigit() else paper


def _name(obj: Any) -> str:
    return getattr(obj, "__name__", type(obj).__name__)


def _describe(aggregator: Any) -> str:
    return repr(aggregator) if isinstance(aggregator, str) else type(aggregator).__name__


# ------------------------------------------------------------------ registry
#: The built-in modules in the order the docs list their algorithms; any other
#: module of :mod:`mmfl_flwr.core` with ``CARDS`` follows, by name.
_ORDER = ("random_allocation", "mfa", "lvr", "stalevr", "stale", "scaffold", "ucb", "group")
_USER_CARDS: dict[str, AlgorithmCard] = {}
_USER_AGGREGATORS: dict[str, AggregatorCard] = {}
_FOUND: tuple[dict[str, AlgorithmCard], dict[str, AggregatorCard]] | None = None


def _discover_all() -> tuple[dict[str, AlgorithmCard], dict[str, AggregatorCard]]:
    """The built-in algorithm and aggregator cards: every module of
    :mod:`mmfl_flwr.core` (in :data:`_ORDER`, then by name) that defines ``CARDS``
    or ``AGGREGATOR_CARDS``, in the order each lists them."""
    global _FOUND
    if _FOUND is None:
        package = __name__.rpartition(".")[0]  # mmfl_flwr.core, without importing it
        found: dict[str, AlgorithmCard] = {}
        aggregators: dict[str, AggregatorCard] = {}
        here = [str(Path(__file__).resolve().parent)]
        names = sorted(m.name for m in pkgutil.iter_modules(here))
        names.sort(key=lambda n: _ORDER.index(n) if n in _ORDER else len(_ORDER))
        for name in names:
            module = importlib.import_module(f"{package}.{name}")
            for card in getattr(module, "CARDS", ()):
                if card.name in found:
                    raise RuntimeError(f"two algorithm cards are named {card.name!r}")
                found[card.name] = card
            for agg in getattr(module, "AGGREGATOR_CARDS", ()):
                if agg.name in aggregators:
                    raise RuntimeError(f"two aggregator cards are named {agg.name!r}")
                aggregators[agg.name] = agg
        _FOUND = (found, aggregators)
    return _FOUND


def _discover() -> dict[str, AlgorithmCard]:
    return _discover_all()[0]


def aggregator_cards() -> list[AggregatorCard]:
    """Every aggregator card: the built-in ones (module by module of
    :mod:`mmfl_flwr.core`), then the registered ones."""
    return [*_discover_all()[1].values(), *_USER_AGGREGATORS.values()]


def aggregator_card_of(aggregator: Aggregator) -> AggregatorCard | None:
    """The card whose factory is ``aggregator``'s class, or None (a stale rule,
    SCAFFOLD's, or an aggregator no card names)."""
    for c in aggregator_cards():
        if c.factory is type(aggregator):
            return c
    return None


def register_aggregator(new: AggregatorCard, replace: bool = False) -> None:
    """Add a user's aggregator: ``--aggregator new.name`` (and a preset's
    ``aggregator=new.name``) builds it, for every preset whose policy it pairs
    with. A built-in name is refused; a registered one only with ``replace``."""
    if new.name in _discover_all()[1] or (new.name in _USER_AGGREGATORS and not replace):
        raise ValueError(f"aggregator {new.name!r} exists already")
    _USER_AGGREGATORS[new.name] = new


def cards() -> list[AlgorithmCard]:
    """Every algorithm card: the built-in ones (module by module of
    :mod:`mmfl_flwr.core`, in the order each module lists them), then the
    registered ones."""
    return [*_discover().values(), *_USER_CARDS.values()]


def card(name: str) -> AlgorithmCard:
    """The card of preset ``name``; unknown names raise a ValueError listing
    the choices."""
    for c in cards():
        if c.name == name:
            return c
    raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(c.name for c in cards())}")


def register_card(new: AlgorithmCard, replace: bool = False) -> None:
    """Add a user's algorithm: ``make_strategy(new.name)`` and the presets'
    lookups find it. Its parameters must be settings that exist already
    (``Settings`` is built once, at import). A name taken by a built-in card
    is refused; a registered one only with ``replace``."""
    if new.name in _discover() or (new.name in _USER_CARDS and not replace):
        raise ValueError(f"strategy {new.name!r} exists already")
    _USER_CARDS[new.name] = new


def presets_taking(field: str) -> list[str]:
    """The presets whose card reads setting ``field``."""
    return [c.name for c in cards() if any(p.field == field for p in c.parameters)]


def check_unused_settings(
    algorithm: AlgorithmCard, values: Mapping[str, Any], defaults: Mapping[str, Any]
) -> None:
    """Raise ValueError for a setting of another card's parameters that ``values``
    (Settings field -> value) set to other than its default (``defaults``):
    ``algorithm`` would drop it silently."""
    mine = {p.field for p in algorithm.parameters}
    for fld, value in values.items():
        if fld in mine or value == defaults.get(fld, value):
            continue
        users = presets_taking(fld)
        if users:
            raise ValueError(
                f"{fld.replace('_', '-')}={value!r} is not used by strategy "
                f"{algorithm.name!r} (strategies that use it: {', '.join(users)})"
            )


def setting_parameters() -> dict[str, list[tuple[AlgorithmCard, Parameter]]]:
    """Settings field -> the (card, parameter) pairs that read it, for every
    built-in card (the fields :class:`~mmfl_flwr.config.Settings` adds for
    the algorithms). Parameters that share a field agree on its type and
    default (checked here)."""
    out: dict[str, list[tuple[AlgorithmCard, Parameter]]] = {}
    for c in _discover().values():
        for p in c.parameters:
            out.setdefault(p.field, []).append((c, p))
    for fld, users in out.items():
        first = users[0][1]
        for c, p in users[1:]:
            if (p.type, p.default) != (first.type, first.default):
                raise RuntimeError(
                    f"setting {fld!r}: card {c.name!r} declares {p.type.__name__} "
                    f"{p.default!r}, card {users[0][0].name!r} {first.type.__name__} "
                    f"{first.default!r}"
                )
    return out


def setting_option(fld: str) -> Parameter:
    """The :class:`Option` of an algorithm setting: its first card's parameter,
    with the meanings of 0 of every card that reads it (``clients-per-round``:
    all clients for some presets, a computed ``K`` for others)."""
    users = setting_parameters()[fld]
    first = users[0][1]
    zeros: dict[str, list[str]] = {}
    for c, p in users:
        if p.zero:
            zeros.setdefault(p.zero, []).append(c.name)
    if len(zeros) > 1:
        joined = "; ".join(f"0 = {z} for {', '.join(names)}" for z, names in zeros.items())
        return dataclasses.replace(first, zero="", help=f"{first.help} ({joined})")
    return first
