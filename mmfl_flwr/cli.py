"""The ``mmfl`` command line: ``mmfl run`` runs an MMFL job and writes results.

Examples
--------
``mmfl run`` — the default 3-model job on Flower's simulation engine.
``mmfl run --engine inprocess --strategy mfa-rand --num-rounds 5`` — fast, no Ray.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence

from mmfl_flwr.config import Settings
from mmfl_flwr.presets import AGGREGATORS, PRESETS
from mmfl_flwr.runner import ENGINES, run


def _add_settings_args(p: argparse.ArgumentParser) -> None:
    defaults = Settings()
    helps = {
        "strategy": f"preset: {', '.join(PRESETS)}",
        "aggregator": f"override the preset's aggregator: {', '.join(AGGREGATORS)}",
        "tasks": "comma-separated task kinds (digits, synthetic); repeats are separate models",
        "num_clients": "clients in the federation",
        "num_rounds": "training rounds",
        "local_epochs": "local SGD epochs per round",
        "lr": "client learning rate",
        "batch_size": "client mini-batch size",
        "budget_fraction": "m/V for budgeted policies (random)",
        "clients_per_round": "K for mfa-rand / mfa-rr / multi-fedavg (0 = all)",
        "labels_per_client": "fraction of labels each client holds (label skew)",
        "synthetic_max_samples": "cap on a Synthetic(1,1) user's samples (0 = none)",
        "fraction_evaluate": "fraction of clients that also evaluate locally",
        "seed": "the one seed of the run",
        "output_dir": "folder for metrics.csv, summary.json, accuracy.png",
        "timeout": "seconds to wait for one round trip's replies",
    }
    for f in dataclasses.fields(Settings):
        if f.name == "extra":
            continue
        default = getattr(defaults, f.name)
        p.add_argument(
            "--" + f.name.replace("_", "-"),
            type=type(default),
            default=default,
            help=f"{helps.get(f.name, '')} (default: {default!r})",
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mmfl`` command."""
    parser = argparse.ArgumentParser(
        prog="mmfl", description="Multi-model federated learning on Flower."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run an MMFL job and write its results")
    p_run.add_argument(
        "--engine", choices=ENGINES, default="simulation",
        help="Flower's Ray simulation engine (default) or the in-process engine",
    )
    p_run.add_argument("--num-cpus", type=int, default=None,
                       help="CPUs Ray may use (simulation engine; default: all)")
    p_run.add_argument("--verbose", action="store_true", help="show Flower's and Ray's logs")
    p_run.add_argument(
        "--config", metavar="FILE", default=None,
        help="a TOML file of run-config keys (e.g. configs/paper003-3task.toml); "
             "setting flags given on the command line override it",
    )
    p_run.add_argument(
        "--resume", metavar="DIR", default=None,
        help="continue the run whose output folder is DIR from its last checkpoint "
             "(its config.json gives every setting; other setting flags are ignored)",
    )
    _add_settings_args(p_run)
    args = parser.parse_args(argv)

    if args.command == "run":
        values = {
            f.name: getattr(args, f.name)
            for f in dataclasses.fields(Settings)
            if f.name != "extra"
        }
        try:
            if args.resume:
                cfg = os.path.join(args.resume, "config.json")
                if not os.path.exists(cfg):
                    parser.error(f"--resume {args.resume}: no config.json there (not an "
                                 "output folder of mmfl run?)")
                from mmfl_flwr.checkpoint import checkpoint_file

                if not checkpoint_file(args.resume).exists():
                    parser.error(f"--resume {args.resume}: no checkpoint.pkl there (the "
                                 "run wrote none: was its output-dir empty?)")
                settings = Settings.load(cfg)
                settings.output_dir = args.resume
                settings.resume_from = args.resume
            elif args.config:
                import tomllib

                with open(args.config, "rb") as f:
                    settings = Settings.from_run_config(tomllib.load(f))
                if settings.extra:
                    parser.error(f"--config {args.config}: unknown keys {sorted(settings.extra)}")
                defaults = Settings()
                for name, value in values.items():  # explicit flags win
                    if value != getattr(defaults, name):
                        setattr(settings, name, value)
            else:
                settings = Settings(**values)
            settings.validate()
        except ValueError as err:
            parser.error(str(err))
        print(
            f"[mmfl] {settings.strategy} on {settings.engine_label(args.engine)}: "
            f"models {', '.join(settings.model_names)}; {settings.num_clients} clients, "
            f"{settings.num_rounds} rounds, seed {settings.seed}",
            flush=True,
        )
        t0 = time.monotonic()
        result = run(settings, engine=args.engine, num_cpus=args.num_cpus, verbose=args.verbose)
        final = {t: round(r["accuracy"], 4) for t, r in result.final().items()}
        print(f"[mmfl] done in {time.monotonic() - t0:.1f}s; final accuracy "
              f"{json.dumps(final)}", flush=True)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
