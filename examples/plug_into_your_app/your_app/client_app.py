"""Your ClientApp: one trainer per task, built by mmfl-flwr's ClientApp factory."""

from __future__ import annotations

from flwr.app import Context

from mmfl_flwr import ClientSpec, make_client_app
from mmfl_flwr.client.trainer import TorchTrainer
from your_app.task import TASKS, make_model, partition


def spec(context: Context) -> ClientSpec:
    """This node: its stable id, its processors, and a trainer per task it holds."""
    pid = int(context.node_config["partition-id"])
    n = int(context.node_config["num-partitions"])
    trainers = {}
    for task in TASKS:
        train, test = partition(task, pid, n)
        trainers[task] = TorchTrainer(lambda t=task: make_model(t), train, test, batch_size=8)
    return ClientSpec(client_id=str(pid), trainers=trainers, processors=1)


app = make_client_app(spec)
