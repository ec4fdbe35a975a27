"""The real daemon as a subprocess on the demo release, driven through vlad.client."""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import subprocess
import time

import msgpack
import numpy as np
import pytest

from tests.conftest import ROOT, VLAD
from tests.helpers import exchange, golden_obs
from vlad_tools.testing import (
    QUIET_MONITORS,
    daemon_command,
    endpoints_in,
    start_daemon,
    tcp_endpoints,
    wait_until,
    write_fault_rig,
)

VLADCTL = VLAD.parent / "vladctl"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("daemon"), extra=QUIET_MONITORS)
    yield d
    d.stop()


@pytest.fixture()
def client(daemon):
    c = daemon.client()
    yield c
    c.close()


def test_ready_only_after_warmup_and_status_lines(daemon):
    ready = daemon.notify.wait_for("READY", "1")
    assert "serving vlad-demo-reacher" in ready["STATUS"]
    first_ready = next(i for i, (_, m) in enumerate(daemon.notify.messages) if m.get("READY") == "1")
    earlier = [m.get("STATUS", "") for _, m in daemon.notify.messages[:first_ready]]
    assert any("loading and warming" in s for s in earlier)
    daemon.notify.wait_for("STATUS", timeout=5)


def test_fresh_observations_yield_correct_chunks(daemon, client, contract, golden):
    """Each observation gives one chunk; its fields and actions match the offline pipeline."""
    import onnxruntime as ort

    from vlad.processing import Tokenizer, decode_actions, preprocess
    from vlad.serving.guard import ActionGuard

    sess = ort.InferenceSession(str(ROOT / "manifests/demo/policy.onnx"), providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_contract(contract)
    period_ns = int(contract.timing.control_period_ms * 1e6)
    for i, case in enumerate(golden * 3):
        seq = 100 + i
        chunk = exchange(client, case, seq)
        t_sensor = chunk.t_sensor_ns
        assert chunk.obs_seq == seq
        assert chunk.valid_until_ns == t_sensor + int(contract.timing.action_validity_ms * 1e6)
        assert chunk.period_ns == period_ns
        # DEGRADED (a warning such as a slow first cycle on a busy machine) still serves the release
        assert chunk.release == "vlad-demo-reacher@1.0.0" and chunk.state in ("ACTIVE", "DEGRADED")
        assert t_sensor < chunk.t_issue_ns < chunk.t_receive_ns
        assert chunk.actions.shape == (contract.action.chunk_length, contract.action.dim)
        assert chunk.actions.dtype == np.float32
        assert {"transport", "queue", "preprocess", "engine", "decode", "guard"} <= set(chunk.timings_ms)
        # offline: same observation and sequence -> same noise -> same actions (unless guarded)
        raw = case["raw"]
        from dataclasses import replace

        inputs = preprocess(contract, tok, replace(raw, sequence=seq))
        ref = decode_actions(contract, {"actions": sess.run(["actions"], inputs)[0]})
        if not chunk.interventions:
            np.testing.assert_allclose(chunk.actions, ref, atol=1e-5)
        else:
            g = ActionGuard(contract)
            assert set(chunk.interventions) <= {"seam", "rate", "bounds", "out_of_bounds"}
            assert np.all(chunk.actions >= g.lower) and np.all(chunk.actions <= g.upper)
        assert chunk.seq > 0


def test_stale_observation_is_skipped_and_counted(daemon, client, golden, contract):
    before = client.status()["counters"].get("stale", 0)
    old = time.monotonic_ns() - int(10 * contract.timing.max_observation_age_ms * 1e6)
    for k in range(3):
        client.publish_observation(**golden_obs(golden[0]), seq=5000 + k, t_sensor_ns=old)
        chunk = client.recv_actions(timeout_ms=150)
        # never a policy output for stale data (a hold posture may bridge the gap)
        assert chunk is None or chunk.is_hold or chunk.obs_seq < 5000
    wait_until(lambda: client.status()["counters"].get("stale", 0) >= before + 1, 3, "the stale count")
    # and serving goes on
    assert exchange(client, golden[1], 5100).obs_seq == 5100


def _good_header(seq):
    return {
        "v": 1,
        "kind": "obs",
        "seq": seq,
        "t_sensor_ns": time.monotonic_ns(),
        "instruction": "reach the red target",
    }


def test_malformed_messages_are_rejected_and_counted(daemon, client, golden):
    img = golden[0]["raw"].images["overhead"]
    q = golden[0]["raw"].proprio.astype(np.float32)
    tensors = [
        {"name": "image/overhead", "dtype": "uint8", "shape": [64, 64, 3]},
        {"name": "proprio", "dtype": "float32", "shape": [4]},
    ]
    bad = {
        "malformed": [[b"obs"], [b"obs", b"\xc1not msgpack"], [b"obs", msgpack.packb([1, 2])]],
        "bad_version": [
            [b"obs", msgpack.packb({**_good_header(1), "v": 2, "tensors": tensors}), img.tobytes(), q.tobytes()]
        ],
        "bad_dtype": [
            [
                b"obs",
                msgpack.packb({**_good_header(2), "tensors": [{**tensors[0], "dtype": "float32"}, tensors[1]]}),
                img.astype(np.float32).tobytes(),
                q.tobytes(),
            ]
        ],
        "bad_shape": [
            [
                b"obs",
                msgpack.packb({**_good_header(3), "tensors": [{**tensors[0], "shape": [32, 128, 3]}, tensors[1]]}),
                img.tobytes(),
                q.tobytes(),
            ],
            [b"obs", msgpack.packb({**_good_header(4), "tensors": tensors}), img.tobytes()[:-1], q.tobytes()],
        ],
        "missing_tensor": [[b"obs", msgpack.packb({**_good_header(5), "tensors": tensors[:1]}), img.tobytes()]],
    }
    # make sure our PUB is connected before counting (slow joiner)
    exchange(client, golden[0], 6000)
    before = client.status()["counters"]["rejected"]
    for frames_list in bad.values():
        for frames in frames_list:
            client.send_raw(frames)
            time.sleep(0.01)  # the queues are bounded on purpose (HWM 4): don't burst
    expected = {k: before.get(k, 0) + len(v) for k, v in bad.items()}
    wait_until(
        lambda: all(client.status()["counters"]["rejected"].get(k, 0) >= n for k, n in expected.items()),
        3,
        f"the rejections {expected}",
    )
    rejected = client.status()["counters"]["rejected"]
    for k, n in expected.items():
        assert rejected.get(k, 0) == n, (k, rejected)
    assert daemon.proc.poll() is None
    assert exchange(client, golden[2], 6001).obs_seq == 6001  # still serving


def test_status_broadcast_and_vladctl(daemon, client, golden):
    exchange(client, golden[0], 7000)
    st = client.recv_status(timeout_ms=3000)
    assert st is not None and st["state"] in ("ACTIVE", "DEGRADED")
    assert st["backend"]["name"] == "onnxruntime"
    out = subprocess.run(
        [str(VLADCTL), "status", "--endpoint", daemon.endpoints["control"]], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert (
        ("ACTIVE" in out.stdout or "DEGRADED" in out.stdout)
        and "vlad-demo-reacher@1.0.0" in out.stdout
        and "e2e" in out.stdout
    )
    js = subprocess.run(
        [str(VLADCTL), "status", "--json", "--endpoint", daemon.endpoints["control"]],
        capture_output=True,
        text=True,
        timeout=30,
    )
    data = json.loads(js.stdout)
    assert data["latency_ms"]["e2e"]["count"] >= 1 and data["engine_ms"]["p50"] > 0
    assert data["latency_ms"]["e2e"]["p50"] >= data["engine_ms"]["p50"]


def test_heartbeats_are_counted(daemon, client):
    before = client.status()["counters"].get("heartbeats", 0)
    for _ in range(20):
        client.heartbeat()
        time.sleep(0.01)  # a controller's pace, not a burst into the bounded queue
    wait_until(lambda: client.status()["counters"].get("heartbeats", 0) > before, 3, "a counted heartbeat")
    st = client.status()
    assert st["heartbeat_age_s"] is not None and st["heartbeat_age_s"] < 5


def test_control_unknown_command(daemon, client):
    from vlad.client import ClientError

    with pytest.raises(ClientError, match="unknown control command"):
        client.control("launch-missiles")
    assert client.control("ping")["pong"] is True


def test_clean_shutdown_on_sigterm(tmp_path, golden):
    d = start_daemon(tmp_path, env={"WATCHDOG_USEC": "200000"})
    c = d.client()
    try:
        exchange(c, golden[0], 1)
        d.notify.wait_for("WATCHDOG", "1", timeout=5)
        status = c._ctx.socket(__import__("zmq").SUB)
        status.setsockopt(__import__("zmq").SUBSCRIBE, b"status")
        status.connect(d.endpoints["status"])
        # the subscription has propagated once the first periodic status arrives
        assert status.poll(5000), "no status message within 5 s of subscribing"
        status.recv_multipart()
        d.proc.send_signal(signal.SIGTERM)
        rc = d.proc.wait(10)
        assert rc == 0, d.log()
        d.notify.wait_for("STOPPING", "1", timeout=1)
        states = []
        while status.poll(100):
            states.append(msgpack.unpackb(status.recv_multipart()[1])["status"]["state"])
        status.close(0)
        assert states and states[-1] == "STOPPING"
        for ep in d.endpoints.values():
            assert not (tmp_path / "run" / ep.rsplit("/", 1)[1]).exists()
        assert "Traceback" not in d.log()
    finally:
        c.close()
        d.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_clean_exit_on_signal_during_warmup(tmp_path, sig):
    """Signals are handled before loading: a stop during a long warm-up (the wrapped backend,
    2 s an inference, 30 warm-up inferences) says STOPPING=1, loads and binds nothing more
    and exits 0 without waiting for the minute-long warm-up."""
    rig = write_fault_rig(tmp_path)
    release = dataclasses.replace(rig.config.release, options={**rig.config.release.options, "delay_ms": 2000})
    config = dataclasses.replace(rig.config, release=release, serve=dataclasses.replace(rig.config.serve, warmup=30))
    d = start_daemon(tmp_path, config=config, env=rig.env, wait_ready=False)
    try:
        loading = "loading release: loading policy.onnx on wrapped"
        wait_until(
            lambda: any(m.get("STATUS") == loading for _, m in list(d.notify.messages)) or d.proc.poll() is not None,
            timeout=60,
            what="the release load to start",
        )
        d.proc.send_signal(sig)
        rc = d.proc.wait(20)  # the warm-up alone would take 60 s
        assert rc == 0, d.log()
        d.notify.wait_for("STOPPING", "1", timeout=1)
        assert d.notify.count("READY") == 0
        assert f"{signal.Signals(sig).name} received" in d.log()
        assert "Traceback" not in d.log(), d.log()
        assert not any((tmp_path / "run").iterdir())  # nothing was bound
    finally:
        d.stop()


def _run_fail(args, timeout=60):
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    return out.returncode, lines


# (--set values, lines on stderr, what the last one says): one line each, after the
# "verification OFF" warning where release.verify=false
STARTUP_FAILURES = [
    (['release.path="/nonexistent/release"'], 1, "no such release folder"),
    (
        [
            'release.path="/nonexistent/release"',
            "release.verify=false",
            'release.backend="onnxruntime"',
            'release.artifact="policy.onnx"',
        ],
        2,
        "no contract.toml",
    ),
    (["serve.warmupp=3"], 1, "unknown key"),
    (['release.backend="nope"'], 1, "differs from the signed manifest"),
    (['release.backend="nope"', 'release.artifact="policy.onnx"', "release.verify=false"], 2, "no backend 'nope'"),
]


def test_startup_failures_are_one_clear_line(tmp_path):
    eps = endpoints_in(tmp_path)
    for settings, n, says in STARTUP_FAILURES:
        rc, lines = _run_fail(daemon_command(eps, [arg for value in settings for arg in ("--set", value)]))
        assert rc == 2 and len(lines) == n and says in lines[-1], (settings, lines)
    rc, lines = _run_fail([str(VLAD), "serve", "--config", str(tmp_path / "missing.toml")])
    assert rc == 2 and len(lines) == 1 and "does not exist" in lines[0], lines


def test_endpoint_in_use_is_refused(daemon, tmp_path):
    cmd = daemon_command(daemon.endpoints)
    rc, lines = _run_fail(cmd)
    assert rc == 2 and len(lines) == 1 and "in use" in lines[0], lines
    assert daemon.proc.poll() is None  # the running daemon kept its endpoints


def test_systemd_unit_verifies(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (scripts/bootstrap installs the systemd package)")
    unit = (ROOT / "systemd" / "vlad.service").read_text()
    assert "Type=notify" in unit and "WatchdogSec=" in unit and "NoNewPrivileges=yes" in unit
    assert "not a safety function" in unit
    # verify with ExecStart pointing at this checkout's executable (the unit's /opt path
    # does not exist on a dev machine)
    local = unit.replace("/opt/vlad/.venv/bin/vlad", str(VLAD))
    path = tmp_path / "vlad.service"
    path.write_text(local)
    out = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in out.stderr.splitlines() if "vlad.service" in ln]
    assert out.returncode == 0 and not problems, out.stderr


def test_tcp_needs_curve_keys(tmp_path):
    eps = tcp_endpoints()
    rc, lines = _run_fail(daemon_command(eps))
    assert rc == 2 and len(lines) == 1 and "CurveZMQ" in lines[0], lines


def test_tcp_control_with_curve(tmp_path, golden):
    import zmq.auth

    from vlad.client import Client, ClientError

    keys = tmp_path / "keys"
    clients = tmp_path / "clients"
    keys.mkdir()
    clients.mkdir()
    server_pub, server_secret = zmq.auth.create_certificates(keys, "server")
    client_pub, client_secret = zmq.auth.create_certificates(keys, "client")
    _, stranger_secret = zmq.auth.create_certificates(keys, "stranger")
    (clients / "client.key").write_bytes(open(client_pub, "rb").read())
    eps = tcp_endpoints()
    d = start_daemon(
        tmp_path,
        extra=[
            "--set",
            f'sockets.curve_secret_key="{server_secret}"',
            "--set",
            f'sockets.curve_clients_dir="{clients}"',
            *QUIET_MONITORS,
        ],
        endpoints=eps,
    )
    try:
        with Client(**eps, curve=(client_secret, server_pub)) as c:
            assert c.control("ping")["pong"] is True
            assert exchange(c, golden[0], 1).obs_seq == 1  # observations and actions over curve too
        with Client(**eps, curve=(stranger_secret, server_pub)) as c:  # not in the authorized folder
            with pytest.raises(ClientError, match="did not answer"):
                c.control("ping", timeout_ms=1000)
        with pytest.raises(ClientError, match="CurveZMQ"):
            Client(**eps)  # no keys: refused before connecting
    finally:
        d.stop()


def test_nan_observation_is_refused_and_counted(daemon, client, golden):
    exchange(client, golden[0], 8000)
    before = client.status()["counters"]["rejected"].get("nonfinite", 0)
    raw = golden[0]["raw"]
    bad = raw.proprio.copy()
    bad[1] = np.nan
    client.publish_observation(dict(raw.images), proprio=bad, instruction=raw.instruction, seq=8001)
    chunk = client.recv_actions(timeout_ms=300)
    assert chunk is None or chunk.is_hold or chunk.obs_seq != 8001  # never a policy output for NaN input
    wait_until(lambda: client.status()["counters"]["rejected"].get("nonfinite", 0) > before, 3, "the NaN's rejection")
    assert client.status()["counters"]["rejected"]["nonfinite"] == before + 1
    assert exchange(client, golden[1], 8002).obs_seq == 8002  # and serving goes on
