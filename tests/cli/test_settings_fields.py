"""Settings declares the algorithm cards' settings as plain fields (so editors and type
checkers see them); the check at import keeps those fields equal to the cards."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from mmfl_flwr import config
from mmfl_flwr.config import Settings, setting_parameters


def test_every_card_setting_is_a_typed_field_with_the_cards_default():
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    hints = typing.get_type_hints(Settings)
    for name, users in setting_parameters().items():
        param = users[0][1]
        assert name in fields, name
        assert hints[name] is param.type, name
        assert fields[name].default == param.default, name


def _copy_of_settings(drop: str | None = None, **changed):
    """A class with Settings' annotations and defaults, one field dropped or changed."""
    notes, attrs = {}, {}
    for f in dataclasses.fields(Settings):
        if f.name == drop:
            continue
        notes[f.name] = f.type
        if f.default is not dataclasses.MISSING:
            attrs[f.name] = changed.get(f.name, f.default)
        else:
            attrs[f.name] = f
    attrs["__annotations__"] = notes
    return type("Copy", (), attrs)


def test_the_copy_itself_passes_the_check():
    config._with_algorithm_settings(_copy_of_settings())


def test_a_card_setting_missing_from_settings_is_refused_at_import():
    with pytest.raises(TypeError, match="stale_beta"):
        config._with_algorithm_settings(_copy_of_settings(drop="stale_beta"))


@pytest.mark.parametrize(
    ("name", "value"), [("stale_beta", 0.5), ("ucb_init", "zero"), ("candidates", 0.0)]
)
def test_a_default_or_type_unlike_the_cards_is_refused(name, value):
    with pytest.raises(TypeError, match=name):
        config._with_algorithm_settings(_copy_of_settings(**{name: value}))
