"""The first stages of the hot path run on scratch copies just before the next observation is due.

A controller streams observations at its own rate, and between two of them the serving
threads sleep. That sleep costs the hot path its CPU caches: on the 2-vCPU VM at 50 Hz the
intake and preprocessing of one observation took 3-5x longer than the same calls back to
back, and a run of the same code 0.5-1 ms earlier, even on other objects, recovered most
of it (docs/benchmarks.md, "A rehearsal before each observation").

So once a controller's observations come at a steady interval (and no other controller's
came for :data:`OTHER_CONTROLLER_NS`), the reader runs, to end
about ``realtime.rehearse_lead_us`` before the next one is due, the code that will meet it: the
last accepted observation's frames through a scratch :class:`~vlad.serving.intake.Intake`
(decoding, the contract and trusted-state checks), a scratch
:class:`~vlad.processing.Preprocessor` for the policy serving (unless one fill of it took
over :data:`PREPROCESS_LIMIT_NS` each of its first :data:`SLOW_FILLS` times: large images
are moving bytes, not waiting for cold caches), and a scratch
:class:`~vlad.serving.guard.ActionGuard`'s seam reference (:meth:`ActionGuard.executing`,
which the serving thread builds before the engine call). The stages after the engine are
not rehearsed: the engine call evicts the caches again.

A rehearsal touches only its own objects: no counter, trusted state, guard history, buffer,
noise draw or socket of the serving path, so what vlad serves is the same with or without
it (tests/serving/test_rehearsal.py). It runs only while no cycle runs and not within
:data:`WARM_AFTER_PUBLISH_NS` of a chunk (the caches are still warm), and it stops between
its steps as soon as a message or a wake-up waits for the reader. A failure in it is
counted and logged, never raised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from vlad.config import GuardConfig
from vlad.processing import Preprocessor
from vlad.serving.counters import IntakeCounts
from vlad.serving.guard import ActionGuard, TrustedState
from vlad.serving.intake import Intake
from vlad.serving.policy import ServedPolicy
from vlad.serving.publisher import Publisher

log = logging.getLogger("vlad.serving")

# A cycle leaves the caches warm: no rehearsal within this long after a chunk went out.
WARM_AFTER_PUBLISH_NS = 2_000_000
# Observations closer together than this come back to back: nothing cools down between them.
MIN_INTERVAL_NS = 4_000_000
# This close to the next observation a rehearsal would delay it rather than prepare it.
TOO_LATE_NS = 200_000
# Steady: an interval within a tenth of the one before (a controller at its rate).
STEADY_FRACTION = 10
# Another controller's observation: none for this long. Two controllers' observations come
# at times the rehearsal cannot foresee, and one arriving while it runs waits for it.
OTHER_CONTROLLER_NS = 2_000_000_000
# Preprocessing that takes longer than this when rehearsed is moving bytes (large images),
# not waiting for cold caches: rehearsing it would only double that work.
PREPROCESS_LIMIT_NS = 300_000
SLOW_FILLS = 5  # ... in each of its first fills (one fast fill: it is the caches)


class Rehearsal:
    """Runs the first stages of the hot path on scratch objects ahead of the next observation
    (module doc). Called by the thread that reads the observation socket."""

    def __init__(self, intake: Intake, publisher: Publisher, lead_ns: int, guard_cfg: GuardConfig) -> None:
        contract = intake.contract
        self.lead_ns = lead_ns
        self.publisher = publisher
        self._trusted = TrustedState(contract, guard_cfg)
        self._intake = Intake(contract, IntakeCounts(), self._trusted, intake.max_skew_ns, intake.tokenizer)
        self._guard = ActionGuard(contract, self._trusted, guard_cfg)
        # A chunk "sent" about each rehearsed observation: the next seam reference follows a
        # chunk, as the serving path's does.
        self._chunk = self._guard.hold_posture()
        self._validity_ns = publisher.validity_ns
        self._pre: Preprocessor | None = None  # None: not rehearsed (see PREPROCESS_LIMIT_NS)
        self._pre_for: ServedPolicy | None = None
        self._slow_fills = 0  # fills over the limit so far (SLOW_FILLS: judged)
        self._frames: Sequence[Any] | None = None  # the last accepted observation's frames
        self._last_rx = 0  # when it was received
        self._last_interval = 0
        self._client: str | None = None  # the controller of the last accepted observation
        self._alone_from = 0  # it has been the only one since (OTHER_CONTROLLER_NS)
        self._interval = 0  # the controller's interval while it is steady, else 0
        self._done_for = 0  # receive time of the observation after which it last rehearsed
        # How long a rehearsal takes here (a maximum that decays): it starts that much earlier,
        # so that it ends ``lead_ns`` before the observation (a larger payload takes longer).
        self._takes_ns = 0
        self.runs = 0
        self.interrupted = 0  # stopped early: a message or a wake-up came
        self.errors = 0

    def accepted(self, frames: Sequence[Any], receive_ns: int, client: str) -> None:
        """The reader accepted an observation (its frames, its receive time, its controller)."""
        if client != self._client:
            if self._client is not None:
                self._alone_from = receive_ns + OTHER_CONTROLLER_NS
            self._client = client
        interval, previous = receive_ns - self._last_rx, self._last_interval
        self._last_interval = interval
        steady = previous > 0 and abs(interval - previous) * STEADY_FRACTION <= previous
        self._interval = (interval + previous) // 2 if steady else 0
        self._last_rx = receive_ns
        self._frames = frames

    def due_ns(self) -> int | None:
        """When to rehearse for the next observation; None: no rehearsal is due."""
        if (
            self._frames is None
            or self._interval < MIN_INTERVAL_NS
            or self._done_for == self._last_rx
            or self._last_rx < self._alone_from
        ):
            return None
        return self._last_rx + self._interval - self.lead_ns - self._takes_ns

    def poll_ms(self, now_ns: int, timeout_ms: int) -> int:
        """The reader's poll timeout (whole milliseconds): waking at the rehearsal's time."""
        due = self.due_ns()
        if due is None or due - now_ns >= timeout_ms * 1_000_000:
            return timeout_ms
        return max(0, (due - now_ns + 500_000) // 1_000_000)

    def maybe_run(self, now_ns: int, policy: ServedPolicy | None, pending: Callable[[], bool]) -> None:
        """Rehearse when it is due. ``policy``: the one serving, None while a cycle runs or
        the hold posture serves (nothing to rehearse); ``pending``: True when a message or a
        wake-up waits for the reader."""
        due = self.due_ns()
        if due is None or now_ns < due - 500_000:  # the poll wakes to the nearest millisecond
            return
        self._done_for = self._last_rx  # once per interval, run or not
        if (
            policy is None
            or now_ns > self._last_rx + self._interval - TOO_LATE_NS
            or now_ns - self.publisher.last_publish_ns < WARM_AFTER_PUBLISH_NS
        ):
            return
        try:
            if self._pre_for is not policy:  # a swap: this interval builds its scratch buffers
                self._pre, self._pre_for, self._slow_fills = Preprocessor(policy.contract, policy.tokenizer), policy, 0
                return
            start = time.monotonic_ns()
            done = self._run(now_ns, pending)
            took = time.monotonic_ns() - start
            self._takes_ns = min(max(took, self._takes_ns * 7 // 8), self._interval // 4)
            if done:
                self.runs += 1
            else:
                self.interrupted += 1
        except Exception:  # a bug here must never reach serving: counted, logged, rate-limited
            self.errors += 1
            if self.errors <= 10 or self.errors % 1000 == 0:
                log.exception("rehearsal failed (%d so far); serving is not affected", self.errors)

    def _run(self, now_ns: int, pending: Callable[[], bool]) -> bool:
        """One rehearsal; False: stopped early because something waits for the reader."""
        assert self._frames is not None
        obs = self._intake.accept(self._frames, now_ns)
        if obs is None:
            return True  # refused by the scratch checks: the code ran all the same
        if pending():
            return False
        if self._pre is not None:
            start = time.monotonic_ns()
            self._pre.fill(obs)
            if self._slow_fills < SLOW_FILLS:  # still judging this policy's preprocessing
                fast = time.monotonic_ns() - start <= PREPROCESS_LIMIT_NS
                self._slow_fills = SLOW_FILLS if fast else self._slow_fills + 1
                if self._slow_fills == SLOW_FILLS and not fast:
                    self._pre = None  # every fill was slow: not rehearsed again
            if pending():
                return False
        t_sensor = obs.sensor_time_ns
        client = obs.client or ""
        self._guard.executing(client, t_sensor, obs.executing)
        self._guard.record(self._chunk, t_sensor, t_sensor + self._validity_ns, now_ns, client)
        return True
