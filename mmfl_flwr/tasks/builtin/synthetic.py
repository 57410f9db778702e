"""The FedProx Synthetic kinds: client ``k`` is Synthetic(1, 1) user ``k``,
generated locally (no data root), each copy with its own generator seed.

* ``synthetic``: 60 dims, 5 classes; ``synthetic-b``: 30 dims, 10 classes (paper
  004's second model);
* ``synthetic-iid`` / ``synthetic-iid-b``: FedProx's Synthetic-IID, one shared
  model for all users, ``x ~ N(0, diag(j^-1.2))``.

The model is a multinomial logistic regression. Under a profile with high-data
clients, the low-data users keep ``1 / high_data_ratio`` of their training
samples. A process that needs some clients' data only (a shard node) generates
only those users.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from mmfl_flwr.tasks.data import Dataset, concat_datasets, packed_synthetic_users, synthetic_users
from mmfl_flwr.tasks.labelled import empty_like, stream_seed
from mmfl_flwr.tasks.packed import PackedUsers, trim_heap
from mmfl_flwr.tasks.registry import register_task
from mmfl_flwr.tasks.spec import Built, KindSpec, TaskBuild

#: Synthetic(alpha, beta) parameters of the ``"synthetic"`` kinds.
SYNTHETIC_ALPHA = 1.0
SYNTHETIC_BETA = 1.0

#: kind -> (its spec, its own stream number, whether it is Synthetic-IID)
_KINDS = {
    "synthetic": (KindSpec(5, (60,), "logreg"), 2, False),
    "synthetic-b": (KindSpec(10, (30,), "logreg"), 3, False),
    "synthetic-iid": (KindSpec(5, (60,), "logreg"), 4, True),
    "synthetic-iid-b": (KindSpec(10, (30,), "logreg"), 5, True),
}
#: The Synthetic kinds (generated locally by the FedProx generator).
SYNTHETIC_KINDS = tuple(_KINDS)


def _model(spec: KindSpec) -> Any:
    """A fresh logistic regression for ``spec``."""
    from mmfl_flwr.tasks.models import LogisticRegression

    dim = 1
    for s in spec.input_shape:
        dim *= s
    return LogisticRegression(dim, spec.num_classes)


def _build(spec: KindSpec, stream: int, iid: bool, req: TaskBuild) -> Built:
    """Per-client data and server test set for one copy of a synthetic task.
    With high-data clients, the other (low-data) users keep ``1 / ratio`` of
    their training samples.

    ``req.clients`` (None for all) and ``req.server_tests`` choose what is
    built: the other clients get the shared empty dataset, and without the
    server test set it is empty. Every user depends only on ``(seed, k)``, so a
    shard generates its own users only; the server's test set (every user's
    test split) and the low-data subsets (one stream drawn user after user) take
    a pass over all users that keeps only what is asked for."""
    num_clients, keep, server, eligible = (
        req.num_clients,
        req.clients,
        req.server_tests,
        req.eligible,
    )
    high = req.high
    stream_seq = stream_seed(req.seed, stream, req.copy)
    options: dict[str, Any] = dict(
        dim=spec.input_shape[0],
        num_classes=spec.num_classes,
        seed=int(stream_seq.generate_state(1, dtype=np.uint32)[0]),
        iid=iid,
        max_samples=req.max_synthetic_samples,
    )
    empty = empty_like(spec)
    if keep is not None and not server and (high is None or not keep):
        # no pass over the others needed: generated straight into the packed arrays
        ids = sorted(k for k in keep if eligible[k])
        packed = packed_synthetic_users(
            SYNTHETIC_ALPHA, SYNTHETIC_BETA, num_clients, ids, **options
        )
        trim_heap()
        return PackedUsers(num_clients, ids, packed, (empty, empty)), empty, eligible
    users, server_test, sizes = _generate(num_clients, keep, server, empty, options)
    if high is not None and (keep is None or keep):
        rng = np.random.default_rng(stream_seq.spawn(1)[0])
        for k in range(num_clients):
            if not high[k]:
                keep_n = max(1, int(np.ceil(sizes[k] / req.profile.high_data_ratio)))
                order = np.sort(rng.permutation(sizes[k])[:keep_n])
                if keep is None or k in keep:
                    tr, te = users[k]
                    users[k] = (tr.subset(order), te)
    held = [k for k in (sorted(keep) if keep is not None else range(num_clients)) if eligible[k]]
    packed_users = PackedUsers.from_users(
        num_clients, held, [users[k] for k in held], (empty, empty)
    )
    trim_heap()
    return packed_users, server_test, eligible


def _generate(
    num_clients: int,
    keep: frozenset[int] | None,
    server: bool,
    empty: Dataset,
    options: dict[str, Any],
) -> tuple[list[tuple[Dataset, Dataset]], Dataset, list[int]]:
    """The users asked for (``keep``, None: all; the others ``empty``), the
    server's test set (empty without ``server``) and every user's training-set
    size."""
    if keep is None:
        users = synthetic_users(SYNTHETIC_ALPHA, SYNTHETIC_BETA, num_clients, **options)
        return users, concat_datasets([te for _, te in users]), [len(tr) for tr, _ in users]
    users = [(empty, empty)] * num_clients
    tests: list[Dataset] = []
    sizes: list[int] = []
    for k in range(num_clients):  # one pass over every user, keeping what is asked for
        ((tr, te),) = synthetic_users(
            SYNTHETIC_ALPHA, SYNTHETIC_BETA, num_clients, ids=[k], **options
        )
        if server:
            tests.append(Dataset(te.x.copy(), te.y.copy()))
        if k in keep:
            users[k] = (tr, te)
        sizes.append(len(tr))
    return users, (concat_datasets(tests) if server else empty), sizes


for _name, (_spec, _stream, _iid) in _KINDS.items():
    register_task(
        _name,
        model_fn=partial(_model, _spec),
        build=partial(_build, _spec, _stream, _iid),
        spec=_spec,
        description=f"FedProx Synthetic{'-IID' if _iid else '(1, 1)'}: "
        f"{_spec.input_shape[0]} dims, {_spec.num_classes} classes",
        builtin=True,
    )
