"""TensorBoard logger: event files in ``--log-dir`` (default ``OUTPUT-DIR/tensorboard``).

Open them with ``tensorboard --logdir OUTPUT-DIR/tensorboard``. Scalars are
``<model>/<column>`` with the round as the step (the columns of
``metrics.csv``), ``<model>/defence/<kind>``, ``round/seconds`` and
``round/mean_accuracy``; the configuration is the run's hyperparameters (the
HPARAMS tab) and a ``config`` text; the clients' training counts are one
histogram per model (``clients/<model>/rounds_trained``) and, with at most
:data:`PER_CLIENT_SCALARS` clients, one scalar per client and model.
Needs ``pip install 'mmfl-flwr[tensorboard]'``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmfl_flwr.tracking.base import RunInfo, RunLogger

#: Up to this many clients, each client's training counts are scalars too.
PER_CLIENT_SCALARS = 100


def log_dir_of(settings: Any) -> Path:
    """Where the event files go: ``settings.log_dir``, else ``OUTPUT-DIR/tensorboard``,
    else ``tensorboard`` in the working folder."""
    if getattr(settings, "log_dir", ""):
        return Path(settings.log_dir)
    if getattr(settings, "output_dir", ""):
        return Path(settings.output_dir) / "tensorboard"
    return Path("tensorboard")


class TensorBoardLogger(RunLogger):
    """Writes the run to TensorBoard event files (``torch.utils.tensorboard``)."""

    name = "tensorboard"

    def __init__(self, log_dir: str | Path | None = None) -> None:
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.writer: Any = None
        self._hparams: dict[str, Any] = {}

    def start(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if self.log_dir is None:
            self.log_dir = log_dir_of(run.settings)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=30)
        self._hparams = {
            k: (v if isinstance(v, (int, float, str, bool)) else json.dumps(v))
            for k, v in run.params.items()
        }
        table = "\n".join(f"| {k} | {v} |" for k, v in run.params.items())
        self.writer.add_text("config", "| setting | value |\n|---|---|\n" + table, run.start_round)

    def log_round(
        self, rnd: int, metrics: Mapping[str, float], rows: Sequence[dict[str, Any]]
    ) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, rnd)

    def log_clients(self, rnd: int, counts: Mapping[str, Mapping[str, int]]) -> None:
        import numpy as np

        models = sorted({m for per in counts.values() for m in per})
        for m in models:
            values = np.array([per.get(m, 0) for per in counts.values()], dtype=np.float64)
            if len(values):
                self.writer.add_histogram(f"clients/{m}/rounds_trained", values, rnd)
        if len(counts) <= PER_CLIENT_SCALARS:
            for cid, per in counts.items():
                for m, n in per.items():
                    self.writer.add_scalar(f"clients/{cid}/{m}", n, rnd)

    def finish(self, status: str, summary: Mapping[str, Any] | None, files: Sequence[Path]) -> None:
        if self.writer is None:
            return
        try:
            from torch.utils.tensorboard.summary import hparams

            final = {}
            if summary:
                for task, acc in (summary.get("final_accuracy") or {}).items():
                    if acc is not None:
                        final[f"final/{task}/accuracy"] = acc
                if summary.get("mean_final_accuracy") is not None:
                    final["final/mean_accuracy"] = summary["mean_final_accuracy"]
            exp, ssi, sei = hparams(self._hparams, final)
            fw = self.writer._get_file_writer()
            for s in (exp, ssi, sei):
                fw.add_summary(s)
            for key, value in final.items():
                self.writer.add_scalar(key, value, int(summary.get("rounds", 0)) if summary else 0)
            self.writer.add_text("status", status)
        finally:
            self.writer.close()
            self.writer = None
