"""The hot path: observation -> preprocess -> infer -> decode -> guard -> publish.

Two threads share it and take turns, so that reading the robot never waits for the policy
and an observation that finds the policy idle wakes one thread, not two:

* the **reader** holds the observation socket (``_reader``): it polls it, decodes and checks
  every message as it arrives (:class:`~vlad.serving.intake.Intake`: heartbeats, liveness,
  the trusted joint state) and answers a refused observation with an advisory hold. A
  controller's heartbeats are therefore read when they come, however long an inference
  takes: liveness is judged on the controller's clock.
* when the reader accepts an observation and no cycle runs, it **serves** it itself:
  :meth:`ServingLoop._cycle`, read top to bottom the whole path from the observation to the
  published chunk. It hands the socket to the other thread (waiting for it) once the
  inputs are ready, just before the engine call: the other thread's wake-up then falls in
  the engine call, which releases the interpreter, not in the preprocessing that needs it.
  An observation accepted while a cycle runs waits; the serving thread takes the newest one
  when its cycle ends (latest wins; older ones still waiting are counted as superseded, and
  enter a policy's observation window when it has ``[history]``), and joins the reader's
  queue for the socket once nothing waits. Latest wins per controller (``client``): with
  several, each one's newest observation waits in its own place and they are served in
  turn, in the order they started waiting, so a fast controller's stream never starves
  another's request (an openpi client beside a native controller).

Two things happen on warm caches, not after the engine call that evicts them: the serving
thread builds the guard's seam reference (what the robot executes,
:meth:`~vlad.serving.guard.ActionGuard.executing`) before the engine call, and the publisher
reuses it unless something it depends on changed meanwhile; and the reader, while no cycle
runs, rehearses the first stages on scratch copies just before a steady controller's next
observation is due (:mod:`vlad.serving.rehearsal`).

The hand-over between the two (the observation queue, who serves) happens under
``_handover``; at most one thread serves at a time. The asyncio event loop is never on this
path; it reads the threads' state through plain attributes and counter snapshots.

The policy a cycle runs is :attr:`ServingLoop.active`, a pointer the supervisor sets (a
fallback swap, a deploy) and then calls :meth:`wake` so that the newest observation is
answered by the new policy at once; ``None`` is the hold posture. A hung engine is the one
case a pointer change cannot fix: the supervisor then calls :meth:`replace_thread`, which
gives up the hung thread, starts a successor and bumps the generation, so the hung thread
can never publish when its call finally returns (it ends then). The reader goes on reading
throughout.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import zmq

from vlad.config import RealtimeConfig
from vlad.processing import RawObservation
from vlad.protocol import HoldKind
from vlad.serving import alloctrace
from vlad.serving.cycle import CycleFailure, run_cycle
from vlad.serving.intake import Intake
from vlad.serving.policy import ServedPolicy
from vlad.serving.publisher import Publisher
from vlad.serving.realtime import apply_thread_knobs
from vlad.serving.rehearsal import Rehearsal
from vlad.serving.rtc import RealTimeChunking
from vlad.serving.shadow import ShadowRun
from vlad.serving.tracing import CycleTimes
from vlad.threads import Worker

log = logging.getLogger("vlad.serving")

# Messages drained per wake-up of the reader: bounds the time a flood holds it before the
# newest valid observation is queued (each message is decoded and counted).
DRAIN_BATCH = 64


class Inference(NamedTuple):
    """The inference running now (read by the health monitors and the watchdog); a tuple,
    built every cycle, is cheaper than a frozen dataclass."""

    policy: ServedPolicy
    since_ns: int


class Accepted(NamedTuple):
    """An accepted observation and when the reader received it."""

    obs: RawObservation
    receive_ns: int


class HeldBack(NamedTuple):
    """A chunk about an observation whose announced re-anchor is not confirmed yet."""

    actions: np.ndarray
    obs: RawObservation
    times: CycleTimes
    policy: ServedPolicy
    continues: tuple[int, int] | None


class ServingLoop:
    """The reading and serving threads and the state the rest of vlad reads from them."""

    def __init__(
        self,
        ctx: zmq.Context,
        sock: zmq.Socket,
        intake: Intake,
        publisher: Publisher,
        realtime: RealtimeConfig,
        period_ns: int,
        history: int = 1,
        rtc: bool = True,
        rehearsal: Rehearsal | None = None,
    ) -> None:
        self.sock = sock
        self.intake = intake
        self.publisher = publisher
        self.realtime = realtime
        self.period_ns = period_ns
        # Accepted observations a policy's window takes in before the newest (its [history]
        # frames - 1): those superseded while an inference ran still enter it, in order.
        self.history = max(1, history)
        # Real-time chunking for policies whose contract has [rtc] (vlad.serving.rtc).
        self.rtc = RealTimeChunking(period_ns) if rtc else None
        # The hot path run on scratch copies before the next observation is due (warm caches).
        self.rehearsal = rehearsal
        self.active: ServedPolicy | None = None  # None: the hold posture
        self.shadow: ShadowRun | None = None
        self.estop_engaged: Callable[[], bool] = lambda: publisher.estop_engaged
        self.in_flight: Inference | None = None
        self.last_obs: RawObservation | None = None  # the newest accepted (trusted) observation
        self.last_obs_receive_ns = 0
        self.last_progress_ns = time.monotonic_ns()
        # When the reader last looked at the socket: the health monitors judge heartbeat and
        # observation ages up to here, not up to now, so a starved reader (messages waiting
        # unread) is never taken for a lost controller.
        self.read_ns = self.last_progress_ns
        self.tap: Callable[..., None] | None = None  # vlad.daemon.tap: never blocks
        self.cycle_errors = 0
        self.generation = 0
        self._served_by: ServedPolicy | None = None  # the policy the last cycle ran
        self._held: HeldBack | None = None  # waits for its re-anchor to be confirmed
        self._anchor = (0, 0)  # the trusted state's generation and announcement the last cycle saw
        self._stopping = False
        self._reader = threading.Lock()  # held by the thread that reads the socket
        self._reading = 0  # that thread's ident (0: between two)
        # The hand-over between the threads: what waits to be served, and who serves.
        self._handover = threading.Lock()
        # Accepted, not yet served: per controller (at most `history` each), in the order
        # they started waiting (the order they are served in).
        self._waiting: dict[str, list[Accepted]] = {}
        # At most as many places as the intake admits controllers at once. Names the intake
        # forgot (silent, never judged) may be followed by new ones while an inference runs:
        # past this many, a newcomer's observation is superseded, so memory stays bounded
        # however long an inference takes.
        self._places = intake.controllers.limit
        self._taken_rx = 0  # receive time of the newest observation taken to be served
        self._woken = False  # serve the newest observation again (a swap, the e-stop's release)
        self._server: _LoopThread | None = None  # the thread serving now, None: none is
        self._wake_addr = f"inproc://vlad-wake-{id(self)}"
        self._wake_rx = ctx.socket(zmq.PULL)  # stops the reader's poll
        self._wake_rx.bind(self._wake_addr)
        self._wake_tx = ctx.socket(zmq.PUSH)
        self._wake_tx.setsockopt(zmq.SNDHWM, 1)
        self._wake_tx.connect(self._wake_addr)
        self._wake_lock = threading.Lock()
        self._times = CycleTimes()
        self._spin = False  # busy-poll before the next blocking poll (see _read_once)
        self._alloc = alloctrace.from_env()  # None unless VLAD_ALLOC_TRACE is set (scripts/soak.py)
        self._threads: list[_LoopThread] = []  # the two taking turns (not one given up as hung)
        self._spawned = 0
        self._started = threading.Event()
        self._start_error: BaseException | None = None

    # -- lifecycle (called from the supervisor) --------------------------------------------

    def start(self, timeout: float = 5.0) -> None:
        """Start both threads; raises the reason when a real-time knob cannot be applied."""
        if self.realtime.gc_freeze:
            gc.collect()
            gc.freeze()  # the model and everything loaded at start are never scanned again
        for _ in range(2):
            self._started.clear()
            self._spawn()
            self._started.wait(timeout)
            if self._start_error is not None:
                self.stop(timeout)
                raise self._start_error

    def _spawn(self) -> None:
        self._spawned += 1
        thread = _LoopThread(self, self._spawned)
        self._threads = [*self._threads, thread]
        thread.start()

    def replace_thread(self) -> None:
        """A hung engine holds the serving thread: start a successor (see module doc)."""
        with self.publisher.lock:
            self.generation += 1
            self.publisher.generation = self.generation
        with self._handover:  # no cycle runs now: the reader may claim what waits
            hung, self._server = self._server, None
        self.in_flight = None
        if hung is None:
            return  # its cycle ended meanwhile: that thread goes on taking turns
        self._threads = [t for t in self._threads if t is not hung]
        log.error("serving thread stuck in an inference: replaced by a new one (generation %d)", self.generation)
        self._started.clear()
        self._spawn()
        self._kick()  # the reader serves what waited at once

    def wake(self) -> None:
        """Serve the newest observation again now (after a swap, the e-stop's release)."""
        with self._handover:
            self._woken = True
        self._kick()

    def _kick(self) -> None:
        """Wake the reader from its poll (it then looks at what there is to serve)."""
        with self._wake_lock:
            try:
                self._wake_tx.send(b"", zmq.NOBLOCK)
            except zmq.Again:
                pass  # a wake-up is already pending: one is enough
            except zmq.ZMQError:
                pass  # closed: the loop has stopped

    def stop(self, timeout: float) -> bool:
        """Stop reading and serving; True when both threads ended (a cycle under way
        finished) within ``timeout``."""
        self._stopping = True
        self._kick()
        deadline = time.monotonic() + timeout
        ok = True
        for thread in self._threads:
            ok = thread.stop(max(0.0, deadline - time.monotonic())) and ok
        return ok

    def wait_not_running(self, policy: ServedPolicy, timeout: float) -> bool:
        """Wait until no inference of ``policy`` is in flight (before closing its session)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = self.in_flight
            if running is None or running.policy is not policy:
                return True
            time.sleep(0.002)
        return False

    def engine_left_ns(self, now_ns: int) -> int | None:
        """While the serving thread is inside its engine call (which releases the GIL): about
        how long that call has left, from the previous call's duration (negative once it
        overran it). None while it is not in one. Read from another thread, without a lock:
        a stamp of the next cycle read with one of this one can only make it None or negative."""
        if self.in_flight is None:
            return None
        t = self._times
        start, end = t.infer_start, t.infer_end
        if start == 0 or end != 0:
            return None
        return int(self.publisher.stats.last("engine") * 1e6) - (now_ns - start)

    def close(self) -> None:
        with self._wake_lock:
            self._wake_tx.close(0)
        self._wake_rx.close(0)

    @property
    def alive(self) -> bool:
        threads = self._threads
        return len(threads) == 2 and all(t.alive for t in threads)

    def _knobs(self) -> bool:
        """The real-time knobs on the calling thread; False (reported to start()) when one fails."""
        try:
            apply_thread_knobs(self.realtime)
        except BaseException as exc:  # start() refuses to run without them
            self._start_error = exc
            self._started.set()
            return False
        return True

    # -- taking turns -----------------------------------------------------------------------

    def _take_turns(self, me: _LoopThread) -> None:
        """A thread's life: read the socket until there is something to serve, serve it while
        the other thread reads, then wait for the socket again (module doc)."""
        if not self._knobs():
            return
        self._started.set()
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        while not self._stopping:
            self._reader.acquire()
            self._reading = threading.get_ident()
            try:
                job = self._read(me, poller)
                if job is not None and not self._serve_all(me, *job):
                    return  # given up as hung (replace_thread): a successor serves
            finally:
                self._hand_off()

    def _hand_off(self) -> None:
        """The socket to the other thread, when the calling one still reads it (before its
        engine call, or once it has served)."""
        if self._reading == threading.get_ident():
            self._reading = 0
            self._reader.release()

    def _read(self, me: _LoopThread, poller: zmq.Poller) -> tuple[int, list[Accepted], bool] | None:
        """Read until there is something to serve and no cycle runs: then claim it. None:
        the loop stops."""
        # Wake at least every quarter period: shutdown is noticed promptly.
        timeout_ms = max(1, self.period_ns // 4_000_000)
        busy_ns = self.realtime.busy_poll_us * 1000
        self._spin = False
        while not self._stopping:
            try:
                job = self._read_once(me, poller, timeout_ms, busy_ns)
            except Exception:  # a bug, not bad input: keep reading, loud but rate-limited
                self.cycle_errors += 1
                if self.cycle_errors <= 10 or self.cycle_errors % 1000 == 0:
                    log.exception("reading the observation socket: unexpected error (%d so far)", self.cycle_errors)
                continue
            if job is not None:
                return job
        return None

    def _read_once(
        self, me: _LoopThread, poller: zmq.Poller, timeout_ms: int, busy_ns: int
    ) -> tuple[int, list[Accepted], bool] | None:
        """One wake-up: poll, drain, queue the accepted observations; claim them when no
        cycle runs."""
        rehearsal = self.rehearsal
        if rehearsal is not None:  # wake in time for it
            timeout_ms = rehearsal.poll_ms(time.monotonic_ns(), timeout_ms)
        # Spin only after a wake-up that brought messages: an idle thread blocks at once
        # instead of spinning busy_poll_us after every quarter-period timeout.
        ready = self._poll(poller, timeout_ms, busy_ns if self._spin else 0)
        now = self.read_ns = time.monotonic_ns()  # every message sent before now is read (or about to be)
        self._spin = bool(ready)
        if self._wake_rx in ready:
            self._clear_wakes()
        accepted = self._drain() if self.sock in ready else []
        with self._handover:
            if accepted:
                self._queue(accepted)
            cycle_runs = self._server is not None  # it takes what waits when it ends
            if not cycle_runs:
                # A held chunk is looked at again on an observation or a quiet poll (it may
                # settle without another observation), not on every heartbeat.
                held = self._held is not None and (accepted or self.sock not in ready)
                if self._waiting or self._woken or held:
                    return self._claim(me)
                self.last_progress_ns = now
        # Nothing claimed. The rehearsal runs only while no cycle runs (then only this thread
        # could start one); during a cycle, this interval's is skipped.
        if rehearsal is not None and not ready:
            rehearsal.maybe_run(now, None if cycle_runs else self.active, self._pending)
        return None

    def _pending(self) -> bool:
        """A message or a wake-up waits for the reader."""
        return bool((int(self.sock.get(zmq.EVENTS)) | int(self._wake_rx.get(zmq.EVENTS))) & zmq.POLLIN)

    def _poll(self, poller: zmq.Poller, timeout_ms: int, busy_ns: int) -> dict:
        if busy_ns:
            end = time.monotonic_ns() + busy_ns
            while time.monotonic_ns() < end:
                ready = dict(poller.poll(0))
                if ready:
                    return ready
        return dict(poller.poll(timeout_ms))

    def _clear_wakes(self) -> None:
        while True:
            try:
                self._wake_rx.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def _drain(self) -> list[Accepted]:
        accepted: list[Accepted] = []
        refused = None  # the newest refused observation, when nothing newer was accepted
        intake = self.intake
        sock = self.sock
        for _ in range(DRAIN_BATCH):
            # Asking is cheaper than pyzmq's Again exception on an empty queue (every wake-up).
            if not int(sock.get(zmq.EVENTS)) & zmq.POLLIN:
                break
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            receive_ns = time.monotonic_ns()
            if self.tap is not None:
                self.tap(frames, receive_ns)
            obs = intake.accept(frames, receive_ns)
            if obs is not None:
                accepted.append(Accepted(obs, receive_ns))
                name = obs.client or ""
                if self.rehearsal is not None:
                    self.rehearsal.accepted(frames, receive_ns, name)
                # What the controller executes now, for the chunk being computed (its seams)
                self.publisher.guard.reported(name, obs.sensor_time_ns, obs.executing)
                refused = None
            elif intake.refused is not None:
                refused = intake.refused
        if refused is not None and not self.estop_engaged():
            # The controller learns at once that this observation gets no policy answer (and
            # why); one answer per wake-up, so a flood of junk cannot flood the action socket.
            seq, t_sensor, reason, client = refused
            self.publisher.publish_hold(
                HoldKind.REJECTED, seq, t_sensor, advisory=True, rejection=reason, client=client
            )
        return accepted

    def _queue(self, accepted: list[Accepted]) -> None:
        """Under ``_handover``: accepted observations join what waits to be served, each
        behind its own controller's (latest wins per controller)."""
        waiting = self._waiting
        superseded = 0
        for item in accepted:
            name = item.obs.client or ""
            mine = waiting.get(name)
            if mine is None:
                if len(waiting) < self._places:
                    waiting[name] = [item]
                else:
                    superseded += 1
                continue
            superseded += 1  # that controller's newest waiting one is never served now
            mine.append(item)
            del mine[: -self.history]
        self.intake.counts.superseded += superseded
        self.last_obs, self.last_obs_receive_ns = accepted[-1]

    def _claim(self, me: _LoopThread) -> tuple[int, list[Accepted], bool]:
        """Under ``_handover``: ``me`` serves what waits (the generation it serves for, the
        observations taken, whether a wake asked for the newest again): the observations of
        the controller that has waited longest; the others' are claimed after this cycle."""
        waiting = self._waiting
        taken = waiting.pop(next(iter(waiting))) if waiting else []
        woken, self._woken = self._woken, False
        if taken:
            self._taken_rx = taken[-1].receive_ns
        self._server = me
        return self.generation, taken, woken

    # -- serving ---------------------------------------------------------------------------

    def _serve_all(self, me: _LoopThread, gen: int, taken: list[Accepted], woken: bool) -> bool:
        """Serve what was claimed, then what arrived meanwhile, until nothing waits. False:
        this thread was given up as hung (a newer generation serves; it ends)."""
        while True:
            try:
                self._serve(gen, taken, woken)
            except Exception:  # a bug, not bad input: keep serving, loud but rate-limited
                self.cycle_errors += 1
                if self.cycle_errors <= 10 or self.cycle_errors % 1000 == 0:
                    log.exception("serving: unexpected error (%d so far)", self.cycle_errors)
            self._hand_off()  # served without an engine call (a hold, the e-stop, a failure)
            with self._handover:
                # Also between cycles that follow each other without a pause (observations
                # arriving while every inference runs): the watchdog sees the progress.
                self.last_progress_ns = time.monotonic_ns()
                if gen != self.generation:
                    return False
                if self._stopping or not (self._waiting or self._woken):
                    self._server = None  # a reader may claim what comes next
                    return True
                gen, taken, woken = self._claim(me)

    def _serve(self, gen: int, taken: list[Accepted], woken: bool) -> None:
        """Serve the newest of ``taken`` (or, on a wake, the newest observation again)."""
        if self._held is not None:  # also on a quiet poll: it may settle without another observation
            self._offer_held(gen, taken)
        if taken:
            newest = taken[-1]
        elif (
            woken
            and self.last_obs is not None
            and (
                (self.last_obs.client or "", self.last_obs.sequence) != self.publisher.answered
                or self._served_by is not self.active
            )
        ):
            # A swap or the e-stop's release: answer the newest observation again (with the
            # new policy), unless a chunk about it already went out since.
            newest = Accepted(self.last_obs, self.last_obs_receive_ns)
        else:
            return
        if not self.estop_engaged():  # e-stop: the policy is not even asked
            if self._alloc is None:
                self._cycle(newest.obs, newest.receive_ns, gen, taken[:-1])
            else:
                self._alloc.measure(self._cycle, newest.obs, newest.receive_ns, gen, taken[:-1])

    # -- the hot path ----------------------------------------------------------------------

    def _cycle(self, obs: RawObservation, receive_ns: int, gen: int, earlier: list[Accepted] | None = None) -> None:
        """One observation in, one action chunk out (or a hold saying why not). ``earlier``:
        accepted observations superseded by ``obs`` (a policy's [history] window takes them in)."""
        shadow = self.shadow
        policy = self.active
        self._served_by = policy
        if policy is None:  # the hold posture serves: answer with it at once
            if shadow is not None:
                shadow.offer(obs, receive_ns)
            self.publisher.publish_hold(HoldKind.FALLBACK, obs.sequence, obs.sensor_time_ns, client=obs.client or "")
            return
        t = self._times
        t.reset(obs.sensor_time_ns, receive_ns)
        anchor = (self.intake.trusted.generation, obs.provisional)
        if anchor != self._anchor and (anchor[0] != self._anchor[0] or obs.provisional):
            if policy.pre.frames > 1:  # the joint state jumped (a new episode): the window restarts
                policy.pre.reset()
        self._anchor = anchor
        # Marked in flight before the retired check: a deploy retiring this policy waits
        # for in_flight to clear before closing its session.
        self.in_flight = Inference(policy, receive_ns)
        try:
            guide, continues = None, None
            # What the robot executes, the guard's seam reference: built now, on warm caches
            # (the engine call evicts them), the publisher reuses it unless it changed meanwhile.
            executing = self.publisher.executing(obs)
            rtc = self.rtc if policy.contract.rtc is not None else None
            if rtc is not None and rtc.delay_periods() >= 1:
                # The chunk arrives after its first slot: it continues what the robot executes.
                guide = rtc.guide(executing, policy.contract.action.chunk_length)
                if guide is not None:
                    continues = (executing.chunk, rtc.delay)
            if shadow is not None:  # a shadow or canary reference: the same observation and guide
                shadow.offer(obs, receive_ns, guide)
            if policy.retired:
                return
            policy.counts.cycles += 1
            if guide is not None:
                policy.counts.guided += 1
            if earlier and policy.pre.frames > 1:
                policy.pre.take_in([a.obs for a in earlier])
            # stale check, preprocess, (the socket to the other thread), infer, decode
            actions = run_cycle(policy, obs, t, guide=guide, before_engine=self._hand_off)
        except CycleFailure as failure:
            self._failed(gen, policy, obs, failure)
            return
        finally:
            if gen == self.generation:
                self.in_flight = None
        try:
            outcome = self.publisher.publish(actions, obs, t, policy, gen, continues)  # guard, e-stop gate, send
            if outcome == "held":
                self._held = HeldBack(actions.copy(), obs, dataclasses.replace(t), policy, continues)
            elif outcome == "sent" and self.rtc is not None:
                self.rtc.published(t.publish - obs.sensor_time_ns)
        except Exception as exc:  # a bug in the guard or the send: still answer, count, log
            broken = CycleFailure("guard", HoldKind.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
            broken.__cause__ = exc
            self._failed(gen, policy, obs, broken)
        # The chunk is out: the next observation's noise is drawn now, before it comes.
        policy.pre.prepare(obs.sequence + 1)

    def _offer_held(self, gen: int, taken: list[Accepted]) -> None:
        """The chunk held back for an announced re-anchor: sent once it is confirmed, unless
        the controller's newer observation (``taken``, the one that confirmed it, usually) is
        answered now instead (latest wins); dropped when an observation contradicted it."""
        held = self._held
        assert held is not None
        trusted = self.intake.trusted
        trusted.settle(time.monotonic_ns())
        status = self.publisher.announcement(held.obs)
        if gen == self.generation and (
            status == "pending"
            # Confirmed by an observation the reader has not queued yet: it is
            # about to be, and answering it is what latest-wins means.
            or (status == "confirmed" and trusted.confirmed_rx > self._taken_rx)
        ):
            return
        self._held = None
        if any(a.obs.client == held.obs.client for a in taken):
            self.intake.counts.superseded += 1
            return
        try:
            self.publisher.publish(held.actions, held.obs, held.times, held.policy, gen, held.continues)
        except Exception as exc:  # a bug in the guard or the send: still answer, count, log
            broken = CycleFailure("guard", HoldKind.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
            broken.__cause__ = exc
            self._failed(gen, held.policy, held.obs, broken)

    def _failed(self, gen: int, policy: ServedPolicy, obs: RawObservation, failure: CycleFailure) -> None:
        """Count ``failure`` where it belongs and answer the observation with a hold saying why."""
        reason, counts = failure.reason, policy.counts
        failure.count(counts)
        if failure.rejection is not None:
            self.intake.reject(failure.rejection, f"obs {obs.sequence}: {failure}")
        if gen != self.generation:
            return  # a replaced thread never sends
        client = obs.client or ""
        if failure.input_fault:
            self.publisher.publish_hold(
                failure.hold,
                obs.sequence,
                obs.sensor_time_ns,
                advisory=True,
                rejection=failure.rejection,
                client=client,
            )
            return
        self.publisher.publish_hold(failure.hold, obs.sequence, obs.sensor_time_ns, client=client)
        n = (
            counts.cycle_errors
            if reason is HoldKind.INTERNAL_ERROR
            else self.publisher.counts.holds[failure.hold.value]
        )
        if n <= 10 or n % 1000 == 0:  # loud for the first ones, then sampled
            log.error(
                "%s: %s on observation %d (%s, %d so far): %s",
                policy.id,
                reason,
                obs.sequence,
                failure.stage,
                n,
                failure,
                exc_info=failure.__cause__ if reason is HoldKind.INTERNAL_ERROR else None,
            )


class _LoopThread(Worker):
    """One of the two threads that take turns reading the socket and serving
    (:meth:`ServingLoop._take_turns`); one given up as hung ends when its call returns."""

    def __init__(self, loop: ServingLoop, number: int) -> None:
        super().__init__(f"vlad-serving-{number}")
        self.loop = loop

    def run(self) -> None:
        self.loop._take_turns(self)

    def wake(self) -> None:
        self.loop._kick()
