"""The recording tap: what the daemon receives and publishes, for ``vladctl record``.

A recorder connects to the tap socket (``sockets.tap``; by default ``tap`` beside the
control endpoint, e.g. ``ipc:///run/vlad/tap``) and subscribes; the daemon then offers it
every observation message as received, every action chunk as published, its status
snapshots and its events. Nothing is offered while no recorder is subscribed.

It can never slow serving. The serving thread (and the cadence and e-stop threads, which
publish holds) only append the frames they already hold to a bounded queue: no copy of an
observation (its ZeroMQ frames are immutable), a copy of a chunk's few dozen bytes, no
lock but the GIL's. A full queue drops the message and counts it. Each drop counter has
one writer at a time (observations: the serving thread; chunks: whoever holds the
publisher's lock; status and events: the event loop), so the counts are exact. The tap's own thread
sends from that queue on an XPUB socket without blocking (``ZMQ_XPUB_NODROP``: a recorder
that does not keep up shows as ``zmq.Again``, dropped and counted, never as a wait).

Wire format, one multipart message per item: ``[kind, t_ns, seq, *payload]`` with ``kind``
one of ``obs``, ``act`` (payload: the protocol frames), ``status``, ``event`` (payload:
one JSON frame); ``t_ns`` (monotonic, little-endian uint64) the receive / publish time;
``seq`` (uint64) counts every item offered while subscribed, so the recorder sees what was
dropped as gaps.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

import zmq

from vlad.threads import Worker

log = logging.getLogger("vlad.tap")

KINDS = (b"obs", b"act", b"status", b"event")
MAX_QUEUE = 1024  # items waiting for the tap's thread ...
MAX_QUEUE_BYTES = 64 * 2**20  # ... and fewer when observations are big (camera frames)
IDLE_POLL_MS = 200  # no recorder: look for a subscription this often
BUSY_POLL_MS = 10  # a recorder attached: send what is queued this often


def tap_endpoint(tap: str, control: str) -> str | None:
    """The tap's endpoint: ``tap`` when set, none for ``"off"``, else ``tap`` beside an
    ``ipc://`` control endpoint (a tcp control endpoint gets no tap unless one is set)."""
    if tap == "off":
        return None
    if tap:
        return tap
    if control.startswith("ipc://"):
        return "ipc://" + str(PurePosixPath(control[len("ipc://") :]).with_name("tap"))
    return None


class Tap(Worker):
    """The daemon side: :meth:`observation` and :meth:`actions` from any thread, never
    blocking; :meth:`status` and :meth:`event` from the event loop."""

    def __init__(self, sock: zmq.Socket, endpoint: str, observation_bytes: int) -> None:
        super().__init__("vlad-tap")
        self.sock = sock
        self.endpoint = endpoint
        # Bounded by items (a length check is atomic; a byte count shared by three threads
        # would not be), sized so that queued observations stay within MAX_QUEUE_BYTES;
        # the socket buffers as many per recorder before it counts drops.
        self.max_items = max(16, min(MAX_QUEUE, MAX_QUEUE_BYTES // max(observation_bytes, 1)))
        sock.setsockopt(zmq.SNDHWM, self.max_items)
        sock.setsockopt(zmq.XPUB_NODROP, 1)
        self.subscribed = False  # read on the hot path: nothing is queued while False
        self._queue: deque[tuple[bytes, int, Any]] = deque()
        self._seq = 0
        self.sent = 0
        self.dropped = {"observations": 0, "actions": 0, "status": 0}  # one writer each (see above)
        self.dropped_socket = 0
        self._last_event_ns = 0

    # -- offered by the serving, cadence and e-stop threads ---------------------------------

    def observation(self, frames: Sequence[Any], t_ns: int) -> None:
        """An observation message as received (its zero-copy frames, kept, not copied)."""
        if self.subscribed:
            if len(self._queue) < self.max_items:
                self._queue.append((b"obs", t_ns, frames))
            else:
                self.dropped["observations"] += 1

    def actions(self, frames: Sequence[Any], t_ns: int) -> None:
        """An action chunk as published (copied: its tensor may be a reused buffer)."""
        if self.subscribed:
            if len(self._queue) < self.max_items:
                self._queue.append((b"act", t_ns, [bytes(f) for f in frames]))
            else:
                self.dropped["actions"] += 1

    def status(self, status: dict[str, Any], t_ns: int) -> None:
        """A status snapshot (encoded as JSON on the tap's thread, not here)."""
        self._other(b"status", status, t_ns)

    def event(self, event: dict[str, Any], t_ns: int) -> None:
        self._other(b"event", event, t_ns)

    def tick(self, status: dict[str, Any], events: Sequence[Any]) -> None:
        """The status task's tick: the snapshot, and the events (``Event`` objects, oldest
        first) not offered yet; a recorder that attaches first gets the recent history."""
        self.status(status, time.monotonic_ns())
        for ev in events:
            if ev.monotonic_ns > self._last_event_ns:
                self.event(ev.to_dict(), ev.monotonic_ns)
                self._last_event_ns = ev.monotonic_ns

    def _other(self, kind: bytes, payload: dict[str, Any], t_ns: int) -> None:
        if self.subscribed:
            if len(self._queue) < self.max_items:
                self._queue.append((kind, t_ns, payload))
            else:
                self.dropped["status"] += 1

    # -- the tap's thread --------------------------------------------------------------------

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self.stopping:
            try:
                ready = dict(poller.poll(BUSY_POLL_MS if self.subscribed else IDLE_POLL_MS))
                if ready:
                    self._subscriptions()
                self._drain()
            except zmq.ZMQError as exc:
                if exc.errno == zmq.ETERM or self.stopping:
                    return
                log.exception("tap: %s", exc)
                time.sleep(0.1)
            except Exception:  # a bug here must never reach serving: log, keep going
                log.exception("tap failed")
                time.sleep(0.1)

    def _subscriptions(self) -> None:
        """XPUB hands up (un)subscriptions: ``\\x01topic`` / ``\\x00topic``; without
        ``XPUB_VERBOSE`` only the first subscriber and the last to leave show."""
        while True:
            try:
                msg = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if not msg:
                continue
            if msg[0] == 1:
                if not self.subscribed:
                    log.info("tap: a recorder subscribed on %s", self.endpoint)
                self.subscribed = True
            elif msg[0] == 0:
                self.subscribed = False
                log.info("tap: the recorder left %s", self.endpoint)
                self._queue.clear()

    def _drain(self) -> None:
        while self._queue:
            kind, t_ns, payload = self._queue.popleft()
            if kind in (b"status", b"event"):
                payload = [json.dumps(payload, default=str).encode()]
            self._seq += 1
            head = [kind, t_ns.to_bytes(8, "little"), self._seq.to_bytes(8, "little")]
            try:
                self.sock.send_multipart([*head, *payload], flags=zmq.NOBLOCK, copy=False)
                self.sent += 1
            except zmq.Again:
                self.dropped_socket += 1

    def stats(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "subscribed": self.subscribed,
            "sent": self.sent,
            "queue_items": self.max_items,
            "dropped": {**self.dropped, "socket": self.dropped_socket},
        }
