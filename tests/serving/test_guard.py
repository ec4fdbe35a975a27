"""The final guard and the trusted joint state: what reaches a command, and what never does."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vlad.config import GuardConfig
from vlad.serving.guard import EXPIRE_PERIODS, WITNESS_PERIODS, ActionGuard, Executing, Sent, TrustedState

NOW = 10_000_000_000
PERIOD = 20_000_000
VALID = 8 * PERIOD  # an action validity shorter than the chunk: expiry is part of what is tested


def _chunk(contract, value=0.0):
    return np.full((contract.action.chunk_length, contract.action.dim), value, np.float32)


def _q(a, b):
    return np.array([a, b, 0.0, 0.0], np.float32)


def _trusted(contract, *positions, t0=NOW):
    """A trusted state fed with observations one period apart."""
    ts = TrustedState(contract)
    for k, q in enumerate(positions):
        assert ts.judge(_q(*q), t0 + k * PERIOD) is None
    return ts


def test_guard_passes_a_sane_chunk(contract):
    g = ActionGuard(contract, _trusted(contract, (0.1, 0.1)))
    c = _chunk(contract, 0.1)
    r = g.check(c, NOW, NOW + 1)
    assert r.interventions == () and r.actions is c and not r.replaced


def test_guard_replaces_nonfinite_with_hold_posture_from_the_trusted_state(contract):
    g = ActionGuard(contract, _trusted(contract, (0.5, -0.25)))
    c = _chunk(contract, 0.1)
    c[3, 1] = np.nan
    r = g.check(c, NOW, NOW + 1)
    assert r.replaced and "nonfinite" in r.interventions
    np.testing.assert_allclose(r.actions, np.tile([0.5, -0.25], (contract.action.chunk_length, 1)))
    assert g.counts["nonfinite"] == 1


def test_guard_clamps_bounds_and_seams(contract):
    g = ActionGuard(contract)
    lo = np.array([j.lower for j in contract.action.joints])
    c = _chunk(contract, 0.0)
    c[:, 0] = lo[0] - 5.0  # far below the bound, and a jump bigger than the rate limit
    r = g.check(c, NOW, NOW + VALID)
    assert "bounds" in r.interventions and "out_of_bounds" in r.interventions  # 5 rad beyond: gross
    assert (r.actions[:, 0] >= lo[0] - 1e-6).all()
    # No trusted state, nothing sent: the robot holds the middle of the range; the chunk starts there.
    assert "seam" in r.interventions and "rate" in r.interventions
    mid = (lo + np.array([j.upper for j in contract.action.joints])) / 2
    rate = np.array([j.rate_limit for j in contract.action.joints])
    assert (np.abs(r.actions[0] - mid) <= rate + 1e-5).all()
    executed = r.actions[0].copy()  # what a controller following the newest chunk runs in slot 0
    r2 = g.check(_chunk(contract, 1.0), NOW + PERIOD, NOW + PERIOD + VALID)
    assert "seam" in r2.interventions
    steps = np.abs(np.diff(np.vstack([executed, r2.actions]), axis=0))
    assert (steps <= rate + 1e-5).all()


def test_decisions_are_the_checks_the_guard_corrects_by(contract):
    """What the gates compare (ActionGuard.decisions) is what check() clamps: a chunk it
    finds nothing in passes untouched; a bound or a step beyond the rate limit is flagged
    where check() corrects it."""
    g = ActionGuard(contract, _trusted(contract, (0.1, 0.1)))
    sane = _chunk(contract, 0.1)
    assert not g.decisions(sane, _q(0.1, 0.1)).any()
    assert g.check(sane.copy(), NOW, NOW + 1).interventions == ()
    hi = np.array([j.upper for j in contract.action.joints], np.float32)
    rate = contract.action.joints[0].rate_limit
    c = _chunk(contract, 0.1)
    c[5:, 0] += 2 * rate  # one step beyond the rate limit at waypoint 5
    c[9, 1] = hi[1] + 0.01  # above joint1's upper bound at waypoint 9 (and steps to it and back)
    d = g.decisions(c, _q(0.1, 0.1))
    assert d.shape == (contract.action.chunk_length, contract.action.dim, 3)
    assert {tuple(x) for x in np.argwhere(d)} >= {(5, 0, 2), (9, 1, 1)} and not d[:, :, 0].any()
    assert not g.decisions(c)[0].any()  # no measured position: nothing to step from
    m = g.margins(c, _q(0.1, 0.1))  # how far from each threshold
    assert m.shape == d.shape and abs(m[9, 1, 1] - 0.01) < 1e-5 and abs(m[5, 0, 2] - rate) < 1e-5
    assert {"bounds", "rate"} <= set(g.check(c, NOW, NOW + 1).interventions)  # corrects c in place


def test_guard_drops_expired_chunks(contract):
    g = ActionGuard(contract)
    r = g.check(_chunk(contract), NOW, NOW - 1)
    assert r.actions is None and r.interventions == ("expired",)


def test_guard_bound_violation_can_hold(contract):
    action = dataclasses.replace(contract.action, on_bound_violation="hold")
    c2 = dataclasses.replace(contract, action=action)
    g = ActionGuard(c2, _trusted(c2, (0.0, 0.0)))
    r = g.check(_chunk(contract, 100.0), NOW, NOW + 1)
    assert r.replaced and (r.actions == 0).all()


def test_small_excursion_is_clamped_but_not_gross(contract):
    g = ActionGuard(contract)
    up = np.array([j.upper for j in contract.action.joints], np.float32)
    c = np.tile(up, (contract.action.chunk_length, 1)) + np.float32(0.01)
    r = g.check(c, NOW, NOW + 1)
    assert "bounds" in r.interventions and "out_of_bounds" not in r.interventions
    assert (r.actions <= up).all()


def test_first_chunk_is_limited_from_the_trusted_state(contract):
    """No last command (start, e-stop released): the first waypoint may move at most one
    rate limit from where the robot is, not jump anywhere."""
    g = ActionGuard(contract, _trusted(contract, (0.0, 0.0)))
    r = g.check(_chunk(contract, 2.0), NOW + PERIOD, NOW + PERIOD + 1)
    assert "seam" in r.interventions
    assert np.abs(r.actions[0]).max() <= 0.25 + 1e-6


# -- the trusted state -------------------------------------------------------------------


def test_a_forged_jump_is_refused_and_never_reaches_a_command(contract):
    """One forged [3.9, 2.9] among genuine observations: refused, and neither the hold
    posture nor the rate-limit reference moves there."""
    ts = _trusted(contract, (0.0, 0.0), (0.01, 0.0))
    g = ActionGuard(contract, ts)
    g.check(_chunk(contract, 0.01), NOW + PERIOD, NOW + 2 * PERIOD)
    assert ts.judge(_q(3.9, 2.9), NOW + 2 * PERIOD) == "implausible_proprio"
    np.testing.assert_allclose(g.hold_posture()[0], [0.01, 0.0])
    r = g.check(_chunk(contract, 3.9), NOW + 2 * PERIOD, NOW + 3 * PERIOD)
    assert np.abs(r.actions[0] - [0.01, 0.01]).max() <= 0.25 + 1e-5
    # the next genuine observation is consistent with the trusted state again
    assert ts.judge(_q(0.02, 0.0), NOW + 3 * PERIOD) is None


def test_beyond_the_joint_limits_is_refused(contract):
    ts = TrustedState(contract)
    assert ts.judge(_q(10.0, 0.0), NOW) == "proprio_out_of_limits"
    assert ts.positions is None


def test_an_external_move_reanchors_after_a_consistent_run(contract):
    """A reset or hand-guiding: a run of consistent observations elsewhere is believed
    after ``reanchor_observations``, and the next chunk is limited from there."""
    cfg = GuardConfig(reanchor_observations=3)
    ts = TrustedState(contract, cfg)
    g = ActionGuard(contract, ts, cfg)
    assert ts.judge(_q(2.0, 2.0), NOW) is None
    g.check(_chunk(contract, 2.0), NOW, NOW + 1)
    verdicts = [ts.judge(_q(-2.0, -2.0), NOW + k * PERIOD) for k in (1, 2, 3)]
    assert verdicts == ["implausible_proprio", "implausible_proprio", None]
    assert ts.reanchors == 1
    c = _chunk(contract, -1.9)
    r = g.check(c, NOW + 3 * PERIOD, NOW + 4 * PERIOD)
    assert r.interventions == ()  # limited from -2.0 (the robot), not from 2.0
    np.testing.assert_array_equal(r.actions, c)


def test_a_burst_of_consistent_forged_states_never_reanchors(contract):
    """A forger repeating the same joint state many times between two genuine observations
    is consistent in count but not over time: no re-anchor (found by tests/daemon/test_hostile.py
    against the live daemon; before, 3 identical forged messages moved the trusted state)."""
    ts = _trusted(contract, (0.0, 0.0))
    for k in range(1, 30):
        t = NOW + k * PERIOD
        assert ts.judge(_q(0.0, 0.0), t) is None  # the real controller
        for i in range(10):  # the forger: 10 identical states within 2 ms
            assert ts.judge(_q(3.0, 2.5), t + 1 + i * 200_000) == "implausible_proprio"
    assert ts.reanchors == 0
    np.testing.assert_allclose(ts.positions, [0.0, 0.0])
    # the same burst with nobody contradicting it still needs its run to span the periods
    ts = _trusted(contract, (0.0, 0.0))
    burst = [ts.judge(_q(3.0, 2.5), NOW + 1 + i * 200_000) for i in range(10)]
    assert set(burst) == {"implausible_proprio"} and ts.reanchors == 0
    assert ts.judge(_q(3.0, 2.5), NOW + 2 * PERIOD + 1) is None and ts.reanchors == 1


def test_an_inconsistent_run_never_reanchors(contract):
    """Forged values that jump around between the genuine stream are never believed."""
    ts = _trusted(contract, (0.0, 0.0))
    for k in range(1, 30):
        t = NOW + k * PERIOD
        assert ts.judge(_q(0.0, 0.0), t) is None  # the real controller
        q = (3.0, 2.5) if k % 2 else (-3.0, -2.5)  # the forger, never consistent with itself
        assert ts.judge(_q(*q), t + PERIOD // 2) == "implausible_proprio"
    assert ts.reanchors == 0
    np.testing.assert_allclose(ts.positions, [0.0, 0.0])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(-50, 50, allow_nan=False), st.floats(-50, 50, allow_nan=False), st.booleans()),
        min_size=1,
        max_size=30,
    ),
    st.lists(st.one_of(st.floats(-1e6, 1e6), st.sampled_from([np.nan, np.inf, -np.inf])), min_size=16, max_size=16),
)
def test_no_observation_moves_a_command_beyond_the_contract(contract, observations, chunk_values):
    """Property: whatever observations arrive (announced re-anchors included) and whatever the
    policy outputs, every published command is within the bounds, and a robot executing the
    newest chunk never steps more than one rate limit per period, unless a later observation
    confirmed that the arm itself moved (a re-anchor)."""
    ts = TrustedState(contract)
    g = ActionGuard(contract, ts)
    lo = np.array([j.lower for j in contract.action.joints])
    hi = np.array([j.upper for j in contract.action.joints])
    rate = np.array([j.rate_limit for j in contract.action.joints])
    executed, before = None, 0  # what the robot commanded in the last slot; re-anchors until then
    base = np.asarray(chunk_values, np.float32).reshape(4, 4)[:, : contract.action.dim]
    chunk = np.resize(base, (contract.action.chunk_length, contract.action.dim))
    for k, (a, b, announce) in enumerate(observations):
        t = NOW + k * PERIOD
        ts.judge(_q(a, b), t, reanchor=announce)
        ts.settle(t)
        reanchors = ts.reanchors
        r = g.check(chunk.copy(), t, t + VALID)
        out = r.actions
        assert (out >= lo - 1e-5).all() and (out <= hi + 1e-5).all()
        assert (np.abs(np.diff(out, axis=0)) <= rate + 1e-4).all()
        if executed is not None and reanchors == before:
            assert (np.abs(out[0] - executed) <= rate + 1e-4).all()
        executed, before = out[0].copy(), reanchors


def test_hold_posture_without_any_trusted_state_is_inside_the_bounds(contract):
    g = ActionGuard(contract)
    mid = [(j.lower + j.upper) / 2 for j in contract.action.joints]
    np.testing.assert_allclose(g.hold_posture(), np.tile(mid, (contract.action.chunk_length, 1)))


class _NumpyJudge:
    """The trusted-state judgement as it was written in numpy before it moved to plain
    floats (for speed on cold caches): the reference the new one must agree with."""

    def __init__(self, ts: TrustedState) -> None:
        self.ts = ts  # configuration only (limits, steps, mapping); state is kept here
        self.positions = None
        self.t_ns = 0
        self.candidate, self.candidate_t, self.candidate_t0, self.run = None, 0, 0, 0

    def _allowed(self, dt_ns):
        ts = self.ts
        return ts.step * (max(1.0, dt_ns / ts.period_ns) if ts.period_ns else 1.0) + 1e-6

    def judge(self, proprio, t):
        ts = self.ts
        m = np.asarray([i >= 0 for i in ts.index])
        q = np.where(m, proprio[np.asarray([max(i, 0) for i in ts.index])].astype(np.float64), np.nan)
        if ((q[m] < ts.lo[m]) | (q[m] > ts.hi[m])).any():
            return "proprio_out_of_limits"
        if self.positions is None:
            self.positions, self.t_ns, self.candidate, self.run = q.astype(np.float32), t, None, 0
            return None
        if t < self.t_ns:
            ok = (np.abs(q[m] - self.positions[m]) <= self._allowed(self.t_ns - t)[m]).all()
            return None if ok else "implausible_proprio"
        if (np.abs(q[m] - self.positions[m]) <= self._allowed(t - self.t_ns)[m]).all():
            self.positions, self.t_ns, self.candidate, self.run = q.astype(np.float32), t, None, 0
            return None
        c = self.candidate
        if c is not None and (np.abs(q[m] - c[m]) <= self._allowed(t - self.candidate_t)[m]).all():
            self.run += 1
        else:
            self.run, self.candidate_t0 = 1, t
        self.candidate, self.candidate_t = q, t
        if self.run < ts.confirm or t - self.candidate_t0 < ts.min_span_ns:
            return "implausible_proprio"
        self.positions, self.t_ns, self.candidate, self.run = q.astype(np.float32), t, None, 0
        return None


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(-4.0, 4.0, width=32),
            st.floats(-4.0, 4.0, width=32),
            st.integers(-2 * PERIOD, 4 * PERIOD),
            st.booleans(),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_the_plain_float_judgement_agrees_with_the_numpy_reference(contract, steps):
    """Same verdicts and the same trusted positions, observation by observation: jumps,
    runs toward a re-anchor, late frames, values beyond the limits."""
    ts = TrustedState(contract)
    ref = _NumpyJudge(ts)
    t = NOW
    for a, b, dt, small in steps:
        if small and ts.positions is not None:  # a plausible move from the trusted state
            a, b = float(ts.positions[0]) + a / 100, float(ts.positions[1]) + b / 100
        t += dt
        q = _q(a, b)
        assert ts.judge(q, t) == ref.judge(q, t)
        if ref.positions is None:
            assert ts.positions is None
        else:
            np.testing.assert_array_equal(ts.positions, ref.positions)


# -- announced re-anchors -------------------------------------------------------------------------


def test_an_announced_jump_is_believed_once_the_next_observation_confirms_it(contract):
    """An episode reset: the announced state is provisional (the observation is served, its
    chunk waits) until the controller's next observation shows the arm there too."""
    ts = _trusted(contract, (0.1, 0.1))
    assert ts.judge(_q(2.0, -1.5), NOW + PERIOD, reanchor=True) is None
    assert ts.provisional == 1 and ts.pending is not None
    np.testing.assert_allclose(ts.positions, [0.1, 0.1])  # not believed yet
    assert ts.judge(_q(2.0, -1.5), NOW + PERIOD + 5_000_000) is None  # too soon to confirm: a burst
    assert ts.provisional == 1 and ts.reanchors == 0
    assert ts.judge(_q(2.01, -1.5), NOW + 2 * PERIOD) is None  # the next period: confirmed
    assert ts.provisional == 0 and ts.confirmed_id == 1 and ts.reanchors == 1 and ts.pending is None
    np.testing.assert_allclose(ts.positions, [2.01, -1.5], atol=1e-6)
    g = ActionGuard(contract, ts)
    r = g.check(_chunk(contract, 0.0) + np.array([2.1, -1.4], np.float32), NOW + 2 * PERIOD, NOW + 2 * PERIOD + VALID)
    assert r.interventions == ()  # 0.1 rad from the new state: within the rate limit


def test_a_forged_announcement_is_contradicted_by_the_real_controller_and_never_believed(contract):
    """Found from outside: one forged ``reanchor`` made the binding hold command the forged
    position (3.38 rad in one period). Now the real controller's next observation, where
    the arm still is, drops it; neither the hold nor any chunk ever went there."""
    ts = _trusted(contract, (0.0, 0.0), (0.01, 0.0))
    g = ActionGuard(contract, ts)
    g.check(_chunk(contract, 0.01), NOW + PERIOD, NOW + PERIOD + VALID)
    assert ts.judge(_q(3.39, 0.0), NOW + PERIOD + 1_000_000, reanchor=True) is None  # the forgery
    assert ts.provisional == 1
    np.testing.assert_allclose(g.hold_posture()[0], [0.01, 0.0])
    assert ts.judge(_q(0.02, 0.0), NOW + 2 * PERIOD) is None  # the real arm
    assert ts.pending is None and ts.contradicted == 1 and ts.reanchors == 0 and ts.provisional == 0
    assert not ts.settle(NOW + 10 * PERIOD)
    np.testing.assert_allclose(ts.positions, [0.02, 0.0], atol=1e-6)


def test_an_announcement_nothing_contradicts_settles_after_one_and_a_half_periods(contract):
    """A controller that asks only when it needs a chunk (openpi) sends nothing after its
    announcement: silence confirms it, later than a stream would."""
    ts = _trusted(contract, (0.0, 0.0))
    t = NOW + PERIOD
    assert ts.judge(_q(3.5, 0.0), t, reanchor=True) is None
    assert not ts.settle(t + PERIOD)
    assert ts.settle(t + 3 * PERIOD // 2) and ts.confirmed_id == 1 and ts.reanchors == 1
    np.testing.assert_allclose(ts.positions, [3.5, 0.0])
    # an observation in between (even too soon to confirm) leaves the confirmation to the next one
    t2 = t + 6 * PERIOD
    assert ts.judge(_q(-3.5, 0.0), t2, reanchor=True) is None and ts.provisional == 2
    assert ts.judge(_q(-3.5, 0.0), t2 + 1_000_000) is None and ts.provisional == 2
    assert not ts.settle(t2 + 10 * PERIOD)


def test_a_stalled_controller_witnesses_and_no_other_name_confirms_a_forgery(contract):
    """Found under load: the real controller stalled 30 ms and that silence confirmed a forged
    announcement. Every controller that observed lately is a witness: neither silence, nor
    the forger's own later observation, nor a second name of the forger confirms while the
    witness has not agreed; its next observation, 80 ms later, still contradicts it."""
    ts = TrustedState(contract)
    for k in range(3):
        assert ts.judge(_q(0.01 * k, 0.0), NOW + k * PERIOD, client="arm") is None
    t = NOW + 2 * PERIOD + 1_000_000  # right after the arm's last observation; then it stalls
    assert ts.judge(_q(3.39, 0.0), t, reanchor=True, client="forger") is None
    assert not ts.settle(t + 2 * PERIOD)  # silence: the arm observed 1 ms before
    assert ts.judge(_q(3.39, 0.0), t + PERIOD, client="forger") is None and ts.provisional == 1
    assert ts.judge(_q(3.39, 0.0), t + PERIOD + 1, client="forger-2") is None and ts.provisional == 1
    assert not ts.settle(t + 3 * PERIOD) and ts.reanchors == 0
    assert ts.judge(_q(0.03, 0.0), t + 4 * PERIOD, client="arm") is None  # the arm, where it was
    assert ts.pending is None and ts.contradicted == 1 and ts.reanchors == 0
    np.testing.assert_allclose(ts.positions, [0.03, 0.0], atol=1e-6)


def test_an_announcement_waits_for_a_witness_to_agree_or_fall_silent_a_liveness_limit(contract):
    """A controller taking over announces its reset: confirmed when the other controller that
    observed lately shows the arm there too, or once that one has been silent for
    ``WITNESS_PERIODS`` (as long as liveness gives it), by observation or by silence."""
    last = NOW + PERIOD  # the old controller's last observation
    t = last + PERIOD  # the new one's announcement

    def taken_over() -> TrustedState:
        ts = TrustedState(contract)
        for k in range(2):
            assert ts.judge(_q(0.0, 0.0), NOW + k * PERIOD, client="old") is None
        assert ts.judge(_q(2.0, 0.0), t, reanchor=True, client="new") is None
        return ts

    # the witness agrees: a real move seen by both
    ts = taken_over()
    assert ts.judge(_q(2.0, 0.0), t + PERIOD, client="new") is None and ts.provisional == 1
    assert ts.judge(_q(2.0, 0.0), t + PERIOD + 1, client="old") is None
    assert ts.provisional == 0 and ts.reanchors == 1 and ts.pending is None
    # the witness fell silent: the announcer's own observation confirms once it has been long enough
    ts = taken_over()
    k = 1
    while ts.pending is not None:
        assert ts.judge(_q(2.0, 0.0), t + k * PERIOD, client="new") is None
        k += 1
    assert ts.reanchors == 1 and t + (k - 1) * PERIOD == last + WITNESS_PERIODS * PERIOD
    # ... and by silence, for a controller that asks by request
    ts = taken_over()
    assert not ts.settle(last + WITNESS_PERIODS * PERIOD - 1)
    assert ts.settle(last + WITNESS_PERIODS * PERIOD) and ts.reanchors == 1


def test_an_old_sensor_time_neither_announces_nor_turns_a_witness_into_agreement(contract):
    """Found in review: an announcement stamped a minute ago made any state "agree" with it
    (the allowed move grows with the sensor-time gap), so the real arm's next observation
    only removed itself from the witnesses and a second forger name confirmed. An
    announcement older than the trusted state is a late frame; and a witness's observation
    of the old state contradicts an announcement whatever else it fits."""
    ts = TrustedState(contract)
    for k in range(3):
        assert ts.judge(_q(0.0, 0.0), NOW + k * PERIOD, client="arm") is None
    assert ts.judge(_q(0.0, 0.0), NOW + 2 * PERIOD + 1, client="forger-2") is None  # a witness too
    t = NOW + 2 * PERIOD + 2_000_000
    ts.judge(_q(3.0, 0.0), t - 60_000_000_000, reanchor=True, receive_ns=t, client="forger")  # a late frame
    assert ts.pending is None and ts.announced == 0
    # the same announcement stamped now, while the arm stalls four periods
    assert ts.judge(_q(3.0, 0.0), t, reanchor=True, client="forger") is None and ts.pending is not None
    assert ts.judge(_q(0.0, 0.0), t + 4 * PERIOD, client="arm") is None  # the old state: contradicted
    assert ts.pending is None and ts.contradicted == 1
    assert ts.judge(_q(3.0, 0.0), t + 4 * PERIOD + 1, client="forger-2") == "implausible_proprio"
    assert ts.reanchors == 0
    np.testing.assert_allclose(ts.positions, [0.0, 0.0])


def test_a_witness_that_never_agrees_holds_an_announcement_for_ten_periods_at_most(contract):
    """Found in review: a witness sending refused or late observations kept an announcement
    pending for ever (its chunk held back, and every hold but the e-stop's). Only believed
    observations keep a controller a witness, and an announcement nothing confirmed within
    ``EXPIRE_PERIODS`` is dropped and counted."""
    ts = TrustedState(contract)
    assert ts.judge(_q(0.0, 0.0), NOW, client="arm") is None
    assert ts.judge(_q(0.0, 0.0), NOW + 1, client="other") is None
    t = NOW + PERIOD
    assert ts.judge(_q(2.0, 0.0), t, reanchor=True, client="arm") is None  # "other" is a witness
    k = 0
    while ts.pending is not None:
        k += 1
        rx = t + k * PERIOD
        assert ts.judge(_q(50.0, 0.0), rx, client="other") == "proprio_out_of_limits"  # refused
        # the announced state with a sensor time before the announcement: too soon, proves nothing
        assert ts.judge(_q(2.0, 0.0), NOW - 1, receive_ns=rx, client="other") is None and ts.provisional == 1
        assert ts.judge(_q(2.0, 0.0), rx + 1, client="arm") is None
    # "other" had nothing believed for 5 periods: the arm's own observation confirmed it then
    assert ts.confirmed_id == 1 and ts.reanchors == 1 and ts.expired == 0
    assert t + k * PERIOD + 1 == NOW + 1 + WITNESS_PERIODS * PERIOD
    # an announcement whose announcer then sends neither state, with no witness: dropped at 10 periods
    t1 = t + k * PERIOD + 1
    for j in range(1, 7):
        assert ts.judge(_q(2.0, 0.0), t1 + j * PERIOD, client="arm") is None
    t2 = t1 + 7 * PERIOD
    assert ts.judge(_q(-2.0, 0.0), t2, reanchor=True, client="arm") is None and ts.pending is not None
    assert ts.judge(_q(0.0, 1.5), t2 + PERIOD, client="arm") == "implausible_proprio"  # neither state
    assert not ts.settle(t2 + EXPIRE_PERIODS * PERIOD - 1) and ts.pending is not None
    assert not ts.settle(t2 + EXPIRE_PERIODS * PERIOD) and ts.pending is None and ts.expired == 1
    assert ts.reanchors == 1


def test_silence_confirms_even_when_nothing_looked_for_ten_periods_and_no_late_frame_contradicts(contract):
    """Found in review: a request-cadence controller's reset was dropped as expired when the
    serving thread first looked after 10 periods, though silence had confirmed it long
    before; and another name's observation stamped a minute ago "contradicted" a reset."""
    ts = _trusted(contract, (0.0, 0.0))
    t = NOW + PERIOD
    assert ts.judge(_q(2.0, 0.0), t, reanchor=True) is None
    assert ts.settle(t + (EXPIRE_PERIODS + 2) * PERIOD) and ts.reanchors == 1 and ts.expired == 0
    ts = _trusted(contract, (0.0, 0.0))
    assert ts.judge(_q(2.0, 0.0), t, reanchor=True) is None
    assert ts.judge(_q(2.0, 0.0), t + 3 * PERIOD) is None  # its next request, the first look: confirmed
    assert ts.confirmed_id == 1 and ts.expired == 0
    np.testing.assert_allclose(ts.positions, [2.0, 0.0])
    # another name, an ancient sensor time, the old state: no contradiction of the next reset
    t2 = t + 10 * PERIOD
    assert ts.judge(_q(-2.0, 0.0), t2, reanchor=True) is None
    ts.judge(_q(2.0, 0.0), t2 - 60_000_000_000, receive_ns=t2 + 1, client="other")
    assert ts.pending is not None and ts.contradicted == 0
    assert ts.judge(_q(-2.0, 0.0), t2 + PERIOD) is None and ts.confirmed_id == 2


def test_a_controller_made_late_by_a_producer_stamping_ahead_is_still_a_witness(contract):
    """Found in review: a forger stamping the true position 4 ms ahead made every observation
    of the real controller a late frame, so it stopped counting as a witness, and then
    confirmed its own announcement between two of them. Believed recent late frames keep
    their controller a witness; its next one contradicts the forgery."""
    ts = TrustedState(contract)
    rx = NOW
    for k in range(8):
        rx = NOW + k * PERIOD
        assert ts.judge(_q(0.0, 0.0), rx + 4_000_000, receive_ns=rx - 2_000_000, client="forger") is None
        assert ts.judge(_q(0.0, 0.0), rx, client="arm") is None  # a late frame, believed
    assert ts.judge(_q(2.5, -2.5), rx + 4_000_000, reanchor=True, receive_ns=rx + 1_000_000, client="forger") is None
    assert ts.judge(_q(2.5, -2.5), rx + 19_000_000, receive_ns=rx + 17_000_000, client="forger") is None
    assert ts.pending is not None and ts.reanchors == 0  # the arm has not agreed
    assert ts.judge(_q(0.0, 0.0), rx + PERIOD, client="arm") is None
    assert ts.pending is None and ts.contradicted == 1 and ts.reanchors == 0
    np.testing.assert_allclose(ts.positions, [0.0, 0.0])


def test_announcements_are_rationed_on_the_daemons_clock_not_the_senders(contract):
    """Found from outside: alternating sensor times now / now - 200 ms got 91 announcements a
    second honoured against a documented 10. The interval is judged on receive times."""
    cfg = GuardConfig(reanchor_min_interval_ms=100.0)
    ts = TrustedState(contract, cfg)
    assert ts.judge(_q(0.0, 0.0), NOW) is None
    honoured = 0
    for k in range(100):  # 1 s of announcements every 10 ms, far from each other
        rx = NOW + (k + 1) * 10_000_000
        t_sensor = rx if k % 2 else rx - 200_000_000
        q = (2.0, 2.0) if k % 2 else (-2.0, -2.0)
        before = ts.announced
        ts.judge(_q(*q), t_sensor, reanchor=True, receive_ns=rx)
        honoured += ts.announced - before
    assert honoured <= 10


def test_announced_jumps_beyond_the_joint_limits_are_refused(contract):
    """Found from outside: 4.4 announced with upper 4.0 was trusted (within the 10 % margin an
    ordinary measurement gets). An announcement is honoured only within the limits themselves."""
    ts = _trusted(contract, (0.1, 0.1))
    upper = contract.action.joints[0].upper
    span = upper - contract.action.joints[0].lower
    assert ts.judge(_q(upper + 0.11 * span, 0.0), NOW + 20 * PERIOD, reanchor=True) == "proprio_out_of_limits"
    assert ts.judge(_q(upper + 0.05 * span, 0.0), NOW + 2 * PERIOD, reanchor=True) == "implausible_proprio"
    assert ts.pending is None and ts.announced == 0


# -- what the robot executes: the seams ---------------------------------------------------------


def test_a_second_answer_to_one_observation_starts_where_the_first_did(contract):
    """After an e-stop release both answers to the same observation are limited from the
    trusted state: the robot executed neither before the second came."""
    ts = _trusted(contract, (0.0, 0.0))
    g = ActionGuard(contract, ts)
    g.forget_command()  # what the publisher does on release
    far = _chunk(contract, 1.0)
    rate = np.array([j.rate_limit for j in contract.action.joints], np.float32)
    first = g.check(far.copy(), NOW, NOW + VALID, NOW, remember=False).actions
    second = g.check(far.copy(), NOW + 5_000_000, NOW + VALID, NOW).actions
    for r in (first, second):
        assert (np.abs(r[0] - ts.positions) <= rate + 1e-6).all(), r[0]


def test_a_controller_that_reports_its_chunk_is_limited_from_the_waypoint_it_executes(contract):
    """Found from outside: a controller executing one chunk for several periods was limited
    against the chunk vlad last *sent*, which it never executed. Its report says which."""
    ts = _trusted(contract, (0.0, 0.0))
    g = ActionGuard(contract, ts)
    # still for the three periods it may take to switch to it, then 0.2 rad a period, then it stays
    steps = np.clip(0.2 * (np.arange(contract.action.chunk_length, dtype=np.float32) - 2), 0.0, 2.0)
    ramp = np.repeat(steps[:, None], 2, axis=1)
    assert g.check(ramp.copy(), NOW, NOW + VALID, NOW, client="arm", seq=1).interventions == ()
    g.check(
        _chunk(contract, 0.0), NOW + PERIOD, NOW + PERIOD + VALID, NOW + PERIOD, client="arm", seq=2
    )  # not executed
    t = NOW + 4 * PERIOD  # it asks again after 4 waypoints of chunk 1: it runs waypoint 4 (1.0) now
    ex = g.executing("arm", t, (1, 4))
    assert ex.chunk == 1
    np.testing.assert_allclose(ex.path[0], ramp[3])  # the slot before: waypoint 3, 0.2
    ahead = np.concatenate([ramp[4:], np.repeat(ramp[-1:], 4, axis=0)])  # chunk 1 from waypoint 4 on
    r = g.check(ahead.copy(), t, t + VALID, t, executing=ex, client="arm", remember=False)
    assert r.interventions == ()  # each slot 0.2 from chunk 1's waypoint of the slot before: no seam
    # Without the report vlad assumes it followed the newest chunk (2, at 0.0): a seam there.
    r = g.check(ahead.copy(), t, t + VALID, t, executing=g.executing("arm", t), client="arm", seq=4)
    assert "seam" in r.interventions


def test_a_newer_report_of_the_same_controller_says_what_it_executes_better(contract):
    """The controller reported nothing executing with the observation being served, then
    took a plan and said so with its next observations (they arrive while the policy
    computes): the chunk is limited from the plan's waypoints, not from the still arm."""
    ts = _trusted(contract, (0.0, 0.0))
    g = ActionGuard(contract, ts)
    # still for the three periods it may take to switch to it, then 0.25 rad a period
    steps = np.clip(0.25 * (np.arange(contract.action.chunk_length, dtype=np.float32) - 2), 0.0, 2.0)
    ramp = np.repeat(steps[:, None], 2, axis=1)
    # valid past the seams
    assert g.check(ramp.copy(), NOW, NOW + 2 * VALID, NOW, client="arm", seq=1).interventions == ()
    t = NOW + PERIOD  # an observation of the still arm, before plan 1 came: "executing nothing"
    g.reported("arm", t, None)
    assert g.executing("arm", t, None).chunk == 0
    later = NOW + 6 * PERIOD  # its later observation: plan 1, waypoint 6 (1.0 rad)
    g.reported("arm", later, (1, 6))
    g.reported("arm", t, None)  # an older report never replaces a newer one
    ex = g.executing("arm", t, None)
    assert ex.chunk == 1
    # slot i of a chunk about t runs at t + i periods: slot 5 is the report's waypoint 6
    np.testing.assert_allclose(ex.path[5 + 1], ramp[6])
    np.testing.assert_allclose(ex.path[5], ramp[5])
    follow_on = np.concatenate([ramp[1:], ramp[-1:]])  # continues plan 1 where it is
    r = g.check(follow_on.copy(), later, t + VALID, t, executing=ex, client="arm", remember=False)
    assert r.interventions == ()
    # without the newer report the arm is believed still: the same chunk is a seam
    blind = ActionGuard(contract, ts)
    blind.check(ramp.copy(), NOW, NOW + 2 * VALID, NOW, client="arm", seq=1)
    r = blind.check(follow_on.copy(), later, t + VALID, t, executing=blind.executing("arm", t, None), remember=False)
    assert "seam" in r.interventions
    # a report from before the chunk's observation says nothing newer
    g2 = ActionGuard(contract, ts)
    g2.reported("arm", NOW - PERIOD, None)
    assert g2.executing("arm", NOW, (-1, -1)).chunk == 0


def test_a_report_of_a_chunk_never_sent_to_that_controller_is_not_believed(contract):
    ts = _trusted(contract, (0.0, 0.0))
    g = ActionGuard(contract, ts)
    g.check(_chunk(contract, 0.1), NOW, NOW + VALID, NOW, client="arm", seq=1)
    g.check(_chunk(contract, 2.0), NOW, NOW + VALID, NOW, client="intruder", seq=2, executing=g.executing(None, NOW))
    for report in ((2, 3), (99, 0), (1, 10_000)):
        ex = g.executing("arm", NOW + PERIOD, report)
        assert ex.chunk == 1, report
    assert g.reports_unknown == 3


def test_chunks_for_another_controller_are_not_what_it_executes(contract):
    ts = _trusted(contract, (0.0, 0.0))
    g = ActionGuard(contract, ts)
    g.check(_chunk(contract, 0.2), NOW, NOW + VALID, NOW, client="arm")
    g.check(_chunk(contract, 0.0) + 0.4, NOW + PERIOD, NOW + PERIOD + VALID, NOW + PERIOD, client="other")
    np.testing.assert_allclose(g.executing("arm", NOW + 2 * PERIOD).path[0], [0.2, 0.2])


def test_after_the_last_chunk_expired_the_trusted_state_is_the_reference(contract):
    ts = _trusted(contract, (0.0, 0.0))
    g = ActionGuard(contract, ts)
    g.check(_chunk(contract, 0.2), NOW, NOW + VALID, NOW)
    later = NOW + VALID + PERIOD  # the controller has nothing valid left: it holds where it is
    assert ts.judge(_q(0.5, 0.5), later) is None  # the arm was moved (slowly, plausibly) meanwhile
    r = g.check(_chunk(contract, 0.6), later, later + VALID, later)
    assert r.interventions == ()  # 0.1 from the measured state; 0.4 from the expired command


def test_a_binding_hold_ramps_from_the_executed_command_to_the_trusted_position(contract):
    """A fallback while the robot runs a chunk ahead of the measured arm: the hold never steps
    more than the rate limit from the command being executed."""
    ts = _trusted(contract, (0.0, 0.0))
    g = ActionGuard(contract, ts)
    g.check(_chunk(contract, 0.0) + 0.2 * np.arange(contract.action.chunk_length, dtype=np.float32)[:, None],
            NOW, NOW + 10 * VALID, NOW)  # fmt: skip
    t = NOW + 6 * PERIOD  # the robot commands 1.2, the arm lags
    hold = g.hold_posture(g.executing(None, t))
    rate = np.array([j.rate_limit for j in contract.action.joints])
    steps = np.abs(np.diff(np.vstack([g.executing(None, t).path[0], hold]), axis=0))
    assert (steps <= rate + 1e-5).all()
    np.testing.assert_allclose(hold[-1], ts.positions)  # and it ends where the arm is


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(0, 6),
    st.floats(0.0, 3.0),
    st.booleans(),
)
def test_the_one_pass_seam_check_clamps_exactly_as_the_slot_by_slot_loop(contract, seed, first, spread, two_paths):
    """The guard judges the seams in one pass and clamps slot by slot only where one needs it:
    on chunks near, at and beyond the rate limit (from the robot's path, from a second path it
    may be on, and between the seams' own waypoints), the result is the loop's alone, bit for bit."""
    rng = np.random.default_rng(seed)
    n, dim = contract.action.chunk_length, contract.action.dim
    g = ActionGuard(contract)
    rate = g.rate
    path = np.cumsum(rng.uniform(-1, 1, (n + 1, dim)) * rate, axis=0).astype(np.float32)
    chunk = (path[1:] + rng.uniform(-spread, spread, (n, dim)) * rate).astype(np.float32)
    before = (path + rng.uniform(-1, 1, (n + 1, dim)) * rate).astype(np.float32) if two_paths else None
    executing = Executing(path, n, 1, before, NOW)
    fast, loop = chunk.copy(), chunk.copy()
    hit_fast = g._limit(fast, executing, first, NOW)
    g._seams_within = lambda *_: False  # the loop alone
    hit_loop = g._limit(loop, executing, first, NOW)
    assert hit_fast == hit_loop
    np.testing.assert_array_equal(fast, loop)


def _path_slot_by_slot(g, chunk, index, hold):
    """The executed path as a loop over the slots: the reference for ActionGuard._path."""
    spec = g.contract.action
    path = np.empty((spec.chunk_length + 1, spec.dim), np.float32)
    path[:] = hold
    covered = 0
    n = len(chunk.actions)
    last_valid = (chunk.valid_until_ns - chunk.t_sensor_ns - 1) // g.period_ns if g.period_ns else n - 1
    end, lo = min(n, last_valid + 1), max(index - 1, 0)
    for i in range(-1, spec.chunk_length):
        if index + i >= end:
            break
        path[i + 1] = chunk.actions[max(index + i, lo)]
        covered = i + 1
    return path, covered


def _hold_joint_by_joint(g):
    """The hold position joint by joint: the reference for ActionGuard._hold_position."""
    q, last = g.trusted.positions, g.last_command
    hold = np.zeros(g.contract.action.dim, dtype=np.float32)
    for k in range(len(hold)):
        if q is not None and np.isfinite(q[k]):
            hold[k] = q[k]
        elif last is not None:
            hold[k] = last[k]
        else:
            hold[k] = (g.lower[k] + g.upper[k]) / 2
    return np.clip(hold, g.lower, g.upper)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 80),
    st.integers(0, 90),
    st.integers(-3, 60),
    st.booleans(),
    st.sampled_from([None, "finite", "unmeasured"]),
)
def test_the_executed_path_and_hold_are_the_slot_by_slot_ones(contract, seed, length, index, valid, last, state):
    """What the robot executes is built with whole-array operations: the path of a chunk run
    from any waypoint (also past its end or its validity) and the hold position (trusted
    state, unmeasured joints, last command, neither) equal the per-slot, per-joint loops."""
    rng = np.random.default_rng(seed)
    dim = contract.action.dim
    ts = _trusted(contract, (0.1, -0.2)) if state else TrustedState(contract)
    if state == "unmeasured":
        ts.positions = np.array([np.nan, 0.3], np.float32)
    g = ActionGuard(contract, ts)
    if last:  # a chunk sent: its first waypoint is the last command
        g.record(rng.uniform(-2, 2, (contract.action.chunk_length, dim)).astype(np.float32), NOW, NOW + VALID, NOW)
        assert g.last_command is not None
    hold = g._hold_position()
    expected = _hold_joint_by_joint(g)
    assert hold.dtype == expected.dtype
    np.testing.assert_array_equal(hold, expected)
    actions = rng.uniform(-1, 1, (length, dim)).astype(np.float32)
    chunk = Sent(1, None, actions, NOW, NOW + valid * PERIOD, False, NOW)
    path, covered = g._path(chunk, index, hold)
    ref_path, ref_covered = _path_slot_by_slot(g, chunk, index, hold)
    assert covered == ref_covered
    np.testing.assert_array_equal(path, ref_path)


def test_what_is_executed_is_built_again_only_when_what_it_depends_on_changed(contract):
    """The serving thread asks before the engine call and the publisher after it: the second
    answer is the first's only while nothing it is built from changed."""
    ts = _trusted(contract, (0.0, 0.0))
    g = ActionGuard(contract, ts)
    first = g.executing("arm", NOW)
    assert g.executing("arm", NOW) is first
    assert g.executing("arm", NOW + PERIOD) is not first  # another observation
    assert g.executing("other", NOW) is not g.executing("arm", NOW)  # another controller

    def fresh(change) -> None:
        before = g.executing("arm", NOW + PERIOD, (-1, -1))
        change()
        after = g.executing("arm", NOW + PERIOD, (-1, -1))
        assert after is not before
        # and what it is now is what a guard built from scratch on the same state says
        rebuilt = ActionGuard(contract, ts)
        rebuilt.sent, rebuilt._newest, rebuilt._reports = g.sent, g._newest, g._reports
        rebuilt._since_seq, rebuilt._since_ns, rebuilt._seen_generation = g._since_seq, g._since_ns, g._seen_generation
        expected = rebuilt.executing("arm", NOW + PERIOD, (-1, -1))
        assert np.array_equal(after.path, expected.path) and after.chunk == expected.chunk

    fresh(lambda: g.record(_chunk(contract, 0.1), NOW, NOW + VALID, NOW, "arm", 1))  # a chunk sent
    fresh(lambda: g.reported("arm", NOW + 2 * PERIOD, (1, 2)))  # a newer report
    fresh(lambda: ts.judge(_q(0.05, 0.05), NOW + PERIOD))  # the trusted state moved
    fresh(g.forget_command)  # the e-stop's release


def test_an_unknown_report_is_counted_once_however_often_it_is_judged(contract):
    ts = _trusted(contract, (0.0, 0.0))
    g = ActionGuard(contract, ts)
    g.executing("arm", NOW, (7, 0))
    g.record(_chunk(contract, 0.1), NOW, NOW + VALID, NOW, "other", 1)  # changes what it is built from
    g.executing("arm", NOW, (7, 0))
    assert g.reports_unknown == 1
    g.executing("arm", NOW + PERIOD, (7, 0))  # the next observation's report
    assert g.reports_unknown == 2
