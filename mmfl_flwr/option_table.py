"""The rows of the run settings' option table: what every setting of
:class:`~mmfl_flwr.config.Settings` does and which values it accepts, one
:class:`~mmfl_flwr.core.parameter.Option` per setting, in four groups (the
preset, federation and training; arrivals, seeds and locations; the defences;
engine, privacy, trackers and console), and the algorithm cards' settings.

:func:`mmfl_flwr.config.options` is the table in the order of the fields, the
one that ``mmfl run --help``, ``docs/reference/run-config.md``,
``Settings.validate``, the run-config reader and the preset factories read; the
help text and the error messages are written from it there. This module only
holds the rows, so it imports nothing of ``config``.
"""

from __future__ import annotations

from mmfl_flwr.core.card import setting_option, setting_parameters
from mmfl_flwr.core.parameter import Option

__all__ = ["option_rows"]


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
            "model's other updates (cosine with their "
            "median below -0.1, this round and on average) "
            "whose influence on the step exceeds this "
            "multiple of the round's lower median "
            "influence down to it; where the clients agree, "
            "hold such updates together to this many "
            "typical pushes of the updates that agree",
            low=1,
            off="off",
        ),
        "collusion_factor": Option(
            "count updates of a model whose cosine distance is under the "
            "round's median distance divided by this as one client's "
            "(each scaled by 1 / the group's size); reject such a group whose "
            "mean points against the round's other updates",
            low=1,
            low_open=True,
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


def option_rows() -> dict[str, Option]:
    """Setting (field name) -> :class:`Option`: the general settings' rows, then
    each algorithm card setting's (:func:`~mmfl_flwr.core.card.setting_option`).
    :func:`mmfl_flwr.config.options` puts them in the order of the fields of
    ``Settings`` and checks that they are the same settings."""
    table = {**_general_options(), **_run_options(), **_defence_options(), **_engine_options()}
    for fld in setting_parameters():
        table[fld] = setting_option(fld)
    return table
