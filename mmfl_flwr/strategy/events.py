"""Defence events: every action of the server's bounds, as a record.

Each time a bound acts on what a client sent (an update rejected, clipped or
scaled down, a sample count or a loss capped), the check that acted calls
:meth:`DefenceLog.act`: the action is logged at DEBUG (INFO under ``mmfl run
--verbose``) with the line it has always had, and recorded as a
:class:`DefenceEvent` (a row of ``events.csv``: ``round, client, task, kind,
value, bound, reason``). The strategy owns one :class:`DefenceLog` per run
(``run_state.defence``); the run's result holds its events
(``result.events``) and the updates received (``result.received``), from
which ``summary.json`` counts them (:func:`summary_counts`).

WARNING is kept for what a user should act on (:meth:`DefenceLog.end_round`):
a client whose updates are rejected, or scaled down by more than
:data:`LARGE_FACTOR`, in :data:`REPEAT` rounds or more; a client the direction
check singles out in :data:`REPEAT` rounds or more; a client whose losses are
capped by more than :data:`LARGE_FACTOR` in :data:`REPEAT` rounds, or whose
declared sample count is (once); a bound that acted on most
of a round's updates of a model; a model that stopped improving while the
bounds acted on most of its updates. Each is said once per (client or model,
kind), and counted again at the end of the run (:meth:`DefenceLog.finish`).
A reply that fails a check (malformed, missing) is still a WARNING each time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, field
from logging import DEBUG, WARNING
from typing import Any

from flwr.common.logger import log

#: kind -> what it means (docs/defence-events.md has the long form).
KINDS: dict[str, str] = {
    "rejected": "an update left out of the aggregate: its norm exceeds update_norm_factor "
    "x the reference norm, it belongs to a reversed coalition (collusion_factor), or the "
    "reply failed a check (malformed, max_update_norm)",
    "clipped": "an update scaled down to update_clip_factor x the model's reference norm",
    "direction": "an update of a client whose updates point against the other clients' "
    "scaled down to the reference norm (direction_factor)",
    "influence": "an update whose influence on the step exceeds influence_clip_factor x "
    "the round's reference influence, scaled down to it",
    "reversed": "an update pointing against the model's other updates whose influence "
    "exceeds reversed_influence_factor x the reference influence, scaled down to it",
    "collusion": "an update of a group of nearly alike updates of a model (cosine "
    "distance under the round's median / collusion_factor), scaled by 1 / the group's size",
    "count": "a client's sample count capped at count_cap x the task's median count",
    "loss": "a reported loss (loss query or training loss) capped at loss_cap x the "
    "task's reference loss",
    "ignored": "part of a reply ignored: arrays of a task not assigned, an invalid loss",
    "missing": "an assigned update that did not come: the client failed or sent no reply",
}
#: The bound behind each kind that acts on updates (and the setting that sets it).
BOUNDS: dict[str, str] = {
    "rejected": "norm bound (update_norm_factor) or the collusion check's reversed coalitions",
    "clipped": "norm clip (update_clip_factor)",
    "direction": "direction check (direction_factor)",
    "influence": "influence bound (influence_clip_factor)",
    "reversed": "reversed-update bound (reversed_influence_factor)",
    "collusion": "collusion check (collusion_factor)",
}
#: The kinds that act on one update of a round (the others act on counts,
#: losses and replies).
UPDATE_KINDS = ("rejected", "clipped", "direction", "influence", "reversed", "collusion")
#: The kinds that scale an update down (``value / bound`` is the factor).
SCALING_KINDS = ("clipped", "direction", "influence", "reversed", "collusion")
#: The kinds the progress line always shows, even at 0.
SHOWN_KINDS = ("clipped", "rejected")
#: An update scaled down by more than this factor (``value / bound``) is a
#: large scaling: a client scaled so, round after round, is named at WARNING.
LARGE_FACTOR = 10.0
#: "Again and again": the rounds a client must be rejected, scaled by more
#: than :data:`LARGE_FACTOR` or singled out by the direction check before a
#: WARNING names it.
REPEAT = 3
#: A model whose best accuracy has not improved for this many rounds while
#: the bounds acted on most of its updates of those rounds is named.
STALL_ROUNDS = 5
#: A bound acting on more than this fraction of a model's updates of a round
#: (at least :data:`MOST_AT_LEAST` of them) is named.
MOST = 0.5
MOST_AT_LEAST = 3

#: The ``extra`` of the WARNINGs this module says (a record then has
#: ``mmfl_escalation`` True): a reader of the log tells them from the actions.
ESCALATION = {"mmfl_escalation": True}

COLUMNS = ("round", "client", "task", "kind", "value", "bound", "reason")


@dataclass(frozen=True)
class DefenceEvent:
    """One action of a bound (a row of ``events.csv``).

    ``value`` is what was measured (an update norm, an influence, a count, a
    loss) and ``bound`` what it was held to; ``value / bound`` is the factor
    an update was scaled down by (NaN where a reply failed a check).
    ``reason`` is the action's log line, without its ``Client <id>:`` prefix.
    """

    round: int
    client: str
    task: str
    kind: str
    value: float
    bound: float
    reason: str

    @property
    def factor(self) -> float:
        """``value / bound`` (NaN where either is not a positive finite number)."""
        if self.bound > 0 and math.isfinite(self.bound) and not math.isnan(self.value):
            return self.value / self.bound
        return math.nan


def _reason(cid: str, message: str) -> str:
    for prefix in (f"Client {cid}: ", f"Client {cid} "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


@dataclass
class DefenceLog:
    """The defence events of one run, and the warnings they lead to.

    ``level``: the level of each action's own log line (DEBUG; INFO under
    ``mmfl run --verbose``). ``events``: every event so far; ``received``:
    task -> client id -> the updates received from it (assigned parts of
    train replies that arrived, before any check)."""

    level: int = DEBUG
    round: int = 0
    events: list[DefenceEvent] = field(default_factory=list)
    received: dict[str, dict[str, int]] = field(default_factory=dict)
    #: (subject, task, rule) -> rounds counted; a key is warned once
    counts: dict[tuple[str, str, str], set[int]] = field(default_factory=dict)
    warned: dict[tuple[str, str, str], str] = field(default_factory=dict)
    #: (subject, task, rule) -> the models its events were on
    models: dict[tuple[str, str, str], set[str]] = field(default_factory=dict)
    #: task -> (best accuracy, round of it)
    best: dict[str, tuple[float, int]] = field(default_factory=dict)
    #: task -> round -> (updates acted on, updates received)
    acted: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)

    def act(
        self,
        kind: str,
        cid: str,
        task: str,
        value: float,
        bound: float,
        template: str,
        *args: Any,
        level: int | None = None,
    ) -> None:
        """Log one action (``template % args``, at ``level`` or :attr:`level`)
        and record it as an event of this round."""
        log(self.level if level is None else level, template, *args)
        self.events.append(
            DefenceEvent(
                self.round,
                str(cid),
                str(task),
                kind,
                float(value),
                float(bound),
                _reason(str(cid), template % args),
            )
        )

    def record(
        self,
        kind: str,
        cid: str,
        task: str,
        reason: str,
        value: float = math.nan,
        bound: float = math.nan,
    ) -> None:
        """Record an event of this round whose line was logged already."""
        self.events.append(
            DefenceEvent(self.round, str(cid), str(task), kind, float(value), float(bound), reason)
        )

    def receive(self, cid: str, task: str) -> None:
        """Count one update received from ``cid`` for ``task``."""
        per = self.received.setdefault(task, {})
        per[cid] = per.get(cid, 0) + 1

    def of_round(self, rnd: int) -> list[DefenceEvent]:
        """The events of round ``rnd``."""
        return [e for e in self.events if e.round == rnd]

    # ---------------------------------------------------------------- warnings
    def _count(self, e: DefenceEvent) -> list[tuple[str, str, str]]:
        """The rule keys (client, "", rule) event ``e`` counts towards: one per
        client and kind, over all its models."""
        keys = []
        if e.kind == "rejected":
            keys.append((e.client, "", "rejected"))
        if e.kind in SCALING_KINDS and e.factor > LARGE_FACTOR:
            keys.append((e.client, "", "scaled"))
        if e.kind == "direction":
            keys.append((e.client, "", "direction"))
        if e.kind in ("count", "loss") and e.factor > LARGE_FACTOR:
            keys.append((e.client, "", e.kind))
        for key in keys:
            self.counts.setdefault(key, set()).add(e.round)
            self.models.setdefault(key, set()).add(e.task)
        return keys

    def end_round(self, rnd: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """After round ``rnd`` (its history ``rows``): log a WARNING for each
        new thing a user should act on (once per client or model and kind)."""
        events = self.of_round(rnd)
        for e in events:
            for key in self._count(e):
                # a count is capped once (when it is declared): said at once
                needed = 1 if key[2] == "count" else REPEAT
                if len(self.counts[key]) >= needed and key not in self.warned:
                    self._warn_client(key, e)
        by_task: dict[str, dict[str, set[str]]] = {}
        for e in events:
            if e.kind in UPDATE_KINDS:
                by_task.setdefault(e.task, {}).setdefault(e.kind, set()).add(e.client)
        for row in rows:
            task = str(row["task"])
            got = int(row.get("uploads", 0)) + int(row.get("rejected", 0))
            kinds = by_task.get(task, {})
            acted = set().union(*kinds.values()) if kinds else set()
            self.acted.setdefault(task, {})[rnd] = (len(acted), got)
            for kind, cids in kinds.items():
                key = ("", task, f"most:{kind}")
                if len(cids) >= MOST_AT_LEAST and len(cids) > MOST * got:
                    self.counts.setdefault(key, set()).add(rnd)
                    if key not in self.warned:
                        self.warned[key] = (
                            f"Model {task!r}: the {BOUNDS[kind]} acted on {len(cids)} of "
                            f"the {got} updates of round {rnd}; a bound that holds most "
                            "updates holds honest ones too: check its factor"
                        )
                        log(WARNING, "%s", self.warned[key], extra=ESCALATION)
            self._check_stall(task, rnd, row)

    def _warn_client(self, key: tuple[str, str, str], e: DefenceEvent) -> None:
        cid, _, rule = key
        n = len(self.counts[key])
        what = {
            "rejected": "its updates were rejected",
            "scaled": f"its updates were scaled down by more than {LARGE_FACTOR:g}x",
            "direction": "its updates point against the other clients' (direction check)",
            "count": f"its declared sample count was capped by more than {LARGE_FACTOR:g}x",
            "loss": f"its reported losses were capped by more than {LARGE_FACTOR:g}x",
        }[rule]
        self.warned[key] = f"Client {cid}: {what}"
        by = f", {e.factor:.3g} x its bound" if math.isfinite(e.factor) else ""
        log(
            WARNING,
            "Client %s: %s in %d rounds (models %s; latest: round %d, model %r%s); said "
            "once, counted at the end of the run (events.csv has every action)",
            cid,
            what,
            n,
            ", ".join(sorted(self.models[key])),
            e.round,
            e.task,
            by,
            extra=ESCALATION,
        )

    def _check_stall(self, task: str, rnd: int, row: Mapping[str, Any]) -> None:
        acc = row.get("accuracy")
        if acc is None or not isinstance(acc, (int, float)) or math.isnan(float(acc)):
            return
        best = self.best.get(task)
        if best is None or float(acc) > best[0]:
            self.best[task] = (float(acc), rnd)
            return
        since = rnd - best[1]
        if since < STALL_ROUNDS:
            return
        window = [self.acted.get(task, {}).get(r, (0, 0)) for r in range(best[1] + 1, rnd + 1)]
        acted, got = sum(a for a, _ in window), sum(g for _, g in window)
        key = ("", task, "stalled")
        if got and acted > MOST * got:
            self.counts.setdefault(key, set()).add(rnd)
            if key not in self.warned:
                self.warned[key] = (
                    f"Model {task!r}: no better accuracy than {best[0]:.4f} (round {best[1]}) "
                    f"for {since} rounds while the bounds acted on {acted} of its {got} "
                    "updates"
                )
                log(WARNING, "%s; see events.csv", self.warned[key], extra=ESCALATION)

    def finish(self) -> None:
        """At the end of the run: each warning said with its final count."""
        for key, text in self.warned.items():
            log(
                WARNING,
                "%s: %d rounds in this run",
                text,
                len(self.counts.get(key, ())),
                extra=ESCALATION,
            )

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The events and counts received, as plain data."""
        return {
            "events": [astuple(e) for e in self.events],
            "received": {t: dict(v) for t, v in self.received.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; what was warned before stays warned."""
        self.events = [DefenceEvent(*row) for row in state.get("events", [])]
        self.received = {t: dict(v) for t, v in state.get("received", {}).items()}
        for e in self.events:
            for key in self._count(e):
                if len(self.counts[key]) >= (1 if key[2] == "count" else REPEAT):
                    self.warned.setdefault(key, f"Client {key[0]}: {key[2]}")


def act(
    events: DefenceLog | None,
    kind: str,
    cid: str,
    task: str,
    value: float,
    bound: float,
    template: str,
    *args: Any,
) -> None:
    """:meth:`DefenceLog.act` on ``events``; without one, the line at DEBUG only."""
    if events is None:
        log(DEBUG, template, *args)
    else:
        events.act(kind, cid, task, value, bound, template, *args)


def logged_below_warning(e: DefenceEvent) -> bool:
    """Whether event ``e``'s own line was logged at DEBUG (INFO with verbose):
    every action of a bound; not a reply that failed a check (``ignored``,
    ``missing``, a ``rejected`` reply without a measured norm), which is a
    WARNING each time."""
    return not (e.kind in ("ignored", "missing") or (e.kind == "rejected" and math.isnan(e.value)))


def action_lines(events: Iterable[DefenceEvent]) -> list[str]:
    """The log lines of the events logged below WARNING (``Client <id>:
    <reason>``): with a run's WARNING lines, every line the checks said."""
    return [f"Client {e.client}: {e.reason}" for e in events if logged_below_warning(e)]


def round_counts(events: Iterable[DefenceEvent]) -> dict[str, int]:
    """kind -> events, with every kind of :data:`SHOWN_KINDS` (0 if none)."""
    out = {k: 0 for k in SHOWN_KINDS}
    for e in events:
        out[e.kind] = out.get(e.kind, 0) + 1
    return out


def progress_text(counts: Mapping[str, int]) -> str:
    """``clipped 2, rejected 0, reversed 1``: the shown kinds, then the others."""
    order = list(SHOWN_KINDS) + sorted(k for k in counts if k not in SHOWN_KINDS)
    return ", ".join(f"{k} {counts.get(k, 0)}" for k in order)


def by_task_kind(events: Iterable[DefenceEvent]) -> dict[str, dict[str, int]]:
    """task -> kind -> events (the trackers' ``<model>/defence/<kind>``)."""
    out: dict[str, dict[str, int]] = {}
    for e in events:
        per = out.setdefault(e.task, {})
        per[e.kind] = per.get(e.kind, 0) + 1
    return out


def _part(count: int, received: int) -> dict[str, Any]:
    return {
        "count": count,
        "updates_received": received,
        "fraction": count / received if received else None,
    }


def touched_updates(events: Iterable[DefenceEvent]) -> set[tuple[int, str, str]]:
    """The updates some bound rejected or scaled (kinds :data:`UPDATE_KINDS`), as
    ``(round, client, task)``, each once however many bounds acted on it; the caps on
    declared counts and reported losses act on reports, not on updates, and are
    counted under their own kinds."""
    return {(e.round, e.client, e.task) for e in events if e.kind in UPDATE_KINDS}


def summary_counts(
    events: Sequence[DefenceEvent], received: Mapping[str, Mapping[str, int]]
) -> dict[str, Any]:
    """``summary.json``'s ``defence_events``: the events counted in all, per
    kind, per model and per client, each with the updates received and the
    fraction (count / updates received; None without updates), and
    ``updates_touched``: the updates some bound rejected or scaled, each once
    (:func:`touched_updates`), over the updates received: the false-positive
    rate of the bounds in a run whose clients are all honest."""
    total = sum(sum(v.values()) for v in received.values())
    per_model = {t: sum(v.values()) for t, v in received.items()}
    per_client: dict[str, int] = {}
    for v in received.values():
        for cid, n in v.items():
            per_client[cid] = per_client.get(cid, 0) + n

    def kinds(es: Iterable[DefenceEvent]) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in es:
            out[e.kind] = out.get(e.kind, 0) + 1
        return dict(sorted(out.items()))

    out: dict[str, Any] = _part(len(events), total)
    # several bounds can act on one update: the updates they touched, each once
    out["updates_touched"] = _part(len(touched_updates(events)), total)
    out["by_kind"] = {k: _part(n, total) for k, n in kinds(events).items()}
    models: dict[str, list[DefenceEvent]] = {}
    clients: dict[str, list[DefenceEvent]] = {}
    for e in events:
        models.setdefault(e.task, []).append(e)
        clients.setdefault(e.client, []).append(e)
    out["by_model"] = {
        t: {**_part(len(es), per_model.get(t, 0)), "by_kind": kinds(es)}
        for t, es in sorted(models.items())
    }
    out["by_client"] = {
        c: {**_part(len(es), per_client.get(c, 0)), "by_kind": kinds(es)}
        for c, es in sorted(clients.items())
    }
    return out
