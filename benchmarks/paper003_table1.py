#!/usr/bin/env python
"""Paper 003 (MMFL-LVR / GVR / StaleVR / StaleVRE vs baselines): Table 1, Fig. 2 and
Fig. 4 from the same runs.

    python benchmarks/paper003_table1.py --quick      # minutes on 2 cores
    python benchmarks/paper003_table1.py --full       # 120 clients, 40 rounds, 8 seeds

* Table 1: final accuracy (mean over the models and the last rounds) per method, with
  95% t intervals over seeds, paired per-seed differences vs ``full`` (the paper's
  reference) and the relative accuracy (method / full per seed), plus the paired
  LVR - GVR difference (paper: LVR .896 > GVR .886 of full, 3 tasks).
* Fig. 2: ``sum_s ||H_{tau,s}||_1`` (the ``coef_sum`` history column summed over the
  models) per round for the unbiased ``d/(B p)`` methods; expectation S; its variance
  over rounds (paper: GVR's is larger than LVR's).
* Fig. 4: rounds until the mean-over-models accuracy first reaches a target, the
  targets being fractions of full participation's final accuracy (the paper uses
  absolute targets on its datasets). RoundRobin-GVR is not a preset (see the fragment).

Outputs (``--out``): paper003_table1.{csv,md,png}, paper003_table1_final.png,
paper003_fig2.{csv,png}, paper003_fig4.{csv,png}; one fragment, paper003_table1.md,
holds the three sections.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Any


import _evidence as E

NAME = "paper003_table1"
METHODS = ["full", "random", "lvr", "gvr", "stalevr", "stalevre", "fedvarp", "mifa",
           "scaffold", "rr-gvr"]
UNBIASED = ["random", "lvr", "gvr"]  # d/(B p) aggregation: E[||H||_1] = 1 per model
PAPER_REL = {"fedvarp": 0.681, "mifa": 0.854, "scaffold": 0.783, "gvr": 0.886,
             "random": 0.792, "full": 1.000, "lvr": 0.896, "stalevr": 0.943,
             "stalevre": 0.918}
FRACTIONS = (0.5, 0.6, 0.7, 0.8, 0.9)

SCALES = {
    # budget_fraction 0 = auto: the smallest hundredth giving 5 expected uploads per
    # model (0.1 V gives ~1-2 per model at 16 clients, too few to train)
    "quick": dict(num_clients=16, num_rounds=6, local_epochs=1, seeds=[0, 1, 2],
                  budget_fraction=0.0, last=3),
    "smoke": dict(num_clients=8, num_rounds=3, local_epochs=1, seeds=[0, 1],
                  budget_fraction=0.0, last=2),
    "full": dict(num_clients=120, num_rounds=40, local_epochs=5, seeds=list(range(8)),
                 budget_fraction=0.1, last=5),
}


def settings_for(method: str, sc: dict[str, Any], tasks: str) -> dict[str, Any]:
    from mmfl_flwr.presets import presets_taking

    kw: dict[str, Any] = dict(strategy=method, tasks=tasks, profile="paper003",
                              num_clients=sc["num_clients"], num_rounds=sc["num_rounds"],
                              local_epochs=sc["local_epochs"], lr=sc.get("lr", 0.1), batch_size=16)
    if method in presets_taking("budget_fraction"):
        kw["budget_fraction"] = sc["budget_fraction"]
    return kw


def fmt(m: float, lo: float, hi: float, p: int = 4) -> str:
    if not math.isfinite(lo):
        return f"{m:.{p}f}"
    return f"{m:.{p}f} [{lo:.{p}f}, {hi:.{p}f}]"


def verdict(diffs: list[dict[str, Any]]) -> str:
    if any(d["verdict"] == "worse" for d in diffs):
        return "does not hold"
    if all(d["verdict"] == "better" for d in diffs):
        return "holds"
    return "not resolved"


# ---------------------------------------------------------------------------- Fig. 2
def coef_sums(rows: list[dict[str, Any]]) -> dict[str, dict[int, dict[int, float]]]:
    """{method: {seed: {round: sum over models of coef_sum}}} (rounds >= 1)."""
    out: dict[str, dict[int, dict[int, float]]] = {}
    for r in rows:
        v = r.get("coef_sum")
        if int(r["round"]) < 1 or v is None or v == "":
            continue
        d = out.setdefault(r["method"], {}).setdefault(int(r["seed"]), {})
        d[int(r["round"])] = d.get(int(r["round"]), 0.0) + float(v)
    return out


# ---------------------------------------------------------------------------- Fig. 4
def rounds_to(curve: dict[int, float], target: float, cap: int) -> int:
    """First round >= 1 whose accuracy reaches ``target``; ``cap + 1`` if none."""
    for rd in sorted(curve):
        if rd >= 1 and curve[rd] >= target:
            return rd
    return cap + 1


def plot_fig4(path: str, table: dict[str, dict[float, list[int]]], targets: dict[float, float],
              cap: int) -> None:
    plt = E._pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for method, per in table.items():
        xs, ms, los, his = [], [], [], []
        for f in sorted(per):
            m, lo, hi = E.mean_ci(per[f])
            xs.append(targets[f])
            ms.append(m)
            los.append(m - lo if math.isfinite(lo) else 0.0)
            his.append(hi - m if math.isfinite(hi) else 0.0)
        ax.errorbar(xs, ms, yerr=[los, his], marker="o", capsize=3, label=method)
    ax.axhline(cap + 1, color="grey", ls=":", lw=1)
    ax.set_xlabel("target accuracy (mean over models)")
    ax.set_ylabel(f"rounds to target ({cap + 1} = not reached)")
    ax.set_title("Paper 003, Fig. 4: rounds to target accuracy (mean, 95% CI)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    E.mode_args(p)
    p.add_argument("--tasks", default="digits,digits,digits")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seeds", default="", help="override the mode's seeds (e.g. 0,1,2)")
    p.add_argument("--num-rounds", type=int, default=0, help="override the mode's rounds")
    p.add_argument("--num-clients", type=int, default=0, help="override the mode's clients")
    p.add_argument("--lr", type=float, default=0.1, help="client learning rate (default 0.1)")
    p.add_argument("--budget-fraction", type=float, default=-1.0,
                   help="override the mode's m / V")
    a = p.parse_args(argv)
    sc = dict(SCALES[a.mode])
    if a.seeds:
        sc["seeds"] = [int(s) for s in a.seeds.split(",")]
    if a.num_rounds:
        sc["num_rounds"] = a.num_rounds
    if a.num_clients:
        sc["num_clients"] = a.num_clients
    if a.budget_fraction >= 0:
        sc["budget_fraction"] = a.budget_fraction
    sc["lr"] = a.lr
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    out = a.out
    os.makedirs(out, exist_ok=True)
    cmd = E.command(NAME, argv)
    jobs = [(m, s, settings_for(m, sc, a.tasks)) for s in sc["seeds"] for m in methods]
    print(f"{len(jobs)} runs on {a.engine}: {sc}", flush=True)
    t0 = time.monotonic()
    rows = E.run_many(jobs, engine=a.engine, workers=a.workers, cache=a.cache)
    wall = time.monotonic() - t0
    E.write_long_csv(os.path.join(out, f"{NAME}.csv"), rows)
    n_models = len(a.tasks.split(","))
    scale = (f"{sc['num_clients']} clients (profile paper003), tasks `{a.tasks}` "
             f"({n_models} models), {sc['num_rounds']} rounds, {sc['local_epochs']} local "
             f"epochs, lr {sc['lr']}, batch 16, budget fraction "
             f"{sc['budget_fraction'] or 'auto (5 expected uploads per model)'}, seeds "
             f"{sc['seeds']}; engine `{a.engine}`; {E.machines_used()}; "
             f"{E.run_time_text(rows, wall)}")

    # ---------------------------------------------------------------- Table 1
    ref = "full" if "full" in methods else methods[0]
    finals = E.final_values(rows, "accuracy", last=sc["last"])
    finals = {m: finals[m] for m in methods if m in finals}
    cmp_rows = E.compare_to_reference(finals, ref)
    rel = {m: {s: v / finals[ref][s] for s, v in per.items() if finals[ref].get(s)}
           for m, per in finals.items()}
    rel_rows = E.compare_to_reference(rel, ref)
    lines = ["| method | relative to full (mean, 95% CI) | paper 003 (3 tasks) |",
             "|---|---|---|"]
    for r in rel_rows:
        paper = (f"{PAPER_REL[r['method']]:.3f}" if r["method"] in PAPER_REL
                 else "not in Table 1")
        lines.append(f"| {r['method']} | {fmt(r['mean'], r['lo'], r['hi'], 3)} | {paper} |")
    key = []
    key_lines = ["| claim | paired difference (95% CI) | n | verdict |", "|---|---|---|---|"]
    for hi_m, lo_m in [("lvr", "gvr"), ("lvr", "random"), ("stalevr", "random"),
                       ("stalevre", "random"), ("stalevr", "lvr"), ("stalevre", "lvr")]:
        if hi_m in finals and lo_m in finals:
            d = E.paired_ci(finals[hi_m], finals[lo_m])
            key.append(d)
            key_lines.append(f"| {hi_m} > {lo_m} | {d['mean']:+.4f} [{d['lo']:+.4f}, "
                             f"{d['hi']:+.4f}] | {d['n']} | {d['verdict']} |")
    E.plot_curves(os.path.join(out, f"{NAME}.png"), E.curves(rows),
                  f"Paper 003 Table 1 runs: accuracy per round ({a.tasks})")
    E.plot_final(os.path.join(out, f"{NAME}_final.png"), finals,
                 f"Paper 003 Table 1: final accuracy (last {sc['last']} rounds)")

    # ---------------------------------------------------------------- Fig. 2
    cs = coef_sums(rows)
    fig2_rows = [{"method": m, "seed": s, "round": rd, "coef_sum_total": v}
                 for m, seeds in cs.items() for s, per in seeds.items()
                 for rd, v in sorted(per.items())]
    E.write_long_csv(os.path.join(out, "paper003_fig2.csv"), fig2_rows)
    shown = [m for m in UNBIASED + ["full"] if m in cs]
    E.plot_curves(os.path.join(out, "paper003_fig2.png"), {m: cs[m] for m in shown},
                  f"Paper 003 Fig. 2: summed global step size sum_s ||H_s||_1 "
                  f"(expectation {n_models})", ylabel="sum over models of coef_sum")
    f2 = ["| method | mean of sum_s ||H_s||_1 over rounds (95% CI over seeds) | "
          "variance over rounds (95% CI) |", "|---|---|---|"]
    variances: dict[str, dict[int, float]] = {}
    for m in shown:
        means = [statistics.fmean(per.values()) for per in cs[m].values()]
        variances[m] = {s: statistics.pvariance(per.values()) for s, per in cs[m].items()}
        f2.append(f"| {m} | {fmt(*E.mean_ci(means), 3)} | "
                  f"{fmt(*E.mean_ci(list(variances[m].values())), 3)} |")
    f2_claim = []
    if "gvr" in variances and "lvr" in variances:
        d = E.paired_ci(variances["gvr"], variances["lvr"])
        f2_claim.append(d)
        f2.append("")
        f2.append(f"Paired variance difference GVR - LVR: {d['mean']:+.3f} "
                  f"[{d['lo']:+.3f}, {d['hi']:+.3f}] (n = {d['n']}, {d['verdict']}).")
        # the same by phase of training: first and last third of the rounds
        third = max(sc["num_rounds"] // 3, 2)
        phases = {"first": (1, third),
                  "last": (sc["num_rounds"] - third + 1, sc["num_rounds"])}
        f2 += ["", "Variance over rounds by phase (95% CI over seeds):", "",
               "| method | " + " | ".join(f"rounds {a}-{b}" for a, b in phases.values())
               + " |", "|---|" + "---|" * len(phases)]
        by_phase: dict[str, dict[str, dict[int, float]]] = {}
        for m in shown:
            cells = []
            for ph, (a0, b0) in phases.items():
                v = {s_: statistics.pvariance([x for rd, x in per.items() if a0 <= rd <= b0])
                     for s_, per in cs[m].items()}
                by_phase.setdefault(ph, {})[m] = v
                cells.append(fmt(*E.mean_ci(list(v.values())), 3))
            f2.append(f"| {m} | " + " | ".join(cells) + " |")
        f2.append("")
        for ph, (a0, b0) in phases.items():
            dp = E.paired_ci(by_phase[ph]["gvr"], by_phase[ph]["lvr"])
            f2.append(f"Paired GVR - LVR, rounds {a0}-{b0}: {dp['mean']:+.3f} "
                      f"[{dp['lo']:+.3f}, {dp['hi']:+.3f}] ({dp['verdict']}).")

    # ---------------------------------------------------------------- Fig. 4
    cur = E.curves(rows)
    full_final = statistics.fmean(finals[ref].values())
    targets = {f: f * full_final for f in FRACTIONS}
    cap = sc["num_rounds"]
    f4: dict[str, dict[float, list[int]]] = {}
    fig4_rows = []
    for m in methods:
        if m not in cur:
            continue
        for f, t in targets.items():
            for s in sorted(cur[m]):
                n = rounds_to(cur[m][s], t, cap)
                f4.setdefault(m, {}).setdefault(f, []).append(n)
                fig4_rows.append({"method": m, "seed": s, "fraction": f, "target": t,
                                  "rounds": n, "reached": int(n <= cap)})
    E.write_long_csv(os.path.join(out, "paper003_fig4.csv"), fig4_rows)
    plot_fig4(os.path.join(out, "paper003_fig4.png"), f4, targets, cap)
    f4l = ["| method | " + " | ".join(f"{f:.0%} of full ({t:.3f})" for f, t in targets.items())
           + " |", "|---|" + "---|" * len(targets)]
    for m, per in f4.items():
        cells = []
        for f in targets:
            v = per[f]
            reached = sum(x <= cap for x in v)
            cells.append(f"{fmt(*E.mean_ci(v), 1)} ({reached}/{len(v)})")
        f4l.append(f"| {m} | " + " | ".join(cells) + " |")
    f4_claim = []
    if "gvr" in f4:
        mid = FRACTIONS[len(FRACTIONS) // 2]
        f4l.append("")
        for m in ("lvr", "random", "stalevr"):
            if m in f4:
                seeds = sorted(cur[m])
                d = E.paired_ci(dict(zip(seeds, f4[m][mid])), dict(zip(seeds, f4["gvr"][mid])))
                f4l.append(f"Paired rounds {m} - gvr at {mid:.0%} of full: {d['mean']:+.2f} "
                           f"[{d['lo']:+.2f}, {d['hi']:+.2f}] (n = {d['n']}).")
    if "gvr" in f4 and "rr-gvr" in f4:
        f4l += ["", "RoundRobin-GVR against MMFL-GVR, paired per seed (rounds rr-gvr - gvr; "
                "positive = MMFL-GVR faster):", "",
                "| target | paired rounds rr-gvr - gvr (95% CI) | n | verdict |",
                "|---|---|---|---|"]
        seeds = sorted(cur["gvr"])
        for f in FRACTIONS:
            d = E.paired_ci(dict(zip(seeds, f4["rr-gvr"][f])), dict(zip(seeds, f4["gvr"][f])))
            f4_claim.append(d)
            f4l.append(f"| {f:.0%} of full | {d['mean']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}]"
                       f" | {d['n']} | {d['verdict']} |")
    f4_verdict = (verdict(f4_claim) + " (MMFL-GVR needs fewer rounds than RoundRobin-GVR at "
                  "every target: every interval above 0 to hold)") if f4_claim else (
        "not resolved (rr-gvr or gvr not run)")

    text = f"""### Paper 003, Table 1: MMFL-LVR / GVR / StaleVR / StaleVRE vs baselines

Paper's claim (Table 1, 3 Fashion-MNIST models, 120 clients, m = 0.1 V): relative to full
participation, MMFL-StaleVR has the highest final accuracy (0.943), then StaleVRE 0.918,
LVR 0.896, GVR 0.886, MIFA 0.854, Random 0.792, SCAFFOLD 0.783, FedVARP 0.681; "MMFL-LVR
outperforms MMFL-GVR" and every proposed method beats the uniform-sampling baselines.
(The paper's ± values are spreads, not intervals.)

Final accuracy = mean over the models and the last {sc['last']} rounds; reference `{ref}`.

{E.markdown_table(cmp_rows, ref, 'final accuracy')}

Relative accuracy (method / full, per seed):

{chr(10).join(lines)}

Key orderings (paired per seed):

{chr(10).join(key_lines)}

![accuracy per round]({out}/{NAME}.png)
![final accuracy]({out}/{NAME}_final.png)

Verdict (MMFL-LVR above MMFL-GVR): {verdict(key[:1]) if key else 'not resolved'}

Verdict (StaleVR and StaleVRE above LVR; LVR, StaleVR and StaleVRE above random):
{verdict(key[1:]) if key else 'not resolved'}

(A claim holds when all its paired intervals lie above 0, does not hold when one lies
below 0, and is not resolved otherwise.)

### Paper 003, Fig. 2: summed global step size sum_s ||H_tau,s||_1

Paper's claim: E[||H_tau,s||_1] = 1 per model (Eq. 16), so the sum over the S models has
expectation S = {n_models}; MMFL-GVR's sum fluctuates much more than MMFL-LVR's (Fig. 2).
Here `coef_sum` (history column, per model and round) = sum over the aggregated (i, b) of
d_i,s / (B_i p_i,s); plotted summed over the models, for the unbiased d/(Bp) methods
(full: exactly S).

{chr(10).join(f2)}

![summed global step size](docs/results/paper003_fig2.png)

Verdict: {verdict(f2_claim) if f2_claim else 'not resolved'} (GVR's variance over rounds
above LVR's)

### Paper 003, Fig. 4: rounds to a target accuracy

Paper's claim: MMFL-GVR reaches each target accuracy in fewer rounds than RoundRobin-GVR
(one model per round, GVR sampling of [6]), the gap widening with the target. Here
RoundRobin-GVR is the preset `rr-gvr` (model tau mod S each round, every holder trains it,
gradient-norm optimal sampling with MMFL-GVR's budget m, unbiased d/q aggregation). Targets =
fractions of full participation's mean final accuracy ({full_final:.3f}); rounds = first
round whose mean-over-models accuracy reaches the target, {cap + 1} when never reached
(a censored lower bound; reached counts in brackets). Where RoundRobin-GVR never reaches a
target, its rounds are a lower bound, so the paired difference understates the gap.

{chr(10).join(f4l)}

![rounds to target](docs/results/paper003_fig4.png)

Verdict: {f4_verdict}

Command: `{cmd}`; scale: {scale}.
"""
    text = text.replace(f"]({out}/", "](docs/results/")
    E.write_fragment(out, NAME, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
