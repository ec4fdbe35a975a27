"""Starts the real daemon as a subprocess with a real systemd notify socket.

Used by the daemon tests and the fault-injection tests: ``start_daemon(tmp_path)`` runs
``vlad serve`` on the demo release with ipc endpoints under ``tmp_path``, waits for
``READY=1`` on a datagram ``NOTIFY_SOCKET`` and returns a :class:`RunningDaemon`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

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

    def wait_for(self, key: str, value: str | None = None, timeout: float = 60.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
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


def start_daemon(tmp_path: Path, extra: list[str] | None = None, env: dict[str, str] | None = None,
                 config: Path | None = None, wait_ready: bool = True) -> RunningDaemon:
    sock_dir = tmp_path / "run"
    sock_dir.mkdir(exist_ok=True)
    endpoints = endpoints_in(sock_dir)
    notify = NotifyListener(tmp_path / "notify.sock")
    full_env = {**os.environ, "NOTIFY_SOCKET": str(notify.path), "PYTHONUNBUFFERED": "1", **(env or {})}
    log_path = tmp_path / "vlad.log"
    proc = subprocess.Popen(
        daemon_command(endpoints, extra, config), env=full_env, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    d = RunningDaemon(proc, endpoints, notify, log_path)
    if wait_ready:
        try:
            notify.wait_for("READY", "1", timeout=90)
        except TimeoutError:
            d.stop()
            raise AssertionError(f"daemon never became ready; log:\n{d.log()}") from None
    return d
