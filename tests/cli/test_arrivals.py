"""Clients and models that arrive during training.

- ``Settings.client_arrival_rounds`` / ``task_arrival_rounds``: parsing,
  determinism, the exponential arrival law, errors.
- ``MultiModelStrategy(client_arrivals=...)`` on the in-process engine with
  numpy fake clients: a client never hears from the server (train, loss query,
  evaluation) before its arrival round and trains after it; under MMFL-Group a
  late client is placed in the cosine-nearest cluster and trains without a new
  C-step.
- ``MultiModelStrategy(task_arrivals=...)``: a model has no metrics rows before
  its arrival round, is never trained before it, and is trained after it; the
  ``group`` preset starts it at the first cycle boundary at or after its
  arrival round, ``mfa-rand`` at its arrival round.
- The real runner with ``client_arrivals`` and ``task_arrivals`` (group preset).
"""

from __future__ import annotations

import csv
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Recorder, StepTrainer
from flwr.app import Context, MessageType

from mmfl_flwr import protocol as P
from mmfl_flwr.client.app import ClientSpec, make_client_app
from mmfl_flwr.config import Settings
from mmfl_flwr.core import FullParticipation
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.presets import group_sampling, mfa_rand
from mmfl_flwr.records import numpy_to_arrays
from mmfl_flwr.strategy import MultiModelStrategy


# ------------------------------------------------------------------ settings
class TestSettings:
    def test_exponential_arrivals_late_clients_only(self):
        s = Settings(num_clients=60, client_arrivals="exponential:static=24,rate=0.1")
        arr = s.client_arrival_rounds()
        assert set(arr) == {str(c) for c in range(24, 60)}
        assert all(isinstance(v, int) and v >= 1 for v in arr.values())
        # deterministic by seed
        assert (
            arr
            == Settings(
                num_clients=60, client_arrivals="exponential:static=24,rate=0.1"
            ).client_arrival_rounds()
        )
        other = Settings(
            num_clients=60, client_arrivals="exponential:static=24,rate=0.1", seed=1
        ).client_arrival_rounds()
        assert set(other) == set(arr) and other != arr

    def test_no_spec_means_everyone_from_the_start(self):
        assert Settings(num_clients=5).client_arrival_rounds() == {}
        assert Settings(num_clients=5, client_arrivals="  ").client_arrival_rounds() == {}

    @pytest.mark.parametrize("rate", [0.1, 0.5, 2.0])
    def test_arrivals_are_a_poisson_process_with_that_rate(self, rate):
        """Papers 000/001: exponential *inter-arrival* times with rate ``rate`` per
        round (on average one client every ``1/rate`` rounds), clients arriving in
        id order: the number arriving in a round is Poisson(rate), and the last of
        ``n`` arrives near round ``n / rate``."""
        n = 20000
        s = Settings(num_clients=n, client_arrivals=f"exponential:static=0,rate={rate}")
        arr = s.client_arrival_rounds()
        rounds = np.array([arr[str(c)] for c in range(n)], dtype=float)
        assert (np.diff(rounds) >= 0).all(), "clients arrive in id order"
        # the n-th arrival time is Gamma(n, rate): mean n / rate, sd sqrt(n) / rate;
        # the ceiling to a round adds less than 1
        assert abs(rounds[-1] - n / rate) < 5 * math.sqrt(n) / rate + 1
        # arrivals per round, away from the first and the last round: Poisson(rate)
        last = int(rounds[-1]) - 1
        counts = np.bincount(rounds.astype(int), minlength=last + 2)[2:last]
        se = math.sqrt(rate / counts.size)
        assert abs(counts.mean() - rate) < 5 * se
        assert abs(counts.var() - rate) < 0.1 * rate
        if rate < 1:  # P(no arrival in a round) = exp(-rate)
            assert abs((counts == 0).mean() - math.exp(-rate)) < 0.02

    def test_paper_rate_spreads_36_arrivals_over_hundreds_of_rounds(self):
        """The papers' scenario (24 static + 36 arriving, rate 0.1): the last client
        arrives after about 360 rounds (Gamma(36, 0.1): sd 60), not within ~40 as
        independent Exp(0.1) arrival times would give (their maximum has mean 41.5)."""
        lasts = [
            max(
                Settings(
                    num_clients=60, seed=seed, client_arrivals="exponential:static=24,rate=0.1"
                )
                .client_arrival_rounds()
                .values()
            )
            for seed in range(20)
        ]
        assert 360 - 5 * 60 / math.sqrt(20) < np.mean(lasts) < 360 + 5 * 60 / math.sqrt(20) + 1

    @pytest.mark.parametrize(
        "spec",
        [
            "uniform:static=3,rate=0.1",
            "exponential",
            "exponential:static=3,rate=0",
            "exponential:static=3,rate=-1",
            "exponential:static=100,rate=0.1",  # more static clients than clients
            "exponential:static=-1,rate=0.1",
            "exponential:static=abc,rate=0.1",
            "exponential:static=3,rate",
        ],
    )
    def test_bad_client_specs_raise(self, spec):
        s = Settings(num_clients=60, client_arrivals=spec)
        with pytest.raises(ValueError):
            s.client_arrival_rounds()
        with pytest.raises(ValueError):
            s.validate()

    def test_unknown_client_spec_key_raises(self):
        s = Settings(num_clients=60, client_arrivals="exponential:static=3,rtae=0.5")
        with pytest.raises(ValueError):
            s.client_arrival_rounds()

    def test_task_arrival_rounds(self):
        s = Settings(tasks="digits,synthetic,digits", task_arrivals="digits_2:3,synthetic:5")
        assert s.task_arrival_rounds() == {"digits_2": 3, "synthetic": 5}
        s.validate()
        assert Settings(task_arrivals="").task_arrival_rounds() == {}
        assert Settings(task_arrivals=" digits_2 : 7 ,").task_arrival_rounds() == {"digits_2": 7}

    @pytest.mark.parametrize("spec", ["digits_2", "digits_2:x", "digits_2:3.5"])
    def test_bad_task_specs_raise(self, spec):
        with pytest.raises(ValueError):
            Settings(task_arrivals=spec).task_arrival_rounds()

    @pytest.mark.parametrize("spec", ["digits_3:3", "mnist:2", "digits_2:3,synth:4"])
    def test_unknown_task_names_raise_in_validate(self, spec):
        s = Settings(tasks="digits,synthetic,digits", task_arrivals=spec)
        with pytest.raises(ValueError, match="task-arrivals"):
            s.validate()

    def test_run_config_round_trip(self):
        s = Settings(
            num_clients=30,
            client_arrivals="exponential:static=10,rate=0.3",
            tasks="digits,digits",
            task_arrivals="digits_2:4",
        )
        back = Settings.from_run_config(s.to_run_config())
        assert back.client_arrival_rounds() == s.client_arrival_rounds()
        assert back.task_arrival_rounds() == {"digits_2": 4}


# --------------------------------------------------------------------- fakes
def fake(n: int, loss: float) -> StepTrainer:
    """``train`` returns ``w - 0.01``; the loss is a fixed number per (client, task)."""
    return StepTrainer(n, 0.01, loss, (loss, 0.5, n), loss)


def initial(tasks) -> dict[str, Any]:
    return {t: numpy_to_arrays({"w": np.zeros((2, 2), np.float32)}) for t in tasks}


def run(strategy: MultiModelStrategy, losses: dict[str, dict[str, float]], tasks, rounds: int):
    """Run ``strategy`` on fake clients ``cid -> {task: loss}``; returns
    ``(result, recorder, snapshots)`` with a per-round snapshot of the policy."""

    def spec_fn(ctx: Context) -> ClientSpec:
        cid = str(ctx.node_config["cid"])
        return ClientSpec(cid, {t: fake(10, v) for t, v in losses[cid].items()})

    rec = Recorder(make_client_app(spec_fn))
    grid = InProcessGrid(rec, [{"cid": c} for c in losses], seed=0)
    snaps: dict[int, dict[str, Any]] = {}
    pol = strategy.policy

    def hook(rnd, rows):
        snaps[rnd] = {
            "rows": rows,
            "groups": dict(getattr(pol, "groups", {})),
            "csteps": len(getattr(pol, "csteps", [])),
            "cycle_start": getattr(pol, "cycle_start", None),
            "centroids": np.array(getattr(pol, "centroids", [])).copy(),
        }

    strategy.on_round_end = hook
    result = strategy.start(grid, initial(tasks), num_rounds=rounds, timeout=60)
    return result, rec, snaps


def blob_losses(centers, per: int, tasks, seed: int = 0, start: int = 0, spread: float = 0.05):
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, float]] = {}
    truth: dict[str, int] = {}
    cid = start
    for g, c in enumerate(centers):
        for _ in range(per):
            v = np.asarray(c, dtype=float) + rng.normal(0, spread, len(c))
            out[str(cid)] = {t: float(x) for t, x in zip(tasks, v)}
            truth[str(cid)] = g
            cid += 1
    return out, truth


# ----------------------------------------------------------- client arrivals
def test_client_never_hears_from_server_before_arrival():
    tasks = ["a", "b"]
    losses = {str(c): {"a": 1.0, "b": 2.0} for c in range(8)}
    arrivals = {"6": 3, "7": 5}
    strategy = MultiModelStrategy(
        FullParticipation(),
        seed=0,
        node_wait_timeout=0.0,
        client_arrivals=arrivals,
        fraction_evaluate=1.0,
    )
    result, rec, _ = run(strategy, losses, tasks, rounds=6)
    for s in rec.log:
        if s.type != P.QUERY_INFO:  # registering is not taking part
            assert s.round >= arrivals.get(s.cid, 0), s
    for cid in losses:
        trained = {s.round for s in rec.of_type(MessageType.TRAIN) if s.cid == cid}
        assert trained == set(range(arrivals.get(cid, 1), 7)), cid
    for rnd, picks in result.assignments.items():
        for cid, _, _ in picks:
            assert rnd >= arrivals.get(cid, 0)
    # the late clients' updates count once they are there
    rows = {(r["round"], r["task"]): r for r in result.history}
    assert rows[(2, "a")]["uploads"] == 6 and rows[(3, "a")]["uploads"] == 7
    assert rows[(5, "a")]["uploads"] == 8


def test_group_late_client_placed_by_cosine_without_new_cstep():
    tasks = ["a", "b"]
    centers = [(1.0, 1.0), (6.0, 1.0), (1.0, 6.0)]
    losses, truth = blob_losses(centers, 6, tasks)
    late = "18"
    v = np.array([4.6, 4.4])  # direction of cluster 0, Euclidean-nearest to cluster 1
    losses[late] = {"a": float(v[0]), "b": float(v[1])}
    strategy = group_sampling(
        participation=1.0, seed=0, node_wait_timeout=0.0, client_arrivals={late: 2}
    )
    pol = strategy.policy
    result, rec, snaps = run(strategy, losses, tasks, rounds=4)

    # round 1: C-step over the 18 clients present; 3 planted clusters, L = 3
    assert pol.csteps[0]["round"] == 1
    assert late not in pol.csteps[0]["clients"] and len(pol.csteps[0]["clients"]) == 18
    assert pol.csteps[0]["k"] == 3
    g1 = snaps[1]["groups"]
    for cid, g in truth.items():
        assert g1[cid] == g1[str(6 * g)]  # same planted blob, same group
    assert len({g1[str(6 * g)] for g in range(3)}) == 3

    # round 2: the late client is placed by cosine; no new C-step
    s2 = snaps[2]
    cent = s2["centroids"]
    cos = cent @ v / (np.linalg.norm(cent, axis=1) * np.linalg.norm(v))
    euclid = int(np.argmin(np.linalg.norm(cent - v, axis=1)))
    assert int(np.argmax(cos)) == g1["0"] and euclid == g1["6"]  # they differ
    assert s2["groups"][late] == g1["0"]
    assert s2["csteps"] == 1 and s2["cycle_start"] == 1
    assert snaps[3]["csteps"] == 1 and snaps[3]["cycle_start"] == 1

    # only the newcomer was asked for its losses in round 2; nobody in round 3
    q = defaultdict(set)
    for s in rec.of_type(P.QUERY_LOSSES):
        q[s.round].add(s.cid)
    assert q[1] == set(truth)
    assert q[2] == {late}
    assert 3 not in q
    assert q[4] == set(losses)  # next cycle: everyone, the late client too

    # it trains in round 2 (participation 1) the model of its group, never before
    train = [s for s in rec.of_type(MessageType.TRAIN) if s.cid == late]
    assert min(s.round for s in train) == 2
    mates = [s for s in rec.of_type(MessageType.TRAIN) if s.round == 2 and s.cid == "0"]
    assert mates and [s.tasks for s in train if s.round == 2] == [mates[0].tasks]
    # round 4: new cycle, the late client is clustered with its own losses
    assert pol.csteps[1]["round"] == 4 and late in pol.csteps[1]["clients"]


# ------------------------------------------------------------- task arrivals
TASKS_ABC = ["a", "b", "c"]


def abc_losses():
    losses, truth = blob_losses([(1.0, 1.0), (6.0, 1.0), (1.0, 6.0)], 6, ["a", "b"])
    rng = np.random.default_rng(5)
    for cid in losses:
        losses[cid]["c"] = float(2.0 + 4.0 * truth[cid] + rng.normal(0, 0.05))
    return losses


def check_task_rows(result, task: str, arrival: int, start: int, rounds: int):
    rows = {r["round"]: r for r in result.history if r["task"] == task}
    assert sorted(rows) == list(range(arrival, rounds + 1))  # no rows before arrival
    for rnd in range(1, rounds + 1):
        trained = {t for _, t, _ in result.assignments[rnd]}
        assert (task in trained) == (rnd >= start), rnd
    for rnd, row in rows.items():
        if rnd < start:
            assert row["assigned"] == 0 and row["uploads"] == 0 and row["step_l1"] == 0.0
        else:
            assert row["uploads"] > 0 and row["step_l1"] > 0.0


@pytest.mark.parametrize("arrival, start", [(2, 4), (4, 4), (5, 7)])
def test_group_new_model_starts_at_next_cycle_boundary(arrival, start):
    rounds = 8
    strategy = group_sampling(
        participation=1.0, seed=0, node_wait_timeout=0.0, task_arrivals={"c": arrival}
    )
    pol = strategy.policy
    result, rec, _ = run(strategy, abc_losses(), TASKS_ABC, rounds=rounds)
    # the planted 3 clusters give L = 3: cycle boundaries at rounds 1, 4, 7
    assert [c["round"] for c in pol.csteps] == [1, 4, 7]
    assert all(c["k"] == 3 for c in pol.csteps)
    check_task_rows(result, "c", arrival, start, rounds)
    for c in pol.csteps:
        assert ("c" in c["tasks"]) == (c["round"] >= start)
    # the model is never sent before its arrival round (loss query or training)
    for s in rec.log:
        if "c" in s.tasks:
            assert s.round >= arrival
            if s.type == MessageType.TRAIN:
                assert s.round >= start
    # the other models train from round 1
    for t in ("a", "b"):
        check_task_rows(result, t, 0, 1, rounds)


def test_mfa_rand_new_model_starts_at_arrival():
    rounds = 6
    strategy = mfa_rand(seed=0, node_wait_timeout=0.0, task_arrivals={"c": 3})
    result, rec, _ = run(strategy, abc_losses(), TASKS_ABC, rounds=rounds)
    check_task_rows(result, "c", 3, 3, rounds)
    for s in rec.log:
        if "c" in s.tasks:
            assert s.round >= 3


def test_unknown_task_in_task_arrivals_raises():
    strategy = MultiModelStrategy(
        FullParticipation(), node_wait_timeout=0.0, task_arrivals={"zzz": 2}
    )
    grid = InProcessGrid(
        make_client_app(lambda ctx: ClientSpec("0", {"a": fake(10, 1.0)})), [{"cid": "0"}], seed=0
    )
    with pytest.raises(ValueError, match="zzz"):
        strategy.start(grid, initial(["a"]), num_rounds=1)


# ---------------------------------------------------------------- real runner
def cluster_rows(path: Path) -> list[dict[str, int]]:
    with open(path, newline="") as f:
        return [{k: int(v) for k, v in r.items()} for r in csv.DictReader(f)]


def test_runner_group_with_client_arrivals(tmp_path):
    from mmfl_flwr import runner

    s = Settings(
        strategy="group",
        tasks="digits,digits,digits",
        profile="clusters-consistent",
        client_arrivals="exponential:static=10,rate=0.3",
        num_clients=20,
        num_rounds=6,
        local_epochs=1,
        output_dir=str(tmp_path),
    )
    arrivals = {int(c): r for c, r in s.client_arrival_rounds().items()}
    result = runner.run(s, engine="inprocess")
    assert max(r["round"] for r in result.history) == 6
    for rnd, picks in result.assignments.items():
        for cid, _, _ in picks:
            assert arrivals.get(int(cid), 0) <= rnd
    rows = cluster_rows(tmp_path / "clusters.csv")
    by_round: dict[int, set[int]] = defaultdict(set)
    for r in rows:
        by_round[r["round"]].add(r["client"])
    for rnd, clients in by_round.items():
        # each C-step clusters exactly the clients there at that round
        assert clients == {c for c in range(20) if arrivals.get(c, 0) <= rnd}
    assert by_round[1] >= set(range(10))
    # some client arriving mid-cycle trained before the next C-step
    csteps = sorted(by_round)
    mid = [
        (rnd, int(cid))
        for rnd, picks in result.assignments.items()
        for cid, _, _ in picks
        if arrivals.get(int(cid), 0) > max(c for c in csteps if c <= rnd)
    ]
    assert mid, "no late client trained between C-steps"


def test_runner_group_with_task_arrivals(tmp_path):
    from mmfl_flwr import runner

    s = Settings(
        strategy="group",
        tasks="digits,digits,digits",
        profile="clusters-consistent",
        task_arrivals="digits_3:3",
        num_clients=20,
        num_rounds=6,
        local_epochs=1,
        output_dir=str(tmp_path),
    )
    result = runner.run(s, engine="inprocess")
    rows = [r for r in result.history if r["task"] == "digits_3"]
    assert min(r["round"] for r in rows) == 3
    assert {r["round"] for r in rows} == {3, 4, 5, 6}
    csteps = sorted({r["round"] for r in cluster_rows(tmp_path / "clusters.csv")})
    later = [c for c in csteps if c >= 3]
    assert later, f"no cycle boundary at or after round 3 within 6 rounds: {csteps}"
    start = later[0]
    assert start > 3  # round 3 is mid-cycle (5 planted clusters: L = 5, C-steps 1, 6)
    for rnd in range(1, 7):
        trained = {t for _, t, _ in result.assignments[rnd]}
        assert ("digits_3" in trained) == (rnd >= start), rnd
    # the other two models train from round 1
    assert all(
        {"digits", "digits_2"} <= {t for _, t, _ in result.assignments[r]} for r in range(1, 7)
    )
    counts = Counter(r["task"] for r in result.history)
    assert counts["digits"] == 7 and counts["digits_3"] == 4
