"""What one hostile client costs, per attack, with the default bounds (issue 12).

Each attack of :mod:`mmfl_flwr.testing.hostile` runs through the public API
(the app's ClientApp on :class:`~mmfl_flwr.grid.InProcessGrid`, real torch
training on the embedded tasks) against the honest run of the same seed and
settings; the test asserts

- the bound that answers the attack logs a line naming the hostile client;
- the final mean accuracy over the models stays within :data:`MARGIN` of the
  honest run's.

The margin is what one missing client costs at this scale (an attack the
bounds answer by rejecting the client's part leaves the federation one client
short): 12 clients, 8 rounds, 5 local epochs, two models (digits CNN and
Synthetic(1,1) logistic regression). Without the bounds the same attacks ruin
the models (``tests/strategy/test_hostile.py`` shows it at unit scale;
docs/explanation/defences.md's attack tables at this one).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from conftest import LogTap

from mmfl_flwr.config import Settings
from mmfl_flwr.runner import run_inprocess
from mmfl_flwr.strategy.registration import token_pin
from mmfl_flwr.testing import hostile as H

#: Largest accepted drop of the final mean accuracy against the honest run.
MARGIN = 0.05
HOSTILE = "3"
BASE = dict(
    tasks="digits,synthetic", num_clients=12, num_rounds=8, local_epochs=5, output_dir="", seed=0
)
PRESET_KW: dict[str, dict[str, Any]] = {
    "mfa-rr": {},
    "full": {},
    "lvr": {"budget_fraction": 0.3},
    "ranklist-ucb": {"clients_per_round": 4},
}
#: every log line of the latest run()
LAST_LOG: list[str] = []
_honest: dict[tuple[str, tuple[tuple[str, Any], ...]], float] = {}


def final_accuracy(result) -> float:
    last = max(r["round"] for r in result.history)
    accs = [r["accuracy"] for r in result.history if r["round"] == last]
    assert accs and all(math.isfinite(a) for a in accs)
    return sum(accs) / len(accs)


def run(preset: str, attack=None, **extra: Any):
    s = Settings(strategy=preset, **BASE, **PRESET_KW[preset], **extra)
    with LogTap.on_flwr() as tap:
        result = run_inprocess(s, wrap_client_app=attack)
    LAST_LOG[:] = [m for _, m in tap.records]
    # the lines naming what the server did: WARNING, and each bound's action at DEBUG
    return result, [m for lvl, m in tap.records if lvl == logging.DEBUG or lvl >= logging.WARNING]


def honest_accuracy(preset: str, **extra: Any) -> float:
    key = (preset, tuple(sorted(extra.items())))
    if key not in _honest:
        _honest[key] = final_accuracy(run(preset, **extra)[0])
    return _honest[key]


def naming(warnings: list[str], who: str, *words: str) -> list[str]:
    return [m for m in warnings if m.startswith(f"Client {who}") and all(w in m for w in words)]


def crashes_in_training(who: str) -> H.Attack:
    """``who``'s ClientApp raises on every train message: the same federation
    with that client's updates missing."""

    def wrap(app):
        def call(msg, ctx):
            if H._is(ctx, who) and msg.metadata.message_type == "train":
                raise RuntimeError("client left out")
            return app(msg, ctx)

        return call

    return wrap


def outcome(result) -> list[tuple[Any, ...]]:
    return [
        (r["round"], r["task"], r["accuracy"], r["loss"], r["uploads"], r["rejected"])
        for r in result.history
    ]


#: Attacks the bounds answer by rejecting every part the client trains: nothing
#: of them may reach a model, so the run equals the one where the client's
#: training fails. (A replaying client's first reply is genuine and counts.)
REJECTED = {"huge-weights", "scaled-x1000", "scaled-x-1000", "count-train"}

CASES = [
    # (id, preset, attack, settings, words of the log line naming the client)
    (
        "huge-weights",
        "mfa-rr",
        H.huge_weights(HOSTILE, 1e30),
        {},
        ("rejected update", "update norm"),
    ),
    (
        "scaled-x1000",
        "mfa-rr",
        H.scaled_update(HOSTILE, 1000.0),
        {},
        ("rejected update", "update norm"),
    ),
    (
        "scaled-x-1000",
        "full",
        H.scaled_update(HOSTILE, -1000.0),
        {},
        ("rejected update", "update norm"),
    ),
    (
        "count-train",
        "mfa-rr",
        H.inflated_count(HOSTILE, 10**6, at_registration=False),
        {},
        ("rejected update", "exceeds"),
    ),
    ("replay", "full", H.replay(HOSTILE), {}, ("answers round",)),
    ("lying-loss-lvr", "lvr", H.lying_loss(HOSTILE, 1e5), {}, ("loss", "capped")),
    ("lying-loss-ucb", "ranklist-ucb", H.lying_loss(HOSTILE, 1e5), {}, ("training loss", "capped")),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_attack_costs_at_most_the_margin(case):
    _, preset, attack, extra, words = case
    result, warnings = run(preset, attack, **extra)
    assert naming(warnings, HOSTILE, *words), "no log line names the hostile client"
    honest = honest_accuracy(preset, **extra)
    attacked = final_accuracy(result)
    print(f"\n[attack] {case[0]} ({preset}): honest {honest:.3f} attacked {attacked:.3f}")
    assert attacked >= honest - MARGIN, (honest, attacked)
    if case[0] in REJECTED:
        absent, _ = run(preset, crashes_in_training(HOSTILE), **extra)
        assert outcome(result) == outcome(absent)


@pytest.mark.slow
def test_inflated_registration_count_is_capped_and_the_median_ignores_it():
    """A client claiming 1e8 examples at registration is used up to ``count-cap``
    (200) x the task's median count, logged with its id. The default must
    admit honest skew (Synthetic(1,1)'s users reach 56x the median), so under
    the sample-weighted FedAvg rule the liar still buys most of the weight
    (its update is honest, so the cost is one client's data dominating; the
    docs/explanation/defences.md's attack tables measures it). The coordinate-wise median does
    not weigh by counts: there the attack costs at most the margin against the
    honest run with the same aggregator."""
    result, warnings = run("mfa-rr", H.inflated_count(HOSTILE, 10**8))
    capped = naming(warnings, HOSTILE, "declared 100000000 examples", "are used")
    assert capped and all("(200 x the median count)" in m for m in capped)
    result, warnings = run("mfa-rr", H.inflated_count(HOSTILE, 10**8), aggregator="median")
    assert naming(warnings, HOSTILE, "declared 100000000 examples", "are used")
    honest = honest_accuracy("mfa-rr", aggregator="median")
    attacked = final_accuracy(result)
    print(
        f"\n[attack] count-registration (mfa-rr, median): honest {honest:.3f} "
        f"attacked {attacked:.3f}"
    )
    assert attacked >= honest - MARGIN


@pytest.mark.slow
def test_squatter_is_refused_when_the_id_is_pinned():
    """Client 3 is late (its first info query fails); node 1 claims id 3 in
    round 1. Without a pin the squatter holds the id and the real client 3 is
    refused every round after (the rule: the first live claim holds). With
    client 3's id pinned to its token the squatter is refused every round
    (logged with the claimed id) and the real client 3 trains from round 2; the
    federation loses only the squatter's own data."""
    secret = "client-3-secret"

    def opening():
        return H.chain(H.impersonate("1", HOSTILE), H.late_registration(HOSTILE))

    squatted, warnings = run("mfa-rr", opening())
    assert [m for m in warnings if f"Client id {HOSTILE} is claimed by nodes" in m]
    for rnd in range(1, BASE["num_rounds"] + 1):  # "3" trains, but it is node 1
        assert HOSTILE in {cid for cid, _, _ in squatted.assignments[rnd]}

    result, warnings = run(
        "mfa-rr",
        H.chain(opening(), H.with_token(HOSTILE, secret)),
        client_pins=f"{HOSTILE}={token_pin(secret)}",
    )
    refused = [
        m
        for m in warnings
        if f"claims client id {HOSTILE} with" in m and m.endswith("refused (the id is pinned)")
    ]
    assert len(refused) == BASE["num_rounds"]  # asked again at the start of every round
    registered = [m for m in LAST_LOG if "identity proved by its token" in m]
    # client 3 registers in round 2; MFA-RR lets a client that comes online
    # mid-frame (2 models: frames of 2 rounds) wait for the next frame
    assert HOSTILE not in {cid for cid, _, _ in result.assignments[1]}
    assert any(f"Client {HOSTILE} registered" in m for m in registered)
    for rnd in range(3, BASE["num_rounds"] + 1):
        assert HOSTILE in {cid for cid, _, _ in result.assignments[rnd]}
    assert [r for r in result.history if r["round"] > 0 and r["rejected"]] == []
    honest = honest_accuracy("mfa-rr")
    assert final_accuracy(result) >= honest - MARGIN
