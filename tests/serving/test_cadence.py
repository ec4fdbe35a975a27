"""Bridging holds (vlad.serving.cadence): a streaming controller whose command is late gets
one (a hung engine, refused observations, a camera that stopped while heartbeats go on); a
controller that executes each chunk for several periods and asks again only when it runs
out (openpi's action chunk broker) gets none between its requests, heartbeats or not.

The hold keeper's ``tick`` is called directly at chosen moments (its thread is not started),
on the in-process rig: real intake, guard and publisher, real inproc sockets.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from vlad.protocol import HoldKind
from vlad.serving.cadence import HoldKeeper
from vlad_tools.testing import wait_until


def _sleep_until(t_ns: int) -> None:
    time.sleep(max(0.0, (t_ns - time.monotonic_ns()) / 1e9))  # the controller's clock: the cadence is the test


def _answered(rig, seq: int) -> int:
    """Receive the chunk for observation ``seq``; the moment the publisher sent it."""
    msg = rig.recv()
    assert msg is not None and msg.header["obs_seq"] == seq, msg
    wait_until(lambda: rig.publisher.last_publish_ns > 0, what="the publish time")
    return rig.publisher.last_publish_ns


def _streaming(rig, period: int) -> tuple[HoldKeeper, int]:
    """A controller streaming observations: two answered back to back (their interval is what
    makes it one). The hold keeper, and when the second answer went out."""
    keeper = HoldKeeper(rig.loop, period)
    rig.send_obs(1)
    _answered(rig, 1)
    rig.send_obs(2)
    return keeper, _answered(rig, 2)


def test_a_chunk_executing_controller_gets_no_bridge_between_its_requests(rig):
    period = rig.loop.period_ns
    keeper = HoldKeeper(rig.loop, period)
    for seq in (1, 2, 3):
        t_ask = time.monotonic_ns()
        rig.send_obs(seq)
        published = _answered(rig, seq)
        # It executes that chunk for four periods and says it is alive every period, as
        # the openpi bridge does for its client; the hold keeper looks every half period.
        for k in range(1, 8):
            _sleep_until(published + k * period // 2)
            rig.send_heartbeat()
            keeper.tick(time.monotonic_ns())
        assert rig.recv(0.0) is None  # nothing went out between the requests
        _sleep_until(t_ask + 4 * period)
    assert rig.publisher.counts.holds["bridge"] == 0 and keeper.bridged == 0
    # The intake times the requests at receive (about 4 periods apart; a late wake-up of the
    # previous receive shortens the measured gap by that much), never the half-period heartbeats.
    assert rig.intake.observation_interval_ns > 3 * period


def test_a_streaming_controller_is_bridged_while_its_inference_is_late(rig):
    period = rig.loop.period_ns
    keeper = HoldKeeper(rig.loop, period)
    rig.send_obs(1)
    published = _answered(rig, 1)
    rig.session.gate = threading.Event()  # the next inference hangs
    rig.send_obs(2)  # the next period's observation (sent early: the interval is what counts)
    assert rig.session.entered.wait(5)
    keeper.tick(published + period)  # a period without a command is not late yet
    assert keeper.bridged == 0
    _sleep_until(published + 16 * period // 10)
    beats = rig.intake.counts.heartbeats
    rig.send_heartbeat()  # the controller is there, every period (read while the engine hangs)
    wait_until(lambda: rig.intake.counts.heartbeats > beats, what="the heartbeat read during the inference")
    keeper.tick(time.monotonic_ns())
    assert keeper.bridged == 1 and rig.publisher.counts.holds["bridge"] == 1
    hold = rig.recv()
    assert hold is not None and hold.header["source"] == "hold:bridge", hold.header
    assert hold.header["obs_seq"] == 2
    rig.session.gate.set()
    late = rig.recv()  # the late chunk still goes out, after the hold
    assert late is not None and late.header["obs_seq"] == 2 and late.header["source"] == "release"


def test_a_streaming_controller_is_bridged_when_its_camera_stops(rig):
    """Observations stop, heartbeats go on: holds every 1.5 periods until the sensor-stall
    monitor moves to the hold posture (the daemon's part, tests/daemon/test_faults.py). The last
    observation was answered, so the holds are about none (``obs_seq`` 0)."""
    period = rig.loop.period_ns
    keeper, published = _streaming(rig, period)
    for k in range(1, 7):
        _sleep_until(published + k * period // 2)
        rig.send_heartbeat()
        keeper.tick(time.monotonic_ns())
    assert keeper.bridged >= 1 and rig.publisher.counts.holds["bridge"] == keeper.bridged
    hold = rig.recv()
    assert hold is not None and hold.header["source"] == "hold:bridge" and hold.header["obs_seq"] == 0
    assert hold.header["advisory"] is True


def test_a_refused_observation_is_answered_at_once_with_an_advisory_hold(rig):
    period = rig.loop.period_ns
    keeper, published = _streaming(rig, period)
    # Joint positions far beyond the arm's limits: refused, counted, and answered by the
    # serving thread with a hold saying why; the cadence has nothing to bridge.
    bad = np.array([9.0, 9.0, 0.0, 0.0], np.float32)
    for k, seq in enumerate(range(3, 7), start=1):
        _sleep_until(published + k * period // 2)
        rig.send_obs(seq, proprio=bad)
        wait_until(lambda n=k: rig.intake.counts.input_rejected >= n, what="the refusal")
        hold = rig.recv()
        assert hold is not None and hold.header["source"] == "hold:rejected", hold.header
        assert hold.header["obs_seq"] == seq and hold.header["advisory"] is True
        assert hold.header["reason"] == "proprio_out_of_limits"
        # The hold posture is the last trusted joint state, never the refused one.
        assert np.allclose(hold.tensors["actions"], rig.trusted.positions, atol=1e-6)
        keeper.tick(time.monotonic_ns())
    assert keeper.bridged == 0 and rig.publisher.counts.holds["rejected"] == 4


def test_a_bridge_decided_before_an_answer_went_out_is_not_sent(rig):
    """The cadence thread decides outside the publisher's lock; the serving thread may answer
    meanwhile. The bridge is then dropped, so no hold ever follows the policy chunk for the
    same observation."""
    period = rig.loop.period_ns
    keeper, published = _streaming(rig, period)
    looked = rig.publisher.last_publish_ns - 1  # what a tick saw just before that chunk went out
    assert not rig.publisher.publish_hold(HoldKind.BRIDGE, 2, 0, advisory=True, unless_sent_after=looked)
    assert rig.recv(0.1) is None and rig.publisher.counts.holds["bridge"] == 0
    assert rig.publisher.answered == ("", 2)


def test_a_controller_that_declares_it_asks_by_request_is_never_bridged(rig):
    """Two requests one period apart (a late answer asked again) look like a stream; the
    controller's declared cadence says otherwise: it waits for nothing between requests."""
    period = rig.loop.period_ns
    rig.send_heartbeat("request")
    wait_until(lambda: rig.intake.controllers.only_requests, what="the declared cadence")
    keeper, published = _streaming(rig, period)
    for k in range(1, 7):
        _sleep_until(published + k * period // 2)
        rig.send_heartbeat("request")
        keeper.tick(time.monotonic_ns())
    assert keeper.bridged == 0 and rig.recv(0.0) is None
