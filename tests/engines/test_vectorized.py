"""The vectorised engine computes what the per-client path computes.

Parity per model of the zoo (the batched ``torch.func`` training against
``TorchTrainer.train`` client by client, from the same weights and seeds, with
unequal dataset sizes so that clients stop at different steps), per message
type through the Grid, and for whole runs of several presets.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from mmfl_flwr.client import vectorized as V
from mmfl_flwr.client.trainer import TorchTrainer, default_device, initial_weights
from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.models import make_model
from mmfl_flwr.tasks.zoo import PreActResNet18

#: where TorchTrainer computes (CUDA when available), so both paths share a device
DEV = default_device()


@pytest.fixture(autouse=True)
def _no_tf32():
    """On a GPU, cuDNN convolutions default to TF32 (about 1e-3 relative per
    operation); parity is a float32 property, so TF32 is off in these tests."""
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def _datasets(shape, classes, sizes, seed=0, integer=False):
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        if integer:
            x = rng.integers(0, classes, size=(n, *shape)).astype(np.float32)
        else:
            x = rng.normal(size=(n, *shape)).astype(np.float32)
        out.append(Dataset(x, rng.integers(0, classes, size=n)))
    return out


def _update_gap(start, ref, got):
    """||Δ_vec - Δ_ref|| / ||Δ_ref|| over the floating-point entries, and whether
    every integer entry (batch-norm counters) is equal
    (:func:`mmfl_flwr.testing.parity.relative_update_gap`: inf when one differs)."""
    from mmfl_flwr.testing.parity import relative_update_gap

    gap = relative_update_gap(start, ref, got)
    return gap, math.isfinite(gap)


def _check_parity(model_fn, datasets, epochs, lr, batch, tol, seed=5):
    torch.set_num_threads(1)
    start = initial_weights(model_fn, seed)
    trainers = [TorchTrainer(model_fn, d, Dataset(d.x[:0], d.y[:0]), batch) for d in datasets]
    seeds = [1000 + 17 * i for i in range(len(datasets))]
    ref = [tr.train(start, epochs, lr, s, batch) for tr, s in zip(trainers, seeds)]
    ref_loss = [tr.loss(start) for tr in trainers]
    vm = V.VectorModel(model_fn, DEV)
    data = [V.ClientData(*tr.train_tensors()) for tr in trainers]
    got = V.batched_train(
        vm, start, [V.TrainJob(d, s) for d, s in zip(data, seeds)], epochs, lr, batch
    )
    got_loss = V.batched_losses(vm, start, data)
    for (rw, rn, rl), (gw, gn, gl), ql, gq in zip(ref, got, ref_loss, got_loss):
        assert gn == rn
        gap, ints_equal = _update_gap(start, rw, gw)
        assert gap <= tol, gap
        assert ints_equal
        assert gl == pytest.approx(rl, rel=tol)
        assert gq == pytest.approx(ql, rel=tol)
    return ref, got


def test_digits_cnn_parity_with_unequal_sizes():
    # sizes 5, 17, 33 with batch 8: 1, 3 and 5 steps per epoch
    _check_parity(
        lambda: make_model("digits"),
        _datasets((1, 8, 8), 10, [5, 17, 33]),
        epochs=3,
        lr=0.05,
        batch=8,
        tol=1e-5,
    )


def test_logistic_regression_parity():
    _check_parity(
        lambda: make_model("synthetic"),
        _datasets((60,), 5, [40, 9, 23]),
        epochs=4,
        lr=0.05,
        batch=8,
        tol=1e-5,
    )


def test_image_cnn_parity():
    # the papers' CNN for 28x28 inputs (1.6M parameters)
    _check_parity(
        lambda: make_model("mnist"),
        _datasets((1, 28, 28), 10, [6, 11]),
        epochs=2,
        lr=0.02,
        batch=4,
        tol=1e-5,
    )


@pytest.mark.slow
def test_char_lstm_parity():
    # on CUDA the LSTM runs step by step under vmap (see the next test)
    _check_parity(
        lambda: make_model("shakespeare"),
        _datasets((80,), 80, [5, 9], integer=True),
        epochs=2,
        lr=0.5,
        batch=4,
        tol=1e-5,
    )


def test_step_by_step_lstm_equals_the_fused_one():
    from mmfl_flwr.tasks.zoo import lstm_last_hidden

    torch.manual_seed(0)
    model = make_model("shakespeare")
    x = torch.randint(0, 80, (3, 80))
    fused = model(x)
    model.unfused = True
    stepped = model(x)
    torch.testing.assert_close(stepped, fused, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="batch-first"):
        lstm_last_hidden(torch.nn.LSTM(4, 5), torch.zeros(2, 3, 4))


@pytest.mark.slow
def test_step_by_step_lstm_training_parity():
    # the CUDA path (recurrence step by step under vmap), forced on this device
    model_fn = lambda: make_model("shakespeare")  # noqa: E731
    data = _datasets((80,), 80, [5, 9], integer=True)
    start = initial_weights(model_fn, 5)
    trainers = [TorchTrainer(model_fn, d, d, 4) for d in data]
    ref = [tr.train(start, 2, 0.5, 100 + i, 4) for i, tr in enumerate(trainers)]
    vm = V.VectorModel(model_fn, DEV)
    vm.step_by_step = True
    got = V.batched_train(
        vm,
        start,
        [V.TrainJob(V.ClientData(*tr.train_tensors()), 100 + i) for i, tr in enumerate(trainers)],
        2,
        0.5,
        4,
    )
    assert not vm.base.unfused  # switched back after training
    for (rw, _, rl), (gw, _, gl) in zip(ref, got):
        gap, _ = _update_gap(start, rw, gw)
        assert gap <= 1e-5, gap
        assert gl == pytest.approx(rl, rel=1e-5)


def test_resnet_float32_single_step_parity():
    # one full-batch step per client: float32 rounding only
    _check_parity(
        lambda: PreActResNet18(10),
        _datasets((3, 8, 8), 10, [6, 9]),
        epochs=1,
        lr=0.05,
        batch=16,
        tol=1e-5,
    )


@pytest.mark.slow
def test_resnet_float64_parity_keeps_per_client_batch_norm_statistics():
    # several steps, unequal sizes, batch norm: in float64 the two paths agree to
    # rounding, so the batched algorithm is the per-client one (in float32 the
    # rounding differences of batched convolutions grow over steps through batch
    # norm, as between any two float32 implementations)
    def model_fn():
        return PreActResNet18(10).double()

    ref, got = _check_parity(
        model_fn, _datasets((3, 12, 12), 10, [6, 5, 8]), epochs=2, lr=0.05, batch=3, tol=1e-9
    )
    # each client keeps its own running statistics
    key = "layer1.0.bn1.running_mean"
    assert not np.allclose(got[0][0][key], got[1][0][key])
    for (rw, *_), (gw, *_) in zip(ref, got):
        np.testing.assert_allclose(gw[key], rw[key], rtol=1e-9, atol=1e-12)
        assert int(gw["layer1.0.bn1.num_batches_tracked"]) == int(
            rw["layer1.0.bn1.num_batches_tracked"]
        )


def test_a_client_out_of_batches_stops_exactly():
    # a 2-sample client next to a 40-sample one: 1 step against 10 per epoch;
    # its result equals training it alone
    def model_fn():
        return make_model("synthetic")

    small, big = _datasets((60,), 5, [2, 40], seed=3)
    start = initial_weights(model_fn, 1)
    alone = TorchTrainer(model_fn, small, Dataset(small.x[:0], small.y[:0]), 4)
    w_alone, _, loss_alone = alone.train(start, 3, 0.1, 11, 4)
    vm = V.VectorModel(model_fn, DEV)
    jobs = [
        V.TrainJob(V.ClientData(*alone.train_tensors()), 11),
        V.TrainJob(V.ClientData(*TorchTrainer(model_fn, big, big, 4).train_tensors()), 12),
    ]
    (w_vec, _, loss_vec), _ = V.batched_train(vm, start, jobs, 3, 0.1, 4)
    gap, _ = _update_gap(start, w_alone, w_vec)
    assert gap < 1e-6
    assert loss_vec == pytest.approx(loss_alone, rel=1e-6)


def test_chunking_does_not_change_results():
    def model_fn():
        return make_model("digits")

    data = _datasets((1, 8, 8), 10, [9, 14, 3, 20, 11])
    start = initial_weights(model_fn, 2)
    vm = V.VectorModel(model_fn, DEV)
    jobs = [
        V.TrainJob(V.ClientData(torch.tensor(d.x).to(DEV), torch.tensor(d.y).to(DEV)), i)
        for i, d in enumerate(data)
    ]
    whole = V.batched_train(vm, start, jobs, 2, 0.05, 4)
    pieces = V.batched_train(vm, start, jobs, 2, 0.05, 4, chunk=2)
    for (a, na, la), (b, nb, lb) in zip(whole, pieces):
        assert na == nb
        gap, _ = _update_gap(start, a, b)
        assert gap < 1e-5
        assert lb == pytest.approx(la, rel=1e-5)


def test_chunks_group_clients_of_similar_size():
    # sorted by size; the 100-sample client would make the call compute
    # 4 * 100 = 400 samples for 1 + 2 + 3 + 100 = 106 real ones: it goes alone
    assert V.chunks_by_size([100, 2, 3, 1], batch_size=1000, chunk=64) == [[3, 1, 2], [0]]
    # with batch 2 every client takes ceil(n/2) steps of width 2
    assert V.chunks_by_size([4, 4, 4], batch_size=2, chunk=2) == [[0, 1], [2]]
    sizes = list(np.random.default_rng(0).integers(1, 500, size=50))
    parts = V.chunks_by_size(sizes, batch_size=10000, chunk=8)
    assert sorted(i for p in parts for i in p) == list(range(50))
    assert all(len(p) <= 8 for p in parts)
    for p in parts:
        if len(p) > 1:
            assert len(p) * max(sizes[i] for i in p) <= 1.5 * sum(sizes[i] for i in p)


def test_loss_queries_reuse_the_concatenated_data_only_while_it_is_the_same():
    model_fn = lambda: make_model("synthetic")  # noqa: E731
    vm = V.VectorModel(model_fn, DEV)
    w = initial_weights(model_fn, 0)
    tensors = [
        (torch.randn(n, 60, device=DEV), torch.randint(0, 5, (n,), device=DEV)) for n in (3, 5)
    ]
    first = V.batched_losses(vm, w, [V.ClientData(*t) for t in tensors])
    cached = vm.loss_cache._value
    # new wrappers of the same tensors (what the Grid builds each round): reused
    again = V.batched_losses(vm, w, [V.ClientData(*t) for t in tensors])
    assert vm.loss_cache._value is cached and again == first
    # other data: rebuilt, and the losses are those of the new data
    other = [(t[0] + 1.0, t[1]) for t in tensors]
    moved = V.batched_losses(vm, w, [V.ClientData(*t) for t in other])
    assert vm.loss_cache._value is not cached
    fresh = V.VectorModel(model_fn, DEV)
    assert moved == pytest.approx(V.batched_losses(fresh, w, [V.ClientData(*t) for t in other]))


def test_batched_evaluate_matches_per_client_evaluate():
    def model_fn():
        return make_model("digits")

    trains = _datasets((1, 8, 8), 10, [12, 30], seed=1)
    tests = _datasets((1, 8, 8), 10, [7, 0], seed=2)  # the second falls back to train data
    start = initial_weights(model_fn, 4)
    trainers = [TorchTrainer(model_fn, a, b, 8) for a, b in zip(trains, tests)]
    vm = V.VectorModel(model_fn, DEV)
    got = V.batched_evaluate(vm, start, [V.ClientData(*t.eval_tensors()) for t in trainers])
    for tr, (loss, acc, n) in zip(trainers, got):
        r_loss, r_acc, r_n = tr.evaluate(start)
        assert n == r_n
        assert loss == pytest.approx(r_loss, rel=1e-6)
        assert acc == pytest.approx(r_acc)


def test_fused_recurrent_models_are_not_vectorised_on_cuda():
    # checked without a GPU: the reason depends on the device type only
    plain = torch.nn.Sequential(torch.nn.LSTM(4, 5, batch_first=True))
    assert "vmap on CUDA" in V.unsupported_reason(plain, "cuda")
    assert V.unsupported_reason(plain, "cpu") is None
    # the zoo's char-LSTM can run its recurrence step by step
    assert V.unsupported_reason(make_model("shakespeare"), "cuda") is None
    assert V.unsupported_reason(make_model("digits"), "cuda") is None


def test_bad_arguments_are_refused():
    vm = V.VectorModel(lambda: make_model("synthetic"), DEV)
    start = initial_weights(lambda: make_model("synthetic"), 1)
    job = [
        V.TrainJob(
            V.ClientData(
                torch.zeros(3, 60, device=DEV), torch.zeros(3, dtype=torch.long, device=DEV)
            ),
            1,
        )
    ]
    with pytest.raises(ValueError, match="epochs"):
        V.batched_train(vm, start, job, 0, 0.1, 2)
    with pytest.raises(ValueError, match="chunk"):
        V.batched_train(vm, start, job, 1, 0.1, 2, chunk=0)
    with pytest.raises(KeyError, match="mismatch"):
        V.batched_train(vm, {"linear.weight": start["linear.weight"]}, job, 1, 0.1, 2)


# ----------------------------------------------------------------- through the Grid
def _grids(num_clients=6, seed=0):
    """One node per client (``plain``) and the vectorized engine's layout, one shard
    node hosting every client (``vec``), on the in-process grid; the shard node's
    clients are the same cached ClientSpecs as ``plain``'s nodes."""
    from flwr.app import Context, RecordDict

    from mmfl_flwr.client.app import cache_specs, make_client_app
    from mmfl_flwr.config import Settings
    from mmfl_flwr.flower_app.client_app import node_spec_fn
    from mmfl_flwr.grid import InProcessGrid
    from mmfl_flwr.runner import node_configs

    s = Settings(num_clients=num_clients, seed=seed, output_dir="")
    spec = cache_specs(node_spec_fn(s))
    app = make_client_app(spec, cached=True)
    configs = node_configs(s)
    plain = InProcessGrid(app, configs, s.to_run_config(), seed=seed)

    def every_client(ctx):
        return [
            spec(Context(ctx.run_id, ctx.node_id, dict(c), RecordDict(), dict(ctx.run_config)))
            for c in configs
        ]

    shard = make_client_app(cache_specs(every_client), cached=True)
    vec = InProcessGrid(shard, [{"clients": f"0-{num_clients - 1}"}], s.to_run_config(), seed=seed)
    return s, spec, plain, vec


def _plain_and_shard(plain, vec, spec, mtype, records, config=None, extra=None):
    """The replies of one node per client (``plain``) and of the one node that
    hosts them all (``vec``, one merged message), as per-client contents in the
    order of ``plain``'s nodes."""
    from flwr.app import ConfigRecord, RecordDict

    from mmfl_flwr import protocol as P

    a = [
        r.content
        for r in plain.send_and_receive(_messages(plain, spec, mtype, records, config, extra))
    ]
    content, order = RecordDict(), []
    for nid in plain.get_node_ids():
        cs = spec(plain.context(nid))
        order.append(cs.client_id)
        for t in cs.trainers:
            content[P.arrays_key(t)] = records[t]
            for key, rec in (extra or {}).items():
                if key.split(".", 1)[1] == t:
                    content[key] = rec
        cfg = ConfigRecord(dict(config or {}))
        cfg[P.CFG_TASKS] = list(cs.trainers)
        content[P.client_key(P.CONFIG_KEY, cs.client_id)] = cfg
    [node] = vec.get_node_ids()
    [reply] = vec.send_and_receive([vec.create_message(content, mtype, node, "1")])
    per = {}
    for key, rec in reply.content.items():
        base, cid = P.split_client_key(key)
        per.setdefault(cid, RecordDict())[base] = rec
    assert set(per) == set(order)
    return a, [per[c] for c in order]


def _messages(grid, spec, mtype, records, config=None, extra=None):
    from flwr.app import ConfigRecord, RecordDict

    from mmfl_flwr import protocol as P

    out = []
    for nid in grid.get_node_ids():
        tasks = spec(grid.context(nid)).trainers
        content = RecordDict({P.arrays_key(t): records[t] for t in tasks})
        if config:
            content[P.CONFIG_KEY] = ConfigRecord(config)
        for key, rec in (extra or {}).items():
            if key.split(".", 1)[1] in tasks:
                content[key] = rec
        out.append(grid.create_message(content, mtype, nid, "1"))
    return out


def _initial_records(spec_settings):
    from mmfl_flwr.flower_app.data import federation_for
    from mmfl_flwr.records import numpy_to_arrays

    fed = federation_for(spec_settings)
    return {
        t: numpy_to_arrays(initial_weights(lambda k=fed.kinds[t]: make_model(k), 1))
        for t in fed.tasks
    }


#: Through the Grid, on the embedded digits data: clients are batched with others,
#: so their float32 rounding differs from training alone; the digits images hold
#: integer pixel values, whose exact ties in max-pooling and zeros at ReLU kinks a
#: rounding difference can break the other way (a different, equally valid
#: subgradient). One client of 18 measured 4.3e-5, the others 2e-7; on
#: continuous data (the per-model tests above) every client is within 1e-5.
GRID_TOL = 1e-4


def _assert_replies_equal(a_replies, b_replies, starts=None, tol=GRID_TOL):
    from mmfl_flwr.records import arrays_to_numpy

    assert len(a_replies) == len(b_replies) > 0
    for a, b in zip(a_replies, b_replies):
        assert set(a.keys()) == set(b.keys())
        for key, rec in a.metric_records.items():
            assert set(rec) == set(b[key])
            for name, value in rec.items():
                assert b[key][name] == pytest.approx(value, rel=tol, abs=1e-7)
        for key, rec in a.array_records.items():
            mine, theirs = arrays_to_numpy(rec), arrays_to_numpy(b[key])
            task = key.split(".", 1)[1]
            if key.startswith("arrays.") and starts is not None:
                # the update (new - sent weights) agrees to rounding
                gap, ints_equal = _update_gap(arrays_to_numpy(starts[task]), mine, theirs)
                assert gap <= tol and ints_equal, (key, gap)
            else:
                for k in mine:
                    np.testing.assert_allclose(theirs[k], mine[k], rtol=tol, atol=1e-7)


@pytest.mark.parametrize("mtype", ["query.losses", "train", "evaluate"])
def test_grid_replies_equal_the_client_app_replies(mtype):
    from mmfl_flwr import protocol as P

    s, spec, plain, vec = _grids()
    records = _initial_records(s)
    config = {P.CFG_EPOCHS: 2, P.CFG_LR: 0.05, P.CFG_BATCH_SIZE: 16, P.CFG_SEED: 1, P.CFG_ROUND: 3}
    a, b = _plain_and_shard(plain, vec, spec, mtype, records, config)
    _assert_replies_equal(a, b, records)
    assert vec.client_app.shard().counts == {"vectorized": len(b), "per-client": 0}


def test_scaffold_messages_take_the_per_client_path_with_one_log_line(caplog):
    from flwr.app import MessageType

    from mmfl_flwr import protocol as P
    from mmfl_flwr.records import arrays_to_numpy, numpy_to_arrays

    s, spec, plain, vec = _grids(num_clients=4)
    records = _initial_records(s)
    zeros = {
        P.control_key(t): numpy_to_arrays(
            {k: np.zeros_like(v) for k, v in arrays_to_numpy(r).items()}
        )
        for t, r in records.items()
    }
    config = {P.CFG_EPOCHS: 1, P.CFG_LR: 0.05, P.CFG_BATCH_SIZE: 16, P.CFG_SEED: 1, P.CFG_ROUND: 1}
    with caplog.at_level(logging.INFO, logger="mmfl_flwr"):
        a, b = _plain_and_shard(plain, vec, spec, MessageType.TRAIN, records, config, zeros)
        _plain_and_shard(plain, vec, spec, MessageType.TRAIN, records, config, zeros)
    _assert_replies_equal(a, b, records)
    assert vec.client_app.shard().counts["vectorized"] == 0
    said = [r.getMessage() for r in caplog.records if "SCAFFOLD" in r.getMessage()]
    assert len(said) == 1 and "per-client path" in said[0]


# --------------------------------------------------------------------- whole runs
def _run(engine, threads=None, **kw):
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run

    base = dict(num_clients=6, num_rounds=2, local_epochs=2, lr=0.05, seed=4, output_dir="")
    base.update(kw)
    return run(Settings(**base), engine=engine, **({} if threads is None else {"threads": threads}))


@pytest.mark.parametrize("strategy", ["mfa-rr", "lvr", "fedvarp", "scaffold"])
def test_whole_runs_match_the_in_process_engine(strategy):
    from mmfl_flwr.config import Settings
    from mmfl_flwr.flower_app.data import federation_for

    a = _run("inprocess", strategy=strategy)
    b = _run("vectorized", strategy=strategy)
    fed = federation_for(Settings(num_clients=6, seed=4))
    tests = {t: len(fed.server_test(t)) for t in fed.tasks}
    assert a.assignments == b.assignments
    assert len(a.history) == len(b.history)
    for ra, rb in zip(a.history, b.history):
        assert (ra["round"], ra["task"]) == (rb["round"], rb["task"])
        # float32 rounding differences of the batched kernels (1e-7 per step)
        # compound over the rounds' local steps and the unbiased 1/(B p) weights;
        # the picks (assignments) must be identical. Accuracy is a count: near
        # chance a prediction on a tie can flip, so it may differ by 2 of the
        # task's server test examples
        for key, tol in (("loss", 1e-3), ("train_loss", 1e-3), ("accuracy", 2 / tests[ra["task"]])):
            x, y = ra.get(key), rb.get(key)
            if isinstance(x, float) and not math.isnan(x):
                assert y == pytest.approx(x, rel=tol, abs=tol), (key, ra["round"])


def test_one_seed_fixes_a_vectorized_run():
    """Bit for bit with the threads fixed: --threads auto follows the load of the
    machine, and float32 sums split over another number of threads round
    differently (within the engines' parity, not bit for bit)."""
    a = _run("vectorized", threads=2, strategy="lvr", seed=9)
    b = _run("vectorized", threads=2, strategy="lvr", seed=9)
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in a.history]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in b.history]
    assert a.assignments == b.assignments


@pytest.mark.slow
def test_every_preset_runs_on_the_vectorized_engine():
    from mmfl_flwr.presets import PRESETS

    for strategy in sorted(PRESETS):
        result = _run("vectorized", strategy=strategy, num_rounds=2, local_epochs=1)
        final = result.final()
        assert set(final) == {"digits", "synthetic", "digits_2"}, strategy
        assert all(math.isfinite(r["accuracy"]) for r in final.values()), strategy


def test_cli_runs_the_vectorized_engine_and_refuses_a_misplaced_chunk(tmp_path, capsys):
    from mmfl_flwr.cli import main

    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--engine",
                "vectorized",
                "--vector-chunk",
                "2",
                "--num-clients",
                "4",
                "--num-rounds",
                "1",
                "--local-epochs",
                "1",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    assert (out / "metrics.csv").is_file()
    with pytest.raises(SystemExit) as err:
        main(["run", "--engine", "inprocess", "--vector-chunk", "2", "--output-dir", ""])
    assert err.value.code == 2
    assert "--vector-chunk applies to --engine vectorized only" in capsys.readouterr().err


# ------------------------------------------------------------- the trainer contract
class _Delegate:
    """A user's trainer that is no TorchTrainer: it delegates the LocalTrainer
    calls to one, and (``vectorizable``) declares the fast-path contract too."""

    def __init__(self, inner, vectorizable):
        self._inner = inner
        if vectorizable:
            self.model_fn, self.device = inner.model_fn, inner.device
            self.train_tensors, self.eval_tensors = inner.train_tensors, inner.eval_tensors

    num_examples = property(lambda self: self._inner.num_examples)
    trainable_keys = property(lambda self: self._inner.trainable_keys)

    def train(self, weights, epochs, lr, seed, batch_size=None, correction=None):
        return self._inner.train(weights, epochs, lr, seed, batch_size, correction)

    def loss(self, weights):
        return self._inner.loss(weights)

    def evaluate(self, weights):
        return self._inner.evaluate(weights)


@pytest.mark.parametrize("vectorizable", [True, False])
def test_any_trainer_with_the_vectorizable_contract_takes_the_fast_path(vectorizable, caplog):
    from mmfl_flwr import protocol as P
    from mmfl_flwr.client.contract import LocalTrainer, VectorizableTrainer

    s, spec, plain, vec = _grids(num_clients=4)
    for nid in plain.get_node_ids():  # the same cached specs serve both grids
        cs = spec(plain.context(nid))
        cs.trainers.update({t: _Delegate(tr, vectorizable) for t, tr in cs.trainers.items()})
    some = next(iter(spec(plain.context(plain.get_node_ids()[0])).trainers.values()))
    assert isinstance(some, LocalTrainer) and type(some) is _Delegate
    assert isinstance(some, VectorizableTrainer) is vectorizable
    records = _initial_records(s)
    config = {P.CFG_EPOCHS: 1, P.CFG_LR: 0.05, P.CFG_BATCH_SIZE: 16, P.CFG_SEED: 2, P.CFG_ROUND: 1}
    with caplog.at_level(logging.INFO, logger="mmfl_flwr"):
        a, b = _plain_and_shard(plain, vec, spec, "train", records, config)
    _assert_replies_equal(a, b, records)
    if vectorizable:
        assert vec.client_app.shard().counts == {"vectorized": len(b), "per-client": 0}
    else:
        assert vec.client_app.shard().counts == {"vectorized": 0, "per-client": len(b)}
        said = [r.getMessage() for r in caplog.records if "_Delegate" in r.getMessage()]
        assert len(said) == 1 and "vectorizable contract" in said[0]


def test_scaffold_with_a_trainer_that_takes_no_correction_is_an_error_reply():
    from flwr.app import MessageType

    from mmfl_flwr import protocol as P
    from mmfl_flwr.client.contract import takes_correction
    from mmfl_flwr.records import arrays_to_numpy, numpy_to_arrays

    class NoCorrection(_Delegate):
        def train(self, weights, epochs, lr, seed, batch_size=None):
            return self._inner.train(weights, epochs, lr, seed, batch_size)

    s, spec, plain, _ = _grids(num_clients=2)
    for nid in plain.get_node_ids():
        cs = spec(plain.context(nid))
        cs.trainers.update({t: NoCorrection(tr, False) for t, tr in cs.trainers.items()})
    records = _initial_records(s)
    assert not takes_correction(NoCorrection(None, False))
    assert takes_correction(_Delegate(None, False))
    zeros = {
        P.control_key(t): numpy_to_arrays(
            {k: np.zeros_like(v) for k, v in arrays_to_numpy(r).items()}
        )
        for t, r in records.items()
    }
    replies = list(
        plain.send_and_receive(
            _messages(
                plain,
                spec,
                MessageType.TRAIN,
                records,
                {P.CFG_EPOCHS: 1, P.CFG_LR: 0.05, P.CFG_BATCH_SIZE: 16},
                zeros,
            )
        )
    )
    assert replies and all(r.has_error() for r in replies)
    assert "correction=" in replies[0].error.reason


class _CellNet(torch.nn.Module):
    """An nn.LSTMCell over the 4 features of each of 3 steps: plain autograd has no
    batching rule for its fused kernel under vmap, functorch's grad loops."""

    def __init__(self):
        super().__init__()
        self.cell = torch.nn.LSTMCell(4, 6)
        self.out = torch.nn.Linear(6, 3)

    def forward(self, x):
        h = c = x.new_zeros(x.shape[0], 6)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        return self.out(h)


def test_a_model_without_a_batching_rule_under_autograd_trains_with_functorch():
    _check_parity(_CellNet, _datasets((3, 4), 3, [5, 9]), epochs=2, lr=0.1, batch=4, tol=1e-5)
    vm = V.VectorModel(_CellNet, DEV)
    data = _datasets((3, 4), 3, [5, 9])
    V.batched_train(
        vm,
        initial_weights(_CellNet, 0),
        [
            V.TrainJob(
                V.ClientData(torch.as_tensor(d.x, device=DEV), torch.as_tensor(d.y, device=DEV)), i
            )
            for i, d in enumerate(data)
        ],
        1,
        0.1,
        4,
    )
    assert vm.grad_modes == {vm.step_by_step: "functorch"}
    cnn = V.VectorModel(lambda: make_model("synthetic"), DEV)
    d = _datasets((60,), 5, [7])[0]
    V.batched_train(
        cnn,
        initial_weights(lambda: make_model("synthetic"), 0),
        [
            V.TrainJob(
                V.ClientData(torch.as_tensor(d.x, device=DEV), torch.as_tensor(d.y, device=DEV)), 0
            )
        ],
        1,
        0.1,
        4,
    )
    assert cnn.grad_modes == {cnn.step_by_step: "autograd"}


def test_batched_training_trains_under_an_outer_no_grad():
    model_fn = lambda: make_model("synthetic")  # noqa: E731
    data = _datasets((60,), 5, [12, 7])
    start = initial_weights(model_fn, 3)
    jobs = [
        V.TrainJob(
            V.ClientData(torch.as_tensor(d.x, device=DEV), torch.as_tensor(d.y, device=DEV)), 40 + i
        )
        for i, d in enumerate(data)
    ]
    free = V.batched_train(V.VectorModel(model_fn, DEV), start, jobs, 2, 0.1, 4)
    with torch.no_grad():
        held = V.batched_train(V.VectorModel(model_fn, DEV), start, jobs, 2, 0.1, 4)
    for (fw, _, fl), (hw, _, hl) in zip(free, held):
        assert fl == hl
        for k in fw:
            assert np.array_equal(fw[k], hw[k]), k
            assert not np.array_equal(fw[k], start[k]), k


def test_a_model_with_nothing_trainable_keeps_its_weights():
    def frozen():
        m = make_model("synthetic")
        for p in m.parameters():
            p.requires_grad_(False)
        return m

    data = _datasets((60,), 5, [6, 9])
    start = initial_weights(frozen, 1)
    got = V.batched_train(
        V.VectorModel(frozen, DEV),
        start,
        [
            V.TrainJob(
                V.ClientData(torch.as_tensor(d.x, device=DEV), torch.as_tensor(d.y, device=DEV)), i
            )
            for i, d in enumerate(data)
        ],
        1,
        0.1,
        4,
    )
    for (w, n, loss), d in zip(got, data):
        assert n == len(d.y) and math.isfinite(loss)
        for k in start:
            assert np.array_equal(w[k], start[k]), k
