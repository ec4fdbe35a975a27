"""A shadow run: a candidate policy on the same observations as the serving one, never published.

The serving thread offers each observation it serves (:meth:`ShadowRun.offer`, latest
wins, never blocking); the shadow's own thread runs the same cycle on it
(:func:`vlad.serving.cycle.run_cycle`: stale check, preprocess, infer, decode), and
:class:`DivergenceMeter` pairs its chunk with the release's chunk for the same observation
(the publisher's observer hook) before either is guarded. :meth:`ShadowRun.status` is the
run as the status shows it (:class:`vlad.snapshot.ShadowStatus`); ``vladctl shadow report``
gets the same, as its wire map. Used by ``vladctl shadow`` and
by a canary, where the previous release runs as the shadow (the divergence reference,
and the warm policy an abort swaps back to).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

import numpy as np

from vlad.processing import Guide, RawObservation
from vlad.serving.cycle import CycleFailure, run_cycle
from vlad.serving.policy import ServedPolicy
from vlad.serving.tracing import CycleTimes, LatencyStats
from vlad.snapshot import Divergence, ShadowStatus, percentiles
from vlad.threads import Worker

log = logging.getLogger("vlad.shadow")


class DivergenceMeter:
    """Pairs two policies' action chunks by observation sequence and accumulates errors;
    :meth:`status` is what they add up to (:class:`vlad.snapshot.Divergence`)."""

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

    def status(self) -> Divergence:
        with self._lock:
            n = max(1, self.values * len(self.sum_abs))
            return Divergence(
                pairs=self.pairs,
                per_joint_max_abs=tuple(round(float(x), 6) for x in self.max_abs),
                per_joint_mean_abs=tuple(round(float(x), 6) for x in self.sum_abs / max(1, self.values)),
                max_abs=round(float(self.max_abs.max(initial=0.0)), 6),
                mean_abs=round(self.mean_abs, 6),
                tolerance=self.tolerance,
                fraction_beyond_tolerance=round(self.beyond / n, 6),
            )


class ShadowRun(Worker):
    """A candidate policy on its own thread (see module docstring)."""

    def __init__(self, policy: ServedPolicy, purpose: str, tolerance: float, window: int = 2000) -> None:
        super().__init__(f"vlad-shadow-{policy.id.release}")
        self.policy = policy
        self.purpose = purpose  # "shadow" or "canary-reference"
        self.divergence = DivergenceMeter(policy.contract.action.dim, tolerance)
        self.stats = LatencyStats(window)
        self.started_ns = time.monotonic_ns()
        self.outputs = 0
        self._cond = threading.Condition()
        self._item: tuple[RawObservation, int, Guide | None] | None = None
        self._times = CycleTimes()

    def offer(self, obs: RawObservation, receive_ns: int, guide: Guide | None = None) -> None:
        """Hand over an observation (the newest wins; never blocks the serving thread) and
        the real-time chunking guide the serving policy computes its chunk with: the shadow
        continues the same executing chunk, so the two chunks are comparable."""
        c = self.policy.contract
        if guide is not None and (c.rtc is None or guide.actions.shape != (c.action.chunk_length, c.action.dim)):
            guide = None  # a shadow without [rtc], or another chunk shape: its plain chunk
        with self._cond:
            self._item = (obs, receive_ns, guide)
            self._cond.notify()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def run(self) -> None:
        while True:
            with self._cond:
                while self._item is None and not self.stopping:
                    self._cond.wait()
                if self.stopping:
                    return
                assert self._item is not None  # the wait ends on an item or on stop
                (obs, receive_ns, guide), self._item = self._item, None
            try:
                self._cycle(obs, receive_ns, guide)
            except Exception:  # a bug, not bad input: keep the shadow going, but loudly
                self.policy.counts.cycle_errors += 1
                log.exception("shadow %s: cycle failed", self.policy.id)

    def _cycle(self, obs: RawObservation, receive_ns: int, guide: Guide | None) -> None:
        """The serving thread's cycle (:func:`vlad.serving.cycle.run_cycle`), never published."""
        p, t = self.policy, self._times
        t.reset(obs.sensor_time_ns, receive_ns)
        p.counts.cycles += 1
        try:
            actions = run_cycle(p, obs, t, guide=guide)
        except CycleFailure as failure:
            failure.count(p.counts)
            return  # an input fault is the serving policy's to answer (it sees the same observation)
        t.guard_end = t.publish = t.decode_end
        self.stats.record(t)
        if not np.isfinite(actions).all():
            p.counts.nonfinite_outputs += 1
        self.outputs += 1
        self.divergence.candidate(obs.sequence, actions)

    def status(self) -> ShadowStatus:
        """The run so far: divergence, latency and faults (the status's ``shadow``)."""
        return ShadowStatus(
            release=self.policy.id.release,
            purpose=self.purpose,
            running_s=round((time.monotonic_ns() - self.started_ns) / 1e9, 3),
            divergence=self.divergence.status(),
            latency_ms=percentiles(self.stats.summary()),
            faults={**self.policy.counts.to_dict(), "outputs": self.outputs},
        )
