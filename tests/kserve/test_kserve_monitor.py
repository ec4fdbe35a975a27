"""The remote-link monitor on hand-built stats (the daemon test runs it inside a real daemon)."""

from __future__ import annotations

from types import SimpleNamespace

from vlad.backend import RollingLatency, SessionStats
from vlad.serving.counters import PolicyId
from vlad_kserve import RemoteLinkMonitor

REMOTE = PolicyId("release", "vlad-demo-reacher@1.0.0")
LOCAL = PolicyId("fallback1", "vlad-demo-reacher@0.9.0")


def stats(**over) -> SessionStats:
    base = {
        "kind": "remote",
        "state": "connected",
        "state_for_s": 3.0,
        "endpoint": "grpc://gpu:8001",
        "window": 200,
        "error_rate": 0.0,
        "last_error": "",
        "network_ms": RollingLatency(p50=2.0, p99=4.0, count=200),
        "round_trip_ms": RollingLatency(p50=6.0, p99=9.0, count=200),
    }
    return SessionStats(**{**base, **over})


def view(remote: SessionStats, deadline_ms: float = 20.0) -> SimpleNamespace:
    return SimpleNamespace(deadline_ns=int(deadline_ms * 1e6), backend_stats={REMOTE: remote, LOCAL: SessionStats()})


def test_healthy_link_no_findings():
    assert RemoteLinkMonitor().check(view(stats())) == []


def test_lost_link_is_a_system_fault_of_that_policy():
    (f,) = RemoteLinkMonitor().check(view(stats(state="lost", state_for_s=0.4, last_error="unavailable: refused")))
    assert (f.monitor, f.code, f.severity, f.scope) == ("remote", "remote_unreachable", "fault", "system")
    assert f.policy == REMOTE
    assert "grpc://gpu:8001" in f.message and "refused" in f.message


def test_slow_network_warns_against_the_deadline():
    (f,) = RemoteLinkMonitor().check(view(stats(network_ms=RollingLatency(p50=8.0, p99=12.5, count=200))))
    assert (f.code, f.severity, f.scope, f.value, f.threshold) == ("remote_slow", "warn", "system", 12.5, 10.0)
    assert RemoteLinkMonitor().check(view(stats(network_ms=RollingLatency(p50=8.0, p99=12.5, count=200)), 40.0)) == []


def test_too_few_samples_say_nothing():
    few = stats(network_ms=RollingLatency(p50=30.0, p99=30.0, count=5), window=5, error_rate=0.4)
    assert RemoteLinkMonitor().check(view(few)) == []


def test_error_rate_warns():
    (f,) = RemoteLinkMonitor().check(view(stats(error_rate=0.1)))
    assert (f.code, f.severity, f.value, f.threshold) == ("remote_errors", "warn", 0.1, 0.05)


def test_server_time_missing_falls_back_to_round_trip():
    """A server that reports no time of its own (Triton): the round trip stands in."""
    slow = stats(network_ms=None, round_trip_ms=RollingLatency(p50=15.0, p99=18.0, count=200))
    assert [f.code for f in RemoteLinkMonitor().check(view(slow))] == ["remote_slow"]


def test_local_and_missing_stats_are_ignored():
    v = SimpleNamespace(deadline_ns=20_000_000, backend_stats={LOCAL: SessionStats()})
    assert RemoteLinkMonitor().check(v) == []
    assert RemoteLinkMonitor().check(SimpleNamespace(deadline_ns=20_000_000, backend_stats={})) == []
