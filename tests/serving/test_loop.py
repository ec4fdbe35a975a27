"""The serving loop in process: latest wins, stale skip, the e-stop gate, fallback swaps and a
replaced thread, on real inproc sockets with a fake engine (no daemon subprocess)."""

from __future__ import annotations

import threading
import time

from tests.serving.rig import FakeSession
from vlad.errors import BackendError, RemoteUnavailable
from vlad.testing import wait_until


def test_one_observation_one_chunk(rig):
    rig.send_obs(1)
    msg = rig.recv()
    assert msg is not None
    h = msg.header
    assert (h["obs_seq"], h["source"], h["policy"], h["release"]) == (1, "release", "release:demo@1", "demo@1")
    assert msg.tensors["actions"].shape == (rig.contract.action.chunk_length, rig.contract.action.dim)
    # the serving thread counts a chunk as published just after sending it
    wait_until(lambda: rig.policy.counts.published == 1, what="the published count")
    assert rig.session.calls == 1


def test_a_burst_is_answered_with_the_newest_observation_only(rig):
    """While the engine is busy, observations queue; the next cycle serves the newest one
    and counts the others as superseded instead of working through a backlog."""
    rig.session.gate = threading.Event()
    rig.send_obs(1)
    assert rig.session.entered.wait(5)  # the engine is inside obs 1's inference
    for seq in range(2, 12):
        rig.send_obs(seq)
    # inproc delivers into the subscriber's queue as it sends: the whole burst is queued
    rig.session.gate.set()
    served = [rig.recv().header["obs_seq"], rig.recv().header["obs_seq"]]
    assert served == [1, 11]
    assert rig.recv(0.2) is None  # nothing for 2..10
    assert rig.intake.counts.superseded == 9
    assert rig.session.calls == 2


def test_a_stale_observation_is_answered_with_an_advisory_hold_without_inference(rig):
    rig.policy.max_age_ns = 500_000_000
    rig.send_obs(1, t_sensor_ns=time.monotonic_ns() - 5_000_000_000)
    hold = rig.recv()
    assert hold.header["source"] == "hold:stale" and hold.header["obs_seq"] == 1 and hold.header["advisory"] is True
    assert rig.policy.counts.stale == 1
    assert rig.session.calls == 0
    rig.send_obs(2)  # fresh again: served
    assert rig.recv().header["obs_seq"] == 2


def test_the_estop_keeps_the_policy_from_being_asked(rig):
    rig.publisher.set_estop(True)  # what the e-stop thread does
    rig.send_obs(1)
    wait_until(lambda: rig.intake.counts.observations == 1, what="the observation to arrive")
    assert rig.recv(0.2) is None
    assert rig.session.calls == 0


def test_an_estop_during_inference_stops_the_chunk_and_release_restarts_from_the_trusted_state(rig):
    rig.send_obs(1)
    assert rig.recv() is not None
    assert rig.guard.last_command is not None
    rig.session.gate = threading.Event()
    rig.session.entered.clear()
    rig.send_obs(2)
    assert rig.session.entered.wait(5)
    rig.publisher.set_estop(True)  # engaged while obs 2 is being computed
    rig.session.gate.set()
    wait_until(lambda: rig.policy.counts.estop_blocked == 1, what="the blocked chunk")
    assert rig.recv(0.1) is None
    rig.publisher.set_estop(False)
    # the robot may have been moved while stopped: rate limits start from the measurement
    assert rig.guard.last_command is None
    rig.send_obs(3)
    assert rig.recv().header["obs_seq"] == 3


def test_a_fallback_swap_answers_the_newest_observation_at_once(rig):
    rig.send_obs(1)
    assert rig.recv().header["policy"] == "release:demo@1"
    backup = rig.served("fallback1", "backup@1")
    rig.publisher.expect_swap("fallback1", time.monotonic_ns())
    rig.loop.active = backup  # what the supervisor does on a fault ...
    rig.loop.wake()  # ... and the newest observation is served again without waiting
    h = rig.recv().header
    assert (h["obs_seq"], h["source"], h["policy"]) == (1, "fallback1", "fallback1:backup@1")
    assert backup.session.calls == 1 and rig.session.calls == 1
    # recorded just after the send, under the publisher's lock
    wait_until(lambda: [s["to"] for s in rig.publisher.swap_ms] == ["fallback1"], what="the swap timing")

    rig.loop.active = None  # the hold posture: no model runs
    rig.loop.wake()
    h = rig.recv().header
    assert (h["obs_seq"], h["source"], h["policy"]) == (1, "hold:fallback", "hold")
    assert backup.session.calls == 1
    wait_until(lambda: rig.publisher.counts.holds["fallback"] == 1, what="the hold count")


def test_an_engine_failure_answers_with_the_hold_posture(rig):
    rig.session.error = BackendError("injected")
    rig.send_obs(1)
    h = rig.recv().header
    assert (h["obs_seq"], h["source"]) == (1, "hold:backend_error")
    assert rig.policy.counts.backend_errors == 1 and rig.policy.counts.remote_errors == 0

    rig.session.error = RemoteUnavailable("server gone")  # not the policy's fault: counted apart
    rig.send_obs(2)
    h = rig.recv().header
    assert (h["obs_seq"], h["source"]) == (2, "hold:remote_unavailable")
    assert rig.policy.counts.backend_errors == 1 and rig.policy.counts.remote_errors == 1


def test_a_replaced_thread_never_publishes(rig):
    """A hung engine holds its thread; the successor serves, and the hung call's chunk is
    dropped when it finally returns."""
    rig.session.gate = threading.Event()
    rig.send_obs(1)
    assert rig.session.entered.wait(5)
    assert rig.loop.in_flight is not None and rig.loop.in_flight.policy is rig.policy
    backup = rig.served("fallback1", "backup@1", FakeSession(rig.contract, value=0.1))
    rig.loop.active = backup
    rig.loop.replace_thread()
    rig.send_obs(2)
    h = rig.recv().header
    assert (h["obs_seq"], h["policy"]) == (2, "fallback1:backup@1")
    rig.session.gate.set()  # the hung inference of obs 1 returns now
    wait_until(lambda: rig.policy.counts.cycles == 1 and rig.loop.generation == 1)
    assert rig.recv(0.3) is None
    assert rig.policy.counts.published == 0
