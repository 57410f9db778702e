"""Writers of the real datasets' on-disk formats (MNIST idx files, CIFAR-10
pickled batches, LEAF JSON, CelebA folders), for tests that load real-format
data offline without mocking the loaders away."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import numpy as np


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    """Write a uint8 array in the idx format (magic 0x0000 08 ndim, big-endian dims)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    blob = header + array.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(blob)
    else:
        path.write_bytes(blob)
    return path


def write_cifar_batch(path: Path, data: np.ndarray, labels: list[int]) -> None:
    """A CIFAR-10 Python batch: a pickled dict with byte-string keys."""
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        b"batch_label": b"tiny batch",
        b"labels": list(labels),
        b"data": np.ascontiguousarray(data, dtype=np.uint8),
        b"filenames": [f"img_{i}.png".encode() for i in range(len(labels))],
    }
    with open(path, "wb") as f:
        pickle.dump(entry, f, protocol=2)


def write_leaf_json(path: Path, user_data: dict[str, tuple[list[str], list[str]]]) -> None:
    """A LEAF JSON file: users, num_samples, user_data {user: {x, y}}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    users = list(user_data)
    blob = {
        "users": users,
        "num_samples": [len(user_data[u][0]) for u in users],
        "user_data": {u: {"x": xs, "y": ys} for u, (xs, ys) in user_data.items()},
    }
    path.write_text(json.dumps(blob), encoding="utf-8")


CELEBA_NAMES = ["5_o_Clock_Shadow", "Eyeglasses", "Male", "Smiling"]


def write_celeba(
    root: Path, rows: list[tuple[str, list[int], int]], colors, size=(12, 10), fmt: str = "jpg"
) -> Path:
    """CelebA's list_attr_celeba.txt, list_eval_partition.txt and solid-colour images."""
    base = root / "celeba"
    (base / "img_align_celeba").mkdir(parents=True, exist_ok=True)
    lines = [str(len(rows)), " ".join(CELEBA_NAMES) + " "]
    for image_id, values, _ in rows:
        lines.append(image_id + " " + " ".join(f"{v:2d}" for v in values))
    (base / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    (base / "list_eval_partition.txt").write_text(
        "".join(f"{image_id} {part}\n" for image_id, _, part in rows)
    )
    for (image_id, _, _), color in zip(rows, colors):
        arr = np.empty((size[0], size[1], 3), dtype=np.uint8)
        arr[...] = color
        if fmt == "npy":
            np.save(base / "img_align_celeba" / (image_id + ".npy"), arr)
        else:
            from PIL import Image

            Image.fromarray(arr).save(base / "img_align_celeba" / image_id, quality=95)
    return base
