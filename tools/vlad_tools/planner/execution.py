"""Chunked execution on a robot with a fixed control period: what rate does it reach?

The controller ticks every ``period_ms``; waypoint k of a chunk belongs to the tick k
periods after its frame. A chunk is usable for ``H = min(chunk, ceil(validity / period))``
ticks after its frame. Inference takes ``latency_ms``; a chunk arrives ``a = ceil(latency /
period)`` ticks after its frame. Two ways to execute (``scripts/bench_async.py`` runs both):

* ``sync``: send a frame and hold still until its chunk arrives (waiting up to
  ``wait_fraction`` of a period inside the tick, else ``w = ceil((latency - wait_fraction
  * period) / period)`` ticks); execute ``min(execute, H - w)`` waypoints from the chunk's
  start (the robot did not move meanwhile, so they still apply; validity still ends
  them); repeat.
* ``wait`` (the episode runner's default rule, :mod:`vlad_tools.episodes`): ask for the next chunk
  once ``execute`` waypoints of the current one have run, wait up to ``wait_fraction`` of
  a period for it inside the tick; if it is not in, keep executing the current chunk and
  take the new one when it comes, its past dropped. A latency within the wait costs
  nothing (``a = 0``); otherwise it is ``async`` below with ``threshold = H - 1 - execute``.
* ``async`` (:class:`vlad.client.ChunkExecutor`, one request in flight): keep executing;
  send the next frame when the waypoints left after the current one fall to the
  threshold, i.e. ``c = max(a, H - 1 - threshold)`` ticks after the previous frame. The new
  chunk takes over at index ``a`` (the past is dropped); the old one runs out ``H`` ticks
  after its frame, so the robot idles ``max(0, c + a - H)`` ticks per cycle of ``c``.

Hence async execution hides a latency of up to half the chunk's horizon (``2a <= H``)
without idling: a chunk is ``a`` ticks old when it arrives and the next one needs
another ``a``. Beyond that it still beats sync (idle ``2a - H`` of every ``a`` ticks), and
a latency of ``H`` or more leaves nothing to execute. Streaming frames instead of
requesting them does not move the bound: a longer chunk or validity does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from vlad_tools.planner.spec import PlannerError


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
    """Ticks after its frame's tick from which a chunk ``latency_ms`` late is executed."""
    return max(1, math.ceil(latency_ms / period_ms - 1e-9))


def horizon_ticks(period_ms: float, chunk: int, validity_ms: float | None) -> int:
    """Ticks after its frame during which a chunk has a valid waypoint."""
    valid = chunk if validity_ms is None else math.ceil(validity_ms / period_ms - 1e-9)
    return max(0, min(chunk, valid))


def async_threshold(
    latency_ms: float, period_ms: float, chunk: int, execute: int, validity_ms: float | None = None
) -> int:
    """Request threshold that replans every ``execute`` waypoints when the latency allows
    it without idling, else as early as one request in flight permits."""
    a, h = ticks_to_arrive(latency_ms, period_ms), horizon_ticks(period_ms, chunk, validity_ms)
    cycle = min(max(execute, a), max(a, h - a))
    return max(0, min(chunk - 1, h - 1 - cycle))


def chunk_rate(
    latency_ms: float,
    period_ms: float,
    chunk: int,
    *,
    mode: str,
    execute: int = 4,
    threshold: int | None = None,
    validity_ms: float | None = None,
    wait_fraction: float = 0.8,
) -> ChunkRate:
    """Predicted control rate of ``sync``, ``wait`` or ``async`` chunk execution (see the module)."""
    if period_ms <= 0 or chunk < 1 or latency_ms < 0:
        raise PlannerError("chunk_rate needs period > 0, chunk >= 1 and latency >= 0")
    tick_hz = 1000.0 / period_ms
    h = horizon_ticks(period_ms, chunk, validity_ms)
    if mode == "sync":
        wait = max(0, math.ceil((latency_ms - wait_fraction * period_ms) / period_ms - 1e-9))
        executed = max(0, min(execute, h - wait))
        cycle = wait + max(executed, 1)
        return ChunkRate(mode, tick_hz * executed / cycle, tick_hz, cycle, cycle - executed, executed)
    if mode == "wait":
        a = 0 if latency_ms <= wait_fraction * period_ms else ticks_to_arrive(latency_ms, period_ms)
        if a >= h:
            return ChunkRate(mode, 0.0, tick_hz, a, a, 0)
        cycle = max(a, min(execute, h), 1)
        idle = min(cycle, max(0, cycle + a - h))
        return ChunkRate(mode, tick_hz * (cycle - idle) / cycle, tick_hz, cycle, idle, cycle - idle)
    if mode == "async":
        a = ticks_to_arrive(latency_ms, period_ms)
        if a >= h:  # every chunk is over before it arrives
            return ChunkRate(mode, 0.0, tick_hz, a, a, 0)
        thr = async_threshold(latency_ms, period_ms, chunk, execute, validity_ms) if threshold is None else threshold
        cycle = max(a, h - 1 - thr)
        idle = min(cycle, max(0, cycle + a - h))
        return ChunkRate(mode, tick_hz * (cycle - idle) / cycle, tick_hz, cycle, idle, cycle - idle)
    raise PlannerError(f"unknown execution mode {mode!r} (sync, wait or async)")
