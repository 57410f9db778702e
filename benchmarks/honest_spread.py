"""How far honest clients get from the references of the hostile-client bounds.

For every preset, an honest run (in-process engine, built-in tasks) records the
largest ratio, over its rounds, of

- ``norm``: an update's L2 norm to the reference norm its bound uses (the lower
  median of the round's update norms; with one update, of the recent accepted
  ones; a model's first lone update, the model's own norm), which
  ``update-norm-factor`` (default 100) bounds;
- ``query``: a loss-query report to the task's loss reference (the largest 90th
  percentile of the reports so far), which ``loss-cap`` (default 10) bounds;
- ``train``: a training loss to the same reference (UCB presets);
- ``influence``: an update's influence (its weight in the aggregate times its
  norm) to the round's lower median influence, which ``influence-clip-factor``
  bounds by scaling down (an honest client above it is trimmed): measured only
  with ``--influence-clip-factor`` (the bound is off by default);
- ``expected``: under the oracle StaleVR, an update's influence on the expected
  step (its data share times its norm) to the round's lower median, which the
  same factor bounds (measured with ``--influence-clip-factor`` too);

read through the bounds' own hook (``mmfl_flwr.strategy.validation.BOUND_OBSERVERS``:
the references are the ones the server uses, nothing is patched), so the defaults
can be checked to leave honest federations alone:

    python benchmarks/hostile_clients.py ...        # what the bounds stop
    python benchmarks/honest_spread.py --profile paper003 --num-clients 30 \\
        --num-rounds 12 --local-epochs 5            # what honest clients reach
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--profile", default="uniform")
    p.add_argument("--presets", default="")
    p.add_argument("--num-clients", type=int, default=20)
    p.add_argument("--num-rounds", type=int, default=6)
    p.add_argument("--local-epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--influence-clip-factor",
        type=float,
        default=0.0,
        help="run with the influence bound at this factor (0: off, the default), "
        "so that ``influence`` is measured",
    )
    a = p.parse_args(argv)
    if a.influence_clip_factor != 0 and not a.influence_clip_factor >= 1:
        p.error(f"--influence-clip-factor must be 0 (off) or >= 1; got {a.influence_clip_factor}")
    logging.getLogger("flwr").setLevel(logging.ERROR)

    from mmfl_flwr import runner
    from mmfl_flwr.config import Settings
    from mmfl_flwr.presets import PRESETS
    from mmfl_flwr.strategy.validation import BOUND_OBSERVERS

    stats: dict[str, float] = collections.defaultdict(float)
    short = {
        "update-norm": "norm",
        "query-loss": "query",
        "train-loss": "train",
        "influence": "influence",
        "expected-influence": "expected",
    }

    def record(kind: str, task: str, values: list[float], reference: float) -> None:
        if kind == "direction":  # the lowest honest mean cosine, and how far below the median
            if values:
                stats["dir-low"] = min(stats.get("dir-low", 1.0), min(values))
                stats["dir-gap"] = max(stats["dir-gap"], reference - min(values))
            return
        # the largest ratio of an honest report to the reference its bound uses
        if reference > 0 and values:
            stats[short[kind]] = max(stats[short[kind]], max(values) / reference)

    BOUND_OBSERVERS.append(record)
    names = a.presets.split(",") if a.presets else list(PRESETS)
    print(
        f"profile {a.profile}, {a.num_clients} clients, {a.num_rounds} rounds, "
        f"{a.local_epochs} local epochs, seed {a.seed}"
    )
    for name in names:
        stats.clear()
        kw = dict(
            strategy=name,
            profile=a.profile,
            num_rounds=a.num_rounds,
            output_dir="",
            num_clients=a.num_clients,
            local_epochs=a.local_epochs,
            seed=a.seed,
            influence_clip_factor=a.influence_clip_factor,
        )
        if name == "group" and a.profile == "uniform":
            kw["profile"] = "clusters-consistent"
        with contextlib.redirect_stdout(io.StringIO()):
            runner.run(Settings(**kw), engine="inprocess")
        print(
            f"  {name:14s} " + "  ".join(f"{k} {v:.2f}" for k, v in sorted(stats.items())),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
