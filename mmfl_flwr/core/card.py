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
import math
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmfl_flwr.core.aggregators import (
    Aggregator,
    FedAvgAggregator,
    MeanAggregator,
    UnbiasedAggregator,
)
from mmfl_flwr.core.pairing import check_pairing
from mmfl_flwr.core.robust import (
    CenteredClipAggregator,
    MedianAggregator,
    TrimmedMeanAggregator,
    UnbiasedCenteredClipAggregator,
)

if TYPE_CHECKING:
    from mmfl_flwr.core.policy import Policy

#: Aggregator name (``aggregator=`` of a preset, ``--aggregator``) -> factory.
AGGREGATORS: dict[str, Callable[[], Aggregator]] = {
    "fedavg": FedAvgAggregator,
    "unbiased": UnbiasedAggregator,
    "mean": MeanAggregator,
    "median": MedianAggregator,
    "trimmed-mean": TrimmedMeanAggregator,
    "centered-clip": CenteredClipAggregator,
    "unbiased-centered-clip": UnbiasedCenteredClipAggregator,
}


def _number(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Option:
    """What one setting does and which values it allows.

    The one source of ``mmfl run --help`` and of the choice and range checks of
    ``Settings.validate``. A setting has ``choices``, a numeric range (``low`` /
    ``high``), or a free form described by ``form`` (checked by its own parser).

    Attributes
    ----------
    help : str
        What the setting does (one sentence, no final period).
    choices : callable, optional
        The allowed values (read when needed: the registries they come from,
        e.g. user tasks, may grow).
    listed : bool
        With ``choices``: a comma-separated list of them (``tasks``).
    empty : str
        With ``choices``: what ``""`` means where it is allowed (``aggregator``).
    low, high : float or str, optional
        Bounds of a numeric range; ``high`` may name another setting
        (``"num_clients"``).
    low_open, high_open : bool
        Whether the bound itself is excluded.
    finite : bool
        Whether the value must be finite (``inf`` and ``nan`` refused).
    off : str
        0 is allowed besides the range and means this (``"off"``).
    zero : str
        What 0, inside the range, means (``"none"``).
    form : str
        Free-form settings: the accepted form.
    """

    help: str
    choices: Callable[[], Sequence[str]] | None = None
    listed: bool = False
    empty: str = ""
    low: float | None = None
    high: float | str | None = None
    low_open: bool = False
    high_open: bool = False
    finite: bool = False
    off: str = ""
    zero: str = ""
    form: str = ""

    def _bound(self, value: float | str | None) -> str:
        return value.replace("_", "-") if isinstance(value, str) else _number(float(value or 0))

    def allowed(self) -> str:
        """The allowed values, as ``mmfl run --help`` and the errors state them."""
        if self.choices is not None:
            names = ", ".join(self.choices())
            if self.listed:
                return f"comma-separated, each one of {names}"
            if self.empty:
                return f'"" ({self.empty}) or one of {names}'
            return f"one of {names}"
        if self.low is None and self.high is None:
            return self.form
        if self.low is not None and self.high is not None:
            text = (
                f"in {'(' if self.low_open else '['}{self._bound(self.low)}, "
                f"{self._bound(self.high)}{')' if self.high_open else ']'}"
            )
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {self._bound(self.low)}"
        else:
            text = f"{'<' if self.high_open else '<='} {self._bound(self.high)}"
        if self.finite:
            text = f"a finite number {text}"
        if self.off:
            text = f"0 ({self.off}) or {text}"
        if self.zero:
            text = f"{text} (0 = {self.zero})"
        return text

    def accepts(self, value: Any, settings: Any) -> bool:
        """Whether ``value`` is allowed (``settings`` give the bounds that name
        another setting). Free-form values are left to their parsers."""
        if self.choices is not None:
            if self.listed:  # no empty item: "digits,,synthetic" is a typo, not 2 models
                items = [v.strip() for v in str(value).split(",")]
                known = set(self.choices())
                return all(v in known for v in items)
            return (value == "" and bool(self.empty)) or value in self.choices()
        if self.low is None and self.high is None:
            return True
        if self.off and value == 0:
            return True
        if self.finite and not math.isfinite(value):
            return False
        if self.low is not None:
            low = float(self.low)
            if not (value > low if self.low_open else value >= low):
                return False
        if self.high is not None:
            high = float(getattr(settings, self.high) if isinstance(self.high, str) else self.high)
            if not (value < high if self.high_open else value <= high):
                return False
        return True

    def error(self, name: str, value: Any, settings: Any = None) -> str:
        """The one-line message for a ``value`` of setting ``name`` that
        :meth:`accepts` refuses (``settings`` give the bounds that name another
        setting)."""
        key = name.replace("_", "-")
        if self.choices is None:
            # the other setting's value, where it is that bound the value breaks
            named = (
                f" ({self._bound(self.high)}={getattr(settings, self.high)!r})"
                if isinstance(self.high, str)
                and settings is not None
                and dataclasses.replace(self, high=None).accepts(value, settings)
                else ""
            )
            return f"{key} must be {self.allowed()}; got {value!r}{named}"
        if self.listed:
            known = set(self.choices())
            if any(not v.strip() for v in str(value).split(",")) and str(value).strip():
                return (
                    f"{key}={value!r} has an empty item (two commas in a row, or one at "
                    f"either end); give task kinds separated by single commas, each one "
                    f"of {', '.join(self.choices())}"
                )
            unknown = [
                v.strip() for v in str(value).split(",") if v.strip() and v.strip() not in known
            ]
            return (
                f"unknown task kind(s) {unknown}; choose from "
                f"{', '.join(self.choices())} or register your own with "
                "mmfl_flwr.tasks.registry.register_task"
            )
        empty = f' (or "" for {self.empty})' if self.empty else ""
        return f"{key}={value!r} is unknown; choose from {', '.join(self.choices())}{empty}"


@dataclass(frozen=True, kw_only=True)
class Parameter(Option):
    """One parameter of an algorithm, and the setting that gives it from a run
    configuration.

    Attributes
    ----------
    name : str
        The keyword of the policy's (or, with ``to="aggregator"``, the
        aggregator's) constructor, and of the preset factory.
    type : type
        ``int``, ``float`` or ``str``: the type of the setting.
    default : object
        The setting's default (``Settings``, ``pyproject.toml``, ``mmfl run``).
    setting : str
        The :class:`~mmfl_flwr.config.Settings` field (run-config key with
        ``-``) when it is not ``name`` (``stale_beta`` for fedstale's ``beta``).
    to : str
        ``"policy"`` or ``"aggregator"``: whose constructor takes it.
    unset : object
        The setting value that means "not given": the constructor's own default
        applies (or ``auto``'s value). None when every value is passed on.
    auto : callable, optional
        ``auto(values)`` gives the value for ``unset`` from the run's other
        settings (``values``: setting -> value), e.g. the UCB presets' ``K``.
    """

    name: str
    type: type
    default: Any
    setting: str = ""
    to: str = "policy"
    unset: Any = None
    auto: Callable[[Mapping[str, Any]], Any] | None = None

    @property
    def field(self) -> str:
        """The Settings field of this parameter."""
        return self.setting or self.name

    @property
    def key(self) -> str:
        """The run-config key (``stale-beta``)."""
        return self.field.replace("_", "-")


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
                    f"{', '.join(c.name for c in cards() if not c.fixed_aggregator)})"
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
_FOUND: dict[str, AlgorithmCard] | None = None


def _discover() -> dict[str, AlgorithmCard]:
    global _FOUND
    if _FOUND is None:
        package = __name__.rpartition(".")[0]  # mmfl_flwr.core, without importing it
        found: dict[str, AlgorithmCard] = {}
        here = [str(Path(__file__).resolve().parent)]
        names = sorted(m.name for m in pkgutil.iter_modules(here))
        names.sort(key=lambda n: _ORDER.index(n) if n in _ORDER else len(_ORDER))
        for name in names:
            module = importlib.import_module(f"{package}.{name}")
            for card in getattr(module, "CARDS", ()):
                if card.name in found:
                    raise RuntimeError(f"two algorithm cards are named {card.name!r}")
                found[card.name] = card
        _FOUND = found
    return _FOUND


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
