"""Read a W&B offline run file (``run-<id>.wandb``) without W&B's own reader.

The file is W&B's record log: a 7-byte header (``:W&B``, magic 0xBEE1,
version), then 32 KiB blocks of records, each a 7-byte header (CRC-32, length,
type: full, first, middle, last), the LevelDB log layout; each whole record is
a ``wandb.proto.wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | Path) -> list[bytes]:
    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert ident == b":W&B" and magic == 0xBEE1, (ident, magic, version)
    out: list[bytes] = []
    pos = HEADER
    pending = b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if length == 0 and kind == 0:  # zero padding to the block's end
            pos += left
            continue
        body = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            out.append(body)
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            out.append(pending + body)
            pending = b""
        else:
            raise ValueError(f"unknown record type {kind} at {pos}")
    return out


def history(path: str | Path) -> list[dict[str, Any]]:
    """The ``history`` records of the run (one dict per ``run.log`` call:
    key -> value, ``_step`` included)."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for raw in records(path):
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in rec.history.item:
            key = item.key or "/".join(item.nested_key)
            row[key] = json.loads(item.value_json)
        rows.append(row)
    return rows


def config(path: str | Path) -> dict[str, Any]:
    """The run's config (the last ``config`` record's values, or the run record's)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out: dict[str, Any] = {}
    for raw in records(path):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        items = (
            rec.run.config.update
            if kind == "run"
            else rec.config.update
            if kind == "config"
            else []
        )
        for item in items:
            key = item.key or "/".join(item.nested_key)
            out[key] = json.loads(item.value_json)
    return out
