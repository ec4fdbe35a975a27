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

import enum
import math
import time
from collections.abc import Callable, Mapping, Sequence
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
MAX_AXIS = 2**31 - 1
MAX_ITEMS = 4096  # entries of any msgpack array or map
MAX_TEXT = 1024  # characters of a string a human or a log sees (instruction, client name)
MAX_REQUEST_BYTES = 64 * 1024  # a control request


class Rejection(enum.StrEnum):
    """Why vlad refused a message: the key it is counted under (``status.counters.rejected``)
    and, for an observation, the ``reason`` of the ``hold:rejected`` chunk that answers it
    (docs/protocol.md, "Rejections"). The control channel counts these under ``control_<reason>``."""

    MALFORMED = "malformed"  # not the protocol (frames, header, fields)
    UNKNOWN_TOPIC = "unknown_topic"
    BAD_VERSION = "bad_version"
    TOO_LARGE = "too_large"
    BAD_DTYPE = "bad_dtype"
    BAD_SHAPE = "bad_shape"
    UNKNOWN_TENSOR = "unknown_tensor"
    MISSING_TENSOR = "missing_tensor"
    NONFINITE = "nonfinite"
    TOO_MANY_CONTROLLERS = "too_many_controllers"
    NAME_IN_USE = "name_in_use"
    FUTURE_TIMESTAMP = "future_timestamp"
    PROPRIO_OUT_OF_LIMITS = "proprio_out_of_limits"  # the guard's judgement of the joint state
    IMPLAUSIBLE_PROPRIO = "implausible_proprio"
    INSTRUCTION_TOO_LONG = "instruction_too_long"  # the release's tokenizer refused it (a cycle's)
    BAD_INPUT = "bad_input"  # the release's preprocessing refused it (a cycle's)
    INTERNAL_ERROR = "internal_error"  # a check raised what vlad did not expect (a bug)
    UNKNOWN_COMMAND = "unknown_command"  # control channel only


class ProtocolError(VladError):
    """A message that does not follow the protocol; ``reason`` is a short counter key.
    ``header``: the message's header map when it could be read (a receiver may still answer
    the sender about it)."""

    def __init__(self, reason: Rejection, detail: str) -> None:
        self.reason = reason
        self.header: dict | None = None
        super().__init__(f"{reason}: {detail}")


@dataclass
class Message:
    """A decoded message: its topic, header map and named tensors (read-only views)."""

    topic: bytes
    header: dict[str, Any]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    layout: Layout | None = None  # set when the tensors matched the receiver's Layout exactly

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
                raise ProtocolError(
                    Rejection.BAD_DTYPE, f"tensor {name!r} has dtype {a.dtype}, allowed: {', '.join(WIRE_DTYPES)}"
                )
            if a.dtype.byteorder == ">":
                a = a.astype(a.dtype.newbyteorder("<"))
            descs.append({"name": name, "dtype": a.dtype.name, "shape": list(a.shape)})
            # numpy's stubs declare ndarray.__buffer__ only for Python >= 3.12
            frames.append(memoryview(a).cast("B") if a.size else b"")  # type: ignore[arg-type]
        head["tensors"] = descs
    frames[1] = msgpack.packb(head, use_bin_type=True)
    return frames


class Layout:
    """The tensors of a message known in advance: names, dtypes and shapes, in order.

    The hot paths send and receive the same tensors every cycle (a contract's cameras and
    proprio; an action chunk). A layout describes them once, so :meth:`encode` writes the
    precomputed descriptions instead of inspecting every array, and :func:`decode` turns
    a message whose descriptions equal :attr:`descs` into arrays without re-checking each
    one (names, dtypes and shapes are then this layout's, already valid). Why it matters:
    at 50 Hz every cycle starts on cold CPU caches, where each numpy attribute, dtype
    lookup and per-tensor branch costs tens of microseconds rather than tens of
    nanoseconds (docs/benchmarks.md, "Serving overhead").
    """

    def __init__(self, tensors: Sequence[tuple[str, str, Sequence[int]]]) -> None:  # (name, dtype, shape)
        if len(tensors) > MAX_TENSORS:
            raise ProtocolError(Rejection.MALFORMED, f"a layout of {len(tensors)} tensors (at most {MAX_TENSORS})")
        descs: list[dict[str, Any]] = []
        parts: list[tuple[np.dtype, tuple[int, ...], int]] = []
        for name, dtype, shape in tensors:
            dims = [int(n) for n in shape]
            desc = {"name": name, "dtype": dtype, "shape": dims}
            dt = _le(dtype)
            nbytes = math.prod(dims) * dt.itemsize
            _tensor(desc, b"\0" * nbytes)  # a valid description on the wire, or ProtocolError
            descs.append(desc)
            if dt.isnative:
                dt = np.dtype(dtype)  # the builtin instance: arrays made here carry this very object
            parts.append((dt, tuple(dims), nbytes))
        self.descs = descs
        self.names: tuple[str, ...] = tuple(name for name, _, _ in tensors)
        self._parts = tuple(parts)

    @classmethod
    def of(cls, msg: Message) -> Layout:
        """The layout of a message that passed :func:`decode` (a receiver learns it once)."""
        return cls([(name, a.dtype.name, a.shape) for name, a in msg.tensors.items()])

    def describes(self, descs: Any) -> bool:
        """``descs`` (a header's ``tensors``) are exactly this layout's: equal, and every axis
        an ``int`` (``1.0`` and ``true`` compare equal to ``1`` but are not valid sizes, as
        the full checks would say)."""
        return descs == self.descs and all(type(n) is int for d in descs for n in d["shape"])

    def arrays(self, frames: Sequence[Any]) -> dict[str, np.ndarray]:
        if len(frames) != 2 + len(self._parts):
            raise ProtocolError(
                Rejection.MALFORMED, f"header describes {len(self._parts)} tensor(s), message has {len(frames) - 2}"
            )
        out: dict[str, np.ndarray] = {}
        for name, (dt, shape, nbytes), buf in zip(self.names, self._parts, frames[2:], strict=True):
            view = memoryview(buf)
            if view.nbytes != nbytes:
                raise ProtocolError(
                    Rejection.BAD_SHAPE, f"tensor {name!r}: {view.nbytes} bytes, {dt.name}{list(shape)} needs {nbytes}"
                )
            arr = np.ndarray(shape, dt, view)  # one numpy call: frombuffer and reshape are two
            out[name] = arr if dt.isnative else arr.astype(dt.newbyteorder("="))
        return out

    def matches(self, arrays: Sequence[np.ndarray]) -> bool:
        """The arrays are this layout's (dtype, shape, C order): :meth:`encode` can take them."""
        if len(arrays) != len(self._parts):
            return False
        for a, (dt, shape, _) in zip(arrays, self._parts, strict=True):
            if not ((a.dtype is dt or a.dtype == dt) and a.shape == shape and a.flags.c_contiguous):
                return False
        return True

    def encode(self, topic: bytes, header: Mapping[str, Any], arrays: Sequence[np.ndarray]) -> list[Any]:
        """The frames of one message with these tensors, in this layout's order. Arrays
        that do not match it (:meth:`matches`) go through the generic :func:`encode`."""
        if not self.matches(arrays):
            return encode(topic, header, dict(zip(self.names, arrays, strict=True)))
        head = {"v": VERSION, "kind": topic.decode(), **header, "tensors": self.descs}
        # numpy's stubs declare ndarray.__buffer__ only for Python >= 3.12
        return [topic, msgpack.packb(head, use_bin_type=True), *(memoryview(a).cast("B") for a in arrays)]  # type: ignore[arg-type]


def unpack_bounded(
    raw: bytes | memoryview,
    max_bytes: int,
    max_items: int = MAX_ITEMS,
    object_hook: Callable[[dict], Any] | None = None,
) -> Any:
    """msgpack -> Python with every length bounded before anything is allocated: strings
    and binaries by ``max_bytes``, arrays and maps by ``max_items``, no extension types,
    only string map keys. msgpack's own exceptions (several types) pass through."""
    return msgpack.unpackb(
        raw,
        object_hook=object_hook,
        raw=False,
        strict_map_key=True,
        use_list=True,
        max_str_len=max_bytes,
        max_bin_len=max_bytes,
        max_array_len=max_items,
        max_map_len=max_items,
        max_ext_len=0,
    )


def _unpack(raw: bytes | memoryview, what: str, max_bytes: int) -> Any:
    """msgpack -> Python, with every size bounded before anything is allocated."""
    if len(raw) > max_bytes:
        raise ProtocolError(Rejection.TOO_LARGE, f"{what} of {len(raw)} bytes exceeds {max_bytes}")
    try:
        return unpack_bounded(raw, max_bytes)
    except Exception as exc:  # msgpack raises several types (and RecursionError on deep nesting)
        raise ProtocolError(Rejection.MALFORMED, f"{what} is not valid msgpack ({type(exc).__name__})") from None


def is_version(value: Any) -> bool:
    """The protocol version, exactly: ``1.0`` and ``true`` compare equal to 1 but are not it."""
    return type(value) is int and value == VERSION


def check_text(value: Any, what: str, max_len: int = MAX_TEXT) -> str:
    """A string a human or a log will see: bounded, no NUL or other control characters."""
    if not isinstance(value, str):
        raise ProtocolError(Rejection.MALFORMED, f"{what} must be a string, got {type(value).__name__}")
    if len(value) > max_len:
        raise ProtocolError(Rejection.MALFORMED, f"{what} longer than {max_len} characters")
    if not value.isprintable():
        raise ProtocolError(Rejection.MALFORMED, f"{what} contains NUL or control characters")
    return value


def decode(frames: Sequence[Any], expect: tuple[bytes, ...] = TOPICS, layout: Layout | None = None) -> Message:
    """Parse and check one multipart message; raises :class:`ProtocolError` on anything off.

    ``frames`` may be ``bytes`` or zero-copy ``zmq.Frame`` objects (anything with the
    buffer protocol): tensors are then views on the received memory, not copies.

    ``layout``: the tensors this receiver expects (see :class:`Layout`). A message whose
    tensor descriptions are exactly those skips the per-tensor checks (they hold by
    construction); anything else takes the full checks, so the verdict is the same.
    """
    if len(frames) < 2:
        raise ProtocolError(Rejection.MALFORMED, f"{len(frames)} frame(s), need at least topic and header")
    topic = bytes(frames[0])
    if topic not in expect:
        raise ProtocolError(Rejection.UNKNOWN_TOPIC, f"topic {topic[:32]!r} not one of {[t.decode() for t in expect]}")
    header = _unpack(memoryview(frames[1]), "header", MAX_HEADER_BYTES)
    if not isinstance(header, dict):
        raise ProtocolError(Rejection.MALFORMED, "header is not a map")
    try:
        return _decode_rest(frames, topic, header, layout)
    except ProtocolError as exc:
        exc.header = header
        raise


def _decode_rest(frames: Sequence[Any], topic: bytes, header: dict, layout: Layout | None) -> Message:
    """:func:`decode` once the header is a map."""
    version = header.get("v")
    if not is_version(version):
        raise ProtocolError(Rejection.BAD_VERSION, f"protocol version {version!r:.32}, this daemon speaks {VERSION}")
    if header.get("kind") != topic.decode():
        raise ProtocolError(
            Rejection.MALFORMED, f"header kind {header.get('kind')!r:.32} does not match topic {topic.decode()!r}"
        )
    seq = header.get("seq")
    if type(seq) is not int or not 0 <= seq < 2**64:
        raise ProtocolError(Rejection.MALFORMED, f"seq must be an integer in [0, 2**64), got {seq!r:.32}")
    descs = header.get("tensors", [])
    if layout is not None and layout.describes(descs):
        return Message(topic, header, layout.arrays(frames), layout)
    if not isinstance(descs, list) or len(descs) > MAX_TENSORS:
        raise ProtocolError(Rejection.MALFORMED, f"tensors must be a list of at most {MAX_TENSORS} entries")
    if len(frames) != 2 + len(descs):
        raise ProtocolError(
            Rejection.MALFORMED, f"header describes {len(descs)} tensor(s), message has {len(frames) - 2}"
        )
    tensors: dict[str, np.ndarray] = {}
    for desc, buf in zip(descs, frames[2:], strict=True):
        name, arr = _tensor(desc, buf)
        if name in tensors:
            raise ProtocolError(Rejection.MALFORMED, f"tensor {name!r} appears twice")
        tensors[name] = arr
    return Message(topic, header, tensors)


def _tensor(desc: Any, buf: Any) -> tuple[str, np.ndarray]:
    if not isinstance(desc, dict):
        raise ProtocolError(Rejection.MALFORMED, "tensor description is not a map")
    name, dtype, shape = desc.get("name"), desc.get("dtype"), desc.get("shape")
    if not isinstance(name, str) or not name:
        raise ProtocolError(Rejection.MALFORMED, "tensor without a name")
    check_text(name, "tensor name", 64)
    if not isinstance(dtype, str):
        raise ProtocolError(Rejection.MALFORMED, f"tensor {name!r}: dtype must be a string")
    if dtype not in WIRE_DTYPES:
        raise ProtocolError(
            Rejection.BAD_DTYPE, f"tensor {name!r}: dtype {dtype!r:.32} not one of {', '.join(WIRE_DTYPES)}"
        )
    # Every axis at least 1 and bounded: a zero axis makes any byte count "match" and an
    # astronomic one overflows numpy's reshape ([0, 2**63] once passed both checks).
    if (
        not isinstance(shape, list)
        or not 1 <= len(shape) <= MAX_RANK
        or not all(type(n) is int and 1 <= n <= MAX_AXIS for n in shape)
    ):
        raise ProtocolError(
            Rejection.BAD_SHAPE,
            f"tensor {name!r}: shape {shape!r:.64} is not a list of 1 to {MAX_RANK} sizes in [1, {MAX_AXIS}]",
        )
    dt = _le(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes > MAX_TENSOR_BYTES:
        raise ProtocolError(Rejection.TOO_LARGE, f"tensor {name!r}: {nbytes} bytes exceeds {MAX_TENSOR_BYTES}")
    view = memoryview(buf)
    if view.nbytes != nbytes:
        raise ProtocolError(Rejection.BAD_SHAPE, f"tensor {name!r}: {view.nbytes} bytes, {dtype}{shape} needs {nbytes}")
    try:
        arr = np.frombuffer(view, dtype=dt).reshape(shape)
    except (ValueError, TypeError) as exc:  # defensive: the checks above should make this unreachable
        raise ProtocolError(Rejection.BAD_SHAPE, f"tensor {name!r}: {exc}") from None
    return name, arr if dt.isnative else arr.astype(dt.newbyteorder("="))


# ---------------------------------------------------------------------------------------
# Control channel (REQ/REP): one msgpack map each way
# ---------------------------------------------------------------------------------------


def encode_request(cmd: str, **args: Any) -> bytes:
    return msgpack.packb({"v": VERSION, "cmd": cmd, "args": args}, use_bin_type=True)


def decode_request(frame: Any) -> tuple[str, dict[str, Any]]:
    """A control request -> (command, arguments); :class:`ProtocolError` on anything off.

    Only the envelope is checked here; each command's arguments are checked against its
    schema by the daemon's command registry before anything runs.
    """
    req = _unpack(memoryview(frame), "control request", MAX_REQUEST_BYTES)
    if not isinstance(req, dict):
        raise ProtocolError(Rejection.MALFORMED, "control request is not a map")
    if not is_version(req.get("v")):
        raise ProtocolError(
            Rejection.BAD_VERSION, f"control request version {req.get('v')!r:.32}, this daemon speaks {VERSION}"
        )
    unknown = set(req) - {"v", "cmd", "args"}
    if unknown:
        raise ProtocolError(Rejection.MALFORMED, f"control request has unknown key(s) {sorted(map(str, unknown))[:5]}")
    cmd, args = req.get("cmd"), req.get("args", {})
    if not isinstance(cmd, str) or not isinstance(args, dict):
        raise ProtocolError(Rejection.MALFORMED, "control request needs 'cmd' (a string) and 'args' (a map)")
    check_text(cmd, "command", 64)
    return cmd, args


def encode_reply(ok: bool, result: Any = None, error: str | None = None) -> bytes:
    return msgpack.packb({"v": VERSION, "ok": ok, "result": result, "error": error}, use_bin_type=True)


def decode_reply(frame: Any) -> dict[str, Any]:
    rep = _unpack(memoryview(frame), "control reply", 64 * 2**20)
    if not isinstance(rep, dict) or not is_version(rep.get("v")):
        raise ProtocolError(Rejection.BAD_VERSION, "control reply has an unknown version")
    return rep


# -- action chunks ---------------------------------------------------------------------------


class HoldKind(enum.StrEnum):
    """Why a chunk is the hold posture, not a policy's output (``source`` ``hold:<kind>``
    on the wire; docs/protocol.md, "Hold chunks")."""

    ESTOP = "estop"  # the e-stop is engaged (binding, every period)
    FALLBACK = "fallback"  # the hold posture is what the fallback chain serves (binding)
    BRIDGE = "bridge"  # nothing went out for 1.5 periods while a controller streams (advisory)
    STALE = "stale"  # this observation was too old when inference would start (advisory)
    REJECTED = "rejected"  # this observation was refused; ``reason`` says why (advisory)
    BACKEND_ERROR = "backend_error"  # this observation's inference failed in the engine (binding)
    REMOTE_UNAVAILABLE = "remote_unavailable"  # ... on the remote link (binding)
    INTERNAL_ERROR = "internal_error"  # ... in vlad's own code (binding)

    @property
    def source(self) -> str:
        """The wire ``source`` of a hold of this kind."""
        return HOLD_PREFIX + self.value


HOLD_PREFIX = "hold:"
_HOLDS = {k.source: k for k in HoldKind}
_REJECTIONS = {r.value: r for r in Rejection}


@dataclass(frozen=True)
class ActionChunk:
    """One action chunk (after the guard): what the daemon publishes (:meth:`header`) and what
    a controller, a recording, the openpi endpoint and the episode runner read back
    (:func:`decode_chunk`; ``t_receive_ns`` = when it arrived, or its log time)."""

    seq: int
    obs_seq: int
    t_sensor_ns: int
    t_issue_ns: int
    valid_until_ns: int
    period_ns: int
    release: str
    state: str
    source: str  # the policy that produced it ("release", "fallback1", ...) or HoldKind.source
    interventions: tuple[str, ...]
    timings_ms: Mapping[str, float]
    actions: np.ndarray  # [chunk_length, action_dim], contract units
    t_receive_ns: int = 0
    advisory: bool = False  # a hold saying "no policy answer for this observation" (docs/protocol.md)
    rejection: Rejection | None = None  # on a hold:rejected, why the observation was refused
    client: str | None = None  # the controller whose observation it answers; None: every controller
    # Real-time chunking: the chunk (seq; 0: the held pose) it continues and the periods of it
    # that were frozen (they had run when it arrived); None: computed plain.
    rtc: tuple[int, int] | None = None
    policy: str = ""  # "<slot>:<release id>" of the policy that computed it, "hold" for a hold

    @property
    def hold(self) -> HoldKind | None:
        """The hold's kind; None for a policy chunk (and for a hold kind this vlad does not know)."""
        return _HOLDS.get(self.source)

    @property
    def reason(self) -> Rejection | HoldKind | None:
        """Why this is a hold (the header's ``reason``): the rejection of a ``hold:rejected``,
        else the hold's kind; None for a policy chunk."""
        return self.rejection or self.hold

    @property
    def is_hold(self) -> bool:
        """A hold posture (fallback, e-stop or a late inference), not a policy output."""
        return self.source.startswith(HOLD_PREFIX)

    def for_client(self, name: str) -> bool:
        """Whether the controller ``name`` executes this chunk: it answers that controller's
        observation, or it is for every controller (docs/protocol.md, "Which chunk to execute")."""
        return self.client is None or self.client == name

    def is_stale(self, now_ns: int | None = None) -> bool:
        """True once the chunk's validity has passed: never execute a stale chunk."""
        return (now_ns if now_ns is not None else time.monotonic_ns()) > self.valid_until_ns

    def action_at(self, now_ns: int | None = None) -> np.ndarray | None:
        """The waypoint for ``now``: waypoint k applies during the (k+1)-th control period
        after the sensor time, ``[t_sensor + k*period, t_sensor + (k+1)*period)``. None when
        stale or past the chunk's end."""
        now = now_ns if now_ns is not None else time.monotonic_ns()
        if self.is_stale(now):
            return None
        k = max(0, (now - self.t_sensor_ns) // self.period_ns) if self.period_ns else 0
        return self.actions[k] if k < len(self.actions) else None

    def header(self) -> dict[str, Any]:
        """The chunk's header on the wire (``encode(TOPIC_ACTIONS, header, (actions,))``)."""
        return {
            "seq": self.seq,
            "obs_seq": self.obs_seq,
            "t_sensor_ns": self.t_sensor_ns,
            "t_issue_ns": self.t_issue_ns,
            "valid_until_ns": self.valid_until_ns,
            "period_ns": self.period_ns,
            "release": self.release,
            "state": self.state,
            "source": self.source,
            "policy": self.policy,
            "interventions": list(self.interventions),
            "timings_ms": dict(self.timings_ms),
            "advisory": self.advisory,
            "reason": str(self.reason or ""),
            "client": self.client,
            "rtc": list(self.rtc) if self.rtc is not None else None,
        }


_U63 = 2**63 - 1
_U64 = 2**64 - 1
_F32 = np.dtype(np.float32)
_REJECTED = HoldKind.REJECTED.source


def decode_chunk(msg: Message, t_receive_ns: int) -> ActionChunk:
    """An ``act`` message as an :class:`ActionChunk`, every header field checked; raises
    :class:`ProtocolError` (reason ``malformed``) naming each field that is off.

    A chunk as the daemon writes it (every field present and valid) passes one pass of
    checks without a word of diagnosis; anything else takes the field-by-field checks,
    which accept what that pass accepts and name what is off (the fuzz target ``chunk``
    holds the two to the same verdict). Why two: a controller decodes each chunk on cold
    caches, where the one pass takes about 30 µs off the ~220 µs the decoding cost
    (docs/benchmarks.md, "The client's cold path")."""
    chunk = _plain_chunk(msg.header, msg.tensors.get("actions"), t_receive_ns)
    return chunk if chunk is not None else _checked_chunk(msg, t_receive_ns)


def _plain_chunk(h: dict[str, Any], actions: np.ndarray | None, t_receive_ns: int) -> ActionChunk | None:
    """The chunk when every header field is present and valid, else None (nothing said why)."""
    try:
        seq, obs_seq, t_sensor, t_issue = h["seq"], h["obs_seq"], h["t_sensor_ns"], h["t_issue_ns"]
        valid_until, period, release, state = h["valid_until_ns"], h["period_ns"], h["release"], h["state"]
        source, reason, policy, client = h["source"], h["reason"], h["policy"], h["client"]
        interventions, timings, advisory, rtc = h["interventions"], h["timings_ms"], h["advisory"], h["rtc"]
    except KeyError:
        return None
    if not (
        type(seq) is int and 0 <= seq <= _U64 and type(obs_seq) is int and 0 <= obs_seq <= _U64
        and type(t_sensor) is int and 0 <= t_sensor <= _U63 and type(t_issue) is int and 0 <= t_issue <= _U63
        and type(valid_until) is int and 0 <= valid_until <= _U63 and type(period) is int and 1 <= period <= _U63
        and type(release) is str and len(release) <= 256 and release.isprintable()
        and type(state) is str and len(state) <= 64 and state.isprintable()
        and type(source) is str and len(source) <= 256 and source.isprintable()
        and type(reason) is str and len(reason) <= 256 and reason.isprintable()
        and type(policy) is str and len(policy) <= 256 and policy.isprintable()
        and (client is None or (type(client) is str and len(client) <= 128 and client.isprintable()))
        and type(interventions) is list and type(timings) is dict and type(advisory) is bool
        and (rtc is None or (
            type(rtc) is list and len(rtc) == 2 and type(rtc[0]) is int and type(rtc[1]) is int
            and 0 <= rtc[0] <= _U63 and 0 <= rtc[1] <= _U63
        ))
        and actions is not None and (actions.dtype is _F32 or actions.dtype == _F32) and actions.ndim == 2
    ):  # fmt: skip
        return None
    for name in interventions:
        if type(name) is not str or len(name) > 64:
            return None
    timings_ms = {}
    for k, v in timings.items():
        if type(k) is not str or type(v) not in (int, float) or not math.isfinite(v):
            return None
        timings_ms[k] = float(v)
    rejection = None
    if source == _REJECTED and (rejection := _REJECTIONS.get(reason)) is None:
        return None
    return ActionChunk(
        seq=seq, obs_seq=obs_seq, t_sensor_ns=t_sensor, t_issue_ns=t_issue, valid_until_ns=valid_until,
        period_ns=period, release=release, state=state, source=source, interventions=tuple(interventions),
        timings_ms=timings_ms, actions=actions, t_receive_ns=t_receive_ns, advisory=advisory,
        rejection=rejection, client=client, rtc=(rtc[0], rtc[1]) if rtc is not None else None, policy=policy,
    )  # fmt: skip


def _checked_chunk(msg: Message, t_receive_ns: int) -> ActionChunk:
    """:func:`decode_chunk` field by field: every problem named (missing optional fields
    take their defaults)."""
    h, problems = msg.header, []

    def integer(name: str, low: int = 0, high: int = _U63) -> int:
        v = h.get(name)
        if name not in h:
            problems.append(f"{name}: missing")
            return 0
        if type(v) is not int or not low <= v <= high:
            problems.append(f"{name}: expected an integer in [{low}, {high}], got {v!r:.32}")
            return 0
        return v

    def text(name: str, max_len: int = 256, optional: bool = False) -> Any:
        v = h.get(name, None if optional else "")
        if v is None and optional:
            return None
        if not isinstance(v, str) or len(v) > max_len or (v and not v.isprintable()):
            problems.append(f"{name}: expected a printable string of at most {max_len} characters, got {v!r:.32}")
            return ""
        return v

    seq, obs_seq = integer("seq", high=2**64 - 1), integer("obs_seq", high=2**64 - 1)
    t_sensor, t_issue, valid_until = integer("t_sensor_ns"), integer("t_issue_ns"), integer("valid_until_ns")
    period = integer("period_ns", low=1)
    release, state, source, reason = text("release"), text("state", 64), text("source"), text("reason")
    policy = text("policy")
    client = text("client", 128, optional=True)
    interventions = h.get("interventions", [])
    if type(interventions) is not list or not all(isinstance(i, str) and len(i) <= 64 for i in interventions):
        problems.append(f"interventions: expected a list of names, got {interventions!r:.32}")
        interventions = []
    timings = h.get("timings_ms", {})
    if not isinstance(timings, dict):
        problems.append(f"timings_ms: expected a map of names to numbers, got {timings!r:.32}")
        timings = {}
    for k, v in timings.items():
        if not isinstance(k, str) or type(v) not in (int, float) or not math.isfinite(v):
            problems.append(f"timings_ms.{str(k)[:32]}: expected a finite number, got {v!r:.32}")
            timings = {}
            break
    advisory = h.get("advisory", False)
    if type(advisory) is not bool:
        problems.append(f"advisory: expected true or false, got {advisory!r:.32}")
    rtc = h.get("rtc")
    if rtc is not None and not (
        type(rtc) is list and len(rtc) == 2 and all(type(v) is int and 0 <= v <= _U63 for v in rtc)
    ):
        problems.append(f"rtc: expected [chunk seq, delay periods], got {rtc!r:.64}")
        rtc = None
    rejection = None
    if source == HoldKind.REJECTED.source:
        if reason not in _REJECTIONS:
            problems.append(f"reason: a hold:rejected needs a rejection reason (docs/protocol.md), got {reason!r:.32}")
        rejection = _REJECTIONS.get(reason)
    actions = msg.tensors.get("actions")
    if actions is None or actions.ndim != 2 or actions.dtype != np.float32:
        problems.append("actions: expected a 2-D float32 tensor")
    if problems:
        raise ProtocolError(Rejection.MALFORMED, "action chunk: " + "; ".join(problems))
    assert actions is not None  # checked above
    return ActionChunk(
        seq=seq, obs_seq=obs_seq, t_sensor_ns=t_sensor, t_issue_ns=t_issue, valid_until_ns=valid_until,
        period_ns=period, release=release, state=state, source=source, interventions=tuple(interventions),
        timings_ms={k: float(v) for k, v in timings.items()}, actions=actions, t_receive_ns=t_receive_ns,
        advisory=advisory is True, rejection=rejection, client=client, rtc=(rtc[0], rtc[1]) if rtc is not None else None,
        policy=policy,
    )  # fmt: skip
