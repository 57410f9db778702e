"""The clients of a shard keep their data as rows of the shard's packed arrays
(issue 24, memory at 100,000 clients): a trainer holds no tensor of its own, a
forward pass over a shard reads one run of rows, and whatever is not one run
(another order, a gap, relabelled data, a trainer with its own tensors) takes
each client's tensors as before, with the same values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict
from torch import nn

from mmfl_flwr.client import vectorized as V
from mmfl_flwr.client.trainer import TorchTrainer, packed_rows
from mmfl_flwr.config import Settings
from mmfl_flwr.flower_app.client_app import client_spec
from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.federation import PackedUsers, build_federation
from mmfl_flwr.tasks.models import make_model

_S = Settings(strategy="lvr", tasks="synthetic,synthetic", num_clients=8, synthetic_max_samples=30)


def _shard(clients: str = "2-6"):
    return client_spec(
        Context(
            run_id=1, node_id=1, node_config={"clients": clients}, state=RecordDict(), run_config={}
        ),
        _S,
    )


def test_a_shards_trainers_share_one_tensor_and_read_their_own_rows():
    specs = _shard()
    fed = build_federation(["synthetic", "synthetic"], 8, _S.seed, max_synthetic_samples=30)
    for task in _S.model_names:
        trainers = [s.trainers[task] for s in specs]
        assert len({id(tr._train.x) for tr in trainers}) == 1  # one packed tensor
        for s, tr in zip(specs, trainers):
            train, test = fed.client_data(int(s.client_id), task)
            x, y = tr.train_tensors()
            np.testing.assert_array_equal(x.numpy(), train.x)
            np.testing.assert_array_equal(y.numpy(), train.y)
            np.testing.assert_array_equal(
                tr.eval_tensors()[0].numpy(), test.x if len(test) else train.x
            )
        x, y, counts = packed_rows(trainers, "train")
        assert counts == [tr.num_train for tr in trainers]
        assert x.data_ptr() == trainers[0].train_tensors()[0].data_ptr()  # no copy
        np.testing.assert_array_equal(
            x.numpy(), np.concatenate([tr.train_tensors()[0].numpy() for tr in trainers])
        )
        np.testing.assert_array_equal(
            y.numpy(), np.concatenate([tr.train_tensors()[1].numpy() for tr in trainers])
        )


def test_what_is_not_one_run_of_rows_is_not_packed():
    specs = _shard()
    task = _S.model_names[0]
    trainers = [s.trainers[task] for s in specs]
    assert packed_rows([], "train") is None
    assert packed_rows(trainers[::-1], "train") is None  # another order
    assert packed_rows(trainers[:1] + trainers[2:], "train") is None  # a gap
    assert packed_rows(trainers[1:3], "train") is not None  # a run inside the shard

    class OwnTensors(TorchTrainer):
        def train_tensors(self):
            return super().train_tensors()

    own = OwnTensors(
        make_model_fn(),
        Dataset(np.ones((3, 60), np.float32), np.zeros(3)),
        Dataset(np.ones((0, 60), np.float32), np.zeros(0)),
    )
    assert packed_rows(trainers + [own], "train") is None

    relabelled = _shard()  # a fresh copy: map_train_labels on one client
    tr = relabelled[1].trainers[task]
    x0, y0 = (t.clone() for t in tr.train_tensors())
    tr.map_train_labels(lambda y: 9 - y)
    x1, y1 = tr.train_tensors()
    assert torch.equal(x1, x0) and torch.equal(y1, 9 - y0)
    others = [s.trainers[task] for s in relabelled]
    assert packed_rows(others, "train") is None  # its labels are its own now
    assert packed_rows(others, "eval") is not None  # its test data are not relabelled


def make_model_fn():
    return lambda: make_model("synthetic")


@pytest.mark.parametrize("side", ["train", "eval"])
def test_a_forward_pass_over_packed_rows_equals_one_over_each_clients_tensors(side):
    specs = _shard()
    task = _S.model_names[1]
    trainers = [s.trainers[task] for s in specs]
    vm = V.VectorModel(make_model_fn(), torch.device("cpu"))
    torch.manual_seed(5)
    weights = {
        k: v.detach().numpy().copy() for k, v in make_model("synthetic").state_dict().items()
    }
    packed = V.PackedData(*packed_rows(trainers, side))
    each = [
        V.ClientData(*(tr.train_tensors() if side == "train" else tr.eval_tensors()))
        for tr in trainers
    ]
    assert V.batched_losses(vm, weights, packed) == V.batched_losses(vm, weights, each)
    assert V.batched_evaluate(vm, weights, packed) == V.batched_evaluate(vm, weights, each)
    # and each equals the client's own trainer, to float32 rounding
    for tr, got in zip(trainers, V.batched_losses(vm, weights, packed)):
        if side == "train":
            assert got == pytest.approx(tr.loss(weights), rel=1e-5)


class _Double(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3).double()

    def forward(self, x):
        return self.lin(x)


def test_a_float64_model_converts_each_clients_own_rows_only():
    """Where the inputs must be converted (a float64 model; a GPU), a client keeps
    a converted copy of its own rows, not of the whole packed array, and the
    shard's forward pass takes each client's tensors, with the same values."""
    xs = np.arange(40, dtype=np.float32).reshape(10, 4).copy()  # owns its memory
    ys = np.arange(10) % 3
    users = [Dataset(xs[a:b], ys[a:b]) for a, b in ((0, 3), (3, 7), (7, 10))]
    empty = Dataset(np.zeros((0, 4), np.float32), np.zeros(0))
    trainers = [TorchTrainer(_Double, u, empty) for u in users]
    for u, tr in zip(users, trainers):
        assert tr._train.x.shape[0] == len(u)  # not the packed array's 10 rows
        x, y = tr.train_tensors()
        assert x.dtype == torch.float64
        np.testing.assert_array_equal(x.numpy(), u.x.astype(np.float64))
        np.testing.assert_array_equal(y.numpy(), u.y)
    assert packed_rows(trainers, "train") is None  # the labels are packed, the inputs not


def test_repeated_queries_of_unpacked_clients_reuse_their_concatenation(monkeypatch):
    """Clients that are not one run of rows (here: in another order) take their
    own tensors, fresh views at every call; the batched kernels' concatenation
    is still made once for repeated queries of the same clients."""
    specs = _shard()
    task = _S.model_names[0]
    trainers = [s.trainers[task] for s in specs][::-1]
    calls = []
    real = V._concat
    monkeypatch.setattr(V, "_concat", lambda d: calls.append(1) or real(d))
    vm = V.VectorModel(make_model_fn(), torch.device("cpu"))
    weights = {
        k: v.detach().numpy().copy() for k, v in make_model("synthetic").state_dict().items()
    }
    got = [
        V.batched_losses(vm, weights, [V.ClientData(*tr.train_tensors()) for tr in trainers])
        for _ in range(3)
    ]
    assert got[0] == got[1] == got[2] and len(calls) == 1
    other = [V.ClientData(*tr.train_tensors()) for tr in trainers[1:]]
    V.batched_losses(vm, weights, other)
    assert len(calls) == 2  # other clients: a new concatenation


def test_packed_users_index_like_a_list_and_make_views_of_one_array():
    fed = build_federation(
        ["synthetic"], 10, 1, max_synthetic_samples=30, clients=[2, 3, 4, 7], server_tests=False
    )
    users = fed.data["synthetic"]
    assert isinstance(users, PackedUsers) and len(users) == 10
    np.testing.assert_array_equal(users[-3][0].x, users[7][0].x)
    assert len(users[0][0]) == 0 and len(users[9][1]) == 0  # not held here
    assert [len(tr) for tr, _ in users[2:5]] == [len(users[k][0]) for k in (2, 3, 4)]
    assert users[2][0].x.base is users[7][0].x.base  # rows of one packed array
    assert users[3][0].x.base is not None
    with pytest.raises(IndexError):
        users[10]
    with pytest.raises(IndexError):
        users[-11]
    full = build_federation(["synthetic"], 10, 1, max_synthetic_samples=30)
    for k in (2, 3, 4, 7):
        for a, b in zip(users[k], full.data["synthetic"][k]):
            np.testing.assert_array_equal(a.x, b.x)
            np.testing.assert_array_equal(a.y, b.y)
