"""The ``client-pins`` setting: pins from the run config reach the strategy, so
``flwr run`` and ``mmfl run`` users can pin client ids too."""

from __future__ import annotations

import hashlib
import logging

import pytest
from conftest import LogTap

from mmfl_flwr.config import Settings
from mmfl_flwr.runner import run_inprocess
from mmfl_flwr.strategy.registration import token_pin

DIGEST = hashlib.sha256(b"only-the-real-client-3-knows").hexdigest()


def test_pins_parse_and_normalise():
    s = Settings(client_pins=f" 3=token:{DIGEST} , 4={DIGEST.upper()}")
    assert s.client_pin_map() == {"3": f"token:{DIGEST}", "4": f"token:{DIGEST}"}
    assert token_pin("only-the-real-client-3-knows") == f"token:{DIGEST}"
    assert Settings().client_pin_map() == {}


@pytest.mark.parametrize(
    "value",
    ["3", "=token:" + "a" * 64, "3=token:abc", f"3={DIGEST},3={DIGEST}", "3=sha1:" + "a" * 64],
)
def test_bad_pins_are_one_line_errors_naming_the_key(value):
    with pytest.raises(ValueError, match="client-pins") as err:
        Settings(client_pins=value).validate()
    assert "\n" not in str(err.value)


def test_a_pinned_id_without_its_token_is_refused_in_a_run():
    """Client 3 is pinned to a token that no node holds: it is refused every
    round (the log names it) and never trains; the other clients run on."""
    s = Settings(
        tasks="synthetic",
        num_clients=5,
        num_rounds=2,
        local_epochs=1,
        output_dir="",
        client_pins=f"3=token:{DIGEST}",
    )
    tap = LogTap()
    logging.getLogger("flwr").addHandler(tap)
    try:
        result = run_inprocess(s)
    finally:
        logging.getLogger("flwr").removeHandler(tap)
    refused = [m for lvl, m in tap.records if lvl >= logging.WARNING and "client id 3" in m]
    assert len(refused) == 2  # asked again, and refused, each round
    trained = {cid for picks in result.assignments.values() for cid, _, _ in picks}
    assert "3" not in trained and trained == {"0", "1", "2", "4"}
