"""The final guard on every action chunk leaving vlad, and the joint state it trusts.

:class:`TrustedState` decides which measured joint states vlad believes. A proprio vector
beyond a joint's limits (with a margin), or that moved farther since the last trusted
state than the joint can physically move (its rate limit × the periods elapsed × a
factor), is refused. A real external move (a reset, hand-guiding, recovery after an
e-stop) shows as a *consistent run* of such observations; after ``reanchor_observations``
of them, spanning that many control periods of sensor time (a burst inside one period is
not a move), the trusted state re-anchors there (counted and logged). A controller that
knows of a jump (an episode reset, homing) announces it with the observation (``reanchor``):
that state is trusted at once, at most once per ``guard.reanchor_min_interval_ms``. A
rejected observation's values never reach an output: holds and re-anchoring use the
trusted state only.

:class:`ActionGuard` checks, in order, against the release contract:

1. every value finite; otherwise the whole chunk is replaced by the hold posture
   (``on_nonfinite = "hold"``): a partially NaN chunk is not trustworthy anywhere;
2. within each joint's ``[lower, upper]``; ``on_bound_violation`` says clamp or hold
   (``bounds``); a value beyond a bound by more than the joint's rate limit is also counted
   as ``out_of_bounds``, which the health monitors treat as a broken policy;
3. within each joint's ``rate_limit`` per control period: between consecutive waypoints,
   and from the reference to the first waypoint. The reference is the command for the
   time slot just before the first waypoint's: the last chunk sent's waypoint for that
   slot while that chunk is valid (a second answer to the same observation is limited
   from what the first one started from), else the trusted joint state (nothing sent yet,
   the e-stop released, the last chunk expired, a re-anchor);
4. still valid: a chunk whose ``valid_until`` has passed is not published at all.

Every correction is an *intervention*, counted by kind. The guard is a process function:
it keeps commands sane, it is not a safety function (that is the PLC and the e-stop).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vlad.config import GuardConfig
from vlad.contract import Contract

log = logging.getLogger("vlad.guard")

INTERVENTIONS = ("nonfinite", "bounds", "out_of_bounds", "rate", "expired")


class TrustedState:
    """The last measured joint positions vlad trusts (action-joint order), see module doc."""

    def __init__(self, contract: Contract, cfg: GuardConfig | None = None) -> None:
        cfg = cfg or GuardConfig()
        spec = contract.action
        self.period_ns = int(contract.timing.control_period_ms * 1e6)
        names = contract.proprio.names if contract.proprio else ()
        units = contract.proprio.units if contract.proprio else ()
        # Proprio entry of each action joint's position, where the contract has one in
        # the same unit (only then can a measurement be compared with a command).
        self.index = []
        for j in spec.joints:
            key = f"{j.name}.position"
            idx = names.index(key) if key in names else -1
            self.index.append(idx if idx >= 0 and units[idx] == j.unit and j.semantics == "position" else -1)
        lower = np.asarray([j.lower for j in spec.joints], np.float64)
        upper = np.asarray([j.upper for j in spec.joints], np.float64)
        margin = (upper - lower) * cfg.proprio_limit_margin
        self.lo, self.hi = lower - margin, upper + margin
        self.step = np.asarray([j.rate_limit for j in spec.joints], np.float64) * cfg.proprio_rate_factor
        # The mapped joints as plain floats, for judge_values.
        self._mapped_k = [k for k, i in enumerate(self.index) if i >= 0]
        self._mapped_i = [i for i in self.index if i >= 0]
        self._lo_m = [float(self.lo[k]) for k in self._mapped_k]
        self._hi_m = [float(self.hi[k]) for k in self._mapped_k]
        self._step_m = [float(self.step[k]) for k in self._mapped_k]
        self._positions_m: list[float] = []
        # Every action joint has a measured position: a trusted state is then all finite.
        self.complete = bool(self._mapped_k) and len(self._mapped_k) == len(self.index)
        self.confirm = cfg.reanchor_observations
        self.announced_interval_ns = int(cfg.reanchor_min_interval_ms * 1e6)
        self._announced_ns: int | None = None  # sensor time of the last announced re-anchor
        self.announced = 0
        # A real move is consistent over time, not only in count: the confirming run must
        # span (confirm - 1) control periods of sensor time (less a quarter period of
        # jitter). A burst of identical forged states inside one period never re-anchors.
        self.min_span_ns = max(0, (self.confirm - 1) * self.period_ns - self.period_ns // 4)
        self.positions: np.ndarray | None = None  # float32, action-joint order (unmapped: NaN)
        self.t_ns = 0
        self.generation = 0  # bumped on every re-anchor after a confirmed jump
        self._candidate: list[float] | None = None
        self._candidate_t = 0
        self._candidate_t0 = 0  # sensor time of the run's first observation
        self._run = 0
        self.reanchors = 0

    def _allowed(self, dt_ns: int) -> list[float]:
        """How far each mapped joint may have moved in ``dt_ns`` of sensor time."""
        periods = max(1.0, dt_ns / self.period_ns) if self.period_ns else 1.0
        return [step * periods + 1e-6 for step in self._step_m]

    def _within(self, q: list[float], ref: list[float], dt_ns: int) -> bool:
        return all(abs(a - b) <= lim for a, b, lim in zip(q, ref, self._allowed(dt_ns), strict=True))

    def judge(self, proprio: np.ndarray | None, t_sensor_ns: int, reanchor: bool = False) -> str | None:
        """:meth:`judge_values` for a proprio array (None: nothing to judge)."""
        if proprio is None:
            return None
        return self.judge_values(np.asarray(proprio, np.float64).tolist(), t_sensor_ns, reanchor)

    def judge_values(self, proprio: Sequence[float], t_sensor_ns: int, reanchor: bool = False) -> str | None:
        """None when ``proprio`` (finite floats, contract order) is trusted (and becomes the
        trusted state), else the rejection reason (a counter key: ``proprio_out_of_limits``,
        ``implausible_proprio``). Plain floats, not numpy: a handful of joints judged at
        every observation costs less in Python than in numpy's per-call dispatch.

        ``reanchor``: the controller announces an intended jump (an episode reset, homing):
        a state within the limits is trusted at once and becomes the rate limiter's
        reference, at most once per ``guard.reanchor_min_interval_ms`` of sensor time."""
        if not self._mapped_k:
            return None
        q = [proprio[i] for i in self._mapped_i]
        if any(not lo <= v <= hi for v, lo, hi in zip(q, self._lo_m, self._hi_m, strict=True)):
            return "proprio_out_of_limits"
        if self.positions is None:
            self._accept(q, t_sensor_ns)
            return None
        if reanchor and (
            self._announced_ns is None or abs(t_sensor_ns - self._announced_ns) >= self.announced_interval_ns
        ):
            self._announced_ns = t_sensor_ns
            self.announced += 1
            self._reanchor(q, t_sensor_ns, "announced by the controller")
            return None
        if t_sensor_ns < self.t_ns:
            # Older than the trusted state (a late frame): judged against it, never replacing it.
            return None if self._within(q, self._positions_m, self.t_ns - t_sensor_ns) else "implausible_proprio"
        if self._within(q, self._positions_m, t_sensor_ns - self.t_ns):
            self._accept(q, t_sensor_ns)
            return None
        # A jump: believe it only once a run of observations agrees with it.
        if self._candidate is not None and self._within(q, self._candidate, t_sensor_ns - self._candidate_t):
            self._run += 1
        else:
            self._run = 1
            self._candidate_t0 = t_sensor_ns
        self._candidate, self._candidate_t = q, t_sensor_ns
        if self._run < self.confirm or t_sensor_ns - self._candidate_t0 < self.min_span_ns:
            return "implausible_proprio"
        self._reanchor(q, t_sensor_ns, f"after {self.confirm} consistent observations")
        return None

    def _reanchor(self, q: list[float], t_ns: int, why: str) -> None:
        before = self._positions_m
        self._accept(q, t_ns)
        self.generation += 1
        self.reanchors += 1
        # An announced re-anchor is routine (every episode reset): logged sparsely.
        if self.reanchors <= 10 or self.reanchors % 1000 == 0:
            log.warning(
                "joint state re-anchored (%d so far) %s: %s -> %s",
                self.reanchors,
                why,
                [round(v, 3) for v in before],
                [round(v, 3) for v in q],
            )

    def _accept(self, q: list[float], t_ns: int) -> None:
        full = [math.nan] * len(self.index)
        for k, v in zip(self._mapped_k, q, strict=True):
            full[k] = v
        # A new array each time, never written in place: other threads read the reference.
        positions = np.array(full, np.float32)
        self._positions_m = [positions.item(k) for k in self._mapped_k]  # as float32 stores them
        self.positions = positions
        self.t_ns = t_ns
        self._candidate, self._run = None, 0


@dataclass(frozen=True)
class GuardResult:
    actions: np.ndarray | None  # None: do not publish (expired)
    interventions: tuple[str, ...]
    replaced: bool  # the chunk was replaced by the hold posture


@dataclass(frozen=True, slots=True)
class Sent:
    """The last chunk a controller may be executing: its waypoints on their time slots."""

    actions: np.ndarray  # a copy, as published
    t_sensor_ns: int  # waypoint k covers [t_sensor + k * period, t_sensor + (k + 1) * period)
    valid_until_ns: int
    before: np.ndarray  # what its first waypoint was limited from (the command for the slot before)


class ActionGuard:
    """Stateful guard: remembers the last chunk sent (:class:`Sent`) for rate limiting."""

    def __init__(self, contract: Contract, trusted: TrustedState | None = None, cfg: GuardConfig | None = None) -> None:
        spec = contract.action
        cfg = cfg or GuardConfig()
        self.contract = contract
        self.trusted = trusted or TrustedState(contract, cfg)
        self.lower = np.asarray([j.lower for j in spec.joints], dtype=np.float32)
        self.upper = np.asarray([j.upper for j in spec.joints], dtype=np.float32)
        self.rate = np.asarray([j.rate_limit for j in spec.joints], dtype=np.float32)
        self._rate_tol = self.rate + np.float32(1e-6)  # what _rate_limit compares steps with
        self._steps = np.empty((max(spec.chunk_length - 1, 0), spec.dim), np.float32)
        self.period_ns = int(contract.timing.control_period_ms * 1e6)
        self.confirm = cfg.reanchor_observations
        self.last: Sent | None = None
        self.counts = dict.fromkeys(INTERVENTIONS, 0)
        self.reanchors = 0  # reference moved to the trusted state after it drifted from the command
        self._seen_generation = 0
        self._drift_run = 0
        self._drift_t = 0

    @property
    def last_command(self) -> np.ndarray | None:
        """The first waypoint of the last chunk sent (None after :meth:`forget_command`)."""
        return self.last.actions[0] if self.last is not None else None

    def hold_posture(self) -> np.ndarray:
        """The approved stationary command as a full chunk.

        ``hold_position``: every waypoint at the trusted joint position (else the last
        published command, else the middle of the joint's range); ``zero_velocity``:
        zeros (velocity/torque joints).
        """
        spec = self.contract.action
        hold = np.zeros(spec.dim, dtype=np.float32)
        if spec.hold_posture == "hold_position":
            q = self.trusted.positions
            last = self.last_command
            for k in range(spec.dim):
                if q is not None and np.isfinite(q[k]):
                    hold[k] = q[k]
                elif last is not None:
                    hold[k] = last[k]
                else:
                    hold[k] = (self.lower[k] + self.upper[k]) / 2
            hold = np.clip(hold, self.lower, self.upper)
        return np.repeat(hold[None], spec.chunk_length, axis=0)

    def forget_command(self) -> None:
        """Start the next chunk from the trusted joint state (e.g. after an e-stop)."""
        self.last = None

    def check(
        self, actions: np.ndarray, now_ns: int, valid_until_ns: int, t_sensor_ns: int | None = None
    ) -> GuardResult:
        """Guard ``actions`` computed from the observation at ``t_sensor_ns`` (default: now);
        may modify them in place; remembers the chunk as sent."""
        spec = self.contract.action
        hit: list[str] = []
        replaced = False
        if now_ns > valid_until_ns:
            self.counts["expired"] += 1
            return GuardResult(None, ("expired",), False)
        t_sensor = now_ns if t_sensor_ns is None else t_sensor_ns
        out = actions
        # The common case in one pass: every value finite and inside its bounds (a NaN fails
        # both comparisons). Only a chunk that is not gets the checks that say which.
        if not ((out >= self.lower) & (out <= self.upper)).all():
            if not np.isfinite(out).all():
                hit.append("nonfinite")
                out, replaced = self.hold_posture(), True
            else:  # finite, so some value is beyond a bound
                hit.append("bounds")
                # Beyond a bound by more than one period's rate limit is not an edge case of
                # a sane policy but a broken one: the health monitors quarantine it.
                excess = np.maximum(self.lower - out, out - self.upper)
                if (excess > self.rate).any():
                    hit.append("out_of_bounds")
                if spec.on_bound_violation == "hold":
                    out, replaced = self.hold_posture(), True
                else:
                    np.clip(out, self.lower, self.upper, out=out)
        before = self._reference(t_sensor)
        if self._rate_limit(out, before):
            hit.append("rate")
        for kind in hit:
            self.counts[kind] += 1
        self.last = Sent(out.copy(), t_sensor, valid_until_ns, out[0].copy() if before is None else before)
        return GuardResult(out, tuple(hit), replaced)

    def record_hold(self, chunk: np.ndarray, t_sensor_ns: int, valid_until_ns: int) -> None:
        """A hold a controller adopts at once (e-stop, fallback, a failed inference): the
        next chunk is limited from it."""
        self.last = Sent(chunk.copy(), t_sensor_ns, valid_until_ns, chunk[0].copy())

    def _reference(self, t_sensor_ns: int) -> np.ndarray | None:
        """The command for the time slot before the one the new chunk's first waypoint covers.

        While the last chunk sent is valid that is its waypoint for that slot (a controller
        following the newest chunk, or one executing a chunk for several periods, is there),
        or, for a chunk about the same slot (two answers to one observation), what the last
        one was limited from. Otherwise (nothing sent yet, after an e-stop, the last chunk
        expired, a re-anchor) it is the trusted joint state. None: no trusted state either.
        """
        trusted = self.trusted
        q = trusted.positions if trusted.complete else None  # all finite (every action joint measured)
        if trusted.generation != self._seen_generation:  # a confirmed or announced re-anchor
            self._seen_generation = trusted.generation
            self._drift_run = 0
            self.last = None
        last = self.last
        if last is None or t_sensor_ns > last.valid_until_ns:
            return q.copy() if q is not None else None
        period = self.period_ns
        k = (t_sensor_ns - last.t_sensor_ns + period // 2) // period - 1 if period else -1
        ref = last.before if k < 0 else last.actions[min(k, len(last.actions) - 1)]
        if q is None:
            return ref
        # The robot drifted from the commands (hand-guiding, a slow external push): follow
        # the measurement only once consecutive trusted states agree on it.
        if (np.abs(q - ref) > self.rate).any():
            if trusted.t_ns != self._drift_t:
                self._drift_run += 1
                self._drift_t = trusted.t_ns
            if self._drift_run >= self.confirm:
                self._drift_run = 0
                self.reanchors += 1
                log.info("rate-limit reference re-anchored on the trusted joint state %s", np.round(q, 3).tolist())
                return q.copy()
        else:
            self._drift_run = 0
        return ref

    def _rate_limit(self, chunk: np.ndarray, ref: np.ndarray | None) -> bool:
        """Clamp per-period changes in place (the first waypoint from ``ref``, one period);
        True when anything was clamped."""
        tol = self._rate_tol
        within = ref is None or bool((np.abs(chunk[0] - ref) <= tol).all())
        if within and len(chunk) > 1:  # then the steps between waypoints
            steps = self._steps if self._steps.shape[0] == len(chunk) - 1 else np.empty_like(chunk[1:])
            np.subtract(chunk[1:], chunk[:-1], out=steps)
            within = bool((np.abs(steps, out=steps) <= tol).all())
        if within:
            return False
        if ref is not None:
            chunk[0] = ref + np.clip(chunk[0] - ref, -self.rate, self.rate)
        for k in range(1, len(chunk)):
            chunk[k] = chunk[k - 1] + np.clip(chunk[k] - chunk[k - 1], -self.rate, self.rate)
        np.clip(chunk, self.lower, self.upper, out=chunk)
        return True
