"""Run settings: one dataclass, read from Flower's ``run_config`` or the CLI.

The keys (dashes, as in ``flwr run --run-config "num-rounds=20 strategy='mfa-rr'"``)
and their defaults are the app's ``[tool.flwr.app.config]`` in pyproject.toml.
What each setting accepts is the option table, :func:`options`, built from the
rows of :mod:`mmfl_flwr.option_table`; the help text (:func:`setting_help`) and
the one error message of a refused value (:func:`option_error`) are written
from it.

Why one module: it is the one :class:`Settings` dataclass and the checks of a
value against it. The dataclass's docstring documents every field (the
reference the field help and the docs point to), and its methods (the values
derived from the text settings, ``save`` / ``load`` / ``check_resumes`` of
``config.json``, ``validate``) all read the same fields; a class cannot be
split over modules. The option table in field order, the help text and the
type and range messages read the fields and defaults of ``Settings``, and
``validate`` and ``from_run_config`` use them: in two modules, each would
import the other. The rows of the table, which need neither, are
:mod:`mmfl_flwr.option_table`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mmfl_flwr.core.card import setting_option, setting_parameters
from mmfl_flwr.core.parameter import Option
from mmfl_flwr.core.policy import MIN_UPLOADS_PER_MODEL
from mmfl_flwr.option_table import option_rows

__all__ = [
    "MIN_UPLOADS_PER_MODEL",
    "RESUME_MAY_CHANGE",
    "Option",
    "Settings",
    "check_option",
    "option_error",
    "options",
    "setting_help",
]

#: Settings that a resumed run may change: they do not alter what the rounds
#: compute (``num_rounds`` extends or finishes the run).
RESUME_MAY_CHANGE = (
    "num_rounds",
    "timeout",
    "clients_per_node",
    "log_to",
    "log_dir",
    "log_clients_every",
    "no_progress",
    "no_report",
)
#: Settings added after runs were saved without them, with the value such a
#: run's ``config.json`` implies (what the run computed), where that differs
#: from today's default: :meth:`Settings.load` fills a missing key with it.
ADDED_LATER = {
    "update-clip-factor": 0.0,
    "direction-factor": 0.0,
    "reversed-influence-factor": 0.0,
}
#: The bounds on hostile updates and reports (each 0 = off); ``defences = "off"``
#: turns them all off (:meth:`Settings.bounds`).
BOUNDS = (
    "max_update_norm",
    "update_norm_factor",
    "loss_cap",
    "count_cap",
    "update_clip_factor",
    "direction_factor",
    "influence_clip_factor",
    "reversed_influence_factor",
    "collusion_factor",
)
#: Settings that say where a run is written, not what it computes.
_LOCATION = ("output_dir", "resume_from", "overwrite")
#: Settings that name a folder: equal when they name the same one.
_PATHS = ("data_root",)

#: The entry of ``config.json`` with the values the run used for its automatic
#: settings (not a setting: :meth:`Settings.load` skips it).
EFFECTIVE_KEY = "effective"
#: config.json / summary.json key of the engine that ran the run (not a setting:
#: :meth:`Settings.load` skips it; a run may resume on another engine)
ENGINE_KEY = "engine"


_T = TypeVar("_T")


def _with_algorithm_settings(cls: type[_T]) -> type[_T]:
    """Check that ``cls`` declares exactly the algorithm cards' settings, in the cards'
    order, each with the card's type and default, right before ``extra``; then list
    them in the docstring. The fields are written out so that editors and type
    checkers see them; this check keeps them equal to the cards."""
    declared = list(cls.__annotations__)
    settings = setting_parameters()
    expected = [*settings, "extra"]
    got = declared[len(declared) - len(expected) :]
    if got != expected:
        raise TypeError(
            f"Settings must end with the algorithm cards' settings and extra, "
            f"{expected}; it ends with {got}"
        )
    docs = []
    for fld, users in settings.items():
        param = users[0][1]
        typ, default = cls.__annotations__[fld], getattr(cls, fld)
        if typ != param.type.__name__ or type(default) is not type(param.default):
            raise TypeError(
                f"Settings.{fld}: {typ} = {default!r}, but the card says "
                f"{param.type.__name__} = {param.default!r}"
            )
        if default != param.default:
            raise TypeError(
                f"Settings.{fld} defaults to {default!r}, the card to {param.default!r}"
            )
        docs.append(
            f"    {fld} : {param.type.__name__}\n        {setting_option(fld).help} "
            f"(strategies: {', '.join(c.name for c, _ in users)})."
        )
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + "\n".join(docs) + "\n    "
    return cls


@_with_algorithm_settings
@dataclass
class Settings:
    """Everything that defines an MMFL run.

    The fields below are the run's general settings; every algorithm parameter
    declared by an algorithm card (:mod:`mmfl_flwr.core.card`) adds one more
    field, listed at the end of this docstring (``budget_fraction``,
    ``stale_beta``, ...). The allowed values and ranges of every setting, as
    ``mmfl run --help`` states them and :meth:`validate` checks them, are
    :func:`options`. The automatic values aim at :data:`MIN_UPLOADS_PER_MODEL`
    expected uploads per model and round: ``budget_fraction`` 0
    (:func:`mmfl_flwr.flower_app.data.auto_budget_fraction`) and the UCB
    presets' ``clients_per_round`` 0, ``min(num_clients, MIN_UPLOADS_PER_MODEL x
    number of models)`` (:func:`mmfl_flwr.core.ucb.default_ucb_clients`).

    Attributes
    ----------
    strategy : str
        Preset name: the ``name`` of an algorithm card (:data:`mmfl_flwr.presets.PRESETS`).
    aggregator : str
        ``""`` for the preset's own, or ``fedavg`` / ``unbiased`` / ``mean`` /
        ``median`` / ``trimmed-mean`` (:data:`mmfl_flwr.core.card.AGGREGATORS`)
        where the preset's card accepts it.
    tasks : str
        Comma-separated task kinds; repeats make separate models
        (``digits,synthetic,digits`` -> models ``digits``, ``synthetic``, ``digits_2``).
    num_clients : int
        Clients in the federation (simulation: virtual SuperNodes).
    num_rounds : int
        Training rounds.
    local_epochs, lr, batch_size : int, float, int
        Local SGD settings.
    labels_per_client : float
        Fraction of the labels each client holds per image task (label skew).
    profile : str
        Client heterogeneity: ``uniform`` (all tasks, one processor, equal data
        weight), ``paper003`` (10% high-data clients per task with ~10x the
        samples, 10% of clients without one task, B_i = |S_i| / ceil(|S_i|/2) / 1
        for 25% / 50% / 25% of clients), ``paper003-sizes`` (the same with paper
        003's data sizes, about 12 / 120 examples), ``clusters-consistent`` or
        ``clusters-inconsistent`` (5 label clusters per digits task, 20% of the
        labels each, one client map for all tasks or one per task), and their
        ``-sizes`` variants (papers 000/001's 30-40 examples a client and task).
    data_root : str
        Folder of the real datasets (``mnist``, ``fashion-mnist``, ``emnist``,
        ``cifar10``, ``shakespeare``, ``celeba-smiling``, ``celeba-eyeglasses``).
    synthetic_max_samples : int
        Cap on a Synthetic(1,1) user's samples (0: no cap).
    fraction_evaluate : float
        Fraction of clients that also evaluate on local data each round.
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
    data_seed : int
        Seed of the federation's data (partitions, generated Synthetic users,
        the server's test sets); -1 (default) = ``seed``. Fixing it while
        ``seed`` varies only the sampling, the initial weights and the
        local training.
    model_seed : int
        Seed of the models' initial weights; -1 (default) = ``seed``. Fixing it
        and ``data_seed`` while ``seed`` varies only the sampling and the
        local training (a variance claim over sampling alone).
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
    update_clip_factor : float
        Updates above this multiple of the model's reference norm (the same
        reference) are scaled down to it (0 = off).
    direction_factor : float
        A client whose updates of a model point against the other clients'
        (mean cosine over its recent rounds) has its updates of that model
        scaled down to the round's reference norm when that mean is negative
        and lies this many robust deviations below the clients' median, while
        the clients agree on a direction (0 = off).
    influence_clip_factor : float
        An update whose influence on its model's step (its weight in the
        aggregate times its norm) exceeds this multiple of the round's lower
        median influence is scaled down to it (0 = off, the default; the attack-field
        benchmark, ``benchmarks/hostile_clients.py --field``, measures 4). Under the
        oracle StaleVR it also bounds each fresh update's influence on the expected
        step (data share times norm).
    reversed_influence_factor : float
        The same bound, on by default at 4, held only on the updates that point
        against their model's other updates: cosine with the coordinate-wise
        median of the round's other updates below -0.1, this round and on
        average over the client's recent rounds (a sign flip, IPM); and, where
        the model's clients agree on a direction, on all such updates of a
        round together: their summed pull against the others (weight x norm x
        |cosine|) at most this many times the typical push of an update that
        agrees (a coalition). Updates the clients agree with keep their weight
        (0 = off).
    collusion_factor : float
        Updates of a model far more alike than the round's usually are (cosine
        distance under the round's median distance divided by this: colluders
        sending one crafted update) count together as one client's, each
        scaled by 1 / the group's size (0 = off, the default: honest clients
        that share their data are grouped too; the attack-field benchmark,
        ``benchmarks/hostile_clients.py --field``, measures 4).
    defences : str
        ``"default"``: each bound above as its own setting gives it; ``"off"``:
        every bound off at once (:data:`BOUNDS`: the norm, count and loss bounds,
        the clips and the direction checks), the papers' algorithms as the papers
        state them. Validity checks (finite values, shapes, known tasks) stay.
        With ``"off"`` a bound set to other than its default is refused.
    timeout : float
        Seconds to wait for the replies of one round trip.
    clients_per_node : str
        Clients each node hosts (``"auto"`` or a whole number >= 1), each node
        computing its clients per model at once (docs/protocol.md, multi-client
        nodes); 1 is one node per client. How the clients are divided among
        nodes, and what ``auto`` means on each engine:
        :class:`mmfl_flwr.nodes.NodeLayout`.
    dp, dp_noise_multiplier, dp_clipping_norm, dp_sampled_clients, dp_delta
        Per-model differential privacy (:mod:`mmfl_flwr.privacy`): the wrapper
        (``""`` off, ``server-fixed``, ``client-fixed``, ``server-adaptive``,
        ``client-adaptive``), its noise multiplier ``z``, clipping norm ``C``
        (the initial one when adaptive), the clients ``m`` of a model's
        aggregate in the noise std ``z C / m`` (required with ``dp``), the
        ``delta`` at which each model's epsilon is reported, and the noise's
        seed (-1: from the operating system, private and not reproducible).
    log_to : str
        Experiment trackers the server streams the run to, comma-separated:
        ``tensorboard``, ``mlflow``, ``wandb`` (``""``: none; docs/tracking.md).
        Each needs its extra (``pip install 'mmfl-flwr[tracking]'``).
    log_dir : str
        TensorBoard's folder; ``""``: ``OUTPUT-DIR/tensorboard``.
    log_clients_every : int
        Log the clients' training counts to the trackers every this many
        rounds (0: at the end only).
    no_progress : bool
        One line per round instead of the progress bar on a terminal.
    no_report : bool
        Write no ``report.html`` at the end of the run.
    """

    strategy: str = "mfa-rr"
    aggregator: str = ""
    tasks: str = "digits,synthetic,digits"
    num_clients: int = 20
    num_rounds: int = 20
    local_epochs: int = 5
    lr: float = 0.1
    batch_size: int = 16
    labels_per_client: float = 0.3
    profile: str = "uniform"
    data_root: str = "data"
    download: bool = False
    synthetic_max_samples: int = 500
    fraction_evaluate: float = 0.0
    client_arrivals: str = ""
    task_arrivals: str = ""
    client_pins: str = ""
    target_accuracy: str = ""
    seed: int = 0
    data_seed: int = -1
    model_seed: int = -1
    output_dir: str = "results/mmfl"
    overwrite: bool = False
    resume_from: str = ""
    max_update_norm: float = 0.0
    update_norm_factor: float = 100.0
    loss_cap: float = 10.0
    count_cap: float = 200.0
    update_clip_factor: float = 3.0
    direction_factor: float = 3.0
    influence_clip_factor: float = 0.0
    reversed_influence_factor: float = 4.0
    collusion_factor: float = 0.0
    defences: str = "default"
    timeout: float = 600.0
    clients_per_node: str = "auto"
    dp: str = ""
    dp_noise_multiplier: float = 1.0
    dp_clipping_norm: float = 1.0
    dp_sampled_clients: int = 0
    dp_delta: float = 1e-5
    dp_noise_seed: int = -1
    log_to: str = ""
    log_dir: str = ""
    log_clients_every: int = 0
    no_progress: bool = False
    no_report: bool = False
    # The algorithm cards' settings (each card Parameter with a ``setting``), in the
    # cards' order, with their types and defaults: _with_algorithm_settings checks it.
    budget_fraction: float = 0.0
    clients_per_round: int = 0
    stalevr_signal: str = "loss"
    stale_storage: str = "float32"
    stalevre_b0: float = 1.0
    stale_beta: float = 0.8
    mifa_start: str = "zero"
    ucb_gamma: float = 0.9
    ucb_init: str = "loss-query"
    pareto_shortfall: str = "front"
    group_participation: float = 1 / 6
    group_variant: str = "consistent"
    group_max_clusters: int = 0
    candidates: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def data_seed_used(self) -> int:
        """The seed of the federation's data: ``data_seed``, or ``seed`` when it is -1."""
        return self.data_seed if self.data_seed >= 0 else self.seed

    @property
    def model_seed_used(self) -> int:
        """The seed of the initial weights: ``model_seed``, or ``seed`` when it is -1."""
        return self.model_seed if self.model_seed >= 0 else self.seed

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
            raise ValueError(f"client-arrivals={spec!r}: expected 'exponential:static=N,rate=R'")
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
        if not (
            math.isfinite(static) and static == int(static) and 0 <= static <= self.num_clients
        ):
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

    def clients_per_node_count(self) -> int | None:
        """``clients_per_node`` as a number (None for ``auto``); a ValueError
        naming the value when it is neither ``auto`` nor a whole number >= 1."""
        text = str(self.clients_per_node).strip().lower()
        if text == "auto":
            return None
        try:
            k = int(text)
        except ValueError:
            k = 0
        if k < 1 or str(k) != text.lstrip("+"):
            raise ValueError(
                f"clients-per-node={self.clients_per_node!r}: must be auto or a "
                "whole number >= 1 (clients each node hosts; 1 is one node "
                "per client)"
            )
        return k

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
            "vectorized": "the vectorized engine",
        }.get(engine, engine)

    def to_run_config(self) -> dict[str, Any]:
        """The ``run_config`` dict (dashed keys) equivalent to these settings."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name != "extra":
                out[f.name.replace("_", "-")] = getattr(self, f.name)
        return out

    def save(
        self, path: str, effective: Mapping[str, Any] | None = None, engine: str | None = None
    ) -> None:
        """Write the settings as JSON (``config.json`` of an output folder); with
        ``effective`` (run-config key -> the value the run uses for an automatic
        setting, :func:`~mmfl_flwr.flower_app.data.effective_settings`) also an
        ``"effective"`` entry, and with ``engine`` an ``"engine"`` entry, which
        :meth:`load` skips."""
        import json

        data: dict[str, Any] = self.to_run_config()
        if effective:
            data[EFFECTIVE_KEY] = dict(effective)
        if engine:
            data[ENGINE_KEY] = engine
        with open(path, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def load(cls, path: str) -> Settings:
        """Read settings written by :meth:`save`; a file that is not valid JSON
        or holds invalid settings raises a ValueError naming it. A setting the
        file predates takes the value of :data:`ADDED_LATER` (what that run
        computed), else the default."""
        import json

        with open(path) as f:
            try:
                data = json.load(f)
                if isinstance(data, dict):
                    data.pop(EFFECTIVE_KEY, None)  # what the run used, not a setting
                    data.pop(ENGINE_KEY, None)
                    data = {**ADDED_LATER, **data}
                return cls.from_run_config(data)
            except ValueError as err:  # json.JSONDecodeError is one too
                raise ValueError(f"{path}: {err}") from err

    def check_resumes(self, stored: Settings, where: str, base: str | None = None) -> None:
        """Raise ValueError unless these settings may continue the run that
        ``stored`` (its ``config.json``, in folder ``where``) describes: every
        setting but :data:`RESUME_MAY_CHANGE` and the locations must be equal.
        A relative folder in ``stored`` names one from ``base`` (default: the
        working folder)."""
        for f in dataclasses.fields(self):
            if f.name in ("extra", *RESUME_MAY_CHANGE, *_LOCATION):
                continue
            old, new = getattr(stored, f.name), getattr(self, f.name)
            if f.name in _PATHS and old and new:  # 'data' and /abs/data may be one folder
                same = os.path.realpath(os.path.join(base or "", old)) == os.path.realpath(new)
            else:
                same = old == new
            if not same:
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

    def bounds(self) -> dict[str, float]:
        """The bounds of :data:`BOUNDS` this run applies: each setting's value, or
        0 (off) for every one with ``defences = "off"``."""
        off = self.defences == "off"
        return {name: 0.0 if off else float(getattr(self, name)) for name in BOUNDS}

    def validate(self) -> None:
        """Raise ValueError with a clear message for settings that cannot run.

        The allowed values and ranges come from :func:`options`, the same table
        that ``mmfl run --help`` is written from."""
        from mmfl_flwr.core.card import card, cards

        opts = options()
        for name in opts:  # the type first: a bool or text is no number, 1.5 no whole one
            value = getattr(self, name)
            if not _of_type(value, _field_types()[name]) and not (
                name == "clients_per_node" and _of_type(value, int)
            ):
                raise ValueError(_type_error(name, value))
        for name in ("strategy", "aggregator"):
            if not opts[name].accepts(getattr(self, name), self):
                raise ValueError(opts[name].error(name, getattr(self, name)))
        algorithm = card(self.strategy)
        if self.aggregator and algorithm.fixed_aggregator:
            raise ValueError(
                f"aggregator={self.aggregator!r} cannot be used with strategy "
                f"{self.strategy!r}: its aggregator is part of the algorithm (presets "
                f"that take one: {', '.join(c.name for c in cards() if not c.fixed_aggregator)})"
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
        if self.defences == "off":
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            given = [
                f"{n.replace('_', '-')}={getattr(self, n)!r}"
                for n in BOUNDS
                if getattr(self, n) != defaults[n]
            ]
            if given:
                raise ValueError(
                    f"defences=off turns every bound off, but {', '.join(given)} asks for "
                    "one: drop it, or use defences=default"
                )
        self.client_arrival_rounds()
        self.client_pin_map()
        self.clients_per_node_count()
        self.target_accuracies()
        from mmfl_flwr.tracking import parse_log_to

        parse_log_to(self.log_to)
        if self.dp and self.dp_sampled_clients < 1:
            raise ValueError(
                f"dp={self.dp!r} needs dp-sampled-clients >= 1: the clients m of "
                "a model's aggregate in the noise std z C / m"
            )
        if (
            self.dp.endswith("adaptive")
            and self.dp_noise_multiplier > 0
            and self.dp_sampled_clients <= 10 * self.dp_noise_multiplier
        ):
            raise ValueError(
                f"dp={self.dp!r} with dp-noise-multiplier={self.dp_noise_multiplier:g} needs "
                f"dp-sampled-clients > {10 * self.dp_noise_multiplier:g}: the clipped count's "
                "noise (std dp-sampled-clients / 20) must stay above half the noise multiplier"
            )
        if self.dp_sampled_clients > self.num_clients:
            raise ValueError(
                f"dp-sampled-clients={self.dp_sampled_clients} is more than the "
                f"{self.num_clients} clients"
            )
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
                f"task-arrivals rounds must be in [0, num-rounds={self.num_rounds}]; got {outside}"
            )
        self.check_algorithm()

    def check_algorithm(self) -> None:
        """The pairing and parameter checks of the strategy's card, on the card:
        builds the policy and aggregator objects (no strategy, no data), so an
        aggregator that does not fit the policy, a value a constructor refuses or
        a setting the strategy would silently drop is a ValueError here."""
        from mmfl_flwr.core.card import card, check_unused_settings

        algorithm = card(self.strategy)
        values = dataclasses.asdict(self)
        try:
            check_unused_settings(algorithm, values, dataclasses.asdict(Settings()))
            algorithm.components(
                self.aggregator or None, self.seed, **algorithm.settings_values(values)
            )
        except ValueError as err:
            raise ValueError(f"strategy={self.strategy!r}: {err}") from err


@functools.cache
def options() -> dict[str, Option]:
    """Setting (field name) -> :class:`Option`, for every field of
    :class:`Settings` but ``extra``, in field order."""
    table = option_rows()
    names = [f.name for f in dataclasses.fields(Settings) if f.name != "extra"]
    missing = set(names) ^ set(table)
    if missing:
        raise AssertionError(f"options() and Settings differ in {sorted(missing)}")
    return {n: table[n] for n in names}


def setting_help(name: str) -> str:
    """The ``mmfl run --help`` text of setting ``name``: what it does, its
    allowed values (:meth:`Option.allowed`), its default and the presets that
    take it."""
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
    :class:`Settings`), or None when it is allowed: of the setting's type and
    accepted by its :class:`Option` (:func:`options`). The same message on
    every surface: ``mmfl run``, a ``--config`` file, :meth:`Settings.validate`,
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
