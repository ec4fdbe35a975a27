"""The health service: sensors and monitors each tick, the fallback decision applied.

Each tick (``fallback.monitor_hz``, while the serving thread needs no GIL: :func:`between_cycles`)
the sensors and monitors read a :class:`~vlad.health.base.HealthView` of the counters off
the event loop; the findings go to the policy chain, which decides
(:func:`vlad.health.policy.decide`) and moves (:meth:`~vlad.daemon.chain.PolicyChain.follow_health`);
a policy hung in its engine gets a fresh serving thread; a running canary is judged; the
state machine follows the decision. The e-stop's changes come here too
(:meth:`HealthService.estop_changed`), so one owner decides the state. The last tick's
findings and readings are what the status shows (:class:`~vlad.daemon.status.HealthReadout`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus

from vlad.health.base import Finding, HealthView, InFlight, Monitor, Sensor
from vlad.health.state import State, StateMachine
from vlad.protocol import HoldKind
from vlad.serving.counters import PolicyCounts, PolicyId

if TYPE_CHECKING:
    from vlad.config import Config
    from vlad.daemon.chain import PolicyChain
    from vlad.daemon.releases import ReleaseManager
    from vlad.daemon.status import HealthReadout
    from vlad.serving.loop import ServingLoop
    from vlad.serving.tracing import LatencyStats

log = logging.getLogger("vlad.daemon")


class HealthService:
    """The health task and the state it decides (module doc)."""

    def __init__(
        self,
        cfg: Config,
        *,
        chain: PolicyChain,
        loop: ServingLoop,
        stats: LatencyStats,
        releases: ReleaseManager,
        state: StateMachine,
        readout: HealthReadout,
        period_ns: int,
        deadline_ns: int,
    ) -> None:
        self.cfg = cfg
        self.chain = chain
        self.loop = loop
        self.stats = stats
        self.releases = releases
        self.state = state
        self.readout = readout
        self.period_ns = period_ns
        self.deadline_ns = deadline_ns
        self.state_before_estop = State.ACTIVE
        self._parts: tuple[list[Sensor], list[Monitor]] | None = None
        self._prev: dict[str, Any] = {}  # the previous tick's counters (windows)

    def parts(self) -> tuple[list[Sensor], list[Monitor]]:
        """The sensors and monitors, made once (monitors keep windows between ticks)."""
        if self._parts is None:
            from dataclasses import asdict

            from vlad.config import parse_monitor_tables
            from vlad.plugins import monitors, sensors

            monitor_list: list[Monitor] = monitors(asdict(self.cfg.monitors))
            # Parsed at load already (vlad serve); a config built in code is parsed here.
            tables = parse_monitor_tables(
                self.cfg.monitors.settings, {m.name: m.Settings for m in monitor_list}, self.cfg.monitors.enabled
            )
            for m in monitor_list:
                if m.Settings is not None:
                    m.settings = tables[m.name]
            if self.cfg.monitors.enabled:
                monitor_list = [m for m in monitor_list if m.name in self.cfg.monitors.enabled]
            self._parts = (sensors(), monitor_list)
        return self._parts

    async def first_decision(self) -> None:
        """One health check before serving starts: when something already faults (a remote
        release whose server does not answer, heat), the fallback serves from the first
        observation on and the state says why."""
        try:
            sensor_list, monitor_list = self.parts()
            view = self._view(self._prev)
            readings, findings = await anyio.to_thread.run_sync(_check, view, sensor_list, monitor_list)
            if any(f.severity == "fault" for f in findings):
                await self._decide(findings, readings)
        except Exception:  # a bug here must not stop the start: the health task decides from its first tick
            log.exception("first health check failed")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        sensor_list, monitor_list = self.parts()
        period = 1.0 / self.cfg.fallback.monitor_hz
        prev = self._prev
        task_status.started()
        while True:
            await anyio.sleep(period)
            await between_cycles(self.loop, self.period_ns)
            try:
                view = self._view(prev)
                # Sensors and monitors (file hashing, psutil, NVML) run off the event loop.
                readings, findings = await anyio.to_thread.run_sync(_check, view, sensor_list, monitor_list)
                await self._decide(findings, readings)
            except Exception:  # a bug here must not take the daemon down with it
                log.exception("health tick failed")

    def _view(self, prev: dict[str, Any]) -> HealthView:
        now = time.monotonic_ns()
        intake = self.loop.intake.counts.snapshot()
        publish = self.loop.publisher.counts.snapshot()
        policies: dict[PolicyId, PolicyCounts] = {p.id: p.served.counts.snapshot() for p in self.chain.policies}
        shadow = self.releases.shadow
        if shadow is not None:
            policies[shadow.policy.id] = shadow.policy.counts.snapshot()
        before = prev.get("policies", {})
        view = HealthView(
            now_ns=now,
            period_ns=self.period_ns,
            deadline_ns=self.deadline_ns,
            thresholds=self.cfg.monitors,
            intake=intake,
            intake_window=intake.minus(prev.get("intake")),
            publish=publish,
            publish_window=publish.minus(prev.get("publish")),
            policies=policies,
            policies_window={k: v.minus(before.get(k)) for k, v in policies.items()},
            serving=self.chain.serving.id if self.chain.serving else None,
            release=self.chain.release.id,
            # Only e2e: the monitors read nothing else, and percentiles of every stage at
            # the monitor rate held the GIL ~0.5 ms per tick against the serving thread.
            latency=self.stats.summary(("e2e",)),
            last_observation_ns=self.loop.intake.last_observation_ns,
            last_heartbeat_ns=self.loop.intake.last_heartbeat_ns,
            controllers=self.loop.intake.controllers.snapshot(),
            controllers_left_ns=self.loop.intake.controllers.left_ns,
            socket_read_ns=self.loop.read_ns,
            in_flight=_in_flight(self.loop),
            hang_timeout_ns=self.cfg.serve.hang_timeout_ns,
            readings=self.readout.readings,
            backend_stats={p.id: p.served.session.stats() for p in self.chain.policies},
            release_dir=self.chain.release.loaded.folder,
            artifacts=self.chain.release.loaded.artifacts,
        )
        prev.update(intake=intake, publish=publish, policies=policies)
        return view

    async def _decide(self, findings: list[Finding], readings: dict[str, float]) -> None:
        self.readout.findings, self.readout.readings = findings, readings
        decision = self.chain.follow_health(findings, time.monotonic_ns())
        self._unstick()
        await self.releases.check_canary(findings)
        active = self.chain.active
        if active != decision.target:  # a canary abort swapped back meanwhile
            decision = dataclasses.replace(
                decision,
                target=active,
                state=State.ACTIVE if active == 0 else State.FALLBACK,
                reason="canary aborted: previous release restored",
            )
        if self.loop.publisher.estop_engaged:  # the e-stop's gate, set before estop_changed is called
            self.state_before_estop = decision.state
        elif decision.state != self.state.state:
            self.state.transition(decision.state, decision.reason)

    def _unstick(self) -> None:
        """A policy hung in its engine holds the serving thread; once the health policy moved
        off it, serving continues on a fresh thread (the hung one can never send again)."""
        running = self.loop.in_flight
        if running is None or running.policy is self.loop.active:
            return
        if time.monotonic_ns() - running.since_ns > self.cfg.serve.hang_timeout_ns:
            self.loop.replace_thread()

    def estop_changed(self, engaged: bool, reason: str) -> None:
        """Called on the e-stop thread after the publisher's gate changed."""
        if engaged:
            current = self.state.state
            self.state_before_estop = current if current not in (State.ESTOPPED, State.STARTING) else State.ACTIVE
            self.state.transition(State.ESTOPPED, reason)
            self.loop.publisher.publish_hold(HoldKind.ESTOP)
        else:
            self.state.transition(self.state_before_estop, reason)
            self.loop.wake()  # serve the newest observation again at once


# The event loop's periodic work (a status build, a health tick) is ~1-2 ms of Python: it
# starts inside the serving thread's engine call only when that call has this long left.
ENGINE_WINDOW_NS = 2_500_000
LOOK_NS = 500_000  # how often to look while a cycle is under way


async def between_cycles(loop: ServingLoop, period_ns: int) -> None:
    """Wait, at most one control period, for a moment the serving thread does not need the GIL.

    The health tick and the status build are ~1-2 ms of Python each (more on cold caches).
    Run while the serving thread is between its engine call and its publish, they hold the
    GIL it needs, which showed as the overhead's tail (docs/benchmarks.md). Two moments are
    free: just after a chunk went out, when the next observation is still about half a
    period away (a controller at its rate: the serving thread is idle); and, when the
    observations come right after the chunks (lock-step) so that no such gap comes, the
    serving thread's engine call (the engine releases the GIL) while it has at least
    :data:`ENGINE_WINDOW_NS` left. With no controller there is nothing to avoid.
    """
    # Not at once after the chunk either: its bytes are still on their way out (the
    # ZeroMQ I/O thread) and the controller is being woken, on the same 2 cores.
    settle = min(2_000_000, period_ns // 8)
    deadline = time.monotonic_ns() + period_ns
    while True:
        now = time.monotonic_ns()
        if now >= deadline or now - loop.intake.last_seen_ns > 2 * period_ns:
            return
        wake = _next_look(loop, now, period_ns, settle)
        if wake is None:
            return
        await anyio.sleep(max(300_000, min(wake, deadline) - now) / 1e9)


def _next_look(loop: ServingLoop, now: int, period: int, settle: int) -> int | None:
    """None: now is a moment the serving thread does not need the GIL (:func:`between_cycles`);
    else when to look again."""
    last = loop.publisher.last_publish_ns
    since = now - last
    running = loop.in_flight
    if running is not None:
        # Its observation came right after the last chunk (lock-step, or cycles longer than
        # the period): no gap will come after this cycle, its engine call is the moment.
        lockstep = running.since_ns - last < period // 2
        left = loop.engine_left_ns(now)
        if lockstep:
            if loop.publisher.stats.last("engine") * 1e6 < ENGINE_WINDOW_NS:
                return None  # engine calls too short to start in: no better moment comes
            return None if left is not None and left >= ENGINE_WINDOW_NS else now + LOOK_NS
        return now + LOOK_NS if left is None else now + max(left, 0) + settle  # just after this cycle
    if settle <= since < period // 2:
        return None  # the next observation is still about half a period away
    if since < settle:
        return last + settle  # just after the last chunk
    if since < period:
        return last + period + settle  # just after the next one, about a period later
    return now + 1_000_000  # the next one is late: look again soon


def _in_flight(loop: ServingLoop) -> InFlight | None:
    running = loop.in_flight
    return InFlight(running.policy.id, running.since_ns) if running is not None else None


def _check(
    view: HealthView, sensor_list: list[Sensor], monitor_list: list[Monitor]
) -> tuple[dict[str, float], list[Finding]]:
    readings: dict[str, float] = {}
    now_s = time.monotonic()
    for s in sensor_list:
        try:
            readings.update(s.sample(now_s))
        except Exception:
            log.exception("sensor %s failed", s.name)
    view = dataclasses.replace(view, readings=readings)
    findings: list[Finding] = []
    for m in monitor_list:
        try:
            findings.extend(m.check(view))
        except Exception:
            log.exception("monitor %s failed", m.name)
    return readings, findings
