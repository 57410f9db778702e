"""The ``digits`` kind: scikit-learn's 8x8 digits images (embedded, no data
root), 10 classes, a small CNN (:class:`~mmfl_flwr.tasks.models.DigitsCNN`).

The global train split of :func:`~mmfl_flwr.tasks.data.load_digits_data` is
partitioned among the task's eligible clients by
:func:`~mmfl_flwr.tasks.labelled.build_labelled`: with the default profile a
label skew (:func:`~mmfl_flwr.tasks.labelled.label_skew_partition`), each
client holding ``max(1, round(labels_per_client * 10))`` labels (split in
proportion to the clients' data weights under a heterogeneous profile). Every
copy of the task draws its own partition from its own stream. All training
examples are used exactly once per copy and every eligible client gets at least
one. A client's local test set is the global test examples of its labels, split
evenly among the holders.
"""

from __future__ import annotations

from typing import Any

from mmfl_flwr.tasks.data import load_digits_data
from mmfl_flwr.tasks.labelled import build_labelled
from mmfl_flwr.tasks.registry import register_task
from mmfl_flwr.tasks.spec import Built, KindSpec, TaskBuild

SPEC = KindSpec(num_classes=10, input_shape=(1, 8, 8), model="cnn")
#: The kind's own stream number (see :func:`~mmfl_flwr.tasks.labelled.stream_seed`).
STREAM = 1


def _model() -> Any:
    """A fresh digits CNN."""
    from mmfl_flwr.tasks.models import DigitsCNN

    return DigitsCNN(num_classes=SPEC.num_classes)


def _build(req: TaskBuild) -> Built:
    """One copy of the digits task."""
    clients, test = build_labelled(req, SPEC, STREAM, *load_digits_data(req.seed))
    return clients, test, req.eligible


register_task(
    "digits",
    model_fn=_model,
    build=_build,
    spec=SPEC,
    description="scikit-learn's 8x8 digits, 10 classes (embedded)",
    builtin=True,
)
