"""The hot path: observation -> preprocess -> infer -> decode -> guard -> publish.

Read :meth:`PolicyWorker.cycle` and :meth:`Publisher.publish` top to bottom: that is the
whole path. Each policy (the release being served and each fallback policy) has its own
worker thread, so the event loop (status, control, heartbeats, the watchdog, the health
monitors) stays responsive while an inference runs, at most one inference per policy is
in flight, and a hung engine only ever blocks its own thread.

The event loop hands observations over through :class:`LatestSlot`: a new observation
replaces one still waiting (the newer one wins, the older is counted as superseded), so
nothing queues up behind a slow inference and a worker always computes on fresh data.

Every chunk leaves through the one :class:`Publisher`, which owns the action PUB socket
(under a lock: ZeroMQ sockets are not thread-safe) and the final guard, so rate limits
apply across policy swaps and hold postures alike.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zmq

from vlad import protocol
from vlad.backend import Session
from vlad.contract import Contract
from vlad.errors import NonFiniteObservation, VladError
from vlad.serving.guard import ActionGuard
from vlad.processing import RawObservation, Tokenizer, decode_actions, preprocess
from vlad.serving.tracing import CycleTimes, LatencyStats

log = logging.getLogger("vlad.serving")


@dataclass
class Pending:
    """An observation waiting for a worker, with its receive time."""

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


class Publisher:
    """The final guard and the action PUB socket: the only way a chunk leaves vlad."""

    def __init__(self, contract: Contract, sock: zmq.Socket, release_id: Callable[[], str],
                 state_name: Callable[[], str], stats: LatencyStats) -> None:
        self.contract = contract
        self.sock = sock
        self.release_id = release_id
        self.state_name = state_name
        self.stats = stats
        self.guard = ActionGuard(contract)
        self.lock = threading.Lock()
        self.seq = 0
        self.last_publish_ns = 0
        self.counters: Counter[str] = Counter()
        self.validity_ns = int(contract.timing.action_validity_ms * 1e6)
        self.deadline_ns = int(contract.timing.e2e_deadline_ms * 1e6)
        self.period_ns = int(contract.timing.control_period_ms * 1e6)
        # Called with (obs_seq, actions) for every chunk of the release being served, while
        # a shadow run or a canary compares another policy against it; empty otherwise.
        self.observers: list[Callable[[int, np.ndarray], None]] = []
        # Hot-swap timing: decision -> first command from the new policy, in ms (last 20).
        self.swap_ms: deque[dict] = deque(maxlen=20)
        self._swap_pending: tuple[str, int] | None = None

    def expect_swap(self, source: str, t0_ns: int) -> None:
        self._swap_pending = (source, t0_ns)

    def _swap_done(self, source: str) -> None:
        pending = self._swap_pending
        if pending is not None and (source == pending[0] or (pending[0] == "hold" and source.startswith("hold"))):
            self.swap_ms.append({"to": pending[0], "first_command_ms": round((self.last_publish_ns - pending[1]) / 1e6, 3)})
            self._swap_pending = None

    def publish(self, actions: np.ndarray, obs: RawObservation, t: CycleTimes, source: str, policy: str = "") -> bool:
        """Guard ``actions`` (from ``obs``) and send them; False when the guard dropped them.

        ``source`` names the chain position ("release", "fallback1"); ``policy`` the exact
        policy ("release:<release id>") that interventions are counted against.
        """
        with self.lock:
            valid_until = obs.sensor_time_ns + self.validity_ns
            verdict = self.guard.check(actions, obs.proprio, time.monotonic_ns(), valid_until)
            t.guard_end = time.monotonic_ns()
            if verdict.actions is None:
                self.counters["expired"] += 1
                return False
            self._send(verdict.actions, verdict.interventions, obs.sequence, obs.sensor_time_ns, valid_until,
                       source, _stage_ms(t))
            t.publish = self.last_publish_ns
            self._swap_done(source)
        if source == "release":
            for observe in self.observers:  # the policy's own output, before the guard
                observe(obs.sequence, actions)
        stages = self.stats.record(t)
        self.counters["published"] += 1
        self.counters[f"published_{source}"] += 1
        if verdict.interventions:
            self.counters["interventions"] += 1
            for kind in verdict.interventions:  # per policy: the health monitor blames the right one
                self.counters[f"{kind}:{policy or source}"] += 1
        if stages["e2e"] * 1e6 > self.deadline_ns:
            self.counters["deadline_misses"] += 1
        return True

    def publish_hold(self, proprio: np.ndarray | None, obs_seq: int, t_sensor_ns: int, reason: str) -> None:
        """Send the contract's hold posture (from the last known joint state)."""
        with self.lock:
            chunk = self.guard.hold_posture(proprio)
            now = time.monotonic_ns()
            self.guard.last_command, self.guard.last_command_ns = chunk[0].copy(), now
            self._send(chunk, ("hold",), obs_seq, t_sensor_ns or now, now + self.validity_ns, f"hold:{reason}", {})
            self._swap_done(f"hold:{reason}")
        self.counters["published_hold"] += 1

    def _send(self, actions, interventions, obs_seq, t_sensor_ns, valid_until_ns, source, timings) -> None:
        self.seq += 1
        header = {
            "seq": self.seq,
            "obs_seq": obs_seq,
            "t_sensor_ns": t_sensor_ns,
            "t_issue_ns": time.monotonic_ns(),
            "valid_until_ns": valid_until_ns,
            "period_ns": self.period_ns,
            "release": self.release_id(),
            "state": self.state_name(),
            "source": source,
            "interventions": list(interventions),
            "timings_ms": timings,
        }
        self.sock.send_multipart(protocol.encode(protocol.TOPIC_ACTIONS, header, {"actions": actions}))
        self.last_publish_ns = time.monotonic_ns()


class PolicyWorker:
    """One policy on its own thread: takes the newest observation, publishes its chunk."""

    def __init__(self, *, name: str, contract: Contract, tokenizer: Tokenizer | None, session: Session,
                 release_id: str, publisher: Publisher) -> None:
        self.name = name
        self.contract = contract
        self.tokenizer = tokenizer
        self.session = session
        self.release_id = release_id
        self.policy_id = f"{name}:{release_id}"  # as in the supervisor's fallback chain
        self.publisher = publisher
        self.slot = LatestSlot()
        self.counters: Counter[str] = Counter()
        self.max_age_ns = int(contract.timing.max_observation_age_ms * 1e6)
        # Watched by the supervisor: a cycle running for too long means a hung engine.
        self.in_flight_since_ns = 0
        self.in_flight_obs: RawObservation | None = None
        self.last_progress_ns = time.monotonic_ns()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"vlad-{name}", daemon=True)

    # -- thread lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop taking work and let the in-flight cycle finish within ``timeout``.

        Returns False when it did not finish; the thread is then abandoned (a daemon thread:
        the process exits without waiting for a hung engine).
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
                log.exception("%s: inference cycle failed", self.name)
            finally:
                self.in_flight_since_ns = 0
                self.in_flight_obs = None
                self.last_progress_ns = time.monotonic_ns()

    # -- the hot path ----------------------------------------------------------------------

    def cycle(self, item: Pending) -> None:
        """One observation in, one action chunk out (or a counted reason why not)."""
        obs = item.obs
        t = CycleTimes(sensor=obs.sensor_time_ns, receive=item.receive_ns)

        # Never compute on stale data: the age is judged when inference would start.
        t.pre_start = time.monotonic_ns()
        if t.pre_start - obs.sensor_time_ns > self.max_age_ns:
            self.counters["stale"] += 1
            return
        self.in_flight_since_ns, self.in_flight_obs = t.pre_start, obs

        try:
            inputs = preprocess(self.contract, self.tokenizer, obs)
        except VladError as exc:
            kind = "nonfinite_inputs" if isinstance(exc, NonFiniteObservation) else "rejected_observations"
            self.counters[kind] += 1
            if self.counters[kind] <= 10 or self.counters[kind] % 1000 == 0:  # a bad stream must not flood the log
                log.warning("%s: observation %d rejected (%d so far): %s", self.name, obs.sequence,
                            self.counters[kind], exc)
            return
        t.pre_end = t.infer_start = time.monotonic_ns()

        try:
            outputs = self.session.infer(inputs)
        except VladError as exc:
            # The controller still gets a command for this observation: the hold posture.
            self.counters["backend_errors"] += 1
            self.publisher.publish_hold(obs.proprio, obs.sequence, obs.sensor_time_ns, "backend_error")
            log.error("%s: inference failed on observation %d: %s", self.name, obs.sequence, exc)
            return
        t.infer_end = time.monotonic_ns()
        timing = self.session.last_timing
        t.h2d_ms, t.d2h_ms = timing.h2d_ms, timing.d2h_ms

        actions = decode_actions(self.contract, outputs)
        t.decode_end = time.monotonic_ns()

        self.publisher.publish(actions, obs, t, self.name, self.policy_id)  # final guard + send


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
