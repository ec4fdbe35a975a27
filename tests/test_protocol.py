"""The wire format: encoding, decoding, and a reason for every refusal."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from vlad import protocol


def test_roundtrip_keeps_dtype_shape_and_bytes():
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    q = np.array([1.5, -2.0], np.float32)
    frames = protocol.encode(protocol.TOPIC_OBS, {"seq": 7, "t_sensor_ns": 5}, {"image/a": img, "proprio": q})
    msg = protocol.decode([bytes(f) for f in frames])
    assert msg.topic == b"obs" and msg.seq == 7 and msg.header["v"] == protocol.VERSION
    np.testing.assert_array_equal(msg.tensors["image/a"], img)
    assert msg.tensors["proprio"].dtype == np.float32


def test_big_endian_input_goes_out_little_endian():
    q = np.array([1.0, 2.0], dtype=">f4")
    frames = protocol.encode(protocol.TOPIC_OBS, {"seq": 1}, {"proprio": q})
    assert bytes(frames[2]) == np.array([1.0, 2.0], "<f4").tobytes()


@pytest.mark.parametrize(
    "frames,reason",
    [
        ([b"obs"], "malformed"),
        ([b"xyz", msgpack.packb({"v": 1, "kind": "xyz", "seq": 1})], "unknown_topic"),
        ([b"obs", b"\xc1"], "malformed"),
        ([b"obs", msgpack.packb({"v": 9, "kind": "obs", "seq": 1})], "bad_version"),
        ([b"obs", msgpack.packb({"v": 1, "kind": "act", "seq": 1})], "malformed"),
        ([b"obs", msgpack.packb({"v": 1, "kind": "obs", "seq": -1})], "malformed"),
        (
            [
                b"obs",
                msgpack.packb(
                    {"v": 1, "kind": "obs", "seq": 1, "tensors": [{"name": "x", "dtype": "object", "shape": [1]}]}
                ),
                b"\0",
            ],
            "bad_dtype",
        ),
        (
            [
                b"obs",
                msgpack.packb(
                    {"v": 1, "kind": "obs", "seq": 1, "tensors": [{"name": "x", "dtype": "float32", "shape": [2]}]}
                ),
                b"\0" * 7,
            ],
            "bad_shape",
        ),
        ([b"obs", msgpack.packb({"v": 1, "kind": "obs", "seq": 1, "tensors": []}), b"extra"], "malformed"),
    ],
    ids=["one-frame", "topic", "not-msgpack", "version", "kind", "seq", "dtype", "size", "extra-frame"],
)
def test_bad_messages_are_refused_with_a_reason(frames, reason):
    with pytest.raises(protocol.ProtocolError) as exc:
        protocol.decode(frames)
    assert exc.value.reason == reason
