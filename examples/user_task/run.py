"""Add a task of your own, from your own tensors, and train it next to a built-in one.

    python examples/user_task/run.py                 # Flower's simulation engine (Ray)
    python examples/user_task/run.py --engine inprocess

The new task, "blobs", is a 3-class problem on 2-D points held in torch tensors;
it is trained beside the embedded ``digits`` CNN, on the same 8 clients, with
MFA-Rand assignment. Results go to results/user_task/.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from mmfl_flwr.config import Settings
from mmfl_flwr.runner import run
from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.registry import register_task

# --- your data, as tensors -------------------------------------------------
g = torch.Generator().manual_seed(0)
CENTERS = torch.tensor([[0.0, 0.0], [3.0, 3.0], [0.0, 4.0]])
LABELS = torch.arange(3).repeat_interleave(200)
POINTS = CENTERS[LABELS] + torch.randn(600, 2, generator=g)


def blobs_data(num_clients: int, seed: int, copy: int):
    """Split the tensors across clients; every 5th point is held out for the server."""
    x, y = POINTS.numpy().astype(np.float32), LABELS.numpy().astype(np.int64)
    order = np.random.default_rng([seed, copy]).permutation(len(y))
    test, train = order[::5], np.setdiff1d(order, order[::5])
    clients = [
        (Dataset(x[part], y[part]), Dataset(x[part[:0]], y[part[:0]]))
        for part in np.array_split(train, num_clients)
    ]
    return clients, Dataset(x[test], y[test])


def blobs_model() -> torch.nn.Module:
    """A small MLP returning logits."""
    return torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


register_task(
    "blobs",
    model_fn=blobs_model,
    data_fn=blobs_data,
    description="3 Gaussian blobs in 2-D, from user tensors",
)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--engine", default="simulation", choices=("simulation", "inprocess"))
    p.add_argument("--num-rounds", type=int, default=5)
    p.add_argument("--output-dir", default="results/user_task")
    a = p.parse_args()
    # overwrite=True: running the example again replaces its own results
    settings = Settings(
        tasks="digits,blobs",
        strategy="mfa-rand",
        num_clients=8,
        num_rounds=a.num_rounds,
        output_dir=a.output_dir,
        overwrite=True,
    )
    result = run(settings, engine=a.engine)
    for task, row in result.final().items():
        print(f"{task}: accuracy {row['accuracy']:.3f}")
