"""The health interface: monitors look at a :class:`HealthView` and return :class:`Finding`s.

The supervisor builds a view every monitor tick (a snapshot: counters copied, nothing live)
and hands it to every monitor; :class:`vlad.health.policy.HealthPolicy` decides what the
findings mean. A finding's ``scope`` says whose fault it is, which decides between
degrading, falling back and quarantining:

* ``policy``: the model misbehaves (quarantined until an operator or a new release);
* ``system``: the machine or a remote link (heat, memory, deadlines, an unreachable server);
* ``controller``: heartbeats (each controller's own);   ``input``: the sensor data.

Monitors and sensors are plugins (``vlad_monitors(config)``, ``vlad_sensors()`` hooks): the
built-ins (:mod:`vlad.health.monitors`, :mod:`vlad.health.sensors`) are registered the same
way a robot integrator registers theirs (a board temperature, a PLC heartbeat).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

from vlad.backend import SessionStats
from vlad.config import MonitorsConfig
from vlad.health.liveness import Beat
from vlad.serving.counters import IntakeCounts, PolicyCounts, PolicyId, PublishCounts

Severity = Literal["warn", "fault"]
Scope = Literal["policy", "system", "controller", "input"]


@dataclass(frozen=True)
class Finding:
    """Something wrong right now, as one monitor sees it."""

    monitor: str
    code: str
    severity: Severity
    scope: Scope
    message: str
    value: float | None = None
    threshold: float | None = None
    policy: PolicyId | None = None  # scope "policy": the policy that produced it
    subject: str = ""  # whom else it is about (a controller's name): one episode each
    # How long this fault must stay clear before vlad moves back up the chain; None:
    # ``fallback.healthy_window_s``. A monitor whose fault already clears with its own
    # hysteresis (the remote link's prober) sets 0.
    healthy_window_ns: int | None = None

    @property
    def key(self) -> tuple[str, str, PolicyId | None, str]:
        """Identity of a fault episode (edge-triggered logging)."""
        return (self.monitor, self.code, self.policy, self.subject)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["policy"] = str(self.policy) if self.policy else None
        return out


@dataclass(frozen=True)
class InFlight:
    """An inference running now: which policy, since when (monotonic ns)."""

    policy: PolicyId
    since_ns: int


@dataclass(frozen=True)
class HealthView:
    """What monitors may look at: one consistent snapshot per monitor tick."""

    now_ns: int
    period_ns: int
    deadline_ns: int
    thresholds: MonitorsConfig
    intake: IntakeCounts  # cumulative
    intake_window: IntakeCounts  # since the previous tick
    publish: PublishCounts
    publish_window: PublishCounts
    policies: Mapping[PolicyId, PolicyCounts]  # cumulative, every loaded policy (chain and shadow)
    policies_window: Mapping[PolicyId, PolicyCounts]
    serving: PolicyId | None  # the policy answering now; None: the hold posture
    release: PolicyId  # the release being served (first in the chain)
    latency: Mapping[str, Mapping[str, float]]  # LatencyStats.summary()
    last_observation_ns: int  # last valid observation (0: none yet)
    last_heartbeat_ns: int  # 0: none yet (the newest of any controller)
    in_flight: InFlight | None
    hang_timeout_ns: int
    readings: Mapping[str, float]  # from every sensor: "temperature.cpu.0" -> 61.0 ...
    backend_stats: Mapping[PolicyId, SessionStats] = field(default_factory=dict)  # Session.stats()
    release_dir: Path | None = None
    artifacts: Mapping[str, str] = field(default_factory=dict)  # relative path -> sha256
    # Each controller's newest heartbeat, by client name (vlad.health.liveness), and when
    # the last one said goodbye (0: none did).
    controllers: Mapping[str, Beat] = field(default_factory=dict)
    controllers_left_ns: int = 0
    # When the serving thread last read its socket: ages of heartbeats and observations are
    # judged up to then (a message may wait unread behind a long inference). 0: now.
    socket_read_ns: int = 0

    @property
    def read_until_ns(self) -> int:
        """The time up to which what controllers sent has been read."""
        return min(self.now_ns, self.socket_read_ns) if self.socket_read_ns else self.now_ns


class Monitor(abc.ABC):
    """One health check. ``check`` must be cheap; it runs every monitor tick (~50 ms).

    A monitor with thresholds of its own declares them as a frozen dataclass, ``Settings``
    (every field with a default; :mod:`vlad.schema` types, bounds and ``Literal`` choices):
    the daemon's config parser reads the ``[monitors.<name>]`` table with it, so an unknown
    key, a wrong type or a value out of bounds refuses the start in one line naming the
    key, and the daemon hands the parsed table to :attr:`settings` before the first check.
    The built-in monitors read the shared ``[monitors]`` thresholds from the view instead.
    """

    name: str = "?"
    #: The dataclass of this monitor's ``[monitors.<name>]`` table; None: it takes none.
    Settings: ClassVar[type | None] = None
    #: The parsed table (a ``Settings``), set by the daemon; a monitor made in code sets
    #: its own (e.g. ``Settings()``'s defaults).
    settings: Any = None

    @abc.abstractmethod
    def check(self, view: HealthView) -> list[Finding]:
        """Findings for what is wrong now; an empty list means healthy."""


class Sensor(abc.ABC):
    """A source of named readings (``temperature.<where>`` in °C, ``memory.<what>`` in bytes)."""

    name: str = "?"
    #: Read at most this often (seconds); the health ticks in between reuse the last
    #: readings. Temperatures and memory change over seconds, and a scan of the hardware
    #: monitors on every 20 Hz tick is interpreter time the serving thread competes with.
    interval_s: float = 0.0
    _sampled: dict[str, float] | None = None
    _sampled_at = 0.0

    @abc.abstractmethod
    def read(self) -> dict[str, float]:
        """Current readings; an unreadable sensor returns ``{}`` rather than raising."""

    def sample(self, now_s: float) -> dict[str, float]:
        """:meth:`read`, or its last readings while they are younger than :attr:`interval_s`
        (``now_s``: ``time.monotonic()``)."""
        if self._sampled is not None and now_s - self._sampled_at < self.interval_s:
            return self._sampled
        readings = self.read()
        self._sampled, self._sampled_at = readings, now_s
        return readings
