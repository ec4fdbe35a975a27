"""The canary's abort decision, in process: typed counters and a real divergence tracker.

``Canary.check`` reads only the canary policy's counters, the shadow's divergence and the
heartbeat faults the supervisor counts; the policies themselves are stand-ins carrying
just those fields. tests/daemon/test_deploy.py covers the whole canary through a live daemon.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vlad.daemon.releases import Canary, CanaryThresholds
from vlad.serving.counters import PolicyCounts, PolicyId
from vlad.serving.shadow import DivergenceMeter

THRESHOLDS = CanaryThresholds(
    window_s=600.0, max_deadline_miss_rate=0.05, max_interventions=0, max_divergence=0.1, max_heartbeat_faults=3
)


def canary(**counts: int) -> Canary:
    policy = SimpleNamespace(id=PolicyId("release", "new@2"), counts=PolicyCounts(**counts))
    previous = SimpleNamespace(id=PolicyId("shadow", "old@1"))
    return Canary(policy=policy, previous=previous, thresholds=THRESHOLDS)  # type: ignore[arg-type]


def shadow_with(mean_error: float, pairs: int) -> SimpleNamespace:
    d = DivergenceMeter(dim=2, tolerance=1.0)
    for seq in range(pairs):
        ref = np.zeros((8, 2), np.float32)
        d.reference(seq, ref)
        d.candidate(seq, ref + np.float32(mean_error))
    return SimpleNamespace(divergence=d)


def test_a_healthy_canary_is_kept():
    c = canary(published=500, deadline_misses=10)  # 2 % < 5 %
    assert c.check(shadow_with(0.01, 50)) is None


@pytest.mark.parametrize(
    ("counts", "reason"),
    [
        ({"published": 100, "deadline_misses": 6}, "deadline miss rate 0.060 > 0.05"),
        ({"published": 100, "nonfinite_outputs": 1}, "1 NaN/bound interventions > 0"),
        ({"published": 100, "out_of_bounds": 2}, "2 NaN/bound interventions > 0"),
    ],
)
def test_each_threshold_aborts_with_its_reason(counts, reason):
    assert canary(**counts).check(None) == reason


def test_the_miss_rate_waits_for_enough_chunks():
    # 5 of 10 late is not judged yet: 20 published chunks first, so start-up noise cannot abort.
    assert canary(published=10, deadline_misses=5).check(None) is None
    assert canary(published=20, deadline_misses=5).check(None) is not None


def test_divergence_needs_pairs_and_names_the_previous_release():
    c = canary(published=100)
    assert c.check(shadow_with(0.5, 9)) is None  # fewer than 10 paired chunks: not judged
    reason = c.check(shadow_with(0.5, 10))
    assert reason is not None and reason.startswith("mean divergence from old@1 0.5000 > 0.1")


def test_heartbeat_faults_abort_beyond_the_allowance():
    c = canary(published=100)
    c.heartbeat_faults = 3
    assert c.check(None) is None
    c.heartbeat_faults = 4
    assert c.check(None) == "4 heartbeat faults > 3"


def test_status_names_both_releases():
    c = canary(published=1)
    r = c.status(c.started_ns + 2_500_000_000)
    assert r.release == "new@2" and r.previous == "old@1" and r.elapsed_s == 2.5


def test_the_divergence_meter_reports_the_status_type():
    from vlad.snapshot import Divergence

    d = shadow_with(0.25, 4).divergence.status()
    assert isinstance(d, Divergence)
    assert d.pairs == 4 and d.per_joint_max_abs == (0.25, 0.25) and d.per_joint_mean_abs == (0.25, 0.25)
    assert (d.max_abs, d.mean_abs, d.tolerance, d.fraction_beyond_tolerance) == (0.25, 0.25, 1.0, 0.0)
