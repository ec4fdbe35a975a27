"""The two v2 wire protocols behind one small interface: metadata, readiness, inference.

``GrpcTransport`` uses tritonclient's gRPC client: tensors travel as
``raw_input_contents`` / ``raw_output_contents`` (binary), each call carries its own gRPC
deadline, and the channel reconnects by itself with a short backoff cap
(``reconnect_backoff_ms``), so a restarted server is found again quickly.

``HttpTransport`` speaks the v2 HTTP protocol with its binary-tensor extension
(``Inference-Header-Content-Length``: a JSON header, then the raw tensor bytes) over one
keep-alive ``http.client`` connection. tritonclient's HTTP client is not used: its timeouts
are fixed per client (gevent), while every vlad request needs its own deadline.

Both are bounded by the request, not by each read: a request's timeout is its *total*
time (gRPC's call deadline; over HTTP every connect, send and receive of the request gets
only the time left until then, so a server trickling one byte every few milliseconds is
cut off at the deadline), and a response is at most ``max_response_mb`` (gRPC's receive
limit; over HTTP the announced length is checked before the body is read, and a body
without one is read no further than that).

Every failure becomes a :class:`TransportError` with a ``kind`` that decides whose fault it
is (see :data:`SYSTEM_KINDS`). An answer that cannot be read at all (a body too large, a
metadata reply that is not the v2 shape) is the server's: ``server_error``.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import numpy as np

from vlad_kserve.options import RemoteOptions

#: numpy dtype <-> v2 datatype (BF16 has no numpy dtype and is not accepted).
V2_DATATYPES: dict[str, str] = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "float16": "FP16", "float32": "FP32", "float64": "FP64",
}  # fmt: skip
NUMPY_DTYPES = {v: np.dtype(k) for k, v in V2_DATATYPES.items()}

#: Response parameter in which vlad_kserve.server reports its own time per request (ns).
SERVER_TIME_PARAMETER = "vlad_server_ns"

# Failure kinds. The first group is the link or the server (RemoteUnavailable: a system
# fault, the policy is not to blame); "rejected" and "bad_response" mean the server and the
# contract disagree (BackendError: a policy fault).
SYSTEM_KINDS = frozenset({"unavailable", "timeout", "server_error", "auth", "not_found", "deadline"})


class TransportError(Exception):
    """A request that got no usable answer; ``kind`` says why (see the module docstring)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def v2_datatype(dtype: np.dtype | str) -> str:
    """The v2 name of a numpy dtype."""
    return V2_DATATYPES[np.dtype(dtype).name]


class TokenSource:
    """A bearer token read from a file, re-read when the file changes (rotation)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._header: str | None = None

    def header(self) -> str | None:
        """``"Bearer <token>"``, or None without a token file."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                with open(self.path, encoding="utf-8") as f:
                    token = f.read().strip()
                if not token:
                    raise TransportError("auth", f"token file {self.path} is empty")
                self._header, self._stamp = f"Bearer {token}", stamp
        except OSError as exc:
            raise TransportError("auth", f"token file {self.path} cannot be read: {exc.strerror}") from None
        return self._header


# ---------------------------------------------------------------------------------------
# gRPC
# ---------------------------------------------------------------------------------------

# gRPC status -> kind. INVALID_ARGUMENT is what KServe and Triton answer for a request the
# model cannot take (and for a model that failed on it): the contract and the served model
# disagree. Everything transient or server-side is the system's.
_GRPC_KINDS = {
    "StatusCode.UNAVAILABLE": "unavailable",
    "StatusCode.DEADLINE_EXCEEDED": "timeout",
    "StatusCode.CANCELLED": "unavailable",
    "StatusCode.UNAUTHENTICATED": "auth",
    "StatusCode.PERMISSION_DENIED": "auth",
    "StatusCode.NOT_FOUND": "not_found",
    "StatusCode.INVALID_ARGUMENT": "rejected",
    "StatusCode.FAILED_PRECONDITION": "rejected",
    "StatusCode.OUT_OF_RANGE": "rejected",
}


class GrpcTransport:
    """v2 over gRPC through tritonclient (thread-safe: one channel, shared)."""

    thread_safe = True

    def __init__(self, opts: RemoteOptions, token: TokenSource) -> None:
        import tritonclient.grpc as grpcclient

        self._g = grpcclient
        self.opts = opts
        self.token = token
        backoff = int(opts.reconnect_backoff_ms)
        args = [
            ("grpc.max_send_message_length", 2**31 - 1),
            ("grpc.max_receive_message_length", opts.max_response_bytes),
            # gRPC's default backoff grows to 120 s: a server back after a restart would stay
            # unused for minutes. Cap it so recovery is noticed within a fraction of a second.
            ("grpc.initial_reconnect_backoff_ms", min(backoff, 100)),
            ("grpc.min_reconnect_backoff_ms", min(backoff, 100)),
            ("grpc.max_reconnect_backoff_ms", backoff),
            ("grpc.enable_retries", 0),  # a retry would spend the deadline behind our back
        ]
        self.client = grpcclient.InferenceServerClient(
            opts.url,
            ssl=opts.tls,
            root_certificates=opts.tls_ca_file,
            private_key=opts.tls_key_file,
            certificate_chain=opts.tls_cert_file,
            channel_args=args,
        )

    def _headers(self) -> dict[str, str] | None:
        h = self.token.header()
        return {"authorization": h} if h else None

    def _error(self, exc: Exception) -> TransportError:
        status = exc.status() if hasattr(exc, "status") else None
        kind = _GRPC_KINDS.get(str(status), "server_error")
        text = (exc.message() if hasattr(exc, "message") else str(exc)) or str(status)
        return TransportError(kind, f"{status or type(exc).__name__}: {text.splitlines()[0] if text else ''}")

    def metadata(self, timeout_s: float) -> dict[str, Any]:
        """The model's v2 metadata as a dict (name, versions, platform, inputs, outputs)."""
        try:
            md = self.client.get_model_metadata(
                self.opts.model_name,
                self.opts.model_version,
                headers=self._headers(),
                as_json=True,
                client_timeout=timeout_s,
            )
        except self._g.InferenceServerException as exc:
            raise self._error(exc) from None
        return parse_metadata(md)

    def ready(self, timeout_s: float) -> bool:
        """Whether the server says the model is ready."""
        try:
            return bool(
                self.client.is_model_ready(
                    self.opts.model_name, self.opts.model_version, headers=self._headers(), client_timeout=timeout_s
                )
            )
        except self._g.InferenceServerException as exc:
            raise self._error(exc) from None

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: list[str], timeout_s: float
    ) -> tuple[dict[str, np.ndarray], int | None]:
        """Outputs by name and the server's own time in ns (None when it does not say)."""
        g = self._g
        reqs = []
        for name, arr in inputs.items():
            x = g.InferInput(name, list(arr.shape), v2_datatype(arr.dtype))
            x.set_data_from_numpy(arr)
            reqs.append(x)
        try:
            result = self.client.infer(
                self.opts.model_name,
                reqs,
                model_version=self.opts.model_version,
                outputs=[g.InferRequestedOutput(n) for n in output_names],
                client_timeout=timeout_s,
                headers=self._headers(),
            )
        except g.InferenceServerException as exc:
            raise self._error(exc) from None
        response = result.get_response()
        outputs = {}
        for out in response.outputs:
            try:
                outputs[out.name] = result.as_numpy(out.name)
            except Exception as exc:  # a datatype or size numpy cannot read
                raise TransportError("bad_response", f"output {out.name!r} cannot be decoded: {exc}") from None
        server_ns = None
        param = response.parameters.get(SERVER_TIME_PARAMETER)
        if param is not None and param.WhichOneof("parameter_choice") == "int64_param":
            server_ns = int(param.int64_param)
        return outputs, server_ns

    def close(self) -> None:
        self.client.close()


def parse_metadata(md: Any) -> dict[str, Any]:
    """A v2 model metadata reply as a dict (name, versions, platform, inputs, outputs), or a
    ``server_error`` when it is not one: nothing of its shape is assumed."""

    def tensor(t: Any) -> dict[str, Any]:
        if not isinstance(t, Mapping):
            raise ValueError("a tensor is not a map")
        shape = t.get("shape", [])
        if not isinstance(shape, list) or len(shape) > 16:
            raise ValueError("a shape is not a list")
        dims = [int(d) for d in shape if isinstance(d, (int, str)) and not isinstance(d, bool)]
        if len(dims) != len(shape):
            raise ValueError("a shape holds something else than integers")
        name, datatype = t.get("name"), t.get("datatype")
        if not isinstance(name, str) or not isinstance(datatype, (str, type(None))):
            raise ValueError("a tensor name is not a string")
        return {"name": name, "datatype": datatype, "shape": dims}

    try:
        if not isinstance(md, Mapping):
            raise ValueError(f"a {type(md).__name__}, not a map")
        inputs, outputs = md.get("inputs", []), md.get("outputs", [])
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) + len(outputs) > 256:
            raise ValueError("inputs/outputs are not lists")
        versions = md.get("versions") or []
        return {
            "name": md.get("name") if isinstance(md.get("name"), str) else None,
            "versions": [str(v) for v in versions][:64] if isinstance(versions, list) else [],
            "platform": str(md.get("platform", ""))[:128],
            "inputs": [tensor(t) for t in inputs],
            "outputs": [tensor(t) for t in outputs],
        }
    except (ValueError, TypeError, OverflowError) as exc:
        raise TransportError("server_error", f"model metadata is not a v2 metadata reply: {exc}") from None


class _Deadline:
    """The deadline of the request a socket serves: every blocking call gets the time left."""

    deadline = 0.0  # time.monotonic() by which the request must be over

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        return left


class _DeadlineSocket(_Deadline, socket.socket):
    def recv_into(self, *args: Any, **kwargs: Any) -> int:
        self.settimeout(self._left())
        return super().recv_into(*args, **kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> bytes:
        self.settimeout(self._left())
        return super().recv(*args, **kwargs)

    def sendall(self, *args: Any, **kwargs: Any) -> None:
        self.settimeout(self._left())  # sendall's timeout is its total time (Python >= 3.5)
        super().sendall(*args, **kwargs)


class _DeadlineSSLSocket(_Deadline, ssl.SSLSocket):
    def recv_into(self, *args: Any, **kwargs: Any) -> int:
        self.settimeout(self._left())
        return super().recv_into(*args, **kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> bytes:
        self.settimeout(self._left())
        return super().recv(*args, **kwargs)

    def send(self, *args: Any, **kwargs: Any) -> int:  # SSLSocket.sendall loops over send
        self.settimeout(self._left())
        return super().send(*args, **kwargs)


# ---------------------------------------------------------------------------------------
# HTTP (binary tensor extension)
# ---------------------------------------------------------------------------------------


def _http_kind(status: int) -> str:
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status in (400, 422):
        return "rejected"
    return "server_error"  # 5xx, and anything else unexpected


class HttpTransport:
    """v2 over HTTP/1.1 with binary tensors, one keep-alive connection (not thread-safe)."""

    thread_safe = False

    def __init__(self, opts: RemoteOptions, token: TokenSource) -> None:
        self.opts = opts
        self.token = token
        self._conn: http.client.HTTPConnection | None = None
        self._ssl: ssl.SSLContext | None = None
        if opts.tls:
            self._ssl = ssl.create_default_context(cafile=opts.tls_ca_file)
            self._ssl.sslsocket_class = _DeadlineSSLSocket
            if opts.tls_cert_file:
                self._ssl.load_cert_chain(opts.tls_cert_file, opts.tls_key_file)
        # Quoted: a contract's model id (the default name) may hold any character.
        name, version = quote(opts.model_name, safe=""), quote(opts.model_version, safe="")
        base = f"/v2/models/{name}" + (f"/versions/{version}" if version else "")
        self._paths = {"metadata": base, "ready": f"{base}/ready", "infer": f"{base}/infer"}

    def _connect(self, deadline: float) -> http.client.HTTPConnection:
        def create_connection(address: tuple[str, int], timeout: float, source_address: Any = None) -> socket.socket:
            plain = socket.create_connection(address, max(deadline - time.monotonic(), 1e-3), source_address)
            sock = _DeadlineSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
            sock.deadline = deadline
            return sock

        conn: http.client.HTTPConnection
        left = max(deadline - time.monotonic(), 1e-3)
        if self._ssl is not None:
            conn = http.client.HTTPSConnection(self.opts.host, self.opts.port, timeout=left, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(self.opts.host, self.opts.port, timeout=left)
        conn._create_connection = create_connection  # type: ignore[attr-defined]  # every I/O on the deadline
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if isinstance(conn.sock, _Deadline):  # the TLS socket wrapping it (same class family)
            conn.sock.deadline = deadline
        return conn

    def _read_body(self, resp: http.client.HTTPResponse) -> bytes:
        """The whole body, never more than ``max_response_bytes`` (checked before reading)."""
        cap = self.opts.max_response_bytes
        length = resp.getheader("Content-Length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                raise TransportError("server_error", f"Content-Length {length[:32]!r} is not a number") from None
            if n > cap:
                raise TransportError("server_error", f"response of {n} bytes, over max_response_mb ({cap} bytes)")
            return resp.read()
        parts, size = [], 0
        while chunk := resp.read(65536):
            size += len(chunk)
            if size > cap:
                raise TransportError("server_error", f"response over max_response_mb ({cap} bytes)")
            parts.append(chunk)
        return b"".join(parts)

    def _request(
        self, method: str, what: str, timeout_s: float, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, http.client.HTTPResponse, bytes]:
        headers = dict(headers or {})
        auth = self.token.header()
        if auth:
            headers["Authorization"] = auth
        deadline = time.monotonic() + timeout_s  # the whole request, connection and retry included
        # A keep-alive connection the server closed meanwhile (restart, idle timeout) fails
        # on first use although the server is fine: one retry on a fresh connection.
        for attempt in (0, 1):
            # http.client drops the socket after a "Connection: close" answer: reconnect.
            reused = self._conn is not None and self._conn.sock is not None
            try:
                if not reused:
                    self.close()
                    self._conn = self._connect(deadline)
                else:
                    assert self._conn is not None  # reused: a connection with a live socket
                    sock = self._conn.sock
                    assert isinstance(sock, _Deadline)  # made by _connect
                    sock.deadline = deadline
                self._conn.request(method, self._paths[what], body=body, headers=headers)
                resp = self._conn.getresponse()
                data = self._read_body(resp)
                return resp.status, resp, data
            except TransportError:
                self.close()  # the rest of an over-long body is never read: a fresh connection next time
                raise
            except TimeoutError:
                self.close()
                raise TransportError(
                    "timeout", f"no complete answer from {self.opts.endpoint} within {timeout_s * 1e3:.1f} ms"
                ) from None
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                self.close()
                if reused and attempt == 0 and isinstance(exc, (ConnectionError, http.client.RemoteDisconnected)):
                    continue
                raise TransportError("unavailable", f"{self.opts.endpoint}: {exc.__class__.__name__}: {exc}") from None
        raise AssertionError("unreachable")

    def _json(self, status: int, data: bytes) -> Any:
        try:
            doc = json.loads(data) if data else {}
        except (ValueError, RecursionError):
            doc = {"error": data[:200].decode(errors="replace")}
        if status != 200:
            why = doc.get("error", doc) if isinstance(doc, dict) else doc
            raise TransportError(_http_kind(status), f"HTTP {status}: {str(why)[:200]}")
        return doc

    def metadata(self, timeout_s: float) -> dict[str, Any]:
        """The model's v2 metadata as a dict (name, versions, platform, inputs, outputs)."""
        status, _, data = self._request("GET", "metadata", timeout_s)
        return parse_metadata(self._json(status, data))

    def ready(self, timeout_s: float) -> bool:
        """Whether the server says the model is ready (200 on the ready path)."""
        status, _, _ = self._request("GET", "ready", timeout_s)
        if status in (401, 403):
            raise TransportError("auth", f"HTTP {status} on the readiness check")
        return status == 200

    def infer(
        self, inputs: Mapping[str, np.ndarray], output_names: list[str], timeout_s: float
    ) -> tuple[dict[str, np.ndarray], int | None]:
        """Outputs by name and the server's own time in ns (None when it does not say)."""
        arrays = [np.ascontiguousarray(a) for a in inputs.values()]
        header = {
            "inputs": [
                {
                    "name": n,
                    "shape": list(a.shape),
                    "datatype": v2_datatype(a.dtype),
                    "parameters": {"binary_data_size": a.nbytes},
                }
                for n, a in zip(inputs, arrays, strict=True)
            ],
            "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in output_names],
        }
        head = json.dumps(header, separators=(",", ":")).encode()
        body = b"".join([head, *(a.tobytes() for a in arrays)])
        status, resp, data = self._request(
            "POST",
            "infer",
            timeout_s,
            body,
            {
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(len(head)),
            },
        )
        if status != 200:
            self._json(status, data)
        size = resp.getheader("Inference-Header-Content-Length")
        try:
            n = int(size) if size is not None else len(data)
            doc = json.loads(data[:n])
            listed = doc.get("outputs", [])
            if not isinstance(listed, list) or not all(isinstance(o, dict) for o in listed):
                raise ValueError("outputs is not a list of maps")
            params = doc.get("parameters") or {}
            server_ns = params.get(SERVER_TIME_PARAMETER) if isinstance(params, dict) else None
        except (ValueError, AttributeError, RecursionError) as exc:
            raise TransportError("bad_response", f"response header is not v2 JSON: {exc}") from None
        outputs, offset = {}, n
        for out in listed:
            outputs[str(out.get("name"))], offset = _decode_http_output(out, data, offset)
        return outputs, int(server_ns) if isinstance(server_ns, (int, float)) and server_ns == server_ns else None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _decode_http_output(out: Mapping[str, Any], data: bytes, offset: int) -> tuple[np.ndarray, int]:
    """One output tensor from the binary section (or, from a server that ignored the
    binary request, its JSON ``data``)."""
    name, datatype, shape = out.get("name"), out.get("datatype"), out.get("shape", [])
    dtype = NUMPY_DTYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise TransportError("bad_response", f"output {name!r} has datatype {datatype!r}, which vlad cannot read")
    params = out.get("parameters") or {}
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    try:
        if size is None:
            return np.asarray(out["data"], dtype=dtype).reshape(shape), offset
        arr = np.frombuffer(data, dtype=dtype, count=int(size) // dtype.itemsize, offset=offset).reshape(shape)
    except (KeyError, ValueError, TypeError) as exc:
        raise TransportError("bad_response", f"output {name!r} ({datatype} {shape}) cannot be decoded: {exc}") from None
    return arr, offset + int(size)


def make_transport(opts: RemoteOptions, token: TokenSource) -> GrpcTransport | HttpTransport:
    """The transport for ``opts.protocol``."""
    return GrpcTransport(opts, token) if opts.protocol == "grpc" else HttpTransport(opts, token)
