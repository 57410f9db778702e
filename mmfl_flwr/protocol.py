"""Wire protocol shared by the server (strategy) and the client (ClientApp).

Everything here is plain Flower records; no torch. One message per node per round
carries every model assigned to that node, each under its own record key.

Message types
-------------
``query.info``     server -> client: nothing; reply: ConfigRecord ``info`` with
                   ``client-id`` (str), ``tasks`` (list[str]), ``num-examples``
                   (list[int], aligned with ``tasks``), ``processors`` (int),
                   and per task ``trainable.<task>`` (list[str]): the keys of
                   the model's trainable parameters. The other entries
                   (batch-norm running statistics, step counters) are state:
                   they are not part of the update ``G`` and are combined by a
                   sample-weighted mean. Without it, every floating-point entry
                   counts as trainable and integer entries as state. Optional
                   ``client-token`` (str): the client's secret, checked against
                   the server's pin of its id.
``query.losses``   server -> client: ``arrays.<task>`` for each task to score;
                   reply: MetricRecord ``losses`` mapping task -> mean local loss
                   (forward pass only, no training).
``train``          server -> client: ``arrays.<task>`` per assigned task and the
                   ConfigRecord ``config``; reply: ``arrays.<task>`` (the locally
                   trained weights) and MetricRecord ``metrics.<task>`` with
                   ``num-examples`` and ``train-loss`` per trained task.
                   With SCAFFOLD the server adds ``control.<task>`` (the server
                   control variate ``c_s``) and the client replies with its new
                   ``c_{i,s}`` under the same key (it keeps ``c_{i,s}`` in
                   ``context.state``).
``evaluate``       server -> client: ``arrays.<task>`` per task; reply:
                   MetricRecord ``metrics.<task>`` with ``num-examples``,
                   ``loss`` and ``accuracy``.

Multi-client nodes (a shard of virtual clients on one Flower node)
------------------------------------------------------------------
A node may host several clients. Its ``query.info`` reply then holds one
ConfigRecord ``info@<client-id>`` per client (the fields of ``info``; its
``client-id`` equal to the key's). Every later message to the node carries the
work of all its clients addressed in the round: the weights once per task
(``arrays.<task>``, ``control.<task>``), and per client a ConfigRecord
``config@<client-id>`` (its ``tasks``, and for training the train config).
The reply holds every record of each client's part under its key plus
``@<client-id>`` (``arrays.<task>@7``, ``metrics.<task>@7``, ``losses@7``,
``control.<task>@7``); a client whose part failed replies ConfigRecord
``error@<client-id>`` with ``code`` (int) and ``reason`` (str). The server
validates, rejects and identifies each client of a node on its own.
"""

from __future__ import annotations

ARRAYS_PREFIX = "arrays."
METRICS_PREFIX = "metrics."
CONTROL_PREFIX = "control."
TRAINABLE_PREFIX = "trainable."
#: Info-record key of the client's secret token (optional; checked against the
#: server's pin of its id, see :mod:`mmfl_flwr.strategy.registration`).
CLIENT_TOKEN = "client-token"
#: Info-record key of the message types the ClientApp serves (optional; a client
#: that declares them and lacks one the strategy sends is refused at registration)
HANDLERS = "handlers"
CONFIG_KEY = "config"
INFO_KEY = "info"
LOSSES_KEY = "losses"

QUERY_INFO = "query.info"
QUERY_LOSSES = "query.losses"

# Keys inside the records.
CLIENT_ID = "client-id"
TASKS = "tasks"
NUM_EXAMPLES = "num-examples"
PROCESSORS = "processors"
TRAIN_LOSS = "train-loss"
LOSS = "loss"
ACCURACY = "accuracy"

# Keys of the train ConfigRecord.
CFG_ROUND = "server-round"
CFG_TASKS = "tasks"
CFG_EPOCHS = "local-epochs"
CFG_LR = "lr"
CFG_BATCH_SIZE = "batch-size"
CFG_SEED = "seed"


def arrays_key(task: str) -> str:
    """Record key under which the weights of ``task`` travel."""
    return ARRAYS_PREFIX + task


def metrics_key(task: str) -> str:
    """Record key under which the metrics of ``task`` travel."""
    return METRICS_PREFIX + task


def trainable_key(task: str) -> str:
    """Info-record key listing the trainable entries of ``task``'s model."""
    return TRAINABLE_PREFIX + task


def control_key(task: str) -> str:
    """Record key of a task's SCAFFOLD control variate."""
    return CONTROL_PREFIX + task


def task_of(key: str, prefix: str) -> str | None:
    """Return the task name of a record key, or None if it lacks ``prefix``."""
    return key[len(prefix) :] if key.startswith(prefix) else None


#: separates a record key from the client it belongs to on a multi-client node
CLIENT_SEP = "@"
#: the per-client record of a failed part on a multi-client node
ERROR_KEY = "error"


def client_key(key: str, cid: str) -> str:
    """``key`` of client ``cid``'s part on a multi-client node (``arrays.a@7``)."""
    return f"{key}{CLIENT_SEP}{cid}"


def split_client_key(key: str) -> tuple[str, str | None]:
    """``(key, client id)`` of a per-client record key; ``(key, None)`` for a key
    without a client (the last ``@`` separates them)."""
    base, sep, cid = key.rpartition(CLIENT_SEP)
    return (base, cid) if sep and base else (key, None)
