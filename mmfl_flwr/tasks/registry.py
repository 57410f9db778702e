"""User-defined tasks: register a model and its data once, then name it in
``tasks`` next to the built-in ones (``tasks="digits,my-task"``).

numpy only here; the model factory and trainer may use any framework.

Example
-------
>>> from mmfl_flwr.tasks.registry import register_task
>>> from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.kinds import KINDS
>>> def my_data(num_clients, seed, copy):
...     # one (train, local test) pair per client, and a server-side test set
...     ...
>>> register_task("my-task", model_fn=lambda: MyTorchModel(), data_fn=my_data)

A client for which ``data_fn`` returns ``None`` (or an empty training set) does
not hold data for the task. ``trainer_fn(model_fn, train, test, batch_size)``
may return a custom trainer (an object with ``num_examples``, ``train``,
``loss`` and ``evaluate``, see :class:`mmfl_flwr.client.app.LocalTrainer`);
by default the torch :class:`~mmfl_flwr.client.trainer.TorchTrainer` is used.

Registrations live in the Python process that makes them. ``mmfl run`` and the
in-process / simulation runners carry a snapshot of the registry to every
simulated client; for ``flwr run`` and deployments, register the task in a
module that both the ServerApp and ClientApp import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mmfl_flwr.tasks.data import Dataset
from mmfl_flwr.tasks.kinds import KINDS

#: ``data_fn(num_clients, seed, copy) -> (clients, server_test)``: per client a
#: ``(train, local_test)`` pair (or None: no data for this task).
DataFn = Callable[[int, int, int], "tuple[list[tuple[Dataset, Dataset] | None], Dataset]"]


@dataclass(frozen=True)
class TaskDefinition:
    """A user task: how to build its model, its federated data, and (optionally)
    its local trainer."""

    name: str
    model_fn: Callable[[], Any]
    data_fn: DataFn
    trainer_fn: Callable[..., Any] | None = None
    description: str = ""


_REGISTRY: dict[str, TaskDefinition] = {}


def register_task(
    name: str,
    model_fn: Callable[[], Any],
    data_fn: DataFn,
    trainer_fn: Callable[..., Any] | None = None,
    description: str = "",
    replace: bool = False,
) -> TaskDefinition:
    """Register a task kind under ``name``.

    Parameters
    ----------
    name : str
        The kind's name, used in ``tasks`` (no commas; must not shadow a
        built-in kind).
    model_fn : callable
        Returns a fresh model (e.g. a ``torch.nn.Module`` returning logits).
    data_fn : callable
        ``data_fn(num_clients, seed, copy)`` returns ``(clients, server_test)``;
        ``copy`` numbers repeated models of this kind (0, 1, ...).
    trainer_fn : callable, optional
        ``trainer_fn(model_fn, train, test, batch_size)`` -> a local trainer.
    description : str
        Shown by ``registered_tasks()``.
    replace : bool
        Allow re-registering an existing name.
    """
    if not isinstance(name, str) or not name or "," in name or name != name.strip():
        raise ValueError(f"task name must be a non-empty string without commas, got {name!r}")
    if name in KINDS:
        raise ValueError(f"{name!r} is a built-in task kind; choose another name")
    if name in _REGISTRY and not replace and _REGISTRY[name].data_fn is not data_fn:
        raise ValueError(f"task {name!r} is already registered (pass replace=True)")
    if not callable(model_fn) or not callable(data_fn):
        raise TypeError("model_fn and data_fn must be callables")
    definition = TaskDefinition(name, model_fn, data_fn, trainer_fn, description)
    _REGISTRY[name] = definition
    return definition


def get_task(name: str) -> TaskDefinition | None:
    """The registered definition of ``name``, or None."""
    return _REGISTRY.get(name)


def registered_tasks() -> dict[str, TaskDefinition]:
    """A copy of the registry (a snapshot to ship to other processes)."""
    return dict(_REGISTRY)


def restore(snapshot: dict[str, TaskDefinition]) -> None:
    """Register every task of a snapshot that this process does not know yet."""
    for name, definition in snapshot.items():
        _REGISTRY.setdefault(name, definition)


#: Run-config key naming a file with a pickled registry snapshot: how tasks
#: registered in the process that starts a run reach the ServerApp and
#: ClientApp processes of Flower's simulation runtime (``mmfl run`` and
#: ``runner.run(..., engine="simulation")`` write it; see flower_app/launch.py).
TASK_SNAPSHOT_KEY = "task-snapshot"
_loaded: set[str] = set()


def save_snapshot(path: str) -> None:
    """Pickle this process's registry to ``path`` (by value, with cloudpickle,
    so tasks defined in a script travel too)."""
    import cloudpickle

    with open(path, "wb") as f:
        cloudpickle.dump(registered_tasks(), f)


def load_snapshot(run_config: Mapping[str, Any]) -> None:
    """Register the tasks of the snapshot the run config names (once per file
    and process); nothing without the key."""
    path = run_config.get(TASK_SNAPSHOT_KEY)
    if not path or str(path) in _loaded:
        return
    import pickle

    with open(str(path), "rb") as f:
        restore(pickle.load(f))
    _loaded.add(str(path))


def unregister_task(name: str) -> None:
    """Remove a registration (tests)."""
    _REGISTRY.pop(name, None)
