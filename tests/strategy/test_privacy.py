"""Per-model differential privacy (mmfl_flwr.privacy): Flower's DP wrappers refuse
a MultiModelStrategy at construction; ours clip each (client, model) update's
trainable entries, add noise of std z C / m to each model's aggregate, adapt the
clipping norm per model (Andrew et al.), and account epsilon per model with
dp-accounting. Fake clients train ``w - step`` (conftest.StepTrainer), so each
update is ``-step`` in every entry and its norm is ``step * sqrt(entries)``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.serverapp import strategy as flower
from flwr.serverapp.strategy import FedAvg
from harness import ClientDef, fake_client_app, run_federation, zero_models

from mmfl_flwr import HookError
from mmfl_flwr import privacy as dp
from mmfl_flwr.core.clipping import clip_update
from mmfl_flwr.core.random_allocation import FullParticipation
from mmfl_flwr.strategy import MultiModelStrategy

TASKS = ("a", "b")
CLIENTS = {
    "c0": ClientDef({t: (10, 1.0) for t in TASKS}),
    "c1": ClientDef({t: (30, 2.0) for t in TASKS}),
}
NODES = {label: {"cid": label} for label in CLIENTS}
SMALL = {"w": (2, 3), "b": (3,)}  # 9 entries: update norms 3 and 6
WRAPPERS = {
    "server-fixed": lambda s, z, c, m: dp.DifferentialPrivacyServerSideFixedClipping(s, z, c, m),
    "client-fixed": lambda s, z, c, m: dp.DifferentialPrivacyClientSideFixedClipping(s, z, c, m),
    "server-adaptive": lambda s, z, c, m: dp.DifferentialPrivacyServerSideAdaptiveClipping(
        s, z, m, initial_clipping_norm=c
    ),
    "client-adaptive": lambda s, z, c, m: dp.DifferentialPrivacyClientSideAdaptiveClipping(
        s, z, m, initial_clipping_norm=c
    ),
}


def strategy(**kw) -> MultiModelStrategy:
    return MultiModelStrategy(FullParticipation(), seed=5, **kw)


def run(s, rounds=2, shapes=SMALL, **kw):
    return run_federation(
        s, fake_client_app(CLIENTS), NODES, zero_models(TASKS, shapes), rounds, **kw
    )


# ------------------------------------------------------------ Flower's own
@pytest.mark.parametrize(
    "name,args",
    [
        ("DifferentialPrivacyServerSideFixedClipping", (0.1, 10.0, 4)),
        ("DifferentialPrivacyClientSideFixedClipping", (0.1, 10.0, 4)),
        ("DifferentialPrivacyServerSideAdaptiveClipping", (0.1, 4)),
        ("DifferentialPrivacyClientSideAdaptiveClipping", (0.1, 4)),
    ],
)
def test_flowers_wrapper_refuses_a_multimodel_strategy_at_construction(name, args):
    cls = getattr(flower, name)
    with pytest.raises(TypeError) as err:
        cls(strategy(), *args)
    assert f"mmfl_flwr.privacy.{name}" in str(err.value)
    with pytest.raises(TypeError):
        cls(
            strategy=strategy(),
            noise_multiplier=args[0],
            num_sampled_clients=4,
            **({"clipping_norm": 10.0} if "Fixed" in name else {}),
        )
    assert cls(FedAvg(), *args).strategy is not None  # Flower's own use is untouched


# ---------------------------------------------------------------- equality
@pytest.mark.parametrize("kind", list(WRAPPERS))
def test_no_noise_and_a_clip_above_every_update_is_the_unwrapped_run(kind):
    plain = run(strategy())
    wrapped_strategy = strategy()
    wrapped = run(WRAPPERS[kind](wrapped_strategy, 0.0, 1e6, 2))
    for rnd in (1, 2):
        for task in TASKS:
            for k, v in plain.snapshots[rnd][task].items():
                np.testing.assert_array_equal(wrapped.snapshots[rnd][task][k], v)
    assert wrapped.result.privacy["a"]["epsilon"] == math.inf  # no noise: no privacy
    assert wrapped.result.privacy["a"]["releases"] == 2


# ----------------------------------------------------------------- clipping
def test_clipping_acts_on_the_trainable_entries_only():
    s = strategy(trainable_keys={t: ["w"] for t in TASKS})
    out = run(dp.DifferentialPrivacyServerSideFixedClipping(s, 0.0, 1.0, 2), rounds=1)
    # w updates: -1 and -2 in 6 entries (norms sqrt 6, 2 sqrt 6), both clipped to norm 1
    np.testing.assert_allclose(out.snapshots[1]["a"]["w"], -1 / math.sqrt(6), rtol=1e-5)
    # the bias is model state here: not clipped, and, since its average over the
    # clients would not be private, not learned either (named once per model)
    assert np.all(out.snapshots[1]["a"]["b"] == 0.0)
    assert [w for w in out.warnings(1) if "entries outside its trainable keys" in w]
    plain = run(strategy(trainable_keys={t: ["w"] for t in TASKS}), rounds=1)
    np.testing.assert_allclose(plain.snapshots[1]["a"]["b"], -(10 * 1 + 30 * 2) / 40, rtol=1e-6)


def test_under_dp_a_clients_declared_trainable_keys_are_ignored():
    # a client declaring only "b" trainable would exempt "w" from clipping and noise
    from flwr.app import Message

    def declare(app):
        def declaring(msg: Message, ctx):
            reply = app(msg, ctx)
            if msg.metadata.message_type == "query.info":
                for task in TASKS:
                    reply.content.config_records["info"][f"trainable.{task}"] = ["b"]
            return reply

        return declaring

    s = strategy()
    out = run(dp.DifferentialPrivacyServerSideFixedClipping(s, 0.0, 1.0, 2), rounds=1, wrap=declare)
    assert s.split_keys("a")[0] == ["w", "b"]
    np.testing.assert_allclose(out.snapshots[1]["a"]["w"], -1 / 3, rtol=1e-5)
    plain = strategy()
    run(plain, rounds=1, wrap=declare)
    assert plain.split_keys("a")[0] == ["b"]  # without DP the declaration is honoured


def test_a_huge_finite_update_is_clipped_not_overflowed():
    old = {"w": np.zeros(4)}
    new = {"w": np.full(4, 1e160)}
    out, norm, was = clip_update(new, old, ["w"], 1.0)
    assert norm == pytest.approx(2e160) and was
    assert np.linalg.norm(out["w"]) == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("name", ["scaffold", "mifa", "fedvarp", "stalevr"])
def test_aggregators_whose_releases_the_noise_does_not_cover_are_refused(name):
    from mmfl_flwr import make_strategy

    with pytest.raises(ValueError, match="supports the aggregators fedavg, unbiased, mean;"):
        dp.DifferentialPrivacyServerSideFixedClipping(make_strategy(name), 1.0, 1.0, 2)
    ok = make_strategy("lvr")
    dp.DifferentialPrivacyServerSideFixedClipping(ok, 1.0, 1.0, 2)


def test_clip_update_by_hand():
    old = {"w": np.array([1.0, 1.0], np.float32), "s": np.array([7], np.int64)}
    new = {"w": np.array([4.0, 5.0], np.float32), "s": np.array([9], np.int64)}
    out, norm, was = clip_update(new, old, ["w"], 1.0)
    assert norm == pytest.approx(5.0) and was
    np.testing.assert_allclose(out["w"], [1.6, 1.8], rtol=1e-6)
    assert out["s"][0] == 9 and out["w"].dtype == np.float32
    same, norm, was = clip_update(new, old, ["w"], 6.0)
    assert not was and same is new


def test_client_side_clipping_is_done_by_the_client_app():
    out = run(dp.DifferentialPrivacyClientSideFixedClipping(strategy(), 0.0, 1.0, 2), rounds=1)
    assert all(r.config["clipping_norm.a"] == 1.0 for r in out.rec.of_type("train"))
    # every update (norm 3 and 6 over 9 entries) clipped to norm 1: entries -1/3
    np.testing.assert_allclose(out.snapshots[1]["a"]["w"], -1 / 3, rtol=1e-5)
    assert not [w for w in out.warnings(1) if "client-side clipping not applied" in w]


def test_a_client_that_ignores_client_side_clipping_is_clipped_on_the_server():
    def strip(app):
        def app_without_clipping(msg, ctx):
            cfg = msg.content.config_records.get("config")
            if cfg is not None:
                for key in [k for k in cfg if k.startswith("clipping_norm")]:
                    del cfg[key]
            return app(msg, ctx)

        return app_without_clipping

    out = run(
        dp.DifferentialPrivacyClientSideFixedClipping(strategy(), 0.0, 1.0, 2), rounds=1, wrap=strip
    )
    np.testing.assert_allclose(out.snapshots[1]["a"]["w"], -1 / 3, rtol=1e-5)
    warned = [w for w in out.warnings(1) if "client-side clipping not applied" in w]
    assert len(warned) == 4  # two clients, two models


# -------------------------------------------------------------------- noise
def test_each_model_gets_noise_of_std_z_c_over_m():
    shapes = {"w": (100, 200), "b": (3,)}  # 20,003 entries: 20,000 noise draws on "w"
    s = strategy()
    out = run(
        dp.DifferentialPrivacyServerSideFixedClipping(s, 1.0, 0.5, {"a": 2, "b": 1}),
        rounds=1,
        shapes=shapes,
    )
    n = 20003
    clipped_entry = -0.5 / math.sqrt(n)  # both updates point the same way: clipped to 0.5
    for task, m in (("a", 2), ("b", 1)):
        noise = out.snapshots[1][task]["w"].astype(np.float64) - clipped_entry * (1 - 1e-6)
        assert noise.std() == pytest.approx(1.0 * 0.5 / m, rel=0.03)
        assert abs(noise.mean()) < 4 * (0.5 / m) / math.sqrt(noise.size)
    assert out.result.train_metrics_clientapp[1]["all"]["b.dp-noise-std"] == pytest.approx(0.5)


def test_noise_skips_the_models_state_entries():
    shapes = {"w": (50, 40), "b": (3,)}
    s = strategy(trainable_keys={t: ["w"] for t in TASKS})
    out = run(
        dp.DifferentialPrivacyServerSideFixedClipping(s, 2.0, 0.5, 2), rounds=1, shapes=shapes
    )
    assert np.all(out.snapshots[1]["a"]["b"] == 0.0)
    assert out.snapshots[1]["a"]["w"].std() > 0.4  # std 2 * 0.5 / 2 = 0.5


def test_the_noise_is_fresh_unless_a_noise_seed_fixes_it():
    # fresh noise from the OS: the run's seed (public, in summary.json) must not
    # let anyone regenerate and subtract it
    a = run(dp.DifferentialPrivacyServerSideFixedClipping(strategy(), 1.0, 1.0, 2))
    b = run(dp.DifferentialPrivacyServerSideFixedClipping(strategy(), 1.0, 1.0, 2))
    assert not np.array_equal(a.snapshots[2]["a"]["w"], b.snapshots[2]["a"]["w"])
    c = run(dp.DifferentialPrivacyServerSideFixedClipping(strategy(), 1.0, 1.0, 2, noise_seed=7))
    d = run(dp.DifferentialPrivacyServerSideFixedClipping(strategy(), 1.0, 1.0, 2, noise_seed=7))
    np.testing.assert_array_equal(c.snapshots[2]["a"]["w"], d.snapshots[2]["a"]["w"])


def test_every_assigned_model_is_noised_even_when_no_update_survives():
    # every update rejected by the norm bound: the aggregate is the old model, and
    # a noiseless output would tell that apart from a neighbour's noisy one
    s = strategy(max_update_norm=0.5)  # updates have norms 3 and 6
    out = run(dp.DifferentialPrivacyServerSideFixedClipping(s, 1.0, 1.0, 2), rounds=1)
    assert out.rows(1)["a"]["uploads"] == 0
    assert not np.all(out.snapshots[1]["a"]["w"] == 0.0)
    assert out.result.privacy["a"]["releases"] == 1


# --------------------------------------------------------------- accounting
def _exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """The tight epsilon of a Gaussian mechanism with ``mu = sensitivity / sigma``
    (Balle and Wang 2018: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)),
    by bisection."""

    def phi(x):
        return 0.5 * math.erfc(-x / math.sqrt(2))

    def d(eps):
        return phi(-eps / mu + mu / 2) - math.exp(eps) * phi(-eps / mu - mu / 2)

    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize("z,rounds", [(1.0, 1), (1.0, 10), (2.5, 50)])
def test_accounted_epsilon_lies_between_the_exact_value_and_the_classic_rdp_bound(z, rounds):
    delta = 1e-5
    got = dp.epsilon(z, [1.0] * rounds, delta)
    # T compositions of a Gaussian mechanism: one Gaussian with mu = sqrt(T) / z
    exact = _exact_gaussian_epsilon(math.sqrt(rounds) / z, delta)
    # RDP of order a: T a / (2 z^2); classic conversion eps = rdp + log(1/delta) / (a - 1)
    classic = min(
        rounds * a / (2 * z * z) + math.log(1 / delta) / (a - 1)
        for a in np.linspace(1.01, 200, 20000)
    )
    assert exact <= got <= classic * (1 + 1e-6)
    assert got < 1.5 * exact  # and RDP is not far from tight here


def test_subsampling_amplifies_and_more_rounds_spend_more():
    assert dp.epsilon(1.0, [0.1] * 10, 1e-5) < dp.epsilon(1.0, [1.0] * 10, 1e-5)
    assert dp.epsilon(1.0, [0.1] * 10, 1e-5) < dp.epsilon(1.0, [0.1] * 20, 1e-5)
    assert dp.epsilon(1.0, [], 1e-5) == 0.0


def test_the_run_records_each_models_privacy():
    s = strategy()
    w = dp.DifferentialPrivacyServerSideFixedClipping(
        s, 1.2, 1.0, {"a": 1, "b": 2}, amplification=True, delta=1e-6
    )
    out = run(w, rounds=3)
    pa, pb = out.result.privacy["a"], out.result.privacy["b"]
    assert pa["releases"] == pb["releases"] == 3 and pa["delta"] == 1e-6
    # model a samples 1 of 2 holders (q 1/2), model b both (q 1: no amplification)
    assert pa["epsilon"] == pytest.approx(dp.epsilon(1.2, [0.5] * 3, 1e-6))
    assert pb["epsilon"] == pytest.approx(dp.epsilon(1.2, [1.0] * 3, 1e-6))
    assert pa["epsilon"] < pb["epsilon"]
    logged = [m for m in out.infos(3) if m.startswith("DP: model 'a': epsilon")]
    assert logged


# ---------------------------------------------------------------- adaptive
def test_adaptive_norm_grows_when_updates_are_clipped_and_shrinks_when_not():
    grow = dp.DifferentialPrivacyServerSideAdaptiveClipping(
        strategy(), 0.0, 2, initial_clipping_norm=1.0, clip_norm_lr=0.2, target_clipped_quantile=0.5
    )
    run(grow, rounds=2)
    # both updates (norms 3 and 6) above C in both rounds: C = exp(0.2 * (1 - 0.5)) ** 2
    assert grow.clipping_norms["a"] == pytest.approx(math.exp(0.2))
    shrink = dp.DifferentialPrivacyServerSideAdaptiveClipping(
        strategy(), 0.0, 2, initial_clipping_norm=100.0, clip_norm_lr=0.2
    )
    run(shrink, rounds=1)
    assert shrink.clipping_norms["b"] == pytest.approx(100 * math.exp(-0.1))


def test_adaptive_splits_the_noise_between_updates_and_the_count():
    w = dp.DifferentialPrivacyServerSideAdaptiveClipping(
        strategy(), 1.0, 2, clipped_count_stddev=10.0
    )
    assert w.update_noise_multiplier == pytest.approx((1 - 1 / 400) ** -0.5)
    with pytest.raises(ValueError, match="clipped_count_stddev"):
        dp.DifferentialPrivacyServerSideAdaptiveClipping(strategy(), 1.0, 2)  # sigma_b 0.1


# --------------------------------------------------------------- bad input
def test_parameters_that_make_no_sense_are_one_clear_error():
    with pytest.raises(ValueError, match="noise_multiplier"):
        dp.DifferentialPrivacyServerSideFixedClipping(strategy(), -1.0, 1.0, 2)
    with pytest.raises(ValueError, match="clipping norm"):
        dp.DifferentialPrivacyServerSideFixedClipping(strategy(), 1.0, 0.0, 2)
    with pytest.raises(ValueError, match="num_sampled_clients"):
        dp.DifferentialPrivacyServerSideFixedClipping(strategy(), 1.0, 1.0, 0)
    with pytest.raises(TypeError, match="MultiModelStrategy"):
        dp.DifferentialPrivacyServerSideFixedClipping(FedAvg(), 1.0, 1.0, 2)
    s = strategy()
    with pytest.raises(HookError, match=r"configure_train.*more than the 2 clients"):
        run(dp.DifferentialPrivacyServerSideFixedClipping(s, 1.0, 1.0, 5), rounds=1)
    assert all(np.all(v == 0) for t in TASKS for v in s.weights[t].values())


# ------------------------------------------------------------------ resume
def test_resume_continues_the_noise_and_the_accountant(tmp_path):
    # (run_federation checks every round from 0, so the resumed run starts directly)
    def wrapped(path):
        s = strategy(checkpoint_path=str(path))
        return dp.DifferentialPrivacyServerSideAdaptiveClipping(
            s, 1.0, 2, initial_clipping_norm=1.0, clipped_count_stddev=5.0, noise_seed=3
        )

    whole = wrapped(tmp_path / "whole")
    full = run(whole, rounds=3)
    part = wrapped(tmp_path / "part")
    run(part, rounds=2)
    again = wrapped(tmp_path / "part")
    res = again.start(
        _grid(), zero_models(TASKS, SMALL), num_rounds=3, resume_from=str(tmp_path / "part")
    )
    for task in TASKS:
        np.testing.assert_array_equal(
            res.arrays[task]["w"].numpy(), full.result.arrays[task]["w"].numpy()
        )
        assert res.privacy[task] == full.result.privacy[task]
    plain = strategy()
    with pytest.raises(ValueError, match="wrapper_name"):
        plain.start(
            _grid(), zero_models(TASKS, SMALL), num_rounds=3, resume_from=str(tmp_path / "part")
        )
    # a checkpoint from before wrappers were recorded (no wrapper keys): a DP run
    # may not continue it (its earlier rounds had no noise)
    from mmfl_flwr.checkpoint import load_checkpoint, save_checkpoint

    old = load_checkpoint(str(tmp_path / "part"))
    for key in ("wrapper_name", "wrapper_config", "wrapper_state"):
        old.pop(key, None)
    save_checkpoint(str(tmp_path / "old"), old)
    with pytest.raises(ValueError, match="wrapper_name"):
        wrapped(tmp_path / "x").start(
            _grid(), zero_models(TASKS, SMALL), num_rounds=3, resume_from=str(tmp_path / "old")
        )


def _grid():
    from mmfl_flwr.grid import InProcessGrid

    grid = InProcessGrid(fake_client_app(CLIENTS), [])
    for label in CLIENTS:
        grid.add_node({"cid": label})
    return grid


def test_the_accountant_leaves_the_root_logger_alone():
    """dp-accounting warns through absl about excluded RDP orders (q = 0.5, z = 1
    does), which added a handler to the root logger, so every flwr log line of a
    DP run printed twice ("INFO:flwr:...")."""
    import logging

    saved = list(logging.root.handlers)
    logging.root.handlers[:] = []  # as in `mmfl run` (pytest's own capture handler aside)
    try:
        dp.epsilon(1.0, [0.5], 1e-5)
        assert logging.root.handlers == []
    finally:
        logging.root.handlers[:] = saved
