"""The e-stop reader's timing: it blocks until a message or a due timer, and still notices
a silent bridge at its timeout (not later, and not by waking 200 times a second)."""

from __future__ import annotations

import time

import zmq

from vlad import protocol
from vlad.config import SafetyConfig
from vlad.daemon.safety import IDLE_WAIT_MS, EStop
from vlad.health.state import StateMachine
from vlad.serving.counters import PublishCounts
from vlad.serving.guard import ActionGuard
from vlad.serving.position import ServingState
from vlad.serving.publisher import Publisher
from vlad.serving.tracing import LatencyStats

PERIOD = 20_000_000


def _publisher(contract, ctx):
    sock = ctx.socket(zmq.PUB)
    sock.bind("inproc://actions-safety-test")
    return Publisher(
        contract, sock, ActionGuard(contract), LatencyStats(), PublishCounts(), ServingState(StateMachine(), "r")
    )


def test_the_reader_blocks_until_a_timer_is_due(contract, tmp_path):
    ctx = zmq.Context()
    try:
        pub = _publisher(contract, ctx)
        assert EStop(SafetyConfig(), None, pub, PERIOD, lambda *_: None)._wait_ms(5) == IDLE_WAIT_MS
        with_file = EStop(SafetyConfig(estop_file=str(tmp_path / "estop")), None, pub, PERIOD, lambda *_: None)
        assert with_file._wait_ms(5) == 5  # a file cannot wake anyone: read every quarter period
        bridge = EStop(SafetyConfig(require_bridge=True, bridge_timeout_ms=500), None, pub, PERIOD, lambda *_: None)
        assert bridge._wait_ms(5) == 5  # engaged until the bridge first speaks
        bridge.last_bridge_ns = time.monotonic_ns() - 450_000_000
        assert 1 <= bridge._wait_ms(5) <= 51  # wakes when the silence would reach the timeout
        bridge.last_bridge_ns = time.monotonic_ns() - 600_000_000
        assert bridge._wait_ms(5) == 5  # already silent: keeps looking, without spinning
    finally:
        ctx.destroy(0)


def test_a_silent_bridge_engages_at_its_timeout(contract):
    ctx = zmq.Context()
    try:
        pub = _publisher(contract, ctx)
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.bind("inproc://estop-safety-test")
        bridge = ctx.socket(zmq.PUB)
        bridge.connect("inproc://estop-safety-test")
        changes: list[tuple[bool, float]] = []
        cfg = SafetyConfig(require_bridge=True, bridge_timeout_ms=200)
        e = EStop(cfg, sub, pub, PERIOD, lambda engaged, _: changes.append((engaged, time.monotonic())))
        e.start()
        try:
            release = protocol.encode(protocol.TOPIC_ESTOP, {"seq": 1, "engaged": False, "source": "plc"})
            deadline = time.monotonic() + 5
            while not (changes and changes[-1][0] is False) and time.monotonic() < deadline:
                bridge.send_multipart(release)  # PUB/SUB: until the subscription has arrived
                time.sleep(0.01)  # one release message every 10 ms
            assert changes and changes[-1][0] is False, "the bridge's release never arrived"
            assert not pub.estop_engaged
            last_word = time.monotonic()  # the last release sent was at most ~10 ms before
            while not pub.estop_engaged and time.monotonic() < last_word + 5:
                time.sleep(0.005)  # polled at 5 ms: the timeout's latency is measured
            engaged_after = changes[-1][1] - last_word
            assert pub.estop_engaged and changes[-1][0] is True
            # The timeout is 200 ms; the reader sleeps until then, not a fixed 100 ms more.
            assert 0.15 <= engaged_after <= 0.2 + 0.5, engaged_after
            assert "silent" in e.reason
        finally:
            e.stop()
    finally:
        ctx.destroy(0)
