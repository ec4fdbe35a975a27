"""A real KServe v2 server process: ``python -m vlad_kserve.server`` on 127.0.0.1.

:class:`ServerProcess` starts it on free ports with a fault file, waits until the model
answers, injects faults through that file (see :mod:`vlad_kserve.server`), and can be killed
and restarted on the same ports (what a crashed and restarted inference server looks like
to vlad). The remote backend's tests and ``scripts/bench_remote.py`` run it; it needs the
``kserve-server`` extra (:func:`server_unavailable` says what is missing).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from vlad.testing.releases import DEMO, REPO

MODEL = "vlad-demo-reacher"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_unavailable() -> str | None:
    """Why the test server cannot run here (kserve or onnxruntime missing), or None."""
    for module, extra in (("kserve", "kserve-server"), ("onnxruntime", "cpu"), ("tritonclient", "kserve plugin")):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'vlad[{extra}]')"
    return None


class ServerProcess:
    """One ``vlad_kserve.server`` subprocess; ``kill`` and ``start`` keep the ports."""

    def __init__(
        self, folder: Path, release: Path = DEMO, extra: list[str] | None = None, tls: dict[str, Path] | None = None
    ) -> None:
        """``tls``: ``{"cert", "key", "ca"[, "client_cert", "client_key"]}``: serve over TLS,
        requiring client certificates signed by ``ca`` when client files are given."""
        self.folder = folder
        self.release = release
        self.extra = list(extra or [])
        self.tls = tls
        if tls:
            self.extra += ["--tls-cert", str(tls["cert"]), "--tls-key", str(tls["key"])]
            if tls.get("client_cert"):
                self.extra += ["--tls-client-ca", str(tls["ca"])]
        self.grpc_port, self.http_port = free_port(), free_port()
        self.fault_file = folder / "fault.json"
        self.log_path = folder / "server.log"
        self.proc: subprocess.Popen | None = None

    def endpoint(self, protocol: str = "grpc") -> str:
        s = "s" if self.tls else ""
        return (
            f"grpc{s}://127.0.0.1:{self.grpc_port}" if protocol == "grpc" else f"http{s}://127.0.0.1:{self.http_port}"
        )

    def start(self, timeout: float = 90.0) -> ServerProcess:
        """Start (or restart) the server and wait until the model is ready on both protocols."""
        cmd = [
            sys.executable,
            "-m",
            "vlad_kserve.server",
            "--release",
            str(self.release),
            "--grpc-port",
            str(self.grpc_port),
            "--http-port",
            str(self.http_port),
            "--fault-file",
            str(self.fault_file),
            *self.extra,
        ]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"test server exited with {self.proc.returncode}:\n{self.log()}")
            if self._ready():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"test server not ready within {timeout} s:\n{self.log()}")

    def _ready(self) -> bool:
        context = None
        if self.tls:
            import ssl

            context = ssl.create_default_context(cafile=str(self.tls["ca"]))
            if self.tls.get("client_cert"):
                context.load_cert_chain(str(self.tls["client_cert"]), str(self.tls["client_key"]))
        try:
            url = f"{self.endpoint('http')}/v2/models/{MODEL}/ready"
            with urllib.request.urlopen(url, timeout=1, context=context) as r:
                http_ok = r.status == 200
        except (urllib.error.URLError, OSError):
            return False
        with socket.socket() as s:
            s.settimeout(1)
            return http_ok and s.connect_ex(("127.0.0.1", self.grpc_port)) == 0

    def fault(self, **fault) -> None:
        """Inject a fault (see vlad_kserve.server); no arguments clears it. Atomic: the
        server never reads a half-written file."""
        tmp = self.fault_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(fault))
        os.replace(tmp, self.fault_file)

    def kill(self) -> None:
        """SIGKILL: the server vanishes without closing anything cleanly."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
