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
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from vlad import protocol
from vlad.errors import VladError


class ClientError(VladError):
    """The daemon did not answer, or answered with an error."""


@dataclass(frozen=True)
class ActionChunk:
    seq: int
    obs_seq: int
    t_sensor_ns: int
    t_issue_ns: int
    valid_until_ns: int
    period_ns: int
    release: str
    state: str
    source: str  # the policy that produced it ("release", "fallback1", ...) or "hold:<reason>"
    interventions: tuple[str, ...]
    timings_ms: Mapping[str, float]
    actions: np.ndarray  # [chunk_length, action_dim], contract units
    t_receive_ns: int

    @property
    def is_hold(self) -> bool:
        """A hold posture (fallback, e-stop or a late inference), not a policy output."""
        return self.source.startswith("hold")

    def is_stale(self, now_ns: int | None = None) -> bool:
        """True once the chunk's validity has passed: never execute a stale chunk."""
        return (now_ns if now_ns is not None else time.monotonic_ns()) > self.valid_until_ns

    def action_at(self, now_ns: int | None = None) -> np.ndarray | None:
        """The waypoint for ``now``: waypoint k applies during the (k+1)-th control period
        after the sensor time, ``[t_sensor + k*period, t_sensor + (k+1)*period)``. None when
        stale or past the chunk's end."""
        now = now_ns if now_ns is not None else time.monotonic_ns()
        if self.is_stale(now):
            return None
        k = max(0, (now - self.t_sensor_ns) // self.period_ns) if self.period_ns else 0
        return self.actions[k] if k < len(self.actions) else None


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
    ) -> None:
        """``curve``: (this client's secret key file, the server's public key file) for
        tcp:// endpoints, which vlad serves only with CurveZMQ."""
        self.name = name
        self.endpoints = {"observations": observations, "actions": actions, "status": status, "control": control}
        self._curve = load_curve(curve) if curve else None
        for endpoint in (observations, actions):  # refuse tcp without keys before opening anything
            apply_curve(None, endpoint, self._curve)
        self._ctx = zmq.Context()
        self._obs = self._ctx.socket(zmq.PUB)
        self._obs.setsockopt(zmq.LINGER, 0)
        self._obs.setsockopt(zmq.SNDHWM, 4)  # never queue old observations behind a slow link
        self._connect(self._obs, observations)
        self._act = self._ctx.socket(zmq.SUB)
        self._act.setsockopt(zmq.LINGER, 0)
        self._act.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_ACTIONS)
        self._connect(self._act, actions)
        self._status: zmq.Socket | None = None
        self._seq = itertools.count(1)
        self.dropped_stale = 0

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
    ) -> int:
        """Send one observation; ``t_sensor_ns`` should be the capture time (default: now)."""
        seq = next(self._seq) if seq is None else seq
        header: dict[str, Any] = {"seq": seq, "t_sensor_ns": t_sensor_ns or time.monotonic_ns(), "client": self.name}
        if instruction is not None:
            header["instruction"] = instruction
        tensors = {f"image/{name}": img for name, img in images.items()}
        if proprio is not None:
            tensors["proprio"] = np.asarray(proprio, dtype=np.float32)
        frames = protocol.encode(protocol.TOPIC_OBS, header, tensors)
        # pyzmq's zero-copy sends cost more than a copy below ~64 KiB (per its docs).
        self._obs.send_multipart(frames, copy=sum(len(f) for f in frames) < 65536)
        return seq

    def heartbeat(self) -> None:
        self._obs.send_multipart(
            protocol.encode(protocol.TOPIC_HEARTBEAT, {"seq": next(self._seq), "t_ns": time.monotonic_ns(), "client": self.name})
        )

    def send_raw(self, frames: list[bytes]) -> None:
        """Send arbitrary frames on the observation socket (for tests and tools)."""
        self._obs.send_multipart(frames)

    # -- receiving -------------------------------------------------------------------------

    def recv_actions(self, timeout_ms: int = 100, drop_stale: bool = True) -> ActionChunk | None:
        """The newest action chunk that arrived within ``timeout_ms`` (older ones are skipped).

        With ``drop_stale`` a chunk already past ``valid_until`` is dropped and counted in
        :attr:`dropped_stale`, and waiting goes on until the timeout.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        newest: ActionChunk | None = None
        while True:
            wait = 0 if newest is not None else max(0, int((deadline - time.monotonic()) * 1000))
            if not self._act.poll(wait):
                if newest is not None or time.monotonic() >= deadline:
                    return newest
                continue
            chunk = self._decode_actions(self._act.recv_multipart())
            if drop_stale and chunk.is_stale():
                self.dropped_stale += 1
                continue
            newest = chunk

    @staticmethod
    def _decode_actions(frames: list[bytes]) -> ActionChunk:
        t = time.monotonic_ns()
        msg = protocol.decode(frames, expect=(protocol.TOPIC_ACTIONS,))
        h = msg.header
        return ActionChunk(
            seq=h["seq"], obs_seq=h["obs_seq"], t_sensor_ns=h["t_sensor_ns"], t_issue_ns=h["t_issue_ns"],
            valid_until_ns=h["valid_until_ns"], period_ns=h["period_ns"], release=h["release"], state=h["state"], source=h.get("source", ""),
            interventions=tuple(h.get("interventions", ())), timings_ms=h.get("timings_ms", {}),
            actions=msg.tensors["actions"], t_receive_ns=t,
        )  # fmt: skip

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
        return self.control("status", timeout_ms)

    def _connect(self, sock: zmq.Socket, endpoint: str) -> None:
        apply_curve(sock, endpoint, self._curve)
        sock.connect(endpoint)

    def close(self) -> None:
        for s in (self._obs, self._act, self._status):
            if s is not None:
                s.close(0)
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


def control_request(ctx: zmq.Context, endpoint: str | None, cmd: str, timeout_ms: int = 2000,
                    curve: tuple[bytes, bytes, bytes] | None = None, **args: Any) -> Any:
    if not endpoint:
        raise ClientError("no control endpoint configured")
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        apply_curve(sock, endpoint, curve)
        sock.connect(endpoint)
        sock.send(protocol.encode_request(cmd, **args))
        if not sock.poll(timeout_ms):
            raise ClientError(f"vlad did not answer {cmd!r} on {endpoint} within {timeout_ms} ms (is it running?)")
        rep = protocol.decode_reply(sock.recv())
    finally:
        sock.close(0)
    if not rep.get("ok"):
        raise ClientError(f"vlad refused {cmd!r}: {rep.get('error')}")
    return rep.get("result")
