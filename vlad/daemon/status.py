"""What ``vladctl status`` shows and the status socket publishes: a :class:`vlad.snapshot.StatusSnapshot`.

:class:`StatusModel` builds it from the components it reports on, which the supervisor
hands it (the chain, the serving parts, the release manager, the e-stop ...). Built on the
event loop from snapshots of the serving thread's counters (no locks on the hot path). The
counters keep the flat names of docs/protocol.md (``published``, ``stale``,
``superseded``, ``rejected`` by reason ...), so dashboards and scripts keep working;
``policies`` has every loaded policy's own counters.

The status is all the Prometheus endpoint (:mod:`vlad.compat.metrics`, its own process)
reads, so it also carries what only cumulative figures can show: per-stage latency
histograms and event counts, folded by :class:`Tallies` once per published status from the
rolling latency windows and the state machine's history.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vlad import __version__
from vlad.backend import SessionStats
from vlad.config import RealtimeConfig
from vlad.serving.tracing import STAGES
from vlad.snapshot import (
    BackendStatus,
    ControllerStatus,
    Counters,
    EStopStatus,
    FindingStatus,
    Histogram,
    Rates,
    StatusSnapshot,
    percentiles,
    split_readings,
)

log = logging.getLogger("vlad.status")

if TYPE_CHECKING:
    from vlad.daemon.chain import PolicyChain
    from vlad.daemon.endpoints import Endpoints
    from vlad.daemon.releases import ReleaseManager
    from vlad.daemon.safety import EStop
    from vlad.daemon.sockets import Gatekeeper
    from vlad.daemon.tap import Tap
    from vlad.health.base import Finding
    from vlad.health.state import StateMachine
    from vlad.serving.cadence import HoldKeeper
    from vlad.serving.guard import ActionGuard
    from vlad.serving.intake import Intake
    from vlad.serving.loop import ServingLoop
    from vlad.serving.publisher import Publisher
    from vlad.serving.tracing import LatencyStats


class RateMeter:
    """Observations and actions per second, over at least half a second."""

    def __init__(self) -> None:
        self._prev = (time.monotonic_ns(), 0, 0)
        self.value = Rates(observations_hz=0.0, actions_hz=0.0)

    def update(self, now: int, observations: int, actions: int) -> Rates:
        t_prev, obs_prev, act_prev = self._prev
        dt = (now - t_prev) / 1e9
        if dt >= 0.5:
            self.value = Rates(
                observations_hz=round((observations - obs_prev) / dt, 2),
                actions_hz=round((actions - act_prev) / dt, 2),
            )
            self._prev = (now, observations, actions)
        return self.value


# Histogram bucket edges, seconds. The demo's e2e is ~3 ms; a remote or GPU policy tens of
# ms; a hang seconds.
BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class Tallies:
    """Cumulative per-stage latency histograms and event counts (module doc).

    :meth:`fold` reads what the latency windows and the event history gained since the
    last fold; no sample is lost unless more than ``serve.latency_window`` cycles happen
    between two published statuses (counted as ``lost``)."""

    def __init__(self, started_ns: int) -> None:
        self.edges_ms = np.asarray(BUCKETS_S) * 1e3  # the windows hold milliseconds
        self.seen = dict.fromkeys(STAGES, 0)
        self.buckets = {s: np.zeros(len(BUCKETS_S) + 1, dtype=np.int64) for s in STAGES}  # last: +Inf
        self.sum_s = dict.fromkeys(STAGES, 0.0)
        self.count = dict.fromkeys(STAGES, 0)
        self.lost = dict.fromkeys(STAGES, 0)
        self.events: Counter[str] = Counter()
        self.transitions: Counter[str] = Counter()
        self.last_event_ns = started_ns - 1

    def fold(self, stats: LatencyStats, state: StateMachine) -> None:
        for stage in STAGES:
            samples, total, lost = stats.since(stage, self.seen[stage])
            self.seen[stage] = total
            self.lost[stage] += lost
            if samples.size:
                idx = np.searchsorted(self.edges_ms, samples, side="left")  # the le-bucket of each sample
                self.buckets[stage] += np.bincount(idx, minlength=len(BUCKETS_S) + 1)
                self.sum_s[stage] += float(samples.sum()) / 1e3
                self.count[stage] += int(samples.size)
        for ev in state.recent(10_000):
            if ev.monotonic_ns <= self.last_event_ns:
                continue
            self.last_event_ns = ev.monotonic_ns
            if ev.kind == "transition":
                self.transitions[ev.state_to] += 1
            else:
                self.events[ev.kind] += 1

    def histograms(self) -> dict[str, Histogram]:
        """Per stage with samples: cumulative counts per bucket edge (the last +Inf), sum, lost."""
        return {
            stage: Histogram(
                cumulative=tuple(int(n) for n in np.cumsum(self.buckets[stage])),
                sum_s=self.sum_s[stage],
                count=self.count[stage],
                lost=self.lost[stage],
            )
            for stage in STAGES
            if self.count[stage] or self.lost[stage]
        }


@dataclass
class HealthReadout:
    """The last health tick's outcome: written by the health task, shown by the status."""

    findings: list[Finding] = field(default_factory=list)
    readings: dict[str, float] = field(default_factory=dict)


@dataclass(eq=False, kw_only=True)
class StatusModel:
    """The status: built from the components it reports on, given by the supervisor."""

    chain: PolicyChain
    state: StateMachine
    intake: Intake
    publisher: Publisher
    guard: ActionGuard
    stats: LatencyStats
    cadence: HoldKeeper
    loop: ServingLoop
    estop: EStop
    gatekeeper: Gatekeeper
    releases: ReleaseManager
    health: HealthReadout
    control_rejected: Mapping[str, int]
    endpoints: Endpoints
    tap: Tap | None
    control_period_ms: float
    heartbeat_limit_ns: int
    realtime: RealtimeConfig  # the real-time settings in force
    started_ns: int = field(init=False, default_factory=time.monotonic_ns)
    rates: RateMeter = field(init=False, default_factory=RateMeter)
    tallies: Tallies = field(init=False)  # cumulative figures the status carries

    def __post_init__(self) -> None:
        self.tallies = Tallies(self.started_ns)

    def fold(self) -> None:
        """Fold what the latency windows and the event history gained into the tallies
        (once per published status)."""
        self.tallies.fold(self.stats, self.state)

    def counters(self) -> Counters:
        """The flat counters (names kept stable across versions)."""
        intake, pub = self.intake.counts.snapshot(), self.publisher.counts.snapshot()
        policies = [p.served.counts for p in self.chain.policies]
        rejected = dict(intake.rejected)
        for role, n in self.gatekeeper.denied.items():
            rejected[f"unauthorized_{role}"] = n
        rejected.update({f"control_{k}": v for k, v in self.control_rejected.items()})
        if self.estop.counts.get("garbled"):
            rejected["estop_garbled"] = self.estop.counts["garbled"]
        guard = self.guard.counts
        rehearsal = self.loop.rehearsal
        return Counters(
            messages=intake.messages,
            observations=intake.observations,
            heartbeats=intake.heartbeats,
            superseded=intake.superseded,
            input_rejected=intake.input_rejected,
            reanchors=intake.reanchors,
            reanchors_announced=self.intake.trusted.announced,
            published=pub.policy_chunks,
            published_hold=sum(pub.holds.values()),
            holds=dict(pub.holds),
            interventions=pub.interventions,
            deadline_misses=pub.deadline_misses,
            bridged=self.cadence.bridged,
            cycle_errors=self.loop.cycle_errors + sum(c.cycle_errors for c in policies),
            stale=sum(c.stale for c in policies),
            backend_errors=sum(c.backend_errors for c in policies),
            remote_errors=sum(c.remote_errors for c in policies),
            expired=sum(c.expired for c in policies),
            estop_blocked=sum(c.estop_blocked for c in policies),
            guard_nonfinite=guard["nonfinite"],
            guard_bounds=guard["bounds"],
            guard_out_of_bounds=guard["out_of_bounds"],
            guard_rate=guard["rate"],
            guard_expired=guard["expired"],
            rejected=rejected,
            guard_seam=guard["seam"],
            reanchors_contradicted=self.intake.trusted.contradicted,
            reanchors_expired=self.intake.trusted.expired,
            unconfirmed=sum(c.unconfirmed for c in policies),
            exec_unknown=self.guard.reports_unknown,
            guided=sum(c.guided for c in policies),
            rehearsals=rehearsal.runs if rehearsal else 0,
            rehearsals_interrupted=rehearsal.interrupted if rehearsal else 0,
            rehearsal_errors=rehearsal.errors if rehearsal else 0,
        )

    def build(self) -> dict[str, Any]:
        """The status map the socket publishes and ``status`` answers."""
        return self.snapshot().to_dict()

    def snapshot(self) -> StatusSnapshot:
        """The status now, typed (what :meth:`build` sends)."""
        now = time.monotonic_ns()
        c = self.counters()
        rates = self.rates.update(now, c.observations, c.published + c.published_hold)
        release = self.chain.release
        desc = release.served.session.describe()
        latency = percentiles(self.stats.summary())
        health = self.chain.health
        serving = self.chain.serving
        backend_stats = {str(p.id): p.served.session.stats() for p in self.chain.policies}
        last_beat = self.intake.last_heartbeat_ns
        # A sensor that failed reads NaN: no figure to show, and JSON has no NaN.
        readings = {k: float(v) for k, v in self.health.readings.items() if math.isfinite(v)}
        temperatures, memory_readings = split_readings(readings)
        return StatusSnapshot(
            version=__version__,
            pid=os.getpid(),
            state=self.state.state.value,
            state_since_s=round((now - self.state.since_ns) / 1e9, 3),
            uptime_s=round((now - self.started_ns) / 1e9, 3),
            release=release.id.release,
            evidence=self.releases.evidence_status(),
            operation=self.releases.operation_status(now),
            serving=str(health.chain[health.active]),
            serving_backend=serving.served.session.describe().backend if serving else "hold",
            chain=tuple(str(p) for p in health.chain),
            quarantined={str(health.chain[i]): code for i, code in health.quarantined.items()},
            estop=EStopStatus(
                engaged=self.estop.engaged,
                source=self.estop.source or "",
                reason=self.estop.reason or "",
                counts=dict(self.estop.counts),
            ),
            findings=tuple(_finding(f) for f in self.health.findings),
            swaps_ms=tuple(self.publisher.swap_ms),
            shadow=self.releases.shadow.status() if self.releases.shadow else None,
            canary=self.releases.canary.status(now) if self.releases.canary else None,
            backend=BackendStatus(
                name=desc.backend,
                runtime=f"{desc.runtime} {desc.runtime_version}",
                device=str(desc.device),
                providers=tuple(desc.providers),
                precision=desc.precision,
                stats=backend_stats.get(str(release.id), SessionStats()),
            ),
            backend_stats=backend_stats,
            control_period_ms=self.control_period_ms,
            rates=rates,
            counters=c,
            policies={str(p.id): p.served.counts.snapshot() for p in self.chain.policies},
            heartbeat_age_s=round((now - last_beat) / 1e9, 3) if last_beat else None,
            controllers={
                name: ControllerStatus(
                    heartbeat_age_s=round(max(0, now - beat.last_ns) / 1e9, 3),
                    alive=now - beat.last_ns <= self.heartbeat_limit_ns,
                    cadence=beat.cadence,
                )
                for name, beat in sorted(self.intake.controllers.snapshot().items())
            },
            latency_ms=latency,
            engine_ms=latency.get("engine"),
            temperatures_c=temperatures,
            # per loaded policy (measured at its load), the sum and the [memory] budget
            memory=self.releases.budget.status(
                self.releases.loaded_memory(),
                host_rss_bytes=int(memory_readings.get("rss", 0)) or release.served.session.memory().host_rss_bytes,
                readings_bytes=memory_readings,
            ),
            realtime=self.realtime,
            tap=self.tap.status() if self.tap is not None else None,
            monotonic_ns=now,  # the daemon's clock when this was built (the metrics' status age)
            readings=readings,
            bucket_edges_s=BUCKETS_S,
            histograms=self.tallies.histograms(),
            event_counts=dict(self.tallies.events),
            transition_counts=dict(self.tallies.transitions),
            openpi=self.endpoints.openpi(),
            metrics=self.endpoints.metrics(),
        )


def _finding(f: Finding) -> FindingStatus:
    d = f.to_dict()
    for key in ("value", "threshold"):  # a reading that failed (NaN) is no figure a reader can use
        if d[key] is not None and not math.isfinite(d[key]):
            d[key] = None
    return FindingStatus(**d)
