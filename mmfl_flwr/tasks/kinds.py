"""The built-in task kinds: what each one's model takes and predicts.

torch-free; imported by the federation builder, the model zoo and
the user-task registry (which must not shadow a built-in name), so none of them
imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmfl_flwr.tasks.real import REAL_KINDS


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
        Model family used for the kind (``"cnn"`` or ``"logreg"``).
    """

    num_classes: int
    input_shape: tuple[int, ...]
    model: str


#: The task kinds known to the package.
KINDS: dict[str, KindSpec] = {
    "digits": KindSpec(num_classes=10, input_shape=(1, 8, 8), model="cnn"),
    "synthetic": KindSpec(num_classes=5, input_shape=(60,), model="logreg"),
    # Paper 004's second model: Synthetic(1,1) with 30 dims and 10 classes.
    "synthetic-b": KindSpec(num_classes=10, input_shape=(30,), model="logreg"),
    # Synthetic-IID (FedProx): one shared model for all users, x ~ N(0, diag(j^-1.2)).
    "synthetic-iid": KindSpec(num_classes=5, input_shape=(60,), model="logreg"),
    "synthetic-iid-b": KindSpec(num_classes=10, input_shape=(30,), model="logreg"),
    # The papers' real datasets, read from `data_root` (mmfl_flwr.tasks.real).
    **{
        k: KindSpec(num_classes=c, input_shape=shape, model=m)
        for k, (c, shape, m) in REAL_KINDS.items()
    },
}

#: The Synthetic kinds (generated locally by the FedProx generator).
SYNTHETIC_KINDS = ("synthetic", "synthetic-b", "synthetic-iid", "synthetic-iid-b")
