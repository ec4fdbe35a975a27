"""Per-controller liveness: every controller's own heartbeat state.

A controller is known by the ``client`` name of its heartbeats and observations (``""`` for
one that names itself in neither); the openpi endpoint heartbeats and sends observations
for each of its websocket clients by slot (``openpi/1`` ...). A name is judged once it has
had both a heartbeat and an accepted observation: then it is alive while its heartbeats
keep coming, and dead, whatever the others do, when they stop; the heartbeat monitor
(:class:`vlad.health.monitors.HeartbeatMonitor`) moves to the hold posture until it is back
or has said goodbye. So a live openpi client (or any second controller) never hides the
death of a native controller's loop, and heartbeats alone (junk from a flood, a name used
once) never make a controller whose silence would hold the robot.

A heartbeat counts only when it is well formed: ``t_ns`` a positive integer (the sender's
monotonic time), ``client`` a printable name of at most 128 characters, ``cadence`` (when
present) ``"stream"`` or ``"request"``, ``bye`` (when present) a boolean. Anything else is
refused as ``malformed`` and keeps nobody alive. ``bye: true`` removes the controller (it
left on purpose). The table holds at most :data:`MAX_CONTROLLERS` names: a flood of new
names is refused (``too_many_controllers``) instead of growing it, and a known name is
never evicted to make room (that would hide its death).

``cadence`` tells the sensor-stall monitor how the controller asks: ``stream`` (default)
sends an observation every control period, so silence is a stalled sensor stream;
``request`` sends one only when it needs a new chunk (openpi's action chunk broker), so
silence between requests is not a stall.

Written by the serving thread (:class:`vlad.serving.intake.Intake` calls it for every
heartbeat and every accepted observation), read by the health task through
:meth:`Controllers.snapshot` (dict and set copies, atomic under the GIL).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from vlad import protocol

MAX_CONTROLLERS = 64
CADENCES = ("stream", "request")


class Beat(NamedTuple):
    """One controller's newest heartbeat: when it arrived (daemon clock) and how it asks."""

    last_ns: int
    cadence: str


class Controllers:
    """The heartbeat table (see module doc)."""

    def __init__(self, limit: int = MAX_CONTROLLERS) -> None:
        self.limit = limit
        self._table: dict[str, Beat] = {}
        self._observing: set[str] = set()  # names with an accepted observation (at most limit)
        self.left_ns = 0  # when the last goodbye arrived (daemon clock)

    def observed(self, client: object) -> None:
        """An observation from ``client`` passed every check (its name is already checked)."""
        name = client if isinstance(client, str) else ""
        if name not in self._observing and len(self._observing) < self.limit:
            self._observing.add(name)

    def heartbeat(self, header: Mapping[str, Any], receive_ns: int) -> None:
        """Record one heartbeat; :class:`vlad.protocol.ProtocolError` when it is refused."""
        t = header.get("t_ns")
        if type(t) is not int or not 0 < t < 2**63:
            raise protocol.ProtocolError("malformed", "heartbeat: t_ns must be a positive integer")
        client = header.get("client", "")
        if client != "":
            protocol.check_text(client, "client", 128)
        cadence = header.get("cadence", "stream")
        if cadence not in CADENCES:
            raise protocol.ProtocolError("malformed", f"heartbeat: cadence must be one of {', '.join(CADENCES)}")
        bye = header.get("bye", False)
        if type(bye) is not bool:
            raise protocol.ProtocolError("malformed", "heartbeat: bye must be true or false")
        if bye:
            self._table.pop(client, None)
            self._observing.discard(client)
            self.left_ns = receive_ns
            return
        if client not in self._table and len(self._table) >= self.limit:
            raise protocol.ProtocolError(
                "too_many_controllers", f"heartbeat from {client!r:.40}: already {self.limit} controllers known"
            )
        self._table[client] = Beat(receive_ns, cadence)

    @property
    def only_requests(self) -> bool:
        """Every controller known declared ``cadence = "request"`` (and there is one): none
        waits for a command between its requests (vlad.serving.cadence sends no bridges)."""
        table = self._table
        return bool(table) and all(b.cadence == "request" for b in table.values())

    def forget(self, names: list[str] | None = None) -> list[str]:
        """Drop the given controllers (every one when None); the names dropped."""
        gone = list(self._table) if names is None else [n for n in names if n in self._table]
        for name in gone:
            self._table.pop(name, None)
            self._observing.discard(name)
        return gone

    def snapshot(self) -> dict[str, Beat]:
        """The controllers judged: names with heartbeats and an accepted observation."""
        beats, observing = dict(self._table), set(self._observing)
        return {name: beat for name, beat in beats.items() if name in observing}
