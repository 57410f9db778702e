"""The option table of the run settings: what every setting of
:class:`~mmfl_flwr.config.Settings` does and accepts (:func:`options`), the
``mmfl run --help`` text written from it (:func:`setting_help`), and the one
message for a value a setting refuses (:func:`option_error`).

``mmfl run --help``, ``docs/reference/run-config.md``, ``Settings.validate``,
the run-config reader and the preset factories all read this table, so each
setting's range and wording is written once. :mod:`mmfl_flwr.config`
re-exports its public names; the fields and defaults stay on ``Settings``,
which this module reads when a function is called (``config`` imports this
module, not the other way round at import time).
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Any

from mmfl_flwr.core.card import setting_option, setting_parameters
from mmfl_flwr.core.parameter import Option

__all__ = ["Option", "check_option", "option_error", "options", "setting_help"]


def _presets() -> list[str]:
    from mmfl_flwr.core.card import cards

    return [c.name for c in cards()]


def _aggregators() -> list[str]:
    from mmfl_flwr.core.card import AGGREGATORS

    return list(AGGREGATORS)


def _kinds() -> list[str]:
    from mmfl_flwr.tasks.federation import known_kinds

    return known_kinds()


def _dp_kinds() -> list[str]:
    return ["server-fixed", "client-fixed", "server-adaptive", "client-adaptive"]


def _profiles() -> list[str]:
    from mmfl_flwr.tasks.federation import PROFILES

    return list(PROFILES)


def _general_options() -> dict[str, Option]:
    """The options of the preset, the federation, its data and local training."""
    return {
        "strategy": Option("the preset (policy and aggregator) to run", _presets),
        "aggregator": Option(
            "override the preset's aggregator", _aggregators, empty="the preset's own"
        ),
        "tasks": Option(
            "the task kinds, one model each; repeats are separate models "
            "(digits,digits -> digits, digits_2)",
            _kinds,
            listed=True,
        ),
        "num_clients": Option("clients in the federation (simulation: virtual SuperNodes)", low=1),
        "num_rounds": Option("training rounds (with --resume: continue to this many)", low=0),
        "local_epochs": Option("local SGD epochs per round", low=1),
        "lr": Option("client learning rate (plain SGD)", low=0, low_open=True, finite=True),
        "batch_size": Option("client mini-batch size", low=1),
        "labels_per_client": Option(
            "fraction of the labels each client holds per image task (label skew)",
            low=0,
            low_open=True,
            high=1,
        ),
        "profile": Option(
            "client heterogeneity: uniform (all tasks, one processor), paper003 (10% "
            "high-data clients per task, 10% without one task, 1 to |S_i| processors), "
            "paper003-sizes (the same with paper 003's data sizes, about 12 / 120 "
            "examples per client, where a labelled image task's pool is large enough), "
            "clusters-consistent / clusters-inconsistent (5 label clusters per digits "
            "task, one client map for all tasks or one per task), and "
            "clusters-consistent-sizes / clusters-inconsistent-sizes (the same with papers "
            "000/001's data sizes, 30-40 examples per client and task, or all of a smaller "
            "share)",
            _profiles,
        ),
        "data_root": Option(
            "folder of the real datasets", form="a folder (relative to the working directory)"
        ),
        "download": Option(
            "fetch missing mnist, fashion-mnist, emnist and cifar10 data into "
            "data-root with torchvision before the run (needs internet)",
            form="a switch (no value)",
        ),
        "synthetic_max_samples": Option(
            "cap on a Synthetic(1,1) user's samples", low=0, zero="no cap"
        ),
        "fraction_evaluate": Option(
            "fraction of clients that also evaluate on local data each round", low=0, high=1
        ),
    }


def _run_options() -> dict[str, Option]:
    """The options of arrivals, pins, targets, seeds and where the run is written."""
    return {
        "client_arrivals": Option(
            "simulated late clients: clients 0..static-1 from the start, the others arrive "
            "in id order with exponential inter-arrival times of that rate per round",
            form='"" (all from the start) or exponential:static=N,rate=R with N an '
            "integer in [0, num-clients] and R a finite number > 0",
        ),
        "task_arrivals": Option(
            "models that join during training",
            form='"" (none) or name:round pairs separated by commas (digits_2:30,'
            "synthetic:60), each a model of the run at most once, each round in "
            "[0, num-rounds]",
        ),
        "client_pins": Option(
            "pinned client ids: a claim of a pinned id without its credential is refused",
            form='"" (no pins) or id=pin pairs separated by commas, pin token:<sha256 '
            "hex> or key:<sha256 hex>, or *=key:first-use (docs/how-to/defences.md, "
            "Client identity)",
        ),
        "target_accuracy": Option(
            "target accuracy per model: summary.json records the rounds to reach it "
            "(rounds_to_target, rounds_to_target_all)",
            form='"" (none), one accuracy in (0, 1] for every model (0.8) or '
            "model:accuracy pairs separated by commas (digits:0.8,synthetic:0.6)",
        ),
        "seed": Option("the one seed of the run", low=0),
        "data_seed": Option(
            "seed of the clients' data and the server's test sets; -1 = "
            "seed (fix it to hold the data fixed while seed varies)",
            low=-1,
        ),
        "model_seed": Option(
            "seed of the models' initial weights; -1 = seed (fix it "
            "and data-seed to vary only sampling and training)",
            low=-1,
        ),
        "output_dir": Option(
            "folder of metrics.csv, summary.json, accuracy.png and the checkpoint",
            form='a folder; "" writes nothing',
        ),
        "overwrite": Option(
            "start a new run in an output folder that holds another run's "
            "checkpoint.pkl (without it such a run is refused)",
            form="a switch (no value)",
        ),
        "resume_from": Option(
            "a checkpoint (file, or folder holding checkpoint.pkl) to continue",
            form='a file or folder; "" starts fresh',
        ),
    }


def _defence_options() -> dict[str, Option]:
    """The options of the bounds on hostile updates and reports."""
    return {
        "max_update_norm": Option("reject updates whose L2 norm exceeds this", low=0, zero="none"),
        "update_norm_factor": Option(
            "reject updates above this multiple of the model's reference norm",
            low=1,
            low_open=True,
            off="off",
        ),
        "update_clip_factor": Option(
            "scale updates above this multiple of the model's reference norm down to it",
            low=1,
            off="off",
        ),
        "direction_factor": Option(
            "scale a client's updates of a model down to the "
            "reference norm when they point against the other "
            "clients' by more than this many robust deviations",
            low=0,
            low_open=True,
            off="off",
        ),
        "influence_clip_factor": Option(
            "scale updates whose influence on the step (weight "
            "in the aggregate x norm) exceeds this multiple of "
            "the round's lower median influence down to it "
            "(StaleVR: also data share x norm)",
            low=1,
            off="off",
        ),
        "reversed_influence_factor": Option(
            "scale updates that point against the "
            "model's other updates (negative cosine with "
            "their median, this round and on average) "
            "whose influence on the step exceeds this "
            "multiple of the round's lower median "
            "influence down to it",
            low=1,
            off="off",
        ),
        "loss_cap": Option(
            "cap reported losses above this multiple of the task's reference loss",
            low=1,
            low_open=True,
            off="off",
        ),
        "count_cap": Option(
            "use a client's sample count up to this multiple of the task's median count",
            low=1,
            off="off",
        ),
        "defences": Option(
            "every bound on hostile updates as its own setting gives it (default) or all "
            "off (off: the papers' algorithms as stated)",
            lambda: ["default", "off"],
        ),
    }


def _engine_options() -> dict[str, Option]:
    """The options of round trips, nodes, differential privacy, trackers and console."""
    return {
        "timeout": Option(
            "seconds to wait for the replies of one round trip", low=0, low_open=True
        ),
        "clients_per_node": Option(
            "clients each Flower node hosts and computes per model at once (simulation "
            "engine: ceil(num-clients / K) virtual nodes; 1 = one node per client)",
            form="auto (one node per CPU, or per GPU with --num-gpus-per-node, that Ray "
            "sees) or a whole number >= 1",
        ),
        "dp": Option(
            "per-model differential privacy (mmfl_flwr.privacy): clip every "
            "update, noise every model's aggregate, report epsilon per model",
            _dp_kinds,
            empty="off",
        ),
        "dp_noise_multiplier": Option(
            "noise multiplier z of the DP noise (std z C / m)", low=0, finite=True
        ),
        "dp_clipping_norm": Option(
            "DP clipping norm C of each update's trainable entries "
            "(the initial norm when adaptive)",
            low=0,
            low_open=True,
            finite=True,
        ),
        "dp_sampled_clients": Option(
            "clients m of a model's aggregate in the DP noise std z C / m (required with dp)",
            low=0,
            zero="unset",
        ),
        "dp_delta": Option(
            "delta at which each model's epsilon is reported",
            low=0,
            low_open=True,
            high=1,
            high_open=True,
        ),
        "dp_noise_seed": Option(
            "seed of the DP noise: -1 draws it from the operating "
            "system (private, not reproducible); a seed >= 0 makes it "
            "reproducible and not private against whoever knows it",
            low=-1,
        ),
        "log_to": Option(
            "experiment trackers the server streams the run to (docs/tracking.md; each "
            "needs its extra: pip install 'mmfl-flwr[tracking]')",
            form='"" (none) or comma-separated, each one of tensorboard, mlflow, wandb',
        ),
        "log_dir": Option(
            "TensorBoard's folder (tensorboard --logdir it)",
            form='a folder; "" is OUTPUT-DIR/tensorboard',
        ),
        "log_clients_every": Option(
            "log the clients' training counts to the trackers every this many rounds",
            low=0,
            zero="at the end only",
        ),
        "no_progress": Option(
            "print one line per round instead of the progress bar shown on a terminal",
            form="a switch (no value)",
        ),
        "no_report": Option(
            "write no report.html at the end of the run",
            form="a switch (no value)",
        ),
    }


@functools.cache
def options() -> dict[str, Option]:
    """Setting (field name) -> :class:`Option`, for every field of
    :class:`~mmfl_flwr.config.Settings` but ``extra``, in field order."""
    from mmfl_flwr.config import Settings

    table = {**_general_options(), **_run_options(), **_defence_options(), **_engine_options()}
    for fld in setting_parameters():
        table[fld] = setting_option(fld)
    names = [f.name for f in dataclasses.fields(Settings) if f.name != "extra"]
    missing = set(names) ^ set(table)
    if missing:
        raise AssertionError(f"options() and Settings differ in {sorted(missing)}")
    return {n: table[n] for n in names}


def setting_help(name: str) -> str:
    """The ``mmfl run --help`` text of setting ``name``: what it does, its
    allowed values (:meth:`Option.allowed`), its default and the presets that
    take it."""
    from mmfl_flwr.config import Settings
    from mmfl_flwr.core.card import presets_taking

    opt = options()[name]
    default = getattr(Settings(), name)
    users = presets_taking(name)
    used_by = f" Strategies: {', '.join(users)}." if users else ""
    if isinstance(default, bool):
        return f"{opt.help}. Allowed: {opt.allowed()}. Default: {'on' if default else 'off'}."
    return f"{opt.help}. Allowed: {opt.allowed()}. Default: {default!r}.{used_by}"


#: The run-config spellings of a switch (``overwrite``, ``download``).
_BOOLS = {"true": True, "1": True, "false": False, "0": False}


@functools.cache
def _field_types() -> dict[str, type]:
    """Setting -> its type (the type of its default: int, float, str, bool)."""
    from mmfl_flwr.config import Settings

    defaults = Settings()
    return {name: type(getattr(defaults, name)) for name in options()}


#: How the messages name each type of setting.
_KINDS = {int: "a whole number", float: "a number", bool: "true or false", str: "text"}


def _of_type(value: Any, typ: type) -> bool:
    """Whether ``value`` is of setting type ``typ``: a bool is no number, an int
    is a float's value too, numpy scalars count as their kind."""
    if typ is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if typ is int:
        return isinstance(value, numbers.Integral)
    if typ is float:
        return isinstance(value, numbers.Real)
    return isinstance(value, str)


def _type_error(name: str, value: Any) -> str:
    """The message for ``value`` of setting ``name`` that is not of its type."""
    opt = options()[name]
    typ = _field_types()[name]
    allowed = opt.allowed()
    kind = _KINDS[typ]
    return (
        f"{name.replace('_', '-')} must be {kind}"
        f"{' ' + allowed if allowed and typ in (int, float) else ''}; got {value!r}"
    )


def option_error(name: str, value: Any, settings: Any = None) -> str | None:
    """The one-line message for ``value`` of setting ``name`` (a field of
    :class:`~mmfl_flwr.config.Settings`), or None when it is allowed: of the setting's type and
    accepted by its :class:`Option` (:func:`options`). The same message on
    every surface: ``mmfl run``, a ``--config`` file, :meth:`~mmfl_flwr.config.Settings.validate`,
    the preset factories and :class:`~mmfl_flwr.strategy.MultiModelStrategy`.
    A bound that names another setting (``clients-per-round <= num-clients``)
    is checked only with ``settings``."""
    typ = _field_types()[name]
    if not _of_type(value, typ):
        return _type_error(name, value)
    opt = options()[name]
    bounded = dataclasses.replace(opt, high=None) if isinstance(opt.high, str) else opt
    if (bounded if settings is None else opt).accepts(value, settings):
        return None
    return opt.error(name, value, settings)


def check_option(name: str, value: Any, settings: Any = None) -> None:
    """Raise ValueError with :func:`option_error`'s message unless ``value`` is
    an allowed value of setting ``name``."""
    message = option_error(name, value, settings)
    if message is not None:
        raise ValueError(message)


def _coerce(key: str, value: Any, typ: type) -> Any:
    """``value`` of run-config key ``key`` as ``typ``: a number may be given as
    text (``"0.5"``), a whole float as an int; a boolean for a number
    (``local-epochs = true``), a fraction for an int or a switch other than
    true / false / 1 / 0 is a ValueError, never a silent 1 or False."""
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, float) or str(value).strip().lower() not in _BOOLS:
                raise ValueError
            return _BOOLS[str(value).strip().lower()]
        if isinstance(value, bool) and typ in (int, float):
            raise ValueError
        if typ is int:
            if isinstance(value, float) and value != int(value):
                raise ValueError
            return int(value)
        if typ is float:
            return float(value)
        return str(value)
    except (TypeError, ValueError) as err:
        name = key.replace("-", "_")
        if name in options():  # the message of every other surface
            raise ValueError(_type_error(name, value)) from err
        raise ValueError(f"{key}={value!r} is not a valid {typ.__name__}") from err
