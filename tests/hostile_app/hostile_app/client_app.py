"""mmfl-flwr's ClientApp, made hostile on a SuperNode whose node config says
``hostile = "<attack>"`` (``huge-weights``: every trained model comes back as
1e30 everywhere; ``scaled-x1000``: the honest update 1000 times larger).
Every other SuperNode is the plain mmfl-flwr client."""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from mmfl_flwr import protocol as P
from mmfl_flwr.flower_app.client_app import app as honest
from mmfl_flwr.testing import hostile as H

ATTACKS = {
    "huge-weights": lambda who: H.huge_weights(who, 1e30),
    "scaled-x1000": lambda who: H.scaled_update(who, 1000.0),
}

app = ClientApp()


def _call(msg: Message, ctx: Context) -> Message:
    attack = str(ctx.node_config.get("hostile", ""))
    if attack:
        return ATTACKS[attack](str(ctx.node_config["partition-id"]))(honest)(msg, ctx)
    return honest(msg, ctx)


@app.train()
def train(msg: Message, ctx: Context) -> Message:
    return _call(msg, ctx)


@app.evaluate()
def evaluate(msg: Message, ctx: Context) -> Message:
    return _call(msg, ctx)


@app.query(P.QUERY_INFO.split(".", 1)[1])
def info(msg: Message, ctx: Context) -> Message:
    return _call(msg, ctx)


@app.query(P.QUERY_LOSSES.split(".", 1)[1])
def losses(msg: Message, ctx: Context) -> Message:
    return _call(msg, ctx)
