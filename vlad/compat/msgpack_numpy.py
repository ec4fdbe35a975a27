"""openpi's msgpack-numpy messages, decoded as if every byte were hostile.

openpi (``openpi_client/msgpack_numpy.py``) packs numpy arrays as maps
``{"__ndarray__": true, "data": bytes, "dtype": str, "shape": [...]}`` (and scalars as
``{"__npgeneric__": true, ...}``). Its own decoder trusts them; this one bounds everything
before anything is built:

* **objects**: :func:`scan` walks the message's msgpack structure, reading only type
  bytes and lengths, and refuses it past ``max_objects`` objects in all (nested lists and
  maps included) or ``max_depth`` levels. A 15 MiB message of nested empty lists is ~15
  million objects; it is refused after ``max_objects`` steps, never built. Only then does
  msgpack build the (small) object tree.
* **bytes**: the message is at most ``max_bytes`` (the websocket's own limit is the same);
  no string or binary inside can claim more.
* **arrays**: a dtype is one of a fixed list of numeric spellings (``"<f4"``, ``"|u1"``,
  ``"float32"`` ...), looked up, never parsed: ``np.dtype`` on a client's string would
  build structured dtypes from a comma string of any length. Rank at most 8, and the data
  exactly ``prod(shape) * itemsize`` bytes (a view on the message, no copy).

Every refusal is a :class:`BadRequest` with a counter key (``malformed``).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import numpy as np

from vlad.protocol import unpack_bounded

MAX_RANK = 8
MAX_OBJECTS = 4096  # an openpi observation has a few dozen
MAX_DEPTH = 32


class BadRequest(Exception):
    """A request the endpoint cannot turn into an observation; ``reason`` is the counter key."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _dtypes() -> dict[str, np.dtype]:
    out: dict[str, np.dtype] = {}
    for name in (
        "bool",
        "uint8",
        "int8",
        "uint16",
        "int16",
        "uint32",
        "int32",
        "uint64",
        "int64",
        "float16",
        "float32",
        "float64",
    ):
        dt = np.dtype(name)
        for spelled in (dt.str, dt.newbyteorder("<").str, dt.newbyteorder(">").str, "=" + dt.str[1:], dt.name):
            out[spelled] = np.dtype(spelled)
    return out


DTYPES = _dtypes()

# msgpack type bytes: (payload length size in bytes, kind) for the variable-length ones;
# kind "str"/"bin" skip a payload, "array"/"map" open a container, "ext" is refused.
_SIZED = {
    0xC4: (1, "bin"),
    0xC5: (2, "bin"),
    0xC6: (4, "bin"),
    0xC7: (1, "ext"),
    0xC8: (2, "ext"),
    0xC9: (4, "ext"),
    0xD9: (1, "str"),
    0xDA: (2, "str"),
    0xDB: (4, "str"),
    0xDC: (2, "array"),
    0xDD: (4, "array"),
    0xDE: (2, "map"),
    0xDF: (4, "map"),
}
# Fixed-size scalars: type byte -> bytes after it.
_FIXED = {
    0xC0: 0,
    0xC2: 0,
    0xC3: 0,
    0xCA: 4,
    0xCB: 8,
    0xCC: 1,
    0xCD: 2,
    0xCE: 4,
    0xCF: 8,
    0xD0: 1,
    0xD1: 2,
    0xD2: 4,
    0xD3: 8,
}
_LEN = {1: struct.Struct(">B"), 2: struct.Struct(">H"), 4: struct.Struct(">I")}


def scan(raw: bytes, max_objects: int = MAX_OBJECTS, max_depth: int = MAX_DEPTH) -> int:
    """Walk one msgpack value in ``raw`` without building it; the number of objects.

    Raises :class:`BadRequest` when it has more than ``max_objects`` objects, nests deeper
    than ``max_depth``, uses an extension type, is truncated or has bytes after its end.
    """
    n = len(raw)
    pos = 0
    objects = 0
    # One entry per open container: how many objects it still holds.
    stack: list[int] = []
    left = 1
    while True:
        while left == 0:
            if not stack:
                if pos != n:
                    raise BadRequest("malformed", f"{n - pos} bytes after the end of the message")
                return objects
            left = stack.pop()
        left -= 1
        objects += 1
        if objects > max_objects:
            raise BadRequest("malformed", f"more than {max_objects} objects in one message")
        if pos >= n:
            raise BadRequest("malformed", "message truncated")
        b = raw[pos]
        pos += 1
        if b <= 0x7F or b >= 0xE0:  # fixint
            continue
        if 0x80 <= b <= 0x9F:  # fixmap, fixarray
            count = (b & 0x0F) * (2 if b <= 0x8F else 1)
        elif 0xA0 <= b <= 0xBF:  # fixstr
            pos += b & 0x1F
            continue
        elif b in _FIXED:
            pos += _FIXED[b]
            continue
        elif b in _SIZED:
            size, kind = _SIZED[b]
            if pos + size > n:
                raise BadRequest("malformed", "message truncated")
            length = _LEN[size].unpack_from(raw, pos)[0]
            pos += size
            if kind == "ext":
                raise BadRequest("malformed", "msgpack extension types are not accepted")
            if kind in ("str", "bin"):
                pos += length
                continue
            count = length * (2 if kind == "map" else 1)
        else:  # 0xC1 (never used) and the fixext types
            raise BadRequest("malformed", f"msgpack type byte 0x{b:02x} is not accepted")
        if count > max_objects:
            raise BadRequest("malformed", f"a container of {count} entries (at most {max_objects} objects)")
        if count:
            if len(stack) >= max_depth:
                raise BadRequest("malformed", f"nested deeper than {max_depth} levels")
            stack.append(left)
            left = count


def _ndarray_hook(obj: dict) -> Any:
    """openpi's ``unpack_array``, minus what hostile input could abuse (module doc)."""
    if "__ndarray__" in obj or b"__ndarray__" in obj:
        get = obj.get
        dtype_s, shape, data = (get(k, get(k.encode())) for k in ("dtype", "shape", "data"))
        dtype = DTYPES.get(dtype_s) if isinstance(dtype_s, str) else None
        if dtype is None:
            raise BadRequest("malformed", f"array dtype {str(dtype_s)[:16]!r} is not one of the numeric dtypes")
        if (
            not isinstance(shape, (list, tuple))
            or len(shape) > MAX_RANK
            or not all(type(d) is int and d >= 0 for d in shape)
        ):
            raise BadRequest("malformed", f"array shape {str(shape)[:64]} is invalid (at most {MAX_RANK} sizes >= 0)")
        if not isinstance(data, bytes) or len(data) != math.prod(shape) * dtype.itemsize:
            raise BadRequest("malformed", f"array data does not match shape {list(shape)} of {dtype.str}")
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if "__npgeneric__" in obj or b"__npgeneric__" in obj:
        get = obj.get
        dtype_s, data = (get(k, get(k.encode())) for k in ("dtype", "data"))
        dtype = DTYPES.get(dtype_s) if isinstance(dtype_s, str) else None
        if dtype is None or isinstance(data, (bytes, str, list, dict)) or data is None:
            raise BadRequest("malformed", "numpy scalar is invalid")
        try:
            return dtype.type(data)
        except (TypeError, ValueError, OverflowError):
            raise BadRequest("malformed", "numpy scalar is invalid") from None
    return obj


def unpack(raw: bytes, max_bytes: int, max_objects: int = MAX_OBJECTS) -> Any:
    """One message -> its objects (arrays as numpy views); :class:`BadRequest` when refused."""
    if len(raw) > max_bytes:
        raise BadRequest("too_large", f"message of {len(raw)} bytes, over {max_bytes}")
    scan(raw, max_objects)
    try:
        return unpack_bounded(raw, max_bytes, max_objects, object_hook=_ndarray_hook)
    except BadRequest:
        raise
    except Exception as exc:  # msgpack raises several types (invalid UTF-8, unhashable keys ...)
        raise BadRequest("malformed", f"not msgpack-numpy ({type(exc).__name__})") from None


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot pack {type(obj).__name__}")


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_pack_default)
