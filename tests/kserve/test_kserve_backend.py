"""The kserve backend against a real KServe v2 server on 127.0.0.1: options, the contract
check at load, deadlines, timing split, stats. Faults: test_kserve_faults.py."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import numpy as np
import pytest

from vlad.backend import example_inputs
from vlad.errors import BackendError, RemoteUnavailable
from vlad_kserve import KServeBackend, parse_options
from vlad_kserve.backend import metadata_problems

ARTIFACT = Path(__file__).resolve().parents[2] / "manifests" / "demo" / "policy.onnx"


def load(contract, endpoint: str, **options):
    return KServeBackend().load(ARTIFACT, contract, {"endpoint": endpoint, **options})


# ---------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "options.endpoint: required, e.g. endpoint = "),
        ({"endpoint": "ftp://h:1"}, "scheme must be grpc, grpcs, http or https"),
        ({"endpoint": "grpc://h"}, "needs a host and a port"),
        ({"endpoint": "grpc://h:1", "protocol": "http"}, "is grpc"),
        ({"endpoint": "grpc://h:1", "token": "secret"}, "must not be inline"),
        ({"endpoint": "grpc://h:1", "timout_ms": 5}, r"options.timout_ms: unknown key \(did you mean 'timeout_ms'\?\)"),
        ({"endpoint": "grpc://h:1", "timeout_ms": -1}, "options.timeout_ms: must be >= 0.1, got -1"),
        ({"endpoint": "grpc://h:1", "tls_ca_file": "/nonexistent"}, "does not exist"),
    ],
)
def test_bad_options_are_refused_with_the_reason(contract, options, message):
    with pytest.raises(BackendError, match=message):
        parse_options(options, contract)


def test_option_defaults_follow_the_contract(contract):
    o = parse_options({"endpoint": "grpc://127.0.0.1:8001"}, contract)
    assert o.model_name == contract.model.id
    assert o.timeout_ms == contract.timing.e2e_deadline_ms
    assert (o.protocol, o.tls, o.url) == ("grpc", False, "127.0.0.1:8001")
    assert parse_options({"endpoint": "https://h:8000"}, contract).protocol == "http"


def test_token_only_over_tls_or_loopback(contract, tmp_path):
    token = tmp_path / "token"
    token.write_text("abc\n")
    parse_options({"endpoint": "grpc://127.0.0.1:1", "token_file": str(token)}, contract)
    with pytest.raises(BackendError, match="in clear"):
        parse_options({"endpoint": "grpc://gpu-server:1", "token_file": str(token)}, contract)
    parse_options({"endpoint": "grpcs://gpu-server:1", "token_file": str(token)}, contract)


# ---------------------------------------------------------------------------------------
# The contract check at load
# ---------------------------------------------------------------------------------------


def _with_input(contract, which: str, **changes):
    inputs = tuple(dataclasses.replace(s, **changes) if s.name == which else s for s in contract.inputs)
    return dataclasses.replace(contract, inputs=inputs)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda c: _with_input(c, "tokens", dtype="int32"), "inputs.tokens.datatype"),
        (lambda c: _with_input(c, "image_overhead", shape=(1, 3, 64, 32)), "inputs.image_overhead.shape[3]"),
        (lambda c: _with_input(c, "proprio", shape=(1, 4, 1)), "inputs.proprio.shape"),
        (lambda c: _with_input(c, "noise", name="noise2"), "inputs.noise2: in the contract but not served"),
        (
            lambda c: dataclasses.replace(c, outputs=c.outputs + (dataclasses.replace(c.outputs[0], name="value"),)),
            "outputs.value: in the contract but not served",
        ),
    ],
    ids=["dtype", "static-dim", "rank", "missing-input", "missing-output"],
)
def test_metadata_mismatch_is_refused_with_the_field_named(kserve_server, contract, protocol, mutate, field):
    """The real server's metadata against a contract that differs in one field."""
    with pytest.raises(BackendError, match="does not match the contract") as info:
        load(mutate(contract), kserve_server.endpoint(protocol))
    assert field in str(info.value)
    assert not isinstance(info.value, RemoteUnavailable)  # a wrong model is the release's fault


def test_metadata_dynamic_axis_needs_minus_one(contract):
    """A server that fixes the batch axis cannot take the contract's batch range."""
    md = {
        "inputs": [
            {"name": s.name, "datatype": "INT64" if s.dtype == "int64" else "FP32", "shape": list(s.shape)}
            for s in contract.inputs
        ],
        "outputs": [{"name": "actions", "datatype": "FP32", "shape": [-1, *contract.output("actions").shape[1:]]}],
    }
    problems = metadata_problems(md, contract)
    assert len(problems) == len(contract.inputs) and all("shape[0]: server fixes it at 1" in p for p in problems)
    md["inputs"].append({"name": "extra", "datatype": "FP32", "shape": [-1]})
    assert "inputs.extra: served by the model but not in the contract" in metadata_problems(md, contract)


def test_unknown_model_name_starts_lost_with_a_hint(kserve_server, contract, protocol):
    """The server answers but serves no such model (yet): the session starts with its link
    lost, the hint in its last error; the daemon serves the fallback meanwhile."""
    session = load(contract, kserve_server.endpoint(protocol), model_name="nope", probe_interval_ms=0)
    try:
        st = session.stats()
        assert st.state == "lost" and re.search("serves no model 'nope'.*model_name", st.last_error), st
        with pytest.raises(RemoteUnavailable):
            session.infer(example_inputs(contract))
    finally:
        session.close()


def test_unreachable_server_at_load_starts_lost(contract, protocol):
    """Nothing listens at load: the session starts lost (no warm-up, no exception); it
    connects once a server answers (tests/kserve/test_kserve_hostile.py)."""
    from tests.kserve.remote_server import free_port

    port = free_port()  # nothing listens there
    endpoint = f"grpc://127.0.0.1:{port}" if protocol == "grpc" else f"http://127.0.0.1:{port}"
    session = load(contract, endpoint, connect_timeout_ms=2000, probe_interval_ms=0)
    try:
        session.warmup(3)  # nothing to warm while lost: returns at once
        st = session.stats()
        assert st.state == "lost" and "cannot reach" in st.last_error, st
        assert session.describe().device == f"remote:{endpoint}"
    finally:
        session.close()


# ---------------------------------------------------------------------------------------
# Deadlines
# ---------------------------------------------------------------------------------------


@pytest.fixture()
def session(kserve_server, contract, protocol):
    s = load(contract, kserve_server.endpoint(protocol), timeout_ms=2000, probe_interval_ms=50)
    s.warmup(2)
    yield s
    kserve_server.fault()
    s.close()


def test_passed_deadline_is_refused_without_sending(session, contract):
    before = session.stats()
    with pytest.raises(RemoteUnavailable, match="not sent"):
        session.infer(example_inputs(contract), deadline_ns=time.monotonic_ns() - 1_000_000)
    after = session.stats()
    assert after.errors == {"deadline": 1}
    assert after.state == "connected"  # nothing was sent, so nothing was learned about the link
    assert after.round_trip_ms.count == before.round_trip_ms.count


def test_request_gives_up_at_the_deadline(session, kserve_server, contract):
    """A server 1.5 s late; the cycle's deadline is 100 ms away: the request is abandoned
    long before the answer (bound: well under the server's delay)."""
    kserve_server.fault(delay_ms=1500)
    t0 = time.monotonic()
    with pytest.raises(RemoteUnavailable, match="timeout"):
        session.infer(example_inputs(contract), deadline_ns=time.monotonic_ns() + 100_000_000)
    assert time.monotonic() - t0 < 1.0
    assert session.stats().errors.get("timeout") == 1


def test_without_deadline_the_timeout_option_applies(kserve_server, contract, protocol):
    kserve_server.fault(delay_ms=1500)
    with load(contract, kserve_server.endpoint(protocol), timeout_ms=100, probe_interval_ms=0) as s:
        t0 = time.monotonic()
        with pytest.raises(RemoteUnavailable, match="timeout"):
            s.infer(example_inputs(contract))
        assert time.monotonic() - t0 < 1.0
    kserve_server.fault()


# ---------------------------------------------------------------------------------------
# Timing and stats
# ---------------------------------------------------------------------------------------


def test_timing_splits_network_and_server(session, contract, golden):
    case = golden[0]
    out = session.infer(case["inputs"], deadline_ns=time.monotonic_ns() + 2_000_000_000)
    assert np.abs(out["actions"] - case["outputs"]["actions"]).max() < 1e-4
    t = session.last_timing
    assert t.server_ms is not None and t.network_ms is not None and t.server_ms > 0
    assert t.network_ms + t.server_ms == pytest.approx(t.compute_ms, abs=1e-6)
    assert t.h2d_ms is None and t.d2h_ms is None


def test_stats_are_live_and_json_able(session, contract):
    import json

    for _ in range(5):
        session.infer(example_inputs(contract))
    s = session.stats()
    json.dumps(s.to_dict())  # the wire form the status carries
    assert s.state == "connected" and s.kind == "remote"
    assert s.requests >= 7 and s.ok == s.requests and s.errors == {}
    assert s.error_rate == 0.0
    assert s.network_ms.p50 <= s.network_ms.p99
    assert s.endpoint.startswith(session.opts.protocol)


def test_describe_names_the_remote(session, contract):
    d = session.describe()
    assert d.backend == "kserve" and d.device == f"remote:{session.opts.endpoint}"
    assert d.extra["model_name"] == contract.model.id


def test_soak_short_no_memory_growth(kserve_server, contract):
    """400 gRPC requests without host memory growth (the 10,000-call conformance soak is
    marked slow for the remote variants: a loopback round trip costs 8-20 ms here)."""
    import gc

    from vlad.backend import host_rss_bytes

    inputs = example_inputs(contract)
    with load(contract, kserve_server.endpoint("grpc"), timeout_ms=2000) as s:
        for _ in range(100):
            s.infer(inputs)
        gc.collect()
        before = host_rss_bytes()
        for _ in range(400):
            s.infer(inputs)
        gc.collect()
        assert host_rss_bytes() - before < 10 * 2**20


def test_the_remote_demo_is_offered_through_the_plugin_hook(monkeypatch):
    """``./scripts/demo --remote`` reaches the plugin's server through the
    ``vlad_remote_demo`` hook (vlad imports no plugin package); without the plugin it gets none."""
    from vlad import plugins
    from vlad_kserve.demo import start_remote_demo

    assert plugins.remote_demo(plugins.make_plugin_manager()) is start_remote_demo
    monkeypatch.setenv("VLAD_PLUGINS", "onnxruntime")
    assert plugins.remote_demo(plugins.make_plugin_manager()) is None
