"""Keeps a command going out every control period when no policy produces one.

Its own small thread, independent of the serving thread (which may be stuck in a hung
engine) and of the event loop (which may be busy): it wakes when a hold could first be due
(:meth:`HoldKeeper._next_due`; at least a quarter period apart, at most two) and looks at when
the last chunk left and publishes the hold posture when

* the e-stop is engaged and ``safety.estop_output = "hold"``: one hold per period;
* the hold posture is the policy serving (the end of the fallback chain) once any
  observation arrived: one per period, also while the controller is silent (the serving
  thread also answers each observation);
* a policy serves but no command went out for 1.5 periods while a streaming controller is
  there (its last two accepted observations at most two periods apart; observations or
  heartbeats within the last period): a late or hung inference, or missing observations.
  These *bridging* holds are advisory (a controller executing a valid chunk ignores them;
  they are not the guard's rate-limit reference), answer the newest observation only
  while it is unanswered, and last until the policy answers again or the monitors move
  down the chain. 1.5 periods, not 1: scheduling jitter must not interleave holds with a
  healthy policy's chunks.

  A controller that executes each chunk for several periods and asks again only when it
  runs out (openpi's action chunk broker, any ``action_horizon`` of 3 or more; declared by
  ``cadence = "request"`` in its heartbeats, or seen as observations more than two periods
  apart) is not bridged, although it (or the openpi bridge for it) heartbeats every period: it waits for
  nothing in between: a hold would go unused.
"""

from __future__ import annotations

import logging
import time

from vlad.protocol import HoldKind
from vlad.serving.loop import ServingLoop
from vlad.threads import Worker

log = logging.getLogger("vlad.cadence")


class HoldKeeper(Worker):
    def __init__(self, loop: ServingLoop, period_ns: int) -> None:
        super().__init__("vlad-cadence")
        self.loop = loop
        self.period_ns = period_ns
        self.bridged = 0

    def run(self) -> None:
        quarter = self.period_ns // 4
        wait_ns = quarter
        while not self.wait(wait_ns / 1e9):
            try:
                now = time.monotonic_ns()
                self.tick(now)
                wait_ns = min(max(self._next_due(now) - now, quarter), 2 * self.period_ns)
            except Exception:  # never let the cadence die silently
                log.exception("cadence tick failed")
                wait_ns = quarter

    def _next_due(self, now: int) -> int:
        """When the next hold could first be due (the thread sleeps until then, at least a
        quarter period): a period after the last chunk for e-stop and fallback holds, just
        past 1.5 periods for a bridge. While a policy answers every period that wake-up
        falls in the gap after the next chunk, not in the middle of its cycle, where taking
        the GIL would delay it. A controller that is not waiting (between the requests of a
        chunk-executing client) may ask at any moment: look again in half a period."""
        pub = self.loop.publisher
        if pub.estop_engaged or self.loop.active is None:
            return pub.last_publish_ns + self.period_ns
        due = pub.last_publish_ns + self.period_ns * 3 // 2 + 100_000
        if due <= now and not self._waiting(now):
            return now + self.period_ns // 2
        return due

    def _waiting(self, now: int) -> bool:
        """A streaming controller (its last two accepted observations at most two periods
        apart, and not every controller declared ``cadence = "request"``) is there: a
        message within the last period (the intake thread reads them as they come, also
        while an inference runs)."""
        intake, period = self.loop.intake, self.period_ns
        if intake.observation_interval_ns > 2 * period or intake.controllers.only_requests:
            return False
        return now - intake.last_seen_ns < period

    def tick(self, now: int) -> None:
        loop, pub, period = self.loop, self.loop.publisher, self.period_ns
        last = pub.last_publish_ns
        since = now - last
        intake = loop.intake
        if pub.estop_engaged:
            if pub.estop_output == "hold" and since >= period:
                pub.publish_hold(HoldKind.ESTOP)
        elif loop.active is None:
            if since >= period and intake.last_observation_ns:
                pub.publish_hold(HoldKind.FALLBACK)
        elif last and since > 1.5 * period and self._waiting(now):
            # About the newest observation if it is still unanswered (a late inference),
            # else about none (the camera stopped while heartbeats go on). Never after a
            # chunk that went out since this tick looked (the serving thread may just have
            # answered).
            obs = loop.last_obs
            about = obs if obs is not None and (obs.client or "", obs.sequence) != pub.answered else None
            if pub.publish_hold(
                HoldKind.BRIDGE,
                about.sequence if about else 0,
                about.sensor_time_ns if about else 0,
                advisory=True,
                unless_sent_after=last,
                client=(about.client or "") if about else None,
            ):
                self.bridged += 1
