"""A robot controller for the gates, speaking the wire protocol on the daemon's sockets.

It owns its own ZeroMQ sockets (PUB observations and heartbeats, SUB action chunks) and
encodes and decodes messages with :mod:`vlad.protocol`, so it sees exactly the frames it
sends and receives: with a :class:`~vlad.gates.recording.McapRecorder` attached it is the
controller-side tap that records what the daemon receives and publishes (the daemon-side
hook records the same frames from inside).

:func:`run_episode` is one real-time episode of the simulated arm through the daemon,
exactly like ``vlad.demo.run``: publish, heartbeat, take the newest fresh chunk, commit to
it for ``exec_steps`` periods, hold when nothing valid is left.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from vlad import protocol


@dataclass(frozen=True)
class Chunk:
    """One action chunk as received; ``t_receive_ns`` is this controller's clock."""

    seq: int
    obs_seq: int
    t_sensor_ns: int
    valid_until_ns: int
    period_ns: int
    source: str
    interventions: tuple[str, ...]
    timings_ms: Mapping[str, float]
    actions: np.ndarray
    t_receive_ns: int

    @property
    def is_hold(self) -> bool:
        """A hold posture (bridge, fallback, e-stop, backend error), not a policy output."""
        return self.source.startswith("hold")

    def action_at(self, now_ns: int) -> np.ndarray | None:
        """The waypoint for ``now_ns`` (waypoint k covers the (k+1)-th period after the
        sensor time); None once stale or past the chunk's end."""
        if now_ns > self.valid_until_ns:
            return None
        k = max(0, (now_ns - self.t_sensor_ns) // self.period_ns) if self.period_ns else 0
        return self.actions[k] if k < len(self.actions) else None


class Controller:
    """Publishes observations and heartbeats, receives chunks, optionally recording both."""

    def __init__(self, endpoints: Mapping[str, str], name: str = "vlad-gate", recorder: Any = None) -> None:
        self.endpoints = dict(endpoints)
        self.name = name
        self.recorder = recorder
        self._ctx = zmq.Context()
        self._obs = self._ctx.socket(zmq.PUB)
        self._obs.setsockopt(zmq.LINGER, 0)
        self._obs.setsockopt(zmq.SNDHWM, 64)
        # Reconnect fast: the cold-start measurement connects before the daemon has bound.
        self._obs.setsockopt(zmq.RECONNECT_IVL, 10)
        self._obs.connect(self.endpoints["observations"])
        self._act = self._ctx.socket(zmq.SUB)
        self._act.setsockopt(zmq.LINGER, 0)
        self._act.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_ACTIONS)
        self._act.setsockopt(zmq.RECONNECT_IVL, 10)
        self._act.connect(self.endpoints["actions"])
        self._seq = 0

    def publish(
        self,
        images: Mapping[str, np.ndarray],
        proprio: np.ndarray | None,
        instruction: str | None,
        t_sensor_ns: int | None = None,
    ) -> int:
        """Send one observation (sensor time: now unless given); returns its sequence number."""
        self._seq += 1
        header: dict[str, Any] = {
            "seq": self._seq,
            "t_sensor_ns": t_sensor_ns or time.monotonic_ns(),
            "client": self.name,
        }
        if instruction is not None:
            header["instruction"] = instruction
        tensors = {f"image/{k}": v for k, v in images.items()}
        if proprio is not None:
            tensors["proprio"] = np.asarray(proprio, dtype=np.float32)
        frames = protocol.encode(protocol.TOPIC_OBS, header, tensors)
        if self.recorder is not None:
            self.recorder.observation(frames, time.monotonic_ns())
        self._obs.send_multipart(frames)
        return self._seq

    def heartbeat(self) -> None:
        """Tell the daemon this controller is alive (it falls back to holding otherwise)."""
        self._seq += 1
        self._obs.send_multipart(
            protocol.encode(
                protocol.TOPIC_HEARTBEAT, {"seq": self._seq, "t_ns": time.monotonic_ns(), "client": self.name}
            )
        )

    def recv(self, timeout_ms: float) -> Chunk | None:
        """The next chunk within ``timeout_ms`` (not skipping any), or None."""
        if not self._act.poll(max(0, int(timeout_ms))):
            return None
        frames = self._act.recv_multipart()
        t = time.monotonic_ns()
        if self.recorder is not None:
            self.recorder.actions(frames, t)
        msg = protocol.decode(frames, expect=(protocol.TOPIC_ACTIONS,))
        h = msg.header
        return Chunk(
            seq=h["seq"],
            obs_seq=h["obs_seq"],
            t_sensor_ns=h["t_sensor_ns"],
            valid_until_ns=h["valid_until_ns"],
            period_ns=h["period_ns"],
            source=h.get("source", ""),
            interventions=tuple(h.get("interventions", ())),
            timings_ms=h.get("timings_ms", {}),
            actions=msg.tensors["actions"],
            t_receive_ns=t,
        )

    def recv_until(self, deadline_ns: int) -> list[Chunk]:
        """Every chunk arriving before ``deadline_ns`` (monotonic), in order."""
        out = []
        while (left := deadline_ns - time.monotonic_ns()) > 0:
            chunk = self.recv(left / 1e6)
            if chunk is None:
                break
            out.append(chunk)
        while (chunk := self.recv(0)) is not None:
            out.append(chunk)
        return out

    def status(self, timeout_ms: int = 3000) -> dict[str, Any]:
        """The daemon's status (control socket); recorded as state when recording."""
        from vlad.client import control_request

        st = control_request(self._ctx, self.endpoints["control"], "status", timeout_ms)
        if self.recorder is not None:
            self.recorder.state(st)
        return st

    def close(self) -> None:
        for s in (self._obs, self._act):
            s.close(0)
        self._ctx.term()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class EpisodeLog:
    """What one real-time episode did, for success rates and safety events."""

    seed: int
    instruction: str
    success: bool = False
    final_distance: float = float("nan")
    latencies_ms: list[float] = field(default_factory=list)
    held_periods: int = 0
    chunks: int = 0
    holds: dict[str, int] = field(default_factory=dict)
    interventions: dict[str, int] = field(default_factory=dict)
    trajectory: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "instruction": self.instruction,
            "success": self.success,
            "final_distance_m": self.final_distance,
            "held_periods": self.held_periods,
            "chunks": self.chunks,
            "holds": self.holds,
            "interventions": self.interventions,
        }


def run_episode(
    ctl: Controller,
    task: Any,
    seed: int,
    instruction: str,
    period_ns: int,
    exec_steps: int = 4,
    steps: int | None = None,
    camera: str = "overhead",
) -> EpisodeLog:
    """One real-time episode of ``task`` (a :class:`vlad.demo.sim.ReacherTask`) through the daemon.

    Every period: publish the frame and joint state, send a heartbeat, wait for this
    observation's chunk until 80 % of the period, switch to the newest chunk once the
    current one has run ``exec_steps`` periods (or is stale), execute the waypoint for
    now, or hold the measured position when nothing valid is left.
    """
    from vlad.demo import sim

    log = EpisodeLog(seed, instruction)
    obs = task.reset(seed, instruction)
    chunk: Chunk | None = None
    first_seq = None
    next_tick = time.monotonic_ns()
    for _ in range(steps or sim.EPISODE_STEPS):
        t_sensor = time.monotonic_ns()
        seq = ctl.publish({camera: obs.image}, obs.proprio, instruction, t_sensor)
        first_seq = seq if first_seq is None else first_seq
        ctl.heartbeat()
        newest = None
        for c in _await(ctl, seq, next_tick + int(period_ns * 0.8)):
            log.chunks += 1
            for kind in c.interventions:
                log.interventions[kind] = log.interventions.get(kind, 0) + 1
            if c.is_hold:
                log.holds[c.source] = log.holds.get(c.source, 0) + 1
            elif c.obs_seq == seq:
                log.latencies_ms.append((c.t_receive_ns - c.t_sensor_ns) / 1e6)
            # A chunk computed before the reset (a hold of the old pose) is never executed:
            # the daemon re-anchors on the reset arm after a few consistent observations.
            if c.obs_seq >= first_seq:
                newest = c
        now = time.monotonic_ns()
        if newest is not None and (
            chunk is None or now > chunk.valid_until_ns or (now - chunk.t_sensor_ns) // period_ns >= exec_steps
        ):
            chunk = newest
        command = chunk.action_at(now) if chunk is not None else None
        if command is None:  # nothing valid to execute: hold where the arm is
            command, log.held_periods = obs.proprio[:2], log.held_periods + 1
        obs = task.step(np.asarray(command, dtype=np.float64))
        log.trajectory.append([float(x) for x in obs.proprio[:2]])
        next_tick += period_ns
        time.sleep(max(0.0, (next_tick - time.monotonic_ns()) / 1e9))
    log.final_distance = task.distance()
    log.success = bool(log.final_distance < sim.SUCCESS_RADIUS)
    return log


def _await(ctl: Controller, seq: int, deadline_ns: int) -> list[Chunk]:
    """Chunks until the one answering ``seq`` arrived (or ``deadline_ns`` passed)."""
    got: list[Chunk] = []
    while (left := deadline_ns - time.monotonic_ns()) > 0:
        c = ctl.recv(left / 1e6)
        if c is None:
            break
        got.append(c)
        if c.obs_seq >= seq and not c.is_hold:
            break
    return got
