"""Defaults that learn (issue "Native to Flower for real users", item 5).

- A budgeted preset whose ``budget-fraction`` expects fewer than
  ``MIN_UPLOADS_PER_MODEL`` uploads per model and round warns once, before the
  run, through Flower's logger, with ``m``, ``V``, the clients and the models and
  a budget-fraction that gives enough (with the default 20 clients, 3 models and
  budget-fraction 0.1, ``m = 2``: every budgeted preset ends at chance).
- The UCB presets run with ``clients-per-round`` left at 0: ``K`` defaults to
  ``min(num-clients, 5 x models)`` instead of an error.
"""

from __future__ import annotations

import logging
import re

import pytest

from mmfl_flwr.config import MIN_UPLOADS_PER_MODEL, Settings, options
from mmfl_flwr.core.random_allocation import RandomAllocation
from mmfl_flwr.core.ucb import default_ucb_clients
from mmfl_flwr.flower_app.data import budget_warning, upload_budget, warn_if_few_uploads
from mmfl_flwr.flower_app.server_app import strategy_from_settings
from mmfl_flwr.presets import UCB_PRESETS, pareto_ucb, presets_taking, ranklist_ucb

BUDGETED = presets_taking("budget_fraction")
#: the papers' budget fraction (paper 003), set explicitly: the setting's
#: default is 0 (auto)
PAPER = 0.1


class Records(logging.Handler):
    """Collects what Flower's logger emits."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def warnings(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == logging.WARNING]


@pytest.fixture
def flwr_log():
    handler = Records()
    logger = logging.getLogger("flwr")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def suggested_fraction(message: str) -> float:
    m = re.search(r"--budget-fraction (\d+(?:\.\d+)?) or more", message)
    assert m, message
    return float(m.group(1))


def test_the_threshold_is_documented():
    assert MIN_UPLOADS_PER_MODEL == 5
    assert "MIN_UPLOADS_PER_MODEL" in (Settings.__doc__ or "")
    assert f"warns below {MIN_UPLOADS_PER_MODEL} expected uploads per model" in (
        options()["budget_fraction"].help
    )


def test_budgeted_presets_are_those_whose_policy_takes_a_budget():
    """Read from the policies' constructors (not from the cards' parameters, which
    presets_taking reads), so a card that forgets its budget parameter fails here."""
    import inspect

    from mmfl_flwr.core.card import cards

    takes = [c.name for c in cards() if "budget_fraction" in inspect.signature(c.policy).parameters]
    assert takes == BUDGETED
    assert {"random", "lvr", "stalevr"} <= set(BUDGETED) and "mfa-rr" not in BUDGETED


def test_lvr_with_the_defaults_warns_once_with_the_numbers(flwr_log):
    s = Settings(strategy="lvr", budget_fraction=PAPER)
    assert (s.num_clients, s.budget_fraction, len(s.model_names)) == (20, 0.1, 3)
    message = warn_if_few_uploads(s)
    assert flwr_log.warnings() == [message]  # once, through Flower's logger, WARNING
    for text in (
        "strategy lvr",
        "budget-fraction=0.1",
        "m = 0.1 x V = 2 expected uploads per round",
        "V = 20 processors of 20 clients",
        "3 models",
        "0.67 per model",
        "fewer than 5",
        "--budget-fraction 0.75 or more",
        "run-config budget-fraction=0.75",
        "m = 15, 5 per model",
    ):
        assert text in message, (text, message)
    assert "\n" not in message


@pytest.mark.parametrize("preset", BUDGETED)
def test_every_budgeted_preset_warns_with_the_default_budget(preset, flwr_log):
    message = warn_if_few_uploads(Settings(strategy=preset, budget_fraction=PAPER))
    assert message and f"strategy {preset}:" in message
    assert len(flwr_log.warnings()) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"strategy": "lvr", "budget_fraction": 0.75},  # m = 15: 5 per model
        {"strategy": "stalevr", "budget_fraction": 1.0},
        {"strategy": "lvr", "tasks": "digits", "budget_fraction": 0.25},  # m = 5, one model
        {"strategy": "mfa-rr"},  # not budgeted
        {"strategy": "full"},
        {"strategy": "ranklist-ucb"},
    ],
)
def test_no_warning_with_enough_uploads_or_without_a_budget(change, flwr_log):
    assert warn_if_few_uploads(Settings(**change)) is None
    assert flwr_log.warnings() == []


def test_just_below_the_threshold_warns():
    message = budget_warning(Settings(strategy="lvr", budget_fraction=0.74))
    assert message and "4.9 per model" in message
    assert suggested_fraction(message) == 0.75


def test_m_is_computed_as_the_policies_compute_it():
    for kw in (
        {"budget_fraction": PAPER},
        {"profile": "paper003", "budget_fraction": PAPER},
        {"num_clients": 33, "budget_fraction": 0.2},
    ):
        s = Settings(strategy="random", **kw)
        m, v, n, models = upload_budget(s)
        assert n == s.num_clients and models == len(s.model_names)
        policy = RandomAllocation(budget_fraction=s.budget_fraction)
        assert m == pytest.approx(policy.activation_probability(v) * v)
    m, v, n, _ = upload_budget(Settings(strategy="lvr", profile="paper003", budget_fraction=PAPER))
    assert v > n  # paper003: clients with several processors; m counts them


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"profile": "paper003"},
        {"num_clients": 21, "tasks": "digits"},
        {"num_clients": 50, "tasks": "digits,synthetic,digits,synthetic"},
        {"num_clients": 120, "budget_fraction": 0.05},
    ],
)
def test_the_suggested_budget_fraction_is_the_smallest_hundredth_that_gives_enough(kw):
    s = Settings(strategy="lvr", **{"budget_fraction": PAPER, **kw})
    _, v, _, models = upload_budget(s)
    message = budget_warning(s)
    assert message is not None
    f = suggested_fraction(message)
    assert 0 < f <= 1
    assert f * v / models >= MIN_UPLOADS_PER_MODEL - 1e-9
    assert (f - 0.01) * v / models < MIN_UPLOADS_PER_MODEL
    s.budget_fraction = f
    assert budget_warning(s) is None


def test_too_few_clients_for_any_budget_says_so():
    message = budget_warning(Settings(strategy="random", num_clients=10))
    assert message and "Even --budget-fraction 1" in message and "3.3 per model" in message
    assert "more clients" in message


# ---------------------------------------------------------------- UCB default K


@pytest.mark.parametrize("preset", UCB_PRESETS)
def test_ucb_presets_build_with_k_unset_and_use_the_documented_default(preset):
    s = Settings(strategy=preset)
    assert s.clients_per_round == 0
    s.validate()  # used to raise "needs clients-per-round (K) > 0"
    assert strategy_from_settings(s).policy.clients_per_round == 15  # min(20, 5 x 3)
    assert default_ucb_clients(20, 3) == 15


@pytest.mark.parametrize("preset", UCB_PRESETS)
@pytest.mark.parametrize(
    "kw, k",
    [
        ({"num_clients": 8}, 8),  # min(8, 15)
        ({"num_clients": 200, "tasks": "synthetic,synthetic-b"}, 10),  # paper 004's large K
        ({"num_clients": 1, "tasks": "synthetic"}, 1),
        ({"clients_per_round": 3}, 3),  # a given K is kept
    ],
)
def test_ucb_k_follows_the_clients_and_models(preset, kw, k):
    s = Settings(strategy=preset, **kw)
    s.validate()
    assert strategy_from_settings(s).policy.clients_per_round == k


def test_the_python_presets_keep_their_own_k():
    assert ranklist_ucb().policy.clients_per_round == 2
    assert pareto_ucb(clients_per_round=4).policy.clients_per_round == 4


def test_the_ucb_default_is_documented():
    doc = Settings.__doc__ or ""
    assert "min(num_clients, MIN_UPLOADS_PER_MODEL x" in " ".join(doc.split())
    assert "default_ucb_clients" in doc
    assert "min(num-clients, 5 x number of models)" in options()["clients_per_round"].help


def test_mfa_presets_keep_all_clients_for_k_zero():
    for preset in ("mfa-rand", "mfa-rr", "multi-fedavg"):
        s = Settings(strategy=preset)
        assert strategy_from_settings(s).policy.clients_per_round is None  # all clients


def test_a_run_warns_once_before_its_first_round(flwr_log):
    """Through the ServerApp (``server_main``, both engines): needs the call
    ``warn_if_few_uploads(s)`` in mmfl_flwr/flower_app/server_app.py."""
    from mmfl_flwr.runner import run

    run(
        Settings(
            strategy="lvr", num_rounds=1, local_epochs=1, output_dir="", budget_fraction=PAPER
        ),
        engine="inprocess",
    )
    (message,) = [w for w in flwr_log.warnings() if "budget-fraction" in w]
    assert "m = 0.1 x V = 2 expected uploads per round" in message


def test_the_default_budget_is_auto_and_gives_enough_uploads(flwr_log):
    """``budget-fraction`` 0 (the default) resolves to the smallest hundredth with
    5 expected uploads per model: 20 clients with one processor each (V = 20)
    and 3 models need m = 15, so 0.75; no warning; the strategy built from the
    settings samples with that fraction."""
    from mmfl_flwr.flower_app.data import auto_budget_fraction, resolved_budget
    from mmfl_flwr.flower_app.server_app import strategy_from_settings

    s = Settings(strategy="lvr")
    assert s.budget_fraction == 0
    assert auto_budget_fraction(s) == 0.75
    assert resolved_budget(s).budget_fraction == 0.75
    assert warn_if_few_uploads(s) is None and flwr_log.warnings() == []
    assert strategy_from_settings(s).policy.budget_fraction == 0.75
    # one model of 20 clients: m = 5 needs 0.25; an explicit value is kept
    assert auto_budget_fraction(Settings(strategy="lvr", tasks="digits")) == 0.25
    assert resolved_budget(Settings(strategy="lvr", budget_fraction=0.3)).budget_fraction == 0.3
    # presets without a budget are left alone
    assert resolved_budget(Settings(strategy="mfa-rr")).budget_fraction == 0
