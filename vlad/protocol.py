"""The vlad wire protocol (version 1): ZeroMQ multipart messages, msgpack header, raw tensors.

Every message on the observation, action and status sockets is::

    frame 0   topic     ASCII: b"obs" | b"hb" | b"act" | b"status" | b"estop"
    frame 1   header    msgpack map: {"v": 1, "kind": <topic>, "seq": <uint64>, ...}
    frame 2.. tensors   raw little-endian, C-order bytes, one frame per entry of
                        header["tensors"] = [{"name": str, "dtype": str, "shape": [int...]}]

Control requests (REQ/REP) are one msgpack frame each way. ``docs/protocol.md`` is the
reference for implementers in other languages. Nothing here unpickles anything: msgpack
is decoded with ``strict_map_key`` and without extension types, tensors with
``np.frombuffer``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from vlad.errors import VladError

VERSION = 1

TOPIC_OBS = b"obs"
TOPIC_HEARTBEAT = b"hb"
TOPIC_ACTIONS = b"act"
TOPIC_STATUS = b"status"
TOPIC_ESTOP = b"estop"
TOPICS = (TOPIC_OBS, TOPIC_HEARTBEAT, TOPIC_ACTIONS, TOPIC_STATUS, TOPIC_ESTOP)

# Dtypes allowed on the wire (little-endian); anything else is rejected.
WIRE_DTYPES = ("uint8", "uint16", "int32", "int64", "float16", "float32", "float64", "bool")
MAX_HEADER_BYTES = 64 * 1024
MAX_TENSOR_BYTES = 64 * 1024 * 1024
MAX_TENSORS = 16
MAX_RANK = 8


class ProtocolError(VladError):
    """A message that does not follow the protocol; ``reason`` is a short counter key."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


@dataclass
class Message:
    """A decoded message: its topic, header map and named tensors (read-only views)."""

    topic: bytes
    header: dict[str, Any]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def seq(self) -> int:
        return self.header["seq"]


def _le(dtype: str) -> np.dtype:
    return np.dtype(dtype).newbyteorder("<")


def encode(topic: bytes, header: Mapping[str, Any], tensors: Mapping[str, np.ndarray] | None = None) -> list[bytes]:
    """Build the frames of one message. Tensors are sent without copying where possible."""
    head = {"v": VERSION, "kind": topic.decode(), **header}
    frames: list = [topic, b""]
    if tensors:
        descs = []
        for name, arr in tensors.items():
            a = np.ascontiguousarray(arr)
            if a.dtype.name not in WIRE_DTYPES:
                raise ProtocolError("bad_dtype", f"tensor {name!r} has dtype {a.dtype}, allowed: {', '.join(WIRE_DTYPES)}")
            if a.dtype.byteorder == ">":
                a = a.astype(a.dtype.newbyteorder("<"))
            descs.append({"name": name, "dtype": a.dtype.name, "shape": list(a.shape)})
            frames.append(memoryview(a).cast("B") if a.size else b"")
        head["tensors"] = descs
    frames[1] = msgpack.packb(head, use_bin_type=True)
    return frames


def decode(frames: Sequence[bytes | memoryview], expect: tuple[bytes, ...] = TOPICS) -> Message:
    """Parse and check one multipart message; raises :class:`ProtocolError` on anything off."""
    if len(frames) < 2:
        raise ProtocolError("malformed", f"{len(frames)} frame(s), need at least topic and header")
    topic = bytes(frames[0])
    if topic not in expect:
        raise ProtocolError("unknown_topic", f"topic {topic[:32]!r} not one of {[t.decode() for t in expect]}")
    raw_header = frames[1]
    if len(raw_header) > MAX_HEADER_BYTES:
        raise ProtocolError("malformed", f"header of {len(raw_header)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(bytes(raw_header), raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several exception types for bad input
        raise ProtocolError("malformed", f"header is not msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise ProtocolError("malformed", "header is not a map")
    version = header.get("v")
    if version != VERSION:
        raise ProtocolError("bad_version", f"protocol version {version!r}, this daemon speaks {VERSION}")
    if header.get("kind") != topic.decode():
        raise ProtocolError("malformed", f"header kind {header.get('kind')!r} does not match topic {topic.decode()!r}")
    seq = header.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise ProtocolError("malformed", f"seq must be a non-negative integer, got {seq!r}")
    descs = header.get("tensors", [])
    if not isinstance(descs, list) or len(descs) > MAX_TENSORS:
        raise ProtocolError("malformed", "tensors must be a list of at most %d entries" % MAX_TENSORS)
    if len(frames) != 2 + len(descs):
        raise ProtocolError("malformed", f"header describes {len(descs)} tensor(s), message has {len(frames) - 2}")
    tensors: dict[str, np.ndarray] = {}
    for desc, buf in zip(descs, frames[2:]):
        name, arr = _tensor(desc, buf)
        if name in tensors:
            raise ProtocolError("malformed", f"tensor {name!r} appears twice")
        tensors[name] = arr
    return Message(topic, header, tensors)


def _tensor(desc: Any, buf: bytes | memoryview) -> tuple[str, np.ndarray]:
    if not isinstance(desc, dict):
        raise ProtocolError("malformed", "tensor description is not a map")
    name, dtype, shape = desc.get("name"), desc.get("dtype"), desc.get("shape")
    if not isinstance(name, str) or not name:
        raise ProtocolError("malformed", "tensor without a name")
    if dtype not in WIRE_DTYPES:
        raise ProtocolError("bad_dtype", f"tensor {name!r}: dtype {dtype!r} not one of {', '.join(WIRE_DTYPES)}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    ):
        raise ProtocolError("bad_shape", f"tensor {name!r}: shape {shape!r} is not a list of at most {MAX_RANK} sizes")
    dt = _le(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes > MAX_TENSOR_BYTES:
        raise ProtocolError("bad_shape", f"tensor {name!r}: {nbytes} bytes exceeds {MAX_TENSOR_BYTES}")
    if len(buf) != nbytes:
        raise ProtocolError("bad_shape", f"tensor {name!r}: {len(buf)} bytes, {dtype}{shape} needs {nbytes}")
    arr = np.frombuffer(buf, dtype=dt).reshape(shape)
    return name, arr.astype(dt.newbyteorder("="), copy=False)


# ---------------------------------------------------------------------------------------
# Control channel (REQ/REP): one msgpack map each way
# ---------------------------------------------------------------------------------------


def encode_request(cmd: str, **args: Any) -> bytes:
    return msgpack.packb({"v": VERSION, "cmd": cmd, "args": args}, use_bin_type=True)


def decode_request(frame: bytes) -> tuple[str, dict[str, Any]]:
    try:
        req = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception:
        raise ProtocolError("malformed", "control request is not msgpack") from None
    if not isinstance(req, dict) or req.get("v") != VERSION:
        raise ProtocolError("bad_version", f"control request version {req.get('v') if isinstance(req, dict) else '?'!r}")
    cmd, args = req.get("cmd"), req.get("args", {})
    if not isinstance(cmd, str) or not isinstance(args, dict):
        raise ProtocolError("malformed", "control request needs 'cmd' (str) and 'args' (map)")
    return cmd, args


def encode_reply(ok: bool, result: Any = None, error: str | None = None) -> bytes:
    return msgpack.packb({"v": VERSION, "ok": ok, "result": result, "error": error}, use_bin_type=True)


def decode_reply(frame: bytes) -> dict[str, Any]:
    rep = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    if not isinstance(rep, dict) or rep.get("v") != VERSION:
        raise ProtocolError("bad_version", "control reply has an unknown version")
    return rep
