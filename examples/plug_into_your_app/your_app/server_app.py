"""Your ServerApp, with MultiModelStrategy where FedAvg used to be.

Before (one model)::

    strategy = FedAvg()
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=5, evaluate_fn=evaluate)

After (two models over the same clients, MFA-Rand assignment)::

    strategy = mfa_rand(local_epochs=2, lr=0.1, seed=0)
    result = strategy.start(grid=grid, initial_arrays={"iris": ..., "wine": ...},
                            num_rounds=5, evaluate_fn=evaluate)
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from mmfl_flwr import mfa_rand
from mmfl_flwr.client.trainer import evaluate_arrays
from mmfl_flwr.records import arrays_to_numpy
from your_app.task import TASKS, make_model, server_test

app = ServerApp()


def evaluate(server_round: int, task: str, arrays: ArrayRecord) -> MetricRecord:
    """Central evaluation of one model on its held-out data."""
    loss, acc = evaluate_arrays(
        lambda: make_model(task), arrays_to_numpy(arrays), server_test(task)
    )
    return MetricRecord({"loss": loss, "accuracy": acc})


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train both models for ``num-rounds`` rounds and print the final accuracies."""
    torch.manual_seed(0)
    initial = {task: ArrayRecord(make_model(task).state_dict()) for task in TASKS}
    strategy = mfa_rand(local_epochs=2, lr=0.1, seed=0)
    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=int(context.run_config.get("num-rounds", 5)),
        evaluate_fn=evaluate,
    )
    for task, row in result.final().items():
        print(f"{task}: accuracy {row['accuracy']:.3f} after round {row['round']}")
