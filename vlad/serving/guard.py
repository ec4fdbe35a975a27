"""The final guard on every action chunk leaving vlad.

Checks, in order, against the release contract:

1. every value finite; otherwise the whole chunk is replaced by the hold posture
   (``on_nonfinite = "hold"``) — a partially NaN chunk is not trustworthy anywhere;
2. within each joint's ``[lower, upper]``; ``on_bound_violation`` says clamp or hold
   (``bounds``); a value beyond a bound by more than the joint's rate limit is also counted
   as ``out_of_bounds``, which the health monitors treat as a broken policy;
3. within each joint's ``rate_limit`` per control period: between consecutive waypoints,
   and from the last published command to the first waypoint (scaled by the control
   periods elapsed since that command; re-anchored on the measured joint positions when
   the robot is farther from that command than the limit allows); violations are clamped
   step by step;
4. still valid: a chunk whose ``valid_until`` has passed is not published at all.

Every correction is an *intervention*, counted by kind. The guard is a process function:
it keeps commands sane, it is not a safety function (that is the PLC and the e-stop).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlad.contract import Contract

INTERVENTIONS = ("nonfinite", "bounds", "out_of_bounds", "rate", "expired")


@dataclass(frozen=True)
class GuardResult:
    actions: np.ndarray | None  # None: do not publish (expired)
    interventions: tuple[str, ...]
    replaced: bool  # the chunk was replaced by the hold posture


class ActionGuard:
    """Stateful guard: remembers the last published command for rate limiting."""

    def __init__(self, contract: Contract) -> None:
        spec = contract.action
        self.contract = contract
        self.lower = np.asarray([j.lower for j in spec.joints], dtype=np.float32)
        self.upper = np.asarray([j.upper for j in spec.joints], dtype=np.float32)
        self.rate = np.asarray([j.rate_limit for j in spec.joints], dtype=np.float32)
        self.period_ns = int(contract.timing.control_period_ms * 1e6)
        self.semantics = tuple(j.semantics for j in spec.joints)
        # Where the hold posture reads the current joint positions from the proprio vector.
        names = contract.proprio.names if contract.proprio else ()
        self._hold_index = [names.index(f"{j.name}.position") if f"{j.name}.position" in names else -1 for j in spec.joints]
        self.last_command: np.ndarray | None = None
        self.last_command_ns = 0
        self.counts = {k: 0 for k in INTERVENTIONS}

    def hold_posture(self, proprio: np.ndarray | None) -> np.ndarray:
        """The approved stationary command as a full chunk.

        ``hold_position``: every waypoint at the current joint position (from proprio, else
        the last published command); ``zero_velocity``: zeros (for velocity/torque joints).
        """
        spec = self.contract.action
        hold = np.zeros(spec.dim, dtype=np.float32)
        if spec.hold_posture == "hold_position":
            for k, idx in enumerate(self._hold_index):
                if idx >= 0 and proprio is not None and np.isfinite(proprio[idx]):
                    hold[k] = proprio[idx]
                elif self.last_command is not None:
                    hold[k] = self.last_command[k]
            hold = np.clip(hold, self.lower, self.upper)
        return np.repeat(hold[None], spec.chunk_length, axis=0)

    def check(self, actions: np.ndarray, proprio: np.ndarray | None, now_ns: int, valid_until_ns: int) -> GuardResult:
        spec = self.contract.action
        hit: list[str] = []
        replaced = False
        if now_ns > valid_until_ns:
            self.counts["expired"] += 1
            return GuardResult(None, ("expired",), False)
        out = actions
        if not np.isfinite(out).all():
            hit.append("nonfinite")
            out, replaced = self.hold_posture(proprio), True
        if not replaced and ((out < self.lower) | (out > self.upper)).any():
            hit.append("bounds")
            # Beyond a bound by more than one period's rate limit is not an edge case of a
            # sane policy but a broken one: the health monitors quarantine it.
            excess = np.maximum(self.lower - out, out - self.upper)
            if (excess > self.rate).any():
                hit.append("out_of_bounds")
            if spec.on_bound_violation == "hold":
                out, replaced = self.hold_posture(proprio), True
            else:
                out = np.clip(out, self.lower, self.upper)
        limited = self._rate_limit(out, now_ns, proprio)
        if limited is not out:
            hit.append("rate")
            out = limited
        for kind in hit:
            self.counts[kind] += 1
        self.last_command = out[0].copy()
        self.last_command_ns = now_ns
        return GuardResult(out, tuple(hit), replaced)

    def _reference(self, proprio: np.ndarray | None, allow: np.ndarray) -> np.ndarray | None:
        """What the first waypoint is rate-limited against: the last published command,
        unless the measured joint positions are farther from it than the limit allows.
        Then the robot was moved by something other than vlad's commands (hand-guiding,
        a recovery after an e-stop, a simulator reset), and a limit relative to a stale
        command would drag it back towards where it was."""
        prev = self.last_command
        if proprio is None or prev is None or not all(i >= 0 for i in self._hold_index):
            return prev
        measured = np.asarray([proprio[i] for i in self._hold_index], dtype=np.float32)
        if not np.isfinite(measured).all():
            return prev
        return measured if bool((np.abs(measured - prev) > allow).any()) else prev

    def _rate_limit(self, chunk: np.ndarray, now_ns: int, proprio: np.ndarray | None = None) -> np.ndarray:
        """Clamp per-period changes; returns ``chunk`` itself when nothing was clamped."""
        first_allow = self.rate
        if self.last_command is not None:
            periods = max(1.0, (now_ns - self.last_command_ns) / self.period_ns) if self.period_ns else 1.0
            first_allow = self.rate * np.float32(periods)
        prev = self._reference(proprio, first_allow)
        deltas = np.diff(chunk, axis=0)
        ok_first = prev is None or bool((np.abs(chunk[0] - prev) <= first_allow + 1e-6).all())
        if ok_first and bool((np.abs(deltas) <= self.rate + 1e-6).all()):
            return chunk
        out = chunk.copy()
        if prev is not None:
            out[0] = prev + np.clip(out[0] - prev, -first_allow, first_allow)
        for k in range(1, len(out)):
            out[k] = out[k - 1] + np.clip(chunk[k] - out[k - 1], -self.rate, self.rate)
        return np.clip(out, self.lower, self.upper)
