"""The one episode runner: a simulated task driven through :class:`~vlad.client.ChunkExecutor`,
its policy called in process or served by vlad.

Every closed-loop figure vlad reports comes from :func:`run_episode`: the demo, the
closed-loop gate, the in-process evaluation of a trained policy and the benchmarks. Only the
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
and :class:`EpisodeLog` records each of those per tick.

**Chunk execution rule** (both links): ask for a chunk at the first tick, then whenever
``exec_steps`` waypoints of the current one have run; switch hard (no blending: what the
policy was trained and evaluated with); execute nothing stale; hold the measured pose when
no valid waypoint is left (before the first chunk comes, too: the arm waits for its first
plan). The daemon's bridging holds are ignored while the current chunk is valid; any other
hold (e-stop, fallback, a refused or failed observation) is adopted. With ``follow``: a
streaming controller that asks with every observation and executes the newest chunk
addressed to it (what real-time chunking serves). Every observation reports the chunk and
waypoint executed (``exec``).

**The reset.** A streaming controller announces each episode's reset (``reanchor``) one
period before the first tick (the reset settles): the first tick's observation confirms it,
and is answered like any other. A controller that only asks announces it with its first
request.
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
    "compare",
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
    """A simulated robot task the runner drives (e.g. :class:`vlad.demo.sim.ReacherTask`)."""

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

    def tick(self) -> None: ...  # once per control period (a heartbeat)
    def send(
        self, frame: Frame, seq: int, t_sensor_ns: int, *, reanchor: bool, wanted: bool, executing: Executing
    ) -> None: ...
    def receive(self, seq: int, deadline_ns: int) -> list[ActionChunk]: ...


def seq_base(seed: int, steps: int) -> int:
    """First observation sequence number of the episode on ``seed``: disjoint per seed and
    increasing with it, so both links number (and so seed the noise of) every tick alike
    (the number after the ticks is the reset's announcement, :func:`_announce`)."""
    return 1 + seed * (steps + 1)


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
    first_chunk_tick: int = -1  # the first tick a policy chunk was executed (-1: none)
    holds_adopted: Counter[str] = field(default_factory=Counter)
    holds_received: Counter[str] = field(default_factory=Counter)
    interventions: Counter[str] = field(default_factory=Counter)  # on the chunks that answered a request
    latencies_ms: list[float] = field(default_factory=list)  # sensor time -> answer received

    @property
    def waited(self) -> int:
        """Ticks before the first policy chunk came: the first plan's latency (the arm still)."""
        return self.first_chunk_tick if self.first_chunk_tick >= 0 else len(self.sources)

    @property
    def idle(self) -> int:
        """Ticks with no valid waypoint once the first policy chunk had come (the runner held)."""
        return sum(src == "held" for src in self.sources[self.waited :])

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
            "first_chunk_tick": self.first_chunk_tick,
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
    task.reset(seed, instruction)
    log.trajectory.append([float(x) for x in task.hold()])
    base = seq_base(seed, task.steps)
    sim_t0 = period_ns  # the simulation's clock: tick t at sim_t0 + t * period (never 0)
    ticks: dict[int, int] = {}  # observation seq -> its tick
    requested: set[int] = set()
    streaming = link.realtime and link.streams
    if streaming:
        ticks[base + task.steps] = -1  # the period before the first tick
        _announce(task, link, base + task.steps, period_ns)
    wall0 = time.monotonic_ns()
    for tick in range(task.steps):
        now_sim = sim_t0 + tick * period_ns
        if link.realtime:
            wall0 = _pace(wall0, tick, period_ns)
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
            # A controller that only asks announces the reset's jump with its first request.
            reanchor = tick == 0 and not streaming
            link.send(frame, seq, t_sensor, reanchor=reanchor, wanted=wanted, executing=ex.report(now_sim))
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
            if log.first_chunk_tick < 0 and current is not None and not current.is_hold:
                log.first_chunk_tick = tick
            log.sources.append(current.source if current is not None else "?")
            log.chunks.append(current.obs_seq if current is not None else -1)
        log.commands.append([float(x) for x in command])
        task.step(np.asarray(command, dtype=np.float64))
        log.trajectory.append([float(x) for x in task.hold()])
    log.success, log.final_distance = task.outcome()
    return log


def _announce(task: Task, link: Link, seq: int, period_ns: int) -> None:
    """The reset settles for one period: a streaming controller observes the still arm and
    announces the jump (``reanchor``) one period before the episode's first tick, whose own
    observation then confirms it (vlad believes an announced jump once a later observation
    agrees), so the first tick is answered like any other."""
    link.tick()
    link.send(task.observe(render=True), seq, time.monotonic_ns(), reanchor=True, wanted=False, executing=None)
    time.sleep(period_ns / 1e9)


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
        if not chunk.is_hold:
            return  # from before this episode
        t_sensor = now_sim  # a hold about no observation of this episode: it starts now
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


class InProcessLink:
    """The policy called in the runner's own process: ``infer(frame, seq) -> actions``
    (e.g. :func:`contract_infer`); a :class:`~vlad.serving.cycle.CycleFailure` is a hold."""

    realtime = False
    streams = False

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

    @classmethod
    def for_contract(cls, contract: Contract, infer: Callable[[Frame, int], np.ndarray]) -> InProcessLink:
        """A link with the contract's control period, validity and chunk shape."""
        t, a = contract.timing, contract.action
        return cls(
            infer,
            int(t.control_period_ms * 1e6),
            int(t.action_validity_ms * 1e6),
            chunk_length=a.chunk_length,
            action_dim=a.dim,
        )

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
        source, reason, advisory = "release", "", False
        try:
            actions = np.asarray(self.infer(frame, seq), dtype=np.float32)
        except CycleFailure as exc:  # what vlad answers too: a hold of where the arm is
            reason, advisory = exc.reason, exc.input_fault
            source = "hold:" + ("stale" if reason == "stale" else "rejected" if advisory else reason)
            actions = np.repeat(np.asarray(frame.proprio[: self.action_dim], np.float32)[None], self.chunk_length, 0)
        now = time.monotonic_ns()
        self._answer = ActionChunk(
            seq=seq, obs_seq=seq, t_sensor_ns=t_sensor_ns, t_issue_ns=now,
            valid_until_ns=t_sensor_ns + self.validity_ns, period_ns=self.period_ns, release="in-process",
            state="ACTIVE", source=source, interventions=(), timings_ms={}, actions=actions, t_receive_ns=now,
            reason=reason, advisory=advisory,
        )  # fmt: skip

    def receive(self, seq: int, deadline_ns: int) -> list[ActionChunk]:
        answer, self._answer = self._answer, None
        return [answer] if answer is not None else []


class NoMotionLink(InProcessLink):
    """The no-motion baseline: every chunk holds the joint positions the episode started in
    (the first observation of an episode is the one that announces the re-anchor)."""

    def __init__(self, period_ns: int, validity_ns: int, *, chunk_length: int, action_dim: int) -> None:
        super().__init__(self._hold, period_ns, validity_ns, chunk_length=chunk_length, action_dim=action_dim)
        self._start = np.zeros(action_dim, np.float32)

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

    def __init__(self, client: Client, *, streams: bool = True) -> None:
        self.client = client
        self.streams = streams
        self._cadence = "stream" if streams else "request"

    def tick(self) -> None:
        self.client.heartbeat(self._cadence)

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
        return out


# -- pairing ----------------------------------------------------------------------------------


def compare(reference: EpisodeLog, other: EpisodeLog, atol: float = 1e-6) -> dict[str, Any]:
    """How ``other`` (through vlad) differs from ``reference`` (in process) on the same seed:
    the first tick whose command differs and what ``other`` did there."""
    first = None
    for tick, (a, b) in enumerate(zip(reference.commands, other.commands, strict=False)):
        if not np.allclose(a, b, atol=atol, rtol=0):
            first = tick
            break
    why = None
    if first is not None:
        src = other.sources[first]
        if first in other.late:
            why = "late answer"
        elif src.startswith("hold"):
            why = src
        elif src == "held":
            why = "nothing valid (held)"
        elif other.interventions:
            why = "guard: " + ",".join(sorted(other.interventions))
        else:
            why = f"different chunk ({src})"
    return {
        "seed": reference.seed,
        "instruction": reference.instruction,
        "reference": reference.success,
        "other": other.success,
        "flipped": reference.success != other.success,
        "first_divergence": first,
        "why": why,
    }
