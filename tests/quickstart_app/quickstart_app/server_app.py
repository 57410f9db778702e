"""A ServerApp training the quickstart's two models at once with an mmfl-flwr
preset (run config ``strategy``, ``num-rounds``); prints the final accuracy
of each model as the clients measured it."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from mmfl_flwr import make_strategy
from quickstart_app.task import TASKS, Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    torch.manual_seed(0)
    name = str(context.run_config.get("strategy", "lvr"))
    kwargs = {"budget_fraction": 0.6} if name in ("lvr", "random") else {}
    strategy = make_strategy(name, local_epochs=2, lr=0.1, seed=0, fraction_evaluate=1.0, **kwargs)
    initial = {t: ArrayRecord(Net(d, c).state_dict()) for t, (d, c) in TASKS.items()}
    result = strategy.start(
        grid=grid, initial_arrays=initial, num_rounds=int(context.run_config.get("num-rounds", 4))
    )
    last = max(result.evaluate_metrics_clientapp)
    for task in TASKS:
        acc = result.evaluate_metrics_clientapp[last]["all"][f"{task}.accuracy"]
        print(f"[quickstart] {name} {task}: accuracy {acc:.3f} after round {last}")
