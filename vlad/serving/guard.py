"""The final guard on every action chunk leaving vlad, the joint state it trusts, and what the
robot executes.

:class:`TrustedState` decides which measured joint states vlad believes. A proprio vector
beyond a joint's limits (with a margin), or that moved farther since the last trusted
state than the joint can physically move (its rate limit × the periods elapsed × a
factor), is refused. A real external move (hand-guiding, recovery after an e-stop) shows as
a *consistent run* of such observations; after ``reanchor_observations`` of them, spanning
that many control periods of sensor time *and* of receive time (a burst inside one period,
or sensor times a sender made up, is not a move), the trusted state re-anchors there
(counted and logged). A controller that knows of a jump (an episode reset, homing)
announces it with the observation (``reanchor``). One message never moves the trusted
state at once: the announced state is *provisional* until a later observation (received at
least ¾ of a period after it) agrees with it, or until 1.5 periods pass with no observation
at all (a controller that asks only when it needs a chunk); it is dropped when an
observation agrees with the old state instead (``reanchors_contradicted``). Every other
controller with an observation believed within :data:`WITNESS_PERIODS` before the
announcement is a *witness*: nothing confirms the announcement (neither silence nor the
announcer's or any other name's observations) until each witness agreed or had nothing
believed that long, and a witness's observation of the old state contradicts it whatever
else it fits. An announcement with a sensor time older than the trusted state's is not
honoured; one unconfirmed after :data:`EXPIRE_PERIODS` is dropped (``reanchors_expired``).
So while the real controller streams, a forged announcement is contradicted by its next
observation before it is believed, also after a stall. Meanwhile the policy may compute on the
provisional observation, but its chunk is held back until the confirmation
(:class:`~vlad.serving.publisher.Publisher`). At most one announcement per
``guard.reanchor_min_interval_ms`` of the daemon's clock is honoured. A rejected
observation's values never reach an output: holds and the references below use the
trusted state only.

:class:`ActionGuard` checks, in order, against the release contract:

1. every value finite; otherwise the whole chunk is replaced by the hold posture
   (``on_nonfinite = "hold"``): a partially NaN chunk is not trustworthy anywhere;
2. within each joint's ``[lower, upper]``; ``on_bound_violation`` says clamp or hold
   (``bounds``); a value beyond a bound by more than the joint's rate limit is also counted
   as ``out_of_bounds``, which the health monitors treat as a broken policy;
3. **seams** (``seam``): the robot switches to a new chunk at a period boundary, coming from
   what it executes (:meth:`ActionGuard.executing`, the :class:`Executing` path). At
   the boundaries where it can switch (the slot the chunk arrives in and the next three)
   the new waypoint is within each joint's ``rate_limit`` of the command of the slot
   before;
4. **steps** (``rate``): from there on, consecutive waypoints within the rate limit;
5. still valid: a chunk whose ``valid_until`` has passed is not published at all.

What the robot executes is never what was merely sent: a controller executes the newest
valid chunk addressed to it (its ``client`` name, or every controller), from the moment it
arrives; one that executes chunks otherwise reports the chunk and waypoint it executes
with its observation (``exec``), and vlad takes that chunk as the one it keeps executing;
the newest report counts (a controller's later observations arrive while the policy
computes on an earlier one).
A controller that executes nothing (it holds its measured pose), a chunk that ran out or
expired, a re-anchor and the e-stop's release leave the trusted joint state as what it
executes. Binding holds go through the same seams (a hold ramps from the executed command
to the trusted position at the rate limit), except the e-stop's, which follows a stop.

Every correction is an *intervention*, counted by kind. The guard is a process function:
it keeps commands sane, it is not a safety function (that is the PLC and the e-stop).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from vlad.config import GuardConfig
from vlad.contract import Contract
from vlad.protocol import Rejection

log = logging.getLogger("vlad.guard")

INTERVENTIONS = ("nonfinite", "bounds", "out_of_bounds", "seam", "rate", "expired")
SENT_KEPT = 64  # chunks remembered for references (more than a second of chunks at 50 Hz)
# Boundaries at which a controller can switch to a chunk: the slot it arrives in, the next one
# (a controller ticks at period boundaries), one more for the chunk's way to it and the lag of
# a sensor time behind the tick it was taken on (capture, rendering), and one more for the
# controller's own scheduling (a tick that runs late).
SEAM_SLOTS = 4
UNREPORTED = (-1, -1)  # an observation without an ``exec`` report


# A controller that sent an observation within this many periods before an announcement is a
# witness: the announcement waits for its agreement, or for its silence over this long, which
# is as long as the liveness monitor's default (``heartbeat_missing_periods``) gives a
# streaming controller before it counts as gone.
WITNESS_PERIODS = 5
# An announcement nothing confirmed within this many periods (twice the longest a witness can
# keep it waiting) is dropped: a witness that neither agrees nor falls silent holds no reset
# pending, and no hold back, for longer.
EXPIRE_PERIODS = 2 * WITNESS_PERIODS


class Announcement(NamedTuple):
    """A jump a controller announced, not yet confirmed by a later observation."""

    id: int
    q: list[float]
    t_sensor_ns: int
    receive_ns: int
    client: str


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
        # An announced jump is believed only within the joint limits themselves: the margin
        # above is for measurement noise, not for a state to re-anchor on.
        self._lower_m = [float(lower[k]) for k in self._mapped_k]
        self._upper_m = [float(upper[k]) for k in self._mapped_k]
        self._step_m = [float(self.step[k]) for k in self._mapped_k]
        self._rate_m = [float(spec.joints[k].rate_limit) for k in self._mapped_k]
        self._positions_m: list[float] = []
        # Every action joint has a measured position: a trusted state is then all finite.
        self.complete = bool(self._mapped_k) and len(self._mapped_k) == len(self.index)
        self.confirm = cfg.reanchor_observations
        self.announced_interval_ns = int(cfg.reanchor_min_interval_ms * 1e6)
        # A confirming observation comes from the controller's next period, not from a burst.
        self.corroborate_ns = self.period_ns * 3 // 4
        # Unless an observation comes at all: then silence for 1.5 periods confirms it.
        self.settle_ns = self.period_ns * 3 // 2
        self._quiet = False  # no observation judged since the pending announcement
        # The receive time of each controller's last believed, current observation, and the other
        # controllers (witnesses) the pending announcement still waits for (module doc).
        self.witness_ns = self.period_ns * WITNESS_PERIODS
        self.expire_ns = self.period_ns * EXPIRE_PERIODS
        self.expired = 0  # announcements dropped unconfirmed (_expire)
        self._seen: dict[str, int] = {}
        self._waiting: set[str] = set()
        self._lock = threading.Lock()  # judged by the intake thread, settled by the serving thread
        self._announced_rx: int | None = None  # receive time of the last honoured announcement
        self._ids = 0
        self.pending: Announcement | None = None
        self.confirmed_id = 0  # the last announcement a later observation confirmed
        self.confirmed_rx = 0  # receive time of the observation that confirmed it (0: silence did)
        self.provisional = 0  # set by every judgement: the announcement the observation belongs to
        self.announced = 0
        self.contradicted = 0
        # A real move is consistent over time, not only in count: the confirming run must
        # span (confirm - 1) control periods (less a quarter period of jitter) of sensor time
        # and of receive time. A burst of identical forged states never re-anchors.
        self.min_span_ns = max(0, (self.confirm - 1) * self.period_ns - self.period_ns // 4)
        self.positions: np.ndarray | None = None  # float32, action-joint order (unmapped: NaN)
        self.t_ns = 0
        self.generation = 0  # bumped on every re-anchor after a confirmed jump
        self.anchor_t_ns = 0  # sensor time the state after the last re-anchor was first seen
        self._candidate: list[float] | None = None
        self._candidate_t = 0
        self._candidate_t0 = 0  # sensor time of the run's first observation
        self._candidate_rx0 = 0  # its receive time
        self._run = 0
        self.reanchors = 0

    def _allowed(self, dt_ns: int) -> list[float]:
        """How far each mapped joint may have moved in ``dt_ns`` of sensor time."""
        periods = max(1.0, dt_ns / self.period_ns) if self.period_ns else 1.0
        return [step * periods + 1e-6 for step in self._step_m]

    def _within(self, q: list[float], ref: list[float], dt_ns: int) -> bool:
        return all(abs(a - b) <= lim for a, b, lim in zip(q, ref, self._allowed(dt_ns), strict=True))

    def judge(
        self,
        proprio: np.ndarray | None,
        t_sensor_ns: int,
        reanchor: bool = False,
        receive_ns: int | None = None,
        client: str = "",
    ) -> Rejection | None:
        """:meth:`judge_values` for a proprio array (None: nothing to judge)."""
        self.provisional = 0
        if proprio is None:
            return None
        return self.judge_values(np.asarray(proprio, np.float64).tolist(), t_sensor_ns, reanchor, receive_ns, client)

    def judge_values(
        self,
        proprio: Sequence[float],
        t_sensor_ns: int,
        reanchor: bool = False,
        receive_ns: int | None = None,
        client: str = "",
    ) -> Rejection | None:
        """None when ``proprio`` (finite floats, contract order) is believed, else the
        rejection reason (a counter key: ``proprio_out_of_limits``, ``implausible_proprio``).
        Plain floats, not numpy: a handful of joints judged at every observation costs less
        in Python than in numpy's per-call dispatch.

        ``reanchor``: the controller announces an intended jump (module doc). Afterwards
        :attr:`provisional` names the announcement a believed observation belongs to (0: it
        is the trusted state). ``receive_ns``: when the daemon received it (default: the
        sensor time, for replays). ``client``: the controller that sent it (its name is
        bound to its connection by the intake), which decides who witnesses an announcement."""
        with self._lock:
            return self._judge(
                proprio, t_sensor_ns, reanchor, t_sensor_ns if receive_ns is None else receive_ns, client
            )

    def settle(self, now_ns: int) -> bool:
        """Confirm the pending announcement when no observation at all came for 1.5 periods
        after it (the announcing controller asks by request) and every witness has been
        silent for :data:`WITNESS_PERIODS`; True when it did. One that cannot be confirmed
        for :data:`EXPIRE_PERIODS` is dropped."""
        with self._lock:
            return self._resolve(now_ns)

    def in_question(self, now_ns: int) -> bool:
        """Whether an announcement is still pending once :meth:`settle` had its say."""
        if self.pending is None:  # the common case, without the lock
            return False
        with self._lock:
            self._resolve(now_ns)
            return self.pending is not None

    def _resolve(self, now_ns: int) -> bool:
        """Confirm the pending announcement by silence, else drop it once expired; True
        when it was confirmed."""
        if self._settle(now_ns):
            return True
        self._expire(now_ns)
        return False

    def _settle(self, now_ns: int) -> bool:
        p = self.pending
        if p is None or not self._quiet or now_ns - p.receive_ns < self.settle_ns or self._awaiting_witness(now_ns):
            return False
        self.pending = None
        self.confirmed_id, self.confirmed_rx = p.id, 0
        self._reanchor(p.q, p.t_sensor_ns, "announced by the controller, nothing contradicting", anchor=p.t_sensor_ns)
        return True

    def _awaiting_witness(self, now_ns: int) -> bool:
        """Whether a witness of the pending announcement that has not agreed with it sent an
        observation within :data:`WITNESS_PERIODS` (those silent longer are dropped)."""
        waiting = self._waiting
        if waiting:
            seen, limit = self._seen, now_ns - self.witness_ns
            waiting.difference_update([w for w in waiting if seen.get(w, 0) <= limit])
        return bool(waiting)

    def _expire(self, now_ns: int) -> None:
        """Drop the pending announcement when nothing confirmed it within :data:`EXPIRE_PERIODS`
        (a witness that neither agrees nor falls silent, a controller whose next observations
        are neither here nor there): its chunk is never sent, holds go out again."""
        p = self.pending
        if p is not None and now_ns - p.receive_ns >= self.expire_ns:
            self._drop(p, None)

    def _drop(self, p: Announcement, by: str | None) -> None:
        """Drop ``p``, not believed: contradicted by controller ``by`` (an observation of the
        old state), or expired (``by`` None)."""
        self.pending = None
        if by is None:
            self.expired += 1
            n, why = self.expired, f"not confirmed within {EXPIRE_PERIODS} periods"
        else:
            self.contradicted += 1
            n, why = self.contradicted, f"contradicted by {by!r}"
        if n <= 10 or n % 1000 == 0:
            log.warning(
                "re-anchor to %s announced by %r %s (%d so far): not believed",
                [round(v, 3) for v in p.q],
                p.client,
                why,
                n,
            )

    def _witness(self, client: str, receive: int) -> None:
        """``client`` sent a believed, recent observation: a witness of announcements for
        :data:`WITNESS_PERIODS`. (A refused one, one stamped long before the trusted state or
        one too soon to confirm proves nothing about the arm, and keeps no one a witness.)"""
        seen = self._seen
        seen[client] = receive
        if len(seen) > 256:  # names used once (bounded by the intake's table of controllers)
            limit = receive - self.witness_ns
            for name in [n for n, rx in seen.items() if rx <= limit]:
                del seen[name]

    def _judge(
        self, proprio: Sequence[float], t_sensor_ns: int, reanchor: bool, receive: int, client: str
    ) -> Rejection | None:
        self.provisional = 0
        if not self._mapped_k:
            return None
        q = [proprio[i] for i in self._mapped_i]
        if any(not lo <= v <= hi for v, lo, hi in zip(q, self._lo_m, self._hi_m, strict=True)):
            return Rejection.PROPRIO_OUT_OF_LIMITS
        if self.positions is None:
            self._accept(q, t_sensor_ns)
            self._witness(client, receive)
            return None
        if self.pending is not None:
            self._resolve(receive)  # what the serving thread would have settled, had it looked
        p = self.pending
        if p is not None:
            self._quiet = False
            where_it_was = self._within(q, self._positions_m, abs(t_sensor_ns - self.t_ns))
            if client != p.client and where_it_was and t_sensor_ns >= self.t_ns:
                # Another controller sees the arm where it was (now, not in a late frame): the
                # announcement is not about this arm. Judged before agreement: however long
                # since the announcement, an observation that fits the old state is no
                # evidence of the jump.
                self._drop(p, client)
            elif self._within(q, p.q, abs(t_sensor_ns - p.t_sensor_ns)):  # where it was announced
                # A later observation, a period on: this controller agrees (a burst does not).
                if receive - p.receive_ns >= self.corroborate_ns and t_sensor_ns > p.t_sensor_ns:
                    self._waiting.discard(client)
                    self._witness(client, receive)
                    if not self._awaiting_witness(receive):
                        self.pending = None
                        self.confirmed_id, self.confirmed_rx = p.id, receive
                        self._reanchor(
                            q, t_sensor_ns, "announced by the controller and confirmed", anchor=p.t_sensor_ns
                        )
                        return None
                self.provisional = p.id  # the announced state again: too soon, or a witness has not agreed
                return None
            elif where_it_was:  # the announcer itself, where the arm was
                self._drop(p, client)
        if (
            reanchor
            # a jump announced with a sensor time older than the trusted state's is a late frame
            and t_sensor_ns >= self.t_ns
            and (self._announced_rx is None or receive - self._announced_rx >= self.announced_interval_ns)
            and all(lo <= v <= hi for v, lo, hi in zip(q, self._lower_m, self._upper_m, strict=True))
            and any(abs(a - b) > r for a, b, r in zip(q, self._positions_m, self._rate_m, strict=True))
        ):
            # Announced (and more than a period's step away: a jump, not a no-op): provisional.
            self._announced_rx = receive
            self.announced += 1
            self._ids += 1
            self.pending = Announcement(self._ids, q, t_sensor_ns, receive, client)
            # Every other controller that observed lately: its next observation says whether
            # the arm moved; until it agrees (or is silent a liveness limit), nothing confirms.
            limit = receive - self.witness_ns
            self._waiting = {n for n, rx in self._seen.items() if rx > limit and n != client}
            self._quiet = True
            self._candidate, self._run = None, 0
            self.provisional = self._ids
            return None
        if t_sensor_ns < self.t_ns:
            # Older than the trusted state (a late frame): judged against it, never replacing it.
            if not self._within(q, self._positions_m, self.t_ns - t_sensor_ns):
                return Rejection.IMPLAUSIBLE_PROPRIO
            if self.t_ns - t_sensor_ns < self.witness_ns:
                # Believed and recent: still a witness (another producer's sensor times stamped a
                # few ms ahead make every one of the real controller's observations late).
                self._witness(client, receive)
            return None
        if self._within(q, self._positions_m, t_sensor_ns - self.t_ns):
            self._accept(q, t_sensor_ns)
            self._witness(client, receive)
            return None
        # A jump: believe it only once a run of observations agrees with it.
        if self._candidate is not None and self._within(q, self._candidate, t_sensor_ns - self._candidate_t):
            self._run += 1
        else:
            self._run = 1
            self._candidate_t0, self._candidate_rx0 = t_sensor_ns, receive
        self._candidate, self._candidate_t = q, t_sensor_ns
        if (
            self._run < self.confirm
            or t_sensor_ns - self._candidate_t0 < self.min_span_ns
            or receive - self._candidate_rx0 < self.min_span_ns
        ):
            return Rejection.IMPLAUSIBLE_PROPRIO
        self._reanchor(q, t_sensor_ns, f"after {self.confirm} consistent observations", anchor=self._candidate_t0)
        self._witness(client, receive)
        return None

    def _reanchor(self, q: list[float], t_ns: int, why: str, anchor: int) -> None:
        before = self._positions_m
        self._accept(q, t_ns)
        self.generation += 1
        self.anchor_t_ns = anchor
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
    """A chunk vlad published: its waypoints on their time slots, and whom it is for."""

    seq: int
    client: str | None  # the controller whose observation it answers; None: every controller
    actions: np.ndarray  # a copy, as published
    t_sensor_ns: int  # waypoint k covers [t_sensor + k * period, t_sensor + (k + 1) * period)
    valid_until_ns: int
    advisory: bool
    issued_ns: int  # when it left


class Executing(NamedTuple):
    """What the robot executes on a new chunk's time slots if it does not switch:
    ``path[i + 1]`` is the command of slot ``i`` (``path[0]``: the slot before the chunk's
    first), ``float32[chunk_length + 1, dim]``; ``covered``: the slots the executed chunk
    itself covers (after them the robot holds its measured pose); ``chunk``: its seq (0:
    none, the trusted state). ``before``: when ``chunk`` is one the controller is taken to
    have switched to since its report (sent after that observation, at ``switched_ns``),
    the path of what it reported: until a period after that chunk was sent, the new one may
    find the robot on either (two chunks arriving within one period, the newer is executed)."""

    path: np.ndarray
    covered: int
    chunk: int
    before: np.ndarray | None = None
    switched_ns: int = 0


class ActionGuard:
    """Stateful guard: remembers the chunks sent (:class:`Sent`) for the seams."""

    def __init__(self, contract: Contract, trusted: TrustedState | None = None, cfg: GuardConfig | None = None) -> None:
        spec = contract.action
        cfg = cfg or GuardConfig()
        self.contract = contract
        self.trusted = trusted or TrustedState(contract, cfg)
        self.lower = np.asarray([j.lower for j in spec.joints], dtype=np.float32)
        self.upper = np.asarray([j.upper for j in spec.joints], dtype=np.float32)
        self.rate = np.asarray([j.rate_limit for j in spec.joints], dtype=np.float32)
        self._rate_tol = self.rate + np.float32(1e-6)  # what the limits compare steps with
        self.period_ns = int(contract.timing.control_period_ms * 1e6)
        self.sent: dict[int, Sent] = {}  # by seq, oldest first (at most SENT_KEPT)
        self._newest: dict[str | None, int] = {}  # per addressee: the newest binding chunk's seq
        self._since_seq = 0  # chunks sent up to this one are no reference (the e-stop's release)
        self._since_ns = 0  # nor chunks about observations before a re-anchor
        self._seen_generation = 0
        self._auto_seq = 0
        self.counts = dict.fromkeys(INTERVENTIONS, 0)
        self.reports_unknown = 0  # ``exec`` reports naming no chunk vlad sent this controller
        self._unknown_counted: tuple | None = None  # the observation whose report was counted last
        # What executing() built last and what it was built from (see there).
        self._sent_version = 0  # bumped on every change to the chunks sent (publisher lock)
        self._cached: tuple[tuple, Executing] | None = None
        # Per controller: its newest ``exec`` report (sensor time, report), written by the
        # intake thread as observations arrive (one dict store), read here.
        self._reports: dict[str, tuple[int, tuple[int, int] | None]] = {}

    @property
    def last_command(self) -> np.ndarray | None:
        """The first waypoint of the newest binding chunk sent (None after :meth:`forget_command`)."""
        seq = max((s for s in self._newest.values()), default=0)
        sent = self.sent.get(seq)
        return sent.actions[0] if sent is not None else None

    def forget_command(self) -> None:
        """The robot executes nothing vlad sent so far (e.g. after an e-stop): the next chunk
        starts from the trusted joint state."""
        self._newest.clear()
        self._since_seq = max(self.sent, default=self._since_seq)
        self._sent_version += 1

    # -- what the robot executes ---------------------------------------------------------------

    def reported(self, client: str, t_sensor_ns: int, report: tuple[int, int] | None) -> None:
        """An accepted observation's ``exec`` report (also of one never served: superseded
        by a newer one). The newest per controller says what it executes now."""
        if report == UNREPORTED:
            return
        known = self._reports.get(client)
        if known is None and len(self._reports) >= SENT_KEPT:
            self._reports.pop(next(iter(self._reports)), None)  # names come and go: bounded
        if known is None or t_sensor_ns > known[0]:
            self._reports[client] = (t_sensor_ns, report)

    def executing(self, client: str | None, t_sensor_ns: int, report: tuple[int, int] | None = UNREPORTED) -> Executing:
        """What the controller ``client`` executes on the slots of a chunk about its
        observation at ``t_sensor_ns`` (module doc). ``report``: the observation's ``exec``
        (chunk seq, waypoint index at ``t_sensor_ns``), None: it executes nothing,
        :data:`UNREPORTED`: it did not say. The controller's newest report (:meth:`reported`)
        says it better when it is newer (its observations arrive while the policy computes),
        or when this one says nothing (a hold about no observation): the path is taken from
        it, shifted by the periods between the two.

        The serving thread asks before the engine call, while its caches are warm, and the
        publisher again once the chunk is there: unless something it depends on changed
        meanwhile (a chunk sent, a newer report, the trusted state), the second call returns
        the first's result, built from the very same state."""
        self._check_generation()
        trusted = self.trusted
        newest = self._reports.get(client or "")
        cached = self._cached
        if cached is not None:
            key = cached[0]
            if (
                key[0] == client
                and key[1] == t_sensor_ns
                and key[2] == report
                and key[3] is newest
                and key[4] == self._sent_version
                and key[5] is trusted.positions  # a new array on every change
                and key[6] == trusted.generation
            ):
                return cached[1]
        key = (client, t_sensor_ns, report, newest, self._sent_version, trusted.positions, trusted.generation)
        ex = self._executing_now(client, t_sensor_ns, report, newest)
        self._cached = (key, ex)
        return ex

    def _executing_now(
        self,
        client: str | None,
        t_sensor_ns: int,
        report: tuple[int, int] | None,
        newest: tuple[int, tuple[int, int] | None] | None,
    ) -> Executing:
        n = self.contract.action.chunk_length
        if newest is not None and self.period_ns and newest[0] >= self._since_ns:
            shift = (newest[0] - t_sensor_ns + self.period_ns // 2) // self.period_ns
            if (shift > 0 or report == UNREPORTED) and -n <= shift <= n:
                ex = self._executing(client, newest[0], newest[1])
                covered = max(0, min(n, ex.covered + shift)) if ex.chunk else 0
                before = None if ex.before is None else _shifted(ex.before, shift)
                return Executing(_shifted(ex.path, shift), covered, ex.chunk, before, ex.switched_ns)
        return self._executing(client, t_sensor_ns, report)

    def _executing(self, client: str | None, t_sensor_ns: int, report: tuple[int, int] | None) -> Executing:
        chunk, index = None, 0
        before = None  # (chunk, index) it reported, when taken to have switched since
        newest = self._newest_for(client, t_sensor_ns)
        if report == UNREPORTED:
            if newest is not None:
                chunk, index = newest, self._index(newest, t_sensor_ns)
        else:
            reported = None if report is None else self._believed(report, client, t_sensor_ns)
            if report is not None and reported is None:
                counted = (client, t_sensor_ns, report)
                if counted != self._unknown_counted:  # once per observation, however often asked
                    self._unknown_counted = counted
                    self.reports_unknown += 1
                if newest is not None:
                    chunk, index = newest, self._index(newest, t_sensor_ns)
            elif newest is not None and (reported is None or newest.seq != reported.seq):
                if self._follows_newest(reported, client, t_sensor_ns):
                    # Nothing newer than what it reports was there when it looked: it follows
                    # the newest chunk, which is what it executes when the new one comes.
                    chunk, index = newest, self._index(newest, t_sensor_ns)
                    before = (reported, report[1] if reported is not None and report is not None else 0)
                elif reported is not None and report is not None:
                    chunk, index = reported, report[1]
            elif reported is not None and report is not None:
                chunk, index = reported, report[1]
        hold = self._hold_position()
        path, covered = self._path(chunk, index, hold)
        if before is None or chunk is None:
            return Executing(path, covered, chunk.seq if chunk is not None else 0)
        return Executing(path, covered, chunk.seq, self._path(before[0], before[1], hold)[0], chunk.issued_ns)

    def _path(self, chunk: Sent | None, index: int, hold: np.ndarray) -> tuple[np.ndarray, int]:
        """The :class:`Executing` path of ``chunk`` run from waypoint ``index`` (None: the
        hold position), and the slots it covers."""
        spec = self.contract.action
        path = np.empty((spec.chunk_length + 1, spec.dim), np.float32)
        path[:] = hold
        covered = 0
        if chunk is not None:
            n = len(chunk.actions)
            # Slot i of the new chunk (from -1, the command before it) is waypoint index + i
            # of the executed one, while that is valid: rows 0..rows-1 of the path.
            last_valid = (chunk.valid_until_ns - chunk.t_sensor_ns - 1) // self.period_ns if self.period_ns else n - 1
            end = min(n, last_valid + 1)
            rows = max(0, min(spec.chunk_length - 1, end - index - 1) + 2)
            if rows:
                waypoints = np.arange(index - 1, index - 1 + rows)
                np.maximum(waypoints, max(index - 1, 0), out=waypoints)
                path[:rows] = chunk.actions[waypoints]
                covered = rows - 1
        return path, covered

    def _newest_for(self, client: str | None, t_sensor_ns: int) -> Sent | None:
        """The newest binding chunk a controller named ``client`` executes (its own or every
        controller's), valid at ``t_sensor_ns``."""
        best = None
        for key in (client, None):
            seq = self._newest.get(key)
            sent = self.sent.get(seq) if seq is not None else None
            if (
                sent is not None
                and self._reference(sent)
                and t_sensor_ns <= sent.valid_until_ns
                and (best is None or sent.seq > best.seq)
            ):
                best = sent
        return best

    def _believed(self, report: tuple[int, int], client: str | None, t_sensor_ns: int) -> Sent | None:
        """The chunk an ``exec`` report names, if vlad sent it to that controller and it is
        valid at the observation; None: not believed. (A chunk from before a re-anchor is
        believed: the controller that jumped drops its chunks, one that reports one did not
        jump.)"""
        seq, k = report
        reported = self.sent.get(seq)
        if (
            reported is None
            or reported.client not in (client, None)
            or not 0 <= k < len(reported.actions)
            or reported.seq <= self._since_seq
            or t_sensor_ns > reported.valid_until_ns
        ):
            return None
        return reported

    def _follows_newest(self, reported: Sent | None, client: str | None, t_sensor_ns: int) -> bool:
        """Whether a controller that reported ``reported`` (None: nothing) at its observation
        follows the newest chunk: no chunk for it newer than that one had come before the
        observation (had one come, it kept its own instead)."""
        after = reported.seq if reported is not None else 0
        for seq in reversed(self.sent):
            if seq <= after:
                return True
            sent = self.sent[seq]
            if (
                not sent.advisory
                and sent.client in (client, None)
                and sent.issued_ns < t_sensor_ns
                and self._reference(sent)
            ):
                return False
        return True

    def _reference(self, sent: Sent) -> bool:
        """A chunk the robot may still be executing: sent after the e-stop's last release,
        about an observation after the last re-anchor."""
        return sent.seq > self._since_seq and sent.t_sensor_ns >= self._since_ns

    def _index(self, chunk: Sent, t_sensor_ns: int) -> int:
        """The waypoint of ``chunk`` a controller executes at ``t_sensor_ns`` (its rule: a
        sample up to a tenth of a period early counts as the next waypoint's)."""
        if not self.period_ns:
            return 0
        return max(0, (t_sensor_ns - chunk.t_sensor_ns + self.period_ns // 10) // self.period_ns)

    def _hold_position(self) -> np.ndarray:
        """Where the robot holds when it executes nothing: the trusted joint position, else
        the last command, else the middle of the joint's range."""
        spec = self.contract.action
        if spec.hold_posture != "hold_position":
            return np.zeros(spec.dim, dtype=np.float32)
        q = self.trusted.positions
        last = self.last_command
        hold = np.array((self.lower + self.upper) / 2 if last is None else last, np.float32)
        if q is not None:  # a joint it does not measure (NaN) keeps the command's value
            np.copyto(hold, q, where=np.isfinite(q))
        return np.clip(hold, self.lower, self.upper)

    def _check_generation(self) -> None:
        """A confirmed or announced re-anchor: nothing computed before it is a reference."""
        trusted = self.trusted
        if trusted.generation != self._seen_generation:
            self._seen_generation = trusted.generation
            self._newest.clear()
            self._since_ns = trusted.anchor_t_ns

    # -- the checks ----------------------------------------------------------------------------

    def hold_posture(self, executing: Executing | None = None, now_ns: int | None = None) -> np.ndarray:
        """The approved stationary command as a full chunk.

        ``hold_position``: every waypoint at the trusted joint position (else the last
        published command, else the middle of the joint's range); ``zero_velocity``: zeros
        (velocity/torque joints). With ``executing`` (a binding hold the robot adopts at once)
        it starts from the executed command and ramps to that position at the rate limit."""
        spec = self.contract.action
        chunk = np.repeat(self._hold_position()[None], spec.chunk_length, axis=0)
        if executing is not None and spec.hold_posture == "hold_position":
            self._limit(chunk, executing, 0, now_ns)
        return chunk

    def decisions(self, actions: np.ndarray, proprio: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
        """The bound and step checks of :meth:`check` on their own, deciding without correcting:
        ``bool[H, J, 3]`` = below the lower bound, above the upper bound, a step beyond the rate
        limit from the previous waypoint (the first waypoint's from the measured joint position,
        where the trusted state maps ``proprio`` to one). What a gate compares between a
        reference and a candidate chunk: a differing decision is a *flip*."""
        a, previous = self._previous(actions, proprio)
        with np.errstate(invalid="ignore"):
            rate = np.abs(a - previous) > self._rate_tol
        rate &= np.isfinite(previous)
        return np.stack([a < self.lower, a > self.upper, rate], axis=-1)

    def margins(self, actions: np.ndarray, proprio: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
        """How far each of :meth:`decisions` lies from its threshold, same layout (contract
        units; a step with no previous waypoint: infinitely far)."""
        a, previous = self._previous(actions, proprio)
        with np.errstate(invalid="ignore"):
            rate = np.abs(np.abs(a - previous) - self._rate_tol)
        rate = np.where(np.isfinite(rate), rate, np.inf)
        return np.stack([np.abs(a - self.lower), np.abs(self.upper - a), rate], axis=-1)

    def _previous(
        self, actions: np.ndarray, proprio: Sequence[float] | np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``actions`` as float32 and each waypoint's previous command (the first's: the
        measured position, NaN where none)."""
        a = np.asarray(actions, np.float32)
        measured = np.full(a.shape[1], np.nan, np.float32)
        if proprio is not None:
            measured[:] = [proprio[i] if i >= 0 else np.nan for i in self.trusted.index]
        return a, np.vstack([measured[None], a[:-1]])

    def check(
        self,
        actions: np.ndarray,
        now_ns: int,
        valid_until_ns: int,
        t_sensor_ns: int | None = None,
        *,
        executing: Executing | None = None,
        client: str | None = None,
        seq: int | None = None,
        remember: bool = True,
    ) -> GuardResult:
        """Guard ``actions`` computed from the observation at ``t_sensor_ns`` (default: now)
        of controller ``client``, coming from ``executing`` (default: what that controller
        executes, :meth:`executing`); may modify them in place. ``remember``: remember the
        chunk as sent under ``seq`` (the publisher does it once it has left: :meth:`record`)."""
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
        if executing is None:
            executing = self.executing(client, t_sensor)
        arrival = max(0, (now_ns - t_sensor) // self.period_ns) if self.period_ns else 0
        hit.extend(self._limit(out, executing, min(arrival, len(out) - 1), now_ns))
        for kind in hit:
            self.counts[kind] += 1
        if remember:
            self.record(out, t_sensor, valid_until_ns, now_ns, client, seq)
        return GuardResult(out, tuple(hit), replaced)

    def record(
        self,
        chunk: np.ndarray,
        t_sensor_ns: int,
        valid_until_ns: int,
        issued_ns: int,
        client: str | None = None,
        seq: int | None = None,
        advisory: bool = False,
    ) -> None:
        """Remember a chunk as sent (a binding one becomes what its addressee executes)."""
        if seq is None:
            self._auto_seq += 1
            seq = self._auto_seq
        self.sent[seq] = Sent(seq, client, chunk.copy(), t_sensor_ns, valid_until_ns, advisory, issued_ns)
        self._sent_version += 1
        if not advisory:
            self._newest[client] = seq
        while len(self.sent) > SENT_KEPT:
            del self.sent[next(iter(self.sent))]

    def _seams_within(self, chunk: np.ndarray, path: np.ndarray, other: np.ndarray | None, seams: range) -> bool:
        """True when no seam waypoint needs a clamp (the common case), judged in one pass: with
        nothing clamped, each seam's bounds are the ones the slot-by-slot loop of :meth:`_limit`
        would compute from the same, unchanged waypoints."""
        if len(seams) == 0:
            return True
        rate, s = self.rate, slice(seams.start, seams.stop)
        lo, hi = path[s] - rate, path[s] + rate
        if other is not None:
            lo, hi = np.maximum(lo, other[s] - rate), np.minimum(hi, other[s] + rate)
        prev = chunk[seams.start : seams.stop - 1]  # each later seam's own previous waypoint
        lo[1:], hi[1:] = np.maximum(lo[1:], prev - rate), np.minimum(hi[1:], prev + rate)
        c = chunk[s]
        return not bool(((c < lo - 1e-6) | (c > hi + 1e-6)).any())

    def _limit(self, chunk: np.ndarray, executing: Executing, first: int, now_ns: int | None) -> list[str]:
        """Clamp ``chunk`` in place: at the seams from ``first`` (the slot it arrives in) on,
        each waypoint within the rate limit of the command of the slot before (of both
        commands the robot may be on, :attr:`Executing.before`); then every step. The kinds
        of correction made."""
        tol, rate, path = self._rate_tol, self.rate, executing.path
        other = executing.before
        if other is not None and (now_ns is None or now_ns - executing.switched_ns >= self.period_ns):
            other = None  # a period after it was sent, the robot has switched to it
        hit = []
        seams = range(first, min(first + SEAM_SLOTS, len(chunk)))
        clamp = () if self._seams_within(chunk, path, other, seams) else seams
        for i in clamp:
            before = path[i]  # the command of slot i - 1 if the robot has not switched yet
            lo, hi = before - rate, before + rate
            if other is not None:
                lo, hi = np.maximum(lo, other[i] - rate), np.minimum(hi, other[i] + rate)
            if i > first:  # and a step from the chunk's own previous waypoint
                lo, hi = np.maximum(lo, chunk[i - 1] - rate), np.minimum(hi, chunk[i - 1] + rate)
            if ((chunk[i] < lo - 1e-6) | (chunk[i] > hi + 1e-6)).any():
                np.clip(chunk[i], lo, np.maximum(lo, hi), out=chunk[i])
                if "seam" not in hit:
                    hit.append("seam")
        start = seams.stop  # steps after the seams
        if start < len(chunk):
            steps = chunk[start:] - chunk[start - 1 : -1] if start > 0 else None
            if steps is not None and not bool((np.abs(steps) <= tol).all()):
                for k in range(start, len(chunk)):
                    chunk[k] = chunk[k - 1] + np.clip(chunk[k] - chunk[k - 1], -rate, rate)
                hit.append("rate")
        if hit:
            np.clip(chunk, self.lower, self.upper, out=chunk)
        return hit


def _shifted(path: np.ndarray, shift: int) -> np.ndarray:
    """An :class:`Executing` path about an observation ``shift`` periods later (earlier, when
    negative) as seen from this one: slots before the later one's repeat its first command,
    slots past the earlier one's end its last."""
    if shift == 0:
        return path
    out = np.empty_like(path)
    if shift > 0:
        out[:shift] = path[0]
        out[shift:] = path[: len(path) - shift]
    else:
        out[: len(path) + shift] = path[-shift:]
        out[len(path) + shift :] = path[-1]
    return out
