"""Sensor recordings in MCAP: what the daemon received and published, byte for byte.

A recording holds, per message, the exact ZeroMQ frames of the vlad wire protocol
(``docs/protocol.md``), so a replay feeds a candidate precisely what the robot sent:

=========================== ================== =============================================
topic                       encoding           content
=========================== ================== =============================================
``/vlad/observations``      ``vlad.frames/1``  each observation as received (topic, header, tensors)
``/vlad/actions``           ``vlad.frames/1``  each action chunk as published
``/vlad/state``             ``json``           daemon status snapshots
``/vlad/observations/info`` ``json``           seq, sensor time, instruction, proprio (for plots)
``/vlad/actions/info``      ``json``           obs seq, source, interventions, timings, actions
=========================== ================== =============================================

``vlad.frames/1`` is ``uint32 count`` then ``uint32 length + bytes`` per frame, little
endian. The ``json`` channels are what Foxglove and other MCAP tools plot directly. Log
times are wall-clock nanoseconds (monotonic stamp + the offset in the ``vlad.recording``
metadata); the monotonic stamps themselves are inside the frames.

:class:`McapRecorder` is what the daemon (or a controller-side tap) calls; it never blocks
the caller: frames are copied and queued, a writer thread compresses and writes them, and
when the queue is full or a size/time limit is reached messages are dropped and counted.
:func:`read_recording` reads a file back.
"""

from __future__ import annotations

import json
import queue
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlad import protocol
from vlad.gates.results import GateError

RECORDING_FORMAT = "vlad.recording/1"
FRAMES_ENCODING = "vlad.frames/1"
TOPIC_OBS, TOPIC_ACT, TOPIC_STATE = "/vlad/observations", "/vlad/actions", "/vlad/state"
TOPIC_OBS_INFO, TOPIC_ACT_INFO = "/vlad/observations/info", "/vlad/actions/info"
_STOP = object()


def pack_frames(frames: Iterable[bytes]) -> bytes:
    """Frames -> one ``vlad.frames/1`` payload."""
    frames = list(frames)
    parts = [struct.pack("<I", len(frames))]
    for f in frames:
        parts += [struct.pack("<I", len(f)), f]
    return b"".join(parts)


def unpack_frames(data: bytes) -> list[bytes]:
    """One ``vlad.frames/1`` payload -> frames; :class:`GateError` when truncated."""
    try:
        (n,), pos, out = struct.unpack_from("<I", data, 0), 4, []
        for _ in range(n):
            (size,) = struct.unpack_from("<I", data, pos)
            pos += 4
            if pos + size > len(data):
                raise struct.error("frame runs past the end")
            out.append(data[pos : pos + size])
            pos += size
    except struct.error as exc:
        raise GateError(f"corrupt {FRAMES_ENCODING} message: {exc}") from None
    return out


def _as_bytes(frame: Any) -> bytes:
    # zmq.Frame exposes .bytes; memoryview/bytearray copy through bytes(): the caller's
    # buffer may be reused as soon as we return.
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)


class McapRecorder:
    """Thread-safe MCAP writer for what vlad receives and publishes.

    Call :meth:`observation` / :meth:`actions` with the message frames and a
    ``time.monotonic_ns()`` stamp, :meth:`state` with a status dict; each returns at once
    (False when the message was dropped). Recording stops by itself at ``max_bytes`` of
    message data or ``max_seconds`` after the first observation or chunk; :meth:`close` flushes and finishes the file.
    ``stop_reason`` and :meth:`stats` say what happened.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        max_bytes: int = 100 * 2**20,
        max_seconds: float = 600.0,
        tap: str = "daemon",
        metadata: dict[str, Any] | None = None,
        queue_size: int = 1024,
    ) -> None:
        from mcap.writer import CompressionType, Writer

        self.path = Path(path)
        self.max_bytes, self.max_ns = int(max_bytes), int(max_seconds * 1e9)
        self._file = open(self.path, "wb")
        self._writer = Writer(self._file, compression=CompressionType.ZSTD)
        self._writer.start(profile="", library="vlad")
        self._offset_ns = time.time_ns() - time.monotonic_ns()
        self._t0: int | None = None
        self._channels = self._register()
        info = {
            "format": RECORDING_FORMAT,
            "tap": tap,
            "clock_offset_ns": str(self._offset_ns),
            "max_bytes": str(self.max_bytes),
            "max_seconds": str(max_seconds),
            **{k: str(v) for k, v in (metadata or {}).items()},
        }
        self._writer.add_metadata("vlad.recording", info)
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._accepted_bytes = 0
        self._counts = {"observations": 0, "actions": 0, "states": 0, "dropped": 0}
        self.stop_reason: str | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vlad-recorder", daemon=True)
        self._thread.start()

    def _register(self) -> dict[str, int]:
        w = self._writer
        obs_schema = w.register_schema("vlad.protocol.obs", "", b"")
        act_schema = w.register_schema("vlad.protocol.act", "", b"")
        obj = json.dumps({"type": "object"}).encode()
        json_schemas = {
            name: w.register_schema(name, "jsonschema", obj)
            for name in ("vlad.status", "vlad.observation_info", "vlad.action_info")
        }
        return {
            TOPIC_OBS: w.register_channel(TOPIC_OBS, FRAMES_ENCODING, obs_schema),
            TOPIC_ACT: w.register_channel(TOPIC_ACT, FRAMES_ENCODING, act_schema),
            TOPIC_STATE: w.register_channel(TOPIC_STATE, "json", json_schemas["vlad.status"]),
            TOPIC_OBS_INFO: w.register_channel(TOPIC_OBS_INFO, "json", json_schemas["vlad.observation_info"]),
            TOPIC_ACT_INFO: w.register_channel(TOPIC_ACT_INFO, "json", json_schemas["vlad.action_info"]),
        }

    # -- the caller's side (any thread, never blocks) ----------------------------------------

    def _accept(self, kind: str, t_ns: int, payload: Any, size: int) -> bool:
        with self._lock:
            if self._closed or self.stop_reason is not None:
                self._counts["dropped"] += 1
                return False
            if self._t0 is None and kind != "states":
                # The limit counts from the first observation or chunk, not from setup: a
                # status snapshot taken while the simulator still loads does not start it.
                self._t0 = t_ns
            if self._t0 is not None and t_ns - self._t0 > self.max_ns:
                self.stop_reason = f"time limit ({self.max_ns / 1e9:g} s) reached"
            elif self._accepted_bytes + size > self.max_bytes:
                self.stop_reason = f"size limit ({self.max_bytes} bytes) reached"
            if self.stop_reason is not None:
                self._counts["dropped"] += 1
                return False
            try:
                self._queue.put_nowait((kind, t_ns, payload))
            except queue.Full:  # the writer fell behind: drop rather than stall the caller
                self._counts["dropped"] += 1
                return False
            self._accepted_bytes += size
            self._counts[kind] += 1
            return True

    def observation(self, frames: Iterable[Any], t_receive_ns: int | None = None) -> bool:
        """Record one observation message as received (its frames, at ``t_receive_ns``)."""
        data = [_as_bytes(f) for f in frames]
        return self._accept("observations", t_receive_ns or time.monotonic_ns(), data, sum(map(len, data)))

    def actions(self, frames: Iterable[Any], t_ns: int | None = None) -> bool:
        """Record one action-chunk message as published (or received by a controller tap)."""
        data = [_as_bytes(f) for f in frames]
        return self._accept("actions", t_ns or time.monotonic_ns(), data, sum(map(len, data)))

    def state(self, status: dict[str, Any], t_ns: int | None = None) -> bool:
        """Record a status snapshot (any JSON-able dict)."""
        data = json.dumps(status, default=str).encode()
        return self._accept("states", t_ns or time.monotonic_ns(), data, len(data))

    def stats(self) -> dict[str, Any]:
        """Messages recorded per kind, dropped, bytes accepted and why recording stopped."""
        with self._lock:
            return {**self._counts, "bytes": self._accepted_bytes, "stop_reason": self.stop_reason}

    def close(self) -> dict[str, Any]:
        """Write what is queued, the summary metadata and the MCAP footer; idempotent."""
        with self._lock:
            already, self._closed = self._closed, True
        if already:
            return self.stats()
        self._queue.put(_STOP)
        self._thread.join()
        stats = self.stats()
        self._writer.add_metadata("vlad.recording.summary", {k: str(v) for k, v in stats.items()})
        self._writer.finish()
        self._file.close()
        if self._error is not None:
            raise GateError(f"recording {self.path} failed: {self._error}") from self._error
        return stats

    def __enter__(self) -> McapRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        seq = 0
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._error is not None:
                continue  # keep draining so callers never block; close() reports the error
            kind, t_ns, payload = item
            seq += 1
            try:
                self._write(kind, t_ns + self._offset_ns, payload, seq)
            except Exception as exc:  # a full disk must not take the daemon down with it
                self._error = exc

    def _write(self, kind: str, log_time: int, payload: Any, seq: int) -> None:
        add = self._writer.add_message
        if kind == "states":
            add(self._channels[TOPIC_STATE], log_time, payload, log_time, seq)
            return
        topic = TOPIC_OBS if kind == "observations" else TOPIC_ACT
        add(self._channels[topic], log_time, pack_frames(payload), log_time, seq)
        info = _info(kind, payload)
        if info is not None:
            info_topic = TOPIC_OBS_INFO if kind == "observations" else TOPIC_ACT_INFO
            add(self._channels[info_topic], log_time, json.dumps(info).encode(), log_time, seq)


def _info(kind: str, frames: list[bytes]) -> dict[str, Any] | None:
    """The small JSON twin of a message, for plotting tools; None if it does not decode."""
    try:
        msg = protocol.decode(frames)
    except protocol.ProtocolError:
        return None
    h = msg.header
    if kind == "observations":
        proprio = msg.tensors.get("proprio")
        return {
            "seq": h.get("seq"),
            "t_sensor_ns": h.get("t_sensor_ns"),
            "instruction": h.get("instruction"),
            "proprio": proprio.tolist() if proprio is not None else None,
        }
    actions = msg.tensors.get("actions")
    return {
        "seq": h.get("seq"),
        "obs_seq": h.get("obs_seq"),
        "source": h.get("source"),
        "interventions": h.get("interventions"),
        "timings_ms": h.get("timings_ms"),
        "actions": actions.tolist() if actions is not None else None,
    }


# ---- reading ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedObservation:
    """One observation as the daemon received it."""

    seq: int
    t_sensor_ns: int
    t_ns: int  # monotonic receive (or send, for a controller tap) time
    instruction: str | None
    images: dict[str, np.ndarray]
    proprio: np.ndarray | None
    reanchor: bool = False  # the controller announced a joint-state jump (docs/protocol.md)


@dataclass(frozen=True)
class RecordedChunk:
    """One action chunk as the daemon published it (after the guard)."""

    seq: int
    obs_seq: int
    t_sensor_ns: int
    t_issue_ns: int
    valid_until_ns: int
    period_ns: int
    source: str
    interventions: tuple[str, ...]
    timings_ms: dict[str, float]
    actions: np.ndarray
    advisory: bool = False  # an advisory hold (docs/protocol.md): controllers keep a valid chunk

    @property
    def is_hold(self) -> bool:
        return self.source.startswith("hold")


@dataclass
class Recording:
    """A recording read back: metadata, observations and chunks in log-time order."""

    path: Path
    metadata: dict[str, dict[str, str]]
    observations: list[RecordedObservation] = field(default_factory=list)
    chunks: list[RecordedChunk] = field(default_factory=list)
    states: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        ts = [o.t_ns for o in self.observations]
        return (max(ts) - min(ts)) / 1e9 if ts else 0.0

    def chunk_for(self) -> dict[int, RecordedChunk]:
        """The policy chunk (not a hold) answering each observation seq."""
        return {c.obs_seq: c for c in self.chunks if not c.is_hold}


def iter_messages(path: str | Path) -> Iterator[tuple[str, int, bytes]]:
    """``(topic, log_time_ns, data)`` of every message, in log-time order."""
    from mcap.reader import make_reader

    with open(path, "rb") as f:
        for _schema, channel, message in make_reader(f).iter_messages():
            yield channel.topic, message.log_time, message.data


def read_recording(path: str | Path, limit: int = 0) -> Recording:
    """Read a recording made by :class:`McapRecorder`; ``limit`` caps the observations."""
    from mcap.exceptions import McapError
    from mcap.reader import make_reader

    path = Path(path)
    try:
        with open(path, "rb") as f:
            meta = {m.name: dict(m.metadata) for m in make_reader(f).iter_metadata()}
        info = meta.get("vlad.recording", {})
        if info.get("format") != RECORDING_FORMAT:
            raise GateError(
                f"{path}: not a vlad recording (no {RECORDING_FORMAT} metadata); record one with `vladctl record`"
            )
        offset = int(info.get("clock_offset_ns", "0"))
        rec = Recording(path, meta)
        for topic, log_time, data in iter_messages(path):
            t = log_time - offset
            if topic == TOPIC_OBS and (not limit or len(rec.observations) < limit):
                obs = _observation(unpack_frames(data), t)
                if obs is not None:
                    rec.observations.append(obs)
            elif topic == TOPIC_ACT:
                rec.chunks.append(_chunk(unpack_frames(data)))
            elif topic == TOPIC_STATE:
                rec.states.append((t, json.loads(data)))
    except FileNotFoundError:
        raise GateError(f"{path}: no such recording") from None
    except (McapError, OSError, ValueError, protocol.ProtocolError) as exc:
        raise GateError(f"{path}: unreadable recording: {exc}") from None
    return rec


def _observation(frames: list[bytes], t_ns: int) -> RecordedObservation | None:
    msg = protocol.decode(frames)
    if msg.topic != protocol.TOPIC_OBS:
        return None  # heartbeats share the observation socket
    h = msg.header
    images = {k[len("image/") :]: v for k, v in msg.tensors.items() if k.startswith("image/")}
    return RecordedObservation(
        int(h["seq"]),
        int(h["t_sensor_ns"]),
        t_ns,
        h.get("instruction"),
        images,
        msg.tensors.get("proprio"),
        h.get("reanchor") is True,
    )


def _chunk(frames: list[bytes]) -> RecordedChunk:
    msg = protocol.decode(frames, expect=(protocol.TOPIC_ACTIONS,))
    h = msg.header
    return RecordedChunk(
        int(h["seq"]),
        int(h["obs_seq"]),
        int(h["t_sensor_ns"]),
        int(h["t_issue_ns"]),
        int(h["valid_until_ns"]),
        int(h["period_ns"]),
        str(h.get("source", "")),
        tuple(h.get("interventions", ())),
        dict(h.get("timings_ms", {})),
        np.array(msg.tensors["actions"]),
        h.get("advisory") is True,
    )
