"""Quiet honest runs (issue 57 item 5): every action of the bounds is a
defence event (``events.csv``, ``summary.json``'s ``defence_events``, the
progress line), logged on its own at DEBUG (INFO with ``--verbose``);
WARNING is kept for what a user should act on, once per client and kind, with
a count at the end of the run.

The main job (``mmfl run``'s defaults, on the in-process engine) prints no
WARNING and ends with the final accuracies it had before the events existed
(the bounds act as before: the 19 actions that were 19 WARNING lines are 19
events); a client sending its update x50 or reversed is named at WARNING.
"""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from conftest import LogTap

from mmfl_flwr import runner
from mmfl_flwr.config import Settings
from mmfl_flwr.core.aggregators import Update
from mmfl_flwr.results import read_events_csv
from mmfl_flwr.runner import run_inprocess
from mmfl_flwr.strategy import events as E
from mmfl_flwr.strategy.events import DefenceEvent, DefenceLog, summary_counts
from mmfl_flwr.strategy.validation import bound_update_norms
from mmfl_flwr.testing import hostile as H
from mmfl_flwr.tracking.progress import line_printer

#: The main job's final accuracies (``mmfl run --engine inprocess``, default
#: settings, seed 0) measured before the defence events existed (commit 9af7cf8,
#: when its bounds touched 19 of its 400 honest updates: 16 by the reversed-update
#: bound, 3 by the norm clip), and its bounds' actions since a reversed update
#: must point against the others by more than a cosine of 0.1 (issue 60: its
#: honest Synthetic(1,1) clients score -0.02 to -0.09): two norm clips.
MAIN_JOB_FINAL = {"digits": 0.8306, "synthetic": 0.8576, "digits_2": 0.7694}
MAIN_JOB_ACTIONS = {"clipped": 2}
#: How far a final accuracy may end from :data:`MAIN_JOB_FINAL` on another machine:
#: the values above were measured on AMD EPYC machines; on an Intel Xeon (the same
#: code, torch 2.13.0 CPU build and packages) float32 rounding differs, training
#: drifts over the 20 rounds, and digits_2 ends at 0.775 (two of its 360 test
#: images), the other two models equal, the bounds' actions the same. A change of
#: behaviour shows in the actions, compared exactly, and in the seven reference
#: runs (tests/strategy/test_reference_runs.py), whose accuracies are exact.
MAIN_JOB_MACHINE_SPREAD = 0.01


def ev(rnd, cid, task="a", kind="clipped", value=2.0, bound=1.0):
    return DefenceEvent(rnd, cid, task, kind, value, bound, "r")


def update(cid, scale):
    return Update(
        cid=cid,
        delta=[np.full(4, float(scale))],
        num_examples=10,
        data_share=0.25,
        processors=1,
        prob=1.0,
        count=1,
    )


def test_a_clip_is_an_event_with_its_value_and_bound_and_a_debug_line():
    log = DefenceLog()
    log.round = 2
    updates = {"a": [update("c1", 1), update("c2", 1), update("c3", 10)]}
    with LogTap.on_flwr() as tap:
        bound_update_norms(updates, {}, 100.0, None, 3.0, log)
    (e,) = log.events
    assert (e.round, e.client, e.task, e.kind) == (2, "c3", "a", "clipped")
    assert e.value == pytest.approx(20.0) and e.bound == pytest.approx(6.0)
    assert e.factor == pytest.approx(20 / 6)
    assert e.reason.startswith("clipped update for task 'a': update norm 20 exceeds 6 ")
    assert [(lvl, m) for lvl, m in tap.records] == [(logging.DEBUG, f"Client c3: {e.reason}")]
    assert tap.warnings() == []


def test_a_client_scaled_hard_again_and_again_is_one_warning_and_a_count_at_the_end():
    log = DefenceLog()
    with LogTap.on_flwr() as tap:
        for rnd in range(1, 6):
            log.round = rnd
            log.events.append(ev(rnd, "7", task="ab"[rnd % 2], value=50.0, bound=3.0))
            log.events.append(ev(rnd, "8", value=5.0, bound=3.0))  # a small scaling
            log.end_round(rnd, [])
        log.finish()
    warned = tap.warnings()
    assert len(warned) == 2
    assert warned[0].startswith(
        "Client 7: its updates were scaled down by more than 10x in 3 rounds (models a, b;"
    )
    assert (
        warned[1] == "Client 7: its updates were scaled down by more than 10x: 5 rounds in this run"
    )
    assert not any("Client 8" in m for m in warned)


def test_rejected_and_direction_again_and_again_are_named_once_per_client_and_kind():
    log = DefenceLog()
    with LogTap.on_flwr() as tap:
        for rnd in range(1, 5):
            log.events.append(ev(rnd, "3", kind="rejected", value=500.0, bound=100.0))
            log.events.append(ev(rnd, "4", kind="direction", value=1.5, bound=1.0))
            log.events.append(ev(rnd, "5", kind="reversed", value=1.5, bound=1.0))
            if rnd < 3:
                log.events.append(ev(rnd, "6", kind="rejected", value=500.0, bound=100.0))
            log.end_round(rnd, [])
    said = tap.warnings()
    assert len(said) == 2
    assert said[0].startswith("Client 3: its updates were rejected in 3 rounds")
    assert said[1].startswith("Client 4: its updates point against the other clients'")


def test_a_bound_acting_on_most_of_a_rounds_updates_is_named_once():
    log = DefenceLog()
    rows = [{"task": "a", "uploads": 4, "rejected": 0, "accuracy": 0.5}]
    with LogTap.on_flwr() as tap:
        for rnd in (1, 2):
            log.events += [ev(rnd, c) for c in ("1", "2", "3")]
            log.end_round(rnd, rows)
    (said,) = tap.warnings()
    assert said.startswith(
        "Model 'a': the norm clip (update_clip_factor) acted on 3 of the 4 updates of round 1"
    )


def test_a_model_stalled_while_the_bounds_act_is_named():
    log = DefenceLog()
    with LogTap.on_flwr() as tap:
        for rnd in range(1, 9):
            acc = 0.6 if rnd == 1 else 0.5
            log.events += [ev(rnd, "1", kind="reversed"), ev(rnd, "2", kind="reversed")]
            log.end_round(rnd, [{"task": "a", "uploads": 3, "rejected": 0, "accuracy": acc}])
    (said,) = tap.warnings()
    assert said.startswith("Model 'a': no better accuracy than 0.6000 (round 1) for 5 rounds")


def test_summary_counts_per_kind_model_and_client_with_fractions():
    events = [ev(1, "1"), ev(1, "2", "b", "reversed"), ev(2, "1", "b", "rejected")]
    received = {"a": {"1": 2, "2": 2}, "b": {"1": 2, "2": 2}}
    got = summary_counts(events, received)
    assert got["count"] == 3 and got["updates_received"] == 8 and got["fraction"] == 3 / 8
    assert got["by_kind"]["clipped"] == {"count": 1, "updates_received": 8, "fraction": 1 / 8}
    assert got["by_model"]["b"]["by_kind"] == {"rejected": 1, "reversed": 1}
    assert got["by_model"]["b"]["fraction"] == 2 / 4
    assert got["by_client"]["1"]["count"] == 2 and got["by_client"]["1"]["fraction"] == 2 / 4
    assert summary_counts([], {})["fraction"] is None


def test_an_update_two_bounds_acted_on_is_touched_once():
    """Clipped and then scaled as reversed: two events, one touched update; a loss
    cap acts on a report, not on an update."""
    events = [
        ev(1, "1"),
        ev(1, "1", kind="reversed"),
        ev(1, "2", "b", "rejected"),
        ev(2, "1"),
        ev(2, "3", kind="loss"),
    ]
    received = {"a": {"1": 2, "2": 2, "3": 2}, "b": {"2": 2}}
    got = summary_counts(events, received)["updates_touched"]
    assert got == {"count": 3, "updates_received": 8, "fraction": 3 / 8}
    assert E.touched_updates(events) == {(1, "1", "a"), (1, "2", "b"), (2, "1", "a")}


def test_the_progress_line_shows_the_rounds_counts(capsys):
    show = line_printer(3, lambda rnd: E.round_counts([ev(rnd, "1"), ev(rnd, "2", kind="loss")]))
    show(1, [{"task": "a", "accuracy": 0.5, "uploads": 2}])
    out = capsys.readouterr().out
    assert "| uploads 2 | clipped 1, rejected 0, loss 1 | elapsed" in out


def events_agree_with_summary(out):
    events = read_events_csv(out / "events.csv")
    counted = json.loads((out / "summary.json").read_text())["defence_events"]
    assert counted["count"] == len(events)
    for kind, part in counted["by_kind"].items():
        assert part["count"] == sum(e.kind == kind for e in events)
    for task, part in counted["by_model"].items():
        assert part["count"] == sum(e.task == task for e in events)
    for cid, part in counted["by_client"].items():
        assert part["count"] == sum(e.client == cid for e in events)
    assert sum(p["count"] for p in counted["by_client"].values()) == len(events)
    assert counted["updates_touched"]["count"] == len(E.touched_updates(events))
    return events, counted


@pytest.mark.slow
def test_the_main_job_is_quiet_and_ends_as_before(tmp_path):
    out = tmp_path / "run"
    with LogTap.on_flwr() as tap:
        result = runner.run(Settings(output_dir=str(out)), engine="inprocess")
    assert tap.warnings() == []
    final = {t: round(r["accuracy"], 4) for t, r in result.final().items()}
    assert final.keys() == MAIN_JOB_FINAL.keys()
    assert all(abs(final[t] - v) <= MAIN_JOB_MACHINE_SPREAD for t, v in MAIN_JOB_FINAL.items())
    events, counted = events_agree_with_summary(out)
    kinds = {k: p["count"] for k, p in counted["by_kind"].items()}
    assert kinds == MAIN_JOB_ACTIONS  # the bounds acted as before; only the level changed
    assert counted["updates_received"] == 400  # 20 rounds x 20 clients
    assert [(e.round, e.client, e.kind) for e in events] == [
        (e.round, e.client, e.kind) for e in result.events
    ]


def test_the_main_job_settings_touch_no_honest_update_over_its_first_rounds(tmp_path):
    """The fast check of the above: over the main job's first 5 rounds (100
    honest updates) no bound acts (the reversed-update bound held 5 of them
    before a reversed update had to point against the others by more than a
    cosine of 0.1), nothing is printed at WARNING, and events.csv and
    summary.json agree."""
    out = tmp_path / "run"
    with LogTap.on_flwr() as tap:
        runner.run(Settings(num_rounds=5, output_dir=str(out)), engine="inprocess")
    assert tap.warnings() == []
    events, counted = events_agree_with_summary(out)
    assert events == [] and counted["updates_touched"]["count"] == 0
    assert counted["updates_received"] == 100


@pytest.mark.parametrize(
    "factor, rounds, named",
    [
        (50.0, 5, "its updates were scaled down by more than 10x"),
        (-1.0, 12, "its updates point against"),
    ],
    ids=["x50", "reversed"],
)
def test_a_hostile_client_is_named_on_the_console(factor, rounds, named):
    with LogTap.on_flwr() as tap:
        result = run_inprocess(
            Settings(num_rounds=rounds, output_dir=""),
            wrap_client_app=H.scaled_update("3", factor),
        )
    said = tap.warnings()
    assert any(m.startswith(f"Client 3: {named}") for m in said), said
    assert all(m.startswith("Client 3:") for m in said), said  # no honest client named
    assert not math.isnan(result.final()["digits"]["accuracy"])


def test_verbose_shows_every_action_at_info_and_a_plain_run_keeps_them_at_debug(tmp_path):
    import os

    from mmfl_flwr.flower_app.server_app import VERBOSE_ENV

    kw = dict(tasks="digits,synthetic", num_clients=6, num_rounds=2, update_clip_factor=1.0)
    levels = {}
    for verbose in (True, False):
        with LogTap.on_flwr() as tap:
            result = runner.run(
                Settings(**kw, output_dir=str(tmp_path / str(verbose))),
                engine="inprocess",
                verbose=verbose,
            )
        assert result.events  # update_clip_factor=1 clips every update above the median
        lines = E.action_lines(result.events)
        levels[verbose] = {lvl for lvl, m in tap.records if m in lines}
        assert os.environ.get(VERBOSE_ENV) is None  # restored
    assert levels[True] == {logging.INFO}  # shown on the console with --verbose
    assert levels[False] == set()  # below runner.run's console level (DEBUG, not created)


def test_a_count_or_loss_capped_far_beyond_its_bound_names_the_client():
    log = DefenceLog()
    with LogTap.on_flwr() as tap:
        log.events.append(ev(1, "9", kind="count", value=10**8, bound=2000))
        log.events.append(ev(1, "8", kind="count", value=3000, bound=2000))  # 1.5x: quiet
        log.end_round(1, [])
        for rnd in (2, 3, 4):
            log.events.append(ev(rnd, "7", kind="loss", value=1e5, bound=20.0))
            log.end_round(rnd, [])
    said = tap.warnings()
    assert len(said) == 2
    assert said[0].startswith("Client 9: its declared sample count was capped by more than 10x")
    assert said[1].startswith("Client 7: its reported losses were capped by more than 10x in 3")
