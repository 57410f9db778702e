"""Run settings: one dataclass, read from Flower's ``run_config`` or the CLI.

The keys (dashes, as in ``flwr run --run-config "num-rounds=20 strategy='mfa-rr'"``)
and their defaults are the app's ``[tool.flwr.app.config]`` in pyproject.toml.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Settings that a resumed run may change: they do not alter what the rounds
#: compute (``num_rounds`` extends or finishes the run).
RESUME_MAY_CHANGE = ("num_rounds", "timeout")
#: Settings that say where a run is written, not what it computes.
_LOCATION = ("output_dir", "resume_from", "overwrite")


@dataclass
class Settings:
    """Everything that defines an MMFL run.

    Attributes
    ----------
    strategy : str
        Preset name: ``random``, ``full``, ``mfa-rand``, ``mfa-rr``, ``multi-fedavg``,
        ``lvr``, ``gvr``, ``stalevr``, ``stalevre``, ``fedvarp``, ``fedstale``, ``mifa``,
        ``scaffold``, ``ranklist-ucb``, ``pareto-ucb``, ``group``.
    aggregator : str
        ``""`` for the preset's own, or ``fedavg`` / ``unbiased`` / ``mean``.
    tasks : str
        Comma-separated task kinds; repeats make separate models
        (``digits,synthetic,digits`` -> models ``digits``, ``synthetic``, ``digits_2``).
    num_clients : int
        Clients in the federation (simulation: virtual SuperNodes).
    num_rounds : int
        Training rounds.
    local_epochs, lr, batch_size : int, float, int
        Local SGD settings.
    budget_fraction : float
        ``m / V`` for the budgeted policies (random, lvr, gvr and the stale ones).
    clients_per_round : int
        ``K`` for MFA-Rand / MFA-RR / Multi-FedAvg (0 means all clients) and the
        UCB policies (required there).
    labels_per_client : float
        Fraction of the labels each client holds per image task (label skew).
    profile : str
        Client heterogeneity: ``uniform`` (all tasks, one processor, equal data
        weight), ``paper003`` (10% high-data clients per task with ~10x the
        samples, 10% of clients without one task, B_i = |S_i| / ceil(|S_i|/2) / 1
        for 25% / 50% / 25% of clients), ``clusters-consistent`` or
        ``clusters-inconsistent`` (5 label clusters per digits task, 20% of the
        labels each, one client map for all tasks or one per task).
    data_root : str
        Folder of the real datasets (``mnist``, ``fashion-mnist``, ``emnist``,
        ``cifar10``, ``shakespeare``, ``celeba-smiling``, ``celeba-eyeglasses``).
    synthetic_max_samples : int
        Cap on a Synthetic(1,1) user's samples (0: no cap).
    fraction_evaluate : float
        Fraction of clients that also evaluate on local data each round.
    stale_beta : float
        ``beta`` of ``fedstale`` (Eq. 17).
    stale_storage : str
        Storage of the stale updates: ``float32``, ``float16`` or ``disk``.
    stalevr_signal : str
        Sampling signal of ``stalevr``: ``loss`` (paper) or ``stale-residual``.
    stalevre_b0 : float
        ``b0`` of ``stalevre`` (Eq. 21).
    ucb_gamma : float
        Discount ``gamma`` of the UCB index (``ranklist-ucb``, ``pareto-ucb``).
    ucb_init : str
        How the UCB index gets its first observation per pair: ``loss-query``
        (one forward pass of every pair) or ``train`` (train untried pairs first,
        within K clients per round).
    group_participation : float
        Fraction of a group's clients that train each round (``group``).
    group_variant : str
        ``consistent`` (C-step on the loss vectors) or ``modified`` (C-step on
        one model's loss, rotating every cycle).
    group_max_clusters : int
        Upper bound of the silhouette search; 0 means ``S + 4``.
    client_arrivals : str
        Simulated client arrivals, ``""`` (all from the start) or
        ``exponential:static=24,rate=0.1``: clients ``0..static-1`` are there
        from the start; each other client arrives at a round drawn
        independently from an exponential distribution with that rate (finite,
        > 0) per round (mean ``1/rate`` rounds), from the run's seed.
    task_arrivals : str
        Models that join during training, ``name:round`` pairs separated by
        commas (``digits_2:30,synthetic:60``), each model at most once, each
        round in ``[0, num_rounds]``.
    client_pins : str
        Pinned client ids, ``id=pin`` pairs separated by commas
        (``3=token:<sha256 hex>,4=key:<sha256 hex>``; ``*=key:first-use``
        binds every id to the SuperNode key of its first claim; see
        :func:`mmfl_flwr.strategy.registration.check_pins`): a claim of a pinned
        id without its credential is refused. Empty: no pins.
    seed : int
        The one seed of the run (>= 0).
    output_dir : str
        Where ``metrics.csv``, ``summary.json``, ``assignments.csv`` and
        ``accuracy.png`` go; empty to
        write nothing.
    overwrite : bool
        Start a new run in an ``output_dir`` that holds another run's
        ``checkpoint.pkl`` (default False: refuse, so a finished or interrupted
        run is never clobbered by accident; resume it instead).
    resume_from : str
        A checkpoint (file, or folder holding ``checkpoint.pkl``) to continue
        from; empty to start fresh. With ``output_dir`` set, a checkpoint is
        written there after every round. Where the checkpoint's folder holds a
        ``config.json``, every setting but those of :data:`RESUME_MAY_CHANGE`,
        ``output_dir`` and ``resume_from`` must equal it.
    max_update_norm : float
        Absolute bound on an update's L2 norm: larger updates are rejected
        (0 = none).
    update_norm_factor : float
        Updates above this multiple of the model's reference norm (the lower
        median of recent update norms) are rejected (0 = off).
    loss_cap : float
        Reported losses (loss queries and training losses) above this multiple
        of the task's reference loss are capped (0 = off).
    count_cap : float
        A client's sample count of a task is used up to this multiple of the
        task's median count (0 = off).
    timeout : float
        Seconds to wait for the replies of one round trip.
    """

    strategy: str = "mfa-rr"
    aggregator: str = ""
    tasks: str = "digits,synthetic,digits"
    num_clients: int = 20
    num_rounds: int = 20
    local_epochs: int = 5
    lr: float = 0.1
    batch_size: int = 16
    budget_fraction: float = 0.1
    clients_per_round: int = 0
    labels_per_client: float = 0.3
    profile: str = "uniform"
    data_root: str = "data"
    synthetic_max_samples: int = 500
    fraction_evaluate: float = 0.0
    stale_beta: float = 0.8
    stale_storage: str = "float32"
    stalevr_signal: str = "loss"
    stalevre_b0: float = 1.0
    ucb_gamma: float = 0.9
    ucb_init: str = "loss-query"
    group_participation: float = 1 / 6
    group_variant: str = "consistent"
    group_max_clusters: int = 0
    client_arrivals: str = ""
    task_arrivals: str = ""
    client_pins: str = ""
    seed: int = 0
    output_dir: str = "results/mmfl"
    overwrite: bool = False
    resume_from: str = ""
    max_update_norm: float = 0.0
    update_norm_factor: float = 100.0
    loss_cap: float = 10.0
    count_cap: float = 200.0
    timeout: float = 600.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def task_kinds(self) -> list[str]:
        """The task kinds, one per model."""
        return [t.strip() for t in self.tasks.split(",") if t.strip()]

    def client_arrival_rounds(self) -> dict[str, int]:
        """The arrival round of every late client (see ``client_arrivals``)."""
        spec = self.client_arrivals.strip()
        if not spec:
            return {}
        kind, _, params = spec.partition(":")
        if kind != "exponential":
            raise ValueError(
                f"client-arrivals={spec!r}: expected 'exponential:static=N,rate=R'"
            )
        values: dict[str, float] = {"static": 0.0, "rate": 0.1}
        for item in params.split(","):
            key, _, val = item.partition("=")
            if key.strip() not in ("static", "rate"):
                raise ValueError(
                    f"client-arrivals={spec!r}: unknown key {key.strip()!r} (use static, rate)"
                )
            try:
                values[key.strip()] = float(val)
            except ValueError:
                raise ValueError(f"client-arrivals={spec!r}: bad value {item!r}") from None
        static, rate = values["static"], values["rate"]
        if not (math.isfinite(static) and static == int(static)
                and 0 <= static <= self.num_clients):
            raise ValueError(
                f"client-arrivals={spec!r}: static must be an integer in "
                f"[0, num-clients={self.num_clients}]"
            )
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"client-arrivals={spec!r}: rate must be a finite number > 0")
        import numpy as np

        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 4242]))
        late = range(int(static), self.num_clients)
        times = rng.exponential(1.0 / rate, size=len(late))
        return {str(c): max(1, int(np.ceil(t))) for c, t in zip(late, times)}

    def client_pin_map(self) -> dict[str, str]:
        """Client id -> pin (see ``client_pins``), checked and normalised."""
        from mmfl_flwr.strategy.registration import check_pins

        pins: dict[str, str] = {}
        for item in self.client_pins.split(","):
            if not item.strip():
                continue
            cid, sep, pin = item.partition("=")
            if not sep or not cid.strip() or cid.strip() in pins:
                raise ValueError(
                    f"client-pins={self.client_pins!r}: expected id=pin pairs, each id once"
                )
            pins[cid.strip()] = pin.strip()
        try:
            return check_pins(pins)
        except ValueError as err:
            raise ValueError(f"client-pins: {err}") from None

    def task_arrival_rounds(self) -> dict[str, int]:
        """Model name -> arrival round (see ``task_arrivals``); a model named
        twice is an error."""
        out: dict[str, int] = {}
        for item in self.task_arrivals.split(","):
            if not item.strip():
                continue
            name, _, rnd = item.partition(":")
            name = name.strip()
            try:
                when = int(rnd)
            except ValueError:
                raise ValueError(
                    f"task-arrivals={self.task_arrivals!r}: expected name:round pairs"
                ) from None
            if name in out:
                raise ValueError(
                    f"task-arrivals={self.task_arrivals!r} names {name} twice; "
                    "give each model one arrival round"
                )
            out[name] = when
        return out

    @property
    def model_names(self) -> list[str]:
        """The model (task) names, repeats suffixed (``digits_2``)."""
        from mmfl_flwr.tasks.federation import task_names

        return task_names(self.task_kinds)

    @staticmethod
    def engine_label(engine: str) -> str:
        """Human name of an engine."""
        return {
            "simulation": "Flower's simulation engine (Ray)",
            "inprocess": "the in-process engine",
        }.get(engine, engine)

    def to_run_config(self) -> dict[str, Any]:
        """The ``run_config`` dict (dashed keys) equivalent to these settings."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name != "extra":
                out[f.name.replace("_", "-")] = getattr(self, f.name)
        return out

    def save(self, path: str) -> None:
        """Write the settings as JSON (``config.json`` of an output folder)."""
        import json

        with open(path, "w") as f:
            json.dump(self.to_run_config(), f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def load(cls, path: str) -> Settings:
        """Read settings written by :meth:`save`; a file that is not valid JSON
        or holds invalid settings raises a ValueError naming it."""
        import json

        with open(path) as f:
            try:
                return cls.from_run_config(json.load(f))
            except ValueError as err:  # json.JSONDecodeError is one too
                raise ValueError(f"{path}: {err}") from err

    def check_resumes(self, stored: Settings, where: str) -> None:
        """Raise ValueError unless these settings may continue the run that
        ``stored`` (its ``config.json``, in folder ``where``) describes: every
        setting but :data:`RESUME_MAY_CHANGE` and the locations must be equal."""
        for f in dataclasses.fields(self):
            if f.name in ("extra", *RESUME_MAY_CHANGE, *_LOCATION):
                continue
            old, new = getattr(stored, f.name), getattr(self, f.name)
            if old != new:
                key = f.name.replace("_", "-")
                raise ValueError(
                    f"cannot resume {where}: it ran with {key}={old!r} (its config.json), "
                    f"this run has {key}={new!r}; only "
                    f"{' and '.join(n.replace('_', '-') for n in RESUME_MAY_CHANGE)} "
                    "may change when resuming"
                )

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> Settings:
        """Read settings from Flower's ``run_config`` (dashed keys); unknown keys
        are kept in ``extra``; missing keys take the defaults."""
        names = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in run_config.items():
            name = key.replace("-", "_")
            if name in names:
                default = getattr(cls(), name)
                kwargs[name] = _coerce(key, value, type(default))
            else:
                extra[key] = value
        s = cls(**kwargs)
        s.extra = extra
        s.validate()
        return s

    def validate(self) -> None:
        """Raise ValueError with a clear message for settings that cannot run."""
        from mmfl_flwr.core.group import VARIANTS
        from mmfl_flwr.core.stale import STORAGE, StaleVRSampling
        from mmfl_flwr.core.ucb import INITS
        from mmfl_flwr.presets import AGGREGATORS, PRESETS, takes_aggregator

        if self.strategy not in PRESETS:
            raise ValueError(
                f"strategy={self.strategy!r} is unknown; choose from {', '.join(PRESETS)}"
            )
        if self.aggregator and self.aggregator not in AGGREGATORS:
            raise ValueError(
                f"aggregator={self.aggregator!r} is unknown; choose from "
                f"{', '.join(AGGREGATORS)} (or leave empty for the preset's own)"
            )
        if self.aggregator and not takes_aggregator(self.strategy):
            raise ValueError(
                f"aggregator={self.aggregator!r} cannot be used with strategy "
                f"{self.strategy!r}: its aggregator is part of the algorithm (presets "
                f"that take one: {', '.join(p for p in PRESETS if takes_aggregator(p))})"
            )
        if not self.task_kinds:
            raise ValueError("tasks must name at least one task, e.g. 'digits,synthetic'")
        from mmfl_flwr.tasks.federation import KINDS, PROFILES

        if self.profile not in PROFILES:
            raise ValueError(
                f"profile={self.profile!r} is unknown; choose from {', '.join(PROFILES)}"
            )
        from mmfl_flwr.tasks.registry import get_task

        unknown = [k for k in self.task_kinds if k not in KINDS and get_task(k) is None]
        if unknown:
            raise ValueError(
                f"unknown task kind(s) {unknown}; choose from {', '.join(KINDS)} or "
                "register your own with mmfl_flwr.tasks.registry.register_task"
            )
        checks = [
            (self.num_clients >= 1, "num-clients must be >= 1"),
            (self.num_rounds >= 0, "num-rounds must be >= 0"),
            (self.local_epochs >= 1, "local-epochs must be >= 1"),
            (math.isfinite(self.lr) and self.lr > 0, "lr must be a finite number > 0"),
            (self.batch_size >= 1, "batch-size must be >= 1"),
            (0 < self.budget_fraction <= 1, "budget-fraction must be in (0, 1]"),
            (
                0 <= self.clients_per_round <= self.num_clients,
                "clients-per-round must be in [0, num-clients] (0 = all)",
            ),
            (0 < self.labels_per_client <= 1, "labels-per-client must be in (0, 1]"),
            (self.synthetic_max_samples >= 0, "synthetic-max-samples must be >= 0"),
            (0 <= self.fraction_evaluate <= 1, "fraction-evaluate must be in [0, 1]"),
            (self.timeout > 0, "timeout must be > 0"),
            (self.max_update_norm >= 0, "max-update-norm must be >= 0 (0 = none)"),
            (self.update_norm_factor == 0 or self.update_norm_factor > 1,
             "update-norm-factor must be 0 (off) or > 1"),
            (self.loss_cap == 0 or self.loss_cap > 1, "loss-cap must be 0 (off) or > 1"),
            (self.count_cap == 0 or self.count_cap >= 1, "count-cap must be 0 (off) or >= 1"),
            (self.seed >= 0, "seed must be >= 0"),
            (0 <= self.stale_beta <= 1, "stale-beta must be in [0, 1]"),
            (self.stale_storage in STORAGE, f"stale-storage must be one of {', '.join(STORAGE)}"),
            (
                self.stalevr_signal in StaleVRSampling.SIGNALS,
                f"stalevr-signal must be one of {', '.join(StaleVRSampling.SIGNALS)}",
            ),
            (self.stalevre_b0 > 0, "stalevre-b0 must be > 0"),
            (0 < self.ucb_gamma < 1, "ucb-gamma must be in (0, 1)"),
            (0 < self.group_participation <= 1, "group-participation must be in (0, 1]"),
            (self.group_variant in VARIANTS, f"group-variant must be one of {', '.join(VARIANTS)}"),
            (self.group_max_clusters >= 0, "group-max-clusters must be >= 0 (0 = S + 4)"),
            (self.ucb_init in INITS, f"ucb-init must be one of {', '.join(INITS)}"),
            (
                self.strategy not in ("ranklist-ucb", "pareto-ucb") or self.clients_per_round > 0,
                f"strategy {self.strategy} needs clients-per-round (K) > 0",
            ),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        self.client_arrival_rounds()
        self.client_pin_map()
        arrivals = self.task_arrival_rounds()
        unknown_tasks = set(arrivals) - set(self.model_names)
        if unknown_tasks:
            raise ValueError(
                f"task-arrivals names {sorted(unknown_tasks)}, which are not models of this "
                f"run ({', '.join(self.model_names)})"
            )
        outside = {t: r for t, r in arrivals.items() if not 0 <= r <= self.num_rounds}
        if outside:
            raise ValueError(
                f"task-arrivals rounds must be in [0, num-rounds={self.num_rounds}]; "
                f"got {outside}"
            )
        from mmfl_flwr.flower_app.server_app import strategy_from_settings

        try:  # the preset's own checks (e.g. an aggregator that does not fit its policy)
            strategy_from_settings(self)
        except ValueError as err:
            raise ValueError(f"strategy={self.strategy!r}: {err}") from err


def _coerce(key: str, value: Any, typ: type) -> Any:
    try:
        if typ is bool:
            return value if isinstance(value, bool) else str(value).lower() in ("1", "true")
        if typ is int:
            if isinstance(value, float) and value != int(value):
                raise ValueError
            return int(value)
        if typ is float:
            return float(value)
        return str(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{key}={value!r} is not a valid {typ.__name__}") from err
