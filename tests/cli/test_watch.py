"""``vladctl status --watch`` in a real 80x24 terminal (a tmux pane) and the plain status view.

* Against a real daemon in its worst practical state: the faulty release quarantined and a
  fallback serving, three health findings, the e-stop engaged, an openpi client connected.
* Against a recorded status (``tests/cli/watch_status.json``, recorded from that daemon with
  ``python -m tests.cli.test_watch``) with what one daemon here cannot show at once layered on:
  two remote links (the KServe backend's real ``LinkStats``), a long release name, nine
  findings, an operation in progress, twenty events.
* Every way out restores the cursor: Ctrl-C, SIGTERM and SIGHUP.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT
from vlad.cli.daemon import format_status
from vlad.cli.watch import HIDE, SHOW, render
from vlad.snapshot import parse_events, parse_status
from vlad_tools.testing import ControllerSim, load_golden, start_daemon, write_fault_rig

TMUX = shutil.which("tmux")
VLADCTL = Path(sys.executable).parent / "vladctl"
RECORDED = Path(__file__).with_name("watch_status.json")
COLS, ROWS = 80, 24
needs_tmux = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (scripts/bootstrap installs it as root)")


# ---------------------------------------------------------------------------------------
# tmux
# ---------------------------------------------------------------------------------------


def tmux(*args: str, check: bool = True) -> str:
    return subprocess.run([TMUX, *args], capture_output=True, text=True, check=check).stdout


def screen(session: str) -> list[str]:
    """The pane's rows, trailing blank rows included (a frame must never need more)."""
    return tmux("capture-pane", "-p", "-t", session).split("\n")[:ROWS]


def wait_screen(session: str, pred, timeout: float = 20.0) -> list[str]:
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = screen(session)
        if pred("\n".join(lines)):
            return lines
        time.sleep(0.2)
    raise AssertionError("screen never matched:\n" + "\n".join(lines))


def start_pane(session: str, command: str, exit_file: Path) -> None:
    """``command`` in a detached 80x24 pane; its exit status lands in ``exit_file``."""
    shell = f"cd {ROOT} && {command}; echo $? > {exit_file}; sleep 60"
    tmux("new-session", "-d", "-s", session, "-x", str(COLS), "-y", str(ROWS), shell)


def watcher_pid(session: str, timeout: float = 10.0) -> int:
    """The ``vladctl``/python process the pane's shell runs."""
    shell = int(tmux("display-message", "-p", "-t", session, "#{pane_pid}").strip())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(shell).children(recursive=True):
            if "python" in child.name() or "vladctl" in " ".join(child.cmdline()):
                return child.pid
        time.sleep(0.1)
    raise AssertionError("the watch process never started")


def cursor_visible(session: str) -> bool:
    return tmux("display-message", "-p", "-t", session, "#{cursor_flag}").strip() == "1"


def exit_code(exit_file: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    # The shell creates the file before it writes the code: wait for the code.
    while not (exit_file.exists() and exit_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return exit_file.read_text().strip() if exit_file.exists() else ""


def assert_fits(lines: list[str]) -> None:
    """Every row within 80 columns, the header on the first row, the state on the second."""
    assert len(lines) <= ROWS
    assert all(len(line) <= COLS for line in lines), max(lines, key=len)
    assert lines[0].startswith("vlad "), lines
    assert lines[1].startswith("state "), lines


# ---------------------------------------------------------------------------------------
# A real daemon in its worst practical state
# ---------------------------------------------------------------------------------------


def worst_daemon(tmp_path: Path):
    """The fault rig (:func:`vlad_tools.testing.write_fault_rig`) with the openpi endpoint on a free port."""
    import socket

    from vlad_tools.demo.openpi import OPENPI_SETTINGS

    rig = write_fault_rig(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sets = [a for s in [*OPENPI_SETTINGS, f"compat.openpi.listen='127.0.0.1:{port}'"] for a in ("--set", s)]
    d = start_daemon(tmp_path, sets, config=rig.config, env=rig.env)
    return rig, d, port


def drive_to_worst(rig, client, ws) -> tuple[ControllerSim, dict]:
    """Traffic, then a quarantined release, three findings and the e-stop engaged; ``ws``
    is a websocket connected to the openpi endpoint."""
    sim = ControllerSim(client, load_golden()[0]).start()
    ws.recv(timeout=10)  # openpi's metadata: the bridge has counted the client
    wait_status(client, lambda st: st["latency_ms"].get("e2e"))
    rig.control.write_text("nan")
    # Quarantined first: a system fault sent the chain to the fallback before the release
    # computed a NaN chunk would leave nothing to quarantine.
    wait_status(client, lambda st: st["quarantined"])
    rig.sensors.write_text(
        json.dumps({"temperature.cpu.0": 97.0, "temperature.gpu.0": 85.0, "memory.board.available_bytes": 1e6})
    )
    wait_status(client, lambda st: st["quarantined"] and len(st["findings"]) >= 3)
    rig.estop.write_text("engaged")
    st = wait_status(client, lambda st: st["state"] == "ESTOPPED" and st["openpi"]["clients"] == 1)
    return sim, st


def wait_status(client, pred, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    st: dict = {}
    while time.monotonic() < deadline:
        st = client.status()
        if pred(st):
            return st
        time.sleep(0.1)
    raise AssertionError(f"status never matched: state {st.get('state')}, findings {st.get('findings')}")


@needs_tmux
def test_watch_fits_80x24_on_a_real_daemon_in_its_worst_state(tmp_path):
    from websockets.sync.client import connect

    rig, d, port = worst_daemon(tmp_path)
    client = d.client()
    stack = contextlib.ExitStack()
    session = f"vlad-watch-{tmp_path.name}"[:60]
    exit_file = tmp_path / "exit"
    sim = None
    try:
        ws = stack.enter_context(connect(f"ws://127.0.0.1:{port}", open_timeout=10))
        sim, st = drive_to_worst(rig, client, ws)
        # The recording the exotic-state tests build on has the live status's keys.
        assert set(json.loads(RECORDED.read_text())) == set(st), "re-record: python -m tests.cli.test_watch"
        start_pane(
            session,
            f"PYTHONPATH={ROOT} {VLADCTL} status --watch --interval 0.3 --endpoint {d.endpoints['control']}",
            exit_file,
        )
        lines = wait_screen(session, lambda s: "ESTOPPED" in s and "events" in s)
        text = "\n".join(lines)
        assert_fits(lines)
        assert "ESTOPPED" in lines[1] and "e-stop ENGAGED" in lines[1]
        # The thermal fault may send the chain past the previous release to the hold posture.
        assert re.search(r"^serving  (hold|fallback1:\S+) \(fallback; quarantined: release:vlad", text, re.M), text
        assert "backend  wrapped" in text
        assert "openpi   1 client(s)" in text
        assert re.search(r"^fault +temperature\.cpu\.0 at 97\.0 °C", text, re.M)
        assert re.search(r"^  p99 ms( +[\d.]+){8}$", text, re.M), text  # all eight stages
        assert re.search(r"^  \d\d:\d\d:\d\d \S+: ", text, re.M)  # an event
        assert not cursor_visible(session)
        # Refreshed in place for a while: the header never leaves the first row.
        for _ in range(5):
            time.sleep(0.4)
            assert_fits(screen(session))
        # SIGTERM: the cursor comes back and the exit status says which signal.
        os.kill(watcher_pid(session), signal.SIGTERM)
        assert exit_code(exit_file) == str(128 + signal.SIGTERM)
        assert cursor_visible(session)
        assert "Traceback" not in "\n".join(screen(session))
        # The plain view: the state, the quarantine, every finding, the e-stop.
        plain = subprocess.run(
            [str(VLADCTL), "status", "--endpoint", d.endpoints["control"]], capture_output=True, text=True, check=True
        ).stdout
        assert "ENGAGED" in plain and "quarantined  release:vlad-demo-reacher@1.0.0" in plain
        assert plain.count("temperature.") >= 2
        # --json: the wire map, every key typed (it parses back into the snapshot it prints).
        out = subprocess.run(
            [str(VLADCTL), "status", "--json", "--endpoint", d.endpoints["control"]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        snap = parse_status(json.loads(out))
        assert snap.estop.engaged and snap.on_fallback and snap.counters.guard()["nonfinite"] >= 1
        assert {"cpu.0", "gpu.0"} <= set(snap.temperatures_c) and "board.available" in snap.memory.readings_bytes
        out = subprocess.run(
            [str(VLADCTL), "events", "--json", "--endpoint", d.endpoints["control"]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        kinds = {e.kind for e in parse_events(json.loads(out))}
        assert {"transition", "fault", "quarantine"} <= kinds, kinds
    finally:
        stack.close()
        if sim is not None:
            sim.stop()
        client.close()
        tmux("kill-session", "-t", session, check=False)
        d.stop()


@needs_tmux
def test_watch_keeps_the_last_state_and_leaves_on_ctrl_c(tmp_path):
    d = start_daemon(tmp_path, ["--set", "serve.warmup=2"])
    session = f"vlad-watch-c-{tmp_path.name}"[:60]
    exit_file = tmp_path / "exit"
    try:
        start_pane(
            session,
            f"PYTHONPATH={ROOT} {VLADCTL} status --watch --interval 0.3 --endpoint {d.endpoints['control']}",
            exit_file,
        )
        lines = wait_screen(session, lambda s: "state " in s and "release " in s)
        assert_fits(lines)
        assert "release  vlad-demo-reacher@1.0.0" in "\n".join(lines)
        # Daemon gone: one line says so under the last known state, and the view retries.
        d.terminate()
        lines = wait_screen(session, lambda s: "daemon unreachable" in s)
        assert_fits(lines)
        tmux("send-keys", "-t", session, "C-c")
        assert exit_code(exit_file) == "0"
        assert cursor_visible(session)
        assert "Traceback" not in "\n".join(screen(session))
    finally:
        tmux("kill-session", "-t", session, check=False)
        d.stop()


# ---------------------------------------------------------------------------------------
# Exotic states: a recorded status with what one daemon here cannot show at once
# ---------------------------------------------------------------------------------------


def remote_link(lost: bool, endpoint: str) -> dict:
    """A remote session's ``stats()`` as the KServe backend builds them (its real LinkStats)."""
    pytest.importorskip("vlad_kserve")
    from vlad_kserve.stats import LinkStats

    link = LinkStats(window=200)
    for i in range(180):
        link.success(2.0 + i % 5, 1.5, 0.5)
    for _ in range(20):
        link.failure("unavailable", "failed to connect to all addresses; Connection refused", system=lost)
    return replace(link.snapshot(), endpoint=endpoint, protocol="grpc", model="pick-and-place").to_dict()


LONG = "pick-and-place-with-a-very-long-release-name-trained-on-the-whole-fleet@12.4.0-rc3"


def exotic(base: dict) -> dict:
    st = copy.deepcopy(base)
    st["release"] = LONG
    st["serving"] = "fallback1:" + LONG
    st["quarantined"] = {f"release:{LONG}": "nonfinite_output"}
    st["backend_stats"] = {
        f"release:{LONG}": remote_link(True, "grpcs://inference.fleet.example.com:8001"),
        f"fallback1:{LONG}": remote_link(False, "grpcs://inference-2.fleet.example.com:8001"),
        "fallback2:other@1.0.0": remote_link(False, "http://10.0.0.7:8000"),
    }
    st["findings"] = [
        {
            "monitor": "m",
            "code": f"c{i}",
            "severity": "fault" if i % 2 else "warn",
            "scope": "system",
            "message": f"finding {i} " + "x" * 90,
        }
        for i in range(9)
    ]
    st["operation"] = {"kind": "deploy", "target": LONG, "elapsed_s": 12.0, "step": "hashing policy.onnx 1.2 GB/s"}
    st["openpi"] = {
        "pid": 4242,
        "running": True,
        "restarts": 0,
        "listen": "127.0.0.1:8000",
        "clients": 3,
        "replies": 123456,
        "errors": {"bad_shape": 7},
        "infer_ms": {"p50": 4.2, "p99": 19.1, "count": 500},
    }
    st["metrics"] = {  # down: being started again
        "pid": None,
        "running": False,
        "restarts": 3,
        "failed_starts": 2,
        "unresponsive": 1,
        "last_failure": "did not start: metrics: the endpoint process did not start within 20 s",
        "listen": "unix:/run/vlad/metrics.sock",
    }
    return st


def events(n: int) -> list[dict]:
    now = time.time()
    return [
        {
            "time": now - n + i,
            "monotonic_ns": i,
            "kind": "fault",
            "state_from": "ACTIVE",
            "state_to": "FALLBACK",
            "reason": f"event {i} " + "y" * 90,
        }
        for i in range(n)
    ]


def states() -> dict[str, dict]:
    base = json.loads(RECORDED.read_text())
    calm = copy.deepcopy(base)
    calm.update(
        findings=[],
        quarantined={},
        serving=base["chain"][0],
        estop={"engaged": False, "source": "", "reason": "", "counts": {}},
    )
    return {"calm": calm, "recorded": base, "exotic": exotic(base), "no-latency": dict(exotic(base), latency_ms={})}


@pytest.mark.parametrize("size", [(80, 24), (80, 12), (60, 24), (80, 3)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", ["calm", "recorded", "exotic", "no-latency"])
@pytest.mark.parametrize("error", [None, "daemon unreachable at ipc:///run/vlad/control; retrying every 1 s"])
def test_every_frame_fits(name, size, error):
    width, height = size
    st = states()[name]
    frame = render(
        parse_status(st), parse_events(events(20)), error, "ipc:///run/vlad/control", time.time(), width, height
    )
    assert len(frame) <= height
    assert all(len(line) <= width for line in frame), max(frame, key=len)
    assert frame[0].startswith("vlad ")
    if height >= 3:
        assert frame[1].startswith("state ")
        if error:
            assert frame[-1].startswith("daemon unreachable")
    if (width, height) == (80, 24) and name == "exotic":
        text = "\n".join(frame)
        assert "+1 more remote links" in text
        assert re.search(r"\+\d+ more findings", text)
        assert "remote   release LOST" in text
        assert "events" in text and "latency" in text
        assert "metrics  DOWN  restarts 3  failed starts 2  unresponsive 1" in text


def test_the_plain_view_shows_the_remote_links():
    st = exotic(json.loads(RECORDED.read_text()))
    text = format_status(parse_status(st))
    lines = [line for line in text.splitlines() if line.startswith("remote ")]
    assert len(lines) == 3
    assert f"release:{LONG} -> grpcs://inference.fleet.example.com:8001 (grpc, model pick-and-place): LOST" in lines[0]
    assert "round trip p50" in lines[0] and "10.0% of the last 200 requests failed (unavailable 20)" in lines[0]
    assert "last error: unavailable: failed to connect" in text
    assert "connected" in lines[1]


def test_the_plain_view_shows_each_endpoint_process():
    text = format_status(parse_status(exotic(json.loads(RECORDED.read_text()))))
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith(("openpi ", "metrics "))}
    assert lines["openpi"] == "openpi       serving on 127.0.0.1:8000 (pid 4242), 3 client(s)"
    assert lines["metrics"] == (
        "metrics      NOT SERVING: being started again (connections to unix:/run/vlad/metrics.sock wait); "
        "restarts 3, failed starts 2, unresponsive 1; "
        "last: did not start: metrics: the endpoint process did not start within 20 s"
    )


@needs_tmux
def test_exotic_state_in_a_real_80x24_pane(tmp_path):
    """The watch loop itself, fed the exotic status, draws in a real terminal without a
    wrapped or scrolled row; SIGHUP restores the cursor and exits 129."""
    status_file = tmp_path / "status.json"
    status_file.write_text(json.dumps({"status": exotic(json.loads(RECORDED.read_text())), "events": events(20)}))
    script = tmp_path / "feed.py"
    script.write_text(f"""
import argparse, json, sys
from vlad.cli.watch import watch
recorded = json.load(open({str(status_file)!r}))
def request(args, cmd, timeout_ms, **kw):
    return recorded["status"] if cmd == "status" else recorded["events"][-kw["limit"]:]
sys.exit(watch(argparse.Namespace(interval=0.2, timeout_ms=500, endpoint=None), request, "ipc:///run/vlad/control"))
""")
    session = f"vlad-watch-x-{tmp_path.name}"[:60]
    exit_file = tmp_path / "exit"
    try:
        start_pane(session, f"PYTHONPATH={ROOT} {sys.executable} {script}", exit_file)
        lines = wait_screen(session, lambda s: "events" in s)
        assert_fits(lines)
        assert lines[-1].startswith("  "), lines  # the last row is used: the frame fills the pane
        assert LONG[:60] in lines[2]
        for _ in range(3):  # redrawn in place: nothing scrolls
            time.sleep(0.3)
            assert_fits(screen(session))
        os.kill(watcher_pid(session), signal.SIGHUP)
        assert exit_code(exit_file) == str(128 + signal.SIGHUP)
        assert cursor_visible(session)
    finally:
        tmux("kill-session", "-t", session, check=False)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_every_way_out_writes_the_cursor_back(tmp_path, sig):
    """The bytes themselves, with no terminal: the cursor is hidden first and shown last."""
    proc = subprocess.Popen(
        [str(VLADCTL), "status", "--watch", "--interval", "0.1", "--endpoint", f"ipc://{tmp_path}/nobody"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out = bytearray()
    first = threading.Event()

    def read() -> None:
        while chunk := proc.stdout.read1(4096):  # type: ignore[union-attr]
            out.extend(chunk)
            if b"daemon unreachable" in out:
                first.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert first.wait(20), bytes(out)
    proc.send_signal(sig)
    code = proc.wait(10)
    reader.join(5)
    assert code == (0 if sig == signal.SIGINT else 128 + sig)
    assert bytes(out).startswith(HIDE.encode())
    assert bytes(out).endswith((SHOW + "\r\n").encode())
    assert b"Traceback" not in proc.stderr.read()  # type: ignore[union-attr]


def record() -> None:
    """Re-record tests/cli/watch_status.json from the fault-rig daemon in its worst state."""
    import tempfile

    from websockets.sync.client import connect

    tmp = Path(tempfile.mkdtemp(prefix="vlad-watch-record-"))
    rig, d, port = worst_daemon(tmp)
    client = d.client()
    try:
        with connect(f"ws://127.0.0.1:{port}", open_timeout=10) as ws:
            sim, st = drive_to_worst(rig, client, ws)
        sim.stop()
        RECORDED.write_text(json.dumps(st, indent=1, sort_keys=True) + "\n")
        print(f"recorded {RECORDED}")
    finally:
        client.close()
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    record()
