"""The publisher on its own, on a real inproc PUB socket: the only way a chunk leaves vlad.

The e-stop gate, dropped chunks (a retired policy, a replaced thread, an expired chunk),
the chunk header, and the observers a shadow run or a canary compares with."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from tests.serving.rig import PROPRIO, FakeSession, connected
from vlad import protocol
from vlad.health.state import StateMachine
from vlad.processing import RawObservation
from vlad.protocol import HoldKind
from vlad.serving.counters import PolicyId, PublishCounts
from vlad.serving.guard import ActionGuard, TrustedState
from vlad.serving.policy import ServedPolicy
from vlad.serving.position import ServingState
from vlad.serving.publisher import Publisher
from vlad.serving.tracing import CycleTimes, LatencyStats


class Bench:
    """A publisher on a bound PUB socket and a subscriber that sees what leaves."""

    def __init__(self, contract, tokenizer, estop_output: str = "hold") -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind("inproc://publisher-test")
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect("inproc://publisher-test")
        self.sub.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_ACTIONS)
        connected(
            self.pub,
            self.sub,
            [protocol.TOPIC_ACTIONS, b"probe"],
            lambda: self.sub.poll(5) and self.sub.recv_multipart() is not None,
        )
        while self.sub.poll(20):
            self.sub.recv_multipart()
        self.contract = contract
        self.trusted = TrustedState(contract)
        self.now = time.monotonic_ns()
        assert self.trusted.judge(PROPRIO, self.now) is None  # a trusted joint state to start from
        self.guard = ActionGuard(contract, self.trusted)
        self.counts = PublishCounts()
        self.publisher = Publisher(
            contract,
            self.pub,
            self.guard,
            LatencyStats(100),
            self.counts,
            ServingState(StateMachine(), "demo@1"),
            estop_output,
        )
        self.policy = ServedPolicy(PolicyId("release", "demo@1"), contract, FakeSession(contract), tokenizer)

    def chunk(self) -> np.ndarray:
        """The trusted position held for the whole chunk: a chunk the guard leaves alone."""
        a = self.contract.action
        return np.tile(PROPRIO[: a.dim], (a.chunk_length, 1)).astype(np.float32)

    def publish(
        self,
        policy: ServedPolicy | None = None,
        generation: int = 0,
        age_ns: int = 0,
        seq: int = 7,
        actions: np.ndarray | None = None,
    ) -> bool:
        t_sensor = time.monotonic_ns() - age_ns
        obs = RawObservation(images={}, proprio=PROPRIO, sequence=seq, sensor_time_ns=t_sensor)
        t = CycleTimes()
        t.reset(t_sensor, t_sensor)
        t.pre_start = t.pre_end = t.infer_start = t.infer_end = t.decode_end = time.monotonic_ns()
        chunk = self.chunk() if actions is None else actions
        return self.publisher.publish(chunk, obs, t, policy or self.policy, generation) == "sent"

    def recv(self, timeout: float = 2.0) -> protocol.Message | None:
        if not self.sub.poll(int(timeout * 1000)):
            return None
        return protocol.decode(self.sub.recv_multipart(), expect=(protocol.TOPIC_ACTIONS,))

    def close(self) -> None:
        self.pub.close(0)
        self.sub.close(0)
        self.ctx.term()


@pytest.fixture()
def bench(contract, tokenizer):
    b = Bench(contract, tokenizer)
    yield b
    b.close()


def test_a_chunk_leaves_with_its_header(bench):
    assert bench.publish(seq=7)
    msg = bench.recv()
    h = msg.header
    assert (h["seq"], h["obs_seq"], h["source"], h["policy"], h["release"], h["state"]) == (
        1,
        7,
        "release",
        "release:demo@1",
        "demo@1",
        "STARTING",
    )
    assert h["valid_until_ns"] == h["t_sensor_ns"] + int(bench.contract.timing.action_validity_ms * 1e6)
    assert h["interventions"] == []
    np.testing.assert_array_equal(msg.tensors["actions"], bench.chunk())
    assert bench.publish(seq=8)
    assert bench.recv().header["seq"] == 2  # the publisher's own sequence, not the observation's
    assert bench.counts.policy_chunks == 2 and bench.policy.counts.published == 2


def test_the_estop_gate(bench):
    bench.publisher.set_estop(True)
    assert not bench.publish()
    assert bench.policy.counts.estop_blocked == 1
    assert not bench.publisher.publish_hold(HoldKind.FALLBACK)  # only e-stop holds while engaged
    assert bench.publisher.publish_hold(HoldKind.ESTOP)  # safety.estop_output = "hold"
    h = bench.recv().header
    assert (h["source"], h["policy"]) == ("hold:estop", "hold")
    assert bench.recv(0.1) is None
    assert bench.counts.policy_chunks == 0 and bench.counts.holds == {"estop": 1}

    bench.publisher.set_estop(False)
    assert bench.publish()
    assert bench.recv().header["source"] == "release"


def test_silence_while_engaged(contract, tokenizer):
    b = Bench(contract, tokenizer, estop_output="silence")
    try:
        b.publisher.set_estop(True)
        assert not b.publisher.publish_hold(HoldKind.ESTOP)
        assert not b.publish()
        assert b.recv(0.1) is None and b.counts.chunks == 0
    finally:
        b.close()


def test_release_forgets_the_last_command_only_on_release(bench):
    """After an e-stop the arm may have been moved: the first chunk is rate-limited from the
    trusted joint state, not from the command sent before the stop."""
    assert bench.publish()
    assert bench.guard.last_command is not None
    bench.publisher.set_estop(False)  # not engaged: nothing to release, nothing forgotten
    assert bench.guard.last_command is not None
    bench.publisher.set_estop(True)
    assert bench.guard.last_command is not None
    bench.publisher.set_estop(False)
    assert bench.guard.last_command is None


def test_a_retired_policy_is_dropped(bench):
    bench.policy.retired = True  # a deploy replaced it while its chunk was in flight
    assert not bench.publish()
    assert bench.recv(0.1) is None
    assert bench.counts.chunks == 0 and bench.policy.counts.published == 0


def test_a_replaced_thread_is_dropped(bench):
    bench.publisher.generation = 1  # what ServingLoop.replace_thread does
    assert not bench.publish(generation=0)
    assert bench.recv(0.1) is None
    assert bench.publish(generation=1)
    assert bench.recv() is not None


def test_an_expired_chunk_is_dropped(bench):
    validity = int(bench.contract.timing.action_validity_ms * 1e6)
    assert not bench.publish(age_ns=2 * validity)
    assert bench.policy.counts.expired == 1
    assert bench.recv(0.1) is None


def test_observers_see_the_release_chunk_before_the_guard(bench):
    seen = []
    bench.publisher.observers.append(lambda seq, chunk: seen.append((seq, chunk.copy())))
    raw = bench.chunk()
    raw[2, 0] = np.nan  # the guard replaces this chunk by the hold posture ...
    assert bench.publish(seq=3, actions=raw.copy())
    assert "nonfinite" in bench.recv().header["interventions"]
    assert len(seen) == 1 and seen[0][0] == 3
    np.testing.assert_array_equal(seen[0][1], raw)  # ... the observer compares the policy's own
    fallback = ServedPolicy(
        PolicyId("fallback1", "b@1"), bench.contract, FakeSession(bench.contract), bench.policy.tokenizer
    )
    assert bench.publish(fallback, seq=4)
    assert len(seen) == 1  # only the release's chunks are compared


def test_no_binding_hold_while_a_reanchor_is_in_question(bench):
    """Found at 150 ms in the closed-loop gate: a fallback during an episode's reset sent a
    binding hold at the pose from before the reset (the announcement not yet confirmed),
    1.9 rad from the arm. Until the announcement settles no hold goes out but the e-stop's;
    the next one starts from where it settled."""
    period = int(bench.contract.timing.control_period_ms * 1e6)
    reset = PROPRIO + np.array([1.5, 0.0, 0.0, 0.0], np.float32)
    t = bench.now + period
    assert bench.trusted.judge(reset, t, reanchor=True) is None and bench.trusted.pending is not None
    assert not bench.publisher.publish_hold(HoldKind.FALLBACK)
    assert not bench.publisher.publish_hold(HoldKind.STALE, 3, t, advisory=True)
    assert bench.recv(0.1) is None
    assert bench.trusted.judge(reset, t + period) is None and bench.trusted.pending is None  # confirmed
    assert bench.publisher.publish_hold(HoldKind.FALLBACK)
    msg = bench.recv()
    assert msg.header["source"] == "hold:fallback"
    np.testing.assert_allclose(msg.tensors["actions"], np.tile(reset[:2], (bench.contract.action.chunk_length, 1)))


def test_a_quiet_announcement_settles_when_a_hold_is_due(bench):
    """A controller that asks by request sends nothing after its announcement: the hold
    due 1.5 periods later settles it (believed: nothing contradicted it) and goes out."""
    period = int(bench.contract.timing.control_period_ms * 1e6)
    reset = PROPRIO + np.array([-1.0, 0.5, 0.0, 0.0], np.float32)
    now = time.monotonic_ns()
    assert bench.trusted.judge(reset, now, reanchor=True, receive_ns=now) is None
    assert not bench.publisher.publish_hold(HoldKind.FALLBACK)
    time.sleep(1.6 * period / 1e9)
    assert bench.publisher.publish_hold(HoldKind.FALLBACK) and bench.trusted.pending is None
    np.testing.assert_allclose(bench.recv().tensors["actions"][-1], reset[:2])
