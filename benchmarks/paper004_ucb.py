"""Evidence for paper 004: Multi-FedAvg, Ranklist-Multi-UCB and Pareto-Multi-UCB
against single-model FedAvg, with few (K = 2) and many (K = 64) clients per round,
with paired 95% confidence intervals over seeds.

Settings as in ``benchmarks/ucb_compare.py`` (imported from it): two logistic-regression
models per dataset (60 dims / 5 classes and 30 dims / 10 classes), one local epoch of SGD
(lr 0.05, batch 10), gamma 0.9, an initial loss query of every (client, model) pair. The
multi-model policies pick K clients per round in total; ``fedavg-single`` trains each
model in its own run with K/2 clients per round (FedAvg = Multi-FedAvg with one model),
from the same data and initial weights, as the paper's baseline.

    python benchmarks/paper004_ucb.py --quick   # Synthetic(1,1), 100 clients, 5 seeds
    python benchmarks/paper004_ucb.py --full    # Synthetic(1,1) and Synthetic-IID, 100 clients,
                                                # 60/30 rounds, 8 seeds

Engine: ``inprocess`` by default here (measured on the shared 2-core machine, 20 rounds
of Ranklist-Multi-UCB with K = 64: 55 s against 261 s on the vectorized engine, same
accuracies; the Synthetic users' sizes are lognormal, and the batched engine pads every
client to the largest one).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import _evidence as E
from ucb_compare import DATASETS, POLICIES

NAME = "paper004_ucb"
REFERENCE = "fedavg-single"
UCB = ("ranklist-ucb", "pareto-ucb")
DATA_LABEL = {"synthetic-1-1": "Synthetic(1,1)", "synthetic-iid": "Synthetic-IID"}
MODES: dict[str, dict[str, Any]] = {
    # rounds per K: K = 64 costs 32x the training of K = 2 per round
    "quick": {
        "datasets": ["synthetic-1-1"],
        "num_clients": 100,
        "rounds": {2: 40, 64: 15},
        "synthetic_max_samples": 100,
        "seeds": [0, 1, 2, 3, 4],
    },
    "smoke": {
        "datasets": ["synthetic-1-1"],
        "num_clients": 64,
        "rounds": {2: 3, 64: 2},
        "synthetic_max_samples": 20,
        "seeds": [0, 1],
    },
    "full": {
        "datasets": ["synthetic-1-1", "synthetic-iid"],
        "num_clients": 100,
        "rounds": {2: 60, 64: 30},
        "synthetic_max_samples": 200,
        "seeds": list(range(8)),
    },
}
BASE = {"local_epochs": 1, "lr": 0.05, "batch_size": 10, "ucb_gamma": 0.9}


def jobs_for(
    dataset: str, k: int, mode: dict[str, Any], defences: str = "off"
) -> list[tuple[str, int, dict[str, Any]]]:
    """``run_many`` jobs of one (dataset, K); ``fedavg-single`` is one job per model
    (method label ``fedavg-single|<task>``, merged afterwards); ``defences``: the runs'
    mode (:func:`_evidence.with_defences`)."""
    common = {
        **BASE,
        "num_clients": mode["num_clients"],
        "num_rounds": mode["rounds"][k],
        "synthetic_max_samples": mode["synthetic_max_samples"],
    }
    tasks = DATASETS[dataset]
    jobs = []
    for seed in mode["seeds"]:
        for pol in POLICIES:
            if pol == "fedavg-single":
                for task in tasks.split(","):
                    jobs.append(
                        (
                            f"fedavg-single|{task}",
                            seed,
                            {
                                **common,
                                "tasks": task,
                                "strategy": "multi-fedavg",
                                "clients_per_round": max(1, k // 2),
                            },
                        )
                    )
            else:
                jobs.append(
                    (pol, seed, {**common, "tasks": tasks, "strategy": pol, "clients_per_round": k})
                )
    return [(m, s, E.with_defences(kw, defences)) for m, s, kw in jobs]


def claim_verdicts(
    dataset: str, k: int, finals: dict[str, dict[int, float]], margin: float = 0.02
) -> list[tuple[str, str, dict[str, Any]]]:
    """The paper's claims for (dataset, K): (claim, verdict, paired difference).
    Direction claims by the paired 95% interval; "level" claims by TOST with the
    equivalence margin ``margin`` (accuracy), whose difference also carries
    ``verdicts`` (the text of the verdicts at ``margin`` and at half of it) and
    ``half_verdict``."""
    out = []

    def ahead(a: str, b: str, claim: str) -> None:
        d = E.paired_ci(finals[a], finals[b])
        v = {"better": "holds", "worse": "does not hold"}.get(d["verdict"], "not resolved")
        out.append((claim, v, d | {"a": a, "b": b}))

    def level(a: str, b: str, claim: str) -> None:
        # an equivalence claim: TOST against +-margin (accuracy), not "the interval
        # covers 0" (absence of evidence); the 90% interval is reported. The margin is
        # this project's choice, so the verdict at half of it is stated too (issue 61);
        # the claim counts by the chosen margin's verdict
        d, half, both = E.equivalence_at_half(finals[a], finals[b], margin)
        out.append(
            (
                claim,
                E.equivalence_verdict(d),
                d | {"a": a, "b": b, "verdicts": both, "half_verdict": half},
            )
        )

    iid = dataset == "synthetic-iid"
    if k <= 2 or iid:
        for u in UCB:
            ahead(u, "fedavg-single", f"{u} ahead of single-model FedAvg")
            ahead(u, "multi-fedavg", f"{u} ahead of Multi-FedAvg")
    else:
        for u in UCB:
            ahead("multi-fedavg", u, f"Multi-FedAvg ahead of {u}")
    level("multi-fedavg", "fedavg-single", "Multi-FedAvg level with single-model FedAvg")
    return out


def main(argv: list[str] | None = None) -> int:
    p = E.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    E.mode_args(
        p,
        "inprocess",
        "faster than the vectorized engine on these small "
        "logistic-regression models with a few trainers per round",
        "default 2, or 1 on a one-core machine",
    )
    p.set_defaults(workers=min(2, os.cpu_count() or 1))
    p.add_argument("--ks", default="2,64")
    p.add_argument("--seeds", default=None, help="override the mode's seeds (0,1,2)")
    p.add_argument(
        "--datasets",
        default=None,
        help=f"override the mode's data sets (from {', '.join(DATASETS)})",
    )
    p.add_argument(
        "--margin",
        default="0.02",
        help="equivalence margin of the 'level with' claims, in accuracy "
        "(default 0.02: TOST, the 90%% interval inside +-margin)",
    )
    E.defences_arg(p)
    a = p.parse_args(argv)
    margin = E.margin_arg(p, a.margin)
    mode = dict(MODES[a.mode])
    if a.datasets is not None:
        mode["datasets"] = E.name_list(p, "--datasets", a.datasets, DATASETS)
    if a.seeds is not None:
        mode["seeds"] = E.int_list(p, "--seeds", a.seeds, low=0)
    ks = E.int_list(p, "--ks", a.ks, low=2)
    if any(k % 2 for k in ks):
        p.error(
            f"--ks: every K must be even (single-model FedAvg trains each model with "
            f"K/2 clients a round); got {a.ks!r}"
        )
    mode["rounds"] = dict(mode["rounds"])
    for k in ks:
        mode["rounds"].setdefault(k, max(mode["rounds"].values()))
        if k > mode["num_clients"]:
            p.error(f"--ks: K={k} needs at least {k} clients (mode has {mode['num_clients']})")
    out = Path(a.out)
    seeds = mode["seeds"]
    plan = [(d, k) for d in mode["datasets"] for k in ks]
    n_jobs = sum(len(jobs_for(d, k, mode, a.defences)) for d, k in plan)
    print(
        f"{NAME}: {n_jobs} runs ({a.mode}: {mode['num_clients']} clients, rounds "
        f"{mode['rounds']}, seeds {seeds}, engine {a.engine}, {a.workers} workers)",
        flush=True,
    )
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    run_seconds = 0.0  # summed over the runs (a re-analysis from a CSV has none)
    machine = E.machines_used()
    if not a.from_csv:
        E.check_cache(
            a.cache,
            [
                j
                for d, k in plan
                for j in E.run_jobs_keys(jobs_for(d, k, mode, a.defences), a.engine)
            ],
        )
    if a.from_csv:
        need = [
            (d, k, m.split("|")[0], s)
            for d, k in plan
            for m, s, _ in jobs_for(d, k, mode, a.defences)
        ]
        rows = E.rows_from_csv(
            p,
            a.from_csv,
            ("dataset", "K", "method", "seed"),
            need,
            rounds=lambda run: mode["rounds"][int(run[1])],
        )
        E.check_configuration(p, a.from_csv, NAME, [f"engine `{a.engine}`"])
        status = E.check_defences(p, a.from_csv, rows, a.defences)
        machine = E.reanalysed_machine(out, NAME, a.from_csv)
    else:
        for d, k in plan:
            ran = E.run_many(
                jobs_for(d, k, mode, a.defences), engine=a.engine, workers=a.workers, cache=a.cache
            )
            run_seconds += E.run_time(ran)
            for r in ran:
                r = {"dataset": d, "K": k, **r}
                r.pop("run_seconds", None)  # outputs must not depend on timing
                r["method"] = str(r["method"]).split("|")[0]
                rows.append(r)
        machine = E.machines_used()
        status = E.defences_of(rows)
        E.write_long_csv(out / f"{NAME}.csv", rows)
    wall = time.monotonic() - t0

    timing = E.seconds_text(run_seconds, wall)
    cmd = f"python benchmarks/{NAME}.py --{a.mode}"
    if a.engine != "inprocess":
        cmd += f" --engine {a.engine}"
    if a.defences != "off":
        cmd += f" --defences {a.defences}"
    if a.seeds is not None or a.ks != "2,64" or a.datasets is not None or a.margin != "0.02":
        cmd = E.command(NAME, argv)
    sections, all_claims = [], []
    for d, k in plan:
        sub = [r for r in rows if r["dataset"] == d and r["K"] == k]
        finals = E.final_values(sub)
        finals = {m: finals[m] for m in POLICIES if m in finals}
        table = E.compare_to_reference(finals, REFERENCE)
        claims = claim_verdicts(d, k, finals, margin)
        all_claims += [(d, k, *c) for c in claims]
        tag = f"{d}_K{k}"
        png, box = out / f"{NAME}_{tag}.png", out / f"{NAME}_{tag}_final.png"
        label = f"{DATA_LABEL[d]}, K = {k}"
        E.plot_curves(
            png,
            E.curves(sub),
            f"Paper 004 {label}: {mode['num_clients']} clients, {mode['rounds'][k]} rounds",
        )
        E.plot_final(box, finals, f"{label}: final accuracy ({len(seeds)} seeds)")
        claim_lines = "\n".join(
            f"| {c} | {x['mean']:+.4f} [{x['lo']:+.4f}, {x['hi']:+.4f}]"
            f"{' (90%, TOST)' if 'margin' in x else ''} | {x.get('verdicts', v)} |"
            for c, v, x in claims
        )
        sections.append(
            f"**{label}** ({mode['rounds'][k]} rounds). Final accuracy (last round, mean "
            f"over the two models); paired column: *method − single-model FedAvg (K/2 "
            f"each)* per seed:\n\n"
            + E.markdown_table(table, REFERENCE, "final accuracy")
            + "\n\n| claim | paired difference (95% CI) | verdict |\n|---|---|---|\n"
            + claim_lines
            + f"\n\n![{label} curves]({_rel(png)}) "
            f"![{label} final]({_rel(box)})\n"
        )
    vs = [c[3] for c in all_claims]
    overall = (
        "holds"
        if all(v == "holds" for v in vs)
        else "does not hold"
        if any(v == "does not hold" for v in vs)
        else "not resolved"
    )
    # (a "level" claim that TOST does not show leaves the overall verdict not resolved)
    n_hold = sum(v == "holds" for v in vs)
    iid_run = "synthetic-iid" in mode["datasets"]
    # every claim that does not hold, and every "level" claim that does not hold at half
    # the chosen margin
    others = [
        f"{DATA_LABEL[d]} K={k}, {c}: {x.get('verdicts', v)}, {x['mean']:+.4f} "
        f"[{x['lo']:+.4f}, {x['hi']:+.4f}]{' (90%)' if 'margin' in x else ''}"
        for d, k, c, v, x in all_claims
        if v != "holds" or x.get("half_verdict", "holds") != "holds"
    ]
    found = f"{n_hold} of {len(vs)} claims hold" + ("; " + "; ".join(others) if others else "")
    iid_claim = (
        "On Synthetic-IID the UCB policies beat Multi-FedAvg and FedAvg at both K, "
        'and Multi-FedAvg is similar to FedAvg ("under all our test scenarios", '
        "Section VI)."
        if iid_run
        else "(The paper also claims that on Synthetic-IID the UCB policies beat "
        "Multi-FedAvg and FedAvg at both K; Synthetic-IID was not run for this "
        "section, so that claim is not tested here: `--datasets "
        "synthetic-1-1,synthetic-iid` adds it.)"
    )
    chosen = (
        "chosen by this project"
        if margin == 0.02
        else "given by `--margin` (this project's choice is ±0.02)"
    )
    text = f"""### Paper 004: Multi-FedAvg and the bandit policies with scarce (K = 2) and \
plentiful (K = 64) clients{E.defences_heading(status)}

**Claim (paper 004, Section V; figures only, no numbers in the text).** On Synthetic(1,1)
with 2 clients per round, Ranklist-Multi-UCB and Pareto-Multi-UCB beat single-model
FedAvg (1 client per round) and Multi-FedAvg, which is level with FedAvg; with 64 clients
per round Multi-FedAvg beats the two loss-based policies and is as good as FedAvg with
half the clients. {iid_claim}

"Ahead of" claims are tested by the paired 95% interval; "level with" claims by TOST
against a margin of ±{margin:g} accuracy (the 90% interval of the paired difference
must lie inside it; an interval that merely covers 0 is not equivalence). The paper
states no margin: ±{margin:g} is {chosen}, so each "level" claim gives
its verdict at half of it (±{margin / 2:g}) too, and counts by the chosen margin's.

Scale: two logistic-regression models, {mode["num_clients"]} clients, rounds
{", ".join("K={}: {}".format(k, mode["rounds"][k]) for k in ks)}, one local epoch (SGD, lr 0.05,
batch 10), gamma 0.9, loss-query initialisation, Synthetic users capped at
{mode["synthetic_max_samples"]} samples, {len(seeds)} seeds
({", ".join(map(str, seeds))}), engine `{a.engine}`. Machine: {machine}; {timing}.

{E.defences_text(status)}

```bash
{cmd}
```

{chr(10).join(sections)}
Verdict: {overall} ({n_hold} of {len(vs)} claims hold; the claim tables above give each).
Found: {found}.
Paper: figures only, no numbers in the text.

Where a claim does not hold or is not resolved, what could be varied: the run length (the
paper's figures run to 500 rounds; the UCB policies lead early and Multi-FedAvg catches
up), gamma, the number of clients (paper 004's text does not state it) and the per-user
sample cap.
"""
    E.write_fragment(out, NAME, text)
    print(
        f"\n{NAME}: {n_jobs} runs in {wall:.0f}s; verdict {overall} "
        f"({n_hold}/{len(vs)} claims hold)"
    )
    for d, k, c, v, x in all_claims:
        print(
            f"  {d} K={k}: {c}: {x['mean']:+.4f} [{x['lo']:+.4f}, {x['hi']:+.4f}] "
            f"-> {x.get('verdicts', v)}"
        )
    for d, k in plan:
        sub = [r for r in rows if r["dataset"] == d and r["K"] == k]
        finals = E.final_values(sub)
        for m in POLICIES:
            if m in finals:
                mm, lo, hi = E.mean_ci(list(finals[m].values()))
                print(f"  {d} K={k} {m:<14} {mm:.4f} [{lo:.4f}, {hi:.4f}]")
    return 0


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(E.REPO))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
