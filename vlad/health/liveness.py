"""Per-controller liveness: every controller's own heartbeat state.

A controller is known by the ``client`` name of its heartbeats and observations (``""`` for
one that names itself in neither); the openpi endpoint heartbeats and sends observations
for each of its websocket clients by slot (``openpi/1`` ...).

**Judged.** A name is *judged* once it has had an accepted observation and heartbeats
spanning the heartbeat limit (``monitors.heartbeat_missing_periods`` periods, ``establish_ns``):
then it is alive while its heartbeats keep coming, and dead, whatever the others do, when
they stop; the heartbeat monitor (:class:`vlad.health.monitors.HeartbeatMonitor`) moves to
the hold posture until it is back, has said goodbye (``bye``) or an operator forgets it
(``vladctl resume``). A live openpi client (or any second controller) therefore never hides
the death of a native controller's loop, while a name used once (one heartbeat, one
observation: junk from a flood, a probe) never becomes a controller whose silence holds the
robot: it is forgotten once it has been silent for the heartbeat limit.

**Bounded.** The table holds at most :data:`MAX_CONTROLLERS` names. A new name when it is
full first takes the place of a silent name that was never judged; when there is none, its
heartbeats *and its observations* are refused (``too_many_controllers``): the policy never
serves a controller that liveness cannot watch. A judged name is never evicted (that would
hide its death).

**Owned.** On the daemon's sockets every connection has an identity from the ZAP handler
(:class:`vlad.daemon.sockets.Gatekeeper`: ``c<n>/<principal>``, the principal the peer's user
id or CurveZMQ key). A name belongs to the connection that uses it first: while that
connection keeps it alive, another connection's heartbeats, goodbyes or observations under
the name are refused (``name_in_use``), so no sender can keep a dead controller alive, make
it say goodbye or change its cadence. Once the owner has been silent for the heartbeat limit
a new connection of the *same principal* takes the name over (the controller restarted);
another principal never can. Messages without an identity (no ZAP handler, e.g. in-process
tests) own nothing.

A heartbeat counts only when it is well formed: ``t_ns`` a positive integer (the sender's
monotonic time), ``client`` a printable name of at most 128 characters, ``cadence`` (when
present) ``"stream"`` or ``"request"``, ``bye`` (when present) a boolean. Anything else is
refused as ``malformed`` and keeps nobody alive.

``cadence`` tells the sensor-stall monitor how the controller asks: ``stream`` (default)
sends an observation every control period, so silence is a stalled sensor stream;
``request`` sends one only when it needs a new chunk (openpi's action chunk broker), so
silence between requests is not a stall.

Written by the intake thread (:class:`vlad.serving.intake.Intake` calls it for every
heartbeat and every accepted observation, as they arrive), read by the health task and the
status through :meth:`Controllers.snapshot` (copies, atomic under the GIL), changed by the
control server through :meth:`Controllers.forget_silent` (under the table's lock).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from vlad import protocol

MAX_CONTROLLERS = 64
CADENCES = ("stream", "request")


class Beat(NamedTuple):
    """One judged controller's newest heartbeat: when it arrived (daemon clock), how it asks,
    and since when it has asked so (a controller that starts streaming again owes an
    observation from then on, not from its last request)."""

    last_ns: int
    cadence: str
    since_ns: int = 0


@dataclass
class _Entry:
    """One name in the table."""

    peer: str | None  # the owning connection's identity (None: unauthenticated)
    first_beat_ns: int = 0  # 0: no heartbeat yet
    last_beat_ns: int = 0
    last_seen_ns: int = 0  # any accepted message under the name
    cadence: str = "stream"
    cadence_since_ns: int = 0  # when its current cadence was first declared
    observed: bool = False
    judged: bool = False


def principal(peer: str | None) -> str | None:
    """The principal part of a connection identity ``c<n>/<principal>`` (None: none)."""
    if not peer:
        return None
    return peer.partition("/")[2] or None


class Controllers:
    """The heartbeat table (see module doc)."""

    def __init__(self, limit: int = MAX_CONTROLLERS, establish_ns: int = 100_000_000) -> None:
        self.limit = limit
        self.establish_ns = establish_ns  # heartbeats must span this long to be judged (and owned)
        self._table: dict[str, _Entry] = {}
        self._lock = threading.Lock()  # the intake thread writes, the control server forgets
        self.left_ns = 0  # when the last goodbye arrived (daemon clock)

    # -- written by the intake thread --------------------------------------------------------

    def heartbeat(self, header: Mapping[str, Any], receive_ns: int, peer: str | None = None) -> None:
        """Record one heartbeat; :class:`vlad.protocol.ProtocolError` when it is refused."""
        t = header.get("t_ns")
        if type(t) is not int or not 0 < t < 2**63:
            raise protocol.ProtocolError(protocol.Rejection.MALFORMED, "heartbeat: t_ns must be a positive integer")
        client = header.get("client", "")
        if client != "":
            protocol.check_text(client, "client", 128)
        cadence = header.get("cadence", "stream")
        if cadence not in CADENCES:
            raise protocol.ProtocolError(
                protocol.Rejection.MALFORMED, f"heartbeat: cadence must be one of {', '.join(CADENCES)}"
            )
        bye = header.get("bye", False)
        if type(bye) is not bool:
            raise protocol.ProtocolError(protocol.Rejection.MALFORMED, "heartbeat: bye must be true or false")
        with self._lock:
            entry = self._claim(client, receive_ns, peer, "heartbeat")
            if bye:
                del self._table[client]
                self.left_ns = receive_ns
                return
            if not entry.first_beat_ns or receive_ns - entry.last_beat_ns > self.establish_ns:
                entry.first_beat_ns = receive_ns  # a new run of heartbeats
            entry.last_beat_ns = entry.last_seen_ns = receive_ns
            if cadence != entry.cadence or not entry.cadence_since_ns:
                entry.cadence, entry.cadence_since_ns = cadence, receive_ns
            self._judge(entry)

    def admit(self, client: object, receive_ns: int, peer: str | None = None) -> None:
        """May an observation under ``client`` (its name already checked) be served?
        :class:`vlad.protocol.ProtocolError` (``too_many_controllers``, ``name_in_use``) when
        not; checked before anything of the observation is believed."""
        with self._lock:
            self._claim(client if isinstance(client, str) else "", receive_ns, peer, "observation")

    def observed(self, client: object, receive_ns: int) -> None:
        """An observation from ``client``, admitted by :meth:`admit`, passed every check."""
        entry = self._table.get(client if isinstance(client, str) else "")
        if entry is not None:
            entry.observed = True
            entry.last_seen_ns = max(entry.last_seen_ns, receive_ns)
            self._judge(entry)

    def _judge(self, entry: _Entry) -> None:
        if not entry.judged and entry.observed and entry.last_beat_ns - entry.first_beat_ns >= self.establish_ns:
            entry.judged = True

    def _claim(self, name: str, now: int, peer: str | None, what: str) -> _Entry:
        """The entry of ``name`` for a message from ``peer`` (created, taken over or refused)."""
        entry = self._table.get(name)
        if entry is None:
            if len(self._table) >= self.limit and not self._evict(now):
                raise protocol.ProtocolError(
                    protocol.Rejection.TOO_MANY_CONTROLLERS,
                    f"{what} from {name!r:.40}: already {self.limit} controllers known",
                )
            entry = self._table[name] = _Entry(peer)
            return entry
        if peer is None or entry.peer == peer:
            return entry
        owner_live = now - max(entry.last_beat_ns, entry.last_seen_ns) <= self.establish_ns
        if entry.peer is None or (not owner_live and principal(entry.peer) == principal(peer)):
            entry.peer = peer  # the controller restarted (or the name was never owned)
            return entry
        raise protocol.ProtocolError(
            protocol.Rejection.NAME_IN_USE, f"{what} under {name!r:.40} from another connection than the controller's"
        )

    def _evict(self, now: int) -> bool:
        """Drop one name that was never judged and is silent past the limit; False: none."""
        for name, entry in self._table.items():
            if not entry.judged and now - entry.last_seen_ns > self.establish_ns:
                del self._table[name]
                return True
        return False

    # -- read by the health task and the status; changed by the operator --------------------

    @property
    def only_requests(self) -> bool:
        """Every controller heartbeating declared ``cadence = "request"`` (and there is one):
        none waits for a command between its requests (vlad.serving.cadence sends no bridges)."""
        entries = [e for e in list(self._table.values()) if e.first_beat_ns]
        return bool(entries) and all(e.cadence == "request" for e in entries)

    def forget_silent(self, now_ns: int, limit_ns: int) -> list[str]:
        """Forget every name (judged or not) silent for more than ``limit_ns``: an operator's
        decision that they are gone (``vladctl resume``); the names forgotten."""
        with self._lock:
            gone = [n for n, e in self._table.items() if now_ns - max(e.last_beat_ns, e.last_seen_ns) > limit_ns]
            for name in gone:
                del self._table[name]
        return gone

    def snapshot(self) -> dict[str, Beat]:
        """The controllers judged, with their newest heartbeat."""
        return {
            name: Beat(e.last_beat_ns, e.cadence, e.cadence_since_ns)
            for name, e in list(self._table.items())
            if e.judged
        }

    def __len__(self) -> int:
        return len(self._table)
