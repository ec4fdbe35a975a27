"""KServe v2 servers for the remote backend's tests and benchmarks (vlad's and a plugin
user's), on 127.0.0.1. Not used by the backend itself.

* :class:`ServerProcess`: the real one, ``python -m vlad_kserve.server`` on a release, on free
  ports with a fault file: it waits until the model answers, injects faults through that file (see
  :mod:`vlad_kserve.server`), and can be killed and restarted on the same ports (what a
  crashed and restarted inference server looks like to vlad). It needs the
  ``kserve-server`` extra (:func:`server_unavailable` says what is missing).
* :class:`HostileServer`: a v2 HTTP server in this process (binary tensors, an ONNX model
  such as the demo's, on ONNX Runtime) answering the way a broken or malicious server does.
  ``mode`` (set any time, atomically):

  - ``proxy``: answers properly (ONNX Runtime here: ~2 ms, well inside the demo's 20 ms
    deadline, where kserve's own HTTP path takes ~14 ms); with ``late_every = N`` every Nth
    inference is trickled instead (a server late now and then);
  - ``trickle``: the proper answer, one byte every ``trickle_s`` (8 ms);
  - ``huge``: ``200`` announcing a 1 GiB body and streaming it (from one reused 1 MiB
    buffer, never allocated whole) until the client hangs up;
  - ``huge_chunked``: the same without a length (chunked transfer encoding);
  - ``bad_metadata``: model metadata that is not a v2 reply (a JSON list, then a map with
    ``inputs: 5``, then a string, in turn); readiness says ready; inference answers 503;
  - ``down``: every connection closed at once, nothing answered.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

MODEL = "vlad-demo-reacher"


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (bound together while chosen)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def server_unavailable() -> str | None:
    """Why the test server cannot run here (kserve or onnxruntime missing), or None."""
    for module, extra in (("kserve", "kserve-server"), ("onnxruntime", "cpu"), ("tritonclient", "kserve plugin")):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'vlad[{extra}]')"
    return None


class ServerProcess:
    """One ``vlad_kserve.server`` subprocess; ``kill`` and ``start`` keep the ports."""

    def __init__(
        self, folder: Path, release: Path | str, extra: list[str] | None = None, tls: dict[str, Path] | None = None
    ) -> None:
        """``release``: a release folder (or a reference the server pulls, see ``extra``);
        ``tls``: ``{"cert", "key", "ca"[, "client_cert", "client_key"]}``: serve over TLS,
        requiring client certificates signed by ``ca`` when client files are given."""
        self.folder = folder
        self.release = release
        self.extra = list(extra or [])
        self.tls = tls
        if tls:
            self.extra += ["--tls-cert", str(tls["cert"]), "--tls-key", str(tls["key"])]
            if tls.get("client_cert"):
                self.extra += ["--tls-client-ca", str(tls["ca"])]
        self.grpc_port, self.http_port = free_ports(2)
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
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
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


# -- the hostile server ----------------------------------------------------------------------

CHUNK = bytes(1 << 20)
GIB = 1 << 30
BAD_METADATA = (b"[1, 2, 3]", b'{"name": "m", "inputs": 5, "outputs": [{"shape": "x"}]}', b'"just a string"')
V2 = {"tensor(float)": "FP32", "tensor(int64)": "INT64", "tensor(int32)": "INT32", "tensor(uint8)": "UINT8"}
NP = {"FP32": np.float32, "INT64": np.int64, "INT32": np.int32, "UINT8": np.uint8}


def _response(status: str, body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\n{extra}Content-Length: {len(body)}\r\n\r\n".encode() + body


class HostileServer:
    """The hostile server (see the module doc) on ``onnx_model`` (e.g. the demo's ``policy.onnx``)."""

    def __init__(self, onnx_model: Path, model: str = MODEL, trickle_s: float = 0.008) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        self.sess = ort.InferenceSession(str(onnx_model), so, providers=["CPUExecutionProvider"])

        def signature(args) -> list[dict]:
            return [
                {"name": a.name, "datatype": V2[a.type], "shape": [d if isinstance(d, int) else -1 for d in a.shape]}
                for a in args
            ]

        self.base = f"/v2/models/{model}"
        self.metadata = json.dumps(
            {
                "name": model,
                "versions": ["1"],
                "platform": "onnxruntime",
                "inputs": signature(self.sess.get_inputs()),
                "outputs": signature(self.sess.get_outputs()),
            }
        ).encode()
        self.trickle_s = trickle_s
        self.late_every = 0  # proxy mode: every Nth inference answered late (trickled); 0: none
        self._infers = itertools.count(1)
        self.mode = "proxy"
        self.requests: dict[str, int] = {}
        self.bytes_sent = 0
        self._bad = itertools.cycle(BAD_METADATA)
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop = True
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            f = conn.makefile("rb")
            while not self._stop:
                if self.mode == "down":
                    return
                try:
                    request = self._read_request(f)
                except (OSError, ValueError):
                    return
                if request is None:
                    return
                mode = self.mode
                self.requests[mode] = self.requests.get(mode, 0) + 1
                try:
                    if not self._answer(conn, mode, *request):
                        return
                except OSError:
                    return

    @staticmethod
    def _read_request(f) -> tuple[str, str, dict[str, str], bytes] | None:
        line = f.readline(65536)
        if not line:
            return None
        method, path, _ = line.decode().split(" ", 2)
        headers = {}
        while (h := f.readline(65536)) not in (b"\r\n", b"\n", b""):
            k, _, v = h.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        body = f.read(int(headers.get("content-length", "0")))
        return method, path, headers, body

    def _proper(self, method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        """What a healthy v2 server answers (binary tensors)."""
        if method == "GET" and path == self.base:
            return _response("200 OK", self.metadata, "Content-Type: application/json\r\n")
        if method == "GET" and path == f"{self.base}/ready":
            return _response("200 OK", b"")
        if method != "POST" or path != f"{self.base}/infer":
            return _response("404 Not Found", b'{"error": "no such path"}')
        n = int(headers["inference-header-content-length"])
        head, offset, feeds = json.loads(body[:n]), n, {}
        for x in head["inputs"]:
            size = x["parameters"]["binary_data_size"]
            feeds[x["name"]] = np.frombuffer(
                body, NP[x["datatype"]], size // np.dtype(NP[x["datatype"]]).itemsize, offset
            ).reshape(x["shape"])
            offset += size
        names = [o["name"] for o in head["outputs"]]
        results = self.sess.run(names, feeds)
        out = [
            {"name": k, "datatype": "FP32", "shape": list(v.shape), "parameters": {"binary_data_size": v.nbytes}}
            for k, v in zip(names, results, strict=True)
        ]
        header = json.dumps({"model_name": "m", "outputs": out}).encode()
        data = header + b"".join(np.ascontiguousarray(v, np.float32).tobytes() for v in results)
        return _response(
            "200 OK",
            data,
            f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(header)}\r\n",
        )

    def _answer(self, conn: socket.socket, mode: str, method: str, path: str, headers: dict, body: bytes) -> bool:
        """Send one answer; False when the connection must end."""
        if mode == "proxy" and self.late_every and method == "POST" and next(self._infers) % self.late_every == 0:
            mode = "trickle"
        if mode == "proxy":
            conn.sendall(self._proper(method, path, headers, body))
            return True
        if mode == "trickle":
            for b in self._proper(method, path, headers, body):
                conn.sendall(bytes((b,)))
                self.bytes_sent += 1
                time.sleep(self.trickle_s)
            return True
        if mode in ("huge", "huge_chunked"):
            length = f"Content-Length: {GIB}\r\n" if mode == "huge" else "Transfer-Encoding: chunked\r\n"
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n{length}\r\n".encode())
            sent = 0
            while sent < GIB:
                if mode == "huge":
                    conn.sendall(CHUNK)
                else:
                    conn.sendall(b"%x\r\n" % len(CHUNK) + CHUNK + b"\r\n")
                sent += len(CHUNK)
                self.bytes_sent += len(CHUNK)
            return False
        if mode == "bad_metadata":
            if path.endswith("/ready"):
                conn.sendall(_response("200 OK", b""))
            elif method == "GET":
                conn.sendall(_response("200 OK", next(self._bad), "Content-Type: application/json\r\n"))
            else:
                conn.sendall(_response("503 Service Unavailable", b""))
            return True
        return False
