"""DecodeCache: a process decodes the round's weights once and every caller gets
its own copy."""

from __future__ import annotations

import numpy as np

from mmfl_flwr.records import DecodeCache, arrays_to_numpy, numpy_to_arrays


def _rec(value: float):
    return numpy_to_arrays(
        {"w": np.full((2, 3), value, dtype=np.float32), "n": np.array(3, dtype=np.int64)}
    )


def test_same_bytes_decode_once_and_copies_are_independent(monkeypatch):
    calls = []
    import mmfl_flwr.records as R

    real = R.arrays_to_numpy
    monkeypatch.setattr(R, "arrays_to_numpy", lambda rec: calls.append(1) or real(rec))
    cache = DecodeCache()
    a = cache.decode(_rec(1.5))
    b = cache.decode(_rec(1.5))  # another record object, the same bytes
    assert len(calls) == 1
    a["w"][0, 0] = 99.0  # a trainer may modify what it gets
    assert b["w"][0, 0] == 1.5 and cache.decode(_rec(1.5))["w"][0, 0] == 1.5
    assert a["n"].shape == () and a["n"].dtype == np.int64
    c = cache.decode(_rec(2.5))
    assert len(calls) == 2 and c["w"][1, 2] == 2.5


def test_digest_separates_keys_shapes_and_dtypes():
    base = {"w": np.zeros(4, dtype=np.float32)}
    digests = {
        DecodeCache.digest(numpy_to_arrays(base)),
        DecodeCache.digest(numpy_to_arrays({"v": np.zeros(4, dtype=np.float32)})),
        DecodeCache.digest(numpy_to_arrays({"w": np.zeros((2, 2), dtype=np.float32)})),
        DecodeCache.digest(numpy_to_arrays({"w": np.zeros(2, dtype=np.float64)})),
    }
    assert len(digests) == 4


def test_the_cache_is_bounded_and_keeps_the_most_recent():
    cache = DecodeCache(size=2)
    for v in (1.0, 2.0, 3.0):
        out = cache.decode(_rec(v))
        np.testing.assert_array_equal(out["w"], arrays_to_numpy(_rec(v))["w"])
    assert len(cache._entries) == 2
    assert DecodeCache.digest(_rec(1.0)) not in cache._entries
    assert DecodeCache.digest(_rec(3.0)) in cache._entries


def test_shared_byte_strings_skip_hashing_but_equal_bytes_still_hit(monkeypatch):
    import copy

    cache = DecodeCache()
    rec = _rec(4.0)
    first = cache.decode(rec)
    hashed = []
    real = DecodeCache.digest
    monkeypatch.setattr(DecodeCache, "digest", staticmethod(lambda r: hashed.append(1) or real(r)))
    # an in-process copy shares the (immutable) byte strings: no hashing
    again = cache.decode(copy.deepcopy(rec))
    assert hashed == []
    np.testing.assert_array_equal(again["w"], first["w"])
    # the same bytes in new objects (a message from another process): hashed, a hit
    fresh = _rec(4.0)
    assert fresh["w"].data is not rec["w"].data
    np.testing.assert_array_equal(cache.decode(fresh)["w"], first["w"])
    assert hashed == [1]


def test_in_process_transport_copies_share_the_bytes_and_are_independent():
    from flwr.app import ConfigRecord, Message, RecordDict

    from mmfl_flwr.grid import ensure_task_identity, transport_copy

    ensure_task_identity()
    rec = _rec(1.0)
    msg = Message(
        RecordDict({"arrays.x": rec, "config": ConfigRecord({"k": 1})}),
        dst_node_id=3,
        message_type="query.losses",
        group_id="1",
    )
    copy_ = transport_copy(msg)
    assert copy_.content["arrays.x"]["w"].data is rec["w"].data  # immutable, shared
    assert copy_.content["arrays.x"] is not rec
    copy_.content["config"]["k"] = 2
    assert msg.content["config"]["k"] == 1
    assert copy_.metadata.dst_node_id == 3
