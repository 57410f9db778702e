"""The type aliases users import resolve: ``typing.get_type_hints`` on them (as editors,
type checkers at run time, pydantic or typer would call it) finds every name they use."""

from __future__ import annotations

import typing

import pytest

from mmfl_flwr.strategy import result


def _holder(module, **annotations):
    """A class declared in ``module`` whose annotations are ``annotations``."""
    return type("Holder", (), {"__annotations__": annotations, "__module__": module.__name__})


@pytest.mark.parametrize("alias", ["EvaluateFn", "RoundCallback"])
def test_alias_resolves_in_its_module(alias):
    hints = typing.get_type_hints(_holder(result, fn=getattr(result, alias)))
    args = typing.get_args(hints["fn"])
    assert args, hints  # a Callable[[...], R]: its parameters and return type resolved
    for arg in args:
        assert not isinstance(arg, typing.ForwardRef), arg


def test_evaluate_fn_return_type_names_metric_record_and_mapping():
    from collections.abc import Mapping

    from flwr.app import MetricRecord

    hints = typing.get_type_hints(_holder(result, fn=result.EvaluateFn))
    returned = typing.get_args(hints["fn"])[-1]
    members = typing.get_args(returned)
    assert MetricRecord in members
    assert type(None) in members
    assert Mapping[str, float] in members
