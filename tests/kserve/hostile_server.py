"""A hostile KServe v2 HTTP server for the tests: the v2 HTTP protocol (binary tensors) over
the demo release's ONNX model, answering the way a broken or malicious server does.

``mode`` (set any time, atomically):

* ``proxy``: answers properly (ONNX Runtime here: ~2 ms, well inside the demo's 20 ms
  deadline, where kserve's own HTTP path takes ~14 ms); with ``late_every = N`` every Nth
  inference is trickled instead (a server late now and then);
* ``trickle``: the proper answer, one byte every ``trickle_s`` (8 ms);
* ``huge``: ``200`` announcing a 1 GiB body and streaming it (from one reused 1 MiB buffer,
  never allocated whole) until the client hangs up;
* ``huge_chunked``: the same without a length (chunked transfer encoding);
* ``bad_metadata``: model metadata that is not a v2 reply (a JSON list, then a map with
  ``inputs: 5``, then a string, in turn); readiness says ready; inference answers 503;
* ``down``: every connection closed at once, nothing answered.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from pathlib import Path

import numpy as np

DEMO = Path(__file__).resolve().parents[2] / "manifests" / "demo"
CHUNK = bytes(1 << 20)
GIB = 1 << 30
BAD_METADATA = (b"[1, 2, 3]", b'{"name": "m", "inputs": 5, "outputs": [{"shape": "x"}]}', b'"just a string"')
V2 = {"tensor(float)": "FP32", "tensor(int64)": "INT64", "tensor(int32)": "INT32", "tensor(uint8)": "UINT8"}
NP = {"FP32": np.float32, "INT64": np.int64, "INT32": np.int32, "UINT8": np.uint8}


def _response(status: str, body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\n{extra}Content-Length: {len(body)}\r\n\r\n".encode() + body


class HostileServer:
    def __init__(self, model: str = "vlad-demo-reacher", trickle_s: float = 0.008) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        self.sess = ort.InferenceSession(str(DEMO / "policy.onnx"), so, providers=["CPUExecutionProvider"])

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
