"""The built-in task kinds, one module per family, each registering its kinds
with :func:`~mmfl_flwr.tasks.registry.register_task` (``builtin=True``) as a
user registers a task of their own.

No list names them: the registry imports every module of this package when it
is first imported (:func:`load`), so a new built-in kind is one new module here
(and its test). Modules are imported in name order; torch is imported only by
the models' factories, when a model is built.
"""

from __future__ import annotations

import importlib
import pkgutil


def load() -> None:
    """Import every module of this package (each registers its kinds)."""
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{module}")
