"""How far honest clients get from the references of the hostile-client bounds.

For every preset, an honest run (in-process engine, built-in tasks) records the
largest ratio, over its rounds, of

- ``norm``: an update's L2 norm to the round's reference norm (the lower median
  of the round's update norms; with one update, of the recent accepted ones),
  which ``update-norm-factor`` (default 100) bounds;
- ``query``: a loss-query report to the task's loss reference (the largest 90th
  percentile of the reports so far), which ``loss-cap`` (default 10) bounds;
- ``train``: a training loss to the same reference (UCB presets);

so the defaults can be checked to leave honest federations alone:

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
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="uniform")
    p.add_argument("--presets", default="")
    p.add_argument("--num-clients", type=int, default=20)
    p.add_argument("--num-rounds", type=int, default=6)
    p.add_argument("--local-epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.ERROR)

    import numpy as np

    import mmfl_flwr.strategy.aggregate as ag
    import mmfl_flwr.strategy.loss_query as lq
    from mmfl_flwr import runner
    from mmfl_flwr.config import Settings
    from mmfl_flwr.presets import PRESETS
    from mmfl_flwr.strategy.validation import l2_norm

    stats: dict[str, float] = collections.defaultdict(float)
    original_cap, original_bound = lq.loss_cap, ag.bound_update_norms

    def recording_cap(tag):
        def cap(run, task, values, factor):
            out = original_cap(run, task, values, factor)
            ref = run.loss_reference.get(task, 0.0)
            if ref > 0 and values:
                stats[tag] = max(stats[tag], max(values) / ref)
            return out
        return cap

    def recording_bound(updates, history, factor, model_norm=None):
        for task, us in updates.items():
            norms = [l2_norm(u.delta) for u in us]
            pool = norms if len(norms) >= 2 else norms + history.get(task, [])
            if len(pool) >= 2:
                ref = float(np.percentile(pool, 50, method="lower"))
                if ref > 0 and norms:
                    stats["norm"] = max(stats["norm"], max(norms) / ref)
        return original_bound(updates, history, factor, model_norm)

    lq.loss_cap = recording_cap("query")
    ag.loss_cap = recording_cap("train")
    ag.bound_update_norms = recording_bound
    names = a.presets.split(",") if a.presets else list(PRESETS)
    print(f"profile {a.profile}, {a.num_clients} clients, {a.num_rounds} rounds, "
          f"{a.local_epochs} local epochs, seed {a.seed}")
    for name in names:
        stats.clear()
        kw = dict(strategy=name, profile=a.profile, num_rounds=a.num_rounds, output_dir="",
                  num_clients=a.num_clients, local_epochs=a.local_epochs, seed=a.seed)
        if name == "group" and a.profile == "uniform":
            kw["profile"] = "clusters-consistent"
        with contextlib.redirect_stdout(io.StringIO()):
            runner.run(Settings(**kw), engine="inprocess")
        print(f"  {name:14s} " + "  ".join(f"{k} {v:.2f}" for k, v in sorted(stats.items())),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
