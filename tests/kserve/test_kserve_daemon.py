"""The daemon serving a remote policy, against a real KServe v2 server: faults at the server.

``vlad serve`` runs as a subprocess (vlad_tools.testing) with an unsigned copy of the
demo release on the ``kserve`` backend, a fallback chain of [a previous release on local
ONNX Runtime, hold], and a simulated controller at 50 Hz. Faults are injected at the
server (late answers, UNAVAILABLE) or by killing and restarting it. Only what is visible
from outside is asserted: the chunks' ``source``, ``state`` / ``serving`` in the status,
and the longest gap between chunks.

The expected behaviour is the remote contract: a remote failure is a *system* fault, so the
daemon holds, falls back to the local policy within the contract's deadline plus a monitor
tick, never quarantines the remote policy, and returns to it once the link's prober has
seen the server answer within the deadline a few times in a row. A server that does not
answer at start does not stop the daemon: it starts on the fallback. A hostile server
(vlad_kserve.testing.HostileServer: a trickling answer) is a link fault too, and the serving
core beside it keeps its cadence and its watchdog. Deselect them all with
``-m "not daemon_remote"``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import MAX_GAP_S, wait_chunks, wait_state
from tests.kserve.remote_server import ServerProcess, started_server
from vlad.config import Config, ReleaseConfig, ServeConfig
from vlad_kserve.testing import HostileServer
from vlad_tools.testing import (
    DEMO,
    WATCHDOG_ENV,
    ControllerSim,
    assert_core_unaffected,
    load_golden,
    max_gap,
    start_daemon,
    unsigned_copy,
)
from vlad_tools.testing.releases import local_fallback

pytestmark = pytest.mark.daemon_remote


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with started_server(tmp_path_factory.mktemp("kserve-daemon")) as s:
        yield s


def write_config(tmp_path: Path, endpoint: str, options: dict[str, Any] | None = None) -> Config:
    """The remote release (unsigned copy of the demo) with a local previous release and hold;
    ``options`` are more of the kserve backend's options."""
    release = unsigned_copy(tmp_path / "release")
    previous = unsigned_copy(tmp_path / "previous", version="0.9.0")
    remote = {"endpoint": endpoint, "model_name": "vlad-demo-reacher", "probe_interval_ms": 50, **(options or {})}
    return Config(
        release=ReleaseConfig(
            path=str(release), verify=False, backend="kserve", artifact="policy.onnx", options=remote
        ),
        serve=ServeConfig(warmup=3),
        fallback=local_fallback(previous),
    )


class RemoteRig:
    def __init__(self, daemon, server: ServerProcess | None) -> None:
        self.daemon, self.server = daemon, server
        self.client = daemon.client()
        self.ctl = ControllerSim(self.client, load_golden()[0]).start()

    def wait_state(self, state: str, serving_prefix: str, timeout: float = 10.0) -> dict:
        return wait_state(self.client, state, serving_prefix, timeout)

    def wait_chunks(self, source: str, n: int = 10, timeout: float = 10.0) -> None:
        wait_chunks(self.ctl, source, n, timeout)

    def fault_and_recover(self, inject, recover) -> list:
        """Inject; the local fallback takes over with no gap over the bound; recover; the
        remote policy serves again, never quarantined."""
        t0 = time.monotonic()
        inject()
        self.wait_state("FALLBACK", "fallback1")
        self.wait_chunks("fallback1")
        seen = self.ctl.since(t0)
        gap = max_gap(seen)
        assert gap <= MAX_GAP_S, f"{gap * 1000:.1f} ms without a chunk; sources {[c.source for c in seen][:40]}"
        assert not self.client.status()["quarantined"], "a remote failure must not quarantine the policy"
        t1 = time.monotonic()
        recover()
        self.wait_state("ACTIVE", "release", timeout=20)
        self.wait_chunks("release")
        seen = self.ctl.since(t1)
        assert max_gap(seen) <= MAX_GAP_S
        return seen

    def close(self) -> None:
        self.ctl.stop()
        self.client.close()
        self.daemon.stop()


@pytest.fixture()
def rig(tmp_path, server):
    if server.proc.poll() is not None:
        server.start()
    server.fault()
    d = start_daemon(tmp_path, config=write_config(tmp_path, server.endpoint("grpc")))
    r = RemoteRig(d, server)
    try:
        r.wait_state("ACTIVE", "release")
        r.wait_chunks("release")
        yield r
    finally:
        r.close()
        server.fault()
        assert "Traceback" not in d.log(), d.log()


def test_remote_policy_serves_the_closed_loop(rig):
    st = rig.client.status()
    assert st["backend"]["name"] == "kserve"
    assert st["backend"]["device"] == f"remote:{rig.server.endpoint('grpc')}"
    chunks = rig.ctl.since(0)
    assert chunks and all(c.source in ("release",) or c.source.startswith("hold") for c in chunks[-20:])


def test_server_unavailable_then_back(rig):
    rig.fault_and_recover(lambda: rig.server.fault(fail="unavailable"), lambda: rig.server.fault())


def test_server_too_slow_then_back(rig):
    """Answers 100 ms late against a 20 ms deadline: useless, so the local policy serves."""
    rig.fault_and_recover(lambda: rig.server.fault(delay_ms=100), lambda: rig.server.fault())


def test_server_killed_then_restarted(rig):
    rig.fault_and_recover(rig.server.kill, rig.server.start)


def test_a_trickling_server_is_a_link_fault_and_the_core_keeps_its_cadence(tmp_path):
    """Issue 22 item 5: one byte every 8 ms. Each request ends at its deadline (a link
    fault), so the serving thread is never held past it, the remote policy is not
    quarantined, and it serves again as soon as the server answers in time."""
    hostile = HostileServer(DEMO / "policy.onnx")
    d = start_daemon(tmp_path, config=write_config(tmp_path, hostile.endpoint), env=WATCHDOG_ENV)
    r = RemoteRig(d, None)
    try:
        r.wait_state("ACTIVE", "release")
        r.wait_chunks("release")
        t0 = time.monotonic()
        hostile.mode = "trickle"
        r.wait_state("FALLBACK", "fallback1")
        r.wait_chunks("fallback1", n=50)  # a second on the local fallback, the trickle going on
        summary = assert_core_unaffected(d, r.ctl, t0)
        st = r.client.status()
        assert not st["quarantined"] and st["backend_stats"][st["chain"][0]]["state"] == "lost", st["quarantined"]
        assert st["counters"]["holds"].get("remote_unavailable", 0) >= 1
        hostile.mode = "proxy"
        t1 = time.monotonic()
        r.wait_state("ACTIVE", "release")
        back = time.monotonic() - t1
        r.wait_chunks("release")
        print(f"trickle: {summary}; back on the remote policy {back * 1e3:.0f} ms after the server answered again")
    finally:
        r.close()
        hostile.close()
        assert "Traceback" not in d.log(), d.log()


def test_an_unreachable_server_at_start_starts_on_the_fallback(tmp_path):
    """Issue 21 item 6: the server is down when vlad starts: vlad starts anyway, on the
    local fallback, and says so (state FALLBACK, finding remote_unreachable, the link lost);
    it serves the remote policy once the server answers."""
    hostile = HostileServer(DEMO / "policy.onnx")
    hostile.mode = "down"
    d = start_daemon(tmp_path, config=write_config(tmp_path, hostile.endpoint, {"connect_timeout_ms": 1000}))
    r = RemoteRig(d, None)
    try:
        st = r.wait_state("FALLBACK", "fallback1")
        assert any(f["code"] == "remote_unreachable" for f in st["findings"]), st["findings"]
        assert st["backend_stats"][st["chain"][0]]["state"] == "lost"
        events = r.client.control("events", limit=50)
        assert not any(e["kind"] == "transition" and e["state_to"] == "ACTIVE" for e in events), events
        r.wait_chunks("fallback1")
        hostile.mode = "proxy"
        r.wait_state("ACTIVE", "release")
        r.wait_chunks("release")
    finally:
        r.close()
        hostile.close()
        assert "Traceback" not in d.log(), d.log()
