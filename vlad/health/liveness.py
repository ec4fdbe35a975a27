"""Per-controller liveness: every controller's own heartbeat state.

A controller is known by the ``client`` name in its heartbeats (``""`` for one that sends
none); the openpi endpoint heartbeats for each of its websocket clients by slot
(``openpi/1`` ...). A controller is alive while its heartbeats keep coming; one whose
heartbeats stop is dead, whatever the others do, and the heartbeat monitor
(:class:`vlad.health.monitors.HeartbeatMonitor`) moves to the hold posture until it is back
or has said goodbye. So a live openpi client (or any second controller) never hides the
death of a native controller's loop.

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

Written by the serving thread (one call from :class:`vlad.serving.intake.Intake` per
heartbeat), read by the health task through :meth:`Controllers.snapshot` (a dict copy,
atomic under the GIL).
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
            return
        if client not in self._table and len(self._table) >= self.limit:
            raise protocol.ProtocolError(
                "too_many_controllers", f"heartbeat from {client!r:.40}: already {self.limit} controllers known"
            )
        self._table[client] = Beat(receive_ns, cadence)

    def forget(self, names: list[str] | None = None) -> list[str]:
        """Drop the given controllers (every one when None); the names dropped."""
        gone = list(self._table) if names is None else [n for n in names if n in self._table]
        for name in gone:
            self._table.pop(name, None)
        return gone

    def snapshot(self) -> dict[str, Beat]:
        return dict(self._table)
