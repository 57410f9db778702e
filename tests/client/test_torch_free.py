"""The server side runs where torch is absent.

A fresh interpreter gets a meta-path finder that makes ``torch`` (and every
``torch.*`` submodule) unimportable, then imports the torch-free modules and runs
a 2-round MultiModelStrategy on the in-process grid with numpy-only trainers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    r"""
    import importlib.abc
    import json
    import sys


    class BlockTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None


    sys.meta_path.insert(0, BlockTorch())
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("the torch blocker does not work")

    import numpy as np

    import mmfl_flwr
    import mmfl_flwr.client.app
    import mmfl_flwr.core
    import mmfl_flwr.grid
    import mmfl_flwr.presets
    import mmfl_flwr.protocol
    import mmfl_flwr.records
    import mmfl_flwr.strategy
    import mmfl_flwr.tasks.federation
    from mmfl_flwr.client.app import ClientSpec, make_client_app
    from mmfl_flwr.grid import InProcessGrid
    from mmfl_flwr.records import arrays_to_numpy, numpy_to_arrays

    # the lazy top-level names resolve too
    strategy_cls = mmfl_flwr.MultiModelStrategy
    policy = mmfl_flwr.FullParticipation()


    class Trainer:
        def __init__(self, n, step):
            self._n, self.step = n, step

        @property
        def num_examples(self):
            return self._n

        def train(self, weights, epochs, lr, seed, batch_size=None):
            moved = {k: (v - np.float32(self.step)).astype(v.dtype) for k, v in weights.items()}
            return moved, self._n, 0.5

        def loss(self, weights):
            return 1.0

        def evaluate(self, weights):
            return 1.0, 0.5, 10


    STEPS = {"0": 1.0, "1": 2.0, "2": 4.0}
    COUNTS = {"0": 10, "1": 30, "2": 60}


    def spec(ctx):
        cid = str(ctx.node_config["partition-id"])
        return ClientSpec(cid, {t: Trainer(COUNTS[cid], STEPS[cid]) for t in ("x", "y")})


    grid = InProcessGrid(make_client_app(spec), [{"partition-id": i} for i in range(3)])
    strategy = mmfl_flwr.presets.make_strategy("full", fraction_evaluate=1.0)
    init = {t: numpy_to_arrays({"w": np.zeros((2, 2), np.float32)}) for t in ("x", "y")}
    result = strategy.start(grid, init, num_rounds=2, timeout=30)
    final = {t: arrays_to_numpy(r)["w"].tolist() for t, r in result.arrays.items()}
    json.dump(
        {
            "torch_loaded": "torch" in sys.modules
            or any(m.startswith("torch.") for m in sys.modules),
            "final": final,
            "rounds": sorted({row["round"] for row in result.history}),
            "uploads": [row["uploads"] for row in result.history if row["round"] > 0],
            "client_accuracy": [
                row["client_accuracy"] for row in result.history if row["round"] > 0
            ],
        },
        sys.stdout,
    )
    """
)


def test_server_side_runs_without_torch():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["torch_loaded"] is False
    assert out["rounds"] == [0, 1, 2]
    assert out["uploads"] == [3, 3, 3, 3]
    assert out["client_accuracy"] == [0.5] * 4
    # FedAvg step by hand: (10*1 + 30*2 + 60*4) / 100 = 3.1 per round
    for t in ("x", "y"):
        for row in out["final"][t]:
            for v in row:
                assert abs(v + 6.2) < 1e-5
