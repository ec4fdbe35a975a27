"""Live state of one remote link: connected or lost, counters, rolling latency and errors.

Written by the inference thread (and the prober), read by ``Session.stats()`` from the
event loop: every access holds one lock for a few list operations; percentiles are
computed on read over at most ``window`` samples, so the hot path only appends.

**Hysteresis.** A system failure of a request (refused, lost, late) marks the link lost at
once. It is connected again after ``recover_after`` consecutive answers within the
deadline (the prober's, or real requests'); one failure starts the count again. A link
that is lost again within :data:`RELAPSE_S` of recovering needs twice as many the next
time (up to :data:`MAX_STREAK`), so a server late on every few requests does not flip
the robot between the remote policy and its local fallback every few hundred
milliseconds; a quiet :data:`RELAPSE_S` resets it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Literal

import numpy as np

from vlad.backend import LinkRecovery, RollingLatency, SessionStats

RELAPSE_S = 10.0
MAX_STREAK = 32


class LinkStats:
    """Thread-safe counters and rolling windows of one remote session."""

    def __init__(self, window: int, recover_after: int = 3) -> None:
        self._lock = threading.Lock()
        self.state = "connected"  # after a successful load; "lost" after a system failure
        self.since_ns = time.monotonic_ns()
        self.requests = 0
        self.ok = 0
        self.reconnects = 0
        self.recover_after = recover_after
        self.needed = recover_after  # in-deadline answers in a row before "connected" again
        self.streak = 0
        self.relapses = 0
        self.recovered_ns = 0
        self.errors: Counter[str] = Counter()
        self.last_error = ""
        self.last_ok_ns = 0
        self._outcomes: deque[bool] = deque(maxlen=window)  # True = failed
        self._rtt: deque[float] = deque(maxlen=window)
        self._network: deque[float] = deque(maxlen=window)
        self._server: deque[float] = deque(maxlen=window)

    def success(self, rtt_ms: float, network_ms: float | None, server_ms: float | None) -> bool:
        """Record an answered request; True when it ended a lost period (a reconnect)."""
        with self._lock:
            self.requests += 1
            self.ok += 1
            self.last_ok_ns = time.monotonic_ns()
            self._outcomes.append(False)
            self._rtt.append(rtt_ms)
            if network_ms is not None:
                self._network.append(network_ms)
            if server_ms is not None:
                self._server.append(server_ms)
            return self._answered_locked()

    def failure(self, kind: str, message: str, system: bool, sent: bool = True) -> None:
        """Record a failed (or refused, ``sent=False``) request; a system failure marks the link lost."""
        with self._lock:
            self.requests += 1
            self.errors[kind] += 1
            self.last_error = f"{kind}: {message}"
            self._outcomes.append(True)
            if system and sent:
                self._lose_locked()

    def lost_at_start(self, message: str) -> None:
        """The server did not answer when the session was made: lost from the start."""
        with self._lock:
            self.last_error = message
            self._lose_locked()

    def probe_failed(self, kind: str, message: str) -> None:
        """A background probe of a lost link failed (not a request: not counted as one)."""
        with self._lock:
            self.last_error = f"{kind}: {message}"
            self.streak = 0

    def recovered(self) -> bool:
        """A probe was answered within the deadline; True when that ended a lost period."""
        with self._lock:
            return self._answered_locked()

    def _lose_locked(self) -> None:
        self.streak = 0
        if self.state == "lost":
            return
        now = time.monotonic_ns()
        relapse = self.recovered_ns and now - self.recovered_ns < RELAPSE_S * 1e9
        self.relapses = self.relapses + 1 if relapse else 0
        self.needed = min(self.recover_after * 2**self.relapses, MAX_STREAK)
        self.state, self.since_ns = "lost", now

    def _answered_locked(self) -> bool:
        if self.state != "lost":
            return False
        self.streak += 1
        if self.streak < self.needed:
            return False
        self.state = "connected"
        self.since_ns = self.recovered_ns = time.monotonic_ns()
        self.reconnects += 1
        self.streak = 0
        return True

    @property
    def lost(self) -> bool:
        with self._lock:
            return self.state == "lost"

    def snapshot(self) -> SessionStats:
        """The link's figures for ``vladctl status`` and the remote-link monitor."""
        with self._lock:
            outcomes = list(self._outcomes)
            rtt, net, srv = list(self._rtt), list(self._network), list(self._server)
            now = time.monotonic_ns()
            state: Literal["connected", "lost"] = "lost" if self.state == "lost" else "connected"
            since_ns, requests, ok, errors = self.since_ns, self.requests, self.ok, dict(self.errors)
            reconnects, last_error, last_ok_ns = self.reconnects, self.last_error, self.last_ok_ns
            recovery = LinkRecovery(streak=self.streak, needed=self.needed, relapses=self.relapses)
        return SessionStats(
            kind="remote",
            state=state,
            state_for_s=round((now - since_ns) / 1e9, 3),
            requests=requests,
            ok=ok,
            errors=errors,
            reconnects=reconnects,
            recovery=recovery,
            last_error=last_error,
            last_ok_age_s=round((now - last_ok_ns) / 1e9, 3) if last_ok_ns else None,
            window=len(outcomes),
            error_rate=round(sum(outcomes) / len(outcomes), 4) if outcomes else 0.0,
            round_trip_ms=_percentiles(rtt),
            network_ms=_percentiles(net),
            server_ms=_percentiles(srv),
        )


def _percentiles(values: list[float]) -> RollingLatency | None:
    if not values:
        return None
    p50, p99 = np.percentile(np.asarray(values), [50, 99])
    return RollingLatency(p50=round(float(p50), 3), p99=round(float(p99), 3), count=len(values))
