"""Server faults seen by one session, against a real KServe v2 server process.

Injected at the server itself (its fault file: late answers, UNAVAILABLE / 503, INTERNAL /
500, wrong outputs) or by killing and restarting the process. A link or server failure is
:class:`RemoteUnavailable` (the supervisor falls back without blaming the policy) and marks
the link lost; the session's prober then finds the server again. A wrong answer is a plain
:class:`BackendError`: the served model and the contract disagree.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.kserve.remote_server import started_server
from vlad.backend import example_inputs
from vlad.errors import BackendError, RemoteUnavailable
from vlad_kserve import KServeBackend, RemoteLinkMonitor
from vlad_tools.testing import wait_until

ARTIFACT = Path(__file__).resolve().parents[2] / "manifests" / "demo" / "policy.onnx"
RECOVERY_S = 15.0  # generous: the prober checks every 50 ms here; the machine is shared


def wait_for(predicate, timeout: float = RECOVERY_S) -> None:
    wait_until(predicate, timeout, "the link's state", poll=0.02)


@pytest.fixture()
def session(kserve_server, contract, protocol):
    s = KServeBackend().load(
        ARTIFACT, contract, {"endpoint": kserve_server.endpoint(protocol), "timeout_ms": 2000, "probe_interval_ms": 50}
    )
    s.warmup(2)
    yield s
    kserve_server.fault()
    s.close()


@pytest.mark.parametrize("fail", ["unavailable", "internal"])
def test_server_error_is_remote_unavailable_then_recovers(session, kserve_server, contract, fail):
    kserve_server.fault(fail=fail)
    with pytest.raises(RemoteUnavailable, match="unavailable|server_error"):
        session.infer(example_inputs(contract))
    st = session.stats()
    assert st.state == "lost" and st.errors.get("server_error", 0) + st.errors.get("unavailable", 0) == 1
    kserve_server.fault()
    wait_for(lambda: session.stats().state == "connected")
    assert session.stats().reconnects == 1
    session.infer(example_inputs(contract))


def test_slow_server_times_out_and_recovers(session, kserve_server, contract):
    kserve_server.fault(delay_ms=400)
    with pytest.raises(RemoteUnavailable, match="timeout"):
        session.infer(example_inputs(contract), deadline_ns=time.monotonic_ns() + 50_000_000)
    assert session.stats().state == "lost"
    # The prober requires an answer within the contract's deadline, not merely any answer.
    time.sleep(0.3)  # six probes of a slow server: that it stays lost meanwhile is the behaviour
    assert session.stats().state == "lost"
    kserve_server.fault()
    wait_for(lambda: session.stats().state == "connected")


@pytest.mark.parametrize("bad", ["shape", "dtype", "missing"])
def test_wrong_answer_is_a_policy_fault(session, kserve_server, contract, bad):
    kserve_server.fault(output=bad)
    with pytest.raises(BackendError) as info:
        session.infer(example_inputs(contract))
    assert not isinstance(info.value, RemoteUnavailable), info.value
    st = session.stats()
    assert st.state == "connected" and st.errors == {"bad_response": 1}


@pytest.fixture(scope="module")
def own_server(tmp_path_factory):
    """A server of this module's own: the tests kill it."""
    with started_server(tmp_path_factory.mktemp("kserve-killed")) as server:
        yield server


def test_killed_then_restarted_server(own_server, contract, protocol):
    """SIGKILL: refused at once, the link is lost; restarted on the same port: found again
    without a new session, and the next request is answered."""
    if own_server.proc.poll() is not None:
        own_server.start()
    s = KServeBackend().load(
        ARTIFACT, contract, {"endpoint": own_server.endpoint(protocol), "timeout_ms": 2000, "probe_interval_ms": 50}
    )
    try:
        s.warmup(2)
        own_server.kill()
        with pytest.raises(RemoteUnavailable):
            s.infer(example_inputs(contract))
        assert s.stats().state == "lost"
        # The monitor the daemon will run sees the live session's stats the same way.
        view = SimpleNamespace(deadline_ns=20_000_000, backend_stats={"release:demo": s.stats()})
        assert [f.code for f in RemoteLinkMonitor().check(view)] == ["remote_unreachable"]
        own_server.start()
        wait_for(lambda: s.stats().state == "connected")
        s.infer(example_inputs(contract))
        st = s.stats()
        assert st.reconnects == 1 and st.state == "connected"
        view.backend_stats = {"release:demo": st}
        assert RemoteLinkMonitor().check(view) == []
    finally:
        s.close()
