"""Runs the real daemon (``vlad serve``) on a release under test, with its real sockets.

The performance and closed-loop gates judge what a robot would get, so they go through
the daemon process, not an in-process shortcut: ipc sockets in a private folder, a
datagram ``NOTIFY_SOCKET`` standing in for systemd (READY=1 marks the end of loading and
warm-up), the release loaded exactly as configured. A release that is not signed yet (the
usual case: evidence is recorded before signing) is served unverified with the
backend, artifact and options of its manifest; with ``keys_dir`` it is verified first.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from vlad.gates.results import GateError
from vlad.gates.subject import Subject

SOCKETS = ("observations", "actions", "status", "control")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON escapes are valid TOML basic strings
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def daemon_config(
    subject: Subject, folder: Path, *, warmup: int, log_level: str = "info", keys_dir: str | None = None
) -> tuple[str, dict[str, str]]:
    """The config text and the endpoints for serving ``subject`` from ``folder``."""
    endpoints = {name: f"ipc://{folder}/{name}" for name in SOCKETS}
    lines = ["[release]", f"path = {_toml(str(subject.path))}"]
    if keys_dir:
        lines += ["verify = true", f"keys_dir = {_toml(str(keys_dir))}"]
    else:
        s = subject.serving
        lines += [
            "verify = false",
            f"backend = {_toml(s.backend)}",
            f"artifact = {_toml(s.artifact)}",
            f"options = {_toml(dict(s.options))}",
        ]
    lines += [
        "",
        "[sockets]",
        *(f"{k} = {_toml(v)}" for k, v in endpoints.items()),
        "",
        "[serve]",
        f"warmup = {int(warmup)}",
        "",
        "[logging]",
        f"level = {_toml(log_level)}",
        'journald = "off"',
        "",
    ]
    return "\n".join(lines), endpoints


class _Notify:
    """A datagram socket standing in for systemd's notify socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.messages: list[tuple[int, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gate-notify", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode(errors="replace").splitlines() if "=" in line)
            self.messages.append((time.monotonic_ns(), fields))

    def first(self, key: str, value: str) -> int | None:
        """Monotonic time of the first ``key=value`` message, or None."""
        return next((t for t, m in list(self.messages) if m.get(key) == value), None)

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


class RunningDaemon:
    """A ``vlad serve`` subprocess on one release; stop it with :meth:`stop` (or ``with``)."""

    def __init__(
        self,
        subject: Subject,
        *,
        warmup: int = 10,
        log_level: str = "info",
        keys_dir: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.subject = subject
        self._tmp = Path(tempfile.mkdtemp(prefix="vlad-gate-"))
        text, self.endpoints = daemon_config(subject, self._tmp, warmup=warmup, log_level=log_level, keys_dir=keys_dir)
        self.config = self._tmp / "vlad.toml"
        self.config.write_text(text)
        self.log_path = self._tmp / "vlad.log"
        self.notify = _Notify(self._tmp / "notify.sock")
        full_env = {**os.environ, "NOTIFY_SOCKET": str(self.notify.path), "PYTHONUNBUFFERED": "1", **(env or {})}
        self.t_start_ns = time.monotonic_ns()
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            _vlad_command() + ["serve", "--config", str(self.config)],
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 120.0) -> float:
        """Seconds from process start to READY=1; a :class:`GateError` with the log's tail if it
        exits or never gets there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.notify.first("READY", "1")
            if t is not None:
                return (t - self.t_start_ns) / 1e9
            if self.proc.poll() is not None:
                raise GateError(
                    f"vlad serve exited with status {self.proc.returncode} while loading "
                    f"{self.subject.path}: {self.log_tail()}"
                )
            time.sleep(0.02)
        raise GateError(f"vlad serve did not become ready within {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 3) -> str:
        """The daemon log's last lines, joined for a one-line error."""
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"

    def peak_rss_bytes(self) -> int | None:
        """The kernel's high-water mark of the daemon's resident memory (VmHWM), or None."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def gpu_memory_bytes(self) -> int | None:
        """GPU memory the daemon process holds (nvidia-smi), or None without a GPU."""
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return None
        try:
            out = subprocess.run(
                [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        used = [
            int(float(m))
            for p, m in (line.split(",") for line in out.strip().splitlines() if "," in line)
            if p.strip() == str(self.proc.pid)
        ]
        return sum(used) * 2**20 if used else 0

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit status."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            self.notify.close()
            self._log.close()
        return self.proc.returncode

    def cleanup(self) -> None:
        """Remove the private folder (config, sockets, log)."""
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> RunningDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.cleanup()


def _vlad_command() -> list[str]:
    """The daemon's console script beside this Python, else the same entry point via -c."""
    script = Path(sys.executable).parent / "vlad"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from vlad.cli import vlad_main; sys.exit(vlad_main())"]
