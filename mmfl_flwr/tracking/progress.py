"""Live progress of a run: a progress bar on a terminal, one line per round elsewhere.

On a terminal (``sys.stdout.isatty()``) and without ``--no-progress``
(``no-progress``), a ``rich`` progress bar: rounds done of the run's rounds,
elapsed and remaining time, the last round's mean accuracy over the models.
Otherwise (a file, a pipe, CI logs, or ``--no-progress``) one line per round,
as before: ``[mmfl] round   3/20 | acc digits=0.812 ... | uploads 12 | clipped 0,
rejected 0 | elapsed 4.1s``. Both show the round's defence events counted by
kind (``clipped`` and ``rejected`` always, any other kind that acted) where the
caller passes ``defence(round) -> {kind: count}``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

RoundCallback = Callable[[int, list[dict[str, Any]]], None]
#: ``defence(round) -> {kind: count}``: a round's defence events counted by kind
DefenceCounts = Callable[[int], Mapping[str, int]]


def _defence(defence: DefenceCounts | None, rnd: int) -> str:
    if defence is None or rnd < 1:
        return ""
    from mmfl_flwr.strategy.events import progress_text

    return progress_text(defence(rnd))


def line_printer(num_rounds: int, defence: DefenceCounts | None = None) -> RoundCallback:
    """A per-round progress line on stdout (with ``defence``, the round's
    defence events counted by kind)."""
    t0 = time.monotonic()

    def show(rnd: int, rows: list[dict[str, Any]]) -> None:
        accs = " ".join(f"{r['task']}={r['accuracy']:.3f}" for r in rows)
        ups = sum(int(r["uploads"]) for r in rows)
        acted = _defence(defence, rnd)
        print(
            f"[mmfl] round {rnd:>3}/{num_rounds} | acc {accs} | uploads {ups} | "
            f"{acted + ' | ' if acted else ''}elapsed {time.monotonic() - t0:6.1f}s",
            flush=True,
        )

    return show


class ProgressBar:
    """A ``rich`` progress bar over the run's rounds (a round callback with
    :meth:`close`)."""

    def __init__(
        self, num_rounds: int, start_round: int = 0, defence: DefenceCounts | None = None
    ) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("[mmfl] round", markup=False),
            MofNCompleteColumn(),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[acc]}"),
            TextColumn("{task.fields[defence]}"),
            console=Console(file=sys.stdout),
            transient=False,
        )
        self.task = self.progress.add_task(
            "rounds", total=max(num_rounds, 1), completed=start_round, acc="", defence=""
        )
        self.defence = defence
        self.progress.start()

    def __call__(self, rnd: int, rows: list[dict[str, Any]]) -> None:
        accs = [
            float(r["accuracy"]) for r in rows if not math.isnan(float(r.get("accuracy", math.nan)))
        ]
        acc = f"mean acc {sum(accs) / len(accs):.3f}" if accs else ""
        self.progress.update(self.task, completed=rnd, acc=acc, defence=_defence(self.defence, rnd))

    def close(self) -> None:
        self.progress.stop()


def use_bar(no_progress: bool = False) -> bool:
    """Whether to draw the bar: stdout is a terminal and ``no_progress`` is off."""
    isatty = getattr(sys.stdout, "isatty", None)
    return not no_progress and bool(isatty and isatty())


def make_progress(
    num_rounds: int, start_round: int = 0, no_progress: bool = False
) -> tuple[RoundCallback, Callable[[], None]]:
    """The round callback that shows progress, and what ends it."""
    if use_bar(no_progress):
        try:
            bar = ProgressBar(num_rounds, start_round)
        except ImportError:  # rich comes with flwr; if not, the lines
            pass
        else:
            return bar, bar.close
    return line_printer(num_rounds), lambda: None
