"""The hot path: observation -> preprocess -> infer -> decode -> guard -> publish.

:meth:`PolicyWorker.cycle` is the whole path, top to bottom, in one place. It runs on one
dedicated worker thread, so the event loop (status, control, heartbeats, the watchdog)
stays responsive while an inference runs, and at most one inference is ever in flight.

The event loop hands observations over through :class:`LatestSlot`: a new observation
replaces one still waiting (the newer one wins, the older is counted as superseded), so
nothing queues up behind a slow inference and the worker always computes on the freshest
data. The worker owns the action PUB socket outright (ZeroMQ sockets are not thread-safe).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import zmq

from vlad import protocol
from vlad.backend import Session
from vlad.contract import Contract
from vlad.errors import VladError
from vlad.guard import ActionGuard
from vlad.processing import RawObservation, Tokenizer, decode_actions, preprocess
from vlad.tracing import CycleTimes, LatencyStats

log = logging.getLogger("vlad.serving")


@dataclass
class Pending:
    """An observation waiting for the worker, with its receive time."""

    obs: RawObservation
    receive_ns: int


class LatestSlot:
    """A one-place mailbox where the newest observation wins."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._item: Pending | None = None
        self._closed = False
        self.superseded = 0

    def put(self, item: Pending) -> None:
        with self._cond:
            if self._item is not None:
                self.superseded += 1
            self._item = item
            self._cond.notify()

    def take(self, timeout: float) -> Pending | None:
        with self._cond:
            if self._item is None and not self._closed:
                self._cond.wait(timeout)
            item, self._item = self._item, None
            return item

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class PolicyWorker:
    """Runs the hot path on its own thread and publishes action chunks."""

    def __init__(
        self,
        *,
        contract: Contract,
        tokenizer: Tokenizer | None,
        session: Session,
        release_id: str,
        actions_socket: zmq.Socket,
        stats: LatencyStats,
        state_name=lambda: "ACTIVE",
    ) -> None:
        self.contract = contract
        self.tokenizer = tokenizer
        self.session = session
        self.release_id = release_id
        self.sock = actions_socket
        self.stats = stats
        self.state_name = state_name
        self.guard = ActionGuard(contract)
        self.slot = LatestSlot()
        self.counters: Counter[str] = Counter()
        self.max_age_ns = int(contract.timing.max_observation_age_ms * 1e6)
        self.validity_ns = int(contract.timing.action_validity_ms * 1e6)
        self.deadline_ns = int(contract.timing.e2e_deadline_ms * 1e6)
        self.period_ns = int(contract.timing.control_period_ms * 1e6)
        self.action_seq = 0
        # Watched by the supervisor: a cycle running for too long means a hung engine.
        self.in_flight_since_ns = 0
        self.last_progress_ns = time.monotonic_ns()
        self.last_publish_ns = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vlad-inference", daemon=True)

    # -- thread lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop taking work, let the in-flight cycle finish within ``timeout``.

        Returns False when the cycle did not finish (the thread is then abandoned: it is a
        daemon thread, and the process exits without waiting for it).
        """
        self._stop.set()
        self.slot.close()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            item = self.slot.take(timeout=0.05)
            self.last_progress_ns = time.monotonic_ns()
            if item is None or self._stop.is_set():
                continue
            try:
                self.cycle(item)
            except Exception:  # a bug, not bad input: keep serving, but make it loud
                self.counters["cycle_errors"] += 1
                log.exception("inference cycle failed")
            finally:
                self.in_flight_since_ns = 0
                self.last_progress_ns = time.monotonic_ns()

    # -- the hot path ----------------------------------------------------------------------

    def cycle(self, item: Pending) -> None:
        """One observation in, at most one action chunk out."""
        obs = item.obs
        t = CycleTimes(sensor=obs.sensor_time_ns, receive=item.receive_ns)

        # Never compute on stale data: the age is judged when inference would start.
        t.pre_start = time.monotonic_ns()
        if t.pre_start - obs.sensor_time_ns > self.max_age_ns:
            self.counters["stale"] += 1
            return
        self.in_flight_since_ns = t.pre_start

        try:
            inputs = preprocess(self.contract, self.tokenizer, obs)
        except VladError as exc:
            self.counters["rejected_observations"] += 1
            log.warning("observation %d rejected: %s", obs.sequence, exc)
            return
        t.pre_end = time.monotonic_ns()

        t.infer_start = t.pre_end
        try:
            outputs = self.session.infer(inputs)
        except VladError as exc:
            self.counters["backend_errors"] += 1
            log.error("inference failed on observation %d: %s", obs.sequence, exc)
            return
        t.infer_end = time.monotonic_ns()
        timing = self.session.last_timing
        t.h2d_ms, t.d2h_ms = timing.h2d_ms, timing.d2h_ms

        actions = decode_actions(self.contract, outputs)
        t.decode_end = time.monotonic_ns()

        valid_until = obs.sensor_time_ns + self.validity_ns
        verdict = self.guard.check(actions, obs.proprio, t.decode_end, valid_until)
        t.guard_end = time.monotonic_ns()
        if verdict.actions is None:
            self.counters["expired"] += 1
            return

        self.action_seq += 1
        header = {
            "seq": self.action_seq,
            "obs_seq": obs.sequence,
            "t_sensor_ns": obs.sensor_time_ns,
            "t_issue_ns": t.guard_end,
            "valid_until_ns": valid_until,
            "period_ns": self.period_ns,
            "release": self.release_id,
            "state": self.state_name(),
            "interventions": list(verdict.interventions),
            "timings_ms": _stage_ms(t),
        }
        self.sock.send_multipart(protocol.encode(protocol.TOPIC_ACTIONS, header, {"actions": verdict.actions}))
        t.publish = time.monotonic_ns()

        self.last_publish_ns = t.publish
        stages = self.stats.record(t)
        self.counters["published"] += 1
        if verdict.interventions:
            self.counters["interventions"] += 1
        if stages["e2e"] * 1e6 > self.deadline_ns:
            self.counters["deadline_misses"] += 1


def _stage_ms(t: CycleTimes) -> dict[str, float]:
    """Per-stage durations up to the guard (publish is stamped after sending)."""
    ms = 1e-6
    out = {
        "transport": round((t.receive - t.sensor) * ms, 4),
        "queue": round((t.pre_start - t.receive) * ms, 4),
        "preprocess": round((t.pre_end - t.pre_start) * ms, 4),
        "infer": round((t.infer_end - t.infer_start) * ms, 4),
        "decode": round((t.decode_end - t.infer_end) * ms, 4),
        "guard": round((t.guard_end - t.decode_end) * ms, 4),
        "sensor_to_issue": round((t.guard_end - t.sensor) * ms, 4),
    }
    if t.h2d_ms is not None:
        out["h2d"] = round(t.h2d_ms, 4)
    if t.d2h_ms is not None:
        out["d2h"] = round(t.d2h_ms, 4)
    return out


def observation_from_message(contract: Contract, msg: protocol.Message) -> RawObservation:
    """Check an ``obs`` message against the contract and build the raw observation.

    Raises :class:`protocol.ProtocolError` for anything that does not match (counted by the
    caller); the checks are cheap header/shape comparisons, the pixel work is preprocess's.
    """
    h = msg.header
    t_sensor = h.get("t_sensor_ns")
    if not isinstance(t_sensor, int) or isinstance(t_sensor, bool) or t_sensor <= 0:
        raise protocol.ProtocolError("malformed", f"obs {msg.seq}: t_sensor_ns must be a positive integer")
    images = {}
    for cam in contract.cameras:
        img = msg.tensors.get(f"image/{cam.name}")
        raw = cam.raw
        want = (raw.height, raw.width, 3) if raw.layout == "HWC" else (3, raw.height, raw.width)
        if img is None:
            raise protocol.ProtocolError("missing_tensor", f"obs {msg.seq}: no tensor 'image/{cam.name}'")
        if img.dtype != np.dtype(raw.dtype):
            raise protocol.ProtocolError("bad_dtype", f"obs {msg.seq}: image/{cam.name} is {img.dtype}, expected {raw.dtype}")
        if img.shape != want:
            raise protocol.ProtocolError("bad_shape", f"obs {msg.seq}: image/{cam.name} is {list(img.shape)}, expected {list(want)}")
        images[cam.name] = img
    proprio = msg.tensors.get("proprio")
    if contract.proprio is not None:
        if proprio is None:
            raise protocol.ProtocolError("missing_tensor", f"obs {msg.seq}: no tensor 'proprio'")
        if proprio.shape != (contract.proprio.dim,):
            raise protocol.ProtocolError("bad_shape", f"obs {msg.seq}: proprio is {list(proprio.shape)}, expected [{contract.proprio.dim}]")
        if proprio.dtype not in (np.float32, np.float64):
            raise protocol.ProtocolError("bad_dtype", f"obs {msg.seq}: proprio is {proprio.dtype}, expected float32")
    instruction = h.get("instruction")
    if contract.language is not None and not isinstance(instruction, str):
        raise protocol.ProtocolError("malformed", f"obs {msg.seq}: header needs an 'instruction' string")
    return RawObservation(images=images, proprio=proprio, instruction=instruction, sequence=msg.seq, sensor_time_ns=t_sensor)
