"""Run the same app without Ray or a SuperLink: mmfl-flwr's in-process Grid.

python examples/plug_into_your_app/run_inprocess.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flwr.app import Context, RecordDict  # noqa: E402
from your_app.client_app import app as client_app  # noqa: E402
from your_app.server_app import app as server_app  # noqa: E402

from mmfl_flwr import InProcessGrid  # noqa: E402

if __name__ == "__main__":
    n = 6
    grid = InProcessGrid(client_app, [{"partition-id": i, "num-partitions": n} for i in range(n)])
    ctx = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={"num-rounds": 5}
    )
    server_app(grid, ctx)
