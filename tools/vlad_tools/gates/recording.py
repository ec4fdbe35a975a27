"""Sensor recordings in MCAP: what the daemon received and published, byte for byte.

A recording holds, per message, the exact ZeroMQ frames of the vlad wire protocol
(``docs/protocol.md``), so a replay feeds a candidate precisely what the robot sent:

=========================== ================== =============================================
topic                       encoding           content
=========================== ================== =============================================
``/vlad/observations``      ``vlad.frames/1``  each observation as received (topic, header, tensors)
``/vlad/actions``           ``vlad.frames/1``  each action chunk as published
``/vlad/state``             ``json``           daemon status snapshots
``/vlad/events``            ``json``           daemon events (state transitions, faults, swaps)
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

import dataclasses
import json
import os
import queue
import stat
import struct
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

from vlad import protocol, schema
from vlad.errors import ProblemsError, VladError
from vlad.files import create_regular
from vlad.protocol import ActionChunk
from vlad_tools.gates.results import GateError

RECORDING_FORMAT = "vlad.recording/1"
FRAMES_ENCODING = "vlad.frames/1"
TOPIC_OBS, TOPIC_ACT, TOPIC_STATE = "/vlad/observations", "/vlad/actions", "/vlad/state"
TOPIC_OBS_INFO, TOPIC_ACT_INFO = "/vlad/observations/info", "/vlad/actions/info"
TOPIC_EVENTS = "/vlad/events"
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


class _Output:
    """The recording's file as the MCAP writer's stream: each write whole or an OSError
    (``os.write`` may write part of a buffer), its position known, and ``good``, the end of
    the last complete record: where the file is cut back to when a write fails."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.position = self.good = 0

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        self.position += len(data)
        return len(data)

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        pass  # nothing buffered here

    def commit(self) -> None:
        self.good = self.position

    def cut(self) -> None:
        os.ftruncate(self.fd, self.good)
        os.lseek(self.fd, self.good, os.SEEK_SET)
        self.position = self.good


def _as_bytes(frame: Any) -> bytes:
    # zmq.Frame exposes .bytes; memoryview/bytearray copy through bytes(): the caller's
    # buffer may be reused as soon as we return.
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)


class McapRecorder:
    """Thread-safe MCAP writer for what vlad receives and publishes.

    Call :meth:`observation` / :meth:`actions` with the message frames and a
    ``time.monotonic_ns()`` stamp, :meth:`state` with a status dict; each returns at once
    (False when the message was dropped). Recording stops by itself at ``max_bytes`` of
    message data or ``max_seconds`` after the first observation or chunk, or when the file
    cannot be written (a full disk); :meth:`close` flushes and finishes the file.
    ``stop_reason`` and :meth:`stats` say what happened.

    ``path`` is created (``0640``) or emptied; a symbolic link, FIFO or device there is
    refused (:func:`vlad.files.create_regular`). When a write fails, the file is cut back to
    the end of the last complete record and finished there (the MCAP end records need a
    few dozen bytes, which the last block almost always has), so what was written before
    stays readable; :meth:`close` then raises one :class:`GateError` line saying so.
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
        self._out = _Output(create_regular(self.path))
        self._offset_ns = time.time_ns() - time.monotonic_ns()
        self._t0: int | None = None
        try:
            # The writer uses write and tell (and flush when asked), which _Output has.
            self._writer = Writer(cast(IO[bytes], self._out), compression=CompressionType.ZSTD)
            self._writer.start(profile="", library="vlad")
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
        except OSError as exc:
            os.close(self._out.fd)
            raise GateError(f"{self.path}: cannot write ({exc.strerror or exc})") from None
        self._out.commit()
        self._kept = 0  # messages in the file up to its last complete record
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._accepted_bytes = 0
        self._counts = {"observations": 0, "actions": 0, "states": 0, "events": 0, "dropped": 0}
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
            for name in ("vlad.status", "vlad.event", "vlad.observation_info", "vlad.action_info")
        }
        return {
            TOPIC_OBS: w.register_channel(TOPIC_OBS, FRAMES_ENCODING, obs_schema),
            TOPIC_ACT: w.register_channel(TOPIC_ACT, FRAMES_ENCODING, act_schema),
            TOPIC_STATE: w.register_channel(TOPIC_STATE, "json", json_schemas["vlad.status"]),
            TOPIC_EVENTS: w.register_channel(TOPIC_EVENTS, "json", json_schemas["vlad.event"]),
            TOPIC_OBS_INFO: w.register_channel(TOPIC_OBS_INFO, "json", json_schemas["vlad.observation_info"]),
            TOPIC_ACT_INFO: w.register_channel(TOPIC_ACT_INFO, "json", json_schemas["vlad.action_info"]),
        }

    # -- the caller's side (any thread, never blocks) ----------------------------------------

    def _accept(self, kind: str, t_ns: int, payload: Any, size: int) -> bool:
        with self._lock:
            if self._closed or self.stop_reason is not None:
                self._counts["dropped"] += 1
                return False
            if self._t0 is None and kind not in ("states", "events"):
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

    def event(self, event: dict[str, Any], t_ns: int | None = None) -> bool:
        """Record a daemon event (any JSON-able dict)."""
        data = json.dumps(event, default=str).encode()
        return self._accept("events", t_ns or time.monotonic_ns(), data, len(data))

    def stats(self) -> dict[str, Any]:
        """Messages recorded per kind, dropped, bytes accepted and why recording stopped."""
        with self._lock:
            return {**self._counts, "bytes": self._accepted_bytes, "stop_reason": self.stop_reason}

    def close(self, summary: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write what is queued, the summary metadata (with ``summary``'s entries) and the
        MCAP footer; idempotent."""
        with self._lock:
            already, self._closed = self._closed, True
        if already:
            return self.stats()
        self._queue.put(_STOP)
        self._thread.join()
        stats = self.stats()
        extra = {k: str(v) for k, v in (summary or {}).items()}
        info = {**{k: str(v) for k, v in stats.items()}, **extra}
        finished = True
        try:
            if self._error is None:
                try:
                    self._writer.add_metadata("vlad.recording.summary", info)
                    self._writer.finish()
                except OSError as exc:
                    self._error = exc
            if self._error is not None:
                finished = self._finish_after_failure(info)
        finally:
            os.close(self._out.fd)
        if self._error is not None:
            why = self._error.strerror if isinstance(self._error, OSError) and self._error.strerror else self._error
            kept = (
                f"the {self._kept} messages written before it are kept, readable"
                if finished
                else "the file could not be finished and is not readable"
            )
            raise GateError(f"{self.path}: cannot write ({why}); recording stopped, {kept}")
        return stats

    def _finish_after_failure(self, info: dict[str, str]) -> bool:
        """Cut the file back to its last complete record and end it there: the summary,
        the data end, a footer without a summary section and the magic; without the summary
        when even that does not fit. False when nothing fits."""
        from mcap.records import DataEnd, Footer, Metadata, RecordBuilder
        from mcap.writer import MCAP0_MAGIC

        info = {**info, "written": str(self._kept)}  # the counts above are what was accepted
        for records in ([Metadata("vlad.recording.summary", info)], []):
            builder = RecordBuilder()
            for record in [*records, DataEnd(0), Footer(0, 0, 0)]:
                record.write(builder)
            try:
                self._out.cut()
                self._out.write(builder.end() + MCAP0_MAGIC)
                return True
            except OSError:
                continue
        try:
            self._out.cut()
        except OSError:
            pass
        return False

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
            except Exception as exc:  # a full disk must not take the caller down with it
                self._error = exc
                with self._lock:
                    if self.stop_reason is None:
                        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                        self.stop_reason = f"cannot write {self.path} ({why})"

    def _write(self, kind: str, log_time: int, payload: Any, seq: int) -> None:
        if kind in ("states", "events"):
            self._add(TOPIC_STATE if kind == "states" else TOPIC_EVENTS, log_time, payload, seq)
            return
        self._add(TOPIC_OBS if kind == "observations" else TOPIC_ACT, log_time, pack_frames(payload), seq)
        info = _info(kind, payload)
        if info is not None:
            info_topic = TOPIC_OBS_INFO if kind == "observations" else TOPIC_ACT_INFO
            self._add(info_topic, log_time, json.dumps(info).encode(), seq)

    def _add(self, topic: str, log_time: int, data: bytes, seq: int) -> None:
        self._writer.add_message(self._channels[topic], log_time, data, log_time, seq)
        if self._out.position != self._out.good:  # a chunk went out whole: everything up to here is in the file
            self._out.commit()
            self._kept = seq


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
#
# A recording may come from anywhere (a robot in the field, a bug report): it is read as
# hostile input. The MCAP records are read sequentially and every size is bounded before
# anything is allocated: each chunk's declared and actual decompressed size (a 33 KB zstd
# bomb declaring gigabytes is refused before it is inflated), the total decompressed,
# the number of messages, each JSON record's size and nesting. Every observation and chunk
# header is validated through the one schema parser (vlad.schema) into the dataclasses
# below. Anything off is one line (RecordingError), never a traceback.

MAX_CHUNK_BYTES = 64 * 2**20  # decompressed, per MCAP chunk (the writer makes 1 MiB chunks)
MAX_RECORDING_BYTES = 2 * 2**30  # decompressed, the whole file: what a read may hold in memory
MAX_MESSAGES = 2_000_000
MAX_JSON_BYTES = 2**20  # one status or event record
MAX_JSON_DEPTH = 64


class RecordingError(ProblemsError, GateError):
    """A recording that cannot be read: corrupt, hostile, or not a vlad recording."""


@dataclass(frozen=True)
class ObservationHeader:
    """What replay needs from a recorded observation's header (the rest is protocol's)."""

    seq: int = field(metadata=schema.bounded(0, 2**64 - 1))
    t_sensor_ns: int = field(metadata=schema.bounded(0, 2**63 - 1))
    instruction: str | None = field(default=None, metadata={"allow_empty": True})
    client: str | None = field(default=None, metadata={"allow_empty": True, "max_len": 128})


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
    client: str | None = None
    executing: tuple[int, int] | None = (-1, -1)  # its `exec` report ((-1, -1): none)


@dataclass
class Recording:
    """A recording read back: metadata, observations and chunks in log-time order.

    ``refused`` counts the observation messages the daemon would have refused at the wire
    (a live tap records what arrived, junk included); ``refusals`` has the first reasons.
    """

    path: Path
    metadata: dict[str, dict[str, str]]
    observations: list[RecordedObservation] = field(default_factory=list)
    chunks: list[ActionChunk] = field(default_factory=list)
    states: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    events: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    refused: int = 0
    refusals: list[str] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        ts = [o.t_ns for o in self.observations]
        return (max(ts) - min(ts)) / 1e9 if ts else 0.0

    def usable(self) -> Recording:
        """This recording, or :class:`RecordingError` when no observation can be replayed."""
        if not self.observations:
            why = f" ({self.refused} refused, e.g. {self.refusals[0]})" if self.refusals else ""
            raise RecordingError(str(self.path), [f"no observation to replay{why}"])
        return self

    def chunk_for(self) -> dict[int, ActionChunk]:
        """The policy chunk (not a hold) answering each observation seq."""
        return {c.obs_seq: c for c in self.chunks if not c.is_hold}


def iter_messages(
    path: str | Path, *, max_bytes: int = MAX_RECORDING_BYTES, max_chunk_bytes: int = MAX_CHUNK_BYTES
) -> Iterator[tuple[str, int, bytes]]:
    """``(topic, log_time_ns, data)`` of every message in file order, sizes bounded
    (:class:`RecordingError`); the ``vlad.recording`` metadata come from :func:`read_recording`."""
    for kind, a, b, c in _records(Path(path), max_bytes, max_chunk_bytes):
        if kind == "message":
            yield a, b, c


def _records(path: Path, max_bytes: int, max_chunk_bytes: int) -> Iterator[tuple[str, Any, Any, Any]]:
    """("message", topic, log_time, data) and ("metadata", name, dict, None), bounded."""
    import dataclasses
    import struct

    from mcap.exceptions import McapError
    from mcap.records import Channel, Chunk, Message, Metadata
    from mcap.stream_reader import StreamReader, breakup_chunk

    def fail(problem: str) -> RecordingError:
        return RecordingError(str(path), [problem])

    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below, also when the caller stops early)
    except FileNotFoundError:
        raise fail("no such recording") from None
    except OSError as exc:
        raise fail(f"cannot open ({exc.strerror or exc})") from None
    channels: dict[int, str] = {}
    total = messages = 0
    try:
        size = os.fstat(f.fileno()).st_size
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise fail("not a regular file")
        reader = StreamReader(f, emit_chunks=True, record_size_limit=max(size, 1))
        for record in reader.records:
            inner: list[Any] = [record]
            if isinstance(record, Chunk):
                if record.compression not in ("", "zstd"):
                    raise fail(f"chunk compression {record.compression[:16]!r} is not supported (zstd or none)")
                if record.uncompressed_size > max_chunk_bytes:
                    raise fail(
                        f"a chunk declares {record.uncompressed_size} bytes decompressed, more than the "
                        f"{max_chunk_bytes} a chunk may have: refusing to decompress it"
                    )
                total += record.uncompressed_size
                if total > max_bytes:
                    raise fail(f"more than {max_bytes} bytes decompressed: too large to read (or a bomb)")
                data = _inflate(record, record.uncompressed_size)
                if len(data) != record.uncompressed_size:
                    raise fail(f"a chunk decompresses to {len(data)} bytes, its header says {record.uncompressed_size}")
                inner = breakup_chunk(dataclasses.replace(record, compression="", data=data))
            for r in inner:
                if isinstance(r, Channel):
                    channels[r.id] = r.topic
                elif isinstance(r, Message):
                    messages += 1
                    if messages > MAX_MESSAGES:
                        raise fail(f"more than {MAX_MESSAGES} messages")
                    if r.channel_id not in channels:
                        raise fail(f"message on channel {r.channel_id}, which no channel record declares")
                    yield "message", channels[r.channel_id], r.log_time, r.data
                elif isinstance(r, Metadata):
                    yield "metadata", r.name, dict(r.metadata), None
    except RecordingError:
        raise
    except (McapError, OSError, ValueError, struct.error, UnicodeDecodeError, KeyError, IndexError) as exc:
        raise fail(f"not a readable MCAP file ({type(exc).__name__}: {str(exc)[:200]})") from None
    except MemoryError:
        raise fail("a record too large to read") from None
    finally:
        f.close()


def _inflate(chunk: Any, limit: int) -> bytes:
    """A chunk's data decompressed, never more than ``limit`` (its declared size, already
    bounded) + 1 bytes: a chunk that lies low about its size is cut there, not inflated."""
    if chunk.compression == "":
        return bytes(chunk.data)
    import zstandard

    out = bytearray()
    try:
        with zstandard.ZstdDecompressor().stream_reader(chunk.data) as reader:
            while len(out) <= limit:
                block = reader.read(min(1 << 20, limit + 1 - len(out)))
                if not block:
                    break
                out += block
    except zstandard.ZstdError as exc:
        raise ValueError(f"corrupt zstd data: {exc}") from None
    return bytes(out)


def read_recording(
    path: str | Path,
    limit: int = 0,
    *,
    max_bytes: int = MAX_RECORDING_BYTES,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
) -> Recording:
    """Read a recording made by :class:`McapRecorder` (or ``vladctl record``); ``limit``
    caps the observations. Every problem is one :class:`RecordingError` line."""
    path = Path(path)
    meta: dict[str, dict[str, str]] = {}
    messages: list[tuple[str, int, bytes]] = []
    for kind, a, b, c in _records(path, max_bytes, max_chunk_bytes):
        if kind == "metadata":
            meta[a] = b
        elif a in (TOPIC_OBS, TOPIC_ACT, TOPIC_STATE, TOPIC_EVENTS):
            messages.append((a, b, c))
    info = meta.get("vlad.recording", {})
    if info.get("format") != RECORDING_FORMAT:
        raise RecordingError(
            str(path), [f"not a vlad recording (no {RECORDING_FORMAT} metadata); record one with `vladctl record`"]
        )
    try:
        offset = int(info.get("clock_offset_ns", "0"))
    except ValueError:
        raise RecordingError(str(path), ["vlad.recording metadata: clock_offset_ns is not an integer"]) from None
    rec = Recording(path, meta)
    messages.sort(key=lambda m: m[1])  # log-time order (stable: file order within a time)
    for i, (topic, log_time, data) in enumerate(messages):
        t = log_time - offset
        where = f"{path} message {i} ({topic})"
        if topic == TOPIC_OBS:
            if limit and len(rec.observations) >= limit:
                continue
            try:
                obs = _observation(unpack_frames(data), t, where)
            except VladError as exc:  # what the daemon would have refused: counted, skipped
                rec.refused += 1
                if len(rec.refusals) < 5:
                    rec.refusals.append(str(exc))
                continue
            if obs is not None:
                rec.observations.append(obs)
        elif topic == TOPIC_ACT:
            try:
                rec.chunks.append(_chunk(unpack_frames(data), t, where))
            except RecordingError:
                raise
            except VladError as exc:  # the daemon published it: malformed means forged or corrupt
                raise RecordingError(where, [f"not a valid action chunk ({exc})"]) from None
        else:
            (rec.states if topic == TOPIC_STATE else rec.events).append((t, _json_object(data, where)))
    return rec


def _json_object(data: bytes, where: str) -> dict[str, Any]:
    if len(data) > MAX_JSON_BYTES:
        raise RecordingError(where, [f"{len(data)} bytes of JSON, more than {MAX_JSON_BYTES}"])
    if _nesting(data) > MAX_JSON_DEPTH:
        raise RecordingError(where, [f"JSON nested deeper than {MAX_JSON_DEPTH} levels"])
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecordingError(where, [f"not JSON ({type(exc).__name__})"]) from None
    if not isinstance(value, dict):
        raise RecordingError(where, ["not a JSON object"])
    return value


def _nesting(data: bytes) -> int:
    """Deepest bracket nesting outside strings (an upper bound is enough)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in data:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (0x5D, 0x7D):
            depth = max(0, depth - 1)
    return deepest


def _observation(frames: list[bytes], t_ns: int, where: str) -> RecordedObservation | None:
    msg = protocol.decode(frames)
    if msg.topic != protocol.TOPIC_OBS:
        return None  # heartbeats share the observation socket
    h = schema.parse(ObservationHeader, _pick(msg.header, ObservationHeader), where, RecordingError)
    images = {k[len("image/") :]: v for k, v in msg.tensors.items() if k.startswith("image/")}
    # reanchor: as the daemon's intake reads it (only a true boolean announces a jump)
    reanchor = msg.header.get("reanchor") is True
    report = msg.header.get("exec", (-1, -1))
    executing = (
        (report[0], report[1])
        if isinstance(report, list) and len(report) == 2 and all(type(v) is int for v in report)
        else None
        if report is None
        else (-1, -1)
    )
    return RecordedObservation(
        h.seq, h.t_sensor_ns, t_ns, h.instruction, images, msg.tensors.get("proprio"), reanchor, h.client, executing
    )


def _chunk(frames: list[bytes], t_ns: int, where: str) -> ActionChunk:
    """A recorded chunk as the controller-side type; ``t_receive_ns`` is its log time."""
    msg = protocol.decode(frames, expect=(protocol.TOPIC_ACTIONS,))
    try:
        chunk = protocol.decode_chunk(msg, t_ns)
    except protocol.ProtocolError as exc:
        raise RecordingError(where, [str(exc).removeprefix("malformed: ")]) from None
    return dataclasses.replace(chunk, actions=np.array(chunk.actions))  # its own copy, not the frame's memory


def _pick(header: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """The header keys ``cls`` describes (the others belong to the protocol)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in header.items() if k in names}
