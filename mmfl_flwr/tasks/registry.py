"""The task registry: a task kind is a model and its federated data, registered
once and then named in ``tasks`` (``tasks="digits,my-task"``).

The built-in kinds are registrations too, made by the modules of
:mod:`mmfl_flwr.tasks.builtin` (imported at the end of this module) with the
same :func:`register_task` a user calls; a user's kind must not shadow them.

numpy only here; the model factory and trainer may use any framework.

Example
-------
>>> from mmfl_flwr.tasks.registry import register_task
>>> from mmfl_flwr.tasks.data import Dataset
>>> def my_data(num_clients, seed, copy):
...     # one (train, local test) pair per client, and a server-side test set
...     ...
>>> register_task("my-task", model_fn=lambda: MyTorchModel(), data_fn=my_data)

A client for which ``data_fn`` returns ``None`` (or an empty training set) does
not hold data for the task.

Instead of ``data_fn``, a task can give its unsplit data and any flwr-datasets
partitioner (https://flower.ai/docs/datasets/); the federation builder runs it
offline on an in-memory table of the labels (nothing is downloaded):

>>> from flwr_datasets.partitioner import DirichletPartitioner
>>> register_task(
...     "my-task", model_fn=lambda: MyTorchModel(), dataset=(train, test),
...     partitioner=lambda num_partitions, seed: DirichletPartitioner(
...         num_partitions, "label", alpha=0.5, min_partition_size=1, seed=seed))

``trainer_fn(model_fn, train, test, batch_size)`` may return a custom trainer
(an object with ``num_examples``, ``train``, ``loss`` and ``evaluate``, see
:class:`mmfl_flwr.client.contract.LocalTrainer`); by default the torch
:class:`~mmfl_flwr.client.trainer.TorchTrainer` is used.

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
from mmfl_flwr.tasks.spec import BuildFn, KindSpec

#: ``data_fn(num_clients, seed, copy) -> (clients, server_test)``: per client a
#: ``(train, local_test)`` pair (or None: no data for this task).
DataFn = Callable[[int, int, int], "tuple[list[tuple[Dataset, Dataset] | None], Dataset]"]

#: ``dataset(seed) -> (train, test)`` or ``(train, test, columns)``: the unsplit
#: data of a task partitioned by a flwr-datasets partitioner.
DatasetFn = Callable[[int], "tuple[Any, ...]"]


class _Fixed:
    """``dataset`` given as a tuple: a callable returning it (hashable by identity,
    so that a definition stays usable as a cache key)."""

    def __init__(self, value: tuple[Any, ...]) -> None:
        self.value = value

    def __call__(self, seed: int) -> tuple[Any, ...]:
        return self.value


@dataclass(frozen=True)
class TaskDefinition:
    """A task kind: how to build its model, its federated data (``data_fn``,
    ``dataset`` split by ``partitioner``, or ``build``), and (optionally) its
    local trainer, what its model takes (``spec``) and how to fetch its data
    (``download``). ``builtin``: one of the package's own kinds."""

    name: str
    model_fn: Callable[[], Any]
    data_fn: DataFn | None
    trainer_fn: Callable[..., Any] | None = None
    description: str = ""
    #: a flwr-datasets Partitioner (without dataset) or ``fn(num_partitions, seed)``
    partitioner: Any = None
    dataset: DatasetFn | None = None
    #: ``build(request) -> (clients, server_test, holders)``, a request being a
    #: :class:`~mmfl_flwr.tasks.spec.TaskBuild`
    build: BuildFn | None = None
    spec: KindSpec | None = None
    #: ``download(data_root)``: fetch the task's missing data
    download: Callable[[str], Any] | None = None
    builtin: bool = False


_REGISTRY: dict[str, TaskDefinition] = {}


def register_task(
    name: str,
    model_fn: Callable[[], Any],
    data_fn: DataFn | None = None,
    trainer_fn: Callable[..., Any] | None = None,
    description: str = "",
    replace: bool = False,
    *,
    dataset: tuple[Any, ...] | DatasetFn | None = None,
    partitioner: Any = None,
    build: BuildFn | None = None,
    spec: KindSpec | None = None,
    download: Callable[[str], Any] | None = None,
    builtin: bool = False,
) -> TaskDefinition:
    """Register a task kind under ``name``; its data comes from exactly one of
    ``data_fn``, ``dataset`` and ``partitioner``, or ``build`` (which sees the
    whole request: profile, eligibility, data root; the built-in kinds use it).

    Parameters
    ----------
    name : str
        The kind's name, used in ``tasks`` (no commas; must not shadow a
        built-in kind).
    model_fn : callable
        Returns a fresh model (e.g. a ``torch.nn.Module`` returning logits).
    data_fn : callable, optional
        ``data_fn(num_clients, seed, copy)`` returns ``(clients, server_test)``;
        ``copy`` numbers repeated models of this kind (0, 1, ...).
    trainer_fn : callable, optional
        ``trainer_fn(model_fn, train, test, batch_size)`` -> a local trainer.
    description : str
        Shown by ``registered_tasks()``.
    replace : bool
        Allow re-registering an existing name (not a built-in one).
    dataset : tuple or callable, optional
        With ``partitioner``: the unsplit data, ``(train, test)`` of
        :class:`~mmfl_flwr.tasks.data.Dataset`, optionally with a third item,
        ``columns``: a dict of further per-training-example 1-D arrays a
        partitioner may partition by (e.g. ``{"writer": ids}`` for
        ``NaturalIdPartitioner("writer")``); or a callable ``dataset(seed)``
        returning that tuple (loads lazily, e.g. from local files, in every
        process that builds the federation).
    partitioner : flwr_datasets.partitioner.Partitioner or callable, optional
        Any flwr-datasets partitioner, as a factory
        ``partitioner(num_partitions, seed) -> Partitioner`` (recommended) or an
        instance without a dataset. The builder calls the factory with the
        number of clients and a seed derived from the run's seed, the task and
        its copy, so every copy and every run seed gets its own partition; an
        instance is deep-copied for each use (flwr-datasets assigns a dataset to
        a partitioner only once), so its own seed stays fixed. The partitioner
        sees an in-memory ``datasets.Dataset`` with the column ``"label"``
        (``train.y``) and the ``columns``, with the rows in a random order drawn
        from the run's seed (``IidPartitioner``, ``SizePartitioner`` and
        ``LinearPartitioner`` cut the data in its order). Partition ``i`` is
        client ``i``'s training set; a partitioner with more partitions than
        clients (``NaturalIdPartitioner``: one per id) has ``num_clients`` of
        them drawn, one with fewer is an error. A client with an empty partition
        does not hold the task. Local test sets are empty; the server evaluates
        on ``test``. flwr-datasets is imported only when such a task is built
        (a few seconds, once per process).
    build : callable, optional
        ``build(request) -> (clients, server_test, holders)`` for a
        :class:`~mmfl_flwr.tasks.spec.TaskBuild` (one copy of the task in one
        federation): per client ``(train, local_test)`` (empty datasets for a
        client without data), the server's test set, and the bool array of the
        clients holding the task (``request.eligible`` or fewer).
    spec : KindSpec, optional
        What the model takes and predicts (every built-in kind has one).
    download : callable, optional
        ``download(data_root)`` fetches missing data (``mmfl run --download``).
    builtin : bool
        The package's own kinds (:mod:`mmfl_flwr.tasks.builtin`), which
        cannot be shadowed or replaced.
    """
    _check_name(name)
    old = _REGISTRY.get(name)
    if old is not None and old.builtin:
        raise ValueError(f"{name!r} is a built-in task kind; choose another name")
    if not callable(model_fn):
        raise TypeError("model_fn must be a callable")
    source = _data_source(name, data_fn, dataset, partitioner, build)
    if old is not None and not replace and _differs(old, data_fn, partitioner, source, build):
        raise ValueError(f"task {name!r} is already registered (pass replace=True)")
    definition = TaskDefinition(
        name,
        model_fn,
        data_fn,
        trainer_fn,
        description,
        partitioner=partitioner,
        dataset=source,
        build=build,
        spec=spec,
        download=download,
        builtin=bool(builtin),
    )
    _REGISTRY[name] = definition
    return definition


def _check_name(name: Any) -> None:
    """A task name: a non-empty string without commas or surrounding spaces."""
    if not isinstance(name, str) or not name or "," in name or name != name.strip():
        raise ValueError(f"task name must be a non-empty string without commas, got {name!r}")


def _data_source(
    name: str,
    data_fn: DataFn | None,
    dataset: tuple[Any, ...] | DatasetFn | None,
    partitioner: Any,
    build: BuildFn | None,
) -> DatasetFn | None:
    """Check that exactly one source of data is given; the ``dataset`` as a
    callable (None without a partitioner)."""
    if build is not None:
        if data_fn is not None or partitioner is not None or dataset is not None:
            raise ValueError("pass build= alone (not with data_fn, dataset= or partitioner=)")
        if not callable(build):
            raise TypeError("build must be a callable build(request)")
        return None
    if partitioner is None:
        if dataset is not None:
            raise ValueError("dataset= needs partitioner= (or pass data_fn instead)")
        if not callable(data_fn):
            raise TypeError("data_fn must be a callable (or pass dataset= and partitioner=)")
        return None
    if data_fn is not None:
        raise ValueError("pass either data_fn or dataset= and partitioner=, not both")
    _check_partitioner(partitioner)
    if dataset is None:
        raise ValueError("partitioner= needs dataset=(train, test) or a dataset(seed) callable")
    if callable(dataset):
        return dataset
    _check_dataset(dataset, name)
    return _Fixed(tuple(dataset))


def _differs(
    old: TaskDefinition,
    data_fn: DataFn | None,
    partitioner: Any,
    source: DatasetFn | None,
    build: BuildFn | None,
) -> bool:
    """Whether a registration under an existing name gives other data than
    ``old`` (the same data again is harmless)."""
    if old.data_fn is not data_fn or old.partitioner is not partitioner or old.build is not build:
        return True
    if old.dataset is source:
        return False
    return not (
        isinstance(old.dataset, _Fixed)
        and isinstance(source, _Fixed)
        and _same(old.dataset.value, source.value)
    )


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _check_partitioner(partitioner: Any) -> None:
    """Refuse what cannot be a flwr-datasets partitioner or a factory of one,
    without importing flwr-datasets (the builder checks the type)."""
    if hasattr(partitioner, "load_partition") and hasattr(partitioner, "is_dataset_assigned"):
        if partitioner.is_dataset_assigned():
            raise ValueError(
                f"the {type(partitioner).__name__} passed as partitioner already has a "
                "dataset (flwr-datasets assigns one only once); pass one without a "
                "dataset, or a factory fn(num_partitions, seed)"
            )
        return
    if not callable(partitioner):
        raise TypeError(
            "partitioner must be a flwr_datasets.partitioner.Partitioner or a factory "
            f"fn(num_partitions, seed) -> Partitioner, got {type(partitioner).__name__}"
        )


def _check_dataset(dataset: Any, name: str) -> None:
    """``(train, test)`` or ``(train, test, columns)`` with a row per training
    example in every column."""
    if not isinstance(dataset, (tuple, list)) or len(dataset) not in (2, 3):
        raise TypeError(
            f"task {name!r}: dataset must be (train, test), (train, test, columns) or a "
            f"callable dataset(seed) returning one, got {type(dataset).__name__}"
        )
    train, test = dataset[0], dataset[1]
    if not isinstance(train, Dataset) or not isinstance(test, Dataset):
        raise TypeError(
            f"task {name!r}: dataset's train and test must be mmfl_flwr.tasks.data.Dataset, "
            f"got {type(train).__name__} and {type(test).__name__}"
        )
    if len(train) == 0:
        raise ValueError(f"task {name!r}: the training set is empty")
    if len(dataset) == 3:
        columns = dataset[2]
        if not isinstance(columns, Mapping):
            raise TypeError(f"task {name!r}: columns must be a dict of name -> array")
        for col, values in columns.items():
            shape = getattr(values, "shape", (len(values),))
            if col == "label" or not isinstance(col, str):
                raise ValueError(
                    f"task {name!r}: column names must be strings other than 'label' "
                    "(the builder's column of train.y)"
                )
            if tuple(shape) != (len(train),):
                raise ValueError(
                    f"task {name!r}: column {col!r} has shape {tuple(shape)}, expected "
                    f"({len(train)},): one value per training example"
                )


def get_task(name: str) -> TaskDefinition | None:
    """The registered definition of ``name``, or None."""
    return _REGISTRY.get(name)


def registered_tasks() -> dict[str, TaskDefinition]:
    """The user-registered tasks (not the built-in kinds, which every process
    registers when it imports this module): a snapshot to ship to other
    processes."""
    return {k: d for k, d in _REGISTRY.items() if not d.builtin}


def task_kinds() -> list[str]:
    """Every registered kind: the built-in ones, then the user's, each in the
    order they were registered."""
    return [k for k, d in _REGISTRY.items() if d.builtin] + list(registered_tasks())


def builtin_kinds() -> dict[str, KindSpec]:
    """Built-in kind -> what its model takes and predicts."""
    return {k: d.spec for k, d in _REGISTRY.items() if d.builtin and d.spec is not None}


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
    """Remove a user registration (tests); the built-in kinds stay."""
    definition = _REGISTRY.get(name)
    if definition is not None and not definition.builtin:
        del _REGISTRY[name]


# The built-in kinds register themselves here, as a user's task does (each of
# their modules imports this one, which is complete by now).
from mmfl_flwr.tasks.builtin import load as _load_builtins  # noqa: E402

_load_builtins()
