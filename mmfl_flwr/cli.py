"""The ``mmfl`` command line: ``mmfl run`` runs an MMFL job and writes results.

Examples
--------
``mmfl run`` — the default 3-model job on Flower's simulation engine.
``mmfl run --engine inprocess --strategy mfa-rand --num-rounds 5`` — fast, no Ray.
``mmfl run --resume results/mmfl --num-rounds 40`` — continue a run to 40 rounds.
``mmfl compare results/a results/b`` — overlay runs (mean and band over seeds).
``mmfl report results/a`` — one self-contained HTML report of a run (or a comparison).
``mmfl run --log-to tensorboard,mlflow,wandb`` — stream the run to trackers.

Every user error (bad settings, a missing ``--config`` file or dataset, an
unreadable checkpoint, an output folder that holds another run) is one line on
stderr and exit code 2, found before anything is written.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from mmfl_flwr.checkpoint import CHECKPOINT_FILE
from mmfl_flwr.config import BOUNDS, RESUME_MAY_CHANGE, Settings, setting_help
from mmfl_flwr.engine_options import ENGINES, EngineOptions
from mmfl_flwr.runner import run

#: Names of the Settings fields that have a command-line flag.
SETTING_NAMES = tuple(f.name for f in dataclasses.fields(Settings) if f.name != "extra")


def _flag(name: str) -> str:
    """The command-line flag of a Settings field (``num_rounds`` -> ``--num-rounds``)."""
    return "--" + name.replace("_", "-")


#: The argument groups of ``mmfl run --help``, in order, with what they hold.
GROUPS = {
    "run": "what is run: clients, rounds, seeds, arrivals; a --config file, --resume",
    "strategy": "the algorithm (preset, aggregator, its parameters) and local training",
    "data": "tasks (one model each), their data and its split over the clients",
    "engine": "where the clients run (--engine) and on which resources",
    "defences": "checks and bounds on what clients send",
    "privacy": "per-model differential privacy (mmfl_flwr.privacy)",
    "outputs": "where results go, what is printed",
}
#: Settings whose group is not ``strategy`` (the preset and its parameters).
_SETTING_GROUP = {
    **dict.fromkeys(
        (
            "num_clients",
            "num_rounds",
            "seed",
            "data_seed",
            "model_seed",
            "timeout",
            "client_arrivals",
            "task_arrivals",
            "resume_from",
        ),
        "run",
    ),
    **dict.fromkeys(
        (
            "tasks",
            "labels_per_client",
            "profile",
            "data_root",
            "download",
            "synthetic_max_samples",
        ),
        "data",
    ),
    "clients_per_node": "engine",
    **dict.fromkeys((*BOUNDS, "defences", "client_pins"), "defences"),
    **dict.fromkeys(
        (
            "output_dir",
            "overwrite",
            "target_accuracy",
            "log_to",
            "log_dir",
            "log_clients_every",
            "no_progress",
            "no_report",
        ),
        "outputs",
    ),
}


def setting_group(name: str) -> str:
    """The ``mmfl run --help`` group of setting ``name`` (:data:`GROUPS`)."""
    if name.startswith("dp"):
        return "privacy"
    return _SETTING_GROUP.get(name, "strategy")


def _add_settings_args(groups: dict[str, argparse._ArgumentGroup]) -> None:
    """One flag per setting. Their default is ``argparse.SUPPRESS``, so that only
    the flags given on the command line appear in the parsed namespace. Each
    flag's help (what it does, its allowed values, its default, the presets that
    take it) is :func:`~mmfl_flwr.config.setting_help`, written from the same
    :func:`~mmfl_flwr.config.options` table that ``Settings.validate`` checks."""
    defaults = Settings()
    for name in SETTING_NAMES:
        default = getattr(defaults, name)
        text = setting_help(name).replace("%", "%%")  # argparse expands %-formats
        p = groups[setting_group(name)]
        if isinstance(default, bool):  # a switch: --overwrite
            p.add_argument(_flag(name), action="store_true", default=argparse.SUPPRESS, help=text)
            continue
        typ = _whole_number if type(default) is int else type(default)
        p.add_argument(_flag(name), type=typ, default=argparse.SUPPRESS, help=text)


def _whole_number(text: str) -> int | float:
    """The value of a whole-number flag: an int, or the number typed (``1.5``),
    which the settings then refuse with the message of every other surface
    (:func:`~mmfl_flwr.config.option_error`); text that is no number is
    argparse's "invalid int value"."""
    try:
        return int(text)
    except ValueError:
        return float(text)  # a ValueError here: argparse names the flag and the text


_whole_number.__name__ = "int"  # argparse: "invalid int value: 'abc'"


def _fail(message: str, prog: str = "mmfl run") -> NoReturn:
    """Report a user error as one line on stderr and exit with code 2."""
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    raise SystemExit(2)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage block)."""

    def error(self, message: str) -> NoReturn:
        _fail(f"{message} (see {self.prog} --help)", self.prog)


def build_parser() -> argparse.ArgumentParser:
    """The ``mmfl`` argument parser."""
    parser = _Parser(prog="mmfl", description="Multi-model federated learning on Flower.")
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run an MMFL job and write its results")
    from mmfl_flwr import compare

    compare.add_parser(sub)
    from mmfl_flwr import report

    report.add_parser(sub)
    groups = {name: p_run.add_argument_group(name, text) for name, text in GROUPS.items()}
    _add_engine_args(groups)
    _add_run_args(groups)
    _add_settings_args(groups)
    return parser


def _add_engine_args(groups: dict[str, argparse._ArgumentGroup]) -> None:
    """The flags of ``mmfl run`` that choose the engine and its resources (and ``--verbose``)."""
    groups["engine"].add_argument(
        "--engine",
        choices=ENGINES,
        default="simulation",
        help="simulation: Flower's Ray simulation engine (default); inprocess: the same "
        "ServerApp and ClientApp in one process, one ClientApp call per message; "
        "vectorized: in one process, each round trip computed per model for all "
        "its clients at once with torch.func (CUDA when available)",
    )
    groups["engine"].add_argument(
        "--num-cpus",
        type=int,
        default=None,
        help="CPUs Ray may use (simulation engine; default: all)",
    )
    groups["engine"].add_argument(
        "--num-gpus-per-client",
        type=float,
        default=None,
        metavar="F",
        help="each client's share of a GPU with one client per Flower node (simulation "
        "engine; --clients-per-node auto then means 1): 0.25 runs 4 clients per "
        "GPU at a time; a value in [0, 1] or a whole number; refused where Ray sees "
        "no GPU (default: 0, CPUs only)",
    )
    groups["engine"].add_argument(
        "--num-gpus-per-node",
        type=float,
        default=None,
        metavar="F",
        help="each Flower node's share of a GPU, a node hosting --clients-per-node "
        "clients (simulation engine; with --clients-per-node auto: one node per "
        "GPU share Ray sees): 1 puts each node on a GPU of its own; a value in "
        "[0, 1] or a whole number; refused where Ray sees no GPU",
    )
    groups["engine"].add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="run the clients on the existing Ray cluster at ADDR (the head's HOST:PORT, "
        "or auto for the one `ray start` started here; simulation engine; default: "
        "$RAY_ADDRESS, else a Ray instance of this machine)",
    )
    groups["outputs"].add_argument(
        "--verbose", action="store_true", help="show Flower's and Ray's logs"
    )
    groups["engine"].add_argument(
        "--vector-chunk",
        type=int,
        default=None,
        metavar="C",
        help="clients trained in one batched call (vectorized engine; default: as many "
        "as fit in half of the free GPU memory, 64 on the CPU)",
    )
    groups["engine"].add_argument(
        "--threads",
        default=None,
        metavar="K",
        help="torch threads of the vectorized engine: auto (default) uses the cores "
        "other processes leave free (at most OMP_NUM_THREADS where it is set), "
        "checked before every round trip; K fixes them",
    )


def _add_run_args(groups: dict[str, argparse._ArgumentGroup]) -> None:
    """The flags of ``mmfl run`` that say what is run: --config, --resume, --sequential."""
    groups["run"].add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="a TOML file of run-config keys (e.g. configs/paper003-3task.toml); "
        "setting flags given on the command line override it",
    )
    groups["run"].add_argument(
        "--resume",
        metavar="DIR",
        default=None,
        help="continue the run whose output folder is DIR from its last checkpoint "
        "(its config.json gives every setting; --num-rounds may extend it, "
        "--timeout and --clients-per-node may change, any other setting flag must "
        "match config.json)",
    )
    groups["run"].add_argument(
        "--sequential",
        action="store_true",
        help="instead of the multi-model run: train the models one after another, each "
        "alone with all clients (the full preset, FedAvg), and write their accuracy "
        "per round to OUTPUT-DIR/single.csv (the single-model curves of "
        "mmfl_flwr.gain)",
    )


def version_text() -> str:
    """What ``mmfl --version`` prints: this package's version and Flower's."""
    from importlib.metadata import PackageNotFoundError, version

    from mmfl_flwr import __version__

    try:
        flwr = version("flwr")
    except PackageNotFoundError:  # pragma: no cover - flwr is a dependency
        flwr = "not installed"
    return f"mmfl {__version__} (mmfl-flwr; flwr {flwr}, Python {sys.version.split()[0]})"


def _message(err: BaseException) -> str:
    """The message of ``err`` (a missing dataset: its first line, where it was
    looked for and how to get it, without the list layout)."""
    from mmfl_flwr.tasks.datasets import DatasetNotFound

    if isinstance(err, DatasetNotFound):
        first = str(err).splitlines()[0]
        looked = f" Looked in: {', '.join(err.paths)}." if err.paths else ""
        return f"{first}{looked} How to get it: {err.how_to}"
    return str(err) or type(err).__name__


def _resumed_settings(folder: str, given: dict[str, Any]) -> Settings:
    """The settings of the run in output folder ``folder`` (its config.json), with
    the flags of :data:`RESUME_MAY_CHANGE` applied; any other given flag must
    equal the run's value."""
    if not (Path(folder) / "config.json").is_file():
        raise ValueError(
            f"--resume {folder}: no config.json there (not an output folder of mmfl run?)"
        )
    if not (Path(folder) / CHECKPOINT_FILE).is_file():
        raise ValueError(
            f"--resume {folder}: no {CHECKPOINT_FILE} there (the run wrote "
            "none: was its output-dir empty?)"
        )
    settings = Settings.load(str(Path(folder) / "config.json"))
    settings.output_dir = settings.resume_from = folder
    for name, value in given.items():
        if name in RESUME_MAY_CHANGE:
            setattr(settings, name, value)
        elif value != getattr(settings, name):
            raise ValueError(
                f"--resume {folder}: {_flag(name)} {value!r} differs from the run's "
                f"{name.replace('_', '-')}={getattr(settings, name)!r} (config.json); "
                f"with --resume only {' and '.join(map(_flag, RESUME_MAY_CHANGE))} may change"
            )
    return settings


def _config_file_settings(path: str, given: dict[str, Any]) -> Settings:
    """The run-config keys of TOML file ``path``, with the given flags over them."""
    import tomllib

    try:
        with open(path, "rb") as f:
            keys = tomllib.load(f)
    except OSError as err:
        raise ValueError(f"--config {path}: cannot read it ({err.strerror})") from err
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"--config {path}: not valid TOML ({err})") from err
    settings = Settings.from_run_config(
        {**keys, **{name.replace("_", "-"): value for name, value in given.items()}}
    )
    if settings.extra:
        raise ValueError(f"--config {path}: unknown keys {sorted(settings.extra)}")
    return settings


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The settings that ``mmfl run`` flags describe. Only the setting flags given
    on the command line override ``--config`` or defaults, whatever their value."""
    given = {name: getattr(args, name) for name in SETTING_NAMES if hasattr(args, name)}
    if args.resume:
        for flag, used in (("--config", args.config), ("--overwrite", "overwrite" in given)):
            if used:
                raise ValueError(f"--resume and {flag} exclude each other")
        settings = _resumed_settings(args.resume, given)
    elif args.config:
        settings = _config_file_settings(args.config, given)
    else:
        settings = Settings(**given)
    settings.validate()
    return settings


def check_before_run(settings: Settings) -> None:
    """Everything that can be checked before a run writes anything: the output
    folder (another run's checkpoint is kept unless resumed or ``overwrite``),
    the checkpoint to resume, and the data (``settings`` are validated). Raises
    ValueError or OSError (DatasetNotFound)."""
    from mmfl_flwr.flower_app.data import federation_for
    from mmfl_flwr.flower_app.server_app import (
        check_output_folder,
        check_resume,
        strategy_from_settings,
    )
    from mmfl_flwr.tracking import check_installed, parse_log_to

    check_installed(parse_log_to(settings.log_to))  # a missing extra: pip install ...
    check_output_folder(settings)
    if settings.resume_from:
        check_resume(settings, strategy_from_settings(settings))
    # loads the real datasets (refused here when missing); generates no synthetic
    # client, which an engine in this process builds with the rest
    federation_for(settings, clients=(), server_tests=False)


def _check_tracking_flags(settings: Settings) -> None:
    """``--log-dir`` and ``--log-clients-every`` without a tracker that reads
    them would be dropped silently: refused."""
    from mmfl_flwr.tracking import parse_log_to

    names = parse_log_to(settings.log_to)
    if settings.log_dir and "tensorboard" not in names:
        raise ValueError(
            f"--log-dir {settings.log_dir} (log-dir) is TensorBoard's folder: it needs "
            "--log-to tensorboard"
        )
    if settings.log_clients_every and not names:
        raise ValueError(
            f"--log-clients-every {settings.log_clients_every} (log-clients-every) applies "
            "to the trackers of --log-to, and none is named"
        )


def _check_pins_provable(settings: Settings) -> None:
    """A pin is proved by a node's ``client-token`` (``token:``) or its SuperNode's
    authenticated public key (``key:``); the nodes of ``mmfl run``'s engines have
    neither, so every client a pin covers would be refused (``*=key:first-use``:
    every client, and the run trains nothing): refused before the run starts."""
    pins = settings.client_pin_map()
    if pins:
        named = sorted(pins)
        raise ValueError(
            f"--client-pins: the nodes of mmfl run's engines carry no client-token and no "
            f"SuperNode key, so every client pinned ({', '.join(named[:3])}"
            f"{', ...' if len(named) > 3 else ''}) would be refused; pins apply to a "
            f"deployment (flwr run on a SuperLink, docs/deploy.md)"
        )


def engine_options(args: argparse.Namespace) -> EngineOptions:
    """The engine options of ``mmfl run``'s flags."""
    return EngineOptions(
        engine=args.engine,
        vector_chunk=getattr(args, "vector_chunk", None),
        threads=getattr(args, "threads", None),
        num_gpus_per_client=getattr(args, "num_gpus_per_client", None),
        num_gpus_per_node=getattr(args, "num_gpus_per_node", None),
        ray_address=getattr(args, "ray_address", None),
    )


def check_ray_options(args: argparse.Namespace, settings: Settings | None = None) -> dict[str, Any]:
    """The Ray options given on the command line (``--num-gpus-per-client``,
    ``--num-gpus-per-node``, ``--ray-address``) as keyword arguments of
    :func:`~mmfl_flwr.runner.run`,
    checked before the run: refused with another engine than ``simulation``;
    an invalid GPU share, GPUs where Ray sees none, an unreachable cluster and
    ``--num-cpus`` with ``--ray-address`` are ValueErrors
    (:func:`~mmfl_flwr.flower_app.launch.plan_ray`, which also checks
    ``RAY_ADDRESS``)."""
    from os import environ

    options = engine_options(args)
    options.check(flags=True)
    given = options.ray_options()
    for name in given:
        if getattr(args, "sequential", False):
            raise ValueError(f"{_flag(name)} does not apply to --sequential yet")
    if args.engine == "simulation" and (given or environ.get("RAY_ADDRESS", "").strip()):
        from mmfl_flwr.flower_app.launch import plan_ray, resolve_clients_per_node

        plan = plan_ray(
            options.num_gpus_per_client or 0.0,
            options.ray_address,
            args.num_cpus,
            options.num_gpus_per_node,
        )
        resolve_clients_per_node(
            settings or settings_from_args(args),
            plan,
            per_client_gpus=bool(options.num_gpus_per_client),
        )
    return given


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill``, a scheduler's stop) ends the run as Ctrl-C does."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave the handler alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def interrupted_message(settings: Settings, engine: str = "simulation") -> str:
    """The one line an interrupted run ends with: the last finished round (from
    the checkpoint in the output folder) and the command that continues it (on
    the same ``engine``)."""
    from mmfl_flwr.checkpoint import load_checkpoint

    out = settings.output_dir
    if not out:
        return (
            "mmfl run: interrupted; nothing was written (no --output-dir), so "
            "nothing can be resumed"
        )
    try:
        done = int(load_checkpoint(out)["round"])
    except Exception:  # no checkpoint yet: the folder holds no run to continue
        return (
            f"mmfl run: interrupted before the first evaluation; {out} holds no "
            f"checkpoint, so start the run again"
        )
    on = "" if engine == "simulation" else f" --engine {engine}"
    where = (
        f"the finished rounds are in {out} (metrics.csv, assignments.csv, accuracy.png"
        f"{'' if settings.no_report else ', report.html'})"
        if done
        else "no round had finished"
    )
    return (
        f"mmfl run: interrupted after round {done} of {settings.num_rounds}; {where}; "
        f"continue with: mmfl run --resume {shlex.quote(out)}{on}"
    )


def colour_logs_only_on_a_terminal() -> None:
    """Flower's log lines carry ANSI colour codes; keep them where stderr is a
    terminal and ``NO_COLOR`` is unset, plain text everywhere else (a file, a
    pipe, CI logs)."""
    import os

    from flwr.common.logger import update_console_handler

    isatty = getattr(sys.stderr, "isatty", None)
    update_console_handler(colored=bool(isatty and isatty()) and not os.environ.get("NO_COLOR"))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mmfl`` command."""
    args = build_parser().parse_args(argv)
    colour_logs_only_on_a_terminal()
    if args.command == "compare":
        from mmfl_flwr import compare

        return compare.main(args)
    if args.command == "report":
        from mmfl_flwr import report

        return report.main(args)
    if args.command != "run":
        return 2
    try:
        settings = settings_from_args(args)
        from mmfl_flwr.flower_app.server_app import check_output_location

        # before any data is loaded or any process (Ray) started
        check_output_location(settings.output_dir)
        ray_options = check_ray_options(args, settings)
        if args.threads is not None and args.sequential:
            raise ValueError("--threads does not apply to --sequential yet")
        _check_pins_provable(settings)
        _check_tracking_flags(settings)
        if args.sequential and settings.log_to:
            raise ValueError("--log-to does not apply to --sequential yet")
        if args.sequential:
            from mmfl_flwr.sequential import check_before_sequential

            check_before_sequential(settings)
        else:
            check_before_run(settings)
    except (OSError, ValueError) as err:
        _fail(_message(err))
    if args.sequential:
        from mmfl_flwr.sequential import run_sequential

        chunk = {} if args.vector_chunk is None else {"vector_chunk": args.vector_chunk}
        run_sequential(
            settings, engine=args.engine, num_cpus=args.num_cpus, verbose=args.verbose, **chunk
        )
        return 0
    print(
        f"[mmfl] {settings.strategy} on {settings.engine_label(args.engine)}: "
        f"models {', '.join(settings.model_names)}; {settings.num_clients} clients, "
        f"{settings.num_rounds} rounds, seed {settings.seed}",
        flush=True,
    )
    from mmfl_flwr.flower_app.launch import SimulationError

    t0 = time.monotonic()
    vector = {} if args.vector_chunk is None else {"vector_chunk": args.vector_chunk}
    if args.threads is not None:
        vector["threads"] = args.threads
    try:
        with _sigterm_as_interrupt():
            result = run(
                settings,
                engine=args.engine,
                num_cpus=args.num_cpus,
                verbose=args.verbose,
                **ray_options,
                **vector,
            )
    except KeyboardInterrupt:
        print(interrupted_message(settings, args.engine), file=sys.stderr, flush=True)
        return 130
    except SimulationError as err:  # Flower's run failed (flwr run itself exits 0)
        print(f"mmfl run: error: the run failed: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    final = {t: round(r["accuracy"], 4) for t, r in result.final().items()}
    print(
        f"[mmfl] done in {time.monotonic() - t0:.1f}s; final accuracy {json.dumps(final)}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
