"""Run outputs: ``metrics.csv``, ``summary.json`` and ``accuracy.png``.

The CSV files (``metrics.csv``, ``assignments.csv``, ``events.csv``) are
written and read by :mod:`mmfl_flwr.run_csv`; their functions are re-exported here.

Data first (CSV/JSON), picture second (matplotlib, drawn from the CSV rows).
The figures are drawn with matplotlib's object-oriented API on their own Agg
canvas: no global backend is set, no display is needed.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import math
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmfl_flwr.config import Settings
from mmfl_flwr.run_csv import BASE_COLUMNS as BASE_COLUMNS
from mmfl_flwr.run_csv import COLUMN_DOCS as COLUMN_DOCS
from mmfl_flwr.run_csv import read_events_csv as read_events_csv
from mmfl_flwr.run_csv import read_metrics_csv as read_metrics_csv
from mmfl_flwr.run_csv import (
    write_assignments_csv,
    write_events_csv,
    write_metrics_csv,
)
from mmfl_flwr.strategy import MultiModelResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _dist_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (None if not installed)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit(package_dir: Path) -> str | None:
    """The commit checked out in the git repository that ``package_dir`` (the
    ``mmfl_flwr`` folder) is tracked in, or None: not a git checkout (e.g.
    installed into site-packages, even inside a repository's virtualenv), git
    missing, a timeout, or any other failure."""
    try:
        tracked = subprocess.run(
            ["git", "ls-files", "--error-unmatch", "--", f"{package_dir.name}/__init__.py"],
            cwd=package_dir.parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        if tracked.returncode != 0:
            return None
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=package_dir.parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    commit = head.stdout.strip()
    return commit if head.returncode == 0 and commit else None


def run_versions() -> dict[str, str | None]:
    """Versions of the software that produced a run (``summary.json``'s
    ``versions``): ``mmfl-flwr``, ``flwr``, ``torch``, ``numpy`` (installed
    distributions, None where absent; nothing is imported), ``python`` and
    ``git_commit`` (the checked-out commit when ``mmfl_flwr`` is imported from a
    git checkout, else None)."""
    import mmfl_flwr

    own = _dist_version("mmfl-flwr")
    if own is None:
        own = getattr(mmfl_flwr, "__version__", None)
    return {
        "mmfl-flwr": own,
        "flwr": _dist_version("flwr"),
        "torch": _dist_version("torch"),
        "numpy": _dist_version("numpy"),
        "python": platform.python_version(),
        "git_commit": _git_commit(Path(mmfl_flwr.__file__).resolve().parent),
    }


def summarize(
    result: MultiModelResult,
    settings: Settings | None,
    effective: Mapping[str, Any] | None = None,
    engine: str | None = None,
) -> dict[str, Any]:
    """Final accuracy per task, their mean, the configuration (``config``: the
    settings as typed; ``effective``: the values used for the automatic ones),
    the seed and the software versions (:func:`run_versions`). With a ``target_accuracy``
    setting also ``target_accuracy`` (model -> target), ``rounds_to_target``
    (model -> the first round ``r >= 1`` whose server-side accuracy is ``>=``
    its target, None if never) and ``rounds_to_target_all`` (the largest of
    them, None if some model never reaches its target):
    :mod:`mmfl_flwr.convergence`. A run under a differential-privacy wrapper
    adds ``privacy``: per model ``epsilon`` (None without noise) at ``delta``,
    ``releases``, ``noise_multiplier`` and ``clipping_norm``. ``defence_events``
    counts the run's defence events (``events.csv``) in all, per kind, per
    model and per client, each with the updates received and the fraction
    (:func:`~mmfl_flwr.strategy.events.summary_counts`)."""
    from mmfl_flwr.strategy.events import summary_counts

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
    targets = settings.target_accuracies() if settings is not None else {}
    reached: dict[str, Any] = {}
    if targets:
        from mmfl_flwr.convergence import (
            accuracy_curves,
            rounds_to_target,
            rounds_to_target_all,
        )

        per_model = rounds_to_target(accuracy_curves(result.history), targets)
        reached = {
            "target_accuracy": targets,
            "rounds_to_target": per_model,
            "rounds_to_target_all": rounds_to_target_all(per_model),
        }
    privacy = {}
    if result.privacy:  # a run under mmfl_flwr.privacy: epsilon per model (None: no noise)
        privacy = {
            "privacy": {
                t: {
                    k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in p.items()
                }
                for t, p in result.privacy.items()
            }
        }
    return {
        **reached,
        **privacy,
        "final_accuracy": {t: v["accuracy"] for t, v in final.items()},
        "final_loss": {t: v["loss"] for t, v in final.items()},
        "mean_final_accuracy": sum(accs) / len(accs) if accs else None,
        "rounds": rounds,
        "total_uploads": uploads,
        "defence_events": summary_counts(result.events, result.received),
        "seed": settings.seed if settings is not None else None,
        "config": settings.to_run_config() if settings is not None else None,
        "effective": dict(effective or {}),
        "engine": engine,
        "versions": run_versions(),
    }


def new_figure(figsize: tuple[float, float], **kwargs: Any) -> Figure:
    """A matplotlib Figure on its own Agg canvas: no pyplot, no global backend,
    no display needed (safe in servers, threads and notebooks alike)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, **kwargs)
    FigureCanvasAgg(fig)
    return fig


def run_title(
    settings: Settings | None,
    strategy_name: str | None = None,
    effective: Mapping[str, Any] | None = None,
) -> str:
    """The title of a run's plot: strategy and seed, then the key settings
    (clients, rounds, local epochs, and the budget fraction and clients per
    round where the strategy takes them). ``effective`` (run-config key -> value,
    :func:`~mmfl_flwr.flower_app.data.effective_settings`) gives the values the
    run used for the settings left automatic, marked "(auto)"."""
    name = strategy_name or (settings.strategy if settings is not None else None)
    head = f"MMFL {name}" if name else "MMFL run"
    if settings is None:
        return head
    head += f", seed {settings.seed}"
    if settings.aggregator:
        head += f", aggregator {settings.aggregator}"
    effective = effective or {}

    def count(n: int, what: str) -> str:
        return f"{n} {what}{'s' if n != 1 else ''}"

    parts = [
        count(settings.num_clients, "client"),
        count(settings.num_rounds, "round"),
        count(settings.local_epochs, "local epoch"),
    ]
    used: list[str] = []
    if strategy_name is None:  # a custom strategy takes what it takes
        from mmfl_flwr.presets import PRESETS, preset_settings

        if settings.strategy in PRESETS:
            used = preset_settings(settings.strategy, ["budget_fraction", "clients_per_round"])
    if "budget_fraction" in used:
        auto = effective.get("budget-fraction")
        if isinstance(auto, (int, float)) and not settings.budget_fraction:
            parts.append(f"budget fraction {auto:g} (auto)")
        else:
            parts.append(f"budget fraction {settings.budget_fraction:g}")
    if "clients_per_round" in used:
        auto = effective.get("clients-per-round")
        if settings.clients_per_round > 0:
            parts.append(f"{settings.clients_per_round} clients/round")
        elif isinstance(auto, (int, float)):
            parts.append(f"{auto:g} clients/round (auto)")
        elif auto:
            parts.append(f"clients/round: {auto}")
    return head + "\n" + ", ".join(parts)


def style_panels(ax_acc: Any, ax_loss: Any, acc_label: str, loss_label: str) -> None:
    """Labels, limits and grid of an accuracy panel above a loss panel over rounds."""
    from matplotlib.ticker import MaxNLocator

    ax_acc.set_ylabel(acc_label)
    ax_acc.set_ylim(0, 1)
    ax_loss.set_ylabel(loss_label)
    ax_loss.set_xlabel("round")
    ax_loss.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)


def accuracy_figure(
    history: Sequence[dict[str, Any]],
    settings: Settings | None = None,
    strategy_name: str | None = None,
    effective: Mapping[str, Any] | None = None,
) -> Figure:
    """The figure of ``accuracy.png``: test accuracy of every model and their
    mean (top), test loss of every model (bottom), over rounds; the title from
    :func:`run_title`; the legend right of the panels, outside the data."""
    models: list[str] = []
    for row in history:
        if row["task"] not in models:
            models.append(row["task"])

    def series(task: str, key: str) -> tuple[list[int], list[float]]:
        pts = [
            (int(r["round"]), float(r[key]))
            for r in history
            if r["task"] == task and not math.isnan(float(r.get(key, math.nan)))
        ]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig = new_figure((8.5, 6.4), layout="constrained")
    ax_acc, ax_loss = fig.subplots(2, 1, sharex=True)
    by_round: dict[int, list[float]] = {}
    for i, task in enumerate(models):
        color = f"C{i % 10}"
        xs, ys = series(task, "accuracy")
        if xs:
            ax_acc.plot(xs, ys, marker=".", color=color, label=task)
        for x, y in zip(xs, ys):
            by_round.setdefault(x, []).append(y)
        xs, ys = series(task, "loss")
        if xs:
            ax_loss.plot(xs, ys, marker=".", color=color, label=task)
    if by_round:
        rounds = sorted(by_round)
        mean = [sum(by_round[r]) / len(by_round[r]) for r in rounds]
        ax_acc.plot(rounds, mean, "k--", linewidth=1.5, label="mean of models")

    style_panels(ax_acc, ax_loss, "test accuracy", "test loss")
    handles, labels = ax_acc.get_legend_handles_labels()
    if not handles:  # no accuracy (no server-side evaluation): the loss lines
        handles, labels = ax_loss.get_legend_handles_labels()
    if handles:
        # "outside": constrained layout keeps the legend right of both panels
        fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    fig.suptitle(run_title(settings, strategy_name, effective), fontsize="medium")
    return fig


def plot_accuracy(
    history: Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    settings: Settings | None = None,
    strategy_name: str | None = None,
    effective: Mapping[str, Any] | None = None,
) -> Figure:
    """Write :func:`accuracy_figure` as a PNG to ``path``; returns the figure."""
    fig = accuracy_figure(history, settings, strategy_name, effective)
    fig.savefig(path, dpi=110)
    return fig


#: Up to this many clients, the who-trained-what figure and the cluster plots
#: name every client; above it they summarise.
MAX_CLIENTS_DRAWN = 60


def _model_colors(models: Sequence[str]) -> dict[str, str]:
    return {m: f"C{i % 10}" for i, m in enumerate(models)}


def assignments_figure(
    assignments: dict[int, list[tuple[str, str, int]]],
    rejections: dict[int, list[tuple[str, str]]] | None = None,
    models: Sequence[str] | None = None,
    max_clients: int = MAX_CLIENTS_DRAWN,
    num_clients: int | None = None,
) -> Figure:
    """The figure of ``assignments.png``: who trained what. Up to ``max_clients``
    clients, one row per client and one column per round, a square per model the
    client trained (coloured by model), crossed out where that part was rejected
    or went missing; with more clients, per round the parts each model was
    trained on (stacked bars) and the rejected parts. ``num_clients`` (the
    run's clients) counts the clients that never trained too: the title says
    how many, and where the clients are ``0`` to ``num_clients - 1`` (the ids
    of ``mmfl run``'s federations) they are drawn as empty rows."""
    from matplotlib.lines import Line2D

    from mmfl_flwr.core.clients import client_sort_key

    rejections = rejections or {}
    rounds = sorted(r for r in assignments if r >= 1)
    models = list(models) if models else sorted({t for r in rounds for _, t, _ in assignments[r]})
    colors = _model_colors(models)
    clients = sorted({c for r in rounds for c, _, _ in assignments[r]}, key=client_sort_key)
    trained = len(clients)
    total = max(num_clients or 0, trained)
    ids = [str(c) for c in range(total)]
    if total > trained and set(clients) <= set(ids):  # the never-trained as empty rows
        clients = ids
    idle = f" ({total - trained} never trained)" if total > trained else ""
    handles = [Line2D([], [], marker="s", linestyle="", color=colors[m], label=m) for m in models]
    if len(clients) <= max_clients:
        height = min(12.0, 2.0 + 0.22 * max(len(clients), 1))
        fig = new_figure((max(7.2, 1.2 + 0.18 * max(len(rounds), 1)), height), layout="constrained")
        ax = fig.add_subplot()
        row = {c: i for i, c in enumerate(clients)}
        for r in rounds:
            cells: dict[str, list[str]] = {}
            for c, t, _ in assignments[r]:
                cells.setdefault(c, []).append(t)
            bad = set(map(tuple, rejections.get(r, [])))
            for c, tasks in cells.items():
                tasks = sorted(set(tasks), key=lambda t: models.index(t) if t in models else 0)
                width = 0.8 / len(tasks)
                for j, t in enumerate(tasks):
                    x = r - 0.4 + width * (j + 0.5)
                    ax.scatter(
                        [x],
                        [row[c]],
                        marker="s",
                        s=30 * width / 0.8 + 6,
                        color=colors.get(t, "0.5"),
                    )
                    if (c, t) in bad:
                        ax.scatter([x], [row[c]], marker="x", s=40, color="black", linewidths=1.0)
        ax.set_yticks(range(len(clients)))
        ax.set_yticklabels(clients, fontsize="x-small")
        ax.set_ylim(-0.7, len(clients) - 0.3)
        ax.invert_yaxis()
        ax.set_ylabel("client")
        handles.append(
            Line2D([], [], marker="x", linestyle="", color="black", label="rejected / missing")
        )
        title = f"Who trained what: {total} clients x {len(rounds)} rounds{idle}"
    else:
        import numpy as np

        fig = new_figure((8.0, 4.5), layout="constrained")
        ax = fig.add_subplot()
        bottom = np.zeros(len(rounds))
        for m in models:
            counts = np.array(
                [sum(n for _, t, n in assignments[r] if t == m) for r in rounds], dtype=float
            )
            ax.bar(rounds, counts, bottom=bottom, color=colors[m], width=0.8)
            bottom += counts
        lost = [len(rejections.get(r, [])) for r in rounds]
        ax.plot(rounds, lost, color="black", marker="x", linestyle="-", linewidth=1.0)
        ax.set_ylabel("parts trained per round (processors)")
        handles.append(Line2D([], [], marker="x", color="black", label="rejected / missing"))
        title = (
            f"Who trained what, per round ({total} clients{idle}: more than "
            f"{max_clients}, so summed per model)"
        )
    ax.set_xlabel("round")
    if rounds:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.2)
    fig.legend(handles=handles, loc="outside right upper", fontsize="small", title="model")
    fig.suptitle(title, fontsize="medium")
    return fig


def training_figure(history: Sequence[dict[str, Any]]) -> Figure:
    """The figure of ``training.png``: per round and model, the updates
    aggregated (uploads), the parts rejected or missing (left out, and the
    title says so, when the run rejected nothing), and the trainers'
    sample-weighted training loss."""
    import math as _math

    rows = [r for r in history if int(r["round"]) >= 1]
    models: list[str] = []
    for r in history:
        if r["task"] not in models:
            models.append(r["task"])
    colors = _model_colors(models)
    # nothing rejected or missing in the whole run: no all-zero panel, the title says so
    any_rejected = any(float(r.get("rejected", 0) or 0) for r in rows)
    panels: tuple[tuple[str, str], ...] = (
        ("uploads", "updates aggregated"),
        ("rejected", "parts rejected\nor missing"),
        ("train_loss", "training loss\n(sample-weighted)"),
    )
    if not any_rejected:
        panels = (panels[0], panels[2])
    fig = new_figure((8.0, 7.5 if any_rejected else 5.5), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True)
    for ax, (key, label) in zip(axes, panels):
        for m in models:
            pts = [
                (int(r["round"]), float(r[key]))
                for r in rows
                if r["task"] == m and key in r and not _math.isnan(float(r[key]))
            ]
            if pts:
                ax.plot(
                    [p[0] for p in pts], [p[1] for p in pts], marker=".", color=colors[m], label=m
                )
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if key in ("uploads", "rejected"):  # counts: integer ticks only
            from matplotlib.ticker import MaxNLocator

            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    from matplotlib.ticker import MaxNLocator

    axes[-1].set_xlabel("round")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small", title="model")
    fig.suptitle(
        "Uploads, rejections and training loss per round"
        if any_rejected
        else "Uploads and training loss per round (none rejected or missing)",
        fontsize="medium",
    )
    return fig


def write_outputs(
    result: MultiModelResult,
    settings: Settings | None,
    output_dir: str | os.PathLike[str],
    strategy_name: str | None = None,
    effective: Mapping[str, Any] | None = None,
    engine: str | None = None,
) -> Path:
    """Write ``metrics.csv``, ``summary.json``, ``assignments.csv``, ``events.csv``,
    ``accuracy.png``, ``assignments.png`` (:func:`assignments_figure`) and
    ``training.png`` (:func:`training_figure`) into ``output_dir`` (created if
    needed). ``strategy_name``
    names the strategy in the plot title where it is not the preset that
    ``settings`` name (a custom strategy); ``effective``, the values used for
    the automatic settings, goes to ``summary.json`` and the title, as does
    ``engine`` (the engine that ran it; None when unknown) to ``summary.json``."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_metrics_csv(result.history, out / "metrics.csv")
    with open(out / "summary.json", "w") as f:
        json.dump(summarize(result, settings, effective, engine), f, indent=2, sort_keys=True)
        f.write("\n")
    write_assignments_csv(result.assignments, out / "assignments.csv")
    write_events_csv(result.events, out / "events.csv")
    plot_accuracy(result.history, out / "accuracy.png", settings, strategy_name, effective)
    models = list(dict.fromkeys(r["task"] for r in result.history))
    assignments_figure(
        result.assignments,
        result.rejections,
        models,
        num_clients=settings.num_clients if settings is not None else None,
    ).savefig(out / "assignments.png", dpi=100)
    training_figure(result.history).savefig(out / "training.png", dpi=100)
    return out


def write_cluster_step(cstep: dict[str, Any], output_dir: str | os.PathLike[str]) -> Path:
    """Record one MMFL-Group C-step: append its assignment to ``clusters.csv``
    (``round, client, cluster``) and draw ``clusters_round_<r>.png``, a 2-D PCA of
    the clients' loss vectors coloured by cluster (the paper's Fig. 3)."""
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
    fig = new_figure((5.5, 4.5))
    ax = fig.add_subplot()
    for g in np.unique(labels):
        m = labels == g
        ax.scatter(xy[m, 0], xy[m, 1], s=18, label=f"group {g}")
    if len(xy) <= MAX_CLIENTS_DRAWN:  # which client is which point
        for cid, (px, py) in zip(cstep["clients"], xy):
            ax.annotate(
                str(cid),
                (px, py),
                xytext=(3, 3),
                textcoords="offset points",
                fontsize="xx-small",
                alpha=0.8,
            )
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
    return path
