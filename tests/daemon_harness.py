"""Starts the real daemon as a subprocess with a real systemd notify socket.

Used by the daemon tests and the fault-injection tests: ``start_daemon(tmp_path)`` runs
``vlad serve`` on the demo release with ipc endpoints under ``tmp_path``, waits for
``READY=1`` on a datagram ``NOTIFY_SOCKET`` and returns a :class:`RunningDaemon`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VLAD = Path(sys.executable).parent / "vlad"


class NotifyListener:
    """A real ``AF_UNIX`` datagram socket standing in for systemd's notify socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((time.monotonic(), fields))

    def wait_for(self, key: str, value: str | None = None, timeout: float = 60.0, proc=None) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                break
            for _, m in list(self.messages):
                if key in m and (value is None or m[key] == value):
                    return m
            time.sleep(0.02)
        raise TimeoutError(f"no {key}={value or '*'} on the notify socket within {timeout} s; got {self.messages}")

    def count(self, key: str) -> int:
        return sum(1 for _, m in list(self.messages) if key in m)

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


class RunningDaemon:
    def __init__(self, proc: subprocess.Popen, endpoints: dict[str, str], notify: NotifyListener, log_path: Path):
        self.proc = proc
        self.endpoints = endpoints
        self.notify = notify
        self.log_path = log_path

    def client(self, name: str = "test-controller"):
        from vlad.client import Client

        return Client(name=name, **self.endpoints)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.terminate()
        finally:
            self.notify.close()


def endpoints_in(folder: Path) -> dict[str, str]:
    return {name: f"ipc://{folder}/{name}" for name in ("observations", "actions", "status", "control")}


def daemon_command(endpoints: dict[str, str], extra: list[str] | None = None, config: Path | None = None) -> list[str]:
    cmd = [str(VLAD), "serve", "--config", str(config or ROOT / "etc" / "vlad" / "demo.toml")]
    for key, ep in endpoints.items():
        cmd += ["--set", f'sockets.{key}="{ep}"']
    return cmd + list(extra or [])


def start_daemon(
    tmp_path: Path,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
    config: Path | None = None,
    wait_ready: bool = True,
    endpoints: dict[str, str] | None = None,
    prefix: list[str] | None = None,
) -> RunningDaemon:
    """``prefix``: a command the daemon runs under (e.g. ``unshare ...``), its last word
    followed by the ``vlad serve`` command line."""
    sock_dir = tmp_path / "run"
    sock_dir.mkdir(exist_ok=True)
    endpoints = endpoints or endpoints_in(sock_dir)
    notify = NotifyListener(tmp_path / "notify.sock")
    full_env = {**os.environ, "NOTIFY_SOCKET": str(notify.path), "PYTHONUNBUFFERED": "1", **(env or {})}
    log_path = tmp_path / "vlad.log"
    proc = subprocess.Popen(
        [*(prefix or []), *daemon_command(endpoints, extra, config)],
        env=full_env,
        stdout=open(log_path, "wb"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    d = RunningDaemon(proc, endpoints, notify, log_path)
    if wait_ready:
        try:
            notify.wait_for("READY", "1", timeout=90, proc=proc)
        except TimeoutError:
            d.stop()
            raise AssertionError(f"daemon never became ready; log:\n{d.log()}") from None
    return d


@dataclass
class FaultRig:
    config: Path
    control: Path  # write a mode here: ok | raise | hang | nan | oob
    sensors: Path  # JSON readings of the injected sensor
    estop: Path  # the e-stop file: "engaged" / "0"
    primary: Path
    env: dict[str, str]


def write_fault_rig(tmp_path: Path) -> FaultRig:
    """Config for a daemon whose release runs on the fault-injecting backend, with a previous
    release (real ONNX Runtime) and the hold posture as its fallback chain."""
    from tests.conftest import DEMO

    primary = tmp_path / "release"
    previous = tmp_path / "previous"
    for folder, version in ((primary, "1.0.0"), (previous, "0.9.0")):
        folder.mkdir()
        for name in ("tokenizer.json", "policy.onnx"):
            shutil.copy(DEMO / name, folder / name)
        text = (DEMO / "contract.toml").read_text().replace('version = "1.0.0"', f'version = "{version}"', 1)
        (folder / "contract.toml").write_text(text)
    control = tmp_path / "fault"
    sensors = tmp_path / "sensors.json"
    estop = tmp_path / "estop"
    config = tmp_path / "vlad.toml"
    config.write_text(f"""
[release]
path = "{primary}"
verify = false
backend = "faulty"
artifact = "policy.onnx"
options = {{ control_file = "{control}", intra_op_threads = 1 }}

[serve]
warmup = 3
hang_timeout_s = 0.3

[fallback]
healthy_window_s = 1.0

[[fallback.chain]]
kind = "release"
path = "{previous}"
backend = "onnxruntime"
artifact = "policy.onnx"
options = {{ intra_op_threads = 1 }}

[[fallback.chain]]
kind = "hold"

[monitors]
artifact_check_interval_s = 0.2

[safety]
estop_file = "{estop}"
""")
    env = {"VLAD_PLUGIN_MODULES": "tests.fault_plugin", "PYTHONPATH": str(ROOT), "VLAD_TEST_SENSOR_FILE": str(sensors)}
    return FaultRig(config, control, sensors, estop, primary, env)


PERIOD_S = 0.02


@dataclass
class Received:
    t: float
    source: str
    state: str
    actions: np.ndarray
    interventions: tuple
    t_issue_ns: int = 0  # the daemon's CLOCK_MONOTONIC, comparable with time.monotonic_ns() here
    obs_seq: int = 0


@dataclass
class ControllerSim:
    """Publishes observations + heartbeats at 50 Hz, records every chunk it receives."""

    client: object
    case: dict
    send_obs: bool = True
    send_heartbeat: bool = True
    stale: bool = False
    bad_shape: bool = False
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ControllerSim:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        raw = self.case["raw"]
        next_t = time.monotonic()
        seq = 0
        while not self._stop.is_set():
            seq += 1
            if self.send_obs:
                t_sensor = time.monotonic_ns() - (int(1e9) if self.stale else 0)
                img = raw.images["overhead"]
                if self.bad_shape:
                    img = np.zeros((32, 32, 3), np.uint8)
                self.client.publish_observation(
                    {"overhead": img}, proprio=raw.proprio, instruction=raw.instruction, seq=seq, t_sensor_ns=t_sensor
                )
            if self.send_heartbeat:
                self.client.heartbeat()
            next_t += PERIOD_S
            while True:
                chunk = self.client.recv_actions(timeout_ms=max(0, int((next_t - time.monotonic()) * 1000)))
                if chunk is None:
                    break
                self.received.append(
                    Received(
                        time.monotonic(),
                        chunk.source,
                        chunk.state,
                        chunk.actions.copy(),
                        chunk.interventions,
                        chunk.t_issue_ns,
                        chunk.obs_seq,
                    )
                )
                if time.monotonic() >= next_t:
                    break

    def since(self, t0: float) -> list[Received]:
        return [r for r in list(self.received) if r.t >= t0]


def max_gap(chunks: list[Received]) -> float:
    ts = [c.t for c in chunks]
    return max(np.diff(ts)) if len(ts) > 1 else float("inf")


# For tests that send observations and heartbeats now and then, not as steady streams:
# switch off the monitors that would (rightly) call that a stalled sensor or a lost
# controller; tests/test_faults.py covers them.
QUIET_MONITORS = [
    "--set",
    "monitors.sensor_stall_periods=1000000",
    "--set",
    "monitors.stale_fraction_fault=1.0",
    "--set",
    "monitors.heartbeat_missing_periods=1000000",
]


# An attack beside the serving core must leave two things as they are: a native controller's
# cadence and the systemd watchdog. Run the daemon with WATCHDOG_ENV (a 1 s watchdog, pinged
# every 0.5 s) and check both over the attack's time with assert_core_unaffected:
#
# * the watchdog never silent for its limit (1 s);
# * the controller's cadence: 95 % of the gaps between its chunks within tests/test_faults.py's
#   bound (3 periods + 10 ms), at least 75 % of the periods with a chunk, and no hole over
#   0.5 s. A strict "every gap within the bound" holds on a quiet machine (the figures each
#   test prints), but the 2-core test machine is shared: another job can take both cores for
#   a scheduler slice or two at any moment. A core held by an endpoint shows as seconds,
#   not as one slice (issue 22: 6-11 s without a chunk or a watchdog ping).
WATCHDOG_ENV = {"WATCHDOG_USEC": "1000000"}
WATCHDOG_LIMIT_S = 1.0
CADENCE_GAP_S = 3 * PERIOD_S + 0.01
MAX_HOLE_S = 0.5


def watchdog_gap(notify: NotifyListener, t0: float, t1: float) -> float:
    """The longest time without a WATCHDOG=1 between t0 and t1 (time.monotonic())."""
    ts = [t0] + [t for t, m in list(notify.messages) if m.get("WATCHDOG") == "1" and t0 <= t <= t1] + [t1]
    return float(max(np.diff(ts)))


def assert_core_unaffected(d: RunningDaemon, ctl: ControllerSim, t0: float, t1: float | None = None) -> str:
    """The native controller kept its cadence and the watchdog kept pinging from t0 to t1
    (see above); a one-line summary of the figures for the test's output."""
    t1 = time.monotonic() if t1 is None else t1
    ts = [t0] + [c.t for c in ctl.since(t0) if c.t <= t1] + [t1]
    gaps = np.diff(ts)
    dog = watchdog_gap(d.notify, t0, t1)
    periods = (t1 - t0) / PERIOD_S
    within = float(np.mean(gaps <= CADENCE_GAP_S))
    summary = (
        f"{len(ts) - 2} chunks in {t1 - t0:.1f} s ({periods:.0f} periods), gaps p50 {np.median(gaps) * 1e3:.1f} "
        f"max {gaps.max() * 1e3:.1f} ms ({within:.1%} within {CADENCE_GAP_S * 1e3:.0f} ms), "
        f"watchdog gap {dog * 1e3:.0f} ms"
    )
    assert d.proc.poll() is None, d.log()[-3000:]
    assert dog <= WATCHDOG_LIMIT_S, f"watchdog silent for {dog * 1e3:.0f} ms: {summary}"
    assert gaps.max() <= MAX_HOLE_S, summary
    assert within >= 0.95 and len(ts) - 2 >= 0.75 * periods, summary
    return summary


def goodbye(client) -> None:
    """The controller leaves on purpose (docs/protocol.md, heartbeat ``bye``): vlad forgets it."""
    from vlad import protocol

    client.send_raw(
        protocol.encode(
            protocol.TOPIC_HEARTBEAT, {"seq": 1, "t_ns": time.monotonic_ns(), "client": client.name, "bye": True}
        )
    )
