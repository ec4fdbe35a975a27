"""The only way a chunk leaves vlad: the final guard, the e-stop gate and the action socket.

Policy chunks come from the serving thread, hold postures from it and from the
:class:`~vlad.serving.cadence.HoldKeeper`; the e-stop thread flips :attr:`estop_engaged`
under the same lock, so once :meth:`Publisher.set_estop` returned no policy chunk is sent
until the e-stop is released, whatever the other threads are doing. ZeroMQ sockets are
not thread-safe: every send happens under the lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Literal

import numpy as np
import zmq

from vlad import protocol
from vlad.contract import Contract
from vlad.processing import RawObservation
from vlad.serving.counters import HOLD, PublishCounts
from vlad.serving.guard import ActionGuard, Executing
from vlad.serving.policy import ServedPolicy
from vlad.serving.position import ServingState
from vlad.serving.tracing import CycleTimes, LatencyStats
from vlad.snapshot import Swap

Observer = Callable[[int, np.ndarray], None]
# What became of a policy chunk: sent; held back until the re-anchor its observation announced
# is confirmed (the serving thread offers it again); dropped (replaced thread, retired policy,
# e-stop, expired, an announcement contradicted).
Outcome = Literal["sent", "held", "dropped"]


_HOLD_NAME = str(HOLD)


class Publisher:
    """Guards and sends action chunks; gates them on the e-stop (see module docstring)."""

    def __init__(
        self,
        contract: Contract,
        sock: zmq.Socket,
        guard: ActionGuard,
        stats: LatencyStats,
        counts: PublishCounts,
        serving: ServingState,
        estop_output: str = "hold",
    ) -> None:
        self.contract = contract
        self.sock = sock
        self.guard = guard
        self.stats = stats
        self.counts = counts
        self.serving = serving  # the release and the state every chunk is labelled with
        self.estop_output = estop_output
        self.lock = threading.Lock()
        self.estop_engaged = False
        # The serving thread's generation: a thread replaced after a hang must never send.
        self.generation = 0
        self.seq = 0
        self.last_publish_ns = 0
        # The newest observation answered (a policy chunk or a hold about it): (client, seq), as
        # sequence numbers are each controller's own.
        self.answered: tuple[str, int] = ("", 0)
        self.tap: Callable[..., None] | None = None  # vlad.daemon.tap: never blocks
        self.validity_ns = int(contract.timing.action_validity_ms * 1e6)
        self.deadline_ns = int(contract.timing.e2e_deadline_ms * 1e6)
        self.period_ns = int(contract.timing.control_period_ms * 1e6)
        # Called with (obs_seq, the policy's own chunk before the guard) for every chunk of
        # the release, while a shadow run or a canary compares another policy against it.
        self.observers: list[Observer] = []
        # Hot-swap timing: decision -> first command from the new policy, in ms (last 20).
        self.swap_ms: deque[Swap] = deque(maxlen=20)
        self._swap_pending: tuple[str, int] | None = None
        self._timings: dict[str, float] = {}
        spec = contract.action
        self._layout = protocol.Layout([("actions", "float32", (spec.chunk_length, spec.dim))])

    # -- the e-stop gate -------------------------------------------------------------------

    def set_estop(self, engaged: bool) -> None:
        """Called by the e-stop thread. Engaged: no policy chunk leaves from now on.
        Released: the next chunk starts from the trusted joint state, not from the last
        command before the stop (the robot may have been moved meanwhile)."""
        with self.lock:
            if self.estop_engaged and not engaged:
                self.guard.forget_command()
            self.estop_engaged = engaged

    # -- sending ---------------------------------------------------------------------------

    def expect_swap(self, source: str, t0_ns: int) -> None:
        self._swap_pending = (source, t0_ns)

    def executing(self, obs: RawObservation) -> Executing:
        """What the controller that sent ``obs`` executes on the slots of a chunk about it
        (:meth:`vlad.serving.guard.ActionGuard.executing`): real-time chunking continues it."""
        with self.lock:
            return self.guard.executing(obs.client or "", obs.sensor_time_ns, obs.executing)

    def announcement(self, obs: RawObservation) -> Literal["confirmed", "pending", "contradicted"]:
        """For an observation of an announced re-anchor: where the announcement stands."""
        trusted = self.guard.trusted
        if trusted.confirmed_id == obs.provisional:
            return "confirmed"
        pending = trusted.pending
        return "pending" if pending is not None and pending.id == obs.provisional else "contradicted"

    def publish(
        self,
        actions: np.ndarray,
        obs: RawObservation,
        t: CycleTimes,
        policy: ServedPolicy,
        generation: int,
        continues: tuple[int, int] | None = None,
    ) -> Outcome:
        """Guard ``actions`` (computed from ``obs`` by ``policy``) and send them.

        "held": ``obs`` announced a re-anchor not yet confirmed (nothing sent: offer it again
        once a later observation confirmed it); "dropped": a replaced serving thread, the
        e-stop engaged, the chunk expired or the announcement was contradicted. ``actions``
        may be modified in place by the guard. ``continues``: real-time chunking computed it
        to continue a chunk (its seq, 0 for the held pose) over that many frozen periods.
        """
        counts = policy.counts
        own = actions.copy() if self.observers and policy.id.slot == "release" else None
        with self.lock:
            if generation != self.generation or policy.retired:
                return "dropped"
            if self.estop_engaged:
                counts.estop_blocked += 1
                return "dropped"
            if obs.provisional:
                standing = self.announcement(obs)
                if standing == "pending":
                    return "held"
                if standing == "contradicted":
                    counts.unconfirmed += 1
                    return "dropped"
            valid_until = obs.sensor_time_ns + self.validity_ns
            client = obs.client or ""
            executing = self.guard.executing(client, obs.sensor_time_ns, obs.executing)
            verdict = self.guard.check(
                actions,
                time.monotonic_ns(),
                valid_until,
                obs.sensor_time_ns,
                executing=executing,
                client=client,
                remember=False,
            )
            t.guard_end = time.monotonic_ns()
            if verdict.actions is None:
                counts.expired += 1
                return "dropped"
            self._send(
                verdict.actions,
                verdict.interventions,
                obs.sequence,
                obs.sensor_time_ns,
                valid_until,
                policy.id.slot,
                policy.name,
                t.header_ms(self._timings),
                False,
                None,
                client,
                continues,
            )
            self.guard.record(verdict.actions, obs.sensor_time_ns, valid_until, self.last_publish_ns, client, self.seq)
            self.answered = (client, obs.sequence)
            t.publish = self.last_publish_ns
            self._swap_done(policy.id.slot)
            self.counts.policy_chunks += 1
            if verdict.interventions:
                self.counts.interventions += 1
            e2e_ms = self.stats.record(t)
            if e2e_ms * 1e6 > self.deadline_ns:
                self.counts.deadline_misses += 1
                counts.deadline_misses += 1
        counts.published += 1
        for kind in verdict.interventions:  # per policy: the health monitors blame the right one
            if kind == "nonfinite":
                counts.nonfinite_outputs += 1
            elif kind in ("bounds", "out_of_bounds", "rate", "seam"):
                setattr(counts, kind, getattr(counts, kind) + 1)
        if own is not None:
            for observe in list(self.observers):
                observe(obs.sequence, own)
        return "sent"

    def publish_hold(
        self,
        kind: protocol.HoldKind,
        obs_seq: int = 0,
        t_sensor_ns: int = 0,
        *,
        advisory: bool = False,
        rejection: protocol.Rejection | None = None,
        unless_sent_after: int | None = None,
        client: str | None = None,
    ) -> bool:
        """Send the contract's hold posture (from the trusted joint state) as a hold of ``kind`` (:class:`~vlad.protocol.HoldKind`);
        ``rejection``: why the observation was refused (a ``REJECTED`` hold's reason).

        ``advisory``: the observation ``obs_seq`` got no policy answer (late, stale, refused);
        a controller with a valid chunk keeps executing it, so an advisory hold is not what
        the next chunk is rate-limited from. Any other hold is adopted at once by every
        controller it is for (``client``: the one whose observation it answers; None: every
        controller), so it starts from what that controller executes and ramps to the hold
        position at the rate limit (the e-stop's hold excepted: the arm has stopped).
        ``unless_sent_after``: send nothing if a chunk went out after this time (decided
        outside the lock: the serving thread may have answered meanwhile). While the e-stop
        is engaged only ``kind="estop"`` holds go out, and only with
        ``safety.estop_output = "hold"``; while an announced re-anchor waits for its
        confirmation no hold but the e-stop's goes out (it is confirmed, contradicted or
        dropped within :data:`~vlad.serving.guard.EXPIRE_PERIODS`; the next hold then starts
        from where it settled). False: nothing was sent.
        """
        with self.lock:
            estop = kind is protocol.HoldKind.ESTOP
            if self.estop_engaged and (not estop or self.estop_output != "hold"):
                return False
            if unless_sent_after is not None and self.last_publish_ns > unless_sent_after:
                return False
            now = time.monotonic_ns()
            if not estop and self.guard.trusted.in_question(now):
                # A re-anchor is in question: the arm is where it was announced (an episode's
                # reset) or where it was (a forged announcement), and a hold commands one of
                # the two: up to the whole joint range away from the arm. A controller with
                # nothing valid holds where it is instead; one executing a chunk goes on with
                # it until the announcement settles (confirmed, contradicted, or dropped
                # unconfirmed by ``settle``) and the next hold (every period while one serves)
                # starts from there.
                return False
            t_sensor = t_sensor_ns or now
            guard = self.guard
            ramp = None if advisory or estop else guard.executing(client, t_sensor)
            chunk = guard.hold_posture(ramp)
            valid_until = now + self.validity_ns
            source = kind.source
            self._send(
                chunk,
                ("hold",),
                obs_seq,
                t_sensor,
                valid_until,
                source,
                _HOLD_NAME,
                {},
                advisory,
                rejection,
                client,
            )
            guard.record(chunk, t_sensor, valid_until, self.last_publish_ns, client, self.seq, advisory)
            if obs_seq:
                self.answered = (client or "", obs_seq)
            self._swap_done(source)
            self.counts.holds[kind.value] += 1
        return True

    def _send(
        self,
        actions: np.ndarray,
        interventions: tuple[str, ...],
        obs_seq: int,
        t_sensor_ns: int,
        valid_until_ns: int,
        source: str,
        policy: str,
        timings: dict[str, float],
        advisory: bool,
        rejection: protocol.Rejection | None,
        client: str | None,
        continues: tuple[int, int] | None = None,
    ) -> None:
        self.seq += 1
        chunk = protocol.ActionChunk(
            seq=self.seq,
            obs_seq=obs_seq,
            t_sensor_ns=t_sensor_ns,
            t_issue_ns=time.monotonic_ns(),
            valid_until_ns=valid_until_ns,
            period_ns=self.period_ns,
            release=self.serving.release,
            state=self.serving.state,
            source=source,
            interventions=interventions,
            timings_ms=timings,
            actions=actions,
            advisory=advisory,
            rejection=rejection,
            client=client,
            rtc=continues,
            policy=policy,
        )
        h = chunk.header()
        msg = self._layout.encode(protocol.TOPIC_ACTIONS, h, (actions,))
        self.sock.send_multipart(msg)
        self.last_publish_ns = time.monotonic_ns()
        if self.tap is not None:
            self.tap(msg, self.last_publish_ns)
        self.counts.chunks += 1

    def _swap_done(self, source: str) -> None:
        pending = self._swap_pending
        if pending is not None and (
            source == pending[0] or (pending[0] == "hold" and source.startswith(protocol.HOLD_PREFIX))
        ):
            self.swap_ms.append(
                Swap(to=pending[0], first_command_ms=round((self.last_publish_ns - pending[1]) / 1e6, 3))
            )
            self._swap_pending = None
