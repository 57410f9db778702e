"""The round trip on Flower's grids: push, then pull with a short, growing pause
(Flower's own ``send_and_receive`` sleeps 0.1 s or 3 s between pulls), with
Flower's semantics: every reply that arrives by the timeout, late ones dropped."""

from __future__ import annotations

import time

from flwr.app import Message, RecordDict

from mmfl_flwr.grid import ensure_task_identity
from mmfl_flwr.strategy import timing

ensure_task_identity()  # replies built outside a ClientApp need a run id

#: What a sleep may overshoot by on a loaded 2-core machine (a CI run with two test
#: workers): the bounds below are about the protocol's waits, not the machine's speed.
SLACK = 0.3


class PollGrid:
    """A Flower-like grid whose replies appear at given times after the push."""

    def __init__(self, delays):
        self.delays, self.pulls, self.sent = list(delays), 0, {}

    def push_messages(self, messages):
        ids = []
        for i, msg in enumerate(messages):
            mid = f"m{i}"
            msg.metadata.__dict__["_message_id"] = mid
            self.sent[mid] = (msg, time.time() + self.delays[i])
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        self.pulls += 1
        now = time.time()
        ready = [m for m in ids if m in self.sent and self.sent[m][1] <= now]
        return [Message(RecordDict(), reply_to=self.sent.pop(m)[0]) for m in ready]

    def send_and_receive(self, messages, *, timeout=None):  # never used here
        raise AssertionError("Flower's own polling loop was used")


def _msgs(n):
    return [
        Message(RecordDict(), dst_node_id=i + 1, message_type="train", group_id="1")
        for i in range(n)
    ]


def test_replies_are_collected_soon_after_they_arrive():
    grid = PollGrid([0.0, 0.05, 0.12])
    t0 = time.monotonic()
    replies = timing.send_and_receive(grid, _msgs(3), timeout=5.0)
    took = time.monotonic() - t0
    assert len(replies) == 3
    # never waits a whole pull interval more than the last reply (plus SLACK for a
    # loaded machine's scheduling; Flower's deployment interval is 3 s)
    assert took < 0.12 + timing.PULL_MOST + SLACK
    assert grid.pulls >= 2


def test_late_replies_are_dropped_at_the_timeout():
    grid = PollGrid([0.0, 10.0])
    t0 = time.monotonic()
    replies = timing.send_and_receive(grid, _msgs(2), timeout=0.3)
    took = time.monotonic() - t0
    assert len(replies) == 1 and replies[0].metadata.reply_to_message_id == "m0"
    assert 0.3 <= took < 0.3 + SLACK  # the late reply would come at 10 s


def test_the_grids_of_this_package_keep_their_own_round_trip():
    from mmfl_flwr.grid import InProcessGrid

    class Mine(InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None):
            return ["own"]

    grid = Mine(lambda m, c: None, [])
    assert timing.send_and_receive(grid, [], timeout=1.0) == ["own"]
