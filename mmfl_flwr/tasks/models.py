"""Torch models of the task kinds (all return logits)."""

from __future__ import annotations

import torch
from torch import nn

from mmfl_flwr.tasks.registry import get_task, task_kinds

__all__ = ["DigitsCNN", "LogisticRegression", "make_model"]


class DigitsCNN(nn.Module):
    """Small CNN for the 1x8x8 digits images.

    conv(1->16, k3, pad1) - ReLU - maxpool2 (4x4) - conv(16->32, k3, pad1) - ReLU -
    maxpool2 (2x2) - linear(128->64) - ReLU - linear(64->num_classes).

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch ``(B, 1, 8, 8)`` to logits ``(B, num_classes)``."""
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.flatten(x, start_dim=1)
        x = torch.relu(self.fc1(x))
        return self.fc2(x)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: a single linear layer producing logits.

    Parameters
    ----------
    dim : int
        Input dimension.
    num_classes : int
        Number of output logits.
    """

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch ``(B, dim)`` to logits ``(B, num_classes)``."""
        return self.linear(torch.flatten(x, start_dim=1))


def make_model(kind: str) -> nn.Module:
    """Build a freshly initialised model for a task kind.

    Parameters
    ----------
    kind : str
        A registered task kind (:func:`~mmfl_flwr.tasks.registry.register_task`;
        the built-in ones are :data:`mmfl_flwr.tasks.kinds.KINDS`).

    Returns
    -------
    torch.nn.Module
        The model (random initialisation from torch's global generator).
    """
    definition = get_task(kind)
    if definition is None:
        raise ValueError(f"unknown task kind {kind!r}; known: {sorted(task_kinds())}")
    return definition.model_fn()
