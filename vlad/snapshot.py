"""The daemon's status as typed data: what the status socket publishes and ``status`` answers.

:class:`StatusSnapshot` is the one definition of the status map. The daemon builds one
(:mod:`vlad.daemon.status`) and sends :meth:`StatusSnapshot.to_dict`; every reader
(``vladctl status``, ``--json``, ``--watch``, the Prometheus endpoint) turns the map it
received back into a snapshot with :func:`parse_status` and reads attributes, never keys
picked by name or prefix. A map this version cannot read is one clear line
(:class:`StatusUnreadable`), listing every problem at once (the parser is
:mod:`vlad.schema`'s, as for the config and the contract). :func:`parse_events` does the
same for the ``events`` answer (:class:`vlad.health.state.Event`).

The wire keys are those documented in docs/protocol.md. The free-form parts are the
events' details and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal

from vlad import __version__, schema
from vlad.backend import RollingLatency, SessionStats
from vlad.config import RealtimeConfig
from vlad.errors import ProblemsError
from vlad.health.base import Scope, Severity
from vlad.health.state import Event, StateName
from vlad.serving.counters import PolicyCounts

# A string field that may be empty (the schema refuses empty strings by default).
TEXT: dict[str, Any] = {"allow_empty": True}


class StatusUnreadable(ProblemsError):
    """A status (or events) map this version of vlad cannot read: another version's daemon,
    or something else publishing on the status socket. One line: the first problems and
    what to check."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(source, problems)
        more = f"; {len(problems) - 3} more" if len(problems) > 3 else ""
        self.args = (
            f"{source} does not parse ({'; '.join(problems[:3])}{more}): "
            f"is this vlad {__version__} the daemon's version?",
        )


@dataclass(frozen=True, kw_only=True)
class EStopStatus:
    """The external e-stop as vlad reads it (it never clears it)."""

    engaged: bool
    source: str = field(metadata=TEXT)  # empty: the safety system did not say
    reason: str = field(metadata=TEXT)
    counts: Mapping[str, int]  # engaged, released, garbled ...


@dataclass(frozen=True, kw_only=True)
class FindingStatus:
    """A health finding as the status shows it (:class:`vlad.health.base.Finding`)."""

    monitor: str
    code: str
    severity: Severity
    scope: Scope
    message: str = field(metadata=TEXT)
    value: float | None = None
    threshold: float | None = None
    policy: str | None = None
    subject: str = field(default="", metadata=TEXT)
    healthy_window_ns: int | None = None


@dataclass(frozen=True, kw_only=True)
class Swap:
    to: str  # the chain slot (or hold) that took over
    first_command_ms: float  # from the swap decision to its first command published


@dataclass(frozen=True, kw_only=True)
class BackendStatus:
    """The serving release's session (:class:`vlad.backend.SessionDescription`) and its stats."""

    name: str
    runtime: str
    device: str
    providers: tuple[str, ...]
    precision: str
    stats: SessionStats


@dataclass(frozen=True, kw_only=True)
class Rates:
    observations_hz: float
    actions_hz: float


@dataclass(frozen=True, kw_only=True)
class Counters:
    """The flat counter names of docs/protocol.md (kept stable for dashboards and scripts)."""

    messages: int
    observations: int
    heartbeats: int
    superseded: int
    input_rejected: int
    reanchors: int
    reanchors_announced: int
    published: int
    published_hold: int
    holds: Mapping[str, int]  # hold chunks by reason
    interventions: int
    deadline_misses: int
    bridged: int
    cycle_errors: int
    stale: int
    backend_errors: int
    remote_errors: int
    expired: int
    estop_blocked: int
    # The final guard's corrections, one field per kind (vlad.serving.guard.INTERVENTIONS).
    guard_nonfinite: int
    guard_bounds: int
    guard_out_of_bounds: int
    guard_rate: int
    guard_expired: int
    rejected: Mapping[str, int]  # refusals by reason
    guard_seam: int = 0
    reanchors_contradicted: int = 0  # announced jumps the next observation contradicted
    reanchors_expired: int = 0  # announced jumps nothing confirmed in time (dropped)
    unconfirmed: int = 0  # policy chunks about such an announcement (not sent)
    exec_unknown: int = 0  # `exec` reports naming no chunk vlad sent that controller
    guided: int = 0  # policy chunks computed to continue what the robot executes (real-time chunking)
    rehearsals: int = 0  # the hot path's first stages run on scratch copies (vlad.serving.rehearsal)
    rehearsals_interrupted: int = 0  # of those, stopped early: a message came
    rehearsal_errors: int = 0  # failed on a bug (logged; serving is not affected)

    def guard(self) -> dict[str, int]:
        """The guard's corrections by kind."""
        return {
            "nonfinite": self.guard_nonfinite,
            "bounds": self.guard_bounds,
            "out_of_bounds": self.guard_out_of_bounds,
            "seam": self.guard_seam,
            "rate": self.guard_rate,
            "expired": self.guard_expired,
        }


@dataclass(frozen=True, kw_only=True)
class Percentiles:
    """One stage's latency over the rolling window, milliseconds."""

    count: int
    p50: float
    p95: float
    p99: float
    max: float


def percentiles(summary: Mapping[str, Mapping[str, float]]) -> dict[str, Percentiles]:
    """A latency window's summary (:meth:`vlad.serving.tracing.LatencyStats.summary`) typed."""
    return {
        stage: Percentiles(count=int(v["count"]), p50=v["p50"], p95=v["p95"], p99=v["p99"], max=v["max"])
        for stage, v in summary.items()
    }


@dataclass(frozen=True, kw_only=True)
class Histogram:
    """One stage's cumulative latency histogram (:class:`vlad.daemon.status.Tallies`)."""

    cumulative: tuple[int, ...]  # per bucket edge of ``bucket_edges_s``, the last +Inf
    sum_s: float
    count: int
    lost: int  # samples overwritten before they were folded


@dataclass(frozen=True, kw_only=True)
class ControllerStatus:
    heartbeat_age_s: float
    alive: bool
    cadence: str = field(metadata=TEXT)


@dataclass(frozen=True)
class PolicyMemory:
    """Bytes a policy holds (or needs) on the host and on its device, and where the figure
    comes from: ``measured`` at its load, ``manifest (<source>)`` or ``estimate``
    (:mod:`vlad.daemon.memory` budgets them)."""

    host_bytes: int
    device_bytes: int
    source: str


@dataclass(frozen=True, kw_only=True)
class MemoryStatus:
    host_rss_bytes: int
    # The health sensors' memory readings without the "memory." and "_bytes" parts
    # ("rss", "available", "board.available", "gpu.0.used" ...).
    readings_bytes: Mapping[str, float]
    budget_host_bytes: int | None
    budget_device_bytes: int | None
    swap: str  # what a deploy that does not fit beside the serving release does: "refuse" or "fallback"
    policies: Mapping[str, PolicyMemory]  # per loaded policy, measured at its load
    policies_host_bytes: int
    policies_device_bytes: int


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """The serving release's gate evidence."""

    status: Literal["passed", "forced", "unverified"]
    release: str
    gate_evidence: str | None
    problems: tuple[str, ...]
    who: str | None = None  # forced: who activated it without passing evidence, why, when
    why: str | None = None
    time: str | None = None
    published_unverified: int | None = None  # unverified: chunks published so


@dataclass(frozen=True, kw_only=True)
class Operation:
    """A release operation in flight (deploy, rollback, canary ...)."""

    kind: str
    target: str
    step: str = field(metadata=TEXT)
    elapsed_s: float


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """A shadow run's actions against the served ones, as its
    :class:`vlad.serving.shadow.DivergenceMeter` adds them up."""

    pairs: int  # chunks compared
    per_joint_max_abs: tuple[float, ...]
    per_joint_mean_abs: tuple[float, ...]
    max_abs: float
    mean_abs: float
    tolerance: float
    fraction_beyond_tolerance: float


@dataclass(frozen=True, kw_only=True)
class ShadowStatus:
    """A candidate running beside the served policy, never published (``vladctl shadow report``)."""

    release: str
    purpose: str  # "shadow" or "canary-reference"
    running_s: float
    divergence: Divergence
    latency_ms: Mapping[str, Percentiles]
    faults: Mapping[str, int]  # its policy counters, and the outputs it produced


@dataclass(frozen=True, kw_only=True)
class CanaryStatus:
    """A release deployed as a canary, watched against its manifest's thresholds."""

    release: str
    previous: str  # what an abort rolls back to
    elapsed_s: float
    window_s: float
    heartbeat_faults: int


@dataclass(frozen=True, kw_only=True)
class TapStatus:
    """The recording tap (``vladctl record``)."""

    endpoint: str
    subscribed: bool
    subscriptions: int  # recorders that subscribed since start
    sent: int
    queue_items: int  # the bounds of the daemon's queue: items ...
    queue_bytes: int  # ... and bytes, every frame counted
    recorder_queue: int  # messages each recorder's own queue in the socket holds
    dropped: Mapping[str, int]  # by the daemon's queue, by stream (a recorder's own losses are its seq gaps)


@dataclass(frozen=True, kw_only=True)
class EndpointStatus:
    """An endpoint process: the daemon's part (pid, running, restarts, failed_starts,
    unresponsive, last_failure) and the process's own report, whose figures are zero until
    its first one (and again from each restart)."""

    pid: int | None  # while running
    running: bool  # started (its ready line came) and not ended since
    restarts: int  # started again after it ended, failed to start or stopped reporting
    failed_starts: int = 0  # starts again that did not serve (killed while starting, an error, too slow)
    unresponsive: int = 0  # killed for sending no report within 5 s (stopped or hung)
    last_failure: str = field(default="", metadata=TEXT)  # why it last ended or failed to start
    listen: str = field(default="", metadata=TEXT)
    open_connections: int = 0
    refused_connections: Mapping[str, int] = field(default_factory=dict)  # closed at accept, by cap
    unreadable: int = 0  # statuses it could not parse (another vlad version)


@dataclass(frozen=True, kw_only=True)
class OpenpiStatus(EndpointStatus):
    """The openpi websocket endpoint (:mod:`vlad.compat.openpi`)."""

    clients: int = 0
    connections: int = 0
    idle_closed: int = 0
    requests: int = 0
    replies: int = 0
    errors: Mapping[str, int] = field(default_factory=dict)  # error answers and refusals, by reason
    infer_ms: RollingLatency | None = None  # request to reply, once there were some


@dataclass(frozen=True, kw_only=True)
class MetricsStatus(EndpointStatus):
    """The Prometheus endpoint (:mod:`vlad.compat.metrics`)."""

    scrapes: int = 0
    renders: int = 0
    bad_requests: int = 0
    timeouts: int = 0


@dataclass(frozen=True, kw_only=True)
class StatusSnapshot:
    """The whole status (module doc); field names are the wire keys."""

    version: str
    pid: int
    state: StateName
    state_since_s: float
    uptime_s: float
    release: str
    evidence: Evidence
    operation: Operation | None
    serving: str  # the policy answering now: a chain slot ("release:...", "fallback1:...") or "hold"
    serving_backend: str
    chain: tuple[str, ...]  # the release first, the hold posture last
    quarantined: Mapping[str, str]  # policy -> the finding code that quarantined it
    estop: EStopStatus
    findings: tuple[FindingStatus, ...]
    swaps_ms: tuple[Swap, ...]
    shadow: ShadowStatus | None
    canary: CanaryStatus | None
    backend: BackendStatus
    backend_stats: Mapping[str, SessionStats]  # every loaded policy's session stats
    control_period_ms: float
    rates: Rates
    counters: Counters
    policies: Mapping[str, PolicyCounts]  # every loaded policy's own counters
    heartbeat_age_s: float | None  # None: no heartbeat yet
    controllers: Mapping[str, ControllerStatus]
    latency_ms: Mapping[str, Percentiles]  # by stage, stages with samples only
    engine_ms: Percentiles | None
    temperatures_c: Mapping[str, float]  # by sensor ("cpu.0", "gpu.0" ...)
    memory: MemoryStatus
    realtime: RealtimeConfig  # the real-time settings in force
    tap: TapStatus | None  # when the tap has an endpoint
    monotonic_ns: int  # the daemon's clock when this was built
    readings: Mapping[str, float]  # every sensor reading, by name
    bucket_edges_s: tuple[float, ...]
    histograms: Mapping[str, Histogram]
    event_counts: Mapping[str, int]  # events recorded since start, by kind
    transition_counts: Mapping[str, int]  # transitions since start, by target state
    openpi: OpenpiStatus | None
    metrics: MetricsStatus | None

    @property
    def on_fallback(self) -> bool:
        """A fallback (or the hold posture) serves instead of the release."""
        return bool(self.chain) and self.serving != self.chain[0]

    def remote_links(self) -> list[tuple[str, SessionStats]]:
        """(policy id, link stats) of every loaded policy on a remote backend, in chain order."""
        return [(pid, s) for pid, s in self.backend_stats.items() if s.remote]

    def to_dict(self) -> dict[str, Any]:
        """The wire map (JSON- and msgpack-able)."""
        return plain(self)


def plain(value: Any) -> Any:
    """A snapshot (or part of one) as plain maps, lists and scalars, the wire form."""
    if isinstance(value, SessionStats):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def parse_status(data: Any, source: str = "the daemon's status") -> StatusSnapshot:
    """The snapshot of a status map; :class:`StatusUnreadable` lists every problem."""
    return schema.parse(StatusSnapshot, data, source, StatusUnreadable)


def parse_events(data: Any, source: str = "the daemon's events") -> list[Event]:
    """The events of an ``events`` answer (a list of event maps), oldest first."""
    if not isinstance(data, list):
        raise StatusUnreadable(source, [f"expected a list, got {schema.kind(data)}"])
    problems: list[str] = []
    out = [schema.convert(Event, e, f"[{i}]", problems) for i, e in enumerate(data)]
    if problems:
        raise StatusUnreadable(source, problems)
    return out


def split_readings(readings: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """The health sensors' readings as (temperatures in °C by sensor, memory in bytes by kind).

    The sensors name their readings ``temperature.<sensor>`` and ``memory.<kind>_bytes``
    (:mod:`vlad.health.sensors`); this is the one place that reads those names, so the
    status carries them typed. Non-finite readings (a sensor that failed) are left out."""
    temperatures: dict[str, float] = {}
    memory: dict[str, float] = {}
    for name, value in sorted(readings.items()):
        if not math.isfinite(value):
            continue
        group, _, rest = name.partition(".")
        if group == "temperature" and rest:
            temperatures[rest] = float(value)
        elif group == "memory" and rest:
            memory[rest.removesuffix("_bytes")] = float(value)
    return temperatures, memory
