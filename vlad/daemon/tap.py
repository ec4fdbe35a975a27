"""The recording tap: what the daemon receives and publishes, for ``vladctl record``.

A recorder connects to the tap socket (``sockets.tap``; by default ``tap`` beside the
control endpoint, e.g. ``ipc:///run/vlad/tap``) and subscribes; the daemon then offers it
every message on the observation socket as received (heartbeats and refused observations
included), every action chunk as published, its status snapshots and its events. Nothing
is offered while no recorder is subscribed. Who may subscribe is the ZAP allow list of the
``tap`` role (``sockets.tap_subscribers``, :mod:`vlad.daemon.sockets`).

It can never slow serving. The serving thread (and the cadence and e-stop threads, which
publish holds) only append the frames they already hold to a bounded queue: no copy of an
observation (its ZeroMQ frames are immutable), a copy of a chunk's few dozen bytes, no
lock but the GIL's. The queue is bounded in items and in bytes, every frame of a message
counted: each stream has its own byte budget (observations :data:`OBSERVATION_BYTES`, or
two of the contract's largest observations when that is more; chunks and the status task's
items :data:`OTHER_BYTES` each), so each budget has one writer and one reader and holds
exactly. An observation message larger than any legal one is not queued. What does not fit
is dropped and counted. Each drop counter has one writer at a time (observations: the
serving thread; chunks: whoever holds the publisher's lock; status and events: the event
loop), so the counts are exact.

The tap's own thread sends from that queue on an XPUB socket, never blocking. The XPUB is
lossy: each recorder has its own queue in the socket (:func:`recorder_queue` messages, set
before the bind, so that it holds about :data:`RECORDER_BYTES`); a recorder that does not
keep up loses messages from its own queue only, and every other recorder's stream goes on
whole. (``ZMQ_XPUB_NODROP`` would refuse a message for every recorder as soon as one
recorder's queue is full: one stalled recorder would starve the others.)

Who is subscribed comes from the XPUB's notifications, with ``ZMQ_XPUB_VERBOSE``: libzmq
passes up every subscription (``\\x01topic``: a recorder attached; each then gets the
event history, see :meth:`Tap.tick`) and an unsubscription (``\\x00topic``) only when the
last subscriber of that topic left, libzmq counting the subscribers per topic itself. The
tap keeps the set of topics that have a subscriber; nothing is offered while it is empty.
Counting the notifications ourselves (``ZMQ_XPUB_VERBOSER``) would break on a recorder
that subscribes the same topic twice (two subscriptions, one departure), and
``ZMQ_TOPICS_COUNT`` is not decremented when a subscriber disconnects (libzmq 4.3.5).
Subscription changes are logged at most :data:`LOG_BURST` times a minute.

Wire format, one multipart message per item: ``[kind, t_ns, seq, *payload]`` with ``kind``
one of ``obs``, ``act`` (payload: the protocol frames), ``status``, ``event`` (payload:
one JSON frame); ``t_ns`` (monotonic, little-endian uint64) the receive / publish time;
``seq`` (little-endian uint64) counts every item offered while subscribed, those dropped by
the daemon included, so a recorder sees what it did not get (dropped by the daemon's queue
or by its own socket queue) as gaps. docs/protocol.md, "The recording tap".
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

from vlad.snapshot import TapStatus
from vlad.threads import Worker

log = logging.getLogger("vlad.tap")

KINDS = (b"obs", b"act", b"status", b"event")
MAX_QUEUE = 1024  # items waiting for the tap's thread ...
OBSERVATION_BYTES = 56 * 2**20  # ... and their bytes: observations (every frame counted) ...
OTHER_BYTES = 4 * 2**20  # ... chunks, and status snapshots with events, each
RECORDER_BYTES = 16 * 2**20  # what each recorder's queue in the socket is sized to hold
IDLE_POLL_MS = 1000  # no recorder: a subscription (or a stop) wakes the poll; this only rolls the churn log
BUSY_POLL_MS = 10  # a recorder attached: send what is queued this often
LOG_BURST = 5  # subscription changes logged per LOG_WINDOW_S; the rest are counted
LOG_WINDOW_S = 60.0

_OBS, _ACT, _OTHER = 0, 1, 2  # the streams, each with its own writer


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


def recorder_queue(largest_observation: int) -> int:
    """Messages each recorder's queue in the XPUB holds (``ZMQ_SNDHWM``, set before the
    bind: libzmq copies it into each connection then): about :data:`RECORDER_BYTES` of the
    largest observations, at least 4 and at most 1000."""
    return max(4, min(1000, RECORDER_BYTES // max(largest_observation, 1)))


class _ChurnLog:
    """Subscription changes logged at most :data:`LOG_BURST` per :data:`LOG_WINDOW_S`; the
    others counted and reported in one line when the window ends."""

    def __init__(self) -> None:
        self.window_start = 0.0
        self.logged = 0
        self.unlogged = 0

    def note(self, now: float, msg: str, *args: Any) -> None:
        self.roll(now)
        if self.logged < LOG_BURST:
            self.logged += 1
            log.info(msg, *args)
        else:
            self.unlogged += 1

    def roll(self, now: float) -> None:
        if now - self.window_start < LOG_WINDOW_S:
            return
        if self.unlogged:
            log.info("tap: %d more subscription changes in the last %.0f s (not logged)", self.unlogged, LOG_WINDOW_S)
        self.window_start, self.logged, self.unlogged = now, 0, 0


class Tap(Worker):
    """The daemon side: :meth:`observation` and :meth:`actions` from any thread, never
    blocking; :meth:`tick` (status and events) from the event loop.

    ``largest_observation`` is the size of the largest legal observation message, every
    frame counted (the contract's tensors and the header limit)."""

    def __init__(self, sock: zmq.Socket, endpoint: str, largest_observation: int) -> None:
        super().__init__("vlad-tap")
        self.sock = sock
        self.endpoint = endpoint
        self.largest_observation = largest_observation
        self.max_items = MAX_QUEUE
        self.budget = (max(OBSERVATION_BYTES, 2 * largest_observation), OTHER_BYTES, OTHER_BYTES)
        self.recorder_queue = int(sock.getsockopt(zmq.SNDHWM))
        sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.subscribed = False  # read on the hot path: nothing is queued while False
        self._topics: set[bytes] = set()
        self.subscriptions = 0  # recorders that subscribed since start (written by the tap's thread)
        self._history_served = 0  # self.subscriptions when the event history was last offered
        self._queue: deque[tuple[int, bytes, int, Sequence[Any], int]] = deque()
        # Bytes queued per stream: what its writer appended, what the tap's thread took.
        self._queued_in = [0, 0, 0]
        self._queued_out = [0, 0, 0]
        self._seq = 0
        self.sent = 0
        self.dropped = {"observations": 0, "actions": 0, "status": 0}  # one writer each (see above)
        self._dropped_seen = 0  # the drops already counted into seq
        self._last_event_ns = 0
        self._churn = _ChurnLog()

    # -- offered by the serving, cadence and e-stop threads ---------------------------------

    def observation(self, frames: Sequence[Any], t_ns: int) -> None:
        """A message of the observation socket as received (its zero-copy frames, kept, not copied)."""
        if self.subscribed:
            size = 0
            for f in frames:
                size += len(f)
            if size <= self.largest_observation and self._fits(_OBS, size):
                self._queued_in[_OBS] += size
                self._queue.append((_OBS, b"obs", t_ns, frames, size))
            else:
                self.dropped["observations"] += 1

    def actions(self, frames: Sequence[Any], t_ns: int) -> None:
        """An action chunk as published (copied: its tensor may be a reused buffer)."""
        if self.subscribed:
            data = [bytes(f) for f in frames]
            size = sum(map(len, data))
            if self._fits(_ACT, size):
                self._queued_in[_ACT] += size
                self._queue.append((_ACT, b"act", t_ns, data, size))
            else:
                self.dropped["actions"] += 1

    def _fits(self, stream: int, size: int) -> bool:
        # The writer's own count is exact; the tap's thread only lowers what is queued.
        queued = self._queued_in[stream] - self._queued_out[stream]
        return len(self._queue) < self.max_items and queued + size <= self.budget[stream]

    # -- offered by the event loop (the status task) -----------------------------------------

    def tick(self, status: dict[str, Any], events: Sequence[Any]) -> None:
        """The status task's tick: the snapshot, and the events (``Event`` objects, oldest
        first) not offered yet. When a recorder subscribed since the last tick, every event
        of ``events`` is offered again, so that each recorder starts with the recent
        history (a recorder already attached gets them twice: ``vladctl record`` keeps one)."""
        self._other(b"status", status, time.monotonic_ns())
        subscriptions = self.subscriptions
        history = subscriptions != self._history_served
        self._history_served = subscriptions
        for ev in events:
            if history or ev.monotonic_ns > self._last_event_ns:
                self._other(b"event", ev.to_dict(), ev.monotonic_ns)
            self._last_event_ns = max(self._last_event_ns, ev.monotonic_ns)

    def _other(self, kind: bytes, payload: dict[str, Any], t_ns: int) -> None:
        if self.subscribed:
            data = json.dumps(payload, default=str).encode()
            if self._fits(_OTHER, len(data)):
                self._queued_in[_OTHER] += len(data)
                self._queue.append((_OTHER, kind, t_ns, [data], len(data)))
            else:
                self.dropped["status"] += 1

    # -- the tap's thread --------------------------------------------------------------------

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.wake_fd(), zmq.POLLIN)  # readable on stop()
        while not self.stopping:
            try:
                ready = dict(poller.poll(BUSY_POLL_MS if self.subscribed else IDLE_POLL_MS))
                if self.sock in ready:
                    self._subscriptions()
                self._churn.roll(time.monotonic())
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
        """Read the XPUB's (un)subscription notifications (module docstring)."""
        while True:
            try:
                msg = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if not msg or msg[0] > 1:
                continue
            topic, now = msg[1:], time.monotonic()
            shown = repr(topic[:32])
            if msg[0] == 1:
                self._topics.add(topic)
                self.subscriptions += 1
                self._churn.note(now, "tap: a recorder subscribed to %s on %s", shown, self.endpoint)
            elif topic in self._topics:
                self._topics.discard(topic)
                self._churn.note(now, "tap: the last recorder subscribed to %s left %s", shown, self.endpoint)
        self.subscribed = bool(self._topics)

    def _drain(self) -> None:
        while self._queue:
            stream, kind, t_ns, payload, size = self._queue.popleft()
            self._queued_out[stream] += size
            # Items the writers dropped since the last send become a gap before this one.
            dropped = sum(self.dropped.values())
            self._seq += 1 + dropped - self._dropped_seen
            self._dropped_seen = dropped
            head = [kind, t_ns.to_bytes(8, "little"), self._seq.to_bytes(8, "little")]
            # A lossy XPUB never refuses a message: a recorder whose queue is full loses it alone.
            self.sock.send_multipart([*head, *payload], flags=zmq.NOBLOCK, copy=False)
            self.sent += 1

    def queued_bytes(self) -> int:
        """Bytes of every frame queued for the tap's thread now."""
        return sum(self._queued_in) - sum(self._queued_out)

    def status(self) -> TapStatus:
        """The tap as the status shows it."""
        return TapStatus(
            endpoint=self.endpoint,
            subscribed=self.subscribed,
            subscriptions=self.subscriptions,
            sent=self.sent,
            queue_items=self.max_items,
            queue_bytes=sum(self.budget),
            recorder_queue=self.recorder_queue,
            dropped=dict(self.dropped),
        )
