"""The Python API accepts no more than the CLI (issue 62, item 4).

Every setting of the option table (:func:`mmfl_flwr.config.options`, the one
``mmfl run --help`` is written from) is tried just outside each of its bounds,
with a fraction for a whole-number setting, and with a value of the wrong type,
on every surface that takes it: ``mmfl run`` (its flags), a ``--config`` TOML
(``Settings.from_run_config``), ``Settings.validate``, the preset factories
(``lvr(...)``, ``mfa_rand(...)``: their parameters and the strategy keywords),
``MultiModelStrategy`` and ``MultiModelStrategy.start``. Each surface must
refuse it with the same one-line message.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

import mmfl_flwr
from mmfl_flwr.cli import build_parser, settings_from_args
from mmfl_flwr.config import BOUNDS, Settings, options
from mmfl_flwr.core.card import setting_parameters
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.records import numpy_to_arrays
from mmfl_flwr.strategy import MultiModelStrategy

#: MultiModelStrategy keywords (and every factory's) that are settings
STRATEGY_KEYWORDS = (
    "local_epochs",
    "lr",
    "batch_size",
    "seed",
    "fraction_evaluate",
    *BOUNDS,
)
#: MultiModelStrategy.start keywords that are settings
START_KEYWORDS = ("num_rounds", "timeout")

FIELD_TYPES = {f.name: type(getattr(Settings(), f.name)) for f in dataclasses.fields(Settings)}
BASE_NUM_CLIENTS = 20


def _card_of(name: str):
    users = setting_parameters().get(name)
    return users[0] if users else (None, None)


def bad_values(name: str) -> list[tuple[Any, bool]]:
    """(value, whether the bound it breaks names another setting) just outside
    each bound of setting ``name``, a fraction for a whole number, and values of
    the wrong type."""
    opt = options()[name]
    typ = FIELD_TYPES[name]
    step = 1 if typ is int else 0.25
    out: list[tuple[Any, bool]] = []
    if opt.low is not None:
        below = float(opt.low) if opt.low_open else float(opt.low) - step
        if opt.off and below == 0:  # 0 means off: the value below the off
            below = -step
        out.append((int(below) if typ is int else below, False))
    if isinstance(opt.high, str):
        out.append((BASE_NUM_CLIENTS + 1, True))
    elif opt.high is not None:
        above = float(opt.high) if opt.high_open else float(opt.high) + step
        out.append((int(above) if typ is int else above, False))
    if opt.finite:
        out += [(math.inf, False), (math.nan, False)]
    if typ is int:
        valid = int(max(float(opt.low or 0), 1)) if opt.low is not None else 1
        out += [(valid + 0.5, False), (True, False), (str(valid), False)]
    elif typ is float:
        out += [(True, False), ("0.5", False)]
    return out


NUMERIC = [
    name
    for name, opt in options().items()
    if FIELD_TYPES[name] in (int, float) and (opt.low is not None or opt.high is not None)
]
CASES = [(name, value, named) for name in NUMERIC for value, named in bad_values(name)]


def _base(name: str) -> dict[str, Any]:
    card, _ = _card_of(name)
    base: dict[str, Any] = {"num_clients": BASE_NUM_CLIENTS}
    if card is not None:
        base["strategy"] = card.name
    if name.startswith("dp") and name != "dp_sampled_clients":
        base.update(dp="server-fixed", dp_sampled_clients=2)
    return base


def settings_message(name: str, value: Any) -> str:
    with pytest.raises(ValueError) as err:
        Settings(**{**_base(name), name: value}).validate()
    return str(err.value)


def run_config_message(name: str, value: Any) -> str | None:
    """A --config TOML holds numbers, booleans and text; text is read as the
    setting's type (``batch-size = "16"`` is 16), so text is no error there."""
    if isinstance(value, str):
        return None
    base = {k.replace("_", "-"): v for k, v in _base(name).items() if k != name}
    with pytest.raises(ValueError) as err:
        Settings.from_run_config({**base, name.replace("_", "-"): value})
    return str(err.value)


def cli_message(name: str, value: Any, capsys) -> str | None:
    """The command line holds text only: a Python bool or str is not a value it
    can give."""
    if isinstance(value, (bool, str)):
        return None
    argv = ["run"]
    for k, v in _base(name).items():
        if k != name:
            argv += ["--" + k.replace("_", "-"), str(v)]
    argv += ["--" + name.replace("_", "-"), str(value)]
    with pytest.raises((ValueError, SystemExit)) as err:
        settings_from_args(build_parser().parse_args(argv))
    if isinstance(err.value, SystemExit):  # argparse refused the text
        assert err.value.code == 2
        return capsys.readouterr().err.strip()
    return str(err.value)


def _grid_and_arrays():
    arrays = {"a": numpy_to_arrays({"w": np.zeros(2, np.float32)})}
    return InProcessGrid(lambda msg, ctx: None, []), arrays


def python_messages(name: str, value: Any, named: bool) -> list[tuple[str, str]]:
    """(surface, message) for every Python surface that takes setting ``name``."""
    out = []
    if name in STRATEGY_KEYWORDS:
        with pytest.raises(ValueError) as err:
            MultiModelStrategy(**{name: value})
        out.append(("MultiModelStrategy", str(err.value)))
        with pytest.raises(ValueError) as err:
            mmfl_flwr.mfa_rand(**{name: value})
        out.append(("mfa_rand", str(err.value)))
    if name in START_KEYWORDS:
        grid, arrays = _grid_and_arrays()
        with pytest.raises(ValueError) as err:
            MultiModelStrategy().start(grid, arrays, **{name: value})
        out.append(("start", str(err.value)))
    if not named:  # a factory cannot know the run's other settings (num-clients)
        for card, param in setting_parameters().get(name, []):
            factory = getattr(mmfl_flwr, card.function)
            with pytest.raises(ValueError) as err:
                factory(**{param.name: value})
            out.append((f"{card.function}({param.name}=)", str(err.value)))
    return out


@pytest.mark.parametrize("name, value, named", CASES, ids=[f"{n}={v!r}" for n, v, _ in CASES])
def test_every_bound_is_refused_alike_on_every_surface(name, value, named, capsys):
    expected = settings_message(name, value)
    key = name.replace("_", "-")
    assert expected.startswith(f"{key} must be ") and f"got {value!r}" in expected, expected
    assert "\n" not in expected
    toml = run_config_message(name, value)
    if toml is not None:
        assert toml == expected, ("--config", toml, expected)
    cli = cli_message(name, value, capsys)
    if cli is not None:
        assert expected in cli, ("mmfl run", cli, expected)
    for surface, message in python_messages(name, value, named):
        assert message == expected, (surface, message, expected)


def test_the_table_covers_every_python_surface():
    """Every strategy and start keyword named above is a setting of the table,
    and every card parameter has a factory that takes it."""
    table = options()
    assert set(STRATEGY_KEYWORDS) | set(START_KEYWORDS) <= set(table)
    for fld, users in setting_parameters().items():
        assert fld in table
        for card, param in users:
            assert param.name in card.keywords(), (card.name, param.name)


def test_the_values_the_issue_named_are_refused_clearly():
    grid, arrays = _grid_and_arrays()
    cases = [
        (lambda: mmfl_flwr.lvr(budget_fraction=2), "budget-fraction must be in [0, 1]; got 2"),
        (lambda: mmfl_flwr.mfa_rand(seed=1.5), "seed must be a whole number"),
        (lambda: mmfl_flwr.mfa_rand(seed=-1), "seed must be >= 0; got -1"),
        (lambda: mmfl_flwr.mfa_rand(local_epochs=2.5), "local-epochs must be a whole number"),
        (lambda: mmfl_flwr.mfa_rand(batch_size="16"), "batch-size must be a whole number"),
        (
            lambda: MultiModelStrategy().start(grid, arrays, num_rounds=-1),
            "num-rounds must be >= 0; got -1",
        ),
        (lambda: MultiModelStrategy().start(grid, arrays, timeout=0), "timeout must be > 0"),
    ]
    for make, words in cases:
        with pytest.raises(ValueError) as err:
            make()
        assert words in str(err.value), (words, str(err.value))


def test_a_policy_given_by_name_is_refused_with_a_pointer_to_the_presets():
    with pytest.raises(TypeError) as err:
        MultiModelStrategy(policy="mfa")
    text = str(err.value)
    assert "policy='mfa'" in text and "make_strategy" in text and "mfa-rand" in text, text
    with pytest.raises(TypeError, match="aggregator='fedavg'"):
        MultiModelStrategy(aggregator="fedavg")


def test_an_evaluate_fn_that_returns_no_metrics_is_named():
    from mmfl_flwr.strategy import HookError

    grid, arrays = _grid_and_arrays()
    with pytest.raises(HookError) as err:
        MultiModelStrategy().start(grid, arrays, num_rounds=0, evaluate_fn=lambda r, t, a: "0.9")
    text = str(err.value)
    assert "evaluate_fn" in text and "returned str" in text and "MetricRecord" in text, text


def test_off_is_zero_in_python_as_on_the_command_line():
    """0 means off for a defence on the command line; so it does in Python
    (as None did and still does)."""
    s = MultiModelStrategy(loss_cap=0, update_clip_factor=0, max_update_norm=0)
    assert s.limits.loss_cap is None and s.limits.update_clip_factor is None
    assert s.limits.max_update_norm is None
