"""Weights & Biases logger: one W&B run per mmfl run.

The mode is ``WANDB_MODE`` where it is set (``offline`` needs no network and no
account: the run is kept in ``OUTPUT-DIR/wandb/offline-run-*``, to upload later
with ``wandb sync``), else ``online`` when ``WANDB_API_KEY`` is set and
``offline`` otherwise (never a login prompt). The project is ``WANDB_PROJECT``
where set, else ``mmfl``; the run's folder ``WANDB_DIR`` where set, else the
output folder. Logged: the effective configuration as the run's config, per
round the metrics of ``metrics.csv`` (step = round), the clients' training
counts as a table, the summary and the result files (an artifact
``mmfl-results``). Needs ``pip install 'mmfl-flwr[wandb]'``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmfl_flwr.tracking.base import RunInfo, RunLogger

#: Up to this many clients, the training counts are a table (one row per client).
MAX_TABLE_CLIENTS = 10_000


def wandb_mode() -> str:
    """``WANDB_MODE``, else ``online`` with ``WANDB_API_KEY`` set, else ``offline``."""
    mode = os.environ.get("WANDB_MODE", "").strip()
    if mode:
        return mode
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class WandbLogger(RunLogger):
    """Logs the run with ``wandb`` (its own run object, no global ``wandb.log``)."""

    name = "wandb"

    def __init__(self, project: str | None = None, directory: str | Path | None = None) -> None:
        self.project = project
        self.directory = directory
        self.run: Any = None

    def start(self, run: RunInfo) -> None:
        import wandb

        directory = Path(
            self.directory or os.environ.get("WANDB_DIR") or run.output_dir or Path.cwd()
        )
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=self.project or os.environ.get("WANDB_PROJECT") or "mmfl",
            name=run.name,
            dir=str(directory),
            mode=wandb_mode(),  # type: ignore[arg-type]
            config=dict(run.params),
            tags=[str(run.params.get("strategy", ""))] if run.params.get("strategy") else None,
            reinit="create_new",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def log_round(
        self, rnd: int, metrics: Mapping[str, float], rows: Sequence[dict[str, Any]]
    ) -> None:
        self.run.log({**metrics, "round": rnd}, step=rnd)

    def log_clients(self, rnd: int, counts: Mapping[str, Mapping[str, int]]) -> None:
        import wandb

        if len(counts) > MAX_TABLE_CLIENTS:
            return
        models = sorted({m for per in counts.values() for m in per})
        table = wandb.Table(
            columns=["client", *models],
            data=[[cid, *(per.get(m, 0) for m in models)] for cid, per in counts.items()],
        )
        self.run.log({"clients/rounds_trained": table}, step=max(rnd, self.run.step))

    def finish(self, status: str, summary: Mapping[str, Any] | None, files: Sequence[Path]) -> None:
        if self.run is None:
            return
        try:
            import wandb

            if summary:
                for key in ("mean_final_accuracy", "rounds", "total_uploads"):
                    if summary.get(key) is not None:
                        self.run.summary[f"final/{key}"] = summary[key]
                for task, acc in (summary.get("final_accuracy") or {}).items():
                    if acc is not None:
                        self.run.summary[f"final/{task}/accuracy"] = acc
            kept = [Path(p) for p in files if Path(p).is_file()]
            if kept:
                art = wandb.Artifact("mmfl-results", type="results")
                for p in kept:
                    art.add_file(str(p), name=p.name)
                self.run.log_artifact(art)
        finally:
            self.run.finish(exit_code=0 if status == "finished" else 1)
            self.run = None
