"""Run settings: one dataclass, read from Flower's ``run_config`` or the CLI.

The keys (dashes, as in ``flwr run --run-config "num-rounds=20 strategy='mfa-rr'"``)
and their defaults are the app's ``[tool.flwr.app.config]`` in pyproject.toml.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Settings that a resumed run may change: they do not alter what the rounds
#: compute (``num_rounds`` extends or finishes the run).
RESUME_MAY_CHANGE = ("num_rounds", "timeout")
#: Settings that say where a run is written, not what it computes.
_LOCATION = ("output_dir", "resume_from", "overwrite")
#: Fewest expected uploads per model and round that a run's defaults aim at.
#: The budgeted presets warn below it (:func:`mmfl_flwr.presets.warn_if_few_uploads`);
#: the UCB presets' default ``K`` is this many clients per model
#: (:func:`mmfl_flwr.presets.default_ucb_clients`). Measured on the default job
#: (20 clients, models ``digits, synthetic, digits_2``, 10 rounds): with about
#: 0.7 uploads per model (budget-fraction 0.1) every budgeted preset ends at
#: chance; with 5 (budget-fraction 0.75) they reach 0.47-0.72 mean accuracy.
MIN_UPLOADS_PER_MODEL = 5


@dataclass
class Settings:
    """Everything that defines an MMFL run.

    Attributes
    ----------
    strategy : str
        Preset name: ``random``, ``full``, ``mfa-rand``, ``mfa-rr``, ``multi-fedavg``,
        ``lvr``, ``gvr``, ``rr-gvr``, ``stalevr``, ``stalevre``, ``fedvarp``, ``fedstale``,
        ``mifa``, ``scaffold``, ``ranklist-ucb``, ``pareto-ucb``, ``group``.
    aggregator : str
        ``""`` for the preset's own, or ``fedavg`` / ``unbiased`` / ``mean`` /
        ``median`` / ``trimmed-mean`` (:data:`mmfl_flwr.presets.AGGREGATORS`).

    The allowed values and ranges of every setting, as ``mmfl run --help``
    states them and :meth:`validate` checks them, are :func:`options`.
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
        ``m / V`` for the budgeted presets (``random``, ``lvr``, ``gvr``, ``rr-gvr``, the
        stale ones and ``scaffold``; ``V`` = total processors): ``m`` updates are
        expected per round. 0 (the default) = auto: the smallest hundredth that
        gives :data:`MIN_UPLOADS_PER_MODEL` expected uploads per model, at most 1
        (:func:`mmfl_flwr.presets.auto_budget_fraction`: 0.75 for the default 20
        clients and 3 models; the paper-003 configurations set 0.1). Below
        :data:`MIN_UPLOADS_PER_MODEL` expected uploads per model a run warns
        before it starts and names a budget-fraction that gives enough
        (:func:`mmfl_flwr.presets.warn_if_few_uploads`).
    clients_per_round : int
        ``K`` for MFA-Rand / MFA-RR / Multi-FedAvg (0 means all clients) and the
        UCB presets (0 means ``min(num_clients, MIN_UPLOADS_PER_MODEL x
        number of models)``, :func:`mmfl_flwr.presets.default_ucb_clients`: 15
        for the default 20 clients and 3 models, 10 for paper 004's two models,
        its "large number of clients (10) per round").
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
        from the start; the others arrive one after another, in id order, with
        exponential inter-arrival times of that rate (finite, > 0) per round
        (papers 000/001: on average one client every ``1/rate`` rounds; the
        ``k``-th late client arrives near round ``k/rate``), from the run's seed.
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
    target_accuracy : str
        ``""`` (none), one accuracy for every model (``0.8``) or
        ``model:accuracy`` pairs (``digits:0.8,synthetic:0.6``), each in
        (0, 1]: ``summary.json`` then records ``rounds_to_target`` per model
        (the first round ``r >= 1`` whose server-side accuracy is ``>=`` the
        target, null if never) and ``rounds_to_target_all`` (the largest,
        null if a model never reaches); see :mod:`mmfl_flwr.convergence`.
    seed : int
        The one seed of the run (>= 0).
    output_dir : str
        Where ``metrics.csv``, ``summary.json``, ``assignments.csv`` and
        ``accuracy.png`` go; empty to
        write nothing.
    download : bool
        Fetch missing real datasets (``mnist``, ``fashion-mnist``, ``emnist``,
        ``cifar10``) into ``data_root`` with torchvision before the run
        (:func:`mmfl_flwr.tasks.real.download_datasets`); offline, the run stops
        with one line saying so. The other kinds cannot be fetched this way.
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
    budget_fraction: float = 0.0
    clients_per_round: int = 0
    labels_per_client: float = 0.3
    profile: str = "uniform"
    data_root: str = "data"
    download: bool = False
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
    target_accuracy: str = ""
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
        # papers 000/001: exponential inter-arrival times (a Poisson process of rate
        # `rate` per round), the late clients arriving in id order
        times = np.cumsum(rng.exponential(1.0 / rate, size=len(late)))
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

    def target_accuracies(self) -> dict[str, float]:
        """Model name -> target accuracy (see ``target_accuracy``; ``{}`` when
        empty), checked: :func:`mmfl_flwr.convergence.parse_target_accuracy`."""
        from mmfl_flwr.convergence import parse_target_accuracy

        return parse_target_accuracy(self.target_accuracy, self.model_names)

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
        """Raise ValueError with a clear message for settings that cannot run.

        The allowed values and ranges come from :func:`options`, the same table
        that ``mmfl run --help`` is written from."""
        from mmfl_flwr.presets import PRESETS, takes_aggregator

        opts = options()
        for name in ("strategy", "aggregator"):
            if not opts[name].accepts(getattr(self, name), self):
                raise ValueError(opts[name].error(name, getattr(self, name)))
        if self.aggregator and not takes_aggregator(self.strategy):
            raise ValueError(
                f"aggregator={self.aggregator!r} cannot be used with strategy "
                f"{self.strategy!r}: its aggregator is part of the algorithm (presets "
                f"that take one: {', '.join(p for p in PRESETS if takes_aggregator(p))})"
            )
        if not self.task_kinds:
            raise ValueError("tasks must name at least one task, e.g. 'digits,synthetic'")
        if not opts["profile"].accepts(self.profile, self):
            raise ValueError(opts["profile"].error("profile", self.profile))
        if not opts["tasks"].accepts(self.tasks, self):
            raise ValueError(opts["tasks"].error("tasks", self.tasks))
        for name, opt in opts.items():
            if name not in ("strategy", "aggregator", "profile", "tasks") and not opt.accepts(
                getattr(self, name), self
            ):
                raise ValueError(opt.error(name, getattr(self, name), self))
        self.client_arrival_rounds()
        self.client_pin_map()
        self.target_accuracies()
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


def _number(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Option:
    """What one setting does and which values it allows.

    The one source of ``mmfl run --help`` (:func:`setting_help`) and of the
    choice and range checks of :meth:`Settings.validate` (:meth:`accepts`,
    :meth:`error`). A setting has ``choices``, a numeric range (``low`` /
    ``high``), or a free form described by ``form`` (checked by its own parser,
    e.g. :meth:`Settings.client_arrival_rounds`).

    Attributes
    ----------
    help : str
        What the setting does (one sentence, no final period).
    choices : callable, optional
        The allowed values (read when needed: the registries they come from,
        e.g. user tasks, may grow).
    listed : bool
        With ``choices``: a comma-separated list of them (``tasks``).
    empty : str
        With ``choices``: what ``""`` means where it is allowed (``aggregator``).
    low, high : float or str, optional
        Bounds of a numeric range; ``high`` may name another setting
        (``"num_clients"``).
    low_open, high_open : bool
        Whether the bound itself is excluded.
    finite : bool
        Whether the value must be finite (``inf`` and ``nan`` refused).
    off : str
        0 is allowed besides the range and means this (``"off"``).
    zero : str
        What 0, inside the range, means (``"none"``).
    form : str
        Free-form settings: the accepted form.
    """

    help: str
    choices: Callable[[], Sequence[str]] | None = None
    listed: bool = False
    empty: str = ""
    low: float | None = None
    high: float | str | None = None
    low_open: bool = False
    high_open: bool = False
    finite: bool = False
    off: str = ""
    zero: str = ""
    form: str = ""

    def _bound(self, value: float | str | None) -> str:
        return value.replace("_", "-") if isinstance(value, str) else _number(float(value or 0))

    def allowed(self) -> str:
        """The allowed values, as ``mmfl run --help`` and the errors state them."""
        if self.choices is not None:
            names = ", ".join(self.choices())
            if self.listed:
                return f"comma-separated, each one of {names}"
            if self.empty:
                return f'"" ({self.empty}) or one of {names}'
            return f"one of {names}"
        if self.low is None and self.high is None:
            return self.form
        if self.low is not None and self.high is not None:
            text = (f"in {'(' if self.low_open else '['}{self._bound(self.low)}, "
                    f"{self._bound(self.high)}{')' if self.high_open else ']'}")
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {self._bound(self.low)}"
        else:
            text = f"{'<' if self.high_open else '<='} {self._bound(self.high)}"
        if self.finite:
            text = f"a finite number {text}"
        if self.off:
            text = f"0 ({self.off}) or {text}"
        if self.zero:
            text = f"{text} (0 = {self.zero})"
        return text

    def accepts(self, value: Any, settings: Settings) -> bool:
        """Whether ``value`` is allowed (``settings`` give the bounds that name
        another setting). Free-form values are left to their parsers."""
        if self.choices is not None:
            if self.listed:
                items = [v.strip() for v in str(value).split(",") if v.strip()]
                known = set(self.choices())
                return bool(items) and all(v in known for v in items)
            return (value == "" and bool(self.empty)) or value in self.choices()
        if self.low is None and self.high is None:
            return True
        if self.off and value == 0:
            return True
        if self.finite and not math.isfinite(value):
            return False
        if self.low is not None:
            low = float(self.low)
            if not (value > low if self.low_open else value >= low):
                return False
        if self.high is not None:
            high = float(getattr(settings, self.high) if isinstance(self.high, str)
                         else self.high)
            if not (value < high if self.high_open else value <= high):
                return False
        return True

    def error(self, name: str, value: Any, settings: Settings | None = None) -> str:
        """The one-line message for a ``value`` of setting ``name`` that
        :meth:`accepts` refuses (``settings`` give the bounds that name another
        setting)."""
        key = name.replace("_", "-")
        if self.choices is None:
            named = (f" ({self._bound(self.high)}={getattr(settings, self.high)!r})"
                     if isinstance(self.high, str) and settings is not None else "")
            return f"{key} must be {self.allowed()}; got {value!r}{named}"
        if self.listed:
            known = set(self.choices())
            unknown = [v.strip() for v in str(value).split(",")
                       if v.strip() and v.strip() not in known]
            return (f"unknown task kind(s) {unknown}; choose from "
                    f"{', '.join(self.choices())} or register your own with "
                    "mmfl_flwr.tasks.registry.register_task")
        empty = f' (or "" for {self.empty})' if self.empty else ""
        return f"{key}={value!r} is unknown; choose from {', '.join(self.choices())}{empty}"


def _presets() -> list[str]:
    from mmfl_flwr.presets import PRESETS

    return list(PRESETS)


def _aggregators() -> list[str]:
    from mmfl_flwr.presets import AGGREGATORS

    return list(AGGREGATORS)


def _kinds() -> list[str]:
    from mmfl_flwr.tasks.federation import known_kinds

    return known_kinds()


def _profiles() -> list[str]:
    from mmfl_flwr.tasks.federation import PROFILES

    return list(PROFILES)


def _storage() -> list[str]:
    from mmfl_flwr.core.stale import STORAGE

    return list(STORAGE)


def _signals() -> list[str]:
    from mmfl_flwr.core.stale import StaleVRSampling

    return list(StaleVRSampling.SIGNALS)


def _inits() -> list[str]:
    from mmfl_flwr.core.ucb import INITS

    return list(INITS)


def _variants() -> list[str]:
    from mmfl_flwr.core.group import VARIANTS

    return list(VARIANTS)


@functools.cache
def options() -> dict[str, Option]:
    """Setting (field name) -> :class:`Option`, for every field of
    :class:`Settings` but ``extra``, in field order."""
    from mmfl_flwr.presets import UCB_PRESETS, presets_taking

    k_all = ", ".join(p for p in presets_taking("clients_per_round") if p not in UCB_PRESETS)
    table = {
        "strategy": Option("the preset (policy and aggregator) to run", _presets),
        "aggregator": Option("override the preset's aggregator", _aggregators,
                             empty="the preset's own"),
        "tasks": Option("the task kinds, one model each; repeats are separate models "
                        "(digits,digits -> digits, digits_2)", _kinds, listed=True),
        "num_clients": Option("clients in the federation (simulation: virtual SuperNodes)",
                              low=1),
        "num_rounds": Option("training rounds (with --resume: continue to this many)", low=0),
        "local_epochs": Option("local SGD epochs per round", low=1),
        "lr": Option("client learning rate (plain SGD)", low=0, low_open=True, finite=True),
        "batch_size": Option("client mini-batch size", low=1),
        "budget_fraction": Option(
            "m / V, the expected uploads per round m over the total processors V, for "
            "the budgeted presets; 0 = auto: the smallest hundredth giving "
            f"{MIN_UPLOADS_PER_MODEL} expected uploads per model (at most 1); a run warns "
            f"below {MIN_UPLOADS_PER_MODEL} expected uploads per model", low=0, high=1),
        "clients_per_round": Option(
            f"K, the clients that train per round (0 = all clients for {k_all}; "
            f"0 = min(num-clients, {MIN_UPLOADS_PER_MODEL} x number of models) for "
            f"{', '.join(UCB_PRESETS)})", low=0, high="num_clients"),
        "labels_per_client": Option(
            "fraction of the labels each client holds per image task (label skew)",
            low=0, low_open=True, high=1),
        "profile": Option(
            "client heterogeneity: uniform (all tasks, one processor), paper003 (10% "
            "high-data clients per task, 10% without one task, 1 to |S_i| processors), "
            "clusters-consistent / clusters-inconsistent (5 label clusters per digits "
            "task, one client map for all tasks or one per task)", _profiles),
        "data_root": Option("folder of the real datasets",
                            form="a folder (relative to the working directory)"),
        "download": Option("fetch missing mnist, fashion-mnist, emnist and cifar10 data into "
                           "data-root with torchvision before the run (needs internet)",
                           form="a switch (no value)"),
        "synthetic_max_samples": Option("cap on a Synthetic(1,1) user's samples", low=0,
                                        zero="no cap"),
        "fraction_evaluate": Option("fraction of clients that also evaluate on local data "
                                    "each round", low=0, high=1),
        "stale_beta": Option("beta of fedstale (Eq. 17)", low=0, high=1),
        "stale_storage": Option("storage of the stale updates and control variates",
                                _storage),
        "stalevr_signal": Option("sampling signal of stalevr (loss: the paper's)", _signals),
        "stalevre_b0": Option("starting beta b0 of stalevre (Eq. 21)", low=0, low_open=True),
        "ucb_gamma": Option("discount gamma of the UCB index", low=0, low_open=True, high=1,
                            high_open=True),
        "ucb_init": Option("first observation of every (client, model) pair: loss-query "
                           "(one forward pass of every pair) or train (untried pairs train "
                           "first, within K per round)", _inits),
        "group_participation": Option("fraction of a group's clients that train each round",
                                      low=0, low_open=True, high=1),
        "group_variant": Option("C-step on the loss vectors (consistent) or on one model's "
                                "loss, rotating every cycle (modified)", _variants),
        "group_max_clusters": Option("upper bound of the silhouette search", low=0,
                                     zero="S + 4"),
        "client_arrivals": Option(
            "simulated late clients: clients 0..static-1 from the start, the others arrive "
            "in id order with exponential inter-arrival times of that rate per round",
            form='"" (all from the start) or exponential:static=N,rate=R with N an '
                 "integer in [0, num-clients] and R a finite number > 0"),
        "task_arrivals": Option(
            "models that join during training",
            form='"" (none) or name:round pairs separated by commas (digits_2:30,'
                 "synthetic:60), each a model of the run at most once, each round in "
                 "[0, num-rounds]"),
        "client_pins": Option(
            "pinned client ids: a claim of a pinned id without its credential is refused",
            form='"" (no pins) or id=pin pairs separated by commas, pin token:<sha256 '
                 "hex> or key:<sha256 hex>, or *=key:first-use (see README)"),
        "target_accuracy": Option(
            "target accuracy per model: summary.json records the rounds to reach it "
            "(rounds_to_target, rounds_to_target_all)",
            form='"" (none), one accuracy in (0, 1] for every model (0.8) or '
                 "model:accuracy pairs separated by commas (digits:0.8,synthetic:0.6)"),
        "seed": Option("the one seed of the run", low=0),
        "output_dir": Option("folder of metrics.csv, summary.json, accuracy.png and the "
                             "checkpoint", form='a folder; "" writes nothing'),
        "overwrite": Option("start a new run in an output folder that holds another run's "
                            "checkpoint.pkl (without it such a run is refused)",
                            form="a switch (no value)"),
        "resume_from": Option("a checkpoint (file, or folder holding checkpoint.pkl) to "
                              "continue", form='a file or folder; "" starts fresh'),
        "max_update_norm": Option("reject updates whose L2 norm exceeds this", low=0,
                                  zero="none"),
        "update_norm_factor": Option("reject updates above this multiple of the model's "
                                     "reference norm", low=1, low_open=True, off="off"),
        "loss_cap": Option("cap reported losses above this multiple of the task's reference "
                           "loss", low=1, low_open=True, off="off"),
        "count_cap": Option("use a client's sample count up to this multiple of the task's "
                            "median count", low=1, off="off"),
        "timeout": Option("seconds to wait for the replies of one round trip", low=0,
                          low_open=True),
    }
    names = [f.name for f in dataclasses.fields(Settings) if f.name != "extra"]
    missing = set(names) ^ set(table)
    if missing:
        raise AssertionError(f"options() and Settings differ in {sorted(missing)}")
    return {n: table[n] for n in names}


def setting_help(name: str) -> str:
    """The ``mmfl run --help`` text of setting ``name``: what it does, its
    allowed values (:meth:`Option.allowed`), its default and the presets that
    take it."""
    from mmfl_flwr.presets import presets_taking

    opt = options()[name]
    default = getattr(Settings(), name)
    users = presets_taking(name)
    used_by = f" Strategies: {', '.join(users)}." if users else ""
    if isinstance(default, bool):
        return f"{opt.help}. Allowed: {opt.allowed()}. Default: {'on' if default else 'off'}."
    return f"{opt.help}. Allowed: {opt.allowed()}. Default: {default!r}.{used_by}"


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
