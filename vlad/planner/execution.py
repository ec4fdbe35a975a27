"""Chunked execution on a robot with a fixed control period: what rate does it reach?

The controller ticks every ``period_ms``. Inference takes ``latency_ms`` from the frame
to the chunk. Two ways to execute chunks (``scripts/bench_async.py`` runs both):

* ``sync``: at the start of a cycle the robot sends a frame and waits (holding still)
  until the chunk arrives: within the tick it waits up to ``wait_fraction`` of a period,
  otherwise it holds ``w = ceil((latency - wait_fraction * period) / period)`` ticks.
  It then executes the chunk from its first waypoint for ``execute`` ticks, never past
  the chunk's validity, and starts the next cycle.
* ``async`` (:class:`vlad.client.ChunkExecutor`): the robot keeps executing; when the
  waypoints left after the current one fall to ``threshold`` it sends the next frame.
  The new chunk is adopted ``a = ceil(latency / period)`` ticks later at its index
  ``a`` (the waypoints already in the past are dropped). The old chunk covers
  ``threshold`` more ticks, so the robot idles ``max(0, a - threshold - 1)`` ticks.

The control rate is the share of ticks that execute a policy waypoint, times the tick
rate. A threshold of at least ``a - 1`` never idles: :func:`async_threshold` picks the
smallest that also keeps the replanning cadence of ``execute`` waypoints.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from vlad.planner.spec import PlannerError


@dataclass(frozen=True)
class ChunkRate:
    """Predicted steady state of chunked execution."""

    mode: str
    control_hz: float  # policy waypoints executed per second
    tick_hz: float  # the control rate the robot asks for
    cycle_ticks: int  # ticks from one frame sent to the next
    idle_ticks: int  # ticks per cycle without a policy waypoint
    executed: int  # waypoints executed per cycle

    def to_dict(self) -> dict:
        """JSON-able summary."""
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def ticks_to_arrive(latency_ms: float, period_ms: float) -> int:
    """Ticks after the frame's tick at which a chunk ``latency_ms`` late is adopted."""
    return max(1, math.ceil(latency_ms / period_ms - 1e-9))


def async_threshold(latency_ms: float, period_ms: float, chunk: int, execute: int) -> int:
    """Smallest request threshold that never idles and replans every ``execute`` waypoints
    (or as often as the latency allows)."""
    return min(chunk - 1, max(chunk - 1 - execute, ticks_to_arrive(latency_ms, period_ms) - 1))


def chunk_rate(latency_ms: float, period_ms: float, chunk: int, *, mode: str, execute: int = 4,
               threshold: int | None = None, validity_ms: float | None = None,
               wait_fraction: float = 0.8) -> ChunkRate:
    """Predicted control rate of ``sync`` or ``async`` chunk execution (see the module)."""
    if period_ms <= 0 or chunk < 1 or latency_ms < 0:
        raise PlannerError("chunk_rate needs period > 0, chunk >= 1 and latency >= 0")
    tick_hz = 1000.0 / period_ms
    validity_ticks = math.floor((validity_ms if validity_ms is not None else chunk * period_ms) / period_ms)
    if mode == "sync":
        wait = max(0, math.ceil((latency_ms - wait_fraction * period_ms) / period_ms - 1e-9))
        executed = max(0, min(execute, chunk, validity_ticks - wait + 1))
        cycle = wait + max(executed, 1)
        return ChunkRate(mode, tick_hz * executed / cycle, tick_hz, cycle, cycle - executed, executed)
    if mode == "async":
        a = ticks_to_arrive(latency_ms, period_ms)
        thr = async_threshold(latency_ms, period_ms, chunk, execute) if threshold is None else threshold
        if a > min(chunk - 1, validity_ticks):  # every chunk is over before it arrives
            return ChunkRate(mode, 0.0, tick_hz, a, a, 0)
        cycle = max(a, chunk - 1 - thr)
        idle = min(cycle, max(0, a - thr - 1))
        return ChunkRate(mode, tick_hz * (cycle - idle) / cycle, tick_hz, cycle, idle, cycle - idle)
    raise PlannerError(f"unknown execution mode {mode!r} (sync or async)")
