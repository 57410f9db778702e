"""Clients' examples as rows of tensors, and the one no-grad pass over them.

Both client paths read their data here: the per-client trainers
(:mod:`mmfl_flwr.client.trainer`) and the batched engine
(:mod:`mmfl_flwr.client.vectorized`).

- :class:`Rows`: one client's examples, a run of rows of tensors that the
  clients of a shard share (its packed arrays, :func:`whole_rows`);
- :func:`one_run`: the one reader of packed rows: whether spans lie one after
  another in one owner. :func:`packed` (clients' :class:`Rows`) and
  :func:`joined` (tensor views) use it to take many clients' rows as one view
  instead of a copy;
- :func:`forward_sums`: the one loss/accuracy pass, per-client sums of
  cross-entropy and correct predictions over rows owned by clients;
  :func:`loss_accuracy` is its one-client case.

Torch and numpy only (no Flower).
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Iterable, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from mmfl_flwr.tasks.data import Dataset

__all__ = [
    "Rows",
    "forward_sums",
    "joined",
    "loss_accuracy",
    "one_run",
    "owners",
    "packed",
    "whole_rows",
]

#: id of a packed array -> the tensor over all of it (while some view of it lives)
_BASE_TENSORS: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()


def whole_rows(a: np.ndarray) -> tuple[torch.Tensor, int]:
    """``(whole, first)``: a tensor sharing ``a``'s memory of which ``a`` is the
    rows ``first .. first + len(a)``: where ``a`` is a run of consecutive rows of
    a larger contiguous array (the packed data of many clients), one tensor
    over that whole array (one per array and process, while some client holds
    it); otherwise a tensor over ``a`` itself (``first`` 0)."""
    base = a.base
    if (
        isinstance(base, np.ndarray)
        and a.ndim >= 1
        and base.ndim == a.ndim
        and base.dtype == a.dtype
        and base.shape[1:] == a.shape[1:]
        and base.flags.c_contiguous
        and a.flags.c_contiguous
        and base.shape[0] > 0
    ):
        row = base.strides[0]
        first, rest = (
            divmod(a.__array_interface__["data"][0] - base.__array_interface__["data"][0], row)
            if row
            else (0, 1)
        )
        if rest == 0 and first >= 0 and first + a.shape[0] <= base.shape[0]:
            whole = _BASE_TENSORS.get(id(base))
            if whole is None or whole.data_ptr() != base.__array_interface__["data"][0]:
                whole = torch.from_numpy(base)
                _BASE_TENSORS[id(base)] = whole
            return whole, int(first)
    return torch.from_numpy(np.ascontiguousarray(a)), 0


class Rows:
    """One client's examples: rows ``xs .. xs + n`` of ``x`` and ``ys .. ys + n``
    of ``y``, tensors that the clients of a shard share (its packed data): a
    client keeps these three numbers and two references instead of tensor views
    of its own (about 1.9 kB a trainer at 100,000 clients; the views are made
    when asked for)."""

    __slots__ = ("x", "y", "xs", "ys", "n")

    def __init__(self, x: torch.Tensor, y: torch.Tensor, xs: int, ys: int, n: int) -> None:
        self.x, self.y, self.xs, self.ys, self.n = x, y, xs, ys, n

    @classmethod
    def of(cls, dataset: Dataset, dtype: torch.dtype, device: torch.device) -> Rows:
        """The rows of ``dataset`` (inputs in ``dtype``, labels int64) on ``device``:
        of the tensor over its packed array where no conversion is needed (CPU,
        float32 inputs); otherwise a converted copy of its own rows only."""
        n = len(dataset)
        sides = []
        for a, kind in (
            (np.asarray(dataset.x, dtype=np.float32), dtype),
            (np.asarray(dataset.y, dtype=np.int64), torch.int64),
        ):
            whole, first = whole_rows(a)
            if whole.dtype != kind or whole.device != device:
                whole, first = whole[first : first + n].to(device=device, dtype=kind), 0
            sides.append((whole, first))
        (x, xs), (y, ys) = sides
        return cls(x, y, xs, ys, n)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, labels)``: views of the shared tensors (or the tensors)."""
        x, y, n = self.x, self.y, self.n
        if self.xs or x.shape[0] != n:
            x = x[self.xs : self.xs + n]
        if self.ys or y.shape[0] != n:
            y = y[self.ys : self.ys + n]
        return x, y


# ------------------------------------------------------------- packed rows
def one_run(spans: Iterable[tuple[Hashable, int, int]]) -> tuple[int, int] | None:
    """``(first, end)`` of spans ``(owner, first, count)`` that lie one after
    another in one owner (equal keys), in their order; None otherwise and for
    no span at all."""
    run: tuple[Hashable, int, int] | None = None
    for owner, first, count in spans:
        if run is None:
            run = (owner, first, first)
        elif owner != run[0] or first != run[2]:
            return None
        run = (run[0], run[1], run[2] + count)
    return None if run is None else (run[1], run[2])


def packed(rows: Sequence[Rows]) -> tuple[torch.Tensor, torch.Tensor, list[int]] | None:
    """``(inputs, labels, each client's rows)`` as views of the tensors the
    clients share, where their rows lie one after another in them in this
    order (the clients of a shard node); otherwise None."""
    xs = one_run((id(r.x), r.xs, r.n) for r in rows)
    ys = one_run((id(r.y), r.ys, r.n) for r in rows) if xs is not None else None
    if xs is None or ys is None:
        return None
    return rows[0].x[xs[0] : xs[1]], rows[0].y[ys[0] : ys[1]], [r.n for r in rows]


def joined(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)``, without the copy where the parts already lie one
    after another in one storage (the packed data of a shard's clients, in
    their order): then a view of those rows."""
    first = parts[0]
    alike = all(
        p.is_contiguous() and p.dtype == first.dtype and p.shape[1:] == first.shape[1:]
        for p in parts
    )
    run = (
        one_run((p.untyped_storage().data_ptr(), int(p.storage_offset()), p.numel()) for p in parts)
        if alike
        else None
    )
    if run is None:
        return torch.cat(list(parts))
    rows = sum(int(p.shape[0]) for p in parts)
    # set_(storage, offset, size) takes contiguous strides; torch's stubs list only
    # the form with explicit strides
    return first.new_empty(
        0
    ).set_(  # type: ignore[call-overload]
        first.untyped_storage(), run[0], (rows, *first.shape[1:])
    )


def owners(counts: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's client (position in ``counts``) and each client's first row,
    for clients of ``counts`` rows one after another."""
    n = torch.tensor(counts, dtype=torch.long, device=device)
    return (
        torch.repeat_interleave(torch.arange(len(counts), device=device), n),
        torch.cumsum(n, 0) - n,
    )


# ------------------------------------------------------ the loss/accuracy pass
@torch.no_grad()
def forward_sums(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    rows: int,
    owner: torch.Tensor | None = None,
    clients: int = 1,
    copy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-client summed cross-entropy and correct predictions (float64, one
    entry per client) of ``model`` in eval mode on ``(x, y)``: one no-grad
    forward, ``rows`` samples at a time.

    ``owner`` gives each row's client (of ``clients``); None: every row is one
    client's. One client's batch losses are summed by the loss kernel and added
    in float64, the sums the per-client path has always reported; rows of many
    clients need their per-sample losses, added to their clients' sums in
    float64 (equal up to float32 rounding). ``copy``: the model gets a copy of
    each batch (for inputs that are the clients' own memory, against a model
    that writes into its input)."""
    model.eval()
    loss_sum = torch.zeros(clients, dtype=torch.float64, device=x.device)
    correct = torch.zeros(clients, dtype=torch.float64, device=x.device)
    for start in range(0, int(y.shape[0]), rows):
        xb = x[start : start + rows]
        if copy:
            xb = xb.clone()
        yb = y[start : start + rows]
        logits = model(xb)
        hits = (logits.argmax(dim=1) == yb).double()
        if owner is None:
            loss_sum += F.cross_entropy(logits, yb, reduction="sum").double()
            correct += hits.sum()
        else:
            ob = owner[start : start + rows]
            loss_sum.index_add_(0, ob, F.cross_entropy(logits, yb, reduction="none").double())
            correct.index_add_(0, ob, hits)
    return loss_sum, correct


def loss_accuracy(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on one client's ``(x, y)``
    (non-empty): :func:`forward_sums` of that one client."""
    n = int(y.shape[0])
    loss_sum, correct = forward_sums(model, x, y, batch_size)
    return float(loss_sum[0]) / n, float(correct[0]) / n
