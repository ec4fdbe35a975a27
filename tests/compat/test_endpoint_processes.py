"""The endpoint processes' addresses and liveness (issue 33 §3.5), against one real daemon
subprocess with the openpi endpoint on a loopback port and the metrics on a unix socket.

The daemon binds both addresses itself and hands them to every endpoint process it starts,
so nothing else can bind them while a process dies, and connections made meanwhile wait
for the next one. A process that dies, dies while starting, or stops (SIGSTOP) is
replaced, and each of these is counted in the status and recorded as an event. Real
processes, real signals, real sockets; no waiting beyond what the daemon's own bounds
(backoff, report timeout) take.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("websockets")
pytest.importorskip("prometheus_client")

from websockets.sync.client import connect  # noqa: E402

from vlad.cli.daemon import format_status  # noqa: E402
from vlad.compat.endpoint import REPORT_TIMEOUT_S  # noqa: E402
from vlad.snapshot import parse_events, parse_status  # noqa: E402
from vlad_tools.demo import openpi as demo_openpi  # noqa: E402
from vlad_tools.testing import QUIET_MONITORS, busy_port, free_port, start_daemon, wait_until  # noqa: E402


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("endpoints")
    port = free_port()
    extra = []
    for item in (
        *demo_openpi.OPENPI_SETTINGS,
        f"compat.openpi.listen='127.0.0.1:{port}'",
        "metrics.enabled=true",
        f"metrics.listen='unix:{tmp}/metrics.sock'",
        "serve.warmup=2",
        "serve.status_hz=10",
    ):
        extra += ["--set", item]
    d = start_daemon(tmp, [*extra, *QUIET_MONITORS])
    d.openpi_port, d.metrics_path = port, tmp / "metrics.sock"
    yield d
    d.stop()
    assert "Traceback" not in d.log(), d.log()[-5000:]


def status(daemon) -> dict:
    c = daemon.client("status-reader")
    try:
        return c.status()
    finally:
        c.close(bye=False)


def wait_status(daemon, predicate, timeout: float, what: str) -> dict:
    last: dict = {}

    def holds() -> bool:
        last.clear()
        last.update(status(daemon))
        return bool(predicate(last))

    try:
        wait_until(holds, timeout, what, poll=0.05)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: { ({k: last.get(k) for k in ('openpi', 'metrics')}) }") from None
    return last


def serving(daemon, kind: str) -> dict:
    """The endpoint's status part once it serves (a test before may have restarted it)."""
    return wait_status(daemon, lambda st: st[kind]["running"], 20, f"the {kind} endpoint to serve")[kind]


def gone(pid: int) -> bool:
    """Ended and reaped by the daemon (no zombie left)."""
    return not Path(f"/proc/{pid}").exists()


def children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``, with their command lines."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue  # it ended while being read
    return out


def impostor_binds(port: int) -> list[str]:
    """Every way another local process might take the port: what succeeded (should be none)."""
    took = []
    for host, option in (
        ("127.0.0.1", None),
        ("127.0.0.1", socket.SO_REUSEADDR),
        ("127.0.0.1", socket.SO_REUSEPORT),
        ("0.0.0.0", socket.SO_REUSEADDR),
    ):
        with socket.socket() as s:
            if option is not None:
                s.setsockopt(socket.SOL_SOCKET, option, 1)
            try:
                s.bind((host, port))
                s.listen()
            except OSError as exc:
                assert exc.errno == errno.EADDRINUSE, exc
                continue
            took.append(f"{host}:{port} option {option}")
    return took


def scrape(path: Path) -> bytes:
    """``GET /metrics`` over the unix socket: the body (15 s for the connection to be served)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(15)
        s.connect(str(path))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200 OK"), reply[:200]
    return reply


def events(daemon, kind: str = "endpoint") -> list:
    c = daemon.client("events-reader")
    try:
        return [e for e in parse_events(c.control("events", limit=500)) if e.kind == kind]
    finally:
        c.close(bye=False)


def test_a_stopped_process_is_killed_and_replaced(daemon):
    """SIGSTOP: the process lives but sends no report. After REPORT_TIMEOUT_S the daemon
    kills it and starts another; a client that connected to the stopped one's port
    meanwhile is served by the next."""
    before = serving(daemon, "openpi")
    t0 = time.monotonic()
    os.kill(before["pid"], signal.SIGSTOP)
    try:
        # Served within the report timeout, the first backoff and a start (up to 20 s on a busy machine).
        with connect(f"ws://127.0.0.1:{daemon.openpi_port}", open_timeout=REPORT_TIMEOUT_S + 25) as ws:
            meta = ws.recv(timeout=15)
        waited = time.monotonic() - t0
        st = wait_status(
            daemon, lambda st: st["openpi"]["running"] and st["openpi"]["pid"] != before["pid"], 10, "a new process"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(before["pid"], signal.SIGCONT)
    assert b"vlad" in meta
    assert waited >= REPORT_TIMEOUT_S, waited  # the stopped process held it until then
    o = st["openpi"]
    assert o["unresponsive"] == before["unresponsive"] + 1 and o["restarts"] == before["restarts"] + 1, o
    assert o["last_failure"] == (
        f"process {before['pid']} sent no report for {REPORT_TIMEOUT_S:g} s (stopped or hung): killed"
    )
    wait_until(lambda: gone(before["pid"]), 5, "the stopped process to be killed and reaped")


def test_no_process_can_take_the_port_while_the_endpoint_restarts(daemon):
    """The openpi process is killed: from that moment until its replacement serves, no
    other process can bind the port (however it asks), and a client that connects
    meanwhile is not refused: it waits in the backlog and gets the next process's metadata."""
    before = serving(daemon, "openpi")
    os.kill(before["pid"], signal.SIGKILL)
    wait_until(lambda: gone(before["pid"]), 5, "the killed process to be reaped")
    assert impostor_binds(daemon.openpi_port) == []
    with connect(f"ws://127.0.0.1:{daemon.openpi_port}", open_timeout=15) as ws:  # while none serves
        meta = ws.recv(timeout=15)
    assert isinstance(meta, bytes) and b"vlad" in meta
    took: list[str] = []

    def replaced() -> bool:
        took.extend(impostor_binds(daemon.openpi_port))  # tried again and again until it serves
        st = status(daemon)["openpi"]
        return bool(st["running"] and st["pid"] != before["pid"])

    wait_until(replaced, 15, "the openpi endpoint to serve again", poll=0.01)
    assert took == []
    st = status(daemon)["openpi"]
    assert st["restarts"] == before["restarts"] + 1 and st["listen"] == f"127.0.0.1:{daemon.openpi_port}"
    assert st["last_failure"] == f"process {before['pid']} killed by SIGKILL"


def test_the_unix_socket_stays_the_daemons_across_a_restart(daemon):
    """The metrics process on a unix socket is killed: the socket file is the same one
    throughout (the daemon's), a scrape made meanwhile waits and is answered."""
    before = serving(daemon, "metrics")
    inode = daemon.metrics_path.stat().st_ino
    os.kill(before["pid"], signal.SIGKILL)
    wait_until(lambda: gone(before["pid"]), 5, "the killed process to be reaped")
    assert b"vlad_up" in scrape(daemon.metrics_path)  # queued, not refused, then answered
    assert daemon.metrics_path.stat().st_ino == inode
    st = wait_status(daemon, lambda st: st["metrics"]["restarts"] == before["restarts"] + 1, 5, "the restart count")
    assert st["metrics"]["running"]


def test_a_process_killed_while_starting_is_started_again(daemon):
    """The serving metrics process is killed, then the next one as soon as it runs, before
    it can be ready: the daemon goes on starting it (with its backoff) and it serves
    again. The operator sees it all: status, `vladctl status`, events, the log."""
    before = serving(daemon, "metrics")
    os.kill(before["pid"], signal.SIGKILL)
    killed = {before["pid"]}

    def kill_new() -> bool:
        for pid, cmd in children(daemon.pid).items():
            if pid not in killed and "vlad.compat metrics" in cmd:
                os.kill(pid, signal.SIGKILL)  # it runs; importing alone takes longer than this poll
                killed.add(pid)
        return len(killed) == 2

    wait_until(kill_new, 20, "a metrics process started after the kill", poll=0.005)
    st = wait_status(
        daemon, lambda st: st["metrics"]["running"] and st["metrics"]["pid"] not in killed, 30, "a new process"
    )
    m = st["metrics"]
    assert m["restarts"] == before["restarts"] + 1 and m["failed_starts"] == before["failed_starts"] + 1, m
    assert m["last_failure"] == "did not start: metrics: the endpoint process killed by SIGKILL at start (see the log)"
    assert b"vlad_up" in scrape(daemon.metrics_path)
    line = next(ln for ln in format_status(parse_status(st)).splitlines() if ln.startswith("metrics "))
    assert line == (
        f"metrics      serving on unix:{daemon.metrics_path} (pid {m['pid']}); "
        f"restarts {m['restarts']}, failed starts {m['failed_starts']}; last: {m['last_failure']}"
    )
    reasons = [e.reason for e in events(daemon)]
    assert any(r.startswith(f"metrics endpoint {m['last_failure']}; starting it again in ") for r in reasons), reasons
    assert f"metrics endpoint started again as pid {m['pid']} (restart {m['restarts']})" in reasons, reasons
    assert "ERROR endpoint: metrics endpoint did not start" in daemon.log()  # the journal's line, as an error


def test_a_taken_port_refuses_the_start_with_one_line(tmp_path):
    """Another process listens on the metrics port: the daemon says so in one line, before
    it loads anything, and starts no endpoint process."""
    with busy_port() as port:
        d = start_daemon(
            tmp_path, ["--set", "metrics.enabled=true", "--set", f"metrics.listen='127.0.0.1:{port}'"], wait_ready=False
        )
        try:
            assert d.proc.wait(60) == 2
        finally:
            d.stop()
    errors = [line for line in d.log().splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: metrics.listen 127.0.0.1:{port}: the port is in use by another process "
        f"(ss -ltnp 'sport = :{port}' shows which); stop it or choose another port"
    ], d.log()
    assert "loading" not in d.log() and "endpoint process" not in d.log(), d.log()


def test_an_endpoint_reads_its_section_typed_and_refuses_a_bad_one_in_one_line():
    """The process parses ``spec.config`` with the daemon's own config schema and checks."""
    from vlad.compat.endpoint import EndpointStartError, Spec, section
    from vlad.config import MetricsConfig, OpenPIConfig

    spec = Spec("openpi", {"listen": "127.0.0.1:8000", "proprio": ["a", "b"], "max_clients": 2}, {}, {})
    cfg = section(spec, OpenPIConfig, "compat.openpi")
    assert cfg == OpenPIConfig(listen="127.0.0.1:8000", proprio=("a", "b"), max_clients=2)
    bad = Spec("metrics", {"listen": "0.0.0.0:9464", "idle_timeout_s": -1, "port": 1}, {}, {})
    with pytest.raises(EndpointStartError) as exc:
        section(bad, MetricsConfig, "metrics")
    msg = str(exc.value)
    assert msg.startswith("metrics: ") and "\n" not in msg
    assert "idle_timeout_s: must be >= 0.1" in msg and "port: unknown key" in msg
    with pytest.raises(EndpointStartError, match="beyond loopback"):  # the config's checks, too
        section(Spec("metrics", {"listen": "0.0.0.0:9464"}, {}, {}), MetricsConfig, "metrics")


def test_an_endpoint_report_that_does_not_parse_keeps_the_daemons_part(caplog):
    """The daemon types each process's report (JSON from another process) where it reads it."""
    from vlad.compat.endpoint import Spec
    from vlad.daemon.endpoints import EndpointProcess
    from vlad.snapshot import MetricsStatus

    p = EndpointProcess("metrics", Spec("metrics", {"listen": "127.0.0.1:1"}, {}, {}), None, None)  # type: ignore[arg-type]
    p.report = {"listen": "127.0.0.1:1", "scrapes": 3, "renders": 1}
    st = p.status(MetricsStatus)
    assert (st.listen, st.scrapes, st.renders, st.running, st.pid) == ("127.0.0.1:1", 3, 1, False, None)
    p.restarts = 2
    p.report = {"scrapes": "many"}  # another version's report
    for _ in range(3):
        st = p.status(MetricsStatus)
    assert st == MetricsStatus(pid=None, running=False, restarts=2)
    assert sum("does not parse" in r.getMessage() for r in caplog.records) == 1  # logged once
