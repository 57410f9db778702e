"""The sequential single-model baseline of paper 002 (Section 7.2): ``single.csv``.

Training ``M`` models one after another, each alone with all clients, is what
multi-model training is compared with: the target of model ``s`` in the gain
``g = M * T_1 / T_M`` (:func:`mmfl_flwr.convergence.gain`) is the accuracy model
``s`` reaches after ``T_1`` rounds of single-model FedAvg with all clients.
:func:`run_sequential` runs those single-model trainings, one per model of the
settings, and writes their server-side accuracy and loss per round to
``single.csv`` (``round, task, accuracy, loss``; round 0 = the initial model).

"All clients" is the ``full`` preset (every client trains the model every round,
FedAvg with weights ``n_{i,s}``), whatever preset the settings name: a budgeted
or sampled preset's participation is what the multi-model run is measured
against, not part of the baseline (paper 002's single-model runs use every
client each round). See :func:`single_settings` for how each run keeps the
model's data and seeds identical to the multi-model run's.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmfl_flwr.config import Settings

#: The file :func:`run_sequential` writes into ``output_dir``.
SINGLE_FILE = "single.csv"
#: Its columns.
SINGLE_COLUMNS = ("round", "task", "accuracy", "loss")
#: The preset of the single-model runs.
SINGLE_STRATEGY = "full"


def single_settings(settings: Settings, model: str) -> Settings:
    """The settings of ``model``'s single-model run.

    The same settings (tasks, clients, profile, data, seed, local training,
    client arrivals), so that the federation, the model's data partition and
    eligibility, its initial weights and its training seeds (which depend only
    on the seeds -- ``seed``, ``data_seed``, ``model_seed`` -- and the model's name)
    are those of the multi-model run, with:

    - ``strategy="full"``, ``aggregator=""``: every client that holds the model
      trains it every round; FedAvg; the other presets' parameters
      (``budget_fraction``, ``clients_per_round``, ``stale_*``, ``ucb_*``,
      ``group_*``) back to their defaults;
    - ``task_arrivals``: ``model`` from round 0, every other model at round
      ``num_rounds``, so only ``model`` trains in rounds ``1 .. num_rounds -
      1``. In the last round the other models train too, from their initial
      weights; under full participation models never interact (each client
      trains each model from its own seed; FedAvg per model), so ``model``'s
      curve is exactly that of training it alone. (A task kind alone,
      ``tasks=kind``, would not do: a repeated kind such as ``digits_2`` or a
      profile that draws per model would give it other data.) Their rows are
      not part of the result;
    - nothing written (``output_dir=""``), no resume, no ``target_accuracy``.
    """
    from mmfl_flwr.presets import preset_settings, presets_taking

    names = settings.model_names
    if model not in names:
        raise ValueError(f"{model!r} is not a model of these settings ({', '.join(names)})")
    others = ",".join(f"{m}:{settings.num_rounds}" for m in names if m != model)
    defaults = Settings()
    fields = [f.name for f in dataclasses.fields(Settings) if f.name != "extra"]
    full_takes = set(preset_settings(SINGLE_STRATEGY, fields))
    # the other presets' parameters (budget-fraction, clients-per-round, ...)
    # back to their defaults: the full preset takes none of them
    reset = {f: getattr(defaults, f) for f in fields if presets_taking(f) and f not in full_takes}
    return dataclasses.replace(
        settings,
        **reset,
        strategy=SINGLE_STRATEGY,
        aggregator="",
        task_arrivals=others,
        output_dir="",
        resume_from="",
        overwrite=False,
        target_accuracy="",
        extra=dict(settings.extra),
    )


def check_before_sequential(settings: Settings) -> None:
    """What :func:`run_sequential` can check before it runs: the settings, no
    resume (a sequential run starts fresh), the data, and that ``single.csv``
    in ``output_dir`` is not overwritten without ``overwrite``. The folder may
    hold the multi-model run of the same settings (``single.csv`` goes beside
    its ``metrics.csv``). Raises ValueError or OSError."""
    settings.validate()
    if settings.resume_from:
        raise ValueError(
            "--sequential and --resume exclude each other (a sequential run starts fresh)"
        )
    for model in settings.model_names:
        single_settings(settings, model).validate()
    from mmfl_flwr.flower_app.server_app import check_output_location

    check_output_location(settings.output_dir)
    if settings.output_dir and not settings.overwrite:
        held = Path(settings.output_dir) / SINGLE_FILE
        if held.exists():
            raise ValueError(
                f"output folder {settings.output_dir} holds {SINGLE_FILE}; pass "
                "--overwrite (run-config overwrite=true) to replace it"
            )
    from mmfl_flwr.flower_app.data import federation_for

    federation_for(settings)  # loads the data (cached for the run)


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    return v


def write_single_csv(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write ``single.csv``: one row per (round, model) with :data:`SINGLE_COLUMNS`
    (floats as ``repr``, NaN as an empty cell, as ``metrics.csv``)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SINGLE_COLUMNS)
        for row in rows:
            w.writerow([_fmt(row.get(c, math.nan)) for c in SINGLE_COLUMNS])


def read_single_csv(path: str | os.PathLike[str]) -> dict[str, list[float]]:
    """The ``single`` accuracy curves of a ``single.csv`` (model -> accuracy per
    round, index 0 = the initial model): the ``single`` of
    :func:`mmfl_flwr.convergence.gain`."""
    from mmfl_flwr.convergence import accuracy_curves

    with open(path, newline="") as f:
        return accuracy_curves(csv.DictReader(f))


def run_sequential(
    settings: Settings,
    engine: str = "simulation",
    num_cpus: int | None = None,
    verbose: bool = False,
    **run_options: Any,
) -> list[dict[str, Any]]:
    """Train the models of ``settings`` one after another, each alone with all
    clients (:func:`single_settings`), with :func:`mmfl_flwr.runner.run` on
    ``engine`` (``run_options``, e.g. ``vector_chunk``, go to it too); return
    the rows ``{round, task, accuracy, loss}`` of every model
    (rounds ``0 .. num_rounds``, models in the settings' order) and, with an
    ``output_dir``, write them to ``<output_dir>/single.csv`` (rewritten after
    each model). ``settings.task_arrivals`` is ignored: each model trains from
    round 0. :func:`mmfl_flwr.convergence.accuracy_curves` of the rows (or
    :func:`read_single_csv`) is the ``single`` of
    :func:`mmfl_flwr.convergence.gain`."""
    from mmfl_flwr.runner import run

    check_before_sequential(settings)
    rows: list[dict[str, Any]] = []
    names = settings.model_names
    path = Path(settings.output_dir) / SINGLE_FILE if settings.output_dir else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    for k, model in enumerate(names, start=1):
        print(
            f"[mmfl] sequential {k}/{len(names)}: {model} alone, full participation "
            f"(FedAvg), {settings.num_clients} clients, {settings.num_rounds} rounds",
            flush=True,
        )
        result = run(
            single_settings(settings, model),
            engine=engine,
            num_cpus=num_cpus,
            verbose=verbose,
            **run_options,
        )
        rows.extend(
            {
                "round": int(r["round"]),
                "task": model,
                "accuracy": float(r["accuracy"]),
                "loss": float(r["loss"]),
            }
            for r in result.history
            if r["task"] == model
        )
        if path is not None:
            write_single_csv(rows, path)
    if path is not None:
        print(f"[mmfl] single-model curves written to {path}", flush=True)
    return rows
