"""Hostile clients for robustness tests: wrappers around a ClientApp callable that
make one client lie in a way that passes the shape checks.

Each attack is a function ``attack(app) -> app`` over the callable
``app(message, context) -> reply`` (a :class:`flwr.clientapp.ClientApp` or a
wrapper of one). Pass it to :func:`mmfl_flwr.runner.run_inprocess`
(``wrap_client_app=``) or wrap the callable given to
:class:`~mmfl_flwr.grid.InProcessGrid`. The hostile client is chosen by its
partition id (the ``partition-id`` of its node config) or by ``cid``.

numpy and flwr only (torch for label flipping); the honest client does all the training.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, Context, Message

from mmfl_flwr import protocol as P

ClientCall = Callable[[Message, Context], Message]
Attack = Callable[[ClientCall], ClientCall]
#: ``fn(task, update, message, context) -> new update`` of :func:`rewrite_update`
UpdateRewrite = Callable[[str, dict[str, np.ndarray], Message, Context], dict[str, np.ndarray]]


def _cid(ctx: Context) -> str:
    cfg = ctx.node_config
    return str(cfg.get("cid", cfg.get("client-id", cfg.get("partition-id"))))


def _is(ctx: Context, who: str) -> bool:
    return _cid(ctx) == str(who)


def _on(kind: str, who: str, rewrite: Callable[[Message, Message, Context], None]) -> Attack:
    """Rewrite ``who``'s replies to messages of type ``kind`` in place."""

    def attack(app: ClientCall) -> ClientCall:
        def call(msg: Message, ctx: Context) -> Message:
            reply = app(msg, ctx)
            if _is(ctx, who) and msg.metadata.message_type == kind and reply.has_content():
                rewrite(msg, reply, ctx)
            return reply

        return call

    return attack


def huge_weights(who: str, value: float = 1e30) -> Attack:
    """``who`` returns ``value`` in every entry of every model it trains."""

    def rewrite(msg: Message, reply: Message, ctx: Context) -> None:
        for key, rec in reply.content.array_records.items():
            if P.task_of(key, P.ARRAYS_PREFIX) is None:
                continue
            for name in list(rec.keys()):
                a = rec[name].numpy()
                if a.dtype.kind == "f":
                    rec[name] = Array(np.full(a.shape, value, dtype=a.dtype))

    return _on("train", who, rewrite)


def _who(who: str | Collection[str]) -> list[str]:
    return [str(who)] if isinstance(who, (str, int)) else [str(w) for w in who]


def rewrite_update(
    who: str | Collection[str], fn: UpdateRewrite, tasks: Collection[str] | None = None
) -> Attack:
    """``who`` (one id, or several colluders) replaces its honest update of
    every model it trains (or of ``tasks`` only) by ``fn(task, update, msg, ctx)``;
    ``update`` maps each floating-point entry name to ``w_local - w_global``
    (float64), and ``fn`` returns the new one (same names and shapes). The
    other entries of the reply are left as trained."""
    names = set(_who(who))

    def attack(app: ClientCall) -> ClientCall:
        def call(msg: Message, ctx: Context) -> Message:
            reply = app(msg, ctx)
            if not (
                any(_is(ctx, w) for w in names)
                and msg.metadata.message_type == "train"
                and reply.has_content()
            ):
                return reply
            for key, rec in reply.content.array_records.items():
                task = P.task_of(key, P.ARRAYS_PREFIX)
                if task is None or (tasks is not None and task not in tasks):
                    continue
                glob = {
                    n: glob_arr.numpy() for n, glob_arr in msg.content.array_records[key].items()
                }
                local = {n: arr.numpy() for n, arr in rec.items()}
                update = {
                    n: a.astype(np.float64) - glob[n].astype(np.float64)
                    for n, a in local.items()
                    if a.dtype.kind == "f"
                }
                new = fn(task, update, msg, ctx)
                for n in update:
                    rec[n] = Array((glob[n].astype(np.float64) + new[n]).astype(glob[n].dtype))
            return reply

        return call

    return attack


def _norm(update: Mapping[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(float(np.square(a).sum()) for a in update.values())))


def scaled_update(who: str, factor: float, tasks: Collection[str] | None = None) -> Attack:
    """``who`` returns ``w_global + factor * (w_local - w_global)``: its honest
    update ``factor`` times larger (or reversed, with a negative factor: a sign
    flip), for every model it trains or for ``tasks`` only."""
    return rewrite_update(
        who, lambda task, u, msg, ctx: {n: factor * a for n, a in u.items()}, tasks
    )


def gaussian_update(
    who: str, scale: float = 10.0, seed: int = 0, tasks: Collection[str] | None = None
) -> Attack:
    """``who`` returns Gaussian noise as its update, with ``scale`` times the
    norm of its honest update (the Gaussian attack of the robust-FL
    benchmarks); ``seed`` fixes the noise."""
    rng = np.random.default_rng(seed)

    def fn(
        task: str, u: dict[str, np.ndarray], msg: Message, ctx: Context
    ) -> dict[str, np.ndarray]:
        noise = {n: rng.standard_normal(a.shape) for n, a in u.items()}
        size = _norm(noise)
        return {n: a * (scale * _norm(u) / size) if size else a for n, a in noise.items()}

    return rewrite_update(who, fn, tasks)


def _this_round(
    store: dict[str, tuple[str, list[dict[str, np.ndarray]]]], task: str, msg: Message
) -> list[dict[str, np.ndarray]]:
    """The colluders' updates of ``task`` in the round of ``msg`` (its group id),
    forgetting earlier rounds."""
    rnd = msg.metadata.group_id
    if task not in store or store[task][0] != rnd:
        store[task] = (rnd, [])
    return store[task][1]


def alie_z(num_clients: int, num_attackers: int) -> float:
    """``z_max`` of "A Little Is Enough" (Baruch et al., 2019): with ``n``
    clients of which ``f`` collude, ``s = floor(n / 2 + 1) - f`` honest clients
    must be swayed and ``z = Phi^{-1}((n - s) / n)``."""
    from statistics import NormalDist

    if not 0 < num_attackers < num_clients:
        raise ValueError("need 0 < num_attackers < num_clients")
    s = num_clients // 2 + 1 - num_attackers
    return float(NormalDist().inv_cdf((num_clients - s) / num_clients))


def alie(colluders: Collection[str], z: float, tasks: Collection[str] | None = None) -> Attack:
    """ "A Little Is Enough" (Baruch et al., 2019): every colluder sends
    ``mean - z * std`` (coordinate-wise) of the honest updates it knows. The
    colluders share what they trained: the mean is over their updates of the
    model this round so far (the first to reply knows only its own) and the
    standard deviation over their latest update each and the current one (zero
    until two are known), an estimate of the honest spread from their own data
    (the attack's paper assumes the honest updates are known)."""
    latest: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    current: dict[str, tuple[str, list[dict[str, np.ndarray]]]] = {}

    def fn(
        task: str, u: dict[str, np.ndarray], msg: Message, ctx: Context
    ) -> dict[str, np.ndarray]:
        now = _this_round(current, task, msg)
        now.append(u)
        latest[(task, _cid(ctx))] = u
        known = [v for (t, _), v in latest.items() if t == task]
        out = {}
        for n in u:
            mean = np.mean([v[n] for v in now], axis=0)
            std = np.std([v[n] for v in known], axis=0) if len(known) >= 2 else 0.0
            out[n] = mean - z * std
        return out

    return rewrite_update(colluders, fn, tasks)


def ipm(colluders: Collection[str], eps: float, tasks: Collection[str] | None = None) -> Attack:
    """Inner-product manipulation (Xie et al., 2020): every colluder sends
    ``-eps`` times the mean of the colluders' honest updates of the model this
    round so far (with one attacker, ``-eps`` times its own update)."""
    seen: dict[str, tuple[str, list[dict[str, np.ndarray]]]] = {}

    def fn(
        task: str, u: dict[str, np.ndarray], msg: Message, ctx: Context
    ) -> dict[str, np.ndarray]:
        now = _this_round(seen, task, msg)
        now.append(u)
        return {n: -eps * np.mean([v[n] for v in now], axis=0) for n in u}

    return rewrite_update(colluders, fn, tasks)


def _flat(update: Mapping[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.ravel(update[n]) for n in sorted(update)]) if update else np.zeros(0)


def agr_gamma(
    benign: np.ndarray,
    direction: np.ndarray,
    rule: str,
    gamma_init: float = 10.0,
    tol: float = 1e-5,
) -> float:
    """The largest ``gamma`` (to ``tol``) for which ``mean(benign) + gamma * direction``
    stays inside the benign updates' spread, by the halving search of Shejwalkar and
    Houmansadr (NDSS 2021, Algorithm 1): rule ``"min-max"`` keeps its largest distance
    to a benign update at most the largest distance between two benign updates;
    ``"min-sum"`` keeps its sum of squared distances to the benign updates at most the
    largest such sum of a benign update. ``benign`` is ``(n, d)``; 0 when no ``gamma >
    0`` qualifies (e.g. one benign update: no spread)."""
    if rule not in ("min-max", "min-sum"):
        raise ValueError(f"rule must be 'min-max' or 'min-sum', not {rule!r}")
    mean = benign.mean(axis=0)
    sq = np.square(benign[:, None, :] - benign[None, :, :]).sum(-1)  # squared distances
    bound = float(np.sqrt(sq.max())) if rule == "min-max" else float(sq.sum(1).max())

    def inside(g: float) -> bool:
        d2 = np.square(benign - (mean + g * direction)).sum(-1)
        return bool(np.sqrt(d2.max()) <= bound if rule == "min-max" else d2.sum() <= bound)

    gamma, step, best = gamma_init, gamma_init / 2, 0.0
    while step > tol:
        if inside(gamma):
            best = max(best, gamma)
            gamma += step
        else:
            gamma -= step
        step /= 2
    return best


def _agr_attack(
    rule: str, colluders: Collection[str], perturbation: str, tasks: Collection[str] | None
) -> Attack:
    if perturbation not in ("std", "unit", "sign"):
        raise ValueError(f"perturbation must be 'std', 'unit' or 'sign', not {perturbation!r}")
    latest: dict[tuple[str, str], dict[str, np.ndarray]] = {}

    def fn(
        task: str, u: dict[str, np.ndarray], msg: Message, ctx: Context
    ) -> dict[str, np.ndarray]:
        latest[(task, _cid(ctx))] = u
        known = [v for (t, _), v in latest.items() if t == task]
        benign = np.stack([_flat(v) for v in known])
        mean = benign.mean(axis=0)
        if perturbation == "std":
            direction = -benign.std(axis=0)
        elif perturbation == "unit":
            direction = -mean / (np.linalg.norm(mean) or 1.0)
        else:
            direction = -np.sign(mean)
        flat = mean + agr_gamma(benign, direction, rule) * direction
        out, at = {}, 0
        for n in sorted(u):
            size = u[n].size
            out[n] = flat[at : at + size].reshape(u[n].shape)
            at += size
        return out

    return rewrite_update(colluders, fn, tasks)


def min_max(
    colluders: Collection[str], perturbation: str = "std", tasks: Collection[str] | None = None
) -> Attack:
    """Min-Max (Shejwalkar and Houmansadr, NDSS 2021): every colluder sends
    ``mean + gamma * p`` of the benign updates it knows, ``p`` the perturbation
    (``"std"``: minus the coordinate-wise standard deviation, the paper's default for
    unknown aggregators; ``"unit"``: minus the mean's direction; ``"sign"``: minus its
    signs) and ``gamma`` as large as keeps the update's largest distance to a benign
    update within the benign updates' largest pairwise distance (:func:`agr_gamma`).
    The benign updates it knows are the colluders' latest honest update of the model
    each, this round's included (the paper's attacker knows every benign update; here,
    as in :func:`alie`, only the colluders' own)."""
    return _agr_attack("min-max", colluders, perturbation, tasks)


def min_sum(
    colluders: Collection[str], perturbation: str = "std", tasks: Collection[str] | None = None
) -> Attack:
    """Min-Sum (Shejwalkar and Houmansadr, NDSS 2021): as :func:`min_max`, with
    ``gamma`` as large as keeps the update's sum of squared distances to the benign
    updates within the largest such sum of a benign update."""
    return _agr_attack("min-sum", colluders, perturbation, tasks)


def inflated_count(who: str, count: int = 10**9, at_registration: bool = True) -> Attack:
    """``who`` claims ``count`` training examples of every task: in its
    registration (``query.info``) or in its train replies."""

    def info(msg: Message, reply: Message, ctx: Context) -> None:
        rec = reply.content.config_records[P.INFO_KEY]
        rec[P.NUM_EXAMPLES] = [int(count)] * len(list(rec[P.NUM_EXAMPLES]))  # type: ignore[arg-type]

    def train(msg: Message, reply: Message, ctx: Context) -> None:
        for key, rec in reply.content.metric_records.items():
            if P.task_of(key, P.METRICS_PREFIX) is not None:
                rec[P.NUM_EXAMPLES] = int(count)

    return _on(P.QUERY_INFO, who, info) if at_registration else _on("train", who, train)


def lying_loss(
    who: str, factor: float = 1e5, train_too: bool = True, tasks: Collection[str] | None = None
) -> Attack:
    """``who`` reports ``factor`` times its true loss in loss queries (and, with
    ``train_too``, as its training loss), to be sampled more often; only for
    ``tasks`` when given (an attack aimed at some models)."""

    def query(msg: Message, reply: Message, ctx: Context) -> None:
        rec = reply.content.metric_records[P.LOSSES_KEY]
        for task in list(rec.keys()):
            if tasks is None or task in tasks:
                rec[task] = float(rec[task]) * factor  # type: ignore[arg-type]

    def train(msg: Message, reply: Message, ctx: Context) -> None:
        for key, rec in reply.content.metric_records.items():
            task = P.task_of(key, P.METRICS_PREFIX)
            if task is not None and (tasks is None or task in tasks) and P.TRAIN_LOSS in rec:
                rec[P.TRAIN_LOSS] = float(rec[P.TRAIN_LOSS]) * factor  # type: ignore[arg-type]

    attacks = [_on(P.QUERY_LOSSES, who, query)] + ([_on("train", who, train)] if train_too else [])
    return chain(*attacks)


def impersonate(who: str, victim: str) -> Attack:
    """``who`` registers under ``victim``'s client id (and keeps training on its
    own data): a squatter. Without a pin for ``victim`` the first live claim
    holds the id; with one, the squatter is refused."""

    def info(msg: Message, reply: Message, ctx: Context) -> None:
        reply.content.config_records[P.INFO_KEY][P.CLIENT_ID] = str(victim)

    return _on(P.QUERY_INFO, who, info)


def with_token(who: str, secret: str) -> Attack:
    """Not an attack: the honest client ``who`` proves its id with ``secret`` in
    its info reply (what its node config's ``client-token`` does in a
    deployment), for runs with that id pinned to ``token_pin(secret)``."""

    def info(msg: Message, reply: Message, ctx: Context) -> None:
        reply.content.config_records[P.INFO_KEY][P.CLIENT_TOKEN] = secret

    return _on(P.QUERY_INFO, who, info)


def late_registration(who: str) -> Attack:
    """Not an attack but the opening for one: ``who``'s first ``query.info``
    fails (its ClientApp raises, as one still starting up would), so it
    registers a round later and a squatter (:func:`impersonate`) can claim its
    id first."""
    seen: set[str] = set()

    def attack(app: ClientCall) -> ClientCall:
        def call(msg: Message, ctx: Context) -> Message:
            if _is(ctx, who) and msg.metadata.message_type == P.QUERY_INFO and who not in seen:
                seen.add(who)
                raise RuntimeError(f"client {who} is not ready yet")
            return app(msg, ctx)

        return call

    return attack


def replay(who: str) -> Attack:
    """``who`` answers every train message with its first train reply again
    (old weights, and the old round in the reply's group id)."""
    first: dict[str, Message] = {}

    def attack(app: ClientCall) -> ClientCall:
        def call(msg: Message, ctx: Context) -> Message:
            reply = app(msg, ctx)
            if not (_is(ctx, who) and msg.metadata.message_type == "train"):
                return reply
            if "reply" not in first:
                first["reply"] = reply
                return reply
            old = first["reply"]
            forged = Message(old.content, reply_to=msg)
            forged.metadata.group_id = old.metadata.group_id
            return forged

        return call

    return attack


def label_flipping(
    who: str | Collection[str], tasks: Collection[str] | None = None
) -> Callable[[Any], Any]:
    """Data poisoning: the clients ``who`` train (and answer loss queries) on
    their own data with every label ``y`` replaced by ``C - 1 - y`` (``C``: the
    model's number of outputs), for ``tasks`` when given, as the label-flipping
    attacks of the robust-FL benchmarks do. Unlike the other attacks this is
    not a wrapper of the ClientApp but a hook on the clients it builds: pass it
    as :func:`mmfl_flwr.runner.run_inprocess`'s ``client_hook``. The replies are
    honest computations on poisoned data, so every shape and norm check passes.
    Needs the trainers' :meth:`~mmfl_flwr.client.trainer.TorchTrainer.map_train_labels`."""
    import torch

    liars = set(_who(who))

    def hook(spec: Any) -> Any:
        if spec.client_id not in liars:
            return spec
        for task, trainer in spec.trainers.items():
            if tasks is not None and task not in tasks:
                continue
            if not hasattr(trainer, "map_train_labels"):
                raise TypeError(
                    f"label_flipping: client {spec.client_id}'s trainer for "
                    f"{task!r} ({type(trainer).__name__}) has no map_train_labels"
                )
            x, _ = trainer.train_tensors()
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                classes = int(trainer.model_fn().to(x.device)(x[:1]).shape[-1])
            trainer.map_train_labels(lambda y, c=classes: (c - 1) - y)
        return spec

    return hook


def chain(*attacks: Attack) -> Attack:
    """Several attacks at once (applied in order)."""

    def attack(app: ClientCall) -> ClientCall:
        for a in attacks:
            app = a(app)
        return app

    return attack


__all__ = [
    "Attack",
    "agr_gamma",
    "alie",
    "alie_z",
    "chain",
    "gaussian_update",
    "huge_weights",
    "impersonate",
    "inflated_count",
    "ipm",
    "label_flipping",
    "late_registration",
    "lying_loss",
    "min_max",
    "min_sum",
    "replay",
    "rewrite_update",
    "scaled_update",
    "with_token",
]
