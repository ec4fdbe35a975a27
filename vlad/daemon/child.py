"""``vlad serve`` as a child process, behind a notify socket of its own.

What runs the daemon from another program (the gates, the demo, the benchmarks and the
tests) the way systemd runs it on a robot. :func:`launch` starts ``vlad serve`` on a typed
:class:`~vlad.config.Config` (written as TOML by :func:`vlad.config.config_toml`) or a config
file, in a private folder that holds its ipc sockets (:func:`endpoints_in`), its config, its
log and a datagram ``NOTIFY_SOCKET`` (:class:`NotifyListener`): ``READY=1`` marks the end of
loading and warm-up, exactly as systemd sees it. :class:`DaemonProcess` is the running
child: ready wait, log, memory figures, stop; :func:`daemon_command` the bare command line
(:func:`vlad_command`: the ``vlad`` console script beside this Python).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vlad.config import Config, config_toml
from vlad.errors import VladError

SOCKETS = ("observations", "actions", "status", "control")


class DaemonFailed(VladError):
    """The daemon exited or never became ready; the message ends with its log's last lines."""


class NotifyListener:
    """A real ``AF_UNIX`` datagram socket standing in for systemd's notify socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        # (time.monotonic() at arrival, fields) of every datagram, in arrival order: the clock
        # of ControllerSim's records, so a test lines up what the controller got with them
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vlad-notify-listener", daemon=True)
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
            self.messages.append((time.monotonic(), fields))

    def wait_for(self, key: str, value: str | None = None, timeout: float = 60.0, proc: Any = None) -> dict[str, str]:
        """The first message with ``key`` (equal to ``value`` when given); TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                break
            for _, m in list(self.messages):
                if key in m and (value is None or m[key] == value):
                    return m
            time.sleep(0.02)
        raise TimeoutError(f"no {key}={value or '*'} on the notify socket within {timeout} s; got {self.messages}")

    def first(self, key: str, value: str) -> float | None:
        """``time.monotonic()`` at the first ``key=value`` message, or None."""
        return next((t for t, m in list(self.messages) if m.get(key) == value), None)

    def count(self, key: str) -> int:
        return sum(1 for _, m in list(self.messages) if key in m)

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


class DaemonProcess:
    """A running ``vlad serve`` (see :func:`launch`); stop it with :meth:`stop` (or ``with``)."""

    def __init__(
        self,
        proc: subprocess.Popen,
        folder: Path,
        endpoints: dict[str, str],
        notify: NotifyListener,
        log_path: Path,
        t_start_ns: int,
        owns_folder: bool,
        echo: bool = False,
    ) -> None:
        self.proc = proc
        self.folder = folder
        self.endpoints = endpoints
        self.notify = notify
        self.log_path = log_path
        self.t_start_ns = t_start_ns
        self._owns_folder = owns_folder
        self.echo = echo  # its log goes to this process's terminal, not to log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, name: str = "test-controller") -> Any:
        """A :class:`vlad.client.Client` on this daemon's sockets."""
        from vlad.client import Client

        e = self.endpoints
        return Client(
            name=name, observations=e["observations"], actions=e["actions"], status=e["status"], control=e["control"]
        )

    def wait_ready(self, timeout: float = 120.0) -> float:
        """Seconds from process start to ``READY=1``; :class:`DaemonFailed` with the log's tail
        when it exits or never gets there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.notify.first("READY", "1")
            if t is not None:
                return t - self.t_start_ns / 1e9
            if self.proc.poll() is not None:
                raise DaemonFailed(f"vlad serve exited with status {self.proc.returncode}: {self.log_tail()}")
            time.sleep(0.02)
        raise DaemonFailed(f"vlad serve did not become ready within {timeout:.0f} s: {self.log_tail()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 3) -> str:
        """The log's last lines, joined for a one-line error."""
        if self.echo:
            return "its log is above"
        text = self.log().strip().splitlines()
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

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait; SIGKILL (and re-raise) after ``timeout``. The exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; closes the notify socket. The exit status."""
        try:
            if self.proc.poll() is None:
                try:
                    self.terminate(timeout)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            self.notify.close()
        return self.proc.returncode

    def cleanup(self) -> None:
        """Remove the private folder, when :func:`launch` made it."""
        if self._owns_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.cleanup()


def vlad_command() -> list[str]:
    """The daemon's console script beside this Python, else the same entry point via -c."""
    script = Path(sys.executable).parent / "vlad"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from vlad.cli import vlad_main; sys.exit(vlad_main())"]


def endpoints_in(folder: Path) -> dict[str, str]:
    """ipc endpoints for the daemon's four sockets, in ``folder``."""
    return {name: f"ipc://{folder}/{name}" for name in SOCKETS}


def daemon_command(config: Path | str, endpoints: Mapping[str, str], extra: Sequence[str] | None = None) -> list[str]:
    """The ``vlad serve`` command line on ``config`` with its sockets moved to ``endpoints``,
    then ``extra`` arguments."""
    cmd = [*vlad_command(), "serve", "--config", str(config)]
    for key, ep in endpoints.items():
        cmd += ["--set", f'sockets.{key}="{ep}"']
    return cmd + list(extra or [])


def launch(
    config: Config | str | Path,
    *,
    folder: Path | None = None,
    settings: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    endpoints: Mapping[str, str] | None = None,
    wait_ready: bool = True,
    timeout: float = 90.0,
    cwd: Path | None = None,
    prefix: Sequence[str] | None = None,
    echo: bool = False,
) -> DaemonProcess:
    """Start ``vlad serve`` on ``config`` (a :class:`~vlad.config.Config`, or a config file) in
    ``folder`` (default: a new temporary folder, removed by :meth:`DaemonProcess.cleanup`).

    Its sockets are ipc endpoints in ``folder/run`` unless ``endpoints`` says otherwise;
    ``settings`` are ``--set KEY=VALUE`` overrides; with ``wait_ready`` this returns once the
    notify socket got ``READY=1`` (:class:`DaemonFailed` if it never does). ``prefix`` is a
    command the daemon runs under (``unshare ...``, ``taskset ...``), its last word followed by
    the ``vlad serve`` command line. With ``echo`` its log goes to this process's terminal
    (the demo) instead of ``folder/vlad.log``.
    """
    owns = folder is None
    folder = Path(tempfile.mkdtemp(prefix="vlad-daemon-")) if folder is None else Path(folder)
    run = folder / "run"
    run.mkdir(parents=True, exist_ok=True)
    eps = dict(endpoints or endpoints_in(run))
    if isinstance(config, Config):
        path = folder / "vlad.toml"
        changes: dict[str, Any] = dict(eps)
        sockets = dataclasses.replace(config.sockets, **changes)
        cfg = dataclasses.replace(config, sockets=sockets)
        path.write_text(config_toml(cfg))
        moved: Mapping[str, str] = {}  # the endpoints are in the file
    else:
        path = Path(config)
        moved = eps
    overrides = [a for item in settings for a in ("--set", item)]
    notify = NotifyListener(folder / "notify.sock")
    full_env = {**os.environ, "NOTIFY_SOCKET": str(notify.path), "PYTHONUNBUFFERED": "1", **(env or {})}
    log_path = folder / "vlad.log"
    t_start = time.monotonic_ns()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*(prefix or ()), *daemon_command(path, moved, overrides)],
            env=full_env,
            stdout=None if echo else log,
            stderr=None if echo else subprocess.STDOUT,
            cwd=cwd,
        )
    daemon = DaemonProcess(proc, folder, eps, notify, log_path, t_start, owns, echo)
    if wait_ready:
        try:
            daemon.wait_ready(timeout)
        except DaemonFailed:
            daemon.stop()
            raise
    return daemon
