"""MLflow logger: one MLflow run per mmfl run.

The tracking store is ``MLFLOW_TRACKING_URI`` where it is set (a server, a
database, a folder), else a local file store ``OUTPUT-DIR/mlruns`` (``mlruns``
in the working folder when the run writes no output folder): open it with
``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri OUTPUT-DIR/mlruns``
(MLflow 3 opens a file store only with ``MLFLOW_ALLOW_FILE_STORE=true``, which
this logger sets in its own process for the default store). The experiment is
``MLFLOW_EXPERIMENT_NAME`` where set, else ``mmfl``. Logged: the effective
configuration as params (with a tracking server: at most
:data:`HTTP_RETRIES` retries and :data:`HTTP_TIMEOUT` seconds a request, unless
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``MLFLOW_HTTP_REQUEST_TIMEOUT`` say otherwise),
per round the metrics of ``metrics.csv`` (step = round),
the clients' training counts and the result files (``summary.json``,
``metrics.csv``, ``report.html``, ...) as artifacts. Needs ``pip install
'mmfl-flwr[mlflow]'`` (``mlflow`` itself for ``mlflow ui``).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmfl_flwr.tracking.base import RunInfo, RunLogger

#: Retries and seconds per request to a tracking server, where the user set none
#: (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``).
HTTP_RETRIES = 2
HTTP_TIMEOUT = 20
#: MLflow refuses longer param values.
MAX_PARAM_CHARS = 6000


def tracking_uri_of(settings: Any) -> str:
    """``MLFLOW_TRACKING_URI``, else the file store ``OUTPUT-DIR/mlruns`` (or
    ``./mlruns`` without an output folder), as a ``file:`` URI."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if uri:
        return uri
    base = Path(getattr(settings, "output_dir", "") or ".")
    return (base / "mlruns").resolve().as_uri()


class MLflowLogger(RunLogger):
    """Logs the run with :class:`mlflow.tracking.MlflowClient` (no global active run)."""

    name = "mlflow"

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.client: Any = None
        self.run_id: str | None = None

    def start(self, run: RunInfo) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = self.tracking_uri or tracking_uri_of(run.settings)
        if uri.startswith("file:"):
            from urllib.parse import urlparse
            from urllib.request import url2pathname

            Path(url2pathname(urlparse(uri).path)).mkdir(parents=True, exist_ok=True)
            # MLflow 3 keeps the file store only on request (it recommends a database;
            # a database's tables take seconds to create): the local default asks for it
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        if uri.startswith(("http://", "https://")):
            # MLflow retries an unreachable server 7 times with growing pauses (minutes);
            # a tracker must not hold the run that long: fewer, unless the user set them
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(HTTP_RETRIES))
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(HTTP_TIMEOUT))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the file store's deprecation note
            self.client = MlflowClient(tracking_uri=uri)
            name = self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "mmfl"
            exp = self.client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
            tags = {"mmfl.strategy": str(run.params.get("strategy", "")), **run.tags}
            created = self.client.create_run(exp_id, run_name=run.name, tags=tags)
        self.run_id = created.info.run_id
        params = []
        for key, value in run.params.items():
            text = value if isinstance(value, str) else json.dumps(value)
            params.append(Param(key, text[:MAX_PARAM_CHARS]))
        for i in range(0, len(params), 100):  # MLflow takes 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log_round(
        self, rnd: int, metrics: Mapping[str, float], rows: Sequence[dict[str, Any]]
    ) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, rnd) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow takes 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def log_clients(self, rnd: int, counts: Mapping[str, Mapping[str, int]]) -> None:
        models = sorted({m for per in counts.values() for m in per})
        lines = ["client," + ",".join(models)]
        lines += [
            f"{cid}," + ",".join(str(per.get(m, 0)) for m in models) for cid, per in counts.items()
        ]
        self.client.log_text(
            self.run_id, "\n".join(lines) + "\n", f"clients/client_rounds_round_{rnd}.csv"
        )

    def finish(self, status: str, summary: Mapping[str, Any] | None, files: Sequence[Path]) -> None:
        if self.client is None or self.run_id is None:
            return
        try:
            if summary:
                self.client.log_dict(self.run_id, dict(summary), "summary.json")
            for path in files:
                if Path(path).is_file() and Path(path).name != "summary.json":
                    self.client.log_artifact(self.run_id, str(path), "results")
        finally:
            state = {"finished": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED")
            self.client.set_terminated(self.run_id, state)
