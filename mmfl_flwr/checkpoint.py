"""Strategy checkpoints: written atomically each round, read back to resume.

A checkpoint is one pickle file holding plain data and numpy arrays: the global
weights of every model, the policy's and the aggregator's state (stale updates,
betas, control variates), the client table, the RNG states, the last finished
round, the history and the assignments. It is written to ``<path>.tmp``, flushed
to disk, then renamed over ``<path>`` (``os.replace``), so a crash mid-write
leaves the previous checkpoint intact. Only load checkpoints you wrote yourself:
pickle files can run code when loaded.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

CHECKPOINT_FILE = "checkpoint.pkl"
FORMAT_VERSION = 1


def checkpoint_file(path: str | os.PathLike[str]) -> Path:
    """A checkpoint file path: ``path`` itself, or ``path/checkpoint.pkl`` for a
    folder."""
    p = Path(path)
    return p / CHECKPOINT_FILE if p.is_dir() or p.suffix != ".pkl" else p


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Write ``state`` atomically (write-then-rename); returns the file path."""
    target = checkpoint_file(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump({"format": FORMAT_VERSION, **state}, f, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Raises
    ------
    FileNotFoundError
        There is no checkpoint file at ``path``.
    ValueError
        The file cannot be unpickled (truncated, empty, not a checkpoint) or has
        another format version; the message is one line.
    """
    target = checkpoint_file(path)
    if not target.exists():
        raise FileNotFoundError(f"no checkpoint at {target}")
    try:
        with open(target, "rb") as f:
            state = pickle.load(f)  # noqa: S301 - our own file, see module docstring
    except Exception as err:  # unpickling garbage raises almost any exception type
        reason = " ".join(str(err).split()) or type(err).__name__
        raise ValueError(f"checkpoint {target} is unreadable/corrupt: {reason}") from err
    if not isinstance(state, dict):
        raise ValueError(
            f"checkpoint {target} is unreadable/corrupt: it holds a "
            f"{type(state).__name__}, not a checkpoint"
        )
    if state.get("format") != FORMAT_VERSION:
        raise ValueError(
            f"{target}: checkpoint format {state.get('format')!r} is not supported "
            f"(expected {FORMAT_VERSION})"
        )
    return state
