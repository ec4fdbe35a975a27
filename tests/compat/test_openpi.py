"""openpi compatibility: the unmodified openpi client drives the demo arm through vlad.

One real daemon subprocess serves both the native ZeroMQ controller and openpi's
``WebsocketClientPolicy`` (real websocket, real MuJoCo), both as transports of the one
episode runner; asking at the same cadence, the same seeded episodes must succeed about as
often either way, and vlad sends no bridging holds between the requests. A second daemon allows only a
foreign uid on its observation socket: the in-process bridge still serves, the native
client is refused, and bad websocket input is answered and counted.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("openpi_client.websocket_client_policy")
pytest.importorskip("openpi_client.action_chunk_broker")

from openpi_client.websocket_client_policy import WebsocketClientPolicy  # noqa: E402

from vlad_tools.demo import openpi as demo_openpi  # noqa: E402
from vlad_tools.demo import sim  # noqa: E402
from vlad_tools.episodes import DaemonLink, run_episode  # noqa: E402
from vlad_tools.testing import (  # noqa: E402
    PLUGIN_ENV,
    ControllerSim,
    busy_port,
    free_port,
    free_ports,
    load_golden,
    start_daemon,
    tcp_endpoints,
    unsigned_copy,
    wait_until,
)

# 12 real-time episodes per client (~30 s in all). The flow-matching noise is seeded by the
# observation sequence, which the endpoint numbers itself, so outcomes differ per episode.
EPISODES = 12
SEEDS = range(20_000, 20_000 + EPISODES)
HORIZON = 4  # openpi's action_horizon: periods per chunk before asking again
# an observation as openpi's client sends it for the demo arm (never modified: copies are)
CHUNK_SHAPE = (sim.CHUNK_HORIZON, 2)  # the demo release's action chunk
OBS = {
    demo_openpi.IMAGE_KEY: np.zeros((64, 64, 3), np.uint8),
    demo_openpi.STATE_KEY: np.zeros(4, np.float32),
    "prompt": sim.INSTRUCTIONS[0],
}


def unix_get(path, url: str) -> str:
    import http.client

    class Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(str(path))

    conn = Conn("localhost", timeout=5)
    conn.request("GET", url)
    return conn.getresponse().read().decode()


def settings(port: int, *extra: str) -> list[str]:
    out = []
    for item in [*demo_openpi.OPENPI_SETTINGS, f"compat.openpi.listen='127.0.0.1:{port}'", "serve.warmup=2", *extra]:
        out += ["--set", item]
    return out


def wait_status(client, predicate, timeout: float = 5.0) -> dict:
    """The daemon's status once ``predicate`` holds for it."""
    st: dict = {}

    def holds() -> bool:
        st.update(client.status())
        return bool(predicate(st))

    try:
        wait_until(holds, timeout, poll=0.05)
    except AssertionError:
        raise AssertionError(f"status never satisfied the test: {st.get('openpi')}") from None
    return st


def answer(policy: WebsocketClientPolicy, obs: dict) -> str:
    """The error an openpi request is answered with, "" for a chunk of the right shape."""
    try:
        return "" if policy.infer(obs)["actions"].shape == CHUNK_SHAPE else "a chunk of another shape"
    except RuntimeError as exc:
        return str(exc)


def reconnect(port: int, timeout: float = 5.0) -> WebsocketClientPolicy:
    """Connect again once the server has seen the previous connection close (until then
    the connection limit answers 503, as it should)."""
    from websockets.exceptions import InvalidStatus

    deadline = time.monotonic() + timeout
    while True:
        try:
            return WebsocketClientPolicy("127.0.0.1", port)
        except InvalidStatus:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # a retry: the slot frees once the server has seen the close


@pytest.mark.slow
def test_openpi_client_drives_the_arm_like_the_native_client(tmp_path, contract):
    """The one episode runner with two transports at the same cadence (a request every
    HORIZON periods, the rest of the time only heartbeats): the native client and openpi's
    own client through the endpoint process. The noise differs (the endpoint numbers its own
    observations), so outcomes are compared in sum, not seed by seed."""
    port = free_port()
    d = start_daemon(tmp_path, settings(port, f"sockets.observation_producers=['uid:{os.getuid()}']"))
    client = d.client("mujoco-reacher")
    period = int(contract.timing.control_period_ms * 1e6)
    validity = int(contract.timing.action_validity_ms * 1e6)
    run = functools.partial(
        run_episode, period_ns=period, exec_steps=HORIZON, chunk_length=contract.action.chunk_length
    )
    plan = [(seed, sim.INSTRUCTIONS[i % 2]) for i, seed in enumerate(SEEDS)]
    try:
        with sim.ReacherTask(render=False) as task:
            native = [run(task, DaemonLink(client, streams=False), seed, instruction) for seed, instruction in plan]
            client.close()  # says goodbye: its silence from now on is no fault
            link = demo_openpi.OpenPILink(demo_openpi.connect("127.0.0.1", port), period, validity)
            openpi = [run(task, link, seed, instruction) for seed, instruction in plan]
        watcher = d.client("status")
        st = watcher.status()
        fallbacks = Counter(
            e["reason"].split(" for ")[0]
            for e in watcher.control("events", limit=500)
            if e["kind"] == "transition" and e["state_to"] == "FALLBACK"
        )
        watcher.close()
    finally:
        d.stop()
    ok_native = sum(r.success for r in native)
    ok_openpi = sum(r.success for r in openpi)
    lat = np.concatenate([r.latencies_ms for r in openpi])
    nat = np.concatenate([r.latencies_ms for r in native])
    print(
        f"native {ok_native}/{EPISODES}, openpi {ok_openpi}/{EPISODES}; openpi request->chunk p50 "
        f"{np.median(lat):.2f} ms p99 {np.percentile(lat, 99):.2f} ms over {len(lat)}; native sensor->chunk p50 "
        f"{np.median(nat):.2f} ms; openpi held {[r.held for r in openpi]}, errors {dict(link.errors)}; "
        f"endpoint {st['openpi']}; fallbacks {dict(fallbacks)}"
    )
    mean_native = np.mean([r.final_distance for r in native])
    mean_openpi = np.mean([r.final_distance for r in openpi])
    assert ok_openpi >= 3
    assert ok_openpi >= ok_native - 3, (ok_native, ok_openpi)
    assert mean_openpi < 0.15, (mean_native, mean_openpi)
    # A chunk-executing client waits for nothing between its requests: no bridging holds
    # (vlad.serving.cadence; a few, each a late chunk).
    holds = st["counters"]["holds"]
    assert holds.get("bridge", 0) <= 2 * EPISODES, (holds, dict(fallbacks))
    assert st["openpi"]["replies"] >= EPISODES * sim.EPISODE_STEPS // HORIZON - 3 * EPISODES
    # Each episode's first request announces the reset: nothing is refused, nothing held long.
    assert not link.errors.get("rejected_implausible_proprio"), dict(link.errors)
    assert all(r.held <= 4 for r in openpi), [r.held for r in openpi]


def test_bridge_serves_under_an_allow_list_and_survives_bad_input(tmp_path):
    port = free_port()
    # uid 4242 is not us: the native client is refused by ZAP; the in-process bridge is not.
    metrics_sock = tmp_path / "metrics.sock"
    estop = tmp_path / "estop"
    estop.write_text("0")
    d = start_daemon(
        tmp_path,
        settings(
            port,
            "sockets.observation_producers=['uid:4242']",
            "compat.openpi.max_message_mb=1",
            "metrics.enabled=true",
            f"metrics.listen='unix:{metrics_sock}'",
            f"safety.estop_file='{estop}'",
        ),
    )
    try:
        policy = WebsocketClientPolicy("127.0.0.1", port)
        meta = policy.get_server_metadata()
        assert meta["server"] == "vlad" and meta["action_dim"] == 2 and meta["chunk_length"] == sim.CHUNK_HORIZON
        out = policy.infer(OBS)
        assert out["actions"].shape == CHUNK_SHAPE and out["actions"].dtype == np.float32
        assert out["server_timing"]["infer_ms"] > 0
        out = policy.infer(OBS)
        assert "prev_total_ms" in out["server_timing"]

        def refused(o, match):
            with pytest.raises(RuntimeError, match=match):
                policy.infer(o)

        refused({**OBS, demo_openpi.IMAGE_KEY: np.zeros((32, 32, 3), np.uint8)}, "rejected_bad_shape")
        refused({k: v for k, v in OBS.items() if k != demo_openpi.STATE_KEY}, "bad_observation")
        refused({**OBS, "prompt": 7}, "bad_observation")
        refused({**OBS, demo_openpi.STATE_KEY: np.full(4, np.nan, np.float32)}, "rejected_nonfinite")
        ws = policy._ws  # raw frames through the same connection
        ws.send("text is not an observation")
        assert "malformed" in ws.recv()
        ws.send(b"\xc1\x00garbage")
        assert "malformed" in ws.recv()
        ws.send(b"\x93\x01\x02\x03")  # msgpack, but a list
        assert "malformed" in ws.recv()
        # An object-dtype array must never be built from client bytes.
        import msgpack

        ws.send(
            msgpack.packb(
                {demo_openpi.IMAGE_KEY: {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]}}
            )
        )
        assert "not one of the numeric dtypes" in ws.recv()
        assert policy.infer(OBS)["actions"].shape == CHUNK_SHAPE  # the connection still serves
        # The connection limit (1): a second client is refused before the handshake.
        with pytest.raises(Exception, match="503"):
            WebsocketClientPolicy("127.0.0.1", port)
        # Over max_message_mb: the websocket layer closes the connection (1009), counted.
        from websockets.exceptions import ConnectionClosed

        with pytest.raises(ConnectionClosed):
            policy.infer({**OBS, "junk": np.zeros(2 * 2**20, np.uint8)})
        policy = reconnect(port)  # the endpoint lives on

        # The closed connection sent no goodbye: if the reconnect took longer than the
        # heartbeat limit, the daemon held for a lost controller (docs/health.md) and serves
        # again once the client is back in its slot.
        def serves() -> bool:
            try:
                return policy.infer(OBS)["actions"].shape == CHUNK_SHAPE
            except RuntimeError as exc:  # an answer naming why there is no chunk yet (hold, stale, expired)
                if "Error in inference server" not in str(exc):
                    raise
                return False

        wait_until(serves, 10, "the daemon serving the reconnected client", poll=0.02)
        client = d.client()
        sent, answered = set(), []
        for _ in range(10):
            t = time.monotonic_ns()
            sent.add(t)
            client.publish_observation(
                {"overhead": OBS[demo_openpi.IMAGE_KEY]},
                proprio=OBS[demo_openpi.STATE_KEY],
                instruction=sim.INSTRUCTIONS[0],
                t_sensor_ns=t,
            )
            chunk = client.recv_actions(timeout_ms=50, drop_stale=False)
            answered += [chunk.t_sensor_ns] if chunk is not None else []
        reasons = ("rejected_bad_shape", "bad_observation", "rejected_nonfinite", "malformed", "busy", "too_large")
        st = wait_status(  # the endpoint process reports once a second
            client,
            lambda st: (
                st["counters"]["rejected"].get("unauthorized_observations", 0) >= 1
                and st["openpi"].get("replies", 0) >= 4
                and all(st["openpi"].get("errors", {}).get(r, 0) >= 1 for r in reasons)
            ),
        )
        client.close()
        assert not sent & set(answered)  # the native observations were refused by the allow list
        assert st["openpi"]["replies"] >= 4
        # E-stop engaged: an explicit error, never a chunk; released: served again.
        estop.write_text("engaged")
        wait_until(lambda: "estop" in answer(policy, OBS), 10, "the e-stop at the openpi endpoint", poll=0.05)
        estop.write_text("0")
        wait_until(lambda: answer(policy, OBS) == "", 10, "serving after the e-stop was released", poll=0.05)
        assert policy.infer(OBS)["actions"].shape == CHUNK_SHAPE
        # The same counters reach Prometheus (here over the metrics unix socket), from the
        # status the daemon publishes (twice a second here).
        wait_until(
            lambda: 'vlad_openpi_errors_total{reason="malformed"}' in unix_get(metrics_sock, "/metrics"),
            5,
            "the openpi counters in /metrics",
            poll=0.1,
        )
        assert "vlad_openpi_replies_total" in unix_get(metrics_sock, "/metrics")
        assert d.proc.poll() is None
    finally:
        d.stop()


def test_openpi_config_is_checked():
    from vlad.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="beyond loopback"):
        parse_config({"compat": {"openpi": {"enabled": True, "listen": "0.0.0.0:8000"}}})
    with pytest.raises(ConfigError, match="unknown key"):
        parse_config({"compat": {"openpi": {"enable": True}}})
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_config({"compat": {"openpi": {"listen": "8000"}}})
    cfg = parse_config(
        {
            "compat": {
                "openpi": {"listen": "0.0.0.0:8000", "tls_cert": "c.pem", "tls_key": "k.pem", "token_file": "token"}
            }
        }
    )
    assert cfg.compat.openpi.listen == "0.0.0.0:8000"
    with pytest.raises(ConfigError, match="allow_remote"):
        parse_config({"metrics": {"listen": "10.0.0.1:9464"}})


def _self_signed(tmp_path):
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vlad-test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_tls_and_token(tmp_path, monkeypatch):
    from websockets.exceptions import InvalidStatus

    cert, key = _self_signed(tmp_path)
    token = tmp_path / "token"
    token.write_text("s3cret-token-for-the-test\n")
    port = free_port()
    d = start_daemon(
        tmp_path,
        settings(
            port,
            f"compat.openpi.tls_cert='{cert}'",
            f"compat.openpi.tls_key='{key}'",
            f"compat.openpi.token_file='{token}'",
        ),
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the client trusts the test certificate
    try:
        with pytest.raises(InvalidStatus, match="401"):
            WebsocketClientPolicy(f"wss://127.0.0.1:{port}", api_key="wrong-token-wrong-token")
        with pytest.raises(InvalidStatus, match="401"):
            WebsocketClientPolicy(f"wss://127.0.0.1:{port}")
        with pytest.raises(Exception):  # noqa: B017 - plain ws:// to a TLS port: no handshake at all
            WebsocketClientPolicy(f"ws://127.0.0.1:{port}")
        policy = WebsocketClientPolicy(f"wss://127.0.0.1:{port}", api_key="s3cret-token-for-the-test")
        assert policy.infer(OBS)["actions"].shape == CHUNK_SHAPE
        client = d.client()
        # the endpoint process reports its counters once a second
        st = wait_status(client, lambda st: st["openpi"].get("replies", 0) >= 1)
        client.close()
        assert st["openpi"]["errors"]["unauthorized"] == 2
    finally:
        d.stop()


def test_a_native_stream_beside_never_starves_an_openpi_request_of_a_slow_policy(tmp_path, contract):
    """A native controller streaming at 50 Hz and an openpi client on one daemon whose every
    inference takes 3 periods (60 ms): the stream's observations come in while each one runs,
    and latest wins per controller, so they supersede only the stream's own. Every openpi
    request is answered with a chunk within its request timeout (500 ms): the controllers take
    turns, so it waits at most for the inference running, one of the stream's that was
    waiting before it, and its own (about 180 ms here)."""
    slow = 60.0
    # what a contract of a policy this slow says: observations and chunks a few inferences old
    timing = contract.timing
    release = unsigned_copy(
        tmp_path / "release",
        edits={
            f"e2e_deadline_ms = {timing.e2e_deadline_ms}": "e2e_deadline_ms = 150.0",
            f"max_observation_age_ms = {timing.max_observation_age_ms}": "max_observation_age_ms = 200.0",
        },
    )
    port = free_port()
    d = start_daemon(
        tmp_path,
        settings(
            port,
            f"release.path='{release}'",
            "release.verify=false",
            "release.backend='wrapped'",
            "release.artifact='policy.onnx'",
            f"release.options={{delay_ms={slow}}}",
        ),
        env=PLUGIN_ENV,
    )
    native = d.client("native")
    stream = ControllerSim(native, load_golden()[0]).start()
    policy = None
    try:
        wait_until(lambda: sum(c.source == "release" for c in stream.since(time.monotonic() - 0.5)) >= 3, 10)
        policy = WebsocketClientPolicy("127.0.0.1", port)
        took = []
        for _ in range(10):
            t0 = time.monotonic()
            assert answer(policy, OBS) == ""
            took.append(time.monotonic() - t0)
            time.sleep(0.04)
        served = [c.obs_seq for c in stream.since(0) if c.source == "release"]
        assert len(served) > 10  # the stream kept its own answers meanwhile
        st = native.status()
        assert st["counters"]["superseded"] > 0  # the stream's own, while inferences ran
    finally:
        if policy is not None:
            policy._ws.close()
        stream.stop()
        native.close()
        d.stop()
    print(f"openpi request -> chunk beside a 50 Hz stream, {slow:.0f} ms inferences: max {max(took) * 1000:.0f} ms")


def test_busy_port_refuses_the_start_with_one_line(tmp_path):
    with busy_port() as port:
        d = start_daemon(tmp_path, settings(port), wait_ready=False)
        try:
            assert d.proc.wait(60) != 0
        finally:
            d.stop()
    errors = [line for line in d.log().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port}: the port is in use by another process" in errors[0], d.log()


def test_openpi_client_recovers_within_a_period_after_estop_and_pause(tmp_path):
    """Issue 21 item 5: after an e-stop release, and after a pause between requests (an
    episode reset), openpi's own client gets a policy chunk for its first request, not ~2 s
    of errors. The endpoint forwards requests during the e-stop (the daemon answers the
    newest one at release) and heartbeats with cadence "request" (silence between requests
    is no sensor stall); input and controller holds end with their cause."""
    port = free_port()
    estop = tmp_path / "estop"
    estop.write_text("0")
    # the default stall limit (5 periods): shorter than every pause below
    d = start_daemon(tmp_path, settings(port, f"safety.estop_file='{estop}'", "monitors.sensor_stall_periods=5"))
    try:
        policy = WebsocketClientPolicy("127.0.0.1", port)
        period = 0.02

        def ask() -> tuple[float, float, str]:
            """(sent, answered, error or "") for one request."""
            t0 = time.monotonic()
            try:
                policy.infer(OBS)
                return t0, time.monotonic(), ""
            except RuntimeError as exc:
                return t0, time.monotonic(), str(exc)

        def every_period(n: int) -> list[tuple[float, float, str]]:
            out, next_t = [], time.monotonic()
            for _ in range(n):
                out.append(ask())
                next_t += period
                time.sleep(max(0.0, next_t - time.monotonic()))  # paced: one request a period
            return out

        assert not any(e for *_, e in every_period(10)[3:]), "not serving before the test"
        estop.write_text("engaged")
        deadline = time.monotonic() + 5
        while "estop" not in ask()[2]:
            assert time.monotonic() < deadline, "the e-stop never reached the openpi client"
        during = every_period(25)  # half a second of requests, each answered "estop"
        assert all("estop" in e for *_, e in during[2:]), {e for *_, e in during}
        estop.write_text("0")
        t_release = time.monotonic()
        after = every_period(25)
        first_ok = next(t1 for t0, t1, e in after if not e)
        # Requests sent more than one period after the release (the e-stop file is read
        # every quarter period) are all served by the policy.
        late_errors = [e for t0, _, e in after if t0 > t_release + period and e]
        assert not late_errors, late_errors[:3]
        time.sleep(1.5)  # a pause (an episode reset): 75 periods without a request
        t0, t1, err = ask()
        assert not err, err
        pause_ms = (t1 - t0) * 1e3
        st = d.client().status()
        print(
            f"first chunk {1e3 * (first_ok - t_release):.1f} ms after the e-stop release; "
            f"first request after a 1.5 s pause answered in {pause_ms:.1f} ms; "
            f"transitions {st['transition_counts']}"
        )
        assert "FALLBACK" not in st["transition_counts"], st["transition_counts"]  # never a hold for input
    finally:
        d.stop()


def test_endpoints_on_tcp_curve_sockets(tmp_path):
    """With tcp:// endpoints (CurveZMQ) the endpoint processes connect with a key pair the
    daemon made for them at start: admitted (the openpi one to the observation socket too,
    whatever observation_producers says), and nobody else's key is."""
    import urllib.request

    import zmq.auth

    keys, clients = tmp_path / "keys", tmp_path / "clients"
    keys.mkdir()
    clients.mkdir()
    _, server_secret = zmq.auth.create_certificates(keys, "server")
    client_pub, _ = zmq.auth.create_certificates(keys, "client")
    (clients / "client.key").write_bytes(open(client_pub, "rb").read())
    client_key = zmq.auth.load_certificate(client_pub)[0].decode()
    eps = tcp_endpoints()
    port, metrics_port = free_ports(2)
    d = start_daemon(
        tmp_path,
        settings(
            port,
            f"sockets.curve_secret_key='{server_secret}'",
            f"sockets.curve_clients_dir='{clients}'",
            f"sockets.observation_producers=['key:{client_key}']",
            "metrics.enabled=true",
            f"metrics.listen='127.0.0.1:{metrics_port}'",
            "serve.status_hz=10",
        ),
        endpoints=eps,
    )
    try:
        policy = WebsocketClientPolicy("127.0.0.1", port)
        assert policy.infer(OBS)["actions"].shape == CHUNK_SHAPE
        policy._ws.close()
        wait_until(
            lambda: (
                "vlad_published_total"
                in urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
            ),
            5,
            "vlad_published_total in /metrics",
            poll=0.1,
        )
    finally:
        d.stop()
