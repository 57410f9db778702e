"""Many clients of one model at once: batched loss queries, evaluation and local
training with ``torch.func`` (framework-free: torch and numpy only, no Flower).

The per-client path (:class:`~mmfl_flwr.client.trainer.TorchTrainer`) trains one
client at a time. Here the clients that train the same model in a round train
together: their weights are stacked along a leading client axis, one ``vmap``
forward computes every client's loss on its own mini-batch, and one backward pass
of their sum gives every client's own gradient.
What each client computes is exactly what :meth:`TorchTrainer.train` computes:

* the same mini-batch order: a ``torch.Generator`` seeded with the client's
  training seed draws ``randperm(n_i)`` at every epoch;
* plain SGD with the same learning rate, batch size and number of epochs; the
  mini-batch loss is the mean cross-entropy over the client's real samples;
* unequal dataset sizes: an epoch runs as many steps as the largest client
  needs; a client whose batches are exhausted is masked out (its samples get
  weight 0 and its update is multiplied by 0), which is what "it stopped" means;
* models with state buffers (batch norm) keep per-client buffers; since batch
  norm sees every sample of a batch, those models never pad: at each step the
  clients are grouped by their actual batch length and each group runs its own
  ``vmap`` call;
* the reported training loss is the mean per-example loss of the last epoch.

Loss queries and evaluation run one no-grad forward over the concatenated data
of all clients (in chunks) and reduce per client.

The results equal the per-client path's up to floating-point summation order
(checked per model of the zoo in ``tests/engines/test_vectorized.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn import functional as F

from mmfl_flwr.client.rows import forward_sums, joined, owners
from mmfl_flwr.client.weights import check_weight_keys

__all__ = [
    "ClientData",
    "PackedData",
    "TrainJob",
    "VectorModel",
    "batched_evaluate",
    "batched_losses",
    "batched_train",
    "default_chunk",
]

Weights = dict[str, np.ndarray]


@dataclass
class ClientData:
    """One client's tensors for one model (already on the compute device)."""

    x: torch.Tensor
    y: torch.Tensor

    @property
    def n(self) -> int:
        """Number of samples."""
        return int(self.y.shape[0])


@dataclass
class PackedData:
    """Several clients' data one after another (a shard's packed rows): client
    ``i`` holds ``counts[i]`` (>= 1) consecutive rows of ``x`` and ``y``, which
    may be views of the clients' own memory (never modified)."""

    x: torch.Tensor
    y: torch.Tensor
    counts: list[int]

    def __len__(self) -> int:
        return len(self.counts)


@dataclass
class TrainJob:
    """One client's local training in a batched call."""

    data: ClientData
    #: the client's training seed (``training_seed(seed, round, client, task)``)
    seed: int


def unsupported_reason(model: nn.Module, device_type: str) -> str | None:
    """Why ``model`` cannot be trained batched on ``device_type``, or None.

    ``nn.LSTM`` on CUDA: cuDNN's fused kernel reads its weights' storage, which
    ``vmap`` does not have (on the CPU, PyTorch's fallback loops inside ``vmap``:
    correct, not faster)."""
    if any(hasattr(m, "unfused") for m in model.modules()):
        return None  # it computes its recurrence step by step when asked
    if device_type == "cuda" and any(isinstance(m, nn.RNNBase) for m in model.modules()):
        return f"{type(model).__name__} (nn.LSTM/GRU/RNN) does not run under vmap on CUDA"
    return None


class VectorModel:
    """A model architecture prepared for functional, batched calls.

    Parameters
    ----------
    model_fn : callable
        Builds the model (its initialisation is never used; the caller's
        global torch RNG is left untouched).
    device : torch.device
        Where the computation runs.
    """

    def __init__(self, model_fn: Callable[[], nn.Module], device: torch.device) -> None:
        with torch.random.fork_rng(devices=[]):
            self.base = model_fn().to(device)
        self.device = device
        state = self.base.state_dict()
        self.keys = list(state)
        self.param_keys = [n for n, p in self.base.named_parameters() if p.requires_grad]
        self.buffer_keys = [k for k in self.keys if k not in set(self.param_keys)]
        #: state buffers that change in train mode (batch norm): no padding then
        self.has_state = any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.base.modules()
        )
        #: recurrent layers step by step under vmap (on CUDA, where the fused cuDNN
        #: kernel cannot be batched; on the CPU PyTorch's fallback for the fused
        #: kernel is faster)
        self.step_by_step = device.type == "cuda"
        #: how training takes the clients' gradients, per ``step_by_step`` value:
        #: "autograd" (of the sum of their losses through the vmapped forward) or
        #: "functorch" (vmap(grad)), found at the first training step
        self.grad_modes: dict[bool, str] = {}
        #: why this model cannot be trained batched here (None: it can)
        self.unsupported = unsupported_reason(self.base, device.type)
        self.dtypes = {k: v.dtype for k, v in state.items()}
        self.loss_cache = _ConcatCache()
        self.eval_cache = _ConcatCache()
        self.shapes = {k: tuple(v.shape) for k, v in state.items()}

    def tensors(self, weights: Weights) -> dict[str, torch.Tensor]:
        """``weights`` as tensors on the device (strict keys and shapes)."""
        check_weight_keys(self.shapes, weights)
        return {
            k: torch.as_tensor(np.asarray(weights[k]), dtype=self.dtypes[k]).to(self.device)
            for k in self.keys
        }

    def load(self, weights: Weights) -> nn.Module:
        """The base module holding ``weights`` (for no-grad passes)."""
        self.base.load_state_dict(self.tensors(weights), strict=True)
        return self.base


def default_chunk(device: torch.device, per_client_bytes: int) -> int:
    """How many clients to train in one batched call: on a GPU, as many as fit in
    half of the free memory; on the CPU, 64 (larger chunks stop paying off once
    the cores are busy)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return max(1, int(0.5 * free) // max(1, per_client_bytes))
    return 64


@torch.no_grad()
def _concat(
    datasets: Sequence[ClientData],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The clients' data one after another: inputs, labels, each sample's client
    (position in ``datasets``) and each client's first row."""
    owner, offsets = owners([d.n for d in datasets], datasets[0].x.device)
    return (joined([d.x for d in datasets]), joined([d.y for d in datasets]), owner, offsets)


class _ConcatCache:
    """The last concatenation of a list of clients' data: a loss query asks for
    the same clients round after round (LVR asks every client)."""

    def __init__(self) -> None:
        self._key: list[torch.Tensor] = []
        self._value: tuple[torch.Tensor, ...] = ()

    def get(self, datasets: Sequence[ClientData]) -> tuple[torch.Tensor, ...]:
        """The concatenation of ``datasets``, reused while their tensors are the
        same objects or views of the same memory (a client's data tensors never
        change during a run)."""
        key = [t for d in datasets for t in (d.x, d.y)]
        if len(key) != len(self._key) or any(
            a is not b and not _same_view(a, b) for a, b in zip(key, self._key)
        ):
            self._key, self._value = key, _concat(datasets)
        return self._value


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` shows the same memory as ``b`` the same way (a fresh view of
    the same rows: a trainer makes one per call). ``b`` is held by the cache, so
    its memory cannot be freed and reused by another tensor meanwhile."""
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.dtype == b.dtype
        and a.stride() == b.stride()
        and a.device == b.device
    )


def _forward_rows(
    model: nn.Module,
    datasets: Sequence[ClientData] | PackedData,
    rows: int,
    cache: _ConcatCache | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-client summed cross-entropy and correct predictions (float64) of one
    no-grad forward over the concatenated data, ``rows`` samples at a time
    (:func:`~mmfl_flwr.client.rows.forward_sums`)."""
    if isinstance(datasets, PackedData):
        x_all, y_all = datasets.x, datasets.y
        owner, _ = owners(datasets.counts, y_all.device)
        shared = True
    else:
        x_all, y_all, owner, _ = cache.get(datasets) if cache is not None else _concat(datasets)
        # the clients' own memory where joined() made no copy: a model that writes
        # into its input (an in-place first activation) gets a copy of each batch
        shared = x_all.data_ptr() == datasets[0].x.data_ptr()
    return forward_sums(model, x_all, y_all, rows, owner, len(datasets), copy=shared)


def _counts(datasets: Sequence[ClientData] | PackedData) -> list[int]:
    if isinstance(datasets, PackedData):
        return datasets.counts
    return [d.n for d in datasets]


def batched_losses(
    vm: VectorModel,
    weights: Weights,
    datasets: Sequence[ClientData] | PackedData,
    rows: int = 8192,
) -> list[float]:
    """Mean cross-entropy of ``weights`` on each client's data (a loss query).

    Parameters
    ----------
    vm : VectorModel
        The model architecture.
    weights : dict of str to np.ndarray
        One model's weights, the same for every client.
    datasets : sequence of ClientData, or PackedData
        Each client's (non-empty) training data.
    rows : int
        Samples per forward pass.

    Returns
    -------
    list of float
        ``f_i(w)`` per client, in the order of ``datasets``.
    """
    if not len(datasets):
        return []
    model = vm.load(weights)
    loss_sum, _ = _forward_rows(model, datasets, rows, vm.loss_cache)
    n = torch.tensor(_counts(datasets), dtype=torch.float64, device=loss_sum.device)
    return (loss_sum / n).cpu().tolist()  # (not a tensor per client: 100,000 cost 0.5 s)


def batched_evaluate(
    vm: VectorModel,
    weights: Weights,
    datasets: Sequence[ClientData] | PackedData,
    rows: int = 8192,
) -> list[tuple[float, float, int]]:
    """``(loss, accuracy, n)`` of ``weights`` on each client's data."""
    if not len(datasets):
        return []
    model = vm.load(weights)
    loss_sum, correct = _forward_rows(model, datasets, rows, vm.eval_cache)
    return [
        (lo / n, c / n, n)
        for lo, c, n in zip(loss_sum.cpu().tolist(), correct.cpu().tolist(), _counts(datasets))
    ]


def _schedule(
    jobs: Sequence[TrainJob], epochs: int, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Every client's mini-batch indices for every step, the same draws as
    :meth:`TorchTrainer.train`.

    Returns ``index`` of shape ``(epochs, steps, clients, batch)`` (padding
    entries are 0), ``count`` of shape ``(epochs, steps, clients)`` (the real
    batch length; 0 once a client has no batch left in the epoch) and ``steps``
    (the most steps any client takes per epoch).
    """
    c = len(jobs)
    steps = max(-(-j.data.n // batch_size) for j in jobs)
    width = min(batch_size, max(j.data.n for j in jobs))
    index = torch.zeros((epochs, steps, c, width), dtype=torch.long)
    count = torch.zeros((epochs, steps, c), dtype=torch.long)
    for ci, job in enumerate(jobs):
        n = job.data.n
        gen = torch.Generator().manual_seed(int(job.seed))
        for e in range(epochs):
            order = torch.randperm(n, generator=gen)
            for s, start in enumerate(range(0, n, batch_size)):
                idx = order[start : start + batch_size]
                index[e, s, ci, : idx.shape[0]] = idx
                count[e, s, ci] = idx.shape[0]
    return index, count, steps


@contextmanager
def _step_by_step_recurrences(model: nn.Module, enabled: bool) -> Iterator[None]:
    """With ``enabled``, modules with an ``unfused`` switch
    (:class:`~mmfl_flwr.tasks.zoo.CharLSTM`) compute their recurrence step by step
    inside: ``vmap`` batches that on CUDA, not the fused cuDNN kernel."""
    switches: list[Any] = [m for m in model.modules() if hasattr(m, "unfused")] if enabled else []
    for m in switches:
        m.unfused = True
    try:
        yield
    finally:
        for m in switches:
            m.unfused = False


def _step_function(vm: VectorModel) -> Callable[..., Any]:
    """``step(params, buffers, xb, yb, mb) -> (grads, losses)``: every client's
    gradient and loss of its masked mean cross-entropy on its batch, by autograd
    through the vmapped forward or, for a model whose ops lack a batching rule
    there, by functorch's grad (found at the model's first step)."""
    base = vm.base

    def loss_fn(p, b, xb, yb, mb):  # one client's masked mean cross-entropy
        logits = functional_call(base, (p, b), (xb,))
        per = F.cross_entropy(logits, yb, reduction="none")
        total = (per * mb).sum()
        return total / mb.sum().clamp(min=1.0)

    batched_loss = vmap(loss_fn, in_dims=(0, 0, 0, 0, 0), randomness="same")

    def autograd_step(p, b, xb, yb, mb):
        # Client c's loss depends only on its own slice of the stacked weights,
        # so the gradient of the sum of the clients' losses is every client's own
        # gradient. Plain autograd through the vmapped forward gives the same
        # numbers as vmap(grad(...)) up to float rounding, without functorch's
        # grad transform, whose first call imports torch._dynamo (~2 CPU-s in
        # every fresh process: each Ray worker and each deployed ClientApp message).
        with torch.enable_grad():  # as functorch's grad, also under an outer no_grad
            leaves = {k: v.detach().requires_grad_(True) for k, v in p.items()}
            losses = batched_loss(leaves, b, xb, yb, mb)
            if not leaves:  # nothing trainable
                return {}, losses.detach()
            found = torch.autograd.grad(losses.sum(), list(leaves.values()), allow_unused=True)
        grads = {k: torch.zeros_like(leaves[k]) if g is None else g for k, g in zip(leaves, found)}
        return grads, losses.detach()

    def with_loss(p, b, xb, yb, mb):
        loss = loss_fn(p, b, xb, yb, mb)
        return loss, loss.detach()

    functorch_steps: list[Callable[..., Any]] = []

    def functorch_step(p, b, xb, yb, mb):
        if not functorch_steps:  # built once per chunk, on first use
            from torch.func import grad

            functorch_steps.append(
                vmap(grad(with_loss, has_aux=True), in_dims=(0, 0, 0, 0, 0), randomness="same")
            )
        return functorch_steps[0](p, b, xb, yb, mb)

    def step_fn(p, b, xb, yb, mb):
        mode = vm.grad_modes.get(vm.step_by_step)
        if mode == "functorch":
            return functorch_step(p, b, xb, yb, mb)
        if mode == "autograd":
            return autograd_step(p, b, xb, yb, mb)
        # first step of this model: an op without a batching rule under plain
        # autograd (the fused kernels of nn.LSTM/GRU/RNN and nn.LSTMCell, which
        # PyTorch loops over inside vmap only under functorch's grad) takes
        # functorch's grad; the attempt runs on copies of the buffers, which the
        # forward updates in place
        trial = {k: v.clone() for k, v in b.items()}
        try:
            out = autograd_step(p, trial, xb, yb, mb)
        except RuntimeError as err:
            if "Batching rule not implemented" not in str(err):
                raise
            vm.grad_modes[vm.step_by_step] = "functorch"
            return functorch_step(p, b, xb, yb, mb)
        vm.grad_modes[vm.step_by_step] = "autograd"
        with torch.no_grad():
            for k, v in trial.items():
                b[k].copy_(v)
        return out

    return step_fn


def _train_chunk(
    vm: VectorModel,
    start: dict[str, torch.Tensor],
    jobs: Sequence[TrainJob],
    epochs: int,
    lr: float,
    batch_size: int,
) -> list[tuple[Weights, int, float]]:
    """Local training of the clients of one batched call (their weights stacked)."""
    c = len(jobs)
    device = vm.device
    index, count, steps = _schedule(jobs, epochs, batch_size)
    index = index.to(device)
    count = count.to(device)
    x_all, y_all, _, offsets = _concat([j.data for j in jobs])
    # rows of x_all: each client's indices shifted to its first row (padding
    # entries point at the client's first sample, masked out)
    index = index + offsets.view(1, 1, -1, 1)
    params = {k: start[k].unsqueeze(0).repeat(c, *([1] * start[k].dim())) for k in vm.param_keys}
    buffers = {k: start[k].unsqueeze(0).repeat(c, *([1] * start[k].dim())) for k in vm.buffer_keys}
    vm.base.train()
    step_fn = _step_function(vm)  # one per chunk
    last_total = torch.zeros(c, dtype=torch.float64, device=device)
    for e in range(epochs):
        for s in range(steps):
            cnt = count[e, s]
            idx = index[e, s]
            if vm.has_state:
                # no padding: one call per group of equal batch length
                for length in torch.unique(cnt[cnt > 0]).tolist():
                    members = torch.nonzero(cnt == length).flatten()
                    sel = idx[members, :length]
                    xb, yb = x_all[sel], y_all[sel]
                    mb = torch.ones(yb.shape, dtype=x_all.dtype, device=device)
                    p = {k: v.index_select(0, members) for k, v in params.items()}
                    b = {k: v.index_select(0, members) for k, v in buffers.items()}
                    grads, loss = step_fn(p, b, xb, yb, mb)
                    with torch.no_grad():
                        for k in params:
                            params[k].index_copy_(0, members, p[k] - lr * grads[k])
                        for k in buffers:
                            buffers[k].index_copy_(0, members, b[k])
                        if e == epochs - 1:
                            last_total.index_add_(0, members, loss.double() * length)
            else:
                width = int(cnt.max())
                sel = idx[:, :width]
                xb, yb = x_all[sel], y_all[sel]
                mb = torch.arange(width, device=device).unsqueeze(0) < cnt.unsqueeze(1)
                mb = mb.to(x_all.dtype)
                grads, loss = step_fn(params, buffers, xb, yb, mb)
                active = (cnt > 0).to(x_all.dtype)
                with torch.no_grad():
                    for k in params:
                        g = grads[k] * active.view(-1, *([1] * (grads[k].dim() - 1)))
                        params[k].sub_(lr * g)
                    if e == epochs - 1:
                        last_total += loss.double() * cnt.double()
    out = []
    for ci, job in enumerate(jobs):
        w: Weights = {}
        for k in vm.keys:
            t = params[k][ci] if k in params else buffers[k][ci]
            w[k] = t.detach().cpu().numpy().copy()
        out.append((w, job.data.n, float(last_total[ci]) / job.data.n))
    return out


#: padded work allowed per batched call, as a multiple of the real work, per device
#: type (see :func:`chunks_by_size`). On a GPU fewer and larger calls win even with
#: padding; on CPU cores padding costs compute. ``benchmarks/bench_vectorized.py
#: --waste`` measures it (its GPU output: docs/results/bench_vectorized_h200.txt).
DEFAULT_WASTE = {"cpu": 1.5, "cuda": math.inf}


def chunks_by_size(
    sizes: Sequence[int], batch_size: int, chunk: int, waste: float = 1.5
) -> list[list[int]]:
    """Split clients (indices into ``sizes``) into batched calls of at most ``chunk``
    clients, clients of similar size together: sorted by size, a client opens a new
    call when adding it would make the padded work of the call (clients × steps ×
    batch width of the largest) exceed ``waste`` times its real work (the samples).
    Without this, one high-data client (10× the samples under the paper-003 profile)
    would make every client of its call compute on padding."""
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    out: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        n = max(1, int(sizes[i]))
        steps = -(-n // batch_size)
        width = min(batch_size, n)
        padded = (len(current) + 1) * steps * width
        if current and (len(current) >= chunk or padded > waste * (real + n)):
            out.append(current)
            current, real = [], 0
        current.append(i)
        real += n
    if current:
        out.append(current)
    return out


def batched_train(
    vm: VectorModel,
    weights: Weights,
    jobs: Sequence[TrainJob],
    epochs: int,
    lr: float,
    batch_size: int,
    chunk: int | None = None,
    waste: float | None = None,
) -> list[tuple[Weights, int, float]]:
    """Local training of several clients from the same starting weights.

    Parameters
    ----------
    vm : VectorModel
        The model architecture.
    weights : dict of str to np.ndarray
        The starting (global) weights.
    jobs : sequence of TrainJob
        Each client's data and training seed.
    epochs, lr, batch_size
        As :meth:`TorchTrainer.train`.
    chunk : int, optional
        Clients per batched call (default: :func:`default_chunk`).
    waste : float, optional
        Padded work allowed per call, as a multiple of the real work
        (:func:`chunks_by_size`; default :data:`DEFAULT_WASTE` of the device).

    Returns
    -------
    list of (weights, n, train_loss)
        Per job, what :meth:`TorchTrainer.train` returns for it.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not jobs:
        return []
    start = vm.tensors(weights)
    if chunk is None:
        n_max = max(j.data.n for j in jobs)
        sample = jobs[0].data.x[0].numel() * jobs[0].data.x.element_size()
        model_bytes = sum(v.numel() * v.element_size() for v in start.values())
        # weights, gradients, activations of one batch (a rough 64 floats per input value)
        per_client = 4 * model_bytes + n_max * sample + 64 * min(batch_size, n_max) * sample
        chunk = default_chunk(vm.device, per_client)
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    results: list[tuple[Weights, int, float] | None] = [None] * len(jobs)
    with _step_by_step_recurrences(vm.base, vm.step_by_step):
        if waste is None:
            waste = DEFAULT_WASTE.get(vm.device.type, 1.5)
        for part in chunks_by_size([j.data.n for j in jobs], batch_size, chunk, waste):
            for i, res in zip(
                part, _train_chunk(vm, start, [jobs[i] for i in part], epochs, lr, batch_size)
            ):
                results[i] = res
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]
