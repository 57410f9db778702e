"""Local training and evaluation of a torch model on numpy data.

Weights travel as ``dict[str, np.ndarray]`` keyed by the model's ``state_dict`` keys
(same order and dtypes). All functions are deterministic given their inputs and seed;
the torch thread count is left to the caller.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from mmfl_flwr.client.rows import Rows, loss_accuracy, packed
from mmfl_flwr.client.weights import check_weight_keys
from mmfl_flwr.tasks.data import Dataset

__all__ = [
    "TorchTrainer",
    "initial_weights",
    "evaluate_arrays",
    "model_to_arrays",
    "load_arrays",
    "packed_rows",
    "torch_trainer_override",
]


def default_device() -> torch.device:
    """CUDA when available (e.g. with Flower's ``client-resources-num-gpus > 0``),
    else the CPU; the ``MMFL_DEVICE`` environment variable overrides it."""
    name = os.environ.get("MMFL_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = _DEVICES.get(name)
    if dev is None:  # one object per name: 100,000 trainers share it
        dev = _DEVICES[name] = torch.device(name)
    return dev


_DEVICES: dict[str, torch.device] = {}


def model_to_arrays(model: nn.Module) -> dict[str, np.ndarray]:
    """Copy a model's ``state_dict`` into numpy arrays (same keys, order, dtypes).

    Parameters
    ----------
    model : torch.nn.Module
        The model.

    Returns
    -------
    dict of str to np.ndarray
        Independent copies of every state tensor.
    """
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def load_arrays(model: nn.Module, weights: dict[str, np.ndarray]) -> None:
    """Load numpy weights into ``model`` in place (strict key and shape match).

    Parameters
    ----------
    model : torch.nn.Module
        The model to overwrite.
    weights : dict of str to np.ndarray
        Arrays keyed like ``model.state_dict()``; cast to each entry's dtype.
    """
    state = model.state_dict()
    check_weight_keys({k: tuple(v.shape) for k, v in state.items()}, weights)
    # one copy per entry, straight into the model's tensors (state_dict() shares
    # their storage)
    with torch.no_grad():
        for key, ref in state.items():
            ref.copy_(torch.as_tensor(np.asarray(weights[key])).to(ref.dtype))


def initial_weights(model_fn: Callable[[], nn.Module], seed: int) -> dict[str, np.ndarray]:
    """Seeded initial weights of a model, as numpy arrays.

    The global torch RNG state of the caller is restored afterwards.

    Parameters
    ----------
    model_fn : callable
        Builds a fresh model.
    seed : int
        Seed of the initialisation.

    Returns
    -------
    dict of str to np.ndarray
        The ``state_dict`` of the freshly built model.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = model_fn()
    return model_to_arrays(model)


def evaluate_arrays(
    model_fn: Callable[[], nn.Module],
    weights: dict[str, np.ndarray],
    dataset: Dataset,
    batch_size: int = 256,
) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of given weights on a dataset.

    Used by the server for central evaluation.

    Parameters
    ----------
    model_fn : callable
        Builds a fresh model of the right architecture.
    weights : dict of str to np.ndarray
        Weights keyed like the model's ``state_dict``.
    dataset : Dataset
        Evaluation data; must not be empty.
    batch_size : int, default 256
        Forward-pass batch size.

    Returns
    -------
    tuple of float
        ``(loss, accuracy)``.
    """
    if len(dataset) == 0:
        raise ValueError("cannot evaluate on an empty dataset")
    with torch.random.fork_rng(devices=[]):
        model = model_fn()
    load_arrays(model, weights)
    device = default_device()
    x, y = Rows.of(dataset, torch.float32, device).tensors()
    return loss_accuracy(model.to(device), x, y, batch_size)


#: model_fn -> (its floating dtype, its trainable keys); a node hosting many
#: clients shares one model_fn per task, and builds its model once here
_PROBES: weakref.WeakKeyDictionary[Callable[[], nn.Module], tuple[torch.dtype, list[str]]] = (
    weakref.WeakKeyDictionary()
)

#: model_fn -> (device, thread) -> the network the trainers of model_fn share: every
#: call loads a whole state_dict into it, so one network per thread serves them all
#: (one per (client, task) held 348 copies of a 6.6 MB CNN and their gradients in a
#: 120-client in-process run)
_NETS: weakref.WeakKeyDictionary[Callable[[], nn.Module], dict[tuple[str, int], nn.Module]] = (
    weakref.WeakKeyDictionary()
)


def shared_net(model_fn: Callable[[], nn.Module], device: torch.device) -> nn.Module:
    """The network of ``model_fn`` on ``device`` for this thread, built once with the
    global torch RNG untouched (a model_fn that cannot be weakly referenced gets a
    new network each call)."""
    key = (str(device), threading.get_ident())
    try:
        nets = _NETS.setdefault(model_fn, {})
    except TypeError:  # not weakly referenceable
        nets = {}
    net = nets.get(key)
    if net is None:
        with torch.random.fork_rng(devices=[]):
            net = nets[key] = model_fn().to(device)
    return net


def _probe(model_fn: Callable[[], nn.Module]) -> tuple[torch.dtype, list[str]]:
    """The floating dtype of ``model_fn``'s parameters (inputs are cast to it:
    float32 for the zoo, float64 inputs for a float64 model) and its trainable
    ``state_dict`` keys, from one model built with the global RNG untouched."""
    try:
        known = _PROBES.get(model_fn)
    except TypeError:  # not weakly referenceable
        known = None
    if known is not None:
        return known[0], known[1]  # shared by the trainers of model_fn: not modified
    with torch.random.fork_rng(devices=[]):
        probe = model_fn()
    dtype = next((p.dtype for p in probe.parameters() if p.is_floating_point()), torch.float32)
    trainable = [n for n, p in probe.named_parameters() if p.requires_grad]
    try:
        _PROBES[model_fn] = (dtype, list(trainable))
    except TypeError:
        pass
    return dtype, trainable


class TorchTrainer:
    """Trains and evaluates one model on one client's data.

    Parameters
    ----------
    model_fn : callable
        Builds a fresh model (its random initialisation is always overwritten).
    train : Dataset
        Local training data (non-empty).
    test : Dataset
        Local test data (may be empty; see :meth:`evaluate`).
    batch_size : int, default 32
        Mini-batch size for training and evaluation.
    """

    def __init__(
        self,
        model_fn: Callable[[], nn.Module],
        train: Dataset,
        test: Dataset,
        batch_size: int = 32,
    ) -> None:
        if len(train) == 0:
            raise ValueError("the training set must not be empty")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model_fn = model_fn
        self.batch_size = int(batch_size)
        self.num_train = len(train)
        self.num_test = len(test)
        self.device = default_device()
        dtype, self._trainable = _probe(model_fn)
        self._train = Rows.of(train, dtype, self.device)
        self._test = Rows.of(test, dtype, self.device)
        self._own_net: nn.Module | None = None  # a subclass's network (see _model)

    @property
    def trainable_keys(self) -> list[str]:
        """``state_dict`` keys of the trainable parameters; the other entries
        (batch-norm running statistics, counters) are model state, not part of
        the update the server aggregates."""
        return list(self._trainable)

    def _model(self, weights: dict[str, np.ndarray]) -> nn.Module:
        """A model holding ``weights``: the network this thread's trainers of the
        same ``model_fn`` share (:func:`shared_net`: built once, global torch RNG
        left untouched), whose whole ``state_dict`` every call overwrites;
        building a model per message cost more than a forward pass over the
        local data, and keeping one per trainer held a copy per client."""
        if type(self) is TorchTrainer:
            net = shared_net(self.model_fn, self.device)
        else:
            # a subclass may change its network beyond the state_dict (hooks, pruning,
            # frozen layers): it keeps one of its own
            if self._own_net is None:
                with torch.random.fork_rng(devices=[]):
                    self._own_net = self.model_fn().to(self.device)
            net = self._own_net
        load_arrays(net, weights)
        return net

    @property
    def num_examples(self) -> int:
        """Number of local training examples."""
        return self.num_train

    def map_train_labels(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace the local training labels by ``fn(labels)`` (a new tensor of
        the same shape; the old one, which may share the federation's arrays,
        is not modified). Loss queries and training then use the new labels:
        how :func:`mmfl_flwr.testing.hostile.label_flipping` poisons a client."""
        old = self._train.tensors()[1]
        y = fn(old)
        if not isinstance(y, torch.Tensor) or y.shape != old.shape:
            raise ValueError("map_train_labels: fn must return a tensor of the labels' shape")
        rows = self._train
        self._train = Rows(rows.x, y.to(device=self.device, dtype=old.dtype), rows.xs, 0, rows.n)

    def train_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The local training inputs and labels as tensors on :attr:`device` (shared,
        not copies: do not modify). Used by the vectorised engine."""
        return self._train.tensors()

    def eval_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What :meth:`evaluate` evaluates on: the local test data, or the training
        data when the test set is empty (shared tensors: do not modify)."""
        return self._eval_rows().tensors()

    def _eval_rows(self) -> Rows:
        return self._test if self.num_test > 0 else self._train

    def train(
        self,
        weights: dict[str, np.ndarray],
        epochs: int,
        lr: float,
        seed: int,
        batch_size: int | None = None,
        correction: dict[str, np.ndarray] | None = None,
    ) -> tuple[dict[str, np.ndarray], int, float]:
        """Run ``epochs`` local epochs of plain mini-batch SGD from ``weights``.

        Mini-batches are reshuffled every epoch by a ``torch.Generator`` seeded with
        ``seed``; ``torch.manual_seed(seed)`` is set too (inside a forked RNG, so the
        caller's global torch RNG state is unchanged).

        Parameters
        ----------
        weights : dict of str to np.ndarray
            Starting weights keyed like the model's ``state_dict``.
        epochs : int
            Number of local epochs (>= 1).
        lr : float
            SGD learning rate.
        seed : int
            Seed of the batch order (and any other randomness).
        batch_size : int, optional
            Overrides the trainer's mini-batch size for this call.
        correction : dict of str to np.ndarray, optional
            Added to the gradient of each named parameter at every step
            (SCAFFOLD's ``c - c_i``); buffers are not corrected.

        Returns
        -------
        new_weights : dict of str to np.ndarray
            Trained weights, same keys, order and dtypes as the ``state_dict``.
        num_examples : int
            Number of local training examples.
        train_loss : float
            Mean (per-example) cross-entropy over the mini-batches of the last epoch.
        """
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        bs = self.batch_size if batch_size is None else int(batch_size)
        if bs < 1:
            raise ValueError(f"batch_size must be >= 1, got {bs}")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            generator = torch.Generator().manual_seed(int(seed))
            model = self._model(weights)
            model.train()
            # plain SGD written out: p <- p - lr * grad, the same operation
            # torch.optim.SGD performs without momentum or weight decay, whose
            # constructor imports torch._dynamo (~2 CPU-s in every fresh process:
            # each Ray worker and each deployed ClientApp message)
            params = [p for p in model.parameters() if p.requires_grad]
            step = -float(lr)
            corr = []
            if correction is not None:
                for name, param in model.named_parameters():
                    if name not in correction:
                        raise KeyError(f"correction has no entry for parameter {name!r}")
                    c = torch.as_tensor(
                        np.asarray(correction[name]), dtype=param.dtype, device=param.device
                    )
                    if c.shape != param.shape:
                        raise ValueError(
                            f"correction {name!r} has shape {tuple(c.shape)}, "
                            f"expected {tuple(param.shape)}"
                        )
                    corr.append((param, c))
            n = self.num_train
            x_train, y_train = self.train_tensors()
            last_loss = math.nan
            for _ in range(int(epochs)):
                order = torch.randperm(n, generator=generator)
                total = 0.0
                for start in range(0, n, bs):
                    idx = order[start : start + bs]
                    for param in params:
                        param.grad = None
                    loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
                    loss.backward()
                    for param, c in corr:
                        grad = param.grad
                        assert grad is not None  # backward() just filled it
                        grad.add_(c)
                    with torch.no_grad():
                        for param in params:
                            if param.grad is not None:
                                param.add_(param.grad, alpha=step)
                    total += float(loss.detach()) * int(idx.shape[0])
                last_loss = total / n
            for param in params:
                param.grad = None  # not kept between calls
        return model_to_arrays(model), n, last_loss

    def loss(self, weights: dict[str, np.ndarray]) -> float:
        """Mean cross-entropy of ``weights`` over the local TRAIN data (no grad).

        Parameters
        ----------
        weights : dict of str to np.ndarray
            Weights keyed like the model's ``state_dict``; not modified.

        Returns
        -------
        float
            The mean training loss ``f_{i,s}(w)``.
        """
        model = self._model(weights)
        loss, _ = loss_accuracy(model, *self.train_tensors(), self.batch_size)
        return loss

    def evaluate(self, weights: dict[str, np.ndarray]) -> tuple[float, float, int]:
        """Mean loss and accuracy of ``weights`` on the local test data.

        If the local test set is empty, the loss and accuracy are computed on the
        local TRAIN data instead (so the result is never NaN) and ``n`` is the
        number of training examples.

        Parameters
        ----------
        weights : dict of str to np.ndarray
            Weights keyed like the model's ``state_dict``; not modified.

        Returns
        -------
        tuple
            ``(loss, accuracy, n)`` with ``n`` the number of examples evaluated.
        """
        model = self._model(weights)
        x, y = self.eval_tensors()
        loss, acc = loss_accuracy(model, x, y, self.batch_size)
        return loss, acc, int(y.shape[0])


def torch_trainer_override(
    trainer: object, names: Sequence[str] = ("train", "loss", "evaluate")
) -> str:
    """The first of ``names`` whose :class:`TorchTrainer` method the class of
    ``trainer`` replaces; "" for none, and for an object that is not a
    TorchTrainer. The one test of a plain TorchTrainer: the batched path computes
    plain SGD and mean cross-entropy only for trainers that keep ``train``,
    ``loss`` and ``evaluate``, and reads packed rows only where they keep
    ``train_tensors`` and ``eval_tensors``."""
    if not isinstance(trainer, TorchTrainer):
        return ""
    cls = type(trainer)
    for name in names:
        if getattr(cls, name) is not getattr(TorchTrainer, name):
            return name
    return ""


def packed_rows(
    trainers: list[object], side: str
) -> tuple[torch.Tensor, torch.Tensor, list[int]] | None:
    """The data of ``trainers`` (``side`` "train": what :meth:`TorchTrainer.train_tensors`
    gives, "eval": :meth:`TorchTrainer.eval_tensors`) as one run of rows of the
    tensors they share: ``(inputs, labels, each trainer's rows)``, where every
    trainer is a :class:`TorchTrainer` that does not override those methods and
    their rows lie one after another in one packed tensor, in this order (the
    clients of a shard node; :func:`~mmfl_flwr.client.rows.packed`); otherwise
    None. No copy: views of the packed tensors."""
    if not trainers:
        return None
    plain: dict[type, bool] = {}
    rows: list[Rows] = []
    for tr in trainers:
        cls = type(tr)
        ok = plain.get(cls)
        if ok is None:
            ok = plain[cls] = isinstance(tr, TorchTrainer) and not torch_trainer_override(
                tr, ("train_tensors", "eval_tensors")
            )
        if not ok:
            return None
        rows.append(tr._train if side == "train" else tr._eval_rows())  # type: ignore[attr-defined]
    return packed(rows)
