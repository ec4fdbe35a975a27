"""Observation intake: every wire-level and contract check of an incoming message, in one place.

:meth:`Intake.accept` takes the raw frames of one message from the observation socket and
returns a :class:`~vlad.processing.RawObservation` only when everything holds; anything
else is a counted rejection with a reason (``IntakeCounts.rejected``, the reasons are
listed in docs/protocol.md). It never raises: a message is data, not control flow.

Checks, in order: the protocol (:func:`vlad.protocol.decode`), the header's fields (sensor
time positive and not in the future beyond ``serve.max_clock_skew_ms``, instruction text),
every tensor against the contract (name, dtype, shape), values (finite), and the joint
state against what the robot can do (:class:`~vlad.serving.guard.TrustedState`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import zmq

from vlad import protocol
from vlad.contract import Contract
from vlad.errors import TokenizerError
from vlad.health.liveness import Controllers
from vlad.processing import RawObservation, Tokenizer
from vlad.protocol import Rejection
from vlad.serving.counters import IntakeCounts
from vlad.serving.guard import TrustedState

log = logging.getLogger("vlad.intake")

_EXPECT = (protocol.TOPIC_OBS, protocol.TOPIC_HEARTBEAT)


class Rejected(Exception):
    """Internal: one check failed (``reason`` is the counter key)."""

    def __init__(self, reason: Rejection, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class Intake:
    """Decodes and checks observations and heartbeats for one contract (see module doc)."""

    def __init__(
        self,
        contract: Contract,
        counts: IntakeCounts,
        trusted: TrustedState,
        max_skew_ns: int,
        tokenizer: Tokenizer | None = None,
        heartbeat_limit_ns: int = 100_000_000,
    ) -> None:
        self.contract = contract
        self.counts = counts
        self.trusted = trusted
        self.max_skew_ns = max_skew_ns
        self.tokenizer = tokenizer  # the release's: an instruction it cannot encode is refused here
        # (seq, t_sensor_ns, reason, client) of the message just refused, when it was an
        # observation whose header could be read: the intake thread answers it with an
        # advisory hold.
        self.refused: tuple[int, int, Rejection, str | None] | None = None
        self.last_observation_ns = 0  # receive time of the last accepted observation
        self.last_heartbeat_ns = 0
        self.last_seen_ns = 0  # any well-formed message: the controller is there
        # Each controller's own heartbeats (vlad.health.liveness); a controller is judged once
        # its heartbeats span the heartbeat limit.
        self.controllers = Controllers(establish_ns=heartbeat_limit_ns)
        # Between the last two accepted observations: about a period for a controller that
        # streams them, action_horizon periods for one that executes each chunk for that
        # long and asks again when it runs out. vlad.serving.cadence bridges only the former.
        self.observation_interval_ns = 0
        cams = []
        for cam in contract.cameras:
            raw = cam.raw
            shape = (raw.height, raw.width, 3) if raw.layout == "HWC" else (3, raw.height, raw.width)
            cams.append((cam.name, f"image/{cam.name}", np.dtype(raw.dtype), shape))
        self._cameras = tuple(cams)
        self._proprio_dim = contract.proprio.dim if contract.proprio else None
        self._language = contract.language is not None
        self._allowed = {name for _, name, _, _ in cams} | ({"proprio"} if self._proprio_dim else set())
        # What a conforming controller sends (vlad.client's order): decoded without
        # re-checking each tensor. Any other layout gets every check below.
        wire: list[tuple[str, str, tuple[int, ...]]] = [(name, dtype.name, shape) for _, name, dtype, shape in cams]
        if self._proprio_dim is not None:
            wire.append(("proprio", "float32", (self._proprio_dim,)))
        self._layout = protocol.Layout(wire)
        self._float_images = any(dtype.kind == "f" for _, _, dtype, _ in cams)

    def accept(self, frames: Sequence[Any], receive_ns: int) -> RawObservation | None:
        """One message -> an observation, or None (a heartbeat, or a counted rejection)."""
        self.counts.messages += 1
        self.refused = None
        msg = None
        try:
            msg = protocol.decode(frames, expect=_EXPECT, layout=self._layout)
            peer = _peer(frames)
            if msg.topic == protocol.TOPIC_HEARTBEAT:
                self.controllers.heartbeat(msg.header, receive_ns, peer)  # a malformed one keeps nobody alive
                self.last_heartbeat_ns = self.last_seen_ns = receive_ns
                self.counts.heartbeats += 1
                return None
            self.last_seen_ns = receive_ns
            obs = self._observation(msg, receive_ns, peer)
        except protocol.ProtocolError as exc:
            self.reject(exc.reason, str(exc).removeprefix(f"{exc.reason}: "))  # logged as "reason: detail" once
            if exc.header is not None and bytes(frames[0]) == protocol.TOPIC_OBS:
                self._remember(exc.header, exc.reason)  # the header names it: the sender hears why
            return None
        except Rejected as exc:
            assert msg is not None  # raised only after the message decoded
            self._refuse(msg, exc.reason, str(exc))
            return None
        except Exception as exc:  # a bug in a check: the message is refused, never the thread's end
            if msg is None or msg.topic != protocol.TOPIC_OBS:
                self.reject(Rejection.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
            else:
                self._refuse(msg, Rejection.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
            if self.counts.rejected[Rejection.INTERNAL_ERROR] <= 10:
                log.error("intake: unexpected error on a message", exc_info=exc)
            return None
        self.counts.observations += 1
        self.controllers.observed(obs.client or "", receive_ns)  # with its heartbeats: a controller judged
        self.observation_interval_ns = receive_ns - self.last_observation_ns
        self.last_observation_ns = receive_ns
        return obs

    def _refuse(self, msg: protocol.Message, reason: Rejection, detail: str) -> None:
        """A refused observation: counted, and remembered so the intake thread answers it."""
        self.reject(reason, detail)
        self._remember(msg.header, reason)

    def _remember(self, h: dict, reason: Rejection) -> None:
        """A refused observation whose header could be read: answered with an advisory hold
        (about its ``seq``, when that is a valid one)."""
        seq = h.get("seq")
        if type(seq) is not int or not 0 <= seq < 2**63:
            return
        t_sensor = h.get("t_sensor_ns")
        client = h.get("client", "")
        self.refused = (
            seq,
            t_sensor if type(t_sensor) is int and 0 < t_sensor < 2**63 else 0,
            reason,
            client if type(client) is str and len(client) <= 128 and client.isprintable() else None,
        )

    def reject(self, reason: str, detail: str) -> None:
        c = self.counts
        c.rejected[reason] += 1
        c.input_rejected += 1
        n = c.input_rejected
        # Loud for the first ones, then sampled, so a broken client cannot flood the journal.
        if n <= 10 or n % 1000 == 0:
            log.warning("rejected message (%d so far): %s: %s", n, reason, detail)

    def _observation(self, msg: protocol.Message, receive_ns: int, peer: str | None = None) -> RawObservation:
        h = msg.header
        seq = msg.seq
        t_sensor = h.get("t_sensor_ns")
        if type(t_sensor) is not int or not 0 < t_sensor < 2**63:
            raise Rejected(Rejection.MALFORMED, f"obs {seq}: t_sensor_ns must be a positive integer")
        if t_sensor > receive_ns + self.max_skew_ns:
            raise Rejected(
                Rejection.FUTURE_TIMESTAMP,
                f"obs {seq}: t_sensor_ns is {(t_sensor - receive_ns) / 1e6:.1f} ms "
                "in the future (clocks not on the daemon's CLOCK_MONOTONIC?)",
            )
        instruction = h.get("instruction")
        if instruction is not None:
            protocol.check_text(instruction, "instruction")
            if self.tokenizer is not None:
                try:
                    self.tokenizer.encode(instruction)  # cached per instruction: once per new text
                except TokenizerError as exc:
                    raise Rejected(Rejection.INSTRUCTION_TOO_LONG, f"obs {seq}: {exc}") from None
        elif self._language:
            raise Rejected(Rejection.MALFORMED, f"obs {seq}: header needs an 'instruction' string")
        client = h.get("client")
        if client is not None:
            protocol.check_text(client, "client", 128)
        try:  # before anything of it is believed: a name liveness cannot watch is not served
            self.controllers.admit(client or "", receive_ns, peer)
        except protocol.ProtocolError as exc:
            raise Rejected(exc.reason, f"obs {seq}: {exc}") from None
        tensors = msg.tensors
        if msg.layout is self._layout and not self._float_images:
            # Names, dtypes and shapes are the contract's (Layout); uint8 pixels are finite.
            images = {cam: tensors[name] for cam, name, _, _ in self._cameras}
        else:
            images = self._images(seq, tensors)
        proprio = tensors.get("proprio")
        if self._proprio_dim is not None and msg.layout is not self._layout:
            if proprio is None:
                raise Rejected(Rejection.MISSING_TENSOR, f"obs {seq}: no tensor 'proprio'")
            if proprio.shape != (self._proprio_dim,):
                raise Rejected(
                    Rejection.BAD_SHAPE, f"obs {seq}: proprio is {list(proprio.shape)}, expected [{self._proprio_dim}]"
                )
            if proprio.dtype not in (np.float32, np.float64):
                raise Rejected(Rejection.BAD_DTYPE, f"obs {seq}: proprio is {proprio.dtype}, expected float32")
        executing = _report(h.get("exec", _UNREPORTED), seq)
        provisional = 0
        if proprio is not None:
            if proprio.dtype != np.float32:
                # Judged and served as the float32 the contract declares: a float64 value
                # beyond float32's range is refused here, not turned into Inf downstream.
                with np.errstate(over="ignore"):
                    proprio = proprio.astype(np.float32)
            # A short vector: plain floats are cheaper than numpy calls on cold caches.
            values = proprio.tolist()
            if not all(map(math.isfinite, values)):
                raise Rejected(Rejection.NONFINITE, f"obs {seq}: proprio holds NaN or Inf (or a value beyond float32)")
            verdict = self.trusted.judge_values(values, t_sensor, h.get("reanchor") is True, receive_ns, client or "")
            if verdict is not None:
                raise Rejected(
                    verdict,
                    f"obs {seq}: joint state {np.round(proprio.astype(np.float64), 3).tolist()} "
                    "is not plausible "
                    "(beyond the joint limits, or moved faster than the joints can)",
                )
            self.counts.reanchors = self.trusted.reanchors
            provisional = self.trusted.provisional
        return RawObservation(
            images=images,
            proprio=proprio,
            instruction=instruction,
            sequence=seq,
            sensor_time_ns=t_sensor,
            client=client,
            executing=executing,
            provisional=provisional,
        )

    def _images(self, seq: int, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every camera tensor checked against the contract (any layout but the expected one)."""
        extra = set(tensors) - self._allowed
        if extra:
            raise Rejected(Rejection.UNKNOWN_TENSOR, f"obs {seq}: tensor(s) {sorted(extra)[:4]} not in the contract")
        images = {}
        for cam, name, dtype, shape in self._cameras:
            img = tensors.get(name)
            if img is None:
                raise Rejected(Rejection.MISSING_TENSOR, f"obs {seq}: no tensor {name!r}")
            if img.dtype != dtype:
                raise Rejected(Rejection.BAD_DTYPE, f"obs {seq}: {name} is {img.dtype}, expected {dtype}")
            if img.shape != shape:
                raise Rejected(Rejection.BAD_SHAPE, f"obs {seq}: {name} is {list(img.shape)}, expected {list(shape)}")
            if dtype.kind == "f" and not np.isfinite(img).all():
                raise Rejected(Rejection.NONFINITE, f"obs {seq}: {name} holds NaN or Inf")
            images[cam] = img
        return images


def _peer(frames: Sequence[Any]) -> str | None:
    """The sending connection's identity (set by the daemon's ZAP handler), None without one."""
    frame = frames[0]
    if not isinstance(frame, zmq.Frame):
        return None
    try:
        peer = frame.get("User-Id")
    except zmq.ZMQError:  # no identity on this connection
        return None
    return peer if isinstance(peer, str) and peer else None


_UNREPORTED = (-1, -1)


def _report(value: Any, seq: int) -> tuple[int, int] | None:
    """An observation's ``exec``: ``[chunk seq, waypoint index]``, nil (executing nothing) or
    absent (:data:`_UNREPORTED`); anything else is ``malformed``."""
    if value is _UNREPORTED or value is None:
        return value
    if (
        type(value) is list
        and len(value) == 2
        and all(type(v) is int for v in value)
        and 0 < value[0] < 2**63
        and 0 <= value[1] < 2**31
    ):
        return value[0], value[1]
    raise Rejected(Rejection.MALFORMED, f"obs {seq}: exec must be [chunk seq, waypoint index] or nil")
