"""Bring your own training code: turn a Flower quickstart's functions into the
MMFL ClientApp.

A Flower quickstart client has, per model, a ``train(net, trainloader, epochs,
lr, device)`` function returning the mean training loss and a ``test(net,
testloader, device)`` function returning ``(loss, accuracy)``, plus its data
loaders. :class:`FunctionTrainer` wraps them as one task's trainer (the
``LocalTrainer`` contract of :mod:`mmfl_flwr.client.contract`), and
:func:`client_app_from_functions` builds the ClientApp that answers every
message of the MMFL protocol (``docs/protocol.md``) from them::

    from mmfl_flwr import FunctionTrainer, client_app_from_functions

    def tasks(context):
        pid = int(context.node_config["partition-id"])
        return {"mnist": FunctionTrainer(Net, train, test, *load_mnist(pid)),
                "cifar": FunctionTrainer(CifarNet, train, test, *load_cifar(pid))}

    app = client_app_from_functions(tasks)

The loss query (``query.losses``, for the loss-based policies) runs ``loss_fn``
if given, else ``test`` on the *training* loader (a forward pass, no update).
SCAFFOLD's corrected steps need the gradient inside the loop and are not
available through a user's ``train`` (use :class:`~mmfl_flwr.client.trainer.TorchTrainer`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Context
from flwr.clientapp import ClientApp

from mmfl_flwr.client.app import ClientSpec, make_client_app
from mmfl_flwr.client.contract import LocalTrainer
from mmfl_flwr.client.trainer import default_device, load_arrays, model_to_arrays

Weights = dict[str, np.ndarray]
TrainFn = Callable[[torch.nn.Module, Any, int, float, torch.device], float]
TestFn = Callable[[torch.nn.Module, Any, torch.device], "tuple[float, float]"]


def _size(loader: Any) -> int:
    dataset = getattr(loader, "dataset", loader)
    return len(dataset)


class FunctionTrainer:
    """One task's trainer from quickstart-style functions.

    Parameters
    ----------
    model_fn : callable
        Returns a fresh ``torch.nn.Module`` (weights are loaded into it).
    train_fn : callable
        ``train_fn(net, trainloader, epochs, lr, device) -> mean training loss``;
        trains ``net`` in place.
    test_fn : callable
        ``test_fn(net, loader, device) -> (loss, accuracy)``; no update.
    trainloader, testloader
        The client's data (anything with ``.dataset`` or ``len()``); the number
        of training examples is ``len(trainloader.dataset)``.
    loss_fn : callable, optional
        ``loss_fn(net, trainloader, device) -> mean loss``; default: the loss of
        ``test_fn`` on the training loader.
    device : torch.device, optional
        Default: CUDA when available, else the CPU (``MMFL_DEVICE`` overrides).

    The batch size the server sends is not used: the loaders fix it. Each
    round's seed seeds torch and the training loader's own generator (if it has
    one), so one seed fixes the run.
    """

    def __init__(
        self,
        model_fn: Callable[[], torch.nn.Module],
        train_fn: TrainFn,
        test_fn: TestFn,
        trainloader: Any,
        testloader: Any,
        loss_fn: Callable[[torch.nn.Module, Any, torch.device], float] | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.model_fn, self.train_fn, self.test_fn, self.loss_fn = (
            model_fn,
            train_fn,
            test_fn,
            loss_fn,
        )
        self.trainloader, self.testloader = trainloader, testloader
        self.device = device or default_device()
        self._net: torch.nn.Module | None = None

    def _model(self, weights: Weights) -> torch.nn.Module:
        if self._net is None:  # one model per task and client, reused
            self._net = self.model_fn().to(self.device)
        load_arrays(self._net, weights)
        return self._net

    @property
    def num_examples(self) -> int:
        return _size(self.trainloader)

    @property
    def trainable_keys(self) -> list[str]:
        net = self._net if self._net is not None else self.model_fn()
        return [name for name, _ in net.named_parameters()]

    def train(
        self,
        weights: Weights,
        epochs: int,
        lr: float,
        seed: int,
        batch_size: int | None = None,
        **kwargs: Any,
    ) -> tuple[Weights, int, float]:
        if kwargs.get("correction") is not None:
            raise NotImplementedError(
                "SCAFFOLD's corrected local steps need the gradient inside the training "
                "loop; FunctionTrainer cannot add them to a user's train function (use "
                "TorchTrainer for scaffold)"
            )
        torch.manual_seed(int(seed))
        # a loader with its own generator shuffles from it: seed it too, so the
        # round's seed fixes the batch order
        for gen in {
            id(g): g
            for g in (
                getattr(self.trainloader, "generator", None),
                getattr(getattr(self.trainloader, "sampler", None), "generator", None),
            )
            if g is not None
        }.values():
            gen.manual_seed(int(seed))
        net = self._model(weights)
        net.train()
        loss = float(self.train_fn(net, self.trainloader, int(epochs), float(lr), self.device))
        return model_to_arrays(net), self.num_examples, loss

    def loss(self, weights: Weights) -> float:
        net = self._model(weights)
        net.eval()
        with torch.no_grad():
            if self.loss_fn is not None:
                return float(self.loss_fn(net, self.trainloader, self.device))
            return float(self.test_fn(net, self.trainloader, self.device)[0])

    def evaluate(self, weights: Weights) -> tuple[float, float, int]:
        net = self._model(weights)
        net.eval()
        with torch.no_grad():
            loss, accuracy = self.test_fn(net, self.testloader, self.device)
        return float(loss), float(accuracy), _size(self.testloader)


def client_app_from_functions(
    tasks: Callable[[Context], Mapping[str, LocalTrainer]],
    client_id: Callable[[Context], str] | None = None,
    processors: Callable[[Context], int] | None = None,
) -> ClientApp:
    """The MMFL ClientApp from a function of the node's context giving its
    trainers by task name (e.g. :class:`FunctionTrainer` objects).

    ``client_id(context)`` is the client's stable id (default: the node config's
    ``client-id``, else its ``partition-id``); ``processors(context)`` how many
    models it may train per round (default: the node config's ``processors``,
    else 1). Built once per node and run config, and reused."""

    def default_id(ctx: Context) -> str:
        cfg = ctx.node_config
        if "client-id" in cfg:
            return str(cfg["client-id"])
        if "partition-id" not in cfg:
            raise ValueError(
                "node config has neither 'client-id' nor 'partition-id'; "
                "pass client_id= to client_app_from_functions"
            )
        return str(cfg["partition-id"])

    def spec(ctx: Context) -> ClientSpec:
        procs = processors(ctx) if processors else int(ctx.node_config.get("processors", 1))
        return ClientSpec(
            client_id=(client_id or default_id)(ctx),
            trainers=dict(tasks(ctx)),
            processors=int(procs),
        )

    return make_client_app(spec)
