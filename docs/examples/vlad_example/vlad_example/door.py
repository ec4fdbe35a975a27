"""The ``door`` monitor: a sensor plugin and the monitor that judges its reading.

Sensors (``vlad_sensors`` hook) read hardware into named numbers; monitors
(``vlad_monitors`` hook) look at one consistent :class:`~vlad.health.base.HealthView` per
tick, sensor readings included, and return findings. A ``warn`` finding of scope
``system`` shows in ``vladctl status`` and moves the daemon to DEGRADED; a ``fault`` would
send it down the fallback chain until the finding has been clear for the healthy window.

The enclosure door stands for any signal a robot integrator has: here a file holding
``open`` or ``closed`` (a GPIO or fieldbus value on a real cell), named by
``$VLAD_EXAMPLE_DOOR_FILE``. vlad only reports it: interlocks belong to the safety PLC.

The monitor's own setting is the ``[monitors.door]`` table of the daemon config, declared
as :class:`DoorSettings`: vlad's config parser reads it with the rest of the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vlad.health.base import Finding, HealthView, Monitor, Sensor
from vlad.hookspecs import hookimpl

READING = "door.open"  # <device>.<what>: 1.0 open, 0.0 closed


class DoorSensor(Sensor):
    name = "door"

    def read(self) -> dict[str, float]:
        """The door's state; an unreadable sensor returns {} (no reading, no finding)."""
        path = os.environ.get("VLAD_EXAMPLE_DOOR_FILE")
        if not path:
            return {}
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except OSError:
            return {}
        return {READING: 1.0 if text == "open" else 0.0}


@dataclass(frozen=True)
class DoorSettings:
    """``[monitors.door]``: every field has a default; unknown keys and other values are refused."""

    severity: Literal["warn", "fault"] = "warn"  # fault: serve below the release while it is open


class DoorMonitor(Monitor):
    name = "door"
    Settings = DoorSettings
    settings = DoorSettings()  # the daemon sets the parsed [monitors.door] table

    def check(self, view: HealthView) -> list[Finding]:
        """Cheap and total: it runs every monitor tick and must not raise."""
        if view.readings.get(READING, 0.0) < 1.0:
            return []
        severity = self.settings.severity
        return [Finding(self.name, "door_open", severity, "system", "enclosure door open", value=1.0, threshold=1.0)]


@hookimpl
def vlad_sensors() -> list[Sensor]:
    return [DoorSensor()]


@hookimpl
def vlad_monitors(config: dict) -> list[Monitor]:
    """``config`` is the daemon's ``[monitors]`` table; this monitor reads its own, ``[monitors.door]``."""
    return [DoorMonitor()]
