"""The hostile-client attack matrix: one lying client against the presets.

For every preset and attack of :mod:`mmfl_flwr.testing.hostile` (one hostile
client, id ``3``, every round), on the embedded tasks and the in-process
engine, with the default bounds, this prints what the server did with the
hostile client's parts (rejected / ignored / bounded by a clip or cap /
accepted as sent) and the final mean accuracy against the honest run of the
same seed, plus the same attack with ``--aggregator median`` where the preset
takes an aggregator.

    python benchmarks/hostile_clients.py --seeds 0,1 --num-rounds 10

Accuracy costs are means over seeds; at a few clients and rounds, one missing
client's update alone moves accuracy by several points (compare the
"rejected" rows with the honest run).

``--field`` runs instead the attack families of the robust-FL benchmarks
(ByzFL, FLPoison, Blades) against each defence configuration, per model:

    python benchmarks/hostile_clients.py --field --seeds 0-5 \
        --defences default,no-direction,no-clip,median,centered-clip \
        --cache docs/results/attack_field_runs.jsonl \
        --markdown docs/results/attack_field.md --json docs/results/attack_field.json

(tasks ``digits,synthetic``, 12 clients, 8 rounds, 5 local epochs, in-process
engine; attacker id 3, colluders 3, 7 and 9 for ALIE and label flipping, which
poisons the clients' data through ``run_inprocess``'s ``client_hook``). Each attack's
per-model drop is paired by seed with the honest run of the same defence and compared with the
drop of the attacker-absent run (client 3 fails every training): an attack is
``contained`` when its mean drop is at most the absent run's upper 95% bound
plus 0.05. Beside the server's test accuracy, each row gives the drop of the
*others'* accuracy (:func:`flip_scale.others_accuracy`: each model on the local test
data of every client but the attackers, so an attacker's own users do not count),
paired by seed with the honest run on the same clients. The minimum over attacks of
each model's accuracy is the defence's worst case (ByzFL's way of ranking defences).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

from _evidence import Parser, int_list, write_outputs

HOSTILE = "3"
ATTACKS = (
    "huge-weights",
    "scaled-x1000",
    "count-registration",
    "count-train",
    "lying-loss",
    "replay",
    "squat",
    "squat-pinned",
)
SQUATTER = "1"  # claims client 3's id; client 3 is late (its first info query fails)
SECRET = "client-3-secret"


class _Tap(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, "mmfl_escalation", False):  # the checks' own lines only
            self.lines.append(record.getMessage())

    def add_actions(self, result: Any) -> None:
        """The bounds' actions, logged at DEBUG since issue 57: from the events."""
        from mmfl_flwr.strategy.events import action_lines

        self.lines += action_lines(result.events)


def _attack(name: str) -> Any:
    from mmfl_flwr.testing import hostile as H

    return {
        "huge-weights": lambda: H.huge_weights(HOSTILE, 1e30),
        "scaled-x1000": lambda: H.scaled_update(HOSTILE, 1000.0),
        "count-registration": lambda: H.inflated_count(HOSTILE, 10**8),
        "count-train": lambda: H.inflated_count(HOSTILE, 10**6, at_registration=False),
        "lying-loss": lambda: H.lying_loss(HOSTILE, 1e5),
        "replay": lambda: H.replay(HOSTILE),
        "squat": lambda: H.chain(H.impersonate(SQUATTER, HOSTILE), H.late_registration(HOSTILE)),
        "squat-pinned": lambda: H.chain(
            H.impersonate(SQUATTER, HOSTILE),
            H.late_registration(HOSTILE),
            H.with_token(HOSTILE, SECRET),
        ),
    }[name]()


def _run(preset: str, attack: str | None, seed: int, rounds: int, aggregator: str = ""):
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run_inprocess

    kw: dict[str, Any] = dict(
        strategy=preset,
        num_clients=10,
        num_rounds=rounds,
        local_epochs=2,
        output_dir="",
        seed=seed,
        aggregator=aggregator,
    )
    if preset in ("lvr", "stalevre", "random"):
        kw["budget_fraction"] = 0.3
    if preset in ("ranklist-ucb", "pareto-ucb"):
        kw["clients_per_round"] = 4
    if attack == "squat-pinned":
        from mmfl_flwr.strategy.registration import token_pin

        kw["client_pins"] = f"{HOSTILE}={token_pin(SECRET)}"
    tap = _Tap()
    logging.getLogger("flwr").addHandler(tap)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            result = run_inprocess(
                Settings(**kw), wrap_client_app=_attack(attack) if attack else None
            )
    finally:
        logging.getLogger("flwr").removeHandler(tap)
    tap.add_actions(result)
    mine = [m for m in tap.lines if m.startswith(f"Client {HOSTILE}:")]
    refused = [m for m in tap.lines if f"client id {HOSTILE} " in m.lower() and "refused" in m]
    counts = {
        "rejected": sum("rejected" in m for m in mine) + len(refused),
        "ignored": sum("ignored" in m for m in mine),
        "bounded": sum(("clipped" in m) or ("capped" in m) or ("are used" in m) for m in mine),
    }
    trained = sum(
        1 for rnd, picks in result.assignments.items() for cid, _, _ in picks if cid == HOSTILE
    )
    acc = statistics.fmean(r["accuracy"] for r in result.final().values())
    return acc, counts, trained


COLLUDERS = ("3", "7", "9")
#: the attackers' sets whose users the others' accuracy leaves out (one, two, three)
OTHERS_GROUPS = (COLLUDERS[:1], COLLUDERS[:2], COLLUDERS)
#: attack name -> (what it is); "@<task>" aims an attack at one model
FIELD = {
    "x50": "honest update x50 (under the 100x rejection bound)",
    "x90": "honest update x90",
    "flip1": "sign flip: -1 x its update",
    "flip10": "sign flip: -10 x its update",
    "gauss10": "Gaussian noise at 10 x its update's norm",
    "ipm2": "inner-product manipulation, eps 2 (one attacker: -2 x its update)",
    "alie2": "ALIE, colluders 3 and 7, z from Baruch et al. for 12 clients",
    "alie3": "ALIE, colluders 3, 7 and 9",
    "alie1-z1": "ALIE by client 3 alone, z = 1",
    "alie1-z1.5": "ALIE by client 3 alone, z = 1.5",
    "alie1-z3": "ALIE by client 3 alone, z = 3",
    "alie2-z1": "ALIE, colluders 3 and 7, z = 1",
    "alie2-z1.5": "ALIE, colluders 3 and 7, z = 1.5",
    "alie2-z3": "ALIE, colluders 3 and 7, z = 3",
    "alie3-z1": "ALIE, colluders 3, 7 and 9, z = 1",
    "alie3-z1.5": "ALIE, colluders 3, 7 and 9, z = 1.5",
    "alie3-z3": "ALIE, colluders 3, 7 and 9, z = 3",
    "ipm2-f3": "inner-product manipulation, eps 2, colluders 3, 7 and 9",
    "minmax3": "Min-Max (Shejwalkar and Houmansadr 2021), colluders 3, 7 and 9, minus std",
    "minsum3": "Min-Sum (Shejwalkar and Houmansadr 2021), colluders 3, 7 and 9, minus std",
    "lflip1": "label flipping (y -> C-1-y) by client 3, on every model",
    "lflip3": "label flipping by clients 3, 7 and 9",
    "x50@synthetic": "x50 on the synthetic model only",
    "flip10@synthetic": "-10 x on the synthetic model only",
    "lflip3@synthetic": "label flipping by clients 3, 7 and 9 on the synthetic model only",
}
#: reference runs --attacks also takes (not in the default set): a coalition's absence,
#: what its three clients' data are worth to the models, beside what its attacks cost
REFERENCES = {
    "absent3": "clients 3, 7 and 9 fail every round: the coalition's absence (a reference)",
}


def _reference(name: str) -> bool:
    """An absence run (client 3's, or the coalition's): a yardstick, not an attack."""
    return name == "absent" or name in REFERENCES


#: "influence-clip": the defaults plus the influence bound on every update at
#: its measured factor (off by default); "no-reversed": the defaults without the
#: bound on reversed updates (the defaults before 2026-12-03); "no-direction": the
#: clip alone, without the direction check and the bound on reversed updates;
#: "no-clip": neither (only the rejection bounds); "collusion": the defaults plus
#: the collusion check at its measured factor (off by default); "collusion-centered-clip":
#: the collusion check with centered clipping as the aggregator; "loose": the defaults with
#: the update clip at 5 and the bound on reversed updates at 8 (it meets the false-positive
#: target on the 14 honest rows measured); "tight": both at 2. The two sides of the
#: trade-off on docs/explanation/defences.md ("The trade-off")
DEFENCES = {
    "default": {},
    "collusion": {"collusion_factor": 4.0},  # COLLUSION_FACTOR
    "influence-clip": {"influence_clip_factor": 4.0},  # INFLUENCE_CLIP_FACTOR
    "no-reversed": {"reversed_influence_factor": 0.0},
    "loose": {"update_clip_factor": 5.0, "reversed_influence_factor": 8.0},
    "tight": {"update_clip_factor": 2.0, "reversed_influence_factor": 2.0},
    "no-direction": {"direction_factor": 0.0, "reversed_influence_factor": 0.0},
    "no-clip": {
        "update_clip_factor": 0.0,
        "direction_factor": 0.0,
        "reversed_influence_factor": 0.0,
    },
    "median": {"aggregator": "median"},
    "centered-clip": {"aggregator": "centered-clip"},
    "collusion-centered-clip": {"collusion_factor": 4.0, "aggregator": "centered-clip"},
}
#: the configurations that replace the preset's aggregator (run only for presets that take one)
AGGREGATOR_DEFENCES = tuple(d for d, kw in DEFENCES.items() if "aggregator" in kw)


def _defence(preset: str, defence: str) -> dict[str, Any]:
    """The settings of a defence for a preset: centered clipping keeps the
    preset's weights (the unbiased rule's d/(Bp) for a policy whose picks carry
    inclusion probabilities, FedAvg's otherwise)."""
    kw = dict(DEFENCES[defence])
    if kw.get("aggregator") == "centered-clip":
        from mmfl_flwr.presets import make_strategy

        if make_strategy(preset).aggregator.needs_inclusion_probabilities:
            kw["aggregator"] = "unbiased-centered-clip"
    return kw


def _field_attack(name: str) -> Any:
    from mmfl_flwr.testing import hostile as H

    if name == "honest":
        return None
    if name in ("absent", "absent3"):
        away = {HOSTILE} if name == "absent" else set(COLLUDERS)

        def absent(app: Any) -> Any:
            def call(msg: Any, ctx: Any) -> Any:
                if H._cid(ctx) in away and msg.metadata.message_type == "train":
                    raise RuntimeError(f"client {H._cid(ctx)} is absent")
                return app(msg, ctx)

            return call

        return absent
    name, _, task = name.partition("@")
    tasks = {task} if task else None
    if name.startswith("x"):
        return H.scaled_update(HOSTILE, float(name[1:]), tasks)
    if name.startswith("flip"):
        return H.scaled_update(HOSTILE, -float(name[4:]), tasks)
    if name == "gauss10":
        return H.gaussian_update(HOSTILE, 10.0, tasks=tasks)
    if name == "ipm2":
        return H.ipm([HOSTILE], 2.0, tasks)
    if name == "ipm2-f3":
        return H.ipm(COLLUDERS, 2.0, tasks)
    if name in ("minmax3", "minsum3"):
        return (H.min_max if name == "minmax3" else H.min_sum)(COLLUDERS, "std", tasks)
    if name.startswith("alie"):
        f_text, _, z_text = name[4:].partition("-z")
        f = int(f_text)
        return H.alie(COLLUDERS[:f], float(z_text) if z_text else H.alie_z(12, f), tasks)
    if name.startswith("lflip"):
        return None  # data poisoning: a client hook (_field_hook), not a wrapper
    raise KeyError(name)


def _attackers(name: str) -> set[str]:
    """The hostile clients of a field attack."""
    name = name.partition("@")[0]
    if name in ("ipm2-f3", "minmax3", "minsum3", "absent3"):
        return set(COLLUDERS)
    for family in ("alie", "lflip"):
        if name.startswith(family):
            return set(COLLUDERS[: int(name[len(family) :].partition("-z")[0])])
    return {HOSTILE}


def _field_hook(name: str) -> Any:
    """The client hook of a data-poisoning attack, or None."""
    from mmfl_flwr.testing import hostile as H

    name, _, task = name.partition("@")
    if not name.startswith("lflip"):
        return None
    return H.label_flipping(sorted(_attackers(name)), {task} if task else None)


def field_settings(preset: str, defence: str, seed: int, rounds: int = 8) -> Any:
    """The field benchmark's run: tasks ``digits,synthetic``, 12 clients, 5 local
    epochs, in-process engine, no outputs, with the defence's settings."""
    from mmfl_flwr.config import Settings

    return Settings(
        strategy=preset,
        tasks="digits,synthetic",
        num_clients=12,
        num_rounds=rounds,
        local_epochs=5,
        output_dir="",
        seed=seed,
        **_defence(preset, defence),
    )


def reusable(r: dict[str, Any]) -> bool:
    """Whether a cached field run may stand for its configuration today: its settings
    (``bounds``, recorded since the configurations ``loose`` and ``tight`` were added)
    are still its configuration's, so that a configuration retuned under its name runs
    again. A run recorded before has none and is kept: its page's header says the code it
    was made with."""
    if "bounds" not in r:
        return True
    return r["defence"] in DEFENCES and r["bounds"] == _defence(r["preset"], r["defence"])


def _field_run(job: tuple[str, str, str, int]) -> dict[str, Any]:
    preset, defence, attack, seed = job
    from mmfl_flwr.runner import run_inprocess

    settings = field_settings(preset, defence, seed)
    logger = logging.getLogger("flwr")
    # the console stays quiet while the tap reads the log; restored after, so a caller's
    # own logging (a test process's) is as it was
    saved = (logger.level, [(h, h.level) for h in logger.handlers])
    logger.setLevel(logging.WARNING)
    for h in logger.handlers:
        h.setLevel(logging.ERROR)
    tap = _Tap()
    logger.addHandler(tap)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            result = run_inprocess(
                settings,
                wrap_client_app=_field_attack(attack),
                client_hook=_field_hook(attack),
            )
    finally:
        logger.removeHandler(tap)
        logger.setLevel(saved[0])
        for h, level in saved[1]:
            h.setLevel(level)
    tap.add_actions(result)
    hostile = _attackers(attack)
    from flip_scale import others_accuracy

    # every coalition's users left out, so an attack's row pairs with the honest run's
    others = {
        ",".join(group): others_accuracy(settings, result.arrays, group) for group in OTHERS_GROUPS
    }
    acted = [m for m in tap.lines if "clipped update" in m or "rejected update" in m]
    who = [m.split(":", 1)[0].removeprefix("Client ") for m in acted]
    return {
        "preset": preset,
        "defence": defence,
        "bounds": _defence(preset, defence),
        "attack": attack,
        "seed": seed,
        "accuracy": {t: r["accuracy"] for t, r in result.final().items()},
        "attacker_named": sum(w in hostile for w in who),
        "attacker_named_tasks": sorted(
            {
                m.split("task ", 1)[1].split(":", 1)[0].strip("'")
                for m, w in zip(acted, who)
                if w in hostile
            }
        ),
        "honest_clipped": sum(w not in hostile and "clipped" in m for m, w in zip(acted, who)),
        "honest_rejected": sum(w not in hostile and "rejected" in m for m, w in zip(acted, who)),
        "others": others,
    }


def _others_drop(
    runs: dict[str, dict[int, dict[str, Any]]], attack: str, task: str
) -> dict[str, float] | None:
    """The others' accuracy of the honest run minus the attack's, paired by seed, on the
    test data of every client but the attack's (the attacker-absent run: client 3's);
    None where a run predates the metric."""
    from _evidence import paired_ci

    group = ",".join(sorted(_attackers(attack), key=COLLUDERS.index))
    try:
        honest = {s: r["others"][group][task] for s, r in runs["honest"].items()}
        hit = {s: r["others"][group][task] for s, r in runs[attack].items()}
    except KeyError:
        return None
    return paired_ci(honest, hit)


#: Issue 60's targets under the defaults: a single attacker lowers the others'
#: accuracy of a model by at most the attacker-absent run's upper 95% bound plus
#: this, and the server's by at most that bound plus :data:`SINGLE_SERVER_MARGIN`
#: (the ``contained`` column); a coalition of three lowers no model by more than
#: :data:`COALITION_LIMIT` under at least one defence configuration.
SINGLE_OTHERS_MARGIN = 0.02
SINGLE_SERVER_MARGIN = 0.05
COALITION_LIMIT = 0.15


def target_lines(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """The field's rows against issue 60's targets (:data:`SINGLE_OTHERS_MARGIN`,
    :data:`SINGLE_SERVER_MARGIN`, :data:`COALITION_LIMIT`), with by how much each
    missed one: the single attackers' rows on the others' and the server's
    accuracy (rows with no others' accuracy are left out), and per preset and
    coalition attack of three the defence with the smallest worst drop over the
    models. Returns the counts and the markdown lines."""
    single = [r for r in rows if not _reference(r["attack"]) and len(_attackers(r["attack"])) == 1]
    misses: list[str] = []
    met = {"others": 0, "server": 0}
    checked = {"others": 0, "server": 0}
    for r in single:
        checks = [("server", r["drop"]["mean"], r["absent_drop"]["hi"] + SINGLE_SERVER_MARGIN)]
        if r["others_drop"] and r.get("absent_others_drop"):
            limit = r["absent_others_drop"]["hi"] + SINGLE_OTHERS_MARGIN
            checks.append(("others", r["others_drop"]["mean"], limit))
        for what, value, limit in checks:
            checked[what] += 1
            if value <= limit:
                met[what] += 1
            else:
                misses.append(
                    f"| {r['preset']} | {r['defence']} | {r['attack']} | {r['model']} | "
                    f"{what} | {value:+.3f} | {limit:+.3f} | {value - limit:+.3f} |"
                )
    coalition: dict[tuple[str, str], dict[str, float]] = {}
    away: dict[tuple[str, str], float] = {}  # (preset, defence): the coalition's absence
    for r in rows:
        if r["attack"] == "absent3":
            key = (r["preset"], r["defence"])
            away[key] = max(away.get(key, -1.0), r["drop"]["mean"])
        elif r["attack"] != "absent" and len(_attackers(r["attack"])) == 3:
            per = coalition.setdefault((r["preset"], r["attack"]), {})
            per[r["defence"]] = max(per.get(r["defence"], -1.0), r["drop"]["mean"])
    best = {k: min(v.items(), key=lambda dv: dv[1]) for k, v in coalition.items()}
    held = sum(worst <= COALITION_LIMIT for _, worst in best.values())
    counts = {
        "single_others": {"met": met["others"], "of": checked["others"]},
        "single_server": {"met": met["server"], "of": checked["server"]},
        "coalitions": {"met": held, "of": len(best)},
    }
    lines = [
        "",
        "Against issue 60's targets (a single attacker: the others' accuracy drop at most the "
        f"attacker-absent run's upper bound + {SINGLE_OTHERS_MARGIN:g}, the server's at most "
        f"its upper bound + {SINGLE_SERVER_MARGIN:g}; three colluders: no model's drop above "
        f"{COALITION_LIMIT:g} under at least one defence configuration run here):",
        "",
    ]
    if single:
        lines += [
            f"- single attacker, others' accuracy: met in {met['others']} of "
            f"{checked['others']} (attack, model) rows;",
            f"- single attacker, server accuracy: met in {met['server']} of {checked['server']};",
        ]
    if best:
        lines.append(f"- three colluders: met for {held} of {len(best)} (preset, attack) pairs.")
    if misses:
        lines += [
            "",
            "Single-attacker rows that miss a target, and by how much:",
            "",
            "| preset | defence | attack | model | accuracy of | drop | limit | over by |",
            "|---|---|---|---|---|---|---|---|",
            *misses,
        ]
    if best:
        absence = " the coalition absent (same defence) |" if away else ""
        lines += [
            "",
            "Three colluders: the defence with the smallest worst drop over the models"
            + (
                " (and, beside it, the worst drop when clients 3, 7 and 9 simply fail every "
                "round: what their data are worth, which no defence can give back):"
                if away
                else ":"
            ),
            "",
            "| preset | attack | best defence | worst drop over the models | over the limit by |"
            + absence,
            "|---|---|---|---|---|" + ("---|" if away else ""),
            *(
                f"| {p} | {x} | {d} | {w:+.3f} | "
                + (f"{w - COALITION_LIMIT:+.3f} |" if w > COALITION_LIMIT else "- |")
                + ((f" {away[(p, d)]:+.3f} |" if (p, d) in away else " - |") if away else "")
                for (p, x), (d, w) in best.items()
            ),
        ]
    return counts, lines


def field(a: argparse.Namespace, argv: list[str] | None = None) -> int:
    import json
    from concurrent.futures import ProcessPoolExecutor

    from _evidence import mean_ci, paired_ci

    from mmfl_flwr.presets import takes_aggregator

    seeds = a.seed_list
    attacks = a.attacks.split(",") if a.attacks else list(FIELD)
    unknown = [x for x in attacks if x not in FIELD and x not in REFERENCES]
    if unknown:
        print(
            f"error: unknown attack(s) {unknown}: expected some of "
            f"{list(FIELD) + list(REFERENCES)}",
            file=sys.stderr,
        )
        return 2
    presets = a.presets.split(",") if a.presets else ["mfa-rr", "lvr", "stalevr"]
    from mmfl_flwr.presets import PRESETS

    if any(p not in PRESETS for p in presets):
        print(f"error: --presets takes some of {list(PRESETS)}", file=sys.stderr)
        return 2
    defences = a.defences.split(",")
    if any(d not in DEFENCES for d in defences):
        print(f"error: --defences takes some of {list(DEFENCES)}", file=sys.stderr)
        return 2
    for p in presets:
        for d in AGGREGATOR_DEFENCES:
            if d in defences and not takes_aggregator(p):
                print(f"note: {p} has its own aggregator; the {d} defence is not run for it")
    jobs = [
        (p, d, x, s)
        for p in presets
        for d in defences
        if d not in AGGREGATOR_DEFENCES or takes_aggregator(p)
        for x in ["honest", "absent"] + attacks
        for s in seeds
    ]
    cache = Path(a.cache) if a.cache else None
    done: dict[tuple, dict[str, Any]] = {}
    if cache and cache.exists():
        for line in cache.read_text().splitlines():
            r = json.loads(line)
            if reusable(r):
                done[(r["preset"], r["defence"], r["attack"], r["seed"])] = r
    todo = [j for j in jobs if j not in done]
    print(f"{len(jobs)} runs, {len(todo)} to do", flush=True)
    with ProcessPoolExecutor(a.workers) as ex:
        for r in ex.map(_field_run, todo):
            done[(r["preset"], r["defence"], r["attack"], r["seed"])] = r
            if cache:
                with cache.open("a") as f:
                    f.write(json.dumps(r) + "\n")
            print(
                f"  {r['preset']} {r['defence']} {r['attack']} seed {r['seed']}: "
                + " ".join(f"{t} {v:.3f}" for t, v in r["accuracy"].items()),
                flush=True,
            )
    rows, worst = [], []
    from _evidence import code_commit, command, machine

    table = [
        f"`{command('hostile_clients', argv)}`",
        "",
        f"Machine: {machine()}; code at commit {code_commit()} (runs re-read from "
        "`--cache` keep the code they were made with). Tasks digits,synthetic, 12 clients, "
        f"8 rounds, 5 local epochs, in-process engine, seeds {', '.join(map(str, seeds))}.",
        "",
        "| preset | defence | attack | model | accuracy | drop vs honest [95% CI] "
        "| absent's drop [95% CI] | others' drop [95% CI] | contained "
        "| attacker named (models) | honest clipped / rejected |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in presets:
        for d in defences:
            if (p, d, "honest", seeds[0]) not in done:
                continue
            runs = {
                x: {s: done[(p, d, x, s)] for s in seeds} for x in ["honest", "absent"] + attacks
            }
            tasks = sorted(runs["honest"][seeds[0]]["accuracy"])
            for t in tasks:
                acc = {x: {s: r["accuracy"][t] for s, r in rs.items()} for x, rs in runs.items()}
                ab = paired_ci(acc["honest"], acc["absent"])
                ab_others = _others_drop(runs, "absent", t)
                floor_acc = min(
                    mean_ci(list(acc[x].values()))[0] for x in attacks if not _reference(x)
                )
                worst.append(
                    {
                        "preset": p,
                        "defence": d,
                        "model": t,
                        "honest": mean_ci(list(acc["honest"].values()))[0],
                        "worst": floor_acc,
                    }
                )
                for x in ["absent"] + attacks:
                    drop = paired_ci(acc["honest"], acc[x])
                    others = _others_drop(runs, x, t)
                    ok = _reference(x) or drop["mean"] <= ab["hi"] + 0.05
                    named = sum(r["attacker_named"] for r in runs[x].values())
                    named_t = sorted(
                        {n for r in runs[x].values() for n in r["attacker_named_tasks"]}
                    )
                    hc = sum(r["honest_clipped"] for r in runs[x].values())
                    hr = sum(r["honest_rejected"] for r in runs[x].values())
                    row = {
                        "preset": p,
                        "defence": d,
                        "attack": x,
                        "model": t,
                        "accuracy": mean_ci(list(acc[x].values()))[0],
                        "drop": drop,
                        "absent_drop": ab,
                        "others_drop": others,
                        "absent_others_drop": ab_others,
                        "contained": ok,
                        "attacker_named": named,
                        "named_models": named_t,
                        "honest_clipped": hc,
                        "honest_rejected": hr,
                    }
                    rows.append(row)
                    table.append(
                        f"| {p} | {d} | {x} | {t} | {row['accuracy']:.3f} | "
                        f"{drop['mean']:+.3f} [{drop['lo']:+.3f}, {drop['hi']:+.3f}] | "
                        f"{ab['mean']:+.3f} [{ab['lo']:+.3f}, {ab['hi']:+.3f}] | "
                        + (
                            f"{others['mean']:+.3f} [{others['lo']:+.3f}, {others['hi']:+.3f}] | "
                            if others
                            else "- | "
                        )
                        + f"{'-' if _reference(x) else 'yes' if ok else '**no**'} | "
                        f"{named} ({', '.join(named_t) or '-'}) | {hc} / {hr} |"
                    )
    table += [
        "",
        "Per defence (mean accuracy over seeds, per model; the minimum over the "
        'attacks is ByzFL\'s worst case; "not contained" counts (attack, model) rows):',
        "",
        "| preset | defence | model | honest | minimum over attacks | not contained "
        "| honest clients rejected |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in worst:
        mine = [
            r
            for r in rows
            if (r["preset"], r["defence"], r["model"]) == (w["preset"], w["defence"], w["model"])
            and not _reference(r["attack"])
        ]
        table.append(
            f"| {w['preset']} | {w['defence']} | {w['model']} | {w['honest']:.3f} | "
            f"{w['worst']:.3f} | {sum(not r['contained'] for r in mine)} of "
            f"{len(mine)} | {sum(r['honest_rejected'] for r in mine)} |"
        )
    targets, lines = target_lines(rows)
    table += lines
    print("\n".join(table))
    write_outputs(
        a.json,
        a.markdown,
        {
            "rows": rows,
            "worst": worst,
            "targets": targets,
            "seeds": seeds,
            "attacks": {x: FIELD.get(x) or REFERENCES[x] for x in attacks},
        },
        "\n".join(table),
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--field",
        action="store_true",
        help="run the attack families of the robust-FL benchmarks instead",
    )
    p.add_argument(
        "--defences",
        default="default,no-clip",
        help=f"--field: defence configurations ({', '.join(DEFENCES)})",
    )
    p.add_argument("--workers", type=int, default=2, help="--field: parallel runs")
    p.add_argument("--cache", default="", help="--field: JSONL file of finished runs (reused)")
    p.add_argument("--presets", default="")
    p.add_argument("--attacks", default="")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--num-rounds", type=int, default=10)
    p.add_argument("--json", default="")
    p.add_argument("--markdown", default="")
    a = p.parse_args(argv)
    if a.workers < 1:
        p.error("--workers must be >= 1")
    a.seed_list = int_list(p, "--seeds", a.seeds, low=0)
    given = {opt for opt in (argv if argv is not None else sys.argv[1:])}
    only = ["--defences", "--workers", "--cache"] if not a.field else ["--num-rounds"]
    used = [o for o in only if any(g == o or g.startswith(o + "=") for g in given)]
    if used:
        p.error(
            f"{used[0]} {'needs' if not a.field else 'does not apply to'} --field"
            + ("" if not a.field else " (its runs have 8 rounds)")
        )
    if a.field:
        return field(a, argv)
    a.presets = a.presets or "mfa-rr,lvr,ranklist-ucb,stalevre"
    a.attacks = a.attacks or ",".join(ATTACKS)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    from mmfl_flwr.presets import takes_aggregator

    seeds = a.seed_list
    rows = []
    for preset in a.presets.split(","):
        honest_runs = [_run(preset, None, s, a.num_rounds) for s in seeds]
        h = statistics.fmean(r[0] for r in honest_runs)
        honest_tried = sum(r[2] for r in honest_runs)
        print(f"{preset}: honest {h:.3f}, client {HOSTILE} trains {honest_tried} times", flush=True)
        for attack in a.attacks.split(","):
            variants = [("default", "")]
            if takes_aggregator(preset):
                variants.append(("median", "median"))
            for label, agg in variants:
                runs = [_run(preset, attack, s, a.num_rounds, agg) for s in seeds]
                base = (
                    h
                    if not agg
                    else statistics.fmean(
                        _run(preset, None, s, a.num_rounds, agg)[0] for s in seeds
                    )
                )
                acc = statistics.fmean(r[0] for r in runs)
                tried = sum(r[2] for r in runs)
                c = {k: sum(r[1][k] for r in runs) for k in ("rejected", "ignored", "bounded")}
                row = {
                    "preset": preset,
                    "attack": attack,
                    "aggregator": label,
                    "honest_trainings": honest_tried,
                    "hostile_trainings": tried,
                    **c,
                    "honest_accuracy": base,
                    "attack_accuracy": acc,
                    "cost": base - acc,
                }
                rows.append(row)
                print(
                    f"  {attack:19s} {label:8s} trainings {tried:3d} rejected {c['rejected']:3d} "
                    f"ignored {c['ignored']:3d} bounded {c['bounded']:3d} | honest {base:.3f} "
                    f"attack {acc:.3f} cost {base - acc:+.3f}",
                    flush=True,
                )
    table = [
        "| preset | attack | aggregator | trainings of id 3 (honest / attacked) | rejected "
        "| ignored | bounded | honest acc. | attacked acc. | cost |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        table.append(
            f"| {r['preset']} | {r['attack']} | {r['aggregator']} | "
            f"{r['honest_trainings']} / {r['hostile_trainings']} | {r['rejected']} | "
            f"{r['ignored']} | "
            f"{r['bounded']} | {r['honest_accuracy']:.3f} | {r['attack_accuracy']:.3f} | "
            f"{r['cost']:+.3f} |"
        )
    write_outputs(
        a.json,
        a.markdown,
        {"rows": rows, "seeds": seeds, "num_rounds": a.num_rounds},
        "\n".join(table),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
