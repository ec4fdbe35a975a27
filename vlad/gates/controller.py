"""A robot controller for the gates, speaking the wire protocol on the daemon's sockets.

It owns its own ZeroMQ sockets (PUB observations and heartbeats, SUB action chunks) and
encodes and decodes messages with :mod:`vlad.protocol`, so it sees exactly the frames it
sends and receives: with a :class:`~vlad.gates.recording.McapRecorder` attached it is the
controller-side tap that records what the daemon receives and publishes (the daemon-side
hook records the same frames from inside).

The performance gate streams recorded observations through it; closed-loop episodes run
on :mod:`vlad.episodes` with a :class:`vlad.client.Client`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import zmq

from vlad import protocol
from vlad.client import ActionChunk, Client


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
        *,
        reanchor: bool = False,
    ) -> int:
        """Send one observation (sensor time: now unless given); returns its sequence number.
        ``reanchor``: announce a joint-state jump (a recording's next episode)."""
        self._seq += 1
        header: dict[str, Any] = {
            "seq": self._seq,
            "t_sensor_ns": t_sensor_ns or time.monotonic_ns(),
            "client": self.name,
        }
        if instruction is not None:
            header["instruction"] = instruction
        if reanchor:
            header["reanchor"] = True
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

    def recv(self, timeout_ms: float) -> ActionChunk | None:
        """The next chunk within ``timeout_ms`` (not skipping any), or None."""
        if not self._act.poll(max(0, int(timeout_ms))):
            return None
        frames = self._act.recv_multipart()
        if self.recorder is not None:
            self.recorder.actions(frames, time.monotonic_ns())
        return Client.decode_chunk(frames)

    def recv_until(self, deadline_ns: int) -> list[ActionChunk]:
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
