"""End-to-end latency tracing: per-cycle timestamps and rolling percentiles per stage.

A cycle records monotonic nanosecond timestamps at each stage boundary; ``record`` turns
them into stage durations written into preallocated ring buffers (no allocation on the hot
path). Percentiles are computed only when status is built, off the hot path.

Stages (all milliseconds):

    queue        receive -> preprocess start (waiting for the worker)
    preprocess   preprocess start -> end
    h2d          host -> device copy (engines that expose it)
    engine       inference enqueue -> complete (engine time only)
    d2h          device -> host copy (engines that expose it)
    decode       action decoding
    guard        final action guard
    publish      guard end -> message sent
    e2e          sensor capture -> publish (what a controller experiences)
    transport    sensor capture -> receive (the controller's send + ZeroMQ)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STAGES = ("transport", "queue", "preprocess", "h2d", "engine", "d2h", "decode", "guard", "publish", "e2e")


@dataclass
class CycleTimes:
    """Monotonic ``time.monotonic_ns()`` stamps of one cycle (0 = not reached)."""

    sensor: int = 0
    receive: int = 0
    pre_start: int = 0
    pre_end: int = 0
    infer_start: int = 0
    infer_end: int = 0
    decode_end: int = 0
    guard_end: int = 0
    publish: int = 0
    h2d_ms: float | None = None
    d2h_ms: float | None = None

    def stages_ms(self) -> dict[str, float]:
        ms = 1e-6
        h2d = self.h2d_ms or 0.0
        d2h = self.d2h_ms or 0.0
        engine = (self.infer_end - self.infer_start) * ms - h2d - d2h
        out = {
            "transport": (self.receive - self.sensor) * ms,
            "queue": (self.pre_start - self.receive) * ms,
            "preprocess": (self.pre_end - self.pre_start) * ms,
            "engine": engine,
            "decode": (self.decode_end - self.infer_end) * ms,
            "guard": (self.guard_end - self.decode_end) * ms,
            "publish": (self.publish - self.guard_end) * ms,
            "e2e": (self.publish - self.sensor) * ms,
        }
        if self.h2d_ms is not None:
            out["h2d"] = self.h2d_ms
        if self.d2h_ms is not None:
            out["d2h"] = self.d2h_ms
        return out


class LatencyStats:
    """Rolling windows of stage durations with p50/p95/p99/max on demand."""

    def __init__(self, window: int = 2000) -> None:
        self.window = window
        self._buf = {s: np.zeros(window, dtype=np.float64) for s in STAGES}
        self._n = {s: 0 for s in STAGES}

    def add(self, stages: dict[str, float]) -> None:
        for stage, value in stages.items():
            n = self._n[stage]
            self._buf[stage][n % self.window] = value
            self._n[stage] = n + 1

    def record(self, times: CycleTimes) -> dict[str, float]:
        stages = times.stages_ms()
        self.add(stages)
        return stages

    def summary(self) -> dict[str, dict[str, float]]:
        """``{stage: {count, p50, p95, p99, max}}`` over the window, for stages with samples."""
        out = {}
        for stage in STAGES:
            n = self._n[stage]
            if n == 0:
                continue
            data = self._buf[stage][: min(n, self.window)]
            p50, p95, p99 = np.percentile(data, (50, 95, 99))
            out[stage] = {
                "count": n,
                "p50": round(float(p50), 4),
                "p95": round(float(p95), 4),
                "p99": round(float(p99), 4),
                "max": round(float(data.max()), 4),
            }
        return out
