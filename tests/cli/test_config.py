"""The Flower App's run config and the Settings dataclass stay in step."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from mmfl_flwr.config import Settings
from mmfl_flwr.presets import PRESETS

ROOT = Path(__file__).resolve().parents[2]


def app_config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["flwr"]["app"]["config"]


def test_every_setting_is_a_run_config_key_with_the_same_default() -> None:
    cfg = app_config()
    assert set(cfg) == set(Settings().to_run_config())
    assert Settings.from_run_config(cfg) == Settings()


def test_every_preset_is_documented_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for name in PRESETS:
        assert f"`{name}`" in readme, name


def test_every_run_config_key_is_documented() -> None:
    """Every run-config key of the app is a row of the generated run-config page
    (docs/reference/run-config.md, which replaced the README's hand-kept table in
    issue 57); the tracking keys (issue 59) are also explained in docs/tracking.md."""
    import importlib.util

    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "tools/mkdocs_hooks.py")
    assert spec and spec.loader
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = hooks.run_config_page()
    tracking = (ROOT / "docs" / "tracking.md").read_text()
    for key in app_config():
        assert f"`--{key}` / `{key}` |" in page, key
        if key in TRACKING_KEYS:
            assert f"`{key}`" in tracking, key


#: Run-config keys also explained in docs/tracking.md.
TRACKING_KEYS = ("log-to", "log-dir", "log-clients-every", "no-progress", "no-report")


@pytest.mark.parametrize(
    "change",
    [
        {"strategy": "nope"},
        {"aggregator": "nope"},
        {"tasks": "digits,nope"},
        {"tasks": ""},
        {"num_clients": 0},
        {"lr": 0.0},
        {"profile": "nope"},
        {"fraction_evaluate": 1.5},
        {"stale_storage": "float8"},
        {"strategy": "ranklist-ucb", "clients_per_round": -1},
        {"task_arrivals": "nope:3"},
        {"client_arrivals": "poisson:rate=1"},
    ],
)
def test_invalid_settings_raise_a_clear_error(change: dict) -> None:
    with pytest.raises(ValueError):
        Settings(**change).validate()


def test_run_config_values_are_coerced_and_checked() -> None:
    s = Settings.from_run_config({"num-rounds": 3.0, "lr": "0.5", "unknown-key": 1})
    assert s.num_rounds == 3 and s.lr == 0.5 and s.extra == {"unknown-key": 1}
    with pytest.raises(ValueError, match="num-rounds"):
        Settings.from_run_config({"num-rounds": 2.5})


@pytest.mark.parametrize("tasks", ["digits,,synthetic", "digits,", ",digits", "digits, ,synthetic"])
def test_an_empty_task_item_is_refused_not_dropped(tasks: str) -> None:
    """Issue 62: ``--tasks digits,,synthetic`` silently trained 2 models."""
    with pytest.raises(ValueError, match="empty item") as err:
        Settings(tasks=tasks).validate()
    assert "tasks=" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "key, value",
    [
        ("local-epochs", True),  # a TOML boolean became 1 epoch
        ("num-rounds", False),
        ("lr", True),
        ("overwrite", "yes"),  # neither true nor false: was silently false
        ("overwrite", 2),
        ("download", "on"),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused_not_coerced(key: str, value: object) -> None:
    """Issue 62: ``local-epochs = true`` in a --config TOML became 1."""
    with pytest.raises(ValueError, match=f"{key} must be .*; got {value!r}") as err:
        Settings.from_run_config({key: value})
    assert "\n" not in str(err.value)


def test_booleans_are_read_from_their_usual_spellings() -> None:
    for value, expected in ((True, True), ("true", True), ("False", False), (1, True), (0, False)):
        assert Settings.from_run_config({"overwrite": value}).overwrite is expected
