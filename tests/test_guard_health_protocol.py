"""Unit tests of the pure pieces: the final guard, the fallback decisions, the wire format."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest

from vlad import protocol
from vlad.serving.guard import ActionGuard
from vlad.health.policy import HealthPolicy
from vlad.health.monitors import Finding
from vlad.health.state import State, StateMachine

NOW = 10_000_000_000
PERIOD = 20_000_000


# -- the final guard ---------------------------------------------------------------------


def _chunk(contract, value=0.0):
    return np.full((contract.action.chunk_length, contract.action.dim), value, np.float32)


def test_guard_passes_a_sane_chunk(contract):
    g = ActionGuard(contract)
    c = _chunk(contract, 0.1)
    r = g.check(c, np.zeros(4, np.float32), NOW, NOW + 1)
    assert r.interventions == () and r.actions is c and not r.replaced


def test_guard_replaces_nonfinite_with_hold_posture(contract):
    g = ActionGuard(contract)
    c = _chunk(contract, 0.1)
    c[3, 1] = np.nan
    proprio = np.array([0.5, -0.25, 0.0, 0.0], np.float32)
    r = g.check(c, proprio, NOW, NOW + 1)
    assert r.replaced and "nonfinite" in r.interventions
    np.testing.assert_allclose(r.actions, np.tile(proprio[:2], (contract.action.chunk_length, 1)))
    assert g.counts["nonfinite"] == 1


def test_guard_clamps_bounds_and_rate(contract):
    g = ActionGuard(contract)
    lo = np.array([j.lower for j in contract.action.joints])
    c = _chunk(contract, 0.0)
    c[:, 0] = lo[0] - 5.0  # far below the bound, and a jump bigger than the rate limit
    r = g.check(c, None, NOW, NOW + 1)
    assert "bounds" in r.interventions and "out_of_bounds" in r.interventions  # 5 rad beyond: gross
    assert (r.actions[:, 0] >= lo[0] - 1e-6).all()
    # next chunk jumps by far more than rate_limit per period relative to the last command
    c2 = _chunk(contract, 0.0)
    r2 = g.check(c2, None, NOW + PERIOD, NOW + PERIOD + 1)
    rate = np.array([j.rate_limit for j in contract.action.joints])
    assert "rate" in r2.interventions
    steps = np.abs(np.diff(np.vstack([r.actions[0], r2.actions]), axis=0))
    assert (steps <= rate + 1e-5).all()


def test_guard_drops_expired_chunks(contract):
    g = ActionGuard(contract)
    r = g.check(_chunk(contract), None, NOW, NOW - 1)
    assert r.actions is None and r.interventions == ("expired",)


def test_guard_bound_violation_can_hold(contract):
    action = dataclasses.replace(contract.action, on_bound_violation="hold")
    g = ActionGuard(dataclasses.replace(contract, action=action))
    r = g.check(_chunk(contract, 100.0), np.zeros(4, np.float32), NOW, NOW + 1)
    assert r.replaced and (r.actions == 0).all()


# -- fallback decisions ------------------------------------------------------------------


def _finding(code, scope, severity="fault", policy=None):
    return Finding("t", code, severity, scope, code, policy=policy)


@pytest.fixture()
def policy():
    return HealthPolicy(["release:a@1", "fallback1:b@1", "hold"], healthy_window_ns=2_000_000_000, events=StateMachine())


def test_policy_fault_quarantines_the_culprit_only(policy):
    d = policy.update([_finding("nonfinite_output", "policy", policy="release:a@1")], NOW)
    assert d.target == 1 and d.state == State.FALLBACK and 0 in policy.quarantined
    # a late fault of a policy no longer in the chain blames nobody
    d = policy.update([_finding("nonfinite_output", "policy", policy="release:gone@0")], NOW + 1)
    assert d.target == 1 and 1 not in policy.quarantined
    # healthy for longer than the window: still no automatic return to the quarantined release
    d = policy.update([], NOW + 10_000_000_000)
    assert d.target == 1
    policy.resume("op", "fixed")
    d = policy.update([], NOW + 20_000_000_000)
    assert d.target == 0 and d.state == State.ACTIVE


def test_system_fault_has_hysteresis(policy):
    assert policy.update([_finding("temperature_high", "system")], NOW).target == 1
    assert policy.update([], NOW + 1_000_000_000).target == 1  # inside the healthy window
    assert policy.update([_finding("temperature_high", "system")], NOW + 1_500_000_000).target == 1  # flaps: restart
    assert policy.update([], NOW + 3_000_000_000).target == 1
    d = policy.update([], NOW + 3_600_000_000)
    assert d.target == 0 and d.state == State.ACTIVE and not policy.quarantined


def test_input_and_controller_faults_hold(policy):
    assert policy.update([_finding("sensor_stall", "input")], NOW).target == 2
    assert policy.update([_finding("heartbeat_lost", "controller")], NOW + 1).target == 2


def test_warnings_only_degrade(policy):
    d = policy.update([_finding("temperature_warm", "system", severity="warn")], NOW)
    assert d.target == 0 and d.state == State.DEGRADED


def test_findings_are_recorded_once_per_episode(policy):
    f = _finding("sensor_stall", "input")
    for i in range(5):
        policy.update([f], NOW + i)
    policy.update([], NOW + 10)
    kinds = [e.kind for e in policy.events.events]
    assert kinds.count("fault") == 1 and kinds.count("cleared") == 1


# -- wire format -------------------------------------------------------------------------


def test_roundtrip_keeps_dtype_shape_and_bytes():
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    q = np.array([1.5, -2.0], np.float32)
    frames = protocol.encode(protocol.TOPIC_OBS, {"seq": 7, "t_sensor_ns": 5}, {"image/a": img, "proprio": q})
    msg = protocol.decode([bytes(f) for f in frames])
    assert msg.topic == b"obs" and msg.seq == 7 and msg.header["v"] == protocol.VERSION
    np.testing.assert_array_equal(msg.tensors["image/a"], img)
    assert msg.tensors["proprio"].dtype == np.float32


def test_big_endian_input_goes_out_little_endian():
    q = np.array([1.0, 2.0], dtype=">f4")
    frames = protocol.encode(protocol.TOPIC_OBS, {"seq": 1}, {"proprio": q})
    assert bytes(frames[2]) == np.array([1.0, 2.0], "<f4").tobytes()


@pytest.mark.parametrize(
    "frames,reason",
    [
        ([b"obs"], "malformed"),
        ([b"xyz", msgpack.packb({"v": 1, "kind": "xyz", "seq": 1})], "unknown_topic"),
        ([b"obs", b"\xc1"], "malformed"),
        ([b"obs", msgpack.packb({"v": 9, "kind": "obs", "seq": 1})], "bad_version"),
        ([b"obs", msgpack.packb({"v": 1, "kind": "act", "seq": 1})], "malformed"),
        ([b"obs", msgpack.packb({"v": 1, "kind": "obs", "seq": -1})], "malformed"),
        ([b"obs", msgpack.packb({"v": 1, "kind": "obs", "seq": 1, "tensors": [{"name": "x", "dtype": "object",
                                                                             "shape": [1]}]}), b"\0"], "bad_dtype"),
        ([b"obs", msgpack.packb({"v": 1, "kind": "obs", "seq": 1, "tensors": [{"name": "x", "dtype": "float32",
                                                                             "shape": [2]}]}), b"\0" * 7], "bad_shape"),
        ([b"obs", msgpack.packb({"v": 1, "kind": "obs", "seq": 1, "tensors": []}), b"extra"], "malformed"),
    ],
    ids=["one-frame", "topic", "not-msgpack", "version", "kind", "seq", "dtype", "size", "extra-frame"],
)
def test_bad_messages_are_refused_with_a_reason(frames, reason):
    with pytest.raises(protocol.ProtocolError) as exc:
        protocol.decode(frames)
    assert exc.value.reason == reason


def test_rate_limit_reanchors_on_a_robot_moved_externally(contract):
    """After the robot was moved (reset, hand-guiding), the limit applies from where it is,
    not from the last command, which would drag it back."""
    g = ActionGuard(contract)
    g.check(_chunk(contract, 2.0), np.array([2.0, 2.0, 0, 0], np.float32), NOW, NOW + 1)
    here = np.array([0.0, 0.0, 0, 0], np.float32)  # the arm is now at 0, not at 2
    c = _chunk(contract, 0.1)
    r = g.check(c, here, NOW + PERIOD, NOW + PERIOD + 1)
    assert "rate" not in r.interventions
    np.testing.assert_array_equal(r.actions, c)


def test_small_excursion_is_clamped_but_not_gross(contract):
    g = ActionGuard(contract)
    up = np.array([j.upper for j in contract.action.joints], np.float32)
    c = np.tile(up, (contract.action.chunk_length, 1)) + np.float32(0.01)
    r = g.check(c, None, NOW, NOW + 1)
    assert "bounds" in r.interventions and "out_of_bounds" not in r.interventions
    assert (r.actions <= up).all()
