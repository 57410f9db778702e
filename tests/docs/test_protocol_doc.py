"""``docs/protocol.md`` is runnable as written: its hand-written ClientApp (the
first ``python`` block, executed verbatim) serves every preset of
``mmfl_flwr.PRESETS`` on the in-process engine, and its server snippet (the
second block) builds a strategy that trains it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import LogTap

from mmfl_flwr import PRESETS, make_strategy
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.records import arrays_to_numpy

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.+?)\n```", DOC.read_text(), re.DOTALL)


def client_app():
    ns: dict = {}
    exec(compile(blocks()[0], str(DOC), "exec"), ns)  # noqa: S102 (the doc, run as written)
    return ns["app"]


def server_snippet() -> dict:
    ns: dict = {}
    exec(compile(blocks()[1], str(DOC), "exec"), ns)  # noqa: S102
    return ns


def accuracy(w: dict[str, np.ndarray]) -> float:
    """Accuracy of ``w`` on fresh points of the doc's labelling rule."""
    rng = np.random.default_rng(99)
    x = rng.normal(size=(2000, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.3 > 0
    return float(np.mean(((x @ w["w"] + w["b"]) > 0) == y))


PRESET_KW = {"ranklist-ucb": {"clients_per_round": 3}, "pareto-ucb": {"clients_per_round": 3}}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_the_documented_client_app_serves_every_preset(preset):
    snippet = server_snippet()
    grid = InProcessGrid(client_app(), [{"partition-id": i} for i in range(8)], seed=0)
    kw = dict(
        local_epochs=5,
        lr=0.5,
        seed=0,
        node_wait_timeout=0.0,
        fraction_evaluate=0.5,
        **PRESET_KW.get(preset, {}),
    )
    if "budget_fraction" in PRESETS[preset].__code__.co_varnames:
        kw["budget_fraction"] = 0.5
    strategy = make_strategy(preset, **kw)
    with LogTap.on_flwr() as tap:
        result = strategy.start(grid, snippet["initial"], num_rounds=6, timeout=30.0)
    problems = tap.warnings()
    assert problems == []  # nothing rejected, ignored or failed
    uploads = sum(r["uploads"] for r in result.history if r["round"] > 0)
    assert uploads > 0
    w = arrays_to_numpy(result.arrays["lin"])
    assert all(np.isfinite(v).all() for v in w.values())
    assert accuracy(w) > 0.75, accuracy(w)  # the zero model scores ~0.5
    evaluated = result.evaluate_metrics_clientapp
    assert evaluated and all(
        "lin.accuracy" in rec for per_round in evaluated.values() for rec in per_round.values()
    )


def test_the_documented_server_snippet_builds_lvr_and_reports_real_accuracies(capsys):
    """The server snippet as written, with the documented ClientApp: every round is
    evaluated by the clients and ``report`` prints real accuracies (issue 25: it
    used to print NaN, its server never evaluating); the per-round log shows them."""
    snippet = server_snippet()
    assert type(snippet["strategy"].policy).__name__ == "LVR"
    assert set(snippet["initial"]) == {"lin"}
    grid = InProcessGrid(client_app(), [{"partition-id": i} for i in range(8)], seed=0)
    with LogTap.on_flwr() as tap:
        result = snippet["strategy"].start(grid, snippet["initial"], num_rounds=10)
    snippet["report"](result)
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == [f"round {r}" for r in range(1, 11)]
    accs = [float(ln.rsplit(" ", 1)[1]) for ln in lines]
    assert all(0.0 <= a <= 1.0 for a in accs) and accs[-1] > 0.75, lines
    logged = [m for _, m in tap.records if "lin" in m and "acc" in m]
    assert logged and not any("acc nan" in m for m in logged), logged


def test_the_documented_shard_app_hosts_its_clients_behind_one_message_per_node():
    """The multi-client section's ClientApp (the third ``python`` block, as written):
    two nodes of four clients each register eight clients, and every round trip
    sends one message per node (issue 24)."""
    from flwr.app import Array, ArrayRecord

    from mmfl_flwr.core.random_allocation import FullParticipation
    from mmfl_flwr.strategy import MultiModelStrategy

    ns: dict = {}
    exec(compile(blocks()[2], str(DOC), "exec"), ns)  # noqa: S102
    seen: list[tuple[int, str]] = []

    def recording(msg, ctx):
        seen.append((ctx.node_id, msg.metadata.message_type))
        return ns["app"](msg, ctx)

    grid = InProcessGrid(recording, [{"clients": "0-3"}, {"clients": "4-7"}], seed=0)
    strategy = MultiModelStrategy(FullParticipation(), local_epochs=1, lr=0.5, seed=0)
    result = strategy.start(
        grid,
        {"mean": ArrayRecord({"m": Array(np.zeros(1, np.float32))})},
        num_rounds=2,
        timeout=30.0,
    )
    assert sorted(strategy.table.ids(), key=int) == [str(c) for c in range(8)]
    assert [m for _, m in seen].count("train") == 4  # 2 nodes x 2 rounds
    assert sorted({c for c, _, _ in result.assignments[2]}, key=int) == [str(c) for c in range(8)]
    # FullParticipation + FedAvg: the mean moves towards the clients' data (means 0..7)
    assert 0.5 < float(arrays_to_numpy(result.arrays["mean"])["m"][0]) < 7.0
