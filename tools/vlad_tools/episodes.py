"""The one episode runner: a simulated task driven through :class:`~vlad.client.ChunkExecutor`,
its policy called in process or served by vlad.

Every closed-loop figure vlad reports comes from :func:`run_episode` (sets of episodes, their
summaries and pairing: :mod:`vlad_tools.evaluation`): the demo, the closed-loop gate, the
in-process evaluation of a trained policy and the benchmarks. Only the
:class:`Link` differs:

* :class:`InProcessLink` runs the release's own pipeline (preprocess -> engine -> decode,
  :func:`vlad.serving.cycle.infer_chunk`) synchronously: the answer is there at once;
* :class:`DaemonLink` is a robot controller on the daemon's sockets (:class:`vlad.client.Client`):
  it streams an observation and a heartbeat every control period, in real time, and waits for
  the answer until ``budget`` of the period has passed.

**Lock-step time.** The simulated arm advances one control period per tick, so the chunk
executor runs on the simulation's clock: tick ``t`` is at ``t * period``, and a chunk
computed from the observation of tick ``s`` starts there, whatever the wall clock did. The
real-time part of serving enters in exactly one place: an answer counts at its tick only
if it arrived within the tick's budget (otherwise it is adopted late, at the tick it
arrived, its past waypoints dropped, as a robot would). A runner that falls behind the wall
clock (a slow render) re-bases its schedule instead of bursting.

**Pairing.** Observation sequence numbers are ``seq_base + tick`` and the contract's noise
is keyed by the sequence number, so a policy in process and the same policy through vlad
compute bit-identical chunks from identical observations: two episodes on the same seed
differ only where serving changed something (a late answer, a hold, a guard intervention),
and :class:`EpisodeLog` records each of those per tick (:func:`vlad_tools.evaluation.compare`
pairs them).

**Chunk execution rule** (both links): ask for a chunk at the first tick, then whenever
``exec_steps`` waypoints of the current one have run; switch hard (no blending: what the
policy was trained and evaluated with); execute nothing stale; hold the measured pose when
no valid waypoint is left. The daemon's bridging holds are ignored while the current chunk is valid; any other
hold (e-stop, fallback, a refused or failed observation) is adopted. With ``follow``: a
streaming controller that asks with every observation and executes the newest chunk
addressed to it (what real-time chunking serves). Every observation reports the chunk and
waypoint executed (``exec``).

**The start.** The episode's clock starts once its first plan has come (the arm still
until then, the scene static): the policy's latency costs an episode its reactions, not its
start, and the plan is executed from the waypoint for the time since its observation. A
streaming controller announces the reset (``reanchor``) one period before its first
request, which confirms it; a controller that only asks announces it with that request
(:func:`_first_plan`). Before it, the link rests (:meth:`Link.rest`): answers about the
last episode still in flight are awaited and dropped, as a robot between tasks does.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from vlad.backend import Session
from vlad.client import UNREPORTED, ActionChunk, ChunkExecutor, Client
from vlad.contract import Contract
from vlad.processing import RawObservation, Tokenizer
from vlad.serving.counters import PolicyId
from vlad.serving.cycle import CycleFailure, run_cycle
from vlad.serving.policy import ServedPolicy
from vlad.serving.tracing import CycleTimes

__all__ = [
    "DaemonLink",
    "EpisodeLog",
    "Frame",
    "InProcessLink",
    "Link",
    "NoMotionLink",
    "Task",
    "contract_infer",
    "run_episode",
    "seq_base",
]


# What a controller executes as an observation reports it (vlad.client.Client.publish_observation).
Executing = tuple[int, int] | None


@dataclass(frozen=True)
class Frame:
    """What the controller sends for one tick (``images`` empty when not rendered)."""

    images: Mapping[str, np.ndarray]
    proprio: np.ndarray
    instruction: str


class Task(Protocol):
    """A simulated robot task the runner drives (e.g. :class:`vlad_tools.demo.sim.ReacherTask`)."""

    steps: int  # control periods per episode

    def reset(self, seed: int, instruction: str) -> object: ...
    def step(self, command: np.ndarray) -> object: ...
    def observe(self, render: bool) -> Frame: ...
    def hold(self) -> np.ndarray: ...
    def outcome(self) -> tuple[bool, float]: ...


@dataclass(frozen=True)
class SimTask:
    """A simulated task a plugin offers the gates (hook ``vlad_sim_tasks``).

    Both callables import the simulator only when called, so listing the tasks (e.g. on a
    robot without the simulator installed) imports nothing heavy.
    """

    name: str  # what a gate plan's ``closed_loop.task`` names
    instructions: Callable[[], tuple[str, ...]]  # the instructions its episodes cycle through
    make: Callable[[], Task]  # a fresh task, rendering off


class Link(Protocol):
    """How the runner reaches the policy (see module doc)."""

    realtime: bool  # True: the runner paces ticks against the wall clock
    streams: bool  # True: an observation every tick (the daemon sees a streaming controller)
    announces: bool  # True: it can send an observation that asks for nothing (a reset's announcement)

    def tick(self) -> None: ...  # once per control period (a heartbeat)
    def rest(self, period_ns: int) -> None: ...  # between episodes: answers in flight awaited, dropped
    def send(
        self, frame: Frame, seq: int, t_sensor_ns: int, *, reanchor: bool, wanted: bool, executing: Executing
    ) -> None: ...
    def receive(self, seq: int, deadline_ns: int) -> list[ActionChunk]: ...


START_WAIT_NS = 2_000_000_000  # the longest an episode waits for its first plan
START_SEQS = 64  # observation numbers after an episode's ticks: its reset and its wait


def seq_base(seed: int, steps: int) -> int:
    """First observation sequence number of the episode on ``seed``: disjoint per seed and
    increasing with it, so both links number (and so seed the noise of) every tick alike
    (the numbers after the ticks are its reset's and its wait's, :func:`_first_plan`)."""
    return 1 + seed * (steps + START_SEQS)


@dataclass
class EpisodeLog:
    """What one episode did, tick by tick where it matters for pairing."""

    seed: int
    instruction: str
    link: str
    success: bool = False
    final_distance: float = float("nan")
    commands: list[list[float]] = field(default_factory=list)  # executed command per tick
    trajectory: list[list[float]] = field(default_factory=list)  # measured joint positions: start, then per tick
    sources: list[str] = field(default_factory=list)  # where each tick's command came from
    chunks: list[int] = field(default_factory=list)  # obs_seq of the chunk each tick executed (-1: held)
    requests: int = 0
    answered_in_time: int = 0
    late: list[int] = field(default_factory=list)  # ticks whose request was not answered in budget
    held: int = 0  # ticks with no valid waypoint: the runner held the measured pose
    first_plan_ms: float = 0.0  # from the first request to the first plan (the episode started then)
    holds_adopted: Counter[str] = field(default_factory=Counter)
    holds_received: Counter[str] = field(default_factory=Counter)
    interventions: Counter[str] = field(default_factory=Counter)  # on the chunks that answered a request
    latencies_ms: list[float] = field(default_factory=list)  # sensor time -> answer received

    def seam_steps(self) -> list[float]:
        """The change of the executed command where a new chunk takes over (from the still arm
        at the start, and at every later switch of chunk), largest joint: what a seam made
        the arm do."""
        cmds = [self.trajectory[0], *self.commands]  # the start pose, then every tick's command
        chunks = [-2, *self.chunks]
        return [
            float(np.max(np.abs(np.subtract(cmds[t], cmds[t - 1]))))
            for t in range(1, len(cmds))
            if chunks[t] != chunks[t - 1] and chunks[t] != -1
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "instruction": self.instruction,
            "link": self.link,
            "success": self.success,
            "final_distance_m": self.final_distance,
            "requests": self.requests,
            "answered_in_time": self.answered_in_time,
            "late_ticks": self.late,
            "held_periods": self.held,
            "first_plan_ms": round(self.first_plan_ms, 1),
            "holds_adopted": dict(self.holds_adopted),
            "holds_received": dict(self.holds_received),
            "interventions": dict(self.interventions),
        }


def run_episode(
    task: Task,
    link: Link,
    seed: int,
    instruction: str,
    *,
    period_ns: int,
    chunk_length: int,
    exec_steps: int = 4,
    budget: float = 0.8,
    label: str = "",
    executor: Callable[[], ChunkExecutor] | None = None,
    wait: bool = True,
    follow: bool = False,
) -> EpisodeLog:
    """One episode of ``task`` on ``seed`` through ``link`` (see module doc).

    ``executor`` makes the episode's :class:`~vlad.client.ChunkExecutor` when the default
    rule (switch hard every ``exec_steps``) is not the one to measure (asynchronous execution
    with an earlier request threshold and blending); with ``wait=False`` the controller never
    waits for an answer inside a tick: it takes what has arrived (asynchronous execution).
    ``follow``: a streaming controller that asks with every observation and executes the
    newest chunk (what real-time chunking serves); it never waits inside a tick.
    """
    if not 1 <= exec_steps <= chunk_length:
        raise ValueError(f"exec_steps must be within 1..{chunk_length}")
    log = EpisodeLog(seed, instruction, label or type(link).__name__)
    if executor is not None:
        ex = executor()
    elif follow:
        ex = ChunkExecutor(request_threshold=chunk_length, overlap=0, blend="none", tolerance=0.0)
        wait = False
    else:
        # Ask again when exec_steps waypoints have run: chunk_length - exec_steps - 1 left after
        # the current one. An unanswered request is asked again at the next tick (its answer
        # still counts if it comes).
        ex = ChunkExecutor(
            request_threshold=chunk_length - exec_steps - 1,
            overlap=0,
            blend="none",
            tolerance=0.0,
            request_timeout_ns=period_ns,
        )
    link.rest(period_ns)
    task.reset(seed, instruction)
    log.trajectory.append([float(x) for x in task.hold()])
    base = seq_base(seed, task.steps)
    sim_t0 = period_ns  # the simulation's clock: tick t at sim_t0 + t * period (never 0)
    ticks: dict[int, int] = {}  # observation seq -> its tick
    requested: set[int] = set()
    wall0 = _first_plan(task, link, ex, log, base, ticks, requested, sim_t0, period_ns, follow)
    for tick in range(task.steps):
        now_sim = sim_t0 + tick * period_ns
        if link.realtime:
            wall0 = _pace(wall0, tick, period_ns)
        if tick > 0:  # tick 0's observation was the episode's first request
            link.tick()
            # First what arrived since the last tick (a late answer): it decides whether to ask.
            for chunk in link.receive(-1, time.monotonic_ns()):
                _offer(ex, log, chunk, -1, requested, ticks, now_sim, sim_t0, period_ns, follow)
            wanted = follow or ex.should_request(now_sim)
            seq = base + tick
            deadline = time.monotonic_ns()  # not waiting: what has arrived
            if wanted or link.streams:
                frame = task.observe(render=True)
                t_sensor = time.monotonic_ns()
                ticks[seq] = tick
                link.send(frame, seq, t_sensor, reanchor=False, wanted=wanted, executing=ex.report(now_sim))
                if wanted:
                    ex.request_sent(seq, now_sim)
                    requested.add(seq)
                    log.requests += 1
                    if wait:
                        deadline = t_sensor + int(budget * period_ns)
            for chunk in link.receive(seq if wanted and wait else -1, deadline):
                _offer(ex, log, chunk, seq if wanted else -1, requested, ticks, now_sim, sim_t0, period_ns, follow)
            if wanted and wait and (ex.current is None or ex.current.obs_seq != seq):
                log.late.append(tick)
        command = ex.step(now_sim)
        current = ex.current
        if command is None:
            command = task.hold()
            log.held += 1
            log.sources.append("held")
            log.chunks.append(-1)
        else:
            log.sources.append(current.source if current is not None else "?")
            log.chunks.append(current.obs_seq if current is not None else -1)
        log.commands.append([float(x) for x in command])
        task.step(np.asarray(command, dtype=np.float64))
        log.trajectory.append([float(x) for x in task.hold()])
    log.success, log.final_distance = task.outcome()
    return log


def _first_plan(
    task: Task,
    link: Link,
    ex: ChunkExecutor,
    log: EpisodeLog,
    base: int,
    ticks: dict[int, int],
    requested: set[int],
    sim_t0: int,
    period_ns: int,
    follow: bool,
) -> int:
    """The episode's first request, answered before its clock starts: a robot starts a task
    once its first plan has come, the arm still meanwhile (the scene does not move), so the
    policy's latency costs the episode its reactions, not its start. The start observations
    lie on the grid of periods the ticks continue: the clock starts at the first grid time
    after the plan came (a controller switches at its next tick), and the plan is executed from its
    waypoint for then (its first waypoints were the arm standing still). Returns that time
    (the wall clock of tick 0).

    A controller announces the reset's jump (``reanchor``) with an observation one period
    before its first request, which confirms it (vlad believes an announced jump once a later
    observation agrees, and then answers that one: the announcement's own answer is
    superseded; a reset that moved nothing is no jump, and its answer is a plan like any
    other). While it waits, a controller goes on heartbeating and, every period, asks
    again with a new observation of the still arm. One that can send nothing but requests
    (openpi's client) announces the reset with its first request."""
    announcing = link.realtime and link.announces
    extra = base + task.steps  # observation numbers after the ticks
    # Start observations on a grid of periods from the first one, as the ticks will be: the
    # plan's waypoints then map onto the ticks exactly.
    seen: dict[int, int] = {}  # start observation -> its sensor time
    grid0 = 0
    if announcing:
        frame = task.observe(render=True)  # (a renderer's first frame is slow: before the heartbeat)
        link.tick()
        grid0 = time.monotonic_ns()
        link.send(frame, extra, grid0, reanchor=True, wanted=False, executing=None)
        seen[extra] = grid0  # its answer is a plan too (vlad answers it when the reset moved nothing)
        requested.add(extra)
        extra += 1
        time.sleep(max(0, grid0 + period_ns - time.monotonic_ns()) / 1e9)
    frame = task.observe(render=True)
    seq, t_first = base, time.monotonic_ns()
    grid0 = grid0 or t_first
    link.send(frame, seq, t_first, reanchor=not announcing, wanted=True, executing=None)
    seen[seq] = t_first
    ex.request_sent(seq, sim_t0)
    requested.add(seq)
    log.requests += 1
    give_up = t_first + START_WAIT_NS
    wall0 = None
    while True:
        # the next grid time (grid points a slow render missed are skipped)
        step = grid0 + ((time.monotonic_ns() - grid0) // period_ns + 1) * period_ns if link.realtime else 0
        for chunk in link.receive(seq, min(step, give_up)):
            if wall0 is None and not chunk.is_hold and chunk.obs_seq in seen:
                # The clock starts at the first grid time after the plan came (a controller
                # switches at its next tick): every start observation lies that many periods
                # back, and the plan is executed from the waypoint for then.
                wall0 = grid0 + (-(-(chunk.t_receive_ns - grid0) // period_ns) * period_ns if link.realtime else 0)
                log.first_plan_ms = (chunk.t_receive_ns - t_first) / 1e6
                for s, t in seen.items():
                    ticks[s] = (t - wall0 + period_ns // 2) // period_ns
            _offer(ex, log, chunk, seq, requested, ticks, sim_t0, sim_t0, period_ns, follow)
        current = ex.current
        if current is not None and (not current.is_hold or not current.advisory):
            break  # a plan, or a binding hold (vlad cannot serve it)
        if not link.realtime or time.monotonic_ns() >= give_up:
            break
        link.tick()
        if extra < base + task.steps + START_SEQS:
            # Observing the still arm again, a request too (an answer may be lost: a stale
            # observation, one superseded, a refused one).
            frame = task.observe(render=True)
            seq = extra
            seen[seq] = time.monotonic_ns()
            link.send(frame, seq, seen[seq], reanchor=False, wanted=True, executing=None)
            requested.add(seq)
            log.requests += 1
            extra += 1
    if wall0 is None:  # no plan came (a binding hold, or given up): the episode starts now
        log.first_plan_ms = (time.monotonic_ns() - t_first) / 1e6
        return time.monotonic_ns()
    return wall0


def _pace(wall0: int, tick: int, period_ns: int) -> int:
    """Sleep until the tick's wall-clock time; re-base when more than a period behind."""
    due = wall0 + tick * period_ns
    now = time.monotonic_ns()
    if now - due > period_ns:
        return now - tick * period_ns  # fell behind (a slow render, a loaded machine): no burst
    if due > now:
        time.sleep((due - now) / 1e9)
    return wall0


def _offer(
    executor: ChunkExecutor,
    log: EpisodeLog,
    chunk: ActionChunk,
    wanted_seq: int,
    requested: set[int],
    ticks: dict[int, int],
    now_sim: int,
    sim_t0: int,
    period_ns: int,
    follow: bool = False,
) -> None:
    """Map ``chunk`` onto the simulation's clock and offer it when the rule says so."""
    if chunk.is_hold:
        log.holds_received[chunk.source] += 1
    elif chunk.obs_seq not in requested and not follow:
        return  # the answer to an observation nobody asked about (streaming): not executed
    tick = ticks.get(chunk.obs_seq)
    if tick is None:
        if not chunk.is_hold or chunk.obs_seq:
            return  # about an observation from before this episode (before its reset's re-anchor)
        t_sensor = now_sim  # a hold about no observation (e-stop, fallback): it starts now
    else:
        t_sensor = sim_t0 + tick * period_ns
    mapped = dataclasses.replace(
        chunk, t_sensor_ns=t_sensor, valid_until_ns=t_sensor + (chunk.valid_until_ns - chunk.t_sensor_ns)
    )
    if not chunk.is_hold:
        log.latencies_ms.append((chunk.t_receive_ns - chunk.t_sensor_ns) / 1e6)
        for kind in chunk.interventions:
            log.interventions[kind] += 1
        if chunk.obs_seq == wanted_seq:
            log.answered_in_time += 1
    if executor.offer(mapped, now_sim) and chunk.is_hold:
        log.holds_adopted[chunk.source] += 1


# -- links ------------------------------------------------------------------------------------


def contract_infer(
    contract: Contract, tokenizer: Tokenizer | None, session: Session
) -> Callable[[Frame, int], np.ndarray]:
    """``infer(frame, seq)`` for :class:`InProcessLink`: ``session`` through the release's own
    cycle (:func:`vlad.serving.cycle.run_cycle`, the serving thread's), the noise keyed by ``seq``."""
    policy = ServedPolicy(PolicyId("in-process", contract.model.id), contract, session, tokenizer)
    times = CycleTimes()

    def infer(frame: Frame, seq: int) -> np.ndarray:
        obs = RawObservation(frame.images, frame.proprio, frame.instruction, seq, time.monotonic_ns())
        return run_cycle(policy, obs, times, max_age=False).copy()

    return infer


def _link_shape(contract: Contract) -> dict[str, int]:
    """An in-process link's control period, validity and chunk shape, from the contract."""
    t, a = contract.timing, contract.action
    return {
        "period_ns": int(t.control_period_ms * 1e6),
        "validity_ns": int(t.action_validity_ms * 1e6),
        "chunk_length": a.chunk_length,
        "action_dim": a.dim,
    }


class InProcessLink:
    """The policy called in the runner's own process: ``infer(frame, seq) -> actions``
    (e.g. :func:`contract_infer`); a :class:`~vlad.serving.cycle.CycleFailure` is a hold."""

    realtime = False
    streams = False
    announces = False

    def __init__(
        self,
        infer: Callable[[Frame, int], np.ndarray],
        period_ns: int,
        validity_ns: int,
        *,
        chunk_length: int,
        action_dim: int,
    ) -> None:
        self.infer = infer
        self.period_ns = period_ns
        self.validity_ns = validity_ns
        self.chunk_length = chunk_length
        self.action_dim = action_dim
        self._answer: ActionChunk | None = None

    def tick(self) -> None:
        pass

    def rest(self, period_ns: int) -> None:
        self._answer = None

    @classmethod
    def for_contract(cls, contract: Contract, infer: Callable[[Frame, int], np.ndarray]) -> InProcessLink:
        """A link with the contract's control period, validity and chunk shape."""
        return cls(infer, **_link_shape(contract))

    def send(
        self,
        frame: Frame,
        seq: int,
        t_sensor_ns: int,
        *,
        reanchor: bool,
        wanted: bool,
        executing: Executing = UNREPORTED,
    ) -> None:
        if not wanted:
            return
        source, rejection, advisory = "release", None, False
        try:
            actions = np.asarray(self.infer(frame, seq), dtype=np.float32)
        except CycleFailure as exc:  # what vlad answers too: a hold of where the arm is
            rejection, advisory, source = exc.rejection, exc.input_fault, exc.hold.source
            actions = np.repeat(np.asarray(frame.proprio[: self.action_dim], np.float32)[None], self.chunk_length, 0)
        now = time.monotonic_ns()
        self._answer = ActionChunk(
            seq=seq, obs_seq=seq, t_sensor_ns=t_sensor_ns, t_issue_ns=now,
            valid_until_ns=t_sensor_ns + self.validity_ns, period_ns=self.period_ns, release="in-process",
            state="ACTIVE", source=source, interventions=(), timings_ms={}, actions=actions, t_receive_ns=now,
            rejection=rejection, advisory=advisory,
        )  # fmt: skip

    def receive(self, seq: int, deadline_ns: int) -> list[ActionChunk]:
        answer, self._answer = self._answer, None
        return [answer] if answer is not None else []


class NoMotionLink(InProcessLink):
    """The no-motion baseline: every chunk holds the joint positions the episode started in
    (the first observation of an episode is the one that announces the re-anchor)."""

    def __init__(self, contract: Contract) -> None:
        super().__init__(self._hold, **_link_shape(contract))
        self._start = np.zeros(self.action_dim, np.float32)

    def send(
        self,
        frame: Frame,
        seq: int,
        t_sensor_ns: int,
        *,
        reanchor: bool,
        wanted: bool,
        executing: Executing = UNREPORTED,
    ) -> None:
        if reanchor:
            self._start = np.asarray(frame.proprio[: self.action_dim], np.float32)
        super().send(frame, seq, t_sensor_ns, reanchor=reanchor, wanted=wanted)

    def _hold(self, frame: Frame, seq: int) -> np.ndarray:
        return np.tile(self._start, (self.chunk_length, 1))


class DaemonLink:
    """A controller on the daemon's sockets (see module doc): a heartbeat every period, and an
    observation every period (``streams``, the default) or only when it asks for a chunk
    (``streams=False``: openpi's action chunk broker's cadence, declared as ``request``)."""

    realtime = True
    announces = True

    def __init__(self, client: Client, *, streams: bool = True) -> None:
        self.client = client
        self.streams = streams
        self._cadence = "stream" if streams else "request"
        self._latency_ns = 0  # the longest sensor-to-receive time of recent chunks

    def tick(self) -> None:
        self.client.heartbeat(self._cadence)

    def rest(self, period_ns: int) -> None:
        """Between tasks: no observation, a heartbeat every period declaring the ``request``
        cadence (the silence is no stalled sensor), until the answers still in flight have
        come and been dropped (a chunk about the last task's arm is none to execute in the
        next one): until nothing came for 1.5 latencies and 3 periods, at most 2 s."""
        quiet_ns = int(1.5 * self._latency_ns + 3 * period_ns)
        last = beat = time.monotonic_ns()
        give_up = last + 2_000_000_000
        self.client.heartbeat("request")
        while (now := time.monotonic_ns()) - last < quiet_ns and now < give_up:
            if now - beat >= period_ns:  # every period, however many chunks come meanwhile
                self.client.heartbeat("request")
                beat = now
            if self.client.recv_chunk(timeout_ms=max(0, beat + period_ns - now) / 1e6) is not None:
                last = time.monotonic_ns()

    def send(
        self,
        frame: Frame,
        seq: int,
        t_sensor_ns: int,
        *,
        reanchor: bool,
        wanted: bool,
        executing: Executing = UNREPORTED,
    ) -> None:
        self.client.publish_observation(
            frame.images,
            frame.proprio,
            frame.instruction,
            seq=seq,
            t_sensor_ns=t_sensor_ns,
            reanchor=reanchor,
            executing=executing,
        )

    def receive(self, seq: int, deadline_ns: int) -> list[ActionChunk]:
        """Every chunk for this controller until the policy's answer to ``seq`` (or the
        deadline); then what is queued."""
        out = []
        name = self.client.name
        while (left := deadline_ns - time.monotonic_ns()) > 0:
            chunk = self.client.recv_chunk(timeout_ms=left / 1e6)
            if chunk is None:
                break
            if not chunk.for_client(name):
                continue
            out.append(chunk)
            if chunk.obs_seq == seq and not chunk.is_hold:
                break
        while (chunk := self.client.recv_chunk(timeout_ms=0)) is not None:
            if chunk.for_client(name):
                out.append(chunk)
        for chunk in out:
            if not chunk.is_hold:
                self._latency_ns = max(int(0.9 * self._latency_ns), chunk.t_receive_ns - chunk.t_sensor_ns)
        return out
