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
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
import sys
from typing import Any


from _evidence import write_outputs

HOSTILE = "3"
ATTACKS = ("huge-weights", "scaled-x1000", "count-registration", "count-train", "lying-loss",
           "replay", "squat", "squat-pinned")
SQUATTER = "1"  # claims client 3's id; client 3 is late (its first info query fails)
SECRET = "client-3-secret"


class _Tap(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


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
        "squat-pinned": lambda: H.chain(H.impersonate(SQUATTER, HOSTILE), H.late_registration(HOSTILE),
                                        H.with_token(HOSTILE, SECRET)),
    }[name]()


def _run(preset: str, attack: str | None, seed: int, rounds: int, aggregator: str = ""):
    from mmfl_flwr.config import Settings
    from mmfl_flwr.runner import run_inprocess

    kw: dict[str, Any] = dict(strategy=preset, num_clients=10, num_rounds=rounds,
                              local_epochs=2, output_dir="", seed=seed, aggregator=aggregator)
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
            result = run_inprocess(Settings(**kw),
                                   wrap_client_app=_attack(attack) if attack else None)
    finally:
        logging.getLogger("flwr").removeHandler(tap)
    mine = [m for m in tap.lines if m.startswith(f"Client {HOSTILE}:")]
    refused = [m for m in tap.lines if f"client id {HOSTILE} " in m.lower() and "refused" in m]
    counts = {
        "rejected": sum("rejected" in m for m in mine) + len(refused),
        "ignored": sum("ignored" in m for m in mine),
        "bounded": sum(("clipped" in m) or ("capped" in m) or ("are used" in m) for m in mine),
    }
    trained = sum(1 for rnd, picks in result.assignments.items()
                  for cid, _, _ in picks if cid == HOSTILE)
    acc = statistics.fmean(r["accuracy"] for r in result.final().values())
    return acc, counts, trained


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="mfa-rr,lvr,ranklist-ucb,stalevre")
    p.add_argument("--attacks", default=",".join(ATTACKS))
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--num-rounds", type=int, default=10)
    p.add_argument("--json", default="")
    p.add_argument("--markdown", default="")
    a = p.parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    from mmfl_flwr.presets import takes_aggregator

    seeds = [int(s) for s in a.seeds.split(",")]
    rows = []
    for preset in a.presets.split(","):
        honest_runs = [_run(preset, None, s, a.num_rounds) for s in seeds]
        h = statistics.fmean(r[0] for r in honest_runs)
        honest_tried = sum(r[2] for r in honest_runs)
        print(f"{preset}: honest {h:.3f}, client {HOSTILE} trains {honest_tried} times",
              flush=True)
        for attack in a.attacks.split(","):
            variants = [("default", "")]
            if takes_aggregator(preset):
                variants.append(("median", "median"))
            for label, agg in variants:
                runs = [_run(preset, attack, s, a.num_rounds, agg) for s in seeds]
                base = h if not agg else statistics.fmean(
                    _run(preset, None, s, a.num_rounds, agg)[0] for s in seeds)
                acc = statistics.fmean(r[0] for r in runs)
                tried = sum(r[2] for r in runs)
                c = {k: sum(r[1][k] for r in runs) for k in ("rejected", "ignored", "bounded")}
                row = {"preset": preset, "attack": attack, "aggregator": label,
                       "honest_trainings": honest_tried, "hostile_trainings": tried, **c, "honest_accuracy": base,
                       "attack_accuracy": acc, "cost": base - acc}
                rows.append(row)
                print(f"  {attack:19s} {label:8s} trainings {tried:3d} rejected {c['rejected']:3d} "
                      f"ignored {c['ignored']:3d} bounded {c['bounded']:3d} | honest {base:.3f} "
                      f"attack {acc:.3f} cost {base - acc:+.3f}", flush=True)
    table = ["| preset | attack | aggregator | trainings of id 3 (honest / attacked) | rejected "
             "| ignored | bounded | honest acc. | attacked acc. | cost |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['preset']} | {r['attack']} | {r['aggregator']} | "
                     f"{r['honest_trainings']} / {r['hostile_trainings']} | {r['rejected']} | "
                     f"{r['ignored']} | "
                     f"{r['bounded']} | {r['honest_accuracy']:.3f} | {r['attack_accuracy']:.3f} | "
                     f"{r['cost']:+.3f} |")
    write_outputs(a.json, a.markdown, {"rows": rows, "seeds": seeds,
                                       "num_rounds": a.num_rounds}, "\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
