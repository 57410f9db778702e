"""The built-in task kinds: what each one's model takes and predicts.

torch-free. Each kind is declared once, by its registration in a module of
:mod:`mmfl_flwr.tasks.builtin`; :data:`KINDS` is read from the registry.
"""

from __future__ import annotations

from mmfl_flwr.tasks.builtin.synthetic import SYNTHETIC_KINDS
from mmfl_flwr.tasks.registry import builtin_kinds
from mmfl_flwr.tasks.spec import KindSpec

__all__ = ["KINDS", "KindSpec", "SYNTHETIC_KINDS"]

#: The task kinds known to the package (built-in kind -> its spec).
KINDS: dict[str, KindSpec] = builtin_kinds()
