"""The atoms of the option table: :class:`Option` (what one setting does and which
values it allows) and :class:`Parameter` (an algorithm's parameter, an Option that
also names the constructor keyword it feeds).

Their own module so that policies, aggregators and the cards can all import them
without importing one another. :mod:`mmfl_flwr.core.card` re-exports both.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


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
