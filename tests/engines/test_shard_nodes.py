"""A node of the Flower app hosting a shard of the federation's clients (node
config ``clients="0-2"``, issue 24): the same run as one node per client, with
real torch training on the embedded synthetic tasks; bad ``clients`` values are one line."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app.client_app import build_client_app, client_spec, parse_clients
from mmfl_flwr.flower_app.server_app import server_main, strategy_from_settings
from mmfl_flwr.grid import InProcessGrid
from mmfl_flwr.runner import node_configs


def test_clients_values_parse_as_ranges_and_ids():
    assert parse_clients("0-3", 10) == [0, 1, 2, 3]
    assert parse_clients("0,3,7", 10) == [0, 3, 7]
    assert parse_clients(" 0-1, 5 ", 10) == [0, 1, 5]
    assert parse_clients(4, 10) == [4]


@pytest.mark.parametrize(
    "raw,words",
    [
        ("a-b", "expected partition ids or ranges"),
        ("3-1", "expected partition ids"),
        ("", "expected partition ids"),
        ("0-12", "12 is outside the federation of num-clients=10"),
        ("0-9999999999", "9999999999 is outside the federation"),
        ("1,1", "names a client twice"),
    ],
)
def test_a_clients_value_that_does_not_parse_is_one_line(raw, words):
    with pytest.raises(ValueError, match=words) as err:
        parse_clients(raw, 10)
    assert "\n" not in str(err.value)


def test_a_shard_node_config_may_not_also_name_one_client():
    ctx = Context(
        run_id=1,
        node_id=1,
        node_config={"clients": "0-1", "partition-id": 0},
        state=RecordDict(),
        run_config={},
    )
    with pytest.raises(ValueError, match="both 'clients' and 'partition-id'"):
        client_spec(ctx, Settings(num_clients=4, tasks="synthetic"))


def _run(settings: Settings, nodes: list[dict], vectorize: bool = True):
    from mmfl_flwr.client.app import make_client_app
    from mmfl_flwr.flower_app.client_app import node_spec_fn

    app = (
        build_client_app(settings)
        if vectorize
        else make_client_app(node_spec_fn(settings), vectorize=False)
    )
    grid = InProcessGrid(app, nodes, settings.to_run_config(), seed=settings.seed)
    ctx = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=settings.to_run_config()
    )
    # the preset of the settings: its first round waits for num_clients clients,
    # however many nodes host them
    return server_main(grid, ctx, settings, strategy_from_settings(settings)), grid


_FED = dict(
    strategy="lvr",
    budget_fraction=0.5,
    num_clients=6,
    tasks="synthetic,synthetic",
    num_rounds=2,
    local_epochs=1,
    output_dir="",
    seed=3,
    synthetic_max_samples=50,
)
_SHARDS = [{"clients": "0-2"}, {"partition-id": 3, "num-partitions": 6}, {"clients": "4,5"}]


def test_shard_nodes_answering_client_by_client_equal_one_node_per_client_exactly():
    s = Settings(**_FED)
    single, _ = _run(s, node_configs(s))
    sharded, _ = _run(s, _SHARDS, vectorize=False)
    assert sharded.assignments == single.assignments
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in sharded.history] == [
        {k: v for k, v in r.items() if k != "seconds"} for r in single.history
    ]
    for task, rec in single.arrays.items():
        for k, v in rec.items():
            np.testing.assert_array_equal(sharded.arrays[task][k].numpy(), v.numpy())


def test_batched_shard_nodes_run_the_federation_as_one_node_per_client():
    from mmfl_flwr.flower_app.server_app import initial_arrays
    from mmfl_flwr.records import arrays_to_numpy
    from mmfl_flwr.testing.parity import run_gaps

    s = Settings(**_FED)
    single, _ = _run(s, node_configs(s))
    sharded, grid = _run(s, _SHARDS)
    assert grid.client_app.shard().counts["vectorized"] > 0
    assert sharded.assignments == single.assignments
    for a, b in zip(single.history, sharded.history):
        assert (a["round"], a["task"], a["uploads"]) == (b["round"], b["task"], b["uploads"])
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=0.02)

    def numpy(arrays):
        return {t: arrays_to_numpy(a) for t, a in arrays.items()}

    gaps = run_gaps(numpy(initial_arrays(s)), numpy(single.arrays), numpy(sharded.arrays))
    assert set(gaps) == set(single.arrays) and max(gaps.values()) <= 1e-5, gaps


def test_a_pickled_client_app_finds_its_process_state_again(tmp_path):
    """Flower's Ray backend pickles the ClientApp with every message it sends to
    a worker: the specs (the clients' data) are built once per process all the
    same, not once per message."""
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    from flwr.app import Message, MessageType

    from mmfl_flwr import protocol as P
    from mmfl_flwr.client.app import make_client_app
    from mmfl_flwr.flower_app.client_app import node_spec_fn
    from mmfl_flwr.grid import ensure_task_identity

    ensure_task_identity()
    s = Settings(num_clients=4, tasks="synthetic", synthetic_max_samples=30)
    inner = node_spec_fn(s)
    log = tmp_path / "built"  # a pickled copy of spec_fn writes here too

    def spec_fn(ctx):
        with open(log, "a") as f:
            f.write(f"{ctx.node_config['clients']}\n")
        return inner(ctx)

    app = make_client_app(spec_fn)
    ctx = Context(
        run_id=1,
        node_id=5,
        node_config={"clients": "0-3"},
        state=RecordDict(),
        run_config=s.to_run_config(),
    )
    for _ in range(3):
        copy = cloudpickle.loads(cloudpickle.dumps(app))
        msg = Message(RecordDict(), dst_node_id=5, message_type=MessageType.QUERY, group_id="1")
        msg.metadata.__dict__["_message_id"] = "m"
        msg.metadata.__dict__["_message_type"] = P.QUERY_INFO
        reply = copy(msg, ctx)
        assert len(reply.content.config_records) == 4
    assert log.read_text().splitlines() == ["0-3"]


def test_a_batched_shard_holds_no_model_per_client():
    """The batched path works on one stacked computation per model: after a run,
    no client of the shard has built a model of its own."""
    from mmfl_flwr.client.app import make_client_app
    from mmfl_flwr.flower_app.client_app import node_spec_fn

    s = Settings(**_FED)
    specs = {}
    inner = node_spec_fn(s)

    def spec_fn(ctx):
        specs[ctx.node_config["clients"]] = out = inner(ctx)
        return out

    grid = InProcessGrid(
        make_client_app(spec_fn), [{"clients": "0-5"}], s.to_run_config(), seed=s.seed
    )
    ctx = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=s.to_run_config()
    )
    server_main(grid, ctx, s, strategy_from_settings(s))
    trainers = [tr for spec in specs["0-5"] for tr in spec.trainers.values()]
    # no network per client: the trainers of a model share one per thread (and the
    # shard's batched kernels need none of them)
    from mmfl_flwr.client.trainer import _NETS

    fns = {tr.model_fn for tr in trainers}
    assert len(trainers) == 12 and sum(len(_NETS.get(f, {})) for f in fns) <= len(fns)


def test_a_torch_trainer_subclass_with_its_own_training_is_not_batched(caplog):
    """A trainer_fn may return a TorchTrainer subclass that trains its own way:
    a shard node runs its loop (per-client path, one log line), not plain SGD."""

    from mmfl_flwr.client.trainer import TorchTrainer
    from mmfl_flwr.client.trainer import torch_trainer_override as _overrides_torch_trainer

    class Proximal(TorchTrainer):
        def train(self, weights, epochs, lr, seed, batch_size=None, correction=None):
            return super().train(weights, epochs, lr, seed, batch_size, correction)

    class Plain(TorchTrainer):
        pass

    assert _overrides_torch_trainer(object()) == ""
    assert _overrides_torch_trainer(Plain.__new__(Plain)) == ""
    assert _overrides_torch_trainer(Proximal.__new__(Proximal)) == "train"
    from mmfl_flwr.client.shard import ShardComputer
    from mmfl_flwr.flower_app.data import federation_for
    from mmfl_flwr.tasks.models import make_model

    s = Settings(**_FED)
    train, test = federation_for(s).client_data(0, "synthetic")
    trainer = Proximal(lambda: make_model("synthetic"), train, test, 8)
    comp = ShardComputer()
    spec = type("S", (), {"trainers": {"t": trainer}})()
    with pytest.raises(Exception, match="overrides TorchTrainer.train"):
        comp._plan(spec, ["t"], False, "train")
    plain = Plain(lambda: make_model("synthetic"), train, test, 8)
    assert set(comp._plan(type("S", (), {"trainers": {"t": plain}})(), ["t"], False, "train")) == {
        "t"
    }


def test_the_contract_is_checked_once_per_trainer(monkeypatch):
    """The batched-path checks (the runtime Protocol's isinstance, the TorchTrainer
    overrides) run once per trainer object, not once per client part of every
    message; the answer is the same every time, with the task's name in it; a
    trainer that cannot be weakly referenced is checked every time and still
    answered."""
    import mmfl_flwr.client.shard as S
    import mmfl_flwr.client.trainer as T
    from mmfl_flwr.client.trainer import TorchTrainer
    from mmfl_flwr.flower_app.data import federation_for
    from mmfl_flwr.tasks.models import make_model

    calls = []
    original = T.torch_trainer_override
    monkeypatch.setattr(T, "torch_trainer_override", lambda tr: calls.append(tr) or original(tr))

    class Proximal(TorchTrainer):
        def loss(self, weights):
            return super().loss(weights)

    train, test = federation_for(Settings(**_FED)).client_data(0, "synthetic")
    plain = TorchTrainer(lambda: make_model("synthetic"), train, test, 8)
    prox = Proximal(lambda: make_model("synthetic"), train, test, 8)
    comp = S.ShardComputer()
    for _ in range(3):
        assert comp._why_not_batched(plain) == ""
        why = comp._why_not_batched(prox)
        assert why.format(task=repr("t")) == (
            "task 't': Proximal overrides TorchTrainer.loss "
            "(its own loop runs, not the batched SGD)"
        )
    assert calls == [plain, prox]

    class Slotted:  # no __weakref__: not cached, still answered
        __slots__ = ()

    for _ in range(2):
        assert comp._why_not_batched(Slotted()).format(task="'t'") == (
            "task 't' has a trainer without the vectorizable contract (Slotted)"
        )


def test_one_clients_bad_train_config_fails_it_alone():
    """A clipping norm that makes no sense in one client's config: that client
    answers error@<id>, the shard's other clients train batched."""
    from flwr.app import ConfigRecord, Message, MessageType

    from mmfl_flwr import protocol as P
    from mmfl_flwr.client.app import make_client_app
    from mmfl_flwr.flower_app.client_app import node_spec_fn
    from mmfl_flwr.flower_app.server_app import initial_arrays
    from mmfl_flwr.grid import ensure_task_identity

    ensure_task_identity()
    s = Settings(**_FED)
    app = make_client_app(node_spec_fn(s))
    ctx = Context(
        run_id=1,
        node_id=5,
        node_config={"clients": "0-2"},
        state=RecordDict(),
        run_config=s.to_run_config(),
    )
    content = RecordDict({P.arrays_key("synthetic"): initial_arrays(s)["synthetic"]})
    for cid in ("0", "1", "2"):
        cfg = {
            P.CFG_TASKS: ["synthetic"],
            P.CFG_EPOCHS: 1,
            P.CFG_LR: 0.05,
            P.CFG_BATCH_SIZE: 8,
            P.CFG_SEED: 1,
            P.CFG_ROUND: 1,
        }
        if cid == "1":
            cfg["clipping_norm"] = -3.0
        content[P.client_key(P.CONFIG_KEY, cid)] = ConfigRecord(cfg)
    msg = Message(content, dst_node_id=5, message_type=MessageType.TRAIN, group_id="1")
    msg.metadata.__dict__["_message_id"] = "m"
    reply = app(msg, ctx)
    keys = set(reply.content.keys())
    assert P.client_key(P.ERROR_KEY, "1") in keys
    assert {P.client_key(P.arrays_key("synthetic"), c) for c in ("0", "2")} <= keys
    assert app.shard().counts["vectorized"] == 2


@pytest.mark.parametrize("mtype", ["query.losses", "evaluate"])
def test_a_shards_forward_passes_answer_each_client_as_alone_and_draw_no_training_seed(
    monkeypatch, mtype
):
    """A loss query or an evaluation of a shard gives every client the values its
    own trainer gives (to float32 rounding), and derives no training seed (the
    per-client seed costs 32 us a client and task, and only training uses it)."""
    import torch
    from flwr.app import ConfigRecord, Message, MessageType

    from mmfl_flwr import protocol as P
    from mmfl_flwr.client import shard as S
    from mmfl_flwr.grid import ensure_task_identity
    from mmfl_flwr.records import numpy_to_arrays
    from mmfl_flwr.tasks.models import make_model

    seeds: list[object] = []
    real_seed = S.training_seed
    monkeypatch.setattr(S, "training_seed", lambda *a: seeds.append(a) or real_seed(*a))
    s = Settings(strategy="lvr", tasks="synthetic,synthetic", num_clients=8)
    specs = client_spec(
        Context(
            run_id=1, node_id=1, node_config={"clients": "2-6"}, state=RecordDict(), run_config={}
        ),
        s,
    )
    content = RecordDict()
    weights = {}
    for i, task in enumerate(s.model_names):
        torch.manual_seed(i)
        weights[task] = {
            k: v.detach().numpy().copy() for k, v in make_model("synthetic").state_dict().items()
        }
        content[P.arrays_key(task)] = numpy_to_arrays(weights[task])
    for spec in specs:
        content[P.client_key(P.CONFIG_KEY, spec.client_id)] = ConfigRecord(
            {P.CFG_TASKS: s.model_names, P.CFG_ROUND: 1}
        )
    ensure_task_identity()
    kind = P.QUERY_LOSSES if mtype == "query.losses" else MessageType.EVALUATE
    msg = Message(content, dst_node_id=1, message_type=kind, group_id="1")
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    node = S.ShardComputer()
    reply = node.reply(specs, msg, ctx, None)
    assert node.counts == {"vectorized": len(specs), "per-client": 0}
    assert seeds == []
    for spec in specs:
        for task, tr in spec.trainers.items():
            if mtype == "query.losses":
                got = reply[P.client_key(P.LOSSES_KEY, spec.client_id)][task]
                assert got == pytest.approx(tr.loss(weights[task]), rel=1e-5)
            else:
                got = reply[P.client_key(P.metrics_key(task), spec.client_id)]
                loss, acc, n = tr.evaluate(weights[task])
                assert got[P.LOSS] == pytest.approx(loss, rel=1e-5)
                assert got[P.ACCURACY] == pytest.approx(acc) and got[P.NUM_EXAMPLES] == n


@pytest.mark.parametrize("mtype", ["query.losses", "evaluate"])
def test_a_shards_forward_pass_reads_its_packed_rows_without_a_tensor_per_client(
    monkeypatch, mtype
):
    """The clients of a shard lie one after another in its packed arrays: a loss
    query or an evaluation reads them as one run of rows (no ClientData, and no
    tensor view, per client); a client whose labels were replaced (label
    flipping) puts the model on each client's own tensors, with the same values."""
    from flwr.app import ConfigRecord, Message, MessageType

    from mmfl_flwr import protocol as P
    from mmfl_flwr.client import shard as S
    from mmfl_flwr.client import vectorized as V
    from mmfl_flwr.grid import ensure_task_identity
    from mmfl_flwr.records import numpy_to_arrays
    from mmfl_flwr.tasks.models import make_model

    made = []
    real = V.ClientData
    monkeypatch.setattr(V, "ClientData", lambda *a: made.append(a) or real(*a))
    s = Settings(strategy="lvr", tasks="synthetic,synthetic", num_clients=8)

    def reply(specs):
        content = RecordDict()
        for task in s.model_names:
            content[P.arrays_key(task)] = numpy_to_arrays(
                {k: v.detach().numpy() for k, v in make_model("synthetic").state_dict().items()}
            )
        for spec in specs:
            content[P.client_key(P.CONFIG_KEY, spec.client_id)] = ConfigRecord(
                {P.CFG_TASKS: s.model_names, P.CFG_ROUND: 1}
            )
        ensure_task_identity()
        kind = P.QUERY_LOSSES if mtype == "query.losses" else MessageType.EVALUATE
        ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
        return S.ShardComputer().reply(
            specs, Message(content, dst_node_id=1, message_type=kind, group_id="1"), ctx, None
        )

    def shard():
        return client_spec(
            Context(
                run_id=1,
                node_id=1,
                node_config={"clients": "1-6"},
                state=RecordDict(),
                run_config={},
            ),
            s,
        )

    import torch

    torch.manual_seed(0)
    packed = reply(shard())
    assert made == []
    flipped = shard()
    flipped[2].trainers["synthetic"].map_train_labels(lambda y: y)  # same labels, own tensor
    torch.manual_seed(0)
    each = reply(flipped)
    assert (len(made) > 0) == (mtype == "query.losses")  # (evaluation reads the test data)
    assert {k: dict(v) for k, v in packed.items()} == {k: dict(v) for k, v in each.items()}
