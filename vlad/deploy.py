"""Live release changes on a running daemon: deploy, rollback, shadow runs and canaries.

* **deploy**: verify -> stage into the store -> load and warm beside the serving release
  -> hot-swap (a pointer change: the action stream never stops) -> activate in the store.
* **rollback**: the store's one-step rollback, then the same load-warm-swap.
* **shadow**: a candidate runs on the same observations as the serving policy, on its own
  thread; its actions are never published, only compared (:class:`Divergence`).
* **canary**: a deploy whose first ``window_s`` is watched against the manifest's
  auto-abort thresholds (deadline miss rate, NaN/bound interventions, divergence from the
  previous release, which runs as a shadow meanwhile, heartbeat faults). Crossing one
  swaps back to the previous release (still loaded and warm) and rolls the store back,
  recording why.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vlad.processing import RawObservation
from vlad.tracing import CycleTimes, LatencyStats


class Divergence:
    """Pairs two policies' action chunks by observation sequence and accumulates errors."""

    def __init__(self, dim: int, tolerance: float, keep: int = 256) -> None:
        self.tolerance = tolerance
        self._ref: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cand: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.keep = keep
        self.pairs = 0
        self.max_abs = np.zeros(dim)
        self.sum_abs = np.zeros(dim)
        self.values = 0
        self.beyond = 0

    def _add(self, table: OrderedDict, other: OrderedDict, seq: int, actions: np.ndarray, ref_first: bool) -> None:
        with self._lock:
            match = other.pop(seq, None)
            if match is None:
                table[seq] = actions.copy()
                while len(table) > self.keep:
                    table.popitem(last=False)
                return
        ref, cand = (actions, match) if ref_first else (match, actions)
        err = np.abs(cand.astype(np.float64) - ref)
        self.pairs += 1
        self.max_abs = np.maximum(self.max_abs, err.max(axis=0))
        self.sum_abs += err.sum(axis=0)
        self.values += err.shape[0]
        self.beyond += int((err > self.tolerance).sum())

    def reference(self, seq: int, actions: np.ndarray) -> None:
        self._add(self._ref, self._cand, seq, actions, True)

    def candidate(self, seq: int, actions: np.ndarray) -> None:
        self._add(self._cand, self._ref, seq, actions, False)

    @property
    def mean_abs(self) -> float:
        return float(self.sum_abs.sum() / max(1, self.values * len(self.sum_abs)))

    def report(self) -> dict[str, Any]:
        n = max(1, self.values * len(self.sum_abs))
        return {
            "pairs": self.pairs,
            "per_joint_max_abs": [round(float(x), 6) for x in self.max_abs],
            "per_joint_mean_abs": [round(float(x), 6) for x in self.sum_abs / max(1, self.values)],
            "max_abs": round(float(self.max_abs.max(initial=0.0)), 6),
            "mean_abs": round(self.mean_abs, 6),
            "tolerance": self.tolerance,
            "fraction_beyond_tolerance": round(self.beyond / n, 6),
        }


class ShadowSink:
    """Stands where a shadow worker's Publisher would: records, compares, never sends."""

    def __init__(self, divergence: Divergence, window: int = 2000) -> None:
        self.divergence = divergence
        self.stats = LatencyStats(window)
        self.counters: Counter[str] = Counter()

    def publish(self, actions: np.ndarray, obs: RawObservation, t: CycleTimes, source: str, policy: str = "") -> bool:
        t.guard_end = t.publish = time.monotonic_ns()
        self.stats.record(t)
        if not np.isfinite(actions).all():
            self.counters["nonfinite_outputs"] += 1
        self.counters["outputs"] += 1
        self.divergence.candidate(obs.sequence, actions)
        return True

    def publish_hold(self, proprio, obs_seq: int, t_sensor_ns: int, reason: str) -> None:
        self.counters[f"hold_{reason}"] += 1


class NullSink:
    """Where a retired worker's last in-flight chunk goes: nowhere (it must not count)."""

    def publish(self, actions, obs, t, source, policy="") -> bool:
        return False

    def publish_hold(self, proprio, obs_seq, t_sensor_ns, reason) -> None:
        pass


@dataclass
class Shadow:
    """A candidate policy running beside the serving one (see module docstring)."""

    release_id: str
    worker: Any  # PolicyWorker with a ShadowSink
    sink: ShadowSink
    policy: Any  # LoadedPolicy
    purpose: str  # "shadow" or "canary-reference"
    started_ns: int = field(default_factory=time.monotonic_ns)

    def report(self) -> dict[str, Any]:
        w = self.worker
        counters = dict(self.sink.counters)
        for k, v in w.counters.items():
            counters[k] = counters.get(k, 0) + v
        return {
            "release": self.release_id,
            "purpose": self.purpose,
            "running_s": round((time.monotonic_ns() - self.started_ns) / 1e9, 3),
            "divergence": self.sink.divergence.report(),
            "latency_ms": self.sink.stats.summary(),
            "faults": counters,
        }


@dataclass(frozen=True)
class CanaryThresholds:
    window_s: float
    max_deadline_miss_rate: float
    max_interventions: int
    max_divergence: float
    max_heartbeat_faults: int


@dataclass
class Canary:
    """The watch over a freshly deployed release; :meth:`check` says why to abort, if so."""

    release_id: str
    previous_id: str
    thresholds: CanaryThresholds
    start_counters: dict[str, int]
    started_ns: int = field(default_factory=time.monotonic_ns)
    heartbeat_faults: int = 0

    def elapsed_s(self, now_ns: int) -> float:
        return (now_ns - self.started_ns) / 1e9

    def check(self, counters: dict[str, Any], divergence: Divergence | None) -> str | None:
        t = self.thresholds

        def delta(key: str) -> int:
            return int(counters.get(key, 0)) - int(self.start_counters.get(key, 0))

        published = delta("published_release")  # the canary is the release being served
        misses = delta("deadline_misses")
        if published >= 20 and misses / published > t.max_deadline_miss_rate:
            return f"deadline miss rate {misses / published:.3f} > {t.max_deadline_miss_rate}"
        policy = f"release:{self.release_id}"
        interventions = delta(f"nonfinite:{policy}") + delta(f"bounds:{policy}")
        if interventions > t.max_interventions:
            return f"{interventions} NaN/bound interventions > {t.max_interventions}"
        if divergence is not None and divergence.pairs >= 10 and divergence.mean_abs > t.max_divergence:
            return f"mean divergence from {self.previous_id} {divergence.mean_abs:.4f} > {t.max_divergence}"
        if self.heartbeat_faults > t.max_heartbeat_faults:
            return f"{self.heartbeat_faults} heartbeat faults > {t.max_heartbeat_faults}"
        return None

    def report(self, now_ns: int) -> dict[str, Any]:
        return {"release": self.release_id, "previous": self.previous_id, "elapsed_s": round(self.elapsed_s(now_ns), 3),
                "window_s": self.thresholds.window_s, "heartbeat_faults": self.heartbeat_faults}
