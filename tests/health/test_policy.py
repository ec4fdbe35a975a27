"""Fallback decisions: which policy of the chain serves, with quarantine and hysteresis."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlad.health.base import Finding
from vlad.health.policy import HealthPolicy, Standing, decide
from vlad.health.state import State, StateMachine
from vlad.serving.counters import HOLD, PolicyId

NOW = 10_000_000_000
A = PolicyId("release", "a@1")
B = PolicyId("fallback1", "b@1")


def _finding(code, scope, severity="fault", policy=None):
    return Finding("t", code, severity, scope, code, policy=policy)


class Followed(HealthPolicy):
    """A health policy whose chain serves each decision at once (PolicyChain.follow_health):
    the health policy itself never moves the serving position."""

    def update(self, findings, now_ns):
        decision = super().update(findings, now_ns)
        self.serving.position = decision.target
        return decision


@pytest.fixture()
def policy():
    return Followed([A, B, HOLD], healthy_window_ns=2_000_000_000, events=StateMachine())


def test_a_decision_alone_moves_nothing():
    """The chain is the one writer of the serving position: a decision only says where to go."""
    policy = HealthPolicy([A, B, HOLD], healthy_window_ns=2_000_000_000, events=StateMachine())
    assert policy.update([_finding("temperature_high", "system")], NOW).target == 1
    assert policy.active == policy.serving.position == 0


def test_policy_fault_quarantines_the_culprit_only(policy):
    d = policy.update([_finding("nonfinite_output", "policy", policy=A)], NOW)
    assert d.target == 1 and d.state == State.FALLBACK and 0 in policy.quarantined
    # a late fault of a policy no longer in the chain blames nobody
    d = policy.update([_finding("nonfinite_output", "policy", policy=PolicyId("release", "gone@0"))], NOW + 1)
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


def test_a_remote_outage_falls_back_without_quarantine_and_returns(policy):
    """A system fault naming a policy (its server is unreachable) moves below it without
    quarantining it; after a healthy window the chain returns to it."""
    d = policy.update([_finding("remote_unavailable", "system", policy=A)], NOW)
    assert d.target == 1 and not policy.quarantined
    assert policy.update([], NOW + 1_000_000_000).target == 1
    assert policy.update([], NOW + 2_500_000_000).target == 0


def test_a_system_fault_of_the_fallback_moves_past_it(policy):
    policy.update([_finding("nonfinite_output", "policy", policy=A)], NOW)
    d = policy.update([_finding("remote_unavailable", "system", policy=B)], NOW + 1)
    assert d.target == 2


def test_input_and_controller_holds_end_with_their_cause(policy):
    """Nothing was wrong with the policies: once observations flow (or the controller is
    back) the chain serves again at the next tick, without a healthy window."""
    assert policy.update([_finding("sensor_stall", "input")], NOW).target == 2
    d = policy.update([], NOW + 1)
    assert d.target == 0 and d.state == State.ACTIVE
    assert policy.update([_finding("heartbeat_lost", "controller")], NOW + 2).target == 2
    assert policy.update([], NOW + 3).target == 0


def test_a_hold_for_input_keeps_the_position_a_system_fault_chose(policy):
    policy.update([_finding("temperature_high", "system")], NOW)
    assert policy.update([_finding("sensor_stall", "input")], NOW + 1).target == 2
    assert policy.update([], NOW + 2).target == 1  # the input is back; the system window still runs
    assert policy.update([], NOW + 2_100_000_000).target == 0


def test_a_finding_with_its_own_window(policy):
    """The remote link's findings carry a window of 0: its prober's streak is the hysteresis."""
    f = Finding("remote", "remote_unreachable", "fault", "system", "lost", policy=A, healthy_window_ns=0)
    assert policy.update([f], NOW).target == 1
    assert policy.update([], NOW + 1).target == 0


def test_a_swap_from_outside_is_adopted(policy):
    """A canary abort or a deploy points the chain elsewhere between ticks: that is the new position."""
    policy.update([_finding("temperature_high", "system")], NOW)
    policy.serving.position = 0  # what PolicyChain.serve does
    assert policy.update([], NOW + 1).target == 0


def test_each_controller_is_its_own_fault_episode(policy):
    a = Finding("heartbeat", "heartbeat_lost", "fault", "controller", "a gone", subject="a")
    b = Finding("heartbeat", "heartbeat_lost", "fault", "controller", "b gone", subject="b")
    policy.update([a], NOW)
    policy.update([a, b], NOW + 1)
    assert [e.reason for e in policy.events.events if e.kind == "fault"] == ["a gone", "b gone"]


# -- the decision as a pure function -----------------------------------------------------------

C = PolicyId("fallback2", "c@1")
CHAIN = (A, B, C, HOLD)
SCOPES = ("policy", "system", "controller", "input")

findings_strategy = st.lists(
    st.builds(
        Finding,
        monitor=st.sampled_from(("m1", "m2")),
        code=st.sampled_from(("nonfinite_output", "temperature_high", "sensor_stall")),
        severity=st.sampled_from(("fault", "warn")),
        scope=st.sampled_from(SCOPES),
        message=st.sampled_from(("x", "y")),
        policy=st.sampled_from((None, A, B, C, PolicyId("release", "gone@0"))),
        healthy_window_ns=st.sampled_from((None, 0, 5)),
    ),
    max_size=5,
)
standing_strategy = st.builds(
    Standing,
    chain=st.just(CHAIN),
    active=st.integers(0, 3),
    position=st.integers(0, 3),
    decided=st.integers(0, 3),
    quarantined=st.dictionaries(st.integers(0, 2), st.just("code"), max_size=3),
    ready_ns=st.integers(0, 20),
    last_fault_reason=st.sampled_from(("", "earlier")),
    healthy_window_ns=st.integers(0, 10),
)


@settings(max_examples=300, deadline=None)
@given(findings=findings_strategy, now=st.integers(0, 30), standing=standing_strategy)
def test_decide_is_pure_and_never_serves_a_quarantined_policy(findings, now, standing):
    before = copy.deepcopy(standing)
    verdict = decide(findings, now, standing)
    assert standing == before  # nothing it was given changed
    assert decide(findings, now, standing) == verdict  # same inputs, same decision
    d = verdict.decision
    hold = len(CHAIN) - 1
    quarantined = set(standing.quarantined) | {i for i, _ in verdict.quarantine}
    assert 0 <= d.target <= hold and (d.target == hold or d.target not in quarantined)
    assert (d.state == State.FALLBACK) == (d.target != 0)
    if any(f.severity == "fault" and f.scope in ("controller", "input") for f in findings):
        assert d.target == hold  # without trustworthy input, hold still
    assert all(i != hold and i not in standing.quarantined for i, _ in verdict.quarantine)


def test_health_policy_applies_the_decision(policy):
    """The policy object keeps the standing between ticks and records what the verdict says."""
    f = _finding("nonfinite_output", "policy", policy=A)
    expected = decide([f], NOW, Standing(tuple(policy.chain), 0, 0, 0, {}, 0, "", policy.healthy_window_ns))
    assert policy.update([f], NOW) == expected.decision
    assert policy.quarantined == {0: "nonfinite_output"} and policy.position == expected.position == 1
    assert [e.kind for e in policy.events.events] == ["fault", "quarantine"]
