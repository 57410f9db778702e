"""Power-of-Choice client selection (Cho, Wang and Joshi 2020), per model:
candidates drawn in proportion to data size, the highest losses picked, within
the clients' processors. Expected selections are worked out by hand below."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from mmfl_flwr import runner
from mmfl_flwr.config import Settings
from mmfl_flwr.core.card import card
from mmfl_flwr.core.clients import ClientInfo, ClientTable
from mmfl_flwr.core.power_of_choice import PowerOfChoice, draw_candidates, highest_loss


def table(rows, losses, rnd=1):
    """rows: cid -> (num_examples dict, processors); losses: (cid, task) -> loss."""
    t = ClientTable()
    for cid, (n, b) in rows.items():
        t.upsert(ClientInfo(cid, dict(n), b))
    for (cid, task), value in losses.items():
        t.set_loss(cid, task, value, rnd)
    return t


# ------------------------------------------------------------------ candidates
def test_candidates_are_drawn_in_proportion_to_data_size():
    ids = ["a", "b", "c", "d"]
    n = np.array([10.0, 30.0, 0.0, 60.0])
    rng = np.random.default_rng(0)
    first = {c: 0 for c in ids}
    draws = 20000
    for _ in range(draws):
        got = draw_candidates(ids, n, 1, rng)
        first[got[0]] += 1
    # one draw: P(i) = n_i / sum n = 0.1, 0.3, 0, 0.6 (binomial sd <= 0.0035)
    assert first["c"] == 0
    for cid, p in (("a", 0.1), ("b", 0.3), ("d", 0.6)):
        assert abs(first[cid] / draws - p) < 0.015, (cid, first[cid] / draws)


def test_candidates_without_replacement_and_at_most_the_eligible():
    rng = np.random.default_rng(1)
    got = draw_candidates(["a", "b", "c"], np.array([1.0, 0.0, 5.0]), 10, rng)
    assert sorted(got) == ["a", "c"]  # b holds no data; only two are eligible
    assert draw_candidates(["a"], np.array([0.0]), 3, rng) == []


# ------------------------------------------------------------------ selection
def test_highest_loss_picks_the_k_largest_with_a_free_processor():
    losses = {"a": 1.0, "b": 3.0, "c": 2.0, "d": 5.0}
    free = {c: 1 for c in "abcd"}
    assert highest_loss(list("abcd"), losses, 2, free) == ["d", "b"]
    assert free == {"a": 1, "b": 0, "c": 1, "d": 0}
    # d and b are busy now: the next two by loss
    assert highest_loss(list("abcd"), losses, 2, free) == ["c", "a"]
    # a candidate without a reported loss (or NaN) is passed over
    assert highest_loss(
        list("abcde"), {"a": 1.0, "e": float("nan")}, 3, {c: 1 for c in "abcde"}
    ) == ["a"]


def test_assign_by_hand_two_models_and_a_shared_client():
    # clients 0-3 hold both models, one processor each; budget m = 4 -> k = 2 per
    # model; d = 10 draws every holder. Losses: model x: 3 > 0 > 1 > 2 (9, 8, 7, 6);
    # model y: 3 > 2 > 1 > 0 (9, 8, 7, 6). Client 3 has the highest loss for both
    # and one processor: the model served first gets it, the other takes its
    # next two.
    rows = {str(i): ({"x": 10, "y": 10}, 1) for i in range(4)}
    losses = {
        ("3", "x"): 9,
        ("0", "x"): 8,
        ("1", "x"): 7,
        ("2", "x"): 6,
        ("3", "y"): 9,
        ("2", "y"): 8,
        ("1", "y"): 7,
        ("0", "y"): 6,
    }
    pol = PowerOfChoice(candidates=10, budget=4.0)
    t = table(rows, losses)
    picks = pol.assign(t, ["x", "y"], 1, np.random.default_rng(0))
    got = {(p.cid, p.task) for p in picks}
    x_first = {("3", "x"), ("0", "x"), ("2", "y"), ("1", "y")}
    y_first = {("3", "y"), ("2", "y"), ("0", "x"), ("1", "x")}
    assert got in (x_first, y_first)
    assert all(p.count == 1 for p in picks)
    # both orders happen over seeds (the models take turns in a random order)
    seen = set()
    for seed in range(20):
        fresh = PowerOfChoice(candidates=10, budget=4.0)
        seen.add(
            frozenset(
                (p.cid, p.task)
                for p in fresh.assign(
                    table(rows, losses), ["x", "y"], 1, np.random.default_rng(seed)
                )
            )
        )
    assert seen == {frozenset(x_first), frozenset(y_first)}


def test_two_processors_let_one_client_train_both_models():
    rows = {
        "0": ({"x": 10, "y": 10}, 2),
        "1": ({"x": 10, "y": 10}, 1),
        "2": ({"x": 10, "y": 10}, 1),
    }
    losses = {
        ("0", "x"): 5,
        ("1", "x"): 1,
        ("2", "x"): 0.5,
        ("0", "y"): 5,
        ("1", "y"): 0.1,
        ("2", "y"): 2,
    }
    pol = PowerOfChoice(candidates=3, budget=2.0)  # k = 1 per model
    picks = pol.assign(table(rows, losses), ["x", "y"], 1, np.random.default_rng(3))
    assert {(p.cid, p.task) for p in picks} == {("0", "x"), ("0", "y")}


def test_only_this_rounds_losses_count():
    rows = {"a": ({"x": 1}, 1), "b": ({"x": 1}, 1)}
    t = table(rows, {("a", "x"): 1.0})
    t.set_loss("b", "x", 50.0, 0)  # reported in an earlier round: stale
    pol = PowerOfChoice(candidates=2, budget=1.0)
    picks = pol.assign(t, ["x"], 1, np.random.default_rng(0))
    assert [(p.cid, p.task) for p in picks] == [("a", "x")]


def test_the_loss_query_asks_the_candidates_that_assign_then_uses():
    rows = {str(i): ({"x": 5 + i}, 1) for i in range(10)}
    pol = PowerOfChoice(candidates=3, budget=1.0)
    rng = np.random.default_rng(7)
    t = table(rows, {})
    asked = pol.loss_query_clients(t, ["x"], 4, rng)
    assert len(asked) == 3
    for cid in asked:
        t.set_loss(cid, "x", float(cid), 4)
    picks = pol.assign(t, ["x"], 4, rng)
    assert [p.cid for p in picks] == [max(asked, key=int)]


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="candidates"):
        PowerOfChoice(candidates=0)
    with pytest.raises(ValueError, match="budget_fraction"):
        PowerOfChoice(budget_fraction=-1)
    with pytest.raises(ValueError, match="does not pair"):
        card("power-of-choice").components("unbiased")


# ------------------------------------------------------------------ a whole run
def test_a_run_trains_the_candidates_within_processors_and_is_deterministic(tmp_path):
    s = dict(
        strategy="power-of-choice",
        tasks="digits,synthetic",
        num_clients=8,
        num_rounds=2,
        local_epochs=1,
        candidates=4,
        budget_fraction=0.5,
        seed=2,
    )
    for name in ("a", "b"):
        runner.run(Settings(**s, output_dir=str(tmp_path / name)), engine="inprocess")
    a = (tmp_path / "a" / "assignments.csv").read_text()
    assert a == (tmp_path / "b" / "assignments.csv").read_text()
    rows = list(csv.DictReader(a.splitlines()))
    for rnd in ("1", "2"):
        this = [r for r in rows if r["round"] == rnd]
        per_model = {t: sum(r["task"] == t for r in this) for t in ("digits", "synthetic")}
        # m = 0.5 x 8 = 4 -> k = 2 per model; one processor each -> no client twice
        assert per_model == {"digits": 2, "synthetic": 2}
        assert len({r["client"] for r in this}) == 4
    metrics = list(csv.DictReader((tmp_path / "a" / "metrics.csv").read_text().splitlines()))
    assert all(r["uploads"] == "2" for r in metrics if r["round"] != "0")
