"""End-to-end latency tracing: per-cycle timestamps and rolling percentiles per stage.

One vocabulary everywhere: the chunk header's ``timings_ms``, ``vladctl status`` and the
metrics use these stage names (all milliseconds):

    transport    sensor capture -> received by vlad (the controller's send + ZeroMQ)
    queue        received -> preprocessing starts (draining, waiting for the thread)
    preprocess   raw observation -> model inputs
    h2d          host -> device copy (engines that expose it)
    engine       inference, without h2d/d2h (a remote backend: the whole round trip)
    d2h          device -> host copy (engines that expose it)
    network      a remote backend's round trip minus the server's own time
    server       a remote backend's server compute time (where the server reports it)
    decode       model outputs -> action chunk in contract units
    guard        the final action guard
    publish      guard end -> message sent
    e2e          sensor capture -> message sent (what a controller experiences)

The header carries every stage up to ``guard`` (``publish`` and ``e2e`` are only known
after sending; ``t_issue_ns - t_sensor_ns`` is the end-to-end time up to the issue).
Recording writes into preallocated ring buffers (no allocation on the hot path);
percentiles are computed only when status is built, off the hot path.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

STAGES = (
    "transport",
    "queue",
    "preprocess",
    "h2d",
    "engine",
    "d2h",
    "network",
    "server",
    "decode",
    "guard",
    "publish",
    "e2e",
)


@dataclass(slots=True)
class CycleTimes:
    """Monotonic ``time.monotonic_ns()`` stamps of one cycle (0 = not reached), reused."""

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
    network_ms: float | None = None
    server_ms: float | None = None

    def reset(self, sensor: int, receive: int) -> None:
        self.sensor, self.receive = sensor, receive
        self.pre_start = self.pre_end = self.infer_start = self.infer_end = 0
        self.decode_end = self.guard_end = self.publish = 0
        self.h2d_ms = self.d2h_ms = self.network_ms = self.server_ms = None

    def header_ms(self, out: dict[str, float]) -> dict[str, float]:
        """The header's ``timings_ms`` (stages up to the guard), written into ``out``."""
        ms = 1e-6
        out.clear()
        out["transport"] = round((self.receive - self.sensor) * ms, 4)
        out["queue"] = round((self.pre_start - self.receive) * ms, 4)
        out["preprocess"] = round((self.pre_end - self.pre_start) * ms, 4)
        out["engine"] = round(self.engine_ms(), 4)
        for name, value in (
            ("h2d", self.h2d_ms),
            ("d2h", self.d2h_ms),
            ("network", self.network_ms),
            ("server", self.server_ms),
        ):
            if value is not None:
                out[name] = round(value, 4)
        out["decode"] = round((self.decode_end - self.infer_end) * ms, 4)
        out["guard"] = round((self.guard_end - self.decode_end) * ms, 4)
        return out

    def engine_ms(self) -> float:
        return (self.infer_end - self.infer_start) * 1e-6 - (self.h2d_ms or 0.0) - (self.d2h_ms or 0.0)


class LatencyStats:
    """Rolling windows of stage durations with p50/p95/p99/max on demand."""

    def __init__(self, window: int = 2000) -> None:
        self.window = window
        # array.array, not numpy: the serving thread writes a dozen scalars per cycle, and a
        # numpy item assignment costs several times more (readers view them with numpy).
        self._buf = {s: array("d", bytes(8 * window)) for s in STAGES}
        self._n = dict.fromkeys(STAGES, 0)

    def add(self, stage: str, value_ms: float) -> None:
        n = self._n[stage]
        self._buf[stage][n % self.window] = value_ms
        self._n[stage] = n + 1

    def record(self, t: CycleTimes) -> float:
        """Record every stage of a published cycle; returns e2e in ms."""
        ms = 1e-6
        add = self.add
        add("transport", (t.receive - t.sensor) * ms)
        add("queue", (t.pre_start - t.receive) * ms)
        add("preprocess", (t.pre_end - t.pre_start) * ms)
        add("engine", t.engine_ms())
        if t.h2d_ms is not None:
            add("h2d", t.h2d_ms)
        if t.d2h_ms is not None:
            add("d2h", t.d2h_ms)
        if t.network_ms is not None:
            add("network", t.network_ms)
        if t.server_ms is not None:
            add("server", t.server_ms)
        add("decode", (t.decode_end - t.infer_end) * ms)
        add("guard", (t.guard_end - t.decode_end) * ms)
        add("publish", (t.publish - t.guard_end) * ms)
        e2e = (t.publish - t.sensor) * ms
        add("e2e", e2e)
        return e2e

    def since(self, stage: str, seen: int) -> tuple[np.ndarray, int, int]:
        """Samples recorded after the first ``seen`` of ``stage`` (for cumulative histograms,
        read off the hot path): (those still in the window, the total count now, how many
        were overwritten before they could be read)."""
        n = self._n[stage]
        new = max(0, n - seen)
        take = min(new, self.window)
        idx = np.arange(n - take, n) % self.window
        return np.frombuffer(self._buf[stage])[idx], n, new - take

    def last(self, stage: str) -> float:
        """The newest sample of ``stage`` in ms (0.0 before the first)."""
        n = self._n[stage]
        return self._buf[stage][(n - 1) % self.window] if n else 0.0

    def summary(self, stages: tuple[str, ...] = STAGES) -> dict[str, dict[str, float]]:
        """``{stage: {count, p50, p95, p99, max}}`` over the window, for ``stages`` with samples."""
        out = {}
        for stage in stages:
            n = self._n[stage]
            if n == 0:
                continue
            data = np.frombuffer(self._buf[stage])[: min(n, self.window)].copy()  # the hot path keeps writing
            p50, p95, p99 = np.percentile(data, (50, 95, 99))
            out[stage] = {
                "count": n,
                "p50": round(float(p50), 4),
                "p95": round(float(p95), 4),
                "p99": round(float(p99), 4),
                "max": round(float(data.max()), 4),
            }
        return out
