"""Seeds derived from the run's one seed (numpy only: no flwr, no torch)."""

from __future__ import annotations

import zlib

import numpy as np


def training_seed(seed: int, server_round: int, client_id: str, task: str) -> int:
    """A 63-bit seed for one (run seed, round, client, task) local training."""
    words = [seed, server_round, zlib.crc32(client_id.encode()), zlib.crc32(task.encode())]
    state = np.random.SeedSequence([abs(int(w)) for w in words]).generate_state(1, np.uint64)
    return int(state[0] >> 1)


def task_seed(seed: int, task: str) -> int:
    """A 31-bit seed for a model's initial weights, from the run seed and its name."""
    state = np.random.SeedSequence([abs(int(seed)), zlib.crc32(task.encode())]).generate_state(1)
    return int(state[0] >> 1)
