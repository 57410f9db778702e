"""Hostile clients for robustness tests: wrappers around a ClientApp callable that
make one client lie in a way that passes the shape checks.

Each attack is a function ``attack(app) -> app`` over the callable
``app(message, context) -> reply`` (a :class:`flwr.clientapp.ClientApp` or a
wrapper of one). Pass it to :func:`mmfl_flwr.runner.run_inprocess`
(``wrap_client_app=``) or wrap the callable given to
:class:`~mmfl_flwr.grid.InProcessGrid`. The hostile client is chosen by its
partition id (the ``partition-id`` of its node config) or by ``cid``.

numpy and flwr only; the honest client does all the training.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import Array, Context, Message

from mmfl_flwr import protocol as P

ClientCall = Callable[[Message, Context], Message]
Attack = Callable[[ClientCall], ClientCall]


def _is(ctx: Context, who: str) -> bool:
    cfg = ctx.node_config
    return str(cfg.get("cid", cfg.get("client-id", cfg.get("partition-id")))) == str(who)


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


def scaled_update(who: str, factor: float) -> Attack:
    """``who`` returns ``w_global + factor * (w_local - w_global)``: its honest
    update ``factor`` times larger (or reversed, with a negative factor)."""

    def rewrite(msg: Message, reply: Message, ctx: Context) -> None:
        for key, rec in reply.content.array_records.items():
            task = P.task_of(key, P.ARRAYS_PREFIX)
            if task is None:
                continue
            glob = msg.content.array_records[key]
            for name in list(rec.keys()):
                local, g = rec[name].numpy(), glob[name].numpy()
                if local.dtype.kind == "f":
                    out = g.astype(np.float64) + factor * (local.astype(np.float64) - g)
                    rec[name] = Array(out.astype(local.dtype))

    return _on("train", who, rewrite)


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


def lying_loss(who: str, factor: float = 1e5, train_too: bool = True) -> Attack:
    """``who`` reports ``factor`` times its true loss in loss queries (and, with
    ``train_too``, as its training loss), to be sampled more often."""

    def query(msg: Message, reply: Message, ctx: Context) -> None:
        rec = reply.content.metric_records[P.LOSSES_KEY]
        for task in list(rec.keys()):
            rec[task] = float(rec[task]) * factor  # type: ignore[arg-type]

    def train(msg: Message, reply: Message, ctx: Context) -> None:
        for key, rec in reply.content.metric_records.items():
            if P.task_of(key, P.METRICS_PREFIX) is not None and P.TRAIN_LOSS in rec:
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


def chain(*attacks: Attack) -> Attack:
    """Several attacks at once (applied in order)."""

    def attack(app: ClientCall) -> ClientCall:
        for a in attacks:
            app = a(app)
        return app

    return attack


__all__ = [
    "Attack", "chain", "huge_weights", "impersonate", "inflated_count", "late_registration",
    "lying_loss", "replay", "scaled_update", "with_token",
]
