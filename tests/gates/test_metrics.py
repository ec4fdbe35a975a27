"""The numbers the gates are judged by."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from vlad.serving.guard import ActionGuard
from vlad_tools.evaluation import percentiles, wilson_interval
from vlad_tools.gates.metrics import DecisionStats, ErrorStats, JointErrors


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (5, 10, 0.2366, 0.7634),
        (44, 50, 0.7619, 0.9438),
        (1, 50, 0.0035, 0.1050),
    ],
)
def test_wilson_interval_matches_published_values(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)
    assert got[0] <= k / n <= got[1]


def test_wilson_interval_without_episodes_says_nothing():
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_error_stats_over_samples():
    e = ErrorStats()
    e.add(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
    e.add(np.array([0.0, 0.0]), np.array([0.0, 0.0]))
    assert e.max_abs == 0.5 and e.mean_abs == pytest.approx(0.125) and e.samples == 2
    assert e.max_rel == pytest.approx(0.25) and e.min_cosine < 1.0
    e.add(np.array([1.0]), np.array([np.nan]))
    assert math.isinf(e.max_abs)  # a NaN output can never pass a budget
    with pytest.raises(ValueError):
        e.add(np.zeros(2), np.zeros(3))


def test_guard_decisions_flip_where_a_bound_or_rate_limit_is_crossed(contract):
    proprio = np.array([0.0, 0.0, 0.0, 0.0], np.float32)
    ref = np.zeros((8, 2), np.float32)
    ref[:, 0] = np.linspace(0.1, 0.8, 8)  # 0.1 rad per period: inside the 0.25 rate limit
    got = ref.copy()
    got[3:, 0] += 0.2  # one jump of 0.3 rad: rate limit crossed at waypoint 3
    d = ActionGuard(contract).decisions(ref, proprio)
    assert d.shape == (8, 2, 3) and not d.any()
    stats = DecisionStats(near=0.01)
    stats.add(contract, ref, got, proprio, "case")
    assert stats.flips == 1 and "waypoint 3 joint0 rate limit" in stats.examples[0]
    over = ref.copy()
    over[7, 1] = 3.5  # joint1's upper bound is 3.0
    assert ActionGuard(contract).decisions(over)[7, 1, 1]


def test_joint_errors_and_percentiles():
    j = JointErrors(("a", "b"))
    j.add(np.zeros((8, 2)), np.full((8, 2), 0.5))
    assert j.max_per_joint() == [0.5, 0.5] and j.per_joint().shape == (8, 2)
    p = percentiles([1.0, 2.0, float("nan"), None, 3.0])
    assert p["count"] == 3 and p["p50"] == 2.0 and p["max"] == 3.0
    assert percentiles([])["count"] == 0


def test_a_warm_scenario_with_no_answers_gives_a_finite_burst_deadline():
    """A slow release on a loaded machine can have every warm observation go to a fallback
    hold; the burst scenario after it must still run, so the gate fails instead of erroring."""
    from vlad.client import ActionChunk
    from vlad_tools.gates.performance import _stats, burst_deadline_ms

    sent = {seq: seq * 20_000_000 for seq in range(1, 101)}
    hold = ActionChunk(
        seq=1,
        obs_seq=0,
        t_sensor_ns=0,
        t_issue_ns=1,
        valid_until_ns=1,
        release="r",
        state="FALLBACK",
        period_ns=20_000_000,
        source="hold:fallback",
        interventions=("hold",),
        timings_ms={},
        actions=np.zeros((8, 2), np.float32),
        t_receive_ns=1,
    )
    nothing = _stats(sent, [hold], deadline_ms=20.0)
    assert nothing["answered"] == 0 and nothing["deadline_misses"] == 100
    assert burst_deadline_ms(20.0, nothing) == 20.0

    policy = dataclasses.replace(hold, obs_seq=5, source="release", interventions=(), timings_ms={"engine": 4.0})
    answered = _stats(sent, [hold, policy], 20.0)
    assert answered["answered"] == 1
    assert burst_deadline_ms(20.0, answered) == 24.0
