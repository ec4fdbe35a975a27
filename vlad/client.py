"""``vlad.client``: what a robot controller needs to talk to vlad, in a few lines.

    from vlad.client import Client

    with Client.from_config("etc/vlad/vlad.toml") as c:
        c.publish_observation({"overhead": rgb}, proprio=q, instruction="reach the red target")
        chunk = c.recv_actions(timeout_ms=100)        # newest fresh chunk, or None
        if chunk is not None:
            command = chunk.action_at(time.monotonic_ns())  # None once past valid_until
        c.heartbeat()
        print(c.status()["state"])

Timestamps are ``CLOCK_MONOTONIC`` nanoseconds (``time.monotonic_ns()``) of the host
vlad runs on; see ``docs/protocol.md``.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np
import zmq

from vlad import protocol
from vlad.errors import ClientError, DaemonUnreachable
from vlad.protocol import ActionChunk, ProtocolError

if TYPE_CHECKING:
    from vlad.snapshot import StatusSnapshot

_F32 = np.dtype(np.float32)

__all__ = [
    "UNREPORTED",
    "ActionChunk",
    "ChunkExecutor",
    "Client",
    "ClientError",
    "DaemonUnreachable",
    "control_request",
]

UNREPORTED = (-1, -1)  # publish_observation without an ``exec`` report


class Client:
    def __init__(
        self,
        *,
        observations: str,
        actions: str,
        status: str | None = None,
        control: str | None = None,
        name: str = "controller",
        curve: tuple[str, str] | None = None,
        send_hwm: int = 4,
        reconnect_ms: int | None = None,
    ) -> None:
        """``curve``: (this client's secret key file, the server's public key file) for
        tcp:// endpoints, which vlad serves only with CurveZMQ.

        ``send_hwm``: observations queued at most while the link is slow (a controller wants
        few: never old observations behind a slow link; a measurement of bursts wants every
        one sent). ``reconnect_ms``: ZeroMQ's reconnect interval (default 100 ms), shorter to
        connect the moment a daemon that is still starting binds (the gates' cold start)."""
        self.name = name
        self.endpoints = {"observations": observations, "actions": actions, "status": status, "control": control}
        self._curve = load_curve(curve) if curve else None
        for endpoint in (observations, actions):  # refuse tcp without keys before opening anything
            apply_curve(None, endpoint, self._curve)
        self._ctx = zmq.Context()
        self._obs = self._ctx.socket(zmq.PUB)
        self._obs.setsockopt(zmq.LINGER, 0)
        self._obs.setsockopt(zmq.SNDHWM, send_hwm)
        self._act = self._ctx.socket(zmq.SUB)
        self._act.setsockopt(zmq.LINGER, 0)
        self._act.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_ACTIONS)
        if reconnect_ms is not None:
            for sock in (self._obs, self._act):
                sock.setsockopt(zmq.RECONNECT_IVL, reconnect_ms)
        self._connect(self._obs, observations)
        self._connect(self._act, actions)
        self._act_poll = [(self._act, zmq.POLLIN)]
        self._status: zmq.Socket | None = None
        self._seq = itertools.count(1)
        self.dropped_stale = 0
        # The tensors of this controller's observations and of the daemon's chunks, learned
        # from the first of each: later ones skip the per-tensor work (protocol.Layout).
        self._obs_layout: protocol.Layout | None = None
        self._act_layout: protocol.Layout | None = None
        # A recorder of what this controller sends and receives: any object with
        # observation(frames, t_ns) and actions(frames, t_ns) (vlad_tools.gates.recording.McapRecorder).
        self.tap: Any = None

    @classmethod
    def from_config(cls, config: str | Path | Any, name: str = "controller") -> Client:
        """Endpoints from a daemon config file (or a loaded :class:`vlad.config.Config`)."""
        from vlad.config import Config, load_config

        cfg = config if isinstance(config, Config) else load_config(config)
        s = cfg.sockets
        return cls(observations=s.observations, actions=s.actions, status=s.status, control=s.control, name=name)

    # -- sending ---------------------------------------------------------------------------

    def publish_observation(
        self,
        images: Mapping[str, np.ndarray],
        proprio: np.ndarray | None = None,
        instruction: str | None = None,
        *,
        seq: int | None = None,
        t_sensor_ns: int | None = None,
        reanchor: bool = False,
        executing: tuple[int, int] | None | ChunkExecutor = UNREPORTED,
    ) -> int:
        """Send one observation; ``t_sensor_ns`` should be the capture time (default: now).

        ``reanchor``: the joint state jumped on purpose since the last observation (an
        episode reset, homing, the arm moved by hand while the controller was paused):
        vlad believes it once the next observation confirms it, and the policy's chunk for
        this one goes out then (docs/protocol.md, "Joint states are judged, not believed").
        ``executing``: what the controller executes at ``t_sensor_ns``, reported as ``exec``:
        ``(chunk seq, waypoint index)``, None for nothing (holding its pose), or the
        :class:`ChunkExecutor` that executes the chunks (it says which); real-time chunking
        and the guard's seams continue it (docs/protocol.md, ``exec``).
        """
        seq = next(self._seq) if seq is None else seq
        t_sensor = t_sensor_ns or time.monotonic_ns()
        header: dict[str, Any] = {"seq": seq, "t_sensor_ns": t_sensor, "client": self.name}
        if instruction is not None:
            header["instruction"] = instruction
        if reanchor:
            header["reanchor"] = True
        if isinstance(executing, ChunkExecutor):
            executing = executing.report(t_sensor)
        if executing is None:
            header["exec"] = None
        elif executing != UNREPORTED:
            header["exec"] = list(executing)
        names = [f"image/{name}" for name in images]
        arrays = list(images.values())
        if proprio is not None:
            names.append("proprio")
            arrays.append(
                proprio if type(proprio) is np.ndarray and proprio.dtype is _F32 else np.asarray(proprio, _F32)
            )
        layout = self._obs_layout
        if layout is None or list(layout.names) != names:
            frames = protocol.encode(protocol.TOPIC_OBS, header, dict(zip(names, arrays, strict=True)))
            try:
                self._obs_layout = protocol.Layout(
                    [(n, a.dtype.name, a.shape) for n, a in zip(names, arrays, strict=True)]
                )
            except ProtocolError:  # sent as it is; the daemon says what it thinks of it
                self._obs_layout = None
        else:
            frames = layout.encode(protocol.TOPIC_OBS, header, arrays)  # generic when shapes changed
        if self.tap is not None:
            self.tap.observation([bytes(f) for f in frames], time.monotonic_ns())
        # pyzmq's zero-copy sends cost more than a copy below ~64 KiB (per its docs).
        self._obs.send_multipart(frames, copy=sum(len(f) for f in frames) < 65536)
        return seq

    def heartbeat(self, cadence: str | None = None, *, bye: bool = False) -> None:
        """Tell vlad this controller is alive (send one every control period: docs/health.md).

        ``cadence``: ``"stream"`` (an observation every period, the default) or ``"request"``
        (an observation only when it needs a new chunk: silence between requests is then not
        a stalled sensor). ``bye``: this controller leaves on purpose (its silence from now
        on is no fault); :meth:`close` sends it."""
        header: dict[str, Any] = {"seq": next(self._seq), "t_ns": time.monotonic_ns(), "client": self.name}
        if cadence is not None:
            header["cadence"] = cadence
        if bye:
            header["bye"] = True
        self._obs.send_multipart(protocol.encode(protocol.TOPIC_HEARTBEAT, header))

    def send_raw(self, frames: list[bytes]) -> None:
        """Send arbitrary frames on the observation socket (for tests and tools)."""
        self._obs.send_multipart(frames)

    # -- receiving -------------------------------------------------------------------------

    def recv_actions(self, timeout_ms: int = 100, drop_stale: bool = True) -> ActionChunk | None:
        """The newest action chunk for this controller (:meth:`ActionChunk.for_client`) that
        arrived within ``timeout_ms`` (older ones are skipped).

        With ``drop_stale`` a chunk already past ``valid_until`` is dropped and counted in
        :attr:`dropped_stale`, and waiting goes on until the timeout.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        newest: ActionChunk | None = None
        sock = self._act
        while True:
            if newest is not None:
                # Another one queued? (asking the socket: cheaper than a poll, which pyzmq
                # builds a Poller for on every call)
                if not int(sock.get(zmq.EVENTS)) & zmq.POLLIN:
                    return newest
            elif not zmq.zmq_poll(self._act_poll, max(0, int((deadline - time.monotonic()) * 1000))):
                if time.monotonic() >= deadline:
                    return None
                continue
            frames = sock.recv_multipart()
            if self.tap is not None:
                self.tap.actions(frames, time.monotonic_ns())
            chunk = self._decode_actions(frames, self)
            if not chunk.for_client(self.name):
                continue
            if drop_stale and chunk.is_stale():
                self.dropped_stale += 1
                continue
            newest = chunk

    def recv_chunk(self, timeout_ms: float = 100) -> ActionChunk | None:
        """The next action chunk within ``timeout_ms``, none skipped, stale ones included
        (for controllers that look at every chunk, e.g. :mod:`vlad_tools.episodes`)."""
        if not zmq.zmq_poll(self._act_poll, max(0, math.ceil(timeout_ms))):
            return None
        frames = self._act.recv_multipart()
        if self.tap is not None:
            self.tap.actions(frames, time.monotonic_ns())
        return self._decode_actions(frames, self)

    def recv_until(self, deadline_ns: int) -> list[ActionChunk]:
        """Every chunk arriving before ``deadline_ns`` (monotonic) and any already queued then,
        in order, none skipped (for measurements that judge every chunk)."""
        out = []
        while (left := deadline_ns - time.monotonic_ns()) > 0:
            chunk = self.recv_chunk(left / 1e6)
            if chunk is None:
                break
            out.append(chunk)
        while (chunk := self.recv_chunk(0)) is not None:
            out.append(chunk)
        return out

    @staticmethod
    def _decode_actions(frames: list[bytes], learn: Client | None = None) -> ActionChunk:
        t = time.monotonic_ns()
        layout = learn._act_layout if learn is not None else None
        msg = protocol.decode(frames, expect=(protocol.TOPIC_ACTIONS,), layout=layout)
        if learn is not None and msg.layout is None and msg.tensors:
            learn._act_layout = protocol.Layout.of(msg)
        return protocol.decode_chunk(msg, t)

    def recv_status(self, timeout_ms: int = 2000) -> dict[str, Any] | None:
        """The next status broadcast (the daemon publishes at >= 1 Hz)."""
        if self._status is None:
            if not self.endpoints["status"]:
                raise ClientError("no status endpoint configured")
            self._status = self._ctx.socket(zmq.SUB)
            self._status.setsockopt(zmq.LINGER, 0)
            self._status.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_STATUS)
            self._connect(self._status, self.endpoints["status"])
        if not self._status.poll(timeout_ms):
            return None
        return protocol.decode(self._status.recv_multipart(), expect=(protocol.TOPIC_STATUS,)).header["status"]

    # -- control ---------------------------------------------------------------------------

    def control(self, cmd: str, timeout_ms: int = 2000, **args: Any) -> Any:
        """One control request; a fresh REQ socket each time, so a lost reply never wedges us."""
        return control_request(self._ctx, self.endpoints["control"], cmd, timeout_ms, curve=self._curve, **args)

    def status(self, timeout_ms: int = 2000) -> dict[str, Any]:
        """The daemon's status as the wire map (docs/protocol.md); :meth:`snapshot` types it."""
        return self.control("status", timeout_ms)

    def snapshot(self, timeout_ms: int = 2000) -> StatusSnapshot:
        """The daemon's status, typed; raises :class:`~vlad.snapshot.StatusUnreadable` (one
        line) when it is not a status this version of vlad reads."""
        from vlad.snapshot import parse_status

        return parse_status(self.status(timeout_ms))

    def _connect(self, sock: zmq.Socket, endpoint: str) -> None:
        apply_curve(sock, endpoint, self._curve)
        sock.connect(endpoint)

    def close(self, bye: bool = True) -> None:
        """Close the sockets; with ``bye`` first tell vlad this controller leaves on purpose."""
        if bye:
            try:
                self.heartbeat(bye=True)
                self._obs.setsockopt(zmq.LINGER, 100)  # let the goodbye leave (at most 100 ms)
            except zmq.ZMQError:
                pass  # the daemon is gone or the queue full: nothing to tell
        for s in (self._obs, self._act, self._status):
            if s is not None:
                s.close()
        self._ctx.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_curve(curve: tuple[str, str]) -> tuple[bytes, bytes, bytes]:
    """(client secret key file, server public key file) -> (secret, public, server public)."""
    import zmq.auth

    try:
        public, secret = zmq.auth.load_certificate(curve[0])
        server_public, _ = zmq.auth.load_certificate(curve[1])
    except (OSError, ValueError) as exc:
        raise ClientError(f"CurveZMQ keys: {exc}") from None
    if secret is None:
        raise ClientError(f"CurveZMQ key {curve[0]} holds no secret key")
    return secret, public, server_public


def apply_curve(sock: zmq.Socket | None, endpoint: str, curve: tuple[bytes, bytes, bytes] | None) -> None:
    """Set the CurveZMQ client keys for a tcp:// endpoint (``sock=None``: only check)."""
    if not endpoint.startswith("tcp://"):
        return
    if curve is None:
        raise ClientError(f"{endpoint}: vlad serves tcp:// only with CurveZMQ; give the client keys (curve=...)")
    if sock is not None:
        sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = curve


def control_request(
    ctx: zmq.Context,
    endpoint: str | None,
    cmd: str,
    timeout_ms: int = 2000,
    curve: tuple[bytes, bytes, bytes] | None = None,
    **args: Any,
) -> Any:
    if not endpoint:
        raise ClientError("no control endpoint configured")
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        apply_curve(sock, endpoint, curve)
        sock.connect(endpoint)
        sock.send(protocol.encode_request(cmd, **args))
        if not sock.poll(timeout_ms):
            raise DaemonUnreachable(
                f"vlad did not answer {cmd!r} on {endpoint} within {timeout_ms} ms (is it running?)"
            )
        rep = protocol.decode_reply(sock.recv())
    finally:
        sock.close(0)
    if not rep.get("ok"):
        raise ClientError(f"vlad refused {cmd!r}: {rep.get('error')}")
    return rep.get("result")


# ---- asynchronous chunk execution ----------------------------------------------------------

BLEND_SCHEDULES = ("linear", "exponential", "none")


@dataclass
class ExecutorStats:
    """What a :class:`ChunkExecutor` did, for logs and benchmarks."""

    adopted: int = 0
    requests: int = 0
    rejected_stale: int = 0  # already past valid_until when offered
    rejected_older: int = 0  # from an older observation than the chunk being executed
    foreign: int = 0  # addressed to another controller
    rejected_exhausted: int = 0  # every waypoint already in the past
    ignored_advisory: int = 0  # the daemon's advisory holds while a valid chunk was running
    dropped_waypoints: int = 0  # past waypoints skipped when switching to a new chunk
    blended_steps: int = 0
    idle_steps: int = 0  # step() had nothing valid to execute


class ChunkExecutor:
    """Executes action chunks while the next one is computed (asynchronous execution).

    The controller calls, every control period::

        for chunk in received: executor.offer(chunk)     # adopt the newest usable one
        command = executor.step()                       # None: hold, nothing valid
        if executor.should_request():                   # few waypoints left: ask early
            seq = client.publish_observation(...)
            executor.request_sent(seq)

    * Switching: a new chunk is adopted at the index for *now*: waypoint k covers
      ``[t_sensor + k * period, t_sensor + (k + 1) * period)``, so waypoints already in
      the past are dropped (counted). A policy chunk from an older observation than the
      policy chunk being executed, a stale one, or one wholly in the past is refused.
    * Blending: for ``overlap`` waypoints after a switch the command mixes the new chunk
      with the old one (while the old one is still valid): weight of the new one ``w_j``
      for the j-th waypoint after the switch, ``linear`` ``(j + 1) / (overlap + 1)``,
      ``exponential`` ``(1 - exp(-r (j + 1) / (overlap + 1))) / (1 - exp(-r))`` with
      ``r = blend_rate`` (front-loaded), ``none`` 1 (a hard switch).
    * Requesting: :meth:`should_request` turns true when the waypoints left after the
      current one fall to ``request_threshold`` and no request is outstanding (an
      unanswered one is given up after ``request_timeout_ns``).
    * Tick jitter: a controller ticking in step with its own frames samples exactly at
      waypoint boundaries, where scheduling jitter of a fraction of a millisecond would
      repeat one waypoint and skip the next. A sample up to ``tolerance`` of a period
      before a boundary counts as the next waypoint's (default 0.1).
    * Validity: nothing is ever returned past a chunk's ``valid_until_ns``.
    * Holds: the daemon's advisory holds (:class:`~vlad.protocol.HoldKind` bridge, stale, rejected:
      this observation got no policy answer) are ignored while the current chunk still
      has a valid waypoint; any other hold (e-stop, fallback, backend error) is adopted at
      once, without blending.

    Pure logic: ``clock`` (default ``time.monotonic_ns``) is injectable, and every method
    takes an explicit ``now_ns``.
    """

    def __init__(
        self,
        *,
        request_threshold: int = 2,
        overlap: int = 2,
        blend: str = "linear",
        blend_rate: float = 3.0,
        request_timeout_ns: int = 500_000_000,
        tolerance: float = 0.1,
        clock: Any = time.monotonic_ns,
        client: str | None = None,
    ) -> None:
        if request_threshold < 0 or overlap < 0:
            raise ValueError("request_threshold and overlap must be >= 0")
        if not 0 <= tolerance < 0.5:
            raise ValueError("tolerance must be in [0, 0.5) of a period")
        if blend not in BLEND_SCHEDULES:
            raise ValueError(f"blend must be one of {', '.join(BLEND_SCHEDULES)}, not {blend!r}")
        if blend == "exponential" and blend_rate <= 0:
            raise ValueError("blend_rate must be > 0")
        self.request_threshold = request_threshold
        self.overlap = overlap
        self.blend = blend
        self.blend_rate = blend_rate
        self.request_timeout_ns = request_timeout_ns
        self.tolerance = tolerance
        self.clock = clock
        self.client = client  # this controller's name: chunks for other controllers are not executed
        self.current: ActionChunk | None = None
        self.stats = ExecutorStats()
        self._previous: ActionChunk | None = None
        self._switch_ns = 0
        self._pending: tuple[int, int] | None = None  # (obs seq, sent at)

    def index(self, chunk: ActionChunk, now_ns: int) -> int:
        """Index of the waypoint for ``now_ns`` in ``chunk`` (may be past its end)."""
        if chunk.period_ns <= 0:
            return 0
        early = int(self.tolerance * chunk.period_ns)
        return max(0, (now_ns - chunk.t_sensor_ns + early) // chunk.period_ns)

    def _usable(self, chunk: ActionChunk | None, now: int) -> TypeGuard[ActionChunk]:
        return chunk is not None and not chunk.is_stale(now) and self.index(chunk, now) < len(chunk.actions)

    def offer(self, chunk: ActionChunk, now_ns: int | None = None) -> bool:
        """Consider ``chunk``; True when it becomes the chunk being executed."""
        now = self.clock() if now_ns is None else now_ns
        if self.client is not None and not chunk.for_client(self.client):
            self.stats.foreign += 1
            return False
        if not chunk.advisory and self._pending is not None and chunk.obs_seq >= self._pending[0]:
            self._pending = None  # answered, whether or not it can be used
        if chunk.is_stale(now):
            self.stats.rejected_stale += 1
            return False
        if chunk.advisory and self._usable(self.current, now):
            self.stats.ignored_advisory += 1
            return False
        current = self.current
        if (
            current is not None
            and not chunk.is_hold
            and not current.is_hold
            and chunk.t_sensor_ns < current.t_sensor_ns
        ):
            # A plan from an older observation than the plan being executed (a hold has no
            # plan: a policy chunk sent after it takes over, by the page's rule of the
            # highest seq).
            self.stats.rejected_older += 1
            return False
        k = self.index(chunk, now)
        if k >= len(chunk.actions):
            self.stats.rejected_exhausted += 1
            return False
        blend = self.overlap > 0 and self.blend != "none" and not chunk.is_hold
        self._previous = self.current if blend and self.current is not None and not self.current.is_hold else None
        self._switch_ns = now
        self.current = chunk
        self.stats.adopted += 1
        self.stats.dropped_waypoints += k
        return True

    def weight(self, j: int) -> float:
        """Weight of the new chunk for the j-th waypoint after a switch (0-based)."""
        if self.blend == "none" or j >= self.overlap:
            return 1.0
        x = (j + 1) / (self.overlap + 1)
        if self.blend == "linear":
            return x
        r = self.blend_rate
        return float((1.0 - np.exp(-r * x)) / (1.0 - np.exp(-r)))

    def step(self, now_ns: int | None = None) -> np.ndarray | None:
        """The command for now, or None when no valid waypoint is left (hold)."""
        now = self.clock() if now_ns is None else now_ns
        chunk = self.current
        if not self._usable(chunk, now):
            self.stats.idle_steps += 1
            return None
        command = np.asarray(chunk.actions[self.index(chunk, now)], dtype=np.float64)
        old = self._previous
        if old is not None:
            j = (now - self._switch_ns) // chunk.period_ns if chunk.period_ns > 0 else self.overlap
            if j < self.overlap and self._usable(old, now):
                w = self.weight(int(j))
                command = w * command + (1.0 - w) * np.asarray(old.actions[self.index(old, now)], dtype=np.float64)
                self.stats.blended_steps += 1
            elif j >= self.overlap:
                self._previous = None
        return command

    def report(self, now_ns: int | None = None) -> tuple[int, int] | None:
        """What this controller executes at ``now_ns``, as an observation's ``exec`` reports it:
        (the chunk's seq, the waypoint index), or None when nothing valid (it holds)."""
        now = self.clock() if now_ns is None else now_ns
        chunk = self.current
        if not self._usable(chunk, now):
            return None
        return chunk.seq, self.index(chunk, now)

    def remaining(self, now_ns: int | None = None) -> int:
        """Waypoints left after the current one (0 when nothing valid is running)."""
        now = self.clock() if now_ns is None else now_ns
        if not self._usable(self.current, now):
            return 0
        chunk = self.current
        last = len(chunk.actions) - 1
        if chunk.period_ns > 0:  # a waypoint starting after valid_until will never run
            last = min(last, (chunk.valid_until_ns - chunk.t_sensor_ns - 1) // chunk.period_ns)
        return max(0, last - self.index(chunk, now))

    def should_request(self, now_ns: int | None = None) -> bool:
        """Whether to send the next observation now."""
        now = self.clock() if now_ns is None else now_ns
        if self._pending is not None:
            if now - self._pending[1] < self.request_timeout_ns:
                return False
            self._pending = None  # lost (dropped observation or reply): ask again
        return self.remaining(now) <= self.request_threshold

    def request_sent(self, obs_seq: int, now_ns: int | None = None) -> None:
        """Record that observation ``obs_seq`` was sent; its chunk answers the request."""
        self._pending = (obs_seq, self.clock() if now_ns is None else now_ns)
        self.stats.requests += 1
