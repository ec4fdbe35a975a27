"""A broken or hostile KServe server against one remote session (vlad_kserve.testing.HostileServer,
a proxy in front of the real test server): every request bounded by its deadline in total,
bodies bounded before they are read, and the prober alive whatever it is answered."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from vlad.backend import SessionStats, example_inputs
from vlad.errors import BackendError, RemoteUnavailable
from vlad_kserve import KServeBackend
from vlad_kserve.testing import HostileServer
from vlad_tools.testing import wait_until

ARTIFACT = Path(__file__).resolve().parents[2] / "manifests" / "demo" / "policy.onnx"


pytest.importorskip("tritonclient.grpc")  # the kserve backend's availability check
pytest.importorskip("onnxruntime")  # the hostile server's model


@pytest.fixture()
def hostile():
    h = HostileServer(ARTIFACT)
    yield h
    h.close()


def load(contract, hostile, **options):
    # The proxy and kserve's HTTP path take ~15 ms a request here: more than the contract's
    # 20 ms deadline allows when the machine is busy. The tests give explicit deadlines
    # where the deadline is what they test.
    return KServeBackend().load(ARTIFACT, contract, {"endpoint": hostile.endpoint, "timeout_ms": 2000, **options})


def wait_state(session, state: str, timeout: float = 10.0) -> SessionStats:
    seen: list[SessionStats] = []

    def reached() -> bool:
        seen[:] = [session.stats()]
        return seen[0].state == state

    try:
        wait_until(reached, timeout, poll=0.02)
    except AssertionError:
        raise AssertionError(seen[0] if seen else "no stats") from None
    return seen[0]


def test_a_trickling_server_is_cut_off_at_the_deadline(hostile, contract):
    """One byte every 8 ms: each read returns at once, so a per-read timeout never fires
    (the answer would take seconds); the request's total time does, and it is a link
    fault (RemoteUnavailable), never a policy fault."""
    s = load(contract, hostile, probe_interval_ms=0)
    try:
        inputs = example_inputs(contract)
        s.infer(inputs)
        hostile.mode = "trickle"
        t0 = time.monotonic()
        with pytest.raises(RemoteUnavailable, match="timeout"):
            s.infer(inputs, deadline_ns=time.monotonic_ns() + 50_000_000)
        elapsed = time.monotonic() - t0
        assert hostile.bytes_sent < 100  # it was cut off early in the answer
        assert elapsed < 0.5, elapsed  # the whole answer would have taken > 2 s
        st = s.stats()
        assert st.state == "lost" and st.errors == {"timeout": 1}
    finally:
        s.close()


@pytest.mark.parametrize("mode", ["huge", "huge_chunked"])
def test_a_1_gib_body_is_refused_not_read(hostile, contract, mode):
    """A server streaming 1 GiB: refused on its announced length before the body is read, or
    after max_response_mb without one; the process does not grow by the body."""
    s = load(contract, hostile, probe_interval_ms=0, max_response_mb=4)
    try:
        inputs = example_inputs(contract)
        s.infer(inputs)
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        hostile.mode = mode
        with pytest.raises(RemoteUnavailable, match="max_response_mb") as info:
            s.infer(inputs)
        assert not isinstance(info.value, BackendError) or isinstance(info.value, RemoteUnavailable)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak_before
        assert grown < 64 * 2**20, f"grew by {grown / 2**20:.0f} MiB"
        assert hostile.bytes_sent < 2**30  # the client hung up long before the end
        assert s.stats().state == "lost"  # the server's fault: the link, not the policy
    finally:
        s.close()


def test_bad_metadata_while_lost_never_ends_the_prober(hostile, contract):
    """While the link is lost the prober gets metadata replies that are not v2 metadata (a
    list, a map with inputs 5, a string): each is a failed probe; the link comes back once
    the server answers properly again, after recover_after good probes."""
    s = load(contract, hostile, probe_interval_ms=10, recover_after=3)
    try:
        inputs = example_inputs(contract)
        s.infer(inputs)
        hostile.mode = "down"
        with pytest.raises(RemoteUnavailable):
            s.infer(inputs)
        hostile.mode = "bad_metadata"
        # every kind of bad reply, several times
        wait_until(lambda: hostile.requests.get("bad_metadata", 0) >= 20, 10, "20 bad metadata replies", poll=0.01)
        st = s.stats()
        assert st.state == "lost" and "not a v2 metadata reply" in st.last_error, st
        assert s._prober is not None and s._prober.is_alive()
        hostile.mode = "proxy"
        st = wait_state(s, "connected")
        assert st.reconnects == 1
        assert s.infer(inputs)["actions"].shape[1:] == contract.output("actions").shape[1:]
    finally:
        s.close()


def test_unreachable_at_start_connects_when_the_server_answers(hostile, contract):
    hostile.mode = "down"
    s = load(contract, hostile, probe_interval_ms=10, connect_timeout_ms=1000)
    try:
        assert s.stats().state == "lost"
        hostile.mode = "proxy"
        st = wait_state(s, "connected")
        assert st.reconnects == 1 and s.server_metadata["inputs"]  # checked against the contract
        assert s.infer(example_inputs(contract))["actions"].shape[1:] == contract.output("actions").shape[1:]
    finally:
        s.close()


def test_recovery_needs_a_run_of_good_answers_and_more_after_a_relapse(hostile, contract):
    """recover_after in-deadline answers in a row before "connected"; a link lost again soon
    after it recovered needs twice as many (hysteresis against a flapping server)."""
    s = load(contract, hostile, probe_interval_ms=10, recover_after=2)
    try:
        inputs = example_inputs(contract)
        s.infer(inputs)
        for needed in (2, 4):
            hostile.mode = "down"
            with pytest.raises(RemoteUnavailable):
                s.infer(inputs)
            assert s.stats().recovery.needed == needed
            hostile.mode = "proxy"
            wait_state(s, "connected")
        assert s.stats().reconnects == 2
    finally:
        s.close()
