"""The in-process serving rig: the real serving loop, intake, guard and publisher on real inproc
ZeroMQ sockets, with a fake engine instead of a model, and no daemon process.

The fake engine (:class:`FakeSession`) is a real :class:`vlad.backend.Session` (the
contract's input checks run) whose answer is a fixed chunk; it can be held inside an
inference (a slow or hung engine) or made to fail, so a test decides exactly what is in
flight when it sends the next observation or engages the e-stop.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import zmq

from vlad import protocol
from vlad.backend import Session, SessionDescription
from vlad.config import GuardConfig, RealtimeConfig
from vlad.health.state import StateMachine
from vlad.serving.counters import IntakeCounts, PolicyId, PublishCounts
from vlad.serving.guard import ActionGuard, TrustedState
from vlad.serving.intake import Intake
from vlad.serving.loop import ServingLoop
from vlad.serving.policy import ServedPolicy
from vlad.serving.position import ServingState
from vlad.serving.publisher import Publisher
from vlad.serving.rehearsal import Rehearsal
from vlad.serving.tracing import LatencyStats

INSTRUCTION = "reach the red target"
# Joint positions inside the demo arm's limits; the velocities are zero: the arm is still.
PROPRIO = np.array([0.3, 0.2, 0.0, 0.0], np.float32)
# The 2-core test machine is shared with other jobs: a thread can be descheduled for tens
# of milliseconds. These tests are about *which* observation and *which* policy answers,
# so observations stay fresh and chunks valid for seconds; staleness has its own test.
GENEROUS_NS = 5_000_000_000

_ids = itertools.count()


class FakeSession(Session):
    """Answers every inference with one fixed chunk (model units) and counts the calls."""

    backend_name = "fake"

    def __init__(self, contract, value: float = 0.0) -> None:
        super().__init__(contract, Path("fake.onnx"), {})
        spec = contract.action
        self.outputs = {spec.output: np.full((1, spec.chunk_length, spec.dim), value, np.float32)}
        self.calls = 0
        self.seen: list[dict[str, np.ndarray]] = []  # the inputs of every inference, copied
        self.entered = threading.Event()  # set when an inference has started
        self.gate: threading.Event | None = None  # set: inferences wait here (a slow engine)
        self.error: Exception | None = None  # raised by the next inferences

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        self.seen.append({k: v.copy() for k, v in inputs.items()})
        self.entered.set()
        if self.gate is not None and not self.gate.wait(10):
            raise AssertionError("test never released the engine")
        if self.error is not None:
            raise self.error
        return {k: v.copy() for k, v in self.outputs.items()}

    def describe(self) -> SessionDescription:
        return SessionDescription(backend="fake", runtime="fake", runtime_version="0", device="cpu")


def connected(pub: zmq.Socket, sub: zmq.Socket, frames: list[bytes], received: Callable[[], bool]) -> None:
    """PUB/SUB drops messages until the subscription has reached the publisher (even over
    inproc): send a probe until the subscriber side has seen one."""
    deadline = time.monotonic() + 5
    while not received():
        if time.monotonic() > deadline:
            raise AssertionError("PUB/SUB never connected")
        pub.send_multipart(frames)
        time.sleep(0.005)  # a probe every 5 ms until one arrives


class Rig:
    """The serving side of the daemon, wired like vlad.daemon.supervisor wires it."""

    def __init__(self, contract, tokenizer, estop_output: str = "hold", rehearse_lead_ns: int = 0) -> None:
        self.contract = contract
        self.tokenizer = tokenizer
        self.ctx = zmq.Context()
        n = next(_ids)
        obs_addr, act_addr = f"inproc://test-obs-{n}", f"inproc://test-act-{n}"
        self.obs_sock = self.ctx.socket(zmq.SUB)
        self.obs_sock.bind(obs_addr)
        for topic in (protocol.TOPIC_OBS, protocol.TOPIC_HEARTBEAT):
            self.obs_sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.act_sock = self.ctx.socket(zmq.PUB)
        self.act_sock.bind(act_addr)
        self.controller = self.ctx.socket(zmq.PUB)  # what a robot controller holds
        self.controller.connect(obs_addr)
        self.actions = self.ctx.socket(zmq.SUB)
        self.actions.connect(act_addr)
        self.actions.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_ACTIONS)
        connected(
            self.act_sock,
            self.actions,
            [protocol.TOPIC_ACTIONS, b"probe"],
            lambda: self.actions.poll(5) and self.actions.recv_multipart() is not None,
        )
        while self.actions.poll(20):  # a probe sent before the first one arrived
            self.actions.recv_multipart()

        self.trusted = TrustedState(contract)
        self.guard = ActionGuard(contract, self.trusted)
        self.intake = Intake(contract, IntakeCounts(), self.trusted, max_skew_ns=5_000_000, tokenizer=tokenizer)
        self.publisher = Publisher(
            contract,
            self.act_sock,
            self.guard,
            LatencyStats(100),
            PublishCounts(),
            ServingState(StateMachine(), "demo@1"),
            estop_output,
        )
        self.publisher.validity_ns = GENEROUS_NS
        period_ns = int(contract.timing.control_period_ms * 1e6)
        # gc_freeze off: the test process is not a daemon that finished loading.
        self.loop = ServingLoop(
            self.ctx,
            self.obs_sock,
            self.intake,
            self.publisher,
            RealtimeConfig(gc_freeze=False),
            period_ns,
            history=contract.frames,
            rehearsal=Rehearsal(self.intake, self.publisher, rehearse_lead_ns, GuardConfig())
            if rehearse_lead_ns
            else None,
        )
        self.session = FakeSession(contract)
        self.policy = self.served("release", "demo@1", self.session)
        self.loop.active = self.policy
        self.loop.start()
        hb = protocol.encode(protocol.TOPIC_HEARTBEAT, {"seq": 0, "t_ns": time.monotonic_ns()})
        connected(self.controller, self.obs_sock, hb, lambda: self.intake.counts.heartbeats > 0)
        self._seq = itertools.count(1)

    def served(self, slot: str, release: str, session: Session | None = None) -> ServedPolicy:
        policy = ServedPolicy(
            PolicyId(slot, release), self.contract, session or FakeSession(self.contract), self.tokenizer
        )
        policy.max_age_ns = GENEROUS_NS
        return policy

    def send_obs(
        self,
        seq: int,
        t_sensor_ns: int | None = None,
        proprio: np.ndarray = PROPRIO,
        instruction: str = INSTRUCTION,
        reanchor: bool = False,
        executing: list[int] | None = None,
        client: str | None = None,
    ) -> None:
        image = np.zeros((64, 64, 3), np.uint8)
        header: dict = {"seq": seq, "t_sensor_ns": t_sensor_ns or time.monotonic_ns(), "instruction": instruction}
        if client is not None:
            header["client"] = client
        if reanchor:
            header["reanchor"] = True
        if executing is not None:
            header["exec"] = executing
        self.controller.send_multipart(
            protocol.encode(protocol.TOPIC_OBS, header, {"image/overhead": image, "proprio": proprio})
        )

    def send_heartbeat(self, cadence: str | None = None) -> None:
        header: dict = {"seq": 0, "t_ns": time.monotonic_ns()}
        if cadence is not None:
            header["cadence"] = cadence
        self.controller.send_multipart(protocol.encode(protocol.TOPIC_HEARTBEAT, header))

    def recv(self, timeout: float = 5.0) -> protocol.Message | None:
        """The next action message, or None when none arrives within ``timeout``."""
        if not self.actions.poll(int(timeout * 1000)):
            return None
        return protocol.decode(self.actions.recv_multipart(), expect=(protocol.TOPIC_ACTIONS,))

    def close(self) -> None:
        if self.session.gate is not None:
            self.session.gate.set()
        assert self.loop.stop(2.0), "serving thread did not stop"
        self.loop.close()
        for s in (self.obs_sock, self.act_sock, self.controller, self.actions):
            s.close(0)
        self.ctx.term()
