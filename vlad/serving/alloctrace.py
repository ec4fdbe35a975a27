"""Allocation tracing of the serving thread's cycles, for ``scripts/soak.py``; off by default.

Set ``VLAD_ALLOC_TRACE=/path/report.jsonl`` in the daemon's environment and the serving
loop wraps each cycle in :meth:`AllocTrace.measure`: ``tracemalloc`` runs (process-wide,
so the figures include whatever another thread allocates during the cycle: on a quiet
daemon that is rare), and per cycle it records the bytes still allocated after the cycle
(retained) and the peak above the start (transient). Every ``VLAD_ALLOC_TRACE_EVERY``
cycles (default 1500, 30 s at 50 Hz) the serving thread appends one JSON line with those
figures and, once a baseline snapshot was taken after ``VLAD_ALLOC_TRACE_WARMUP`` cycles
(default 500), the top growth since then among allocations made under the serving loop.

Never set on a robot: tracemalloc slows every allocation of the process and a snapshot
stalls the serving thread for tens of milliseconds.
"""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

ENV = "VLAD_ALLOC_TRACE"
_FILTER = (
    tracemalloc.Filter(True, "*/vlad/serving/loop.py", all_frames=True),
    tracemalloc.Filter(False, tracemalloc.__file__),
)


class AllocTrace:
    def __init__(self, path: str, every: int, warmup: int, frames: int = 16) -> None:
        self.path = path
        self.every = max(1, every)
        self.warmup = max(1, warmup)
        self.cycles = 0
        self._retained = np.zeros(self.every, np.int64)
        self._transient = np.zeros(self.every, np.int64)
        self._baseline: tracemalloc.Snapshot | None = None
        self._baseline_traced = 0
        self.frames = frames

    def measure(self, fn: Callable[..., Any], *args: Any) -> None:
        if not tracemalloc.is_tracing():  # from the first served cycle on: the loaded model is not traced
            tracemalloc.start(self.frames)
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        try:
            fn(*args)
        finally:
            after, peak = tracemalloc.get_traced_memory()
            i = self.cycles % self.every
            self._retained[i] = after - before
            self._transient[i] = peak - before
            self.cycles += 1
            if self.cycles == self.warmup:
                self._baseline = tracemalloc.take_snapshot().filter_traces(_FILTER)
                self._baseline_traced = after
            if self.cycles % self.every == 0:
                self._report(after)

    def _report(self, traced: int) -> None:
        r, t = self._retained, self._transient
        line: dict[str, Any] = {
            "t_monotonic_s": round(time.monotonic(), 3),
            "cycles": self.cycles,
            "traced_bytes": traced,
            "per_cycle": {
                "retained_mean": round(float(r.mean()), 1),
                "retained_max": int(r.max()),
                "retained_min": int(r.min()),
                "transient_p50": float(np.percentile(t, 50)),
                "transient_p99": float(np.percentile(t, 99)),
                "transient_max": int(t.max()),
            },
        }
        if self._baseline is not None:
            snap = tracemalloc.take_snapshot().filter_traces(_FILTER)
            stats = snap.compare_to(self._baseline, "lineno")
            line["traced_growth_since_baseline"] = traced - self._baseline_traced
            line["serving_growth_since_baseline"] = sum(s.size_diff for s in stats)
            line["top_growth"] = [
                {"where": str(s.traceback[0]), "size_diff": s.size_diff, "count_diff": s.count_diff}
                for s in stats[:8]
                if s.size_diff
            ]
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


def from_env() -> AllocTrace | None:
    """An :class:`AllocTrace` when ``VLAD_ALLOC_TRACE`` names a report file, else None."""
    path = os.environ.get(ENV)
    if not path:
        return None
    return AllocTrace(path, int(os.environ.get(f"{ENV}_EVERY", "1500")), int(os.environ.get(f"{ENV}_WARMUP", "500")))
