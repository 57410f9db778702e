"""LEAF's Shakespeare: the 80-character vocabulary and the per-user loader
(:func:`load_leaf_shakespeare`), whose inputs are token ids
(:class:`TokenDataset`). Importable from :mod:`mmfl_flwr.tasks.datasets`.

numpy and the standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.files import DatasetNotFound, PathLike, _check_split


@dataclass
class TokenDataset(Dataset):
    """A :class:`~mmfl_flwr.tasks.data.Dataset` whose inputs are integer token ids.

    ``x`` is int64 (e.g. ``(n, 80)`` character indices) instead of float32; ``y`` is
    int64. :meth:`subset` keeps the type.
    """

    def __post_init__(self) -> None:
        self.x = np.asarray(self.x, dtype=np.int64)
        self.y = np.asarray(self.y, dtype=np.int64)
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x has {self.x.shape[0]} examples but y has {self.y.shape[0]}")

    def subset(self, indices: np.ndarray) -> TokenDataset:
        """Return the examples at ``indices`` (a copy), still a :class:`TokenDataset`."""
        idx = np.asarray(indices, dtype=np.int64)
        return TokenDataset(self.x[idx], self.y[idx])


#: LEAF's 80-character Shakespeare vocabulary, in LEAF's order (the index of a
#: character is its class): newline, space, the punctuation ``!"&'(),-.``, the
#: digits, ``:;>?``, the upper-case letters, ``[]``, the lower-case letters and ``}``.
#: (LEAF's ``models/utils/language_utils.py`` maps a character to its position in
#: this string.)
LEAF_SHAKESPEARE_VOCAB = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
assert len(LEAF_SHAKESPEARE_VOCAB) == 80 and len(set(LEAF_SHAKESPEARE_VOCAB)) == 80

_VOCAB_CODES = np.array([ord(c) for c in LEAF_SHAKESPEARE_VOCAB], dtype=np.int64)
_VOCAB_ORDER = np.argsort(_VOCAB_CODES)
_VOCAB_SORTED = _VOCAB_CODES[_VOCAB_ORDER]

_LEAF_HOWTO = (
    "generate it with LEAF's preprocessing: git clone https://github.com/TalwalkarLab/leaf; "
    "cd leaf/data/shakespeare; ./preprocess.sh -s niid --sf 1.0 -k 0 -t sample -tf 0.8 "
    "(needs a network to fetch the text); then pass root='<leaf>/data' (the loader reads "
    "'<root>/shakespeare/data/{train,test}/*.json'). There is no automatic download."
)


def encode_chars(text: str, unknown: str | None = " ") -> np.ndarray:
    """Map every character of ``text`` to its index in :data:`LEAF_SHAKESPEARE_VOCAB`.

    Parameters
    ----------
    text : str
        Characters to encode.
    unknown : str or None, default " "
        Character that replaces characters outside the vocabulary (LEAF itself would
        produce -1, which no embedding can take); ``None`` raises ``ValueError``.

    Returns
    -------
    np.ndarray
        int64 indices, one per character.
    """
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)
    pos = np.clip(np.searchsorted(_VOCAB_SORTED, codes), 0, _VOCAB_SORTED.shape[0] - 1)
    known = _VOCAB_SORTED[pos] == codes
    out = _VOCAB_ORDER[pos]
    if not known.all():
        if unknown is None:
            bad = sorted({chr(c) for c in codes[~known]})
            raise ValueError(f"characters outside LEAF's vocabulary: {bad!r}")
        out = np.where(known, out, LEAF_SHAKESPEARE_VOCAB.index(unknown))
    return out.astype(np.int64)


def load_leaf_shakespeare(
    root: PathLike,
    split: str = "train",
    download: bool = False,
    unknown: str | None = " ",
) -> tuple[dict[str, TokenDataset], int]:
    """Load LEAF's Shakespeare next-character data, one dataset per user.

    Reads every ``*.json`` file in ``<root>/shakespeare/data/<split>`` (or
    ``<root>/data/<split>`` or ``<root>/<split>``), LEAF's format::

        {"users": [...], "num_samples": [...],
         "user_data": {user: {"x": [80-character strings], "y": [next characters]}}}

    A user present in several files gets its samples concatenated (files in sorted
    order).

    Parameters
    ----------
    root : str or os.PathLike
        Data root (LEAF's ``data`` folder).
    split : {"train", "test"}
        Which split.
    download : bool, default False
        There is no automatic download; ``True`` only changes the error message.
    unknown : str or None, default " "
        See :func:`encode_chars`.

    Returns
    -------
    users : dict of str to TokenDataset
        Per user (sorted ids), ``x`` int64 ``(n, seq_len)`` character indices
        (``seq_len`` is 80 in LEAF) and ``y`` int64 ``(n,)`` the next character.
    vocab_size : int
        ``len(LEAF_SHAKESPEARE_VOCAB)`` (80).
    """
    _check_split(split)
    root = Path(root)
    dirs = [root / "shakespeare" / "data" / split, root / "data" / split, root / split]
    files: list[Path] = []
    for d in dirs:
        if d.is_dir():
            files = sorted(d.glob("*.json"))
            if files:
                break
    if not files:
        reason = (
            "download=True: LEAF data cannot be downloaded automatically"
            if download
            else "no *.json file"
        )
        raise DatasetNotFound(
            "LEAF Shakespeare", [d / "*.json" for d in dirs], _LEAF_HOWTO, reason=reason
        )
    xs: dict[str, list[np.ndarray]] = {}
    ys: dict[str, list[np.ndarray]] = {}
    seq_len: int | None = None
    for path in files:
        with open(path, encoding="utf-8") as f:
            blob = json.load(f)
        try:
            user_data = blob["user_data"]
            users = blob.get("users", list(user_data))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}: not a LEAF JSON file (no 'user_data')") from exc
        for user in users:
            rec = user_data[user]
            x_strs, y_strs = list(rec["x"]), list(rec["y"])
            if len(x_strs) != len(y_strs):
                raise ValueError(f"{path}: user {user!r} has {len(x_strs)} x but {len(y_strs)} y")
            if any(len(s) != 1 for s in y_strs):
                raise ValueError(f"{path}: user {user!r} has a y that is not one character")
            lengths = {len(s) for s in x_strs}
            if seq_len is not None:
                lengths.add(seq_len)
            if len(lengths) > 1:
                raise ValueError(f"{path}: sequences of different lengths {sorted(lengths)}")
            if x_strs:
                seq_len = lengths.pop()
            x = encode_chars("".join(x_strs), unknown).reshape(len(x_strs), seq_len or 0)
            y = encode_chars("".join(y_strs), unknown)
            xs.setdefault(str(user), []).append(x)
            ys.setdefault(str(user), []).append(y)
    width = seq_len if seq_len is not None else 80
    out: dict[str, TokenDataset] = {}
    for user in sorted(xs):
        parts = [p.reshape(-1, width) for p in xs[user]]
        out[user] = TokenDataset(np.concatenate(parts), np.concatenate(ys[user]))
    return out, len(LEAF_SHAKESPEARE_VOCAB)
