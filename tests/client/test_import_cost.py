"""Local training does not import ``torch._dynamo``.

Every Ray worker of the simulation engine and every message a deployed
SuperNode serves (Flower 1.42 starts a fresh ClientApp process per message)
imports what local training touches. ``torch.optim.SGD``'s constructor and
functorch's ``grad`` transform both import ``torch._dynamo`` (about 2 CPU-s per
process on the build machine), which plain SGD and plain autograd through a
``vmap``-ed forward do not need. These tests pin that, and that the written-out
SGD step is bit for bit the one ``torch.optim.SGD`` takes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from mmfl_flwr.client.trainer import TorchTrainer, initial_weights
from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.models import make_model

SCRIPT = textwrap.dedent(
    r"""
    import sys

    import numpy as np
    import torch

    from mmfl_flwr.client import vectorized as V
    from mmfl_flwr.client.trainer import TorchTrainer, initial_weights
    from mmfl_flwr.tasks.data import Dataset
    from mmfl_flwr.tasks.models import make_model

    if "torch._dynamo" in sys.modules:
        print("preloaded")  # this torch imports it on import: nothing to check
        raise SystemExit(0)
    rng = np.random.default_rng(0)
    data = [Dataset(rng.normal(size=(n, 1, 8, 8)).astype(np.float32),
                    rng.integers(0, 10, size=n)) for n in (7, 12, 5)]
    model_fn = lambda: make_model("digits")
    start = initial_weights(model_fn, 0)
    tr = TorchTrainer(model_fn, data[0], data[0], 4)
    tr.train(start, 2, 0.05, 3)
    corr = {k: np.full_like(v, 0.01) for k, v in start.items() if k in tr.trainable_keys}
    tr.train(start, 1, 0.05, 4, correction=corr)
    vm = V.VectorModel(model_fn, torch.device("cpu"))
    jobs = [V.TrainJob(V.ClientData(torch.as_tensor(d.x), torch.as_tensor(d.y)), 10 + i)
            for i, d in enumerate(data)]
    V.batched_train(vm, start, jobs, 2, 0.05, 4)
    print("dynamo" if "torch._dynamo" in sys.modules else "clean")
    """
)


def test_local_training_does_not_import_torch_dynamo():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    if last == "preloaded":
        pytest.skip(f"torch {torch.__version__} imports torch._dynamo on import")
    assert last == "clean"


def _sgd_reference(model_fn, weights, data, epochs, lr, seed, batch):
    """TorchTrainer.train's loop with torch.optim.SGD doing the step."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        model = model_fn()
        model.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        x, y = torch.as_tensor(data.x), torch.as_tensor(data.y)
        for _ in range(epochs):
            order = torch.randperm(len(y), generator=gen)
            for s in range(0, len(y), batch):
                idx = order[s : s + batch]
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def test_written_out_sgd_step_equals_torch_optim_sgd_bit_for_bit():
    rng = np.random.default_rng(1)
    data = Dataset(rng.normal(size=(23, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, size=23))
    model_fn = lambda: make_model("digits")  # noqa: E731
    start = initial_weights(model_fn, 5)
    got, n, _ = TorchTrainer(model_fn, data, data, 5).train(start, 3, 0.07, 11)
    want = _sgd_reference(model_fn, start, data, 3, 0.07, 11, 5)
    assert n == 23
    assert set(got) == set(want)
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    assert all(not np.array_equal(got[k], start[k]) for k in ("fc2.weight", "conv1.weight"))
