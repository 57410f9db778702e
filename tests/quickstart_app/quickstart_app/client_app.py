"""The quickstart's functions, served to MultiModelStrategy through
mmfl_flwr.client_app_from_functions: no handler written by hand."""

from __future__ import annotations

from flwr.app import Context

from mmfl_flwr import FunctionTrainer, client_app_from_functions
from quickstart_app.task import TASKS, Net, load_data, test, train


def tasks(context: Context) -> dict[str, FunctionTrainer]:
    pid = int(context.node_config["partition-id"])
    return {
        name: FunctionTrainer(
            lambda d=dims, c=classes: Net(d, c), train, test, *load_data(name, pid)
        )
        for name, (dims, classes) in TASKS.items()
    }


app = client_app_from_functions(tasks)
