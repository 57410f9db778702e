#!/usr/bin/env python
"""Client computation of one MMFL round: the per-client path against the vectorised one.

No Flower here (it runs where only torch, numpy and scikit-learn are installed, e.g. a
GPU machine): this times the work the clients do in a round of the paper-003 workload
(``--strategy lvr --profile paper003 --tasks digits,digits,digits --local-epochs 5
--batch-size 10000``):

* a loss query of every (client, model) pair (LVR's sampling signal);
* ``m = round(budget_fraction * V)`` local trainings (V = total processors), pairs
  drawn from the seed, 5 full-batch epochs each.

Per-client path: ``TorchTrainer.loss`` and ``TorchTrainer.train`` one client at a time
(what the in-process engine's ClientApp calls). Vectorised path:
``mmfl_flwr.client.vectorized.batched_losses`` and ``batched_train`` per model (what
``--engine vectorized`` calls). Both run on the same device (CUDA when available,
``--device`` overrides) from the same weights and seeds, and the script checks they
agree: the largest relative update gap ||Δ_vec - Δ_ref|| / ||Δ_ref|| and loss gap.

Usage::

    python benchmarks/bench_vectorized.py --num-clients 120 1000 --rounds 3 [--json out.json]

Prints seconds per round (mean over rounds after one warm-up round) for both paths and
the speed-up, per N.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    n: int,
    rounds: int,
    budget: float,
    epochs: int,
    lr: float,
    batch: int,
    seed: int,
    device: torch.device,
    chunk: int | None,
    wastes: list[float | None],
) -> list[dict]:
    from mmfl_flwr.client import vectorized as V
    from mmfl_flwr.client.trainer import TorchTrainer, initial_weights
    from mmfl_flwr.tasks.federation import build_federation
    from mmfl_flwr.tasks.models import make_model

    fed = build_federation(["digits", "digits", "digits"], n, seed, profile="paper003")
    pairs = [(c, t) for c in range(n) for t in fed.tasks if t in fed.client_tasks(c)]
    trainers = {}
    for c, t in pairs:
        train, test = fed.client_data(c, t)
        trainers[c, t] = TorchTrainer(lambda k=fed.kinds[t]: make_model(k), train, test, batch)
    weights = {
        t: initial_weights(lambda k=fed.kinds[t]: make_model(k), seed + i)
        for i, t in enumerate(fed.tasks)
    }
    models = {t: V.VectorModel(lambda k=fed.kinds[t]: make_model(k), device) for t in fed.tasks}
    m = max(1, round(budget * int(np.sum(fed.processors))))
    rng = np.random.default_rng(seed)
    times: dict = {"per-client": [], **{w: [] for w in wastes}}
    worst_update = worst_loss = 0.0
    for r in range(rounds + 1):
        picks = [pairs[i] for i in rng.choice(len(pairs), size=min(m, len(pairs)), replace=False)]
        seeds = {p: int(rng.integers(2**62)) for p in picks}
        # per-client path
        _sync(device)
        t0 = time.perf_counter()
        ref_loss = {p: trainers[p].loss(weights[p[1]]) for p in pairs}
        ref = {p: trainers[p].train(weights[p[1]], epochs, lr, seeds[p], batch) for p in picks}
        _sync(device)
        t1 = time.perf_counter()
        if r > 0:  # round 0 is the warm-up
            times["per-client"].append(t1 - t0)
        # vectorised path (once per padding allowance)
        for waste in wastes:
            _sync(device)
            t1 = time.perf_counter()
            vec_loss = {}
            vec = {}
            for t in fed.tasks:
                mine = [p for p in pairs if p[1] == t]
                data = [V.ClientData(*trainers[p].train_tensors()) for p in mine]
                vec_loss.update(zip(mine, V.batched_losses(models[t], weights[t], data)))
                chosen = [p for p in picks if p[1] == t]
                jobs = [
                    V.TrainJob(V.ClientData(*trainers[p].train_tensors()), seeds[p]) for p in chosen
                ]
                vec.update(
                    zip(
                        chosen,
                        V.batched_train(
                            models[t], weights[t], jobs, epochs, lr, batch, chunk=chunk, waste=waste
                        ),
                    )
                )
            _sync(device)
            t2 = time.perf_counter()
            if r > 0:
                times[waste].append(t2 - t1)
        for p in picks:
            w0 = weights[p[1]]
            keys = [k for k in w0 if w0[k].dtype.kind == "f"]
            d_ref = np.concatenate([(ref[p][0][k] - w0[k]).ravel() for k in keys])
            d_vec = np.concatenate([(vec[p][0][k] - w0[k]).ravel() for k in keys])
            gap = float(np.linalg.norm(d_vec - d_ref) / max(np.linalg.norm(d_ref), 1e-30))
            worst_update = max(worst_update, gap)
        for p in pairs:
            worst_loss = max(worst_loss, abs(vec_loss[p] - ref_loss[p]) / abs(ref_loss[p]))
        # next round starts from the mean of this round's updates (like FedAvg)
        for t in fed.tasks:
            done = [ref[p][0] for p in picks if p[1] == t]
            if done:
                weights[t] = {
                    k: np.mean([d[k] for d in done], axis=0).astype(weights[t][k].dtype)
                    for k in weights[t]
                }
    per = float(np.mean(times["per-client"]))
    out = []
    for waste in wastes:
        vec_s = float(np.mean(times[waste]))
        out.append(
            {
                "num_clients": n,
                "pairs": len(pairs),
                "trainings_per_round": m,
                "rounds": rounds,
                "waste": waste,
                "per_client_s_per_round": per,
                "vectorized_s_per_round": vec_s,
                "speedup": per / vec_s,
                "max_update_gap": worst_update,
                "max_loss_gap": worst_loss,
            }
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-clients", type=int, nargs="+", default=[120, 1000])
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up")
    p.add_argument("--budget-fraction", type=float, default=0.1)
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--chunk", type=int, default=None)
    p.add_argument(
        "--waste",
        default="",
        help="comma-separated padding allowances of the batched calls to "
        "compare (default: the device's default only)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument(
        "--tf32",
        action="store_true",
        help="allow TF32 convolutions and matmuls on the GPU (default: off, so "
        "both paths compute in float32 and their results can be compared)",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.device:
        import os

        os.environ["MMFL_DEVICE"] = args.device  # TorchTrainer's device too
    torch.backends.cudnn.allow_tf32 = bool(args.tf32)
    torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(
        f"device {device} ({name}); torch {torch.__version__}; "
        f"{torch.get_num_threads()} threads; TF32 {'on' if args.tf32 else 'off'}",
        flush=True,
    )
    wastes = [float(w) for w in args.waste.split(",") if w.strip()] or [None]
    rows = []
    for n in args.num_clients:
        for row in measure(
            n,
            args.rounds,
            args.budget_fraction,
            args.local_epochs,
            args.lr,
            args.batch_size,
            args.seed,
            device,
            args.chunk,
            wastes,
        ):
            rows.append(row)
            label = "" if row["waste"] is None else f" waste {row['waste']:g}"
            print(
                f"N={n:5d} ({row['pairs']} pairs, {row['trainings_per_round']} "
                f"trainings/round){label}: per-client {row['per_client_s_per_round']:.3f} "
                f"s/round, vectorized {row['vectorized_s_per_round']:.3f} s/round, "
                f"speed-up {row['speedup']:.1f}x; max update gap "
                f"{row['max_update_gap']:.1e}, loss gap {row['max_loss_gap']:.1e}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": str(device),
                    "name": name,
                    "torch": torch.__version__,
                    "threads": torch.get_num_threads(),
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
