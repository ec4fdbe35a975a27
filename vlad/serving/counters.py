"""Typed identities and counters shared by the hot path (writer) and the monitors (readers).

Each counter object has exactly one writing thread (the hot path, the e-stop thread, the
publisher under its lock); readers on the event loop take a :meth:`Counts.snapshot` and
subtract an earlier one (:meth:`Counts.minus`) for what happened in a monitor window. No
locks on the hot path: an ``int`` attribute write is atomic under the GIL, and a reader
that sees a value one increment old is fine for health decisions.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Self


@dataclass(frozen=True, slots=True)
class PolicyId:
    """One loaded policy: its place in the chain (``release``, ``fallback1``, ``shadow``)
    and the release it runs. Faults are attributed to a PolicyId, never to a position, so
    a chunk still in flight from a policy just swapped out is blamed on that policy."""

    slot: str
    release: str

    def __str__(self) -> str:
        return f"{self.slot}:{self.release}" if self.release else self.slot


HOLD = PolicyId("hold", "")  # the hold posture: the last resort of every chain, runs no model


@dataclass(slots=True)
class Counts:
    """Base of the counter groups: snapshot, difference and a JSON form."""

    def snapshot(self) -> Self:
        out = copy.copy(self)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Counter):
                setattr(out, f.name, Counter(value))
        return out

    def minus(self, earlier: Self | None) -> Self:
        """What was counted since ``earlier`` (a snapshot of the same object)."""
        out = self.snapshot()
        if earlier is None:
            return out
        for f in fields(self):
            now, then = getattr(self, f.name), getattr(earlier, f.name)
            if isinstance(now, Counter):
                setattr(out, f.name, Counter({k: v - then.get(k, 0) for k, v in now.items() if v != then.get(k, 0)}))
            else:
                setattr(out, f.name, now - then)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {f.name: dict(v) if isinstance(v := getattr(self, f.name), Counter) else v for f in fields(self)}


@dataclass(slots=True)
class IntakeCounts(Counts):
    """What arrived on the observation socket (written by the hot-path thread)."""

    messages: int = 0  # every message received, valid or not
    observations: int = 0  # observations that passed every check
    heartbeats: int = 0
    superseded: int = 0  # valid observations replaced by a newer one before inference
    input_rejected: int = 0  # observations refused for their content (the controller's fault)
    rejected: Counter[str] = field(default_factory=Counter)  # by reason (docs/protocol.md)
    reanchors: int = 0  # trusted joint state moved after a confirmed external move


@dataclass(slots=True)
class PolicyCounts(Counts):
    """One policy's cycles (written by the thread running it, and the publisher)."""

    cycles: int = 0  # observations this policy was asked to answer
    guided: int = 0  # of those, computed to continue the chunk the robot executes (real-time chunking)
    published: int = 0  # its chunks that left vlad
    stale: int = 0  # skipped: too old when inference would start
    backend_errors: int = 0  # the engine failed (a policy fault)
    remote_errors: int = 0  # a remote backend was unreachable or late (a system fault)
    cycle_errors: int = 0  # a bug in vlad's own cycle code (logged with a traceback)
    nonfinite_outputs: int = 0  # guard: NaN/Inf chunk replaced by the hold posture
    bounds: int = 0  # guard: clamped into the joint bounds
    out_of_bounds: int = 0  # guard: beyond a bound by more than one period's rate limit
    seam: int = 0  # guard: its start clamped to continue what the robot executes
    rate: int = 0  # guard: rate-limited between its own waypoints
    expired: int = 0  # guard: past valid_until before it could be sent
    unconfirmed: int = 0  # about an announced re-anchor the next observation contradicted (not sent)
    deadline_misses: int = 0
    estop_blocked: int = 0  # chunks not sent because the e-stop was engaged


@dataclass(slots=True)
class PublishCounts(Counts):
    """Everything that left on the action socket (written under the publisher's lock)."""

    chunks: int = 0  # policy chunks and holds
    policy_chunks: int = 0
    holds: Counter[str] = field(default_factory=Counter)  # by reason: fallback, bridge, estop, ...
    interventions: int = 0  # chunks the guard changed
    deadline_misses: int = 0
