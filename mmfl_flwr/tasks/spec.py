"""What a task kind declares about its model (:class:`KindSpec`) and what its
federation builder is given (:class:`TaskBuild`).

numpy only, and no import of the registry or the builder: both import this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mmfl_flwr.tasks.data import Dataset
    from mmfl_flwr.tasks.profiles import Profile


@dataclass(frozen=True)
class KindSpec:
    """Description of one task kind.

    Attributes
    ----------
    num_classes : int
        Number of output classes.
    input_shape : tuple of int
        Shape of one input example (without the batch axis).
    model : str
        Model family used for the kind (``"cnn"``, ``"logreg"``, ``"resnet18"``
        or ``"lstm"`` for the built-in kinds).
    """

    num_classes: int
    input_shape: tuple[int, ...]
    model: str


@dataclass(frozen=True)
class TaskBuild:
    """One copy of one task of a federation being built: what a task's
    ``build`` function (:func:`~mmfl_flwr.tasks.registry.register_task`) is
    given.

    Attributes
    ----------
    kind : str
        The task kind (its registered name).
    num_clients : int
        Number of clients ``N`` of the federation.
    seed : int
        The federation's seed.
    copy : int
        Which copy of this kind (0, 1, ...) among the federation's models.
    eligible : np.ndarray
        Shape ``(N,)`` bool: the clients the profile lets hold this task.
    profile : Profile
        The federation's client heterogeneity.
    high : np.ndarray or None
        Shape ``(N,)`` bool, the task's high-data clients, where the profile has
        any (else None).
    cluster_of : np.ndarray or None
        Shape ``(N,)`` int, each client's label cluster, where the profile has
        clusters (else None).
    labels_per_client : float
        Fraction of a labelled task's labels each client holds.
    max_synthetic_samples : int or None
        Cap on the samples per synthetic user.
    data_root : str
        Where the real datasets are.
    clients : frozenset of int or None
        The clients whose data this process needs (None: all); a builder may
        give the others empty data.
    server_tests : bool
        Whether the server-side test set is needed.
    """

    kind: str
    num_clients: int
    seed: int
    copy: int
    eligible: np.ndarray
    profile: Profile
    high: np.ndarray | None = None
    cluster_of: np.ndarray | None = None
    labels_per_client: float = 0.3
    max_synthetic_samples: int | None = 500
    data_root: str = "data"
    clients: frozenset[int] | None = None
    server_tests: bool = True

    @property
    def weights(self) -> np.ndarray | None:
        """Per-client data weights (``high_data_ratio`` for a high-data client,
        1 for the others), or None without high-data clients."""
        if self.high is None:
            return None
        return np.where(self.high, self.profile.high_data_ratio, 1.0)


#: What a ``build`` function returns: per client ``(train, local_test)``
#: (empty datasets for a client without data), the server-side test set, and
#: the clients that hold the task (``TaskBuild.eligible`` or fewer).
Built = tuple["Sequence[tuple[Dataset, Dataset]]", "Dataset", np.ndarray]

#: ``build(request) -> (clients, server_test, holders)``.
BuildFn = Callable[[TaskBuild], Built]
