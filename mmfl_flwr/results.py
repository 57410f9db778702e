"""Run outputs: ``metrics.csv``, ``summary.json`` and ``accuracy.png``.

Data first (CSV/JSON), picture second (matplotlib, drawn from the CSV rows).
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmfl_flwr.config import Settings
from mmfl_flwr.strategy import MultiModelResult

#: Columns always present in metrics.csv, in this order; extra columns follow.
BASE_COLUMNS = [
    "round",
    "task",
    "accuracy",
    "loss",
    "uploads",
    "assigned",
    "rejected",
    "train_loss",
    "step_l1",
]


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    return v


def write_metrics_csv(history: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """One row per (round, task). Timing columns are left out so that the same
    seed gives a byte-identical file."""
    extra: list[str] = []
    for row in history:
        for k in row:
            if k not in BASE_COLUMNS and k not in extra and k != "seconds":
                extra.append(k)
    cols = BASE_COLUMNS + extra
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for row in history:
            w.writerow([_fmt(row.get(c, "")) for c in cols])


def write_assignments_csv(
    assignments: dict[int, list[tuple[str, str, int]]], path: str | os.PathLike[str]
) -> None:
    """Who trained what: one row per (round, client, task) pick, with its count."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", "client", "task", "count"])
        for rnd in sorted(assignments):
            for cid, task, count in assignments[rnd]:
                w.writerow([rnd, cid, task, count])


def read_metrics_csv(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read ``metrics.csv`` back (numbers as float/int, empty cells as NaN)."""
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = {}
            for k, v in raw.items():
                if k == "task":
                    row[k] = v
                elif v == "":
                    row[k] = math.nan
                else:
                    num = float(v)
                    row[k] = int(num) if k in ("round", "uploads", "assigned", "rejected") else num
            rows.append(row)
    return rows


def summarize(result: MultiModelResult, settings: Settings | None) -> dict[str, Any]:
    """Final accuracy per task, their mean, the configuration and the seed."""
    final = {}
    for task, row in result.final().items():
        final[task] = {
            "round": row["round"],
            "accuracy": None if math.isnan(row["accuracy"]) else row["accuracy"],
            "loss": None if math.isnan(row["loss"]) else row["loss"],
        }
    accs = [v["accuracy"] for v in final.values() if v["accuracy"] is not None]
    uploads = sum(int(r["uploads"]) for r in result.history)
    rounds = max((r["round"] for r in result.history), default=0)
    return {
        "final_accuracy": {t: v["accuracy"] for t, v in final.items()},
        "final_loss": {t: v["loss"] for t, v in final.items()},
        "mean_final_accuracy": sum(accs) / len(accs) if accs else None,
        "rounds": rounds,
        "total_uploads": uploads,
        "seed": settings.seed if settings is not None else None,
        "config": settings.to_run_config() if settings is not None else None,
    }


def plot_accuracy(history: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Accuracy of every task over rounds, plus their mean, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_task: dict[str, list[tuple[int, float]]] = {}
    for row in history:
        if not math.isnan(row["accuracy"]):
            by_task.setdefault(row["task"], []).append((row["round"], row["accuracy"]))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for task, pts in by_task.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=task)
    if by_task:
        rounds = sorted({r for pts in by_task.values() for r, _ in pts})
        mean = []
        for r in rounds:
            vals = [a for pts in by_task.values() for rr, a in pts if rr == r]
            mean.append(sum(vals) / len(vals))
        ax.plot(rounds, mean, "k--", linewidth=1.5, label="mean")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title("MMFL: accuracy per model")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(
    result: MultiModelResult, settings: Settings | None, output_dir: str | os.PathLike[str]
) -> Path:
    """Write the three output files into ``output_dir`` (created if needed)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_metrics_csv(result.history, out / "metrics.csv")
    with open(out / "summary.json", "w") as f:
        json.dump(summarize(result, settings), f, indent=2, sort_keys=True)
        f.write("\n")
    write_assignments_csv(result.assignments, out / "assignments.csv")
    plot_accuracy(result.history, out / "accuracy.png")
    return out


def write_cluster_step(cstep: dict[str, Any], output_dir: str | os.PathLike[str]) -> Path:
    """Record one MMFL-Group C-step: append its assignment to ``clusters.csv``
    (``round, client, cluster``) and draw ``clusters_round_<r>.png``, a 2-D PCA of
    the clients' loss vectors coloured by cluster (the paper's Fig. 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "clusters.csv"
    new = not csv_path.exists()
    with open(csv_path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["round", "client", "cluster"])
        for cid, g in zip(cstep["clients"], cstep["labels"]):
            w.writerow([cstep["round"], cid, g])
    x = np.asarray(cstep["features"], dtype=np.float64)
    labels = np.asarray(cstep["labels"])
    if x.shape[1] >= 2 and x.shape[0] >= 2:
        from sklearn.decomposition import PCA

        xy = PCA(n_components=2).fit_transform(x)
    elif x.shape[0] >= 1:
        xy = np.column_stack([x[:, 0], np.zeros(len(x))])
    else:
        xy = np.zeros((0, 2))
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for g in np.unique(labels):
        m = labels == g
        ax.scatter(xy[m, 0], xy[m, 1], s=18, label=f"group {g}")
    title = f"C-step at round {cstep['round']}: k = {cstep['k']}"
    if cstep.get("cluster_task"):
        title += f" (clustered on {cstep['cluster_task']})"
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel("PC 1 of the loss vectors")
    ax.set_ylabel("PC 2")
    ax.legend(fontsize="x-small", loc="best")
    fig.tight_layout()
    path = out / f"clusters_round_{cstep['round']}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
