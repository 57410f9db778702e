"""The default bounds on hostile values never reject or cap in an honest federation.

Every preset runs honestly on the built-in tasks (in-process engine), with the
uniform profile and with paper 003's heterogeneous one (high-data clients train
ten times as many steps, several processors per client); no update may be
rejected, no loss or count capped, no reply ignored. The update clip
(``update_clip_factor``, 3 x the reference norm) sits at the edge of the honest
spread on purpose: it may trim a rare honest update, but only one within 2 x
its bound (6 x the reference), never an honest update of ordinary size. The
direction check (``direction_factor``) may shrink the updates of an honest
client whose updates keep pointing against the others' (an outlier of the
model's clients, a flipper's signature) to the reference norm; it singles out
at most one client per model in a run, never a group of honest clients. The
bounds on reversed updates (``reversed_influence_factor``, on by default since
2026-12-03) may hold an honest update whose cosine with the others' median is
below -0.1 this round and on average, alone to 4 typical clients' influence and,
where the clients agree, together with the others such to 4 typical clients'
push: they act in honest federations by design (what that costs is measured by
``benchmarks/honest_false_positives.py``, docs/explanation/defences.md), and each
of their lines must name a cosine and a mean below -0.1; the bound on every
update (``influence_clip_factor``) stays off.
"""

from __future__ import annotations

import logging
import re

import pytest
from conftest import LogTap

from mmfl_flwr import runner
from mmfl_flwr.config import Settings
from mmfl_flwr.presets import PRESETS

ACTS = ("capped", "are used (", "answers round", "rejected", "exceeds", "nearly alike")
CLIP = re.compile(r"clipped update for task '[^']+': update norm (\S+) exceeds (\S+) ")
DIRECTION = re.compile(
    r"^Client (\S+): clipped update for task '([^']+)': its updates point "
    r"against the other clients'"
)
REVERSED = re.compile(
    r"it points against the model's other updates \(cosine (\S+) with "
    r"their median this round, mean (\S+) over its last \d+ rounds\)"
)


def honest_settings(preset: str, profile: str) -> Settings:
    kw = dict(
        strategy=preset,
        profile=profile,
        num_clients=20,
        num_rounds=4,
        local_epochs=3,
        output_dir="",
        seed=1,
    )
    if preset in ("ranklist-ucb", "pareto-ucb"):
        kw["clients_per_round"] = 4
    if preset == "group":
        kw.update(
            profile="clusters-consistent" if profile == "uniform" else "paper003", num_clients=30
        )
    return Settings(**kw)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["uniform", "paper003"])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_no_bound_acts_in_an_honest_run(preset, profile):
    tap = LogTap()
    logger = logging.getLogger("flwr")
    logger.addHandler(tap)
    try:
        result = runner.run(honest_settings(preset, profile), engine="inprocess")
    finally:
        logger.removeHandler(tap)
    # the WARNINGs, and every action of a bound (its line is at DEBUG since issue 57,
    # below runner.run's console level): each event is its log line
    warnings = [m for lvl, m in tap.records if lvl >= logging.WARNING] + [
        f"Client {e.client}: {e.reason}" for e in result.events
    ]
    clipped = [m for m in warnings if CLIP.search(m)]
    turned = [m for m in warnings if DIRECTION.search(m)]
    held = [m for m in warnings if REVERSED.search(m)]
    acted = [
        m
        for m in warnings
        if m not in clipped + turned + held and any(word in m for word in ACTS + ("clipped",))
    ]
    assert acted == []
    for m in held:  # only updates pointing against the others, this round and on average
        cosine, mean = (float(x) for x in REVERSED.search(m).groups())
        assert cosine < -0.1 and mean < -0.1, m
    suspects: dict[str, set[str]] = {}
    for m in turned:
        cid, task = DIRECTION.search(m).groups()
        suspects.setdefault(task, set()).add(cid)
    assert all(len(cids) <= 1 for cids in suspects.values()), suspects
    for m in clipped:
        norm, bound = (float(x) for x in CLIP.search(m).groups())
        assert norm <= 2 * bound, m
    assert all(r["rejected"] == 0 for r in result.history)
