"""start() drives every round through the Strategy hooks a Flower user knows
(configure_train / aggregate_train, configure_evaluate / aggregate_evaluate, and
configure_loss_query / aggregate_loss_query), so a subclass's override changes
the run; an override that raises or returns what the round cannot use is one
HookError naming it, and no global model changes.

The federation: fake clients (``w - step`` training, conftest.StepTrainer) on
the in-process Grid, two models, full participation with FedAvg, so every
number below follows by hand from the steps and sample counts."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from harness import ClientDef, fake_client_app, run_federation, zero_models

from mmfl_flwr import HookError, make_strategy
from mmfl_flwr.core.random_allocation import FullParticipation
from mmfl_flwr.strategy import MultiModelStrategy

TASKS = ("a", "b")
#: label -> (examples, step) on both models; FedAvg's round-1 model is -(weighted mean step)
CLIENTS = {
    "c0": ClientDef(
        {t: (10, 1.0) for t in TASKS},
        losses={"a": 1.0, "b": 2.0},
        evals={t: (0.5, 0.8, 10) for t in TASKS},
    ),
    "c1": ClientDef(
        {t: (30, 2.0) for t in TASKS},
        losses={"a": 3.0, "b": 1.0},
        evals={t: (1.5, 0.4, 30) for t in TASKS},
    ),
}
NODES = {label: {"cid": label} for label in CLIENTS}
MEAN_STEP = (10 * 1.0 + 30 * 2.0) / 40  # 1.75


def run(strategy: MultiModelStrategy, rounds: int = 2, **kw):
    return run_federation(
        strategy, fake_client_app(CLIENTS), NODES, zero_models(TASKS), rounds, **kw
    )


def full(cls: type[MultiModelStrategy] = MultiModelStrategy, **kw) -> MultiModelStrategy:
    return cls(FullParticipation(), seed=3, **kw)


# ---------------------------------------------------------------- train hooks
class ExtraConfig(MultiModelStrategy):
    def configure_train(self, server_round, arrays, config, grid):
        msgs = list(super().configure_train(server_round, arrays, config, grid))
        for m in msgs:
            m.content["config"]["extra"] = 7
        return msgs


class OnlyFirstNode(MultiModelStrategy):
    def configure_train(self, server_round, arrays, config, grid):
        return list(super().configure_train(server_round, arrays, config, grid))[:1]


class HalveModelA(MultiModelStrategy):
    """A server-side step on one model, and a metric added to every model."""

    def aggregate_train(self, server_round, replies):
        models, metrics = super().aggregate_train(server_round, replies)
        w = models["a"].to_numpy_ndarrays()
        models["a"] = ArrayRecord(
            {k: Array(v * np.float32(0.5)) for k, v in zip(models["a"].keys(), w)}
        )
        for task in models:
            metrics[f"{task}.server-step"] = 1.0 if task == "a" else 0.0
        return models, metrics


class KeepModelB(MultiModelStrategy):
    def aggregate_train(self, server_round, replies):
        models, metrics = super().aggregate_train(server_round, replies)
        del models["b"]
        return models, metrics


def test_the_hooks_get_the_current_models_as_one_record_per_model():
    seen = []

    class Spy(MultiModelStrategy):
        def configure_train(self, server_round, arrays, config, grid):
            seen.append(
                (server_round, sorted(arrays.keys()), float(arrays["a"]["w"].numpy()[0, 0]))
            )
            return super().configure_train(server_round, arrays, config, grid)

    run(full(Spy))
    assert seen == [(1, ["a", "b"], 0.0), (2, ["a", "b"], -MEAN_STEP)]


def test_configure_train_override_changes_the_messages():
    plain = run(full())
    extra = run(full(ExtraConfig))
    assert all(r.config.get("extra") == 7 for r in extra.rec.of_type("train"))
    assert not any("extra" in r.config for r in plain.rec.of_type("train"))
    assert len(extra.rec.of_type("train")) == len(plain.rec.of_type("train")) == 4


def test_configure_train_override_that_drops_a_node_trains_without_it():
    out = run(full(OnlyFirstNode))
    trained = {r.cid for r in out.rec.of_type("train")}
    assert len(trained) == 1
    (cid,) = trained
    step = CLIENTS[cid].tasks["a"][1]
    np.testing.assert_allclose(out.snapshots[1]["a"]["w"], -step)
    assert all(row["uploads"] == 1 for row in out.rows(1).values())


def test_aggregate_train_override_steps_one_model_and_adds_a_metric():
    plain = run(full(), rounds=1)
    halved = run(full(HalveModelA), rounds=1)
    np.testing.assert_allclose(plain.snapshots[1]["a"]["w"], -MEAN_STEP)
    np.testing.assert_allclose(halved.snapshots[1]["a"]["w"], -MEAN_STEP / 2)
    np.testing.assert_array_equal(halved.snapshots[1]["b"]["w"], plain.snapshots[1]["b"]["w"])
    # the history measures the model that was installed: 9 entries moved by 1.75 / 2
    assert halved.rows(1)["a"]["step_l1"] == pytest.approx(9 * MEAN_STEP / 2)
    assert plain.rows(1)["a"]["step_l1"] == pytest.approx(9 * MEAN_STEP)
    metrics = halved.result.train_metrics_clientapp[1]["all"]
    assert metrics["a.server-step"] == 1.0 and metrics["b.server-step"] == 0.0
    assert metrics["a.uploads"] == 2
    np.testing.assert_allclose(halved.result.arrays["a"]["w"].numpy(), -MEAN_STEP / 2)


def test_a_model_left_out_of_aggregate_train_stays_as_it_was():
    out = run(full(KeepModelB))
    assert np.all(out.snapshots[2]["b"]["w"] == 0.0)
    np.testing.assert_allclose(out.snapshots[2]["a"]["w"], -2 * MEAN_STEP)
    assert out.rows(1)["b"]["step_l1"] == 0.0


# ----------------------------------------------------------- evaluation hooks
def test_evaluate_overrides_change_who_evaluates_and_what_is_recorded():
    class FirstOnlyDoubledAccuracy(MultiModelStrategy):
        def configure_evaluate(self, server_round, arrays, config, grid):
            return list(super().configure_evaluate(server_round, arrays, config, grid))[:1]

        def aggregate_evaluate(self, server_round, replies):
            metrics = super().aggregate_evaluate(server_round, replies)
            metrics["a.accuracy"] = 2 * metrics["a.accuracy"]
            return metrics

    plain = run(full(fraction_evaluate=1.0), rounds=1)
    sub = run(full(FirstOnlyDoubledAccuracy, fraction_evaluate=1.0), rounds=1)
    assert len(plain.rec.of_type("evaluate")) == 2 and len(sub.rec.of_type("evaluate")) == 1
    # both clients: (10 * 0.8 + 30 * 0.4) / 40 = 0.5
    assert plain.rows(1)["a"]["client_accuracy"] == pytest.approx(0.5)
    (cid,) = {r.cid for r in sub.rec.of_type("evaluate")}
    own = CLIENTS[cid].evals["a"][1]
    assert sub.rows(1)["a"]["client_accuracy"] == pytest.approx(2 * own)
    assert sub.rows(1)["b"]["client_accuracy"] == pytest.approx(own)
    assert sub.result.evaluate_metrics_clientapp[1]["all"]["a.accuracy"] == pytest.approx(2 * own)


# ----------------------------------------------------------- loss-query hooks
def lvr(cls: type[MultiModelStrategy] = MultiModelStrategy) -> MultiModelStrategy:
    preset = make_strategy("lvr", seed=3)
    return cls(preset.policy, preset.aggregator, seed=3)


def test_loss_query_hooks_decide_what_the_policy_reads():
    class HalfLosses(MultiModelStrategy):
        def aggregate_loss_query(self, server_round, replies):
            losses = super().aggregate_loss_query(server_round, replies)
            return RecordDict(
                {t: MetricRecord({c: v / 2 for c, v in rec.items()}) for t, rec in losses.items()}
            )

    plain, half = lvr(), lvr(HalfLosses)
    run(plain, rounds=1)
    run(half, rounds=1)
    for cid, d in CLIENTS.items():
        for task in TASKS:
            assert plain.table[cid].losses[task] == pytest.approx(d.losses[task])
            assert half.table[cid].losses[task] == pytest.approx(d.losses[task] / 2)


def test_configure_loss_query_override_can_skip_the_query():
    class NoQuery(MultiModelStrategy):
        def configure_loss_query(self, server_round, arrays, config, grid):
            return []

    s = lvr(NoQuery)
    out = run(s, rounds=1)
    assert out.rec.of_type("query.losses") == []
    assert all(not s.table[cid].losses for cid in CLIENTS)
    assert out.rec.of_type("train")  # the round went on without losses


# ------------------------------------------------------------------ bad hooks
def bad(name: str, body):
    return type(f"Bad_{name}", (MultiModelStrategy,), {name: body})


def _train_raises(self, server_round, arrays, config, grid):
    raise RuntimeError("boom")


def _agg_raises(self, server_round, replies):
    raise ValueError("bad arithmetic")


def _agg_shape(self, server_round, replies):
    models, metrics = MultiModelStrategy.aggregate_train(self, server_round, replies)
    models["a"] = ArrayRecord(
        {"w": Array(np.zeros((3, 3), np.float32)), "b": Array(np.zeros(3, np.float32))}
    )
    return models, metrics


def _agg_nan(self, server_round, replies):
    models, metrics = MultiModelStrategy.aggregate_train(self, server_round, replies)
    models["b"] = ArrayRecord(
        {"w": Array(np.full((2, 3), np.nan, np.float32)), "b": Array(np.zeros(3, np.float32))}
    )
    return models, metrics


def _agg_unknown_model(self, server_round, replies):
    models, metrics = MultiModelStrategy.aggregate_train(self, server_round, replies)
    models["wines"] = models["a"]
    return models, metrics


def _agg_not_a_pair(self, server_round, replies):
    return MultiModelStrategy.aggregate_train(self, server_round, replies)[0]


def _agg_dict_metrics(self, server_round, replies):
    models, _ = MultiModelStrategy.aggregate_train(self, server_round, replies)
    return models, {"a.x": 1.0}


def _agg_without_super(self, server_round, replies):
    return None, None


def _train_not_messages(self, server_round, arrays, config, grid):
    return ["not a message"]


def _eval_dict(self, server_round, replies):
    return {"a.accuracy": 1.0}


def _loss_unknown_client(self, server_round, replies):
    return RecordDict({"a": MetricRecord({"ghost": 1.0})})


def _loss_nan(self, server_round, replies):
    return RecordDict({"a": MetricRecord({"c0": float("nan")})})


CASES = {
    "configure_train raises": (bad("configure_train", _train_raises), "configure_train", "boom"),
    "configure_train returns strings": (
        bad("configure_train", _train_not_messages),
        "configure_train",
        "expected Flower Messages",
    ),
    "aggregate_train raises": (
        bad("aggregate_train", _agg_raises),
        "aggregate_train",
        "bad arithmetic",
    ),
    "wrong shape": (bad("aggregate_train", _agg_shape), "aggregate_train", "shape (3, 3)"),
    "NaN model": (bad("aggregate_train", _agg_nan), "aggregate_train", "NaN"),
    "unknown model": (bad("aggregate_train", _agg_unknown_model), "aggregate_train", "wines"),
    "not a pair": (
        bad("aggregate_train", _agg_not_a_pair),
        "aggregate_train",
        "expected (models, metrics)",
    ),
    "dict metrics": (
        bad("aggregate_train", _agg_dict_metrics),
        "aggregate_train",
        "expected a MetricRecord",
    ),
    "no super()": (bad("aggregate_train", _agg_without_super), "aggregate_train", "super()"),
    "evaluate dict": (
        bad("aggregate_evaluate", _eval_dict),
        "aggregate_evaluate",
        "expected a MetricRecord",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_hook_is_one_error_naming_it_and_no_model_changes(case):
    cls, hook, words = CASES[case]
    strategy = cls(FullParticipation(), seed=3, fraction_evaluate=1.0)
    with pytest.raises(HookError) as err:
        run(strategy, rounds=1)
    text = str(err.value)
    assert f"{cls.__name__}.{hook}" in text and words in text, text
    # a bad train hook installs nothing; a bad evaluation hook comes after round 1's
    # honest aggregate was installed
    expected = -MEAN_STEP if hook.endswith("evaluate") else 0.0
    for task in TASKS:
        for v in strategy.weights[task].values():
            np.testing.assert_allclose(v, expected)


@pytest.mark.parametrize(
    "body,words", [(_loss_unknown_client, "'ghost'"), (_loss_nan, "must be finite")]
)
def test_a_bad_loss_query_hook_is_one_error_and_nothing_is_stored(body, words):
    s = lvr(bad("aggregate_loss_query", body))
    with pytest.raises(HookError) as err:
        run(s, rounds=1)
    assert "aggregate_loss_query" in str(err.value) and words in str(err.value)
    assert all(not s.table[cid].losses for cid in CLIENTS)


def test_aggregate_train_without_configure_train_says_so():
    with pytest.raises(HookError, match="must call super"):
        full().aggregate_train(5, [])


def test_the_docs_override_example_runs_as_written():
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "plug-into-flower.md"
    readme = page.read_text()
    block = re.search(r"<!-- hook-example -->\n```python\n(.+?)```", readme, re.S)
    assert block, f"no python block after <!-- hook-example --> in {page}"
    scope: dict = {}
    exec(block.group(1), scope)
    s = scope["DampedDigits"](FullParticipation(), seed=3)
    out = run_federation(
        s,
        fake_client_app(
            {
                label: ClientDef({"digits": d.tasks["a"], "other": d.tasks["b"]})
                for label, d in CLIENTS.items()
            }
        ),
        NODES,
        zero_models(("digits", "other")),
        1,
    )
    np.testing.assert_allclose(out.snapshots[1]["digits"]["w"], -MEAN_STEP / 2)
    np.testing.assert_allclose(out.snapshots[1]["other"]["w"], -MEAN_STEP)
    assert out.result.train_metrics_clientapp[1]["all"]["other.server-round"] == 1
