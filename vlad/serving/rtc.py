"""Real-time chunking served by vlad: the next chunk continues the one the robot executes.

While a chunk executes, the next one is computed from a newer observation; it arrives
``d`` control periods after that observation was captured (the delay, from vlad's own
latency measurements: the 90th percentile of the sensor-to-publish times of the last 20
chunks, rounded up to whole periods, since a controller switches at the first period
boundary after the chunk came; overestimating it only freezes a waypoint the robot executes
anyway, underestimating it switches where the weights are still close to 1). Its first ``d`` waypoints are therefore already decided: they
are what the robot executes meanwhile. Real-time chunking (K. Black, M. Y. Galliker,
S. Levine, "Real-Time Execution of Action Chunking Flow Policies", 2025, arXiv 2506.07339)
conditions the new chunk on them: weight 1 on the waypoints that will have run, weights
decaying from 1 towards 0 over the rest of the executed chunk (the paper's exponential soft
mask), 0 beyond it, so the new chunk continues the old plan where they overlap instead of
jumping at the switch. The release's graph does the conditioning (contract ``[rtc]``;
``inpaint``: the gradient-free variant inside an exported graph).

What the robot executes comes from the guard (:meth:`vlad.serving.guard.ActionGuard.executing`):
the newest chunk addressed to the controller, or the one it reports (``exec``), or the
pose it holds. With a delay under one period (the chunk arrives in the slot its observation
was captured in) nothing is decided yet: the chunk is the plain one, exactly what the
policy computes in process.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from vlad.processing import Guide
from vlad.serving.guard import Executing

LATENCY_KEPT = 20  # recent chunks whose sensor-to-publish time sets the delay


def soft_mask(length: int, delay: int, overlap: int) -> np.ndarray:
    """The paper's weights over a chunk of ``length``: 1 for the first ``delay`` waypoints,
    ``c (e^c - 1) / (e - 1)`` with ``c = (overlap - i) / (overlap - delay + 1)`` up to
    ``overlap`` (where the executed chunk ends), 0 after."""
    w = np.zeros(length, np.float32)
    w[: min(delay, length)] = 1.0
    end = min(overlap, length)
    if end > delay:
        i = np.arange(delay, end, dtype=np.float64)
        c = (end - i) / (end - delay + 1)
        w[delay:end] = c * (np.exp(c) - 1.0) / (math.e - 1.0)
    return w


class RealTimeChunking:
    """The delay estimate and the guide of the next chunk (see module doc)."""

    def __init__(self, period_ns: int) -> None:
        self.period_ns = period_ns
        self._latency: deque[int] = deque(maxlen=LATENCY_KEPT)
        self.delay = 0  # periods, as the last guide used it

    def published(self, latency_ns: int) -> None:
        """A chunk left ``latency_ns`` after its observation's sensor time."""
        self._latency.append(latency_ns)

    def delay_periods(self) -> int:
        """The periods that start before a chunk can be executed: the recent 90th percentile
        of the latency, rounded up to whole periods (a controller switches at the first
        period boundary after the chunk came); 0 while it is under one period (the chunk
        arrives in the period its observation was captured in)."""
        if not self._latency or not self.period_ns:
            return 0
        recent = sorted(self._latency)
        latency = recent[int(0.9 * (len(recent) - 1))]
        return 0 if latency < self.period_ns else -(-latency // self.period_ns)

    def guide(self, executing: Executing, length: int) -> Guide | None:
        """What the next chunk continues, or None when it arrives within its first slot."""
        d = self.delay = self.delay_periods()
        if d < 1:
            return None
        weights = soft_mask(length, d, max(d, executing.covered))
        return Guide(executing.path[1:], weights)
