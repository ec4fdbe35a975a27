"""A small KServe v2 server for a release's ONNX model (tests, the demo, benchmarks).

    python -m vlad_kserve.server --release manifests/demo --grpc-port 8001 --http-port 8000
    python -m vlad_kserve.server --release registry.example/fleet/reacher@sha256:... --keys /etc/vlad/keys.d

``--release`` is a release folder, or a vlad release in an OCI registry pinned by digest
(``vladctl push`` prints it): the server pulls it into ``--model-dir`` (KServe's
``/mnt/models`` by default), verified against ``--keys`` as a robot verifies it (signature
first, every file against its signed digest), then serves it (docs/fleet.md).

It serves the release's ONNX artifact with ONNX Runtime through ``kserve.ModelServer``
(gRPC and HTTP, v2 protocol), bound to ``--host`` (default 127.0.0.1: kserve itself binds
every interface). The model is named after the contract's model id unless
``--model-name`` says otherwise; its metadata is the ONNX model's own signature (``-1`` for
symbolic dimensions), so the client's contract check compares against what really runs.
Each response carries ``vlad_server_ns``: the time from the decoded request to the
encoded outputs inside the model handler, which the client subtracts from its round trip.

Fault injection, for tests only (``--fault-file``): before each inference the server
reads that JSON file (when it changed) and applies it::

    {"delay_ms": 50}              answer late (asyncio sleep: the server stays responsive)
    {"fail": "unavailable"}       UNAVAILABLE / HTTP 503
    {"fail": "internal"}          INTERNAL / HTTP 500
    {"output": "shape"}           a wrong output shape   ("dtype": float64, "missing": none)

A production deployment uses Triton or KServe proper (docs/remote.md, docs/triton/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np


class FaultFile:
    """The injected fault, re-read only when the file changes."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self.fault: dict[str, Any] = {}

    def current(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self.fault = None, {}
            return self.fault
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self.fault = json.loads(Path(self.path).read_text() or "{}")
            except ValueError:
                self.fault = {}  # a half-written file: no fault this time
            self._stamp = stamp
        return self.fault


def release_folder(args: argparse.Namespace) -> Path:
    """``--release`` as a folder: itself, or a registry reference pulled and verified by
    ``vladctl pull`` (a plugin stays off vlad's release layers: it runs the operator
    command, as a KServe storage container would)."""
    if Path(args.release).exists() or "@sha256:" not in args.release:
        return Path(args.release)
    if not args.keys:
        raise SystemExit("vlad_kserve.server: a registry reference is verified before it is served: pass --keys")
    digest = args.release.rsplit("@sha256:", 1)[1]
    dest = Path(args.model_dir) / digest[:16]
    vladctl = [sys.executable, "-m", "vlad.cli"]
    if dest.is_dir():  # pulled by an earlier start of this server: verified again, not trusted
        cmd = [*vladctl, "verify", str(dest), "--keys", args.keys]
    else:
        cmd = [*vladctl, "pull", args.release, "--out", str(dest), "--keys", args.keys, "--root", args.model_dir]
        cmd += ["--cache", str(Path(args.model_dir) / ".blobs")]
        cmd += ["--plain-http"] if args.plain_http else []
        cmd += ["--ca-file", args.ca_file] if args.ca_file else []
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"vlad_kserve.server: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else cmd[3]}")
    print(
        f"vlad_kserve.server: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else 'verified'}", flush=True
    )
    return dest


def release_model(release: Path, artifact: str | None) -> tuple[str, Path]:
    """The contract's model id and the ONNX artifact of a release folder (the manifest's
    artifact when it names an .onnx file, else the only .onnx file)."""
    from vlad.contract import load_contract

    contract = load_contract(release / "contract.toml")
    if artifact is None:
        manifest = release / "manifest.toml"
        named = tomllib.loads(manifest.read_text()).get("backend", {}).get("artifact") if manifest.is_file() else None
        if named and named.endswith(".onnx"):
            artifact = named
        else:
            found = sorted(release.glob("*.onnx"))
            if len(found) != 1:
                raise SystemExit(
                    f"vlad_kserve.server: {release} has {len(found)} .onnx files; name one with --artifact"
                )
            artifact = found[0].name
    path = release / artifact
    if not path.is_file():
        raise SystemExit(f"vlad_kserve.server: {path} does not exist")
    return contract.model.id, path


def build_model(name: str, onnx_path: Path, threads: int, faults: FaultFile, token: str | None = None):
    """A ``kserve.Model`` running ``onnx_path`` on ONNX Runtime's CPU provider; with
    ``token``, inference requests need ``authorization: Bearer <token>``."""
    import onnxruntime as ort
    from grpc_interceptor.exceptions import Unauthenticated
    from kserve import InferOutput, InferRequest, InferResponse, Model
    from kserve.errors import ServerNotReady

    from vlad_kserve.transport import NUMPY_DTYPES, SERVER_TIME_PARAMETER

    ort_types = {
        "tensor(float)": "FP32",
        "tensor(double)": "FP64",
        "tensor(float16)": "FP16",
        "tensor(int64)": "INT64",
        "tensor(int32)": "INT32",
        "tensor(int8)": "INT8",
        "tensor(uint8)": "UINT8",
        "tensor(bool)": "BOOL",
    }

    def signature(args) -> list[dict[str, Any]]:
        return [
            {
                "name": a.name,
                "datatype": ort_types.get(a.type, a.type),
                "shape": [d if isinstance(d, int) else -1 for d in a.shape],
            }
            for a in args
        ]

    class OnnxModel(Model):
        def load(self) -> bool:
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.log_severity_level = 3
            self.sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
            self.inputs_md = signature(self.sess.get_inputs())
            self.outputs_md = signature(self.sess.get_outputs())
            self.output_names = [o["name"] for o in self.outputs_md]
            self.ready = True
            return True

        def get_input_types(self) -> list[dict[str, Any]]:
            return self.inputs_md

        def get_output_types(self) -> list[dict[str, Any]]:
            return self.outputs_md

        async def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> InferResponse:
            t0 = time.perf_counter_ns()
            if token is not None and (headers or {}).get("authorization") != f"Bearer {token}":
                raise Unauthenticated("missing or wrong bearer token")
            fault = faults.current()
            if fault.get("delay_ms"):
                await asyncio.sleep(float(fault["delay_ms"]) / 1e3)
            if fault.get("fail") == "unavailable":
                raise ServerNotReady("injected fault: unavailable")
            if fault.get("fail") == "internal":
                raise RuntimeError("injected fault: internal error")
            feeds = {x.name: x.as_numpy() for x in payload.inputs}
            results = dict(zip(self.output_names, self.sess.run(self.output_names, feeds), strict=True))
            bad = fault.get("output")
            if bad == "shape":
                results = {k: v[..., :1] for k, v in results.items()}
            elif bad == "dtype":
                results = {k: v.astype(np.float64) for k, v in results.items()}
            elif bad == "missing":
                results = {}
            outputs = []
            for out_name, value in results.items():
                dt = next((k for k, v in NUMPY_DTYPES.items() if v == value.dtype), "FP32")
                o = InferOutput(name=out_name, shape=list(value.shape), datatype=dt)
                o.set_data_from_numpy(np.ascontiguousarray(value), binary_data=True)
                outputs.append(o)
            return InferResponse(
                response_id=payload.id or "",
                model_name=self.name,
                infer_outputs=outputs,
                use_binary_outputs=True,
                parameters={SERVER_TIME_PARAMETER: time.perf_counter_ns() - t0},
            )

    model = OnnxModel(name)
    model.load()
    return model


def build_server(host: str, http_port: int, grpc_port: int, tls: dict[str, str | None]):
    """A ``kserve.ModelServer`` whose gRPC and HTTP listeners bind ``host`` (optionally TLS,
    with client certificates required when ``tls["client_ca"]`` is set)."""
    import ssl

    import grpc
    from grpc import aio
    from kserve import ModelServer
    from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
    from kserve.model_server import args as kserve_args
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
    from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
    from kserve.protocol.grpc.servicer import InferenceServicer
    from kserve.protocol.rest.server import RESTServer

    class BoundGRPCServer:
        """kserve's gRPC server (its servicer and error mapping) on one host, TLS optional."""

        _server: Any  # a grpc.aio.Server once started

        def __init__(self, dataplane, repository) -> None:
            self.dataplane, self.repository, self._server = dataplane, repository, None

        async def start(self) -> None:
            self._server = aio.server(
                interceptors=(ExceptionToStatusInterceptor(),),
                options=[("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)],
            )
            grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
                InferenceServicer(self.dataplane, self.repository), self._server
            )
            address = f"{host}:{grpc_port}"
            cert, key, client_ca = tls.get("cert"), tls.get("key"), tls.get("client_ca")
            if cert:
                assert key is not None  # main(): --tls-cert and --tls-key go together
                creds = grpc.ssl_server_credentials(
                    [(Path(key).read_bytes(), Path(cert).read_bytes())],
                    root_certificates=Path(client_ca).read_bytes() if client_ca else None,
                    require_client_auth=bool(client_ca),
                )
                self._server.add_secure_port(address, creds)
            else:
                self._server.add_insecure_port(address)
            await self._server.start()
            await self._server.wait_for_termination()

        async def stop(self, sig: int | None = None) -> None:
            if self._server:
                await self._server.stop(grace=0.5)

    class BoundModelServer(ModelServer):
        def start(self, models: list) -> None:
            self._register_and_check_atleast_one_model_is_ready(models)
            self._rest_server = RESTServer(
                FASTAPI_APP_IMPORT_STRING,
                self.dataplane,
                self.model_repository_extension,
                self.http_port,
                workers=1,
                grace_period=1,
                event_loop=self.event_loop,
                timeout_keep_alive=self.timeout_keep_alive,
                ssl_certfile=tls.get("cert"),
                ssl_keyfile=tls.get("key"),
            )
            self._rest_server.config.host = host  # uvicorn reads it when it binds
            if tls.get("client_ca"):
                self._rest_server.config.ssl_ca_certs = tls["client_ca"]
                self._rest_server.config.ssl_cert_reqs = ssl.CERT_REQUIRED
            self._grpc_server = BoundGRPCServer(self.dataplane, self.model_repository_extension)
            self.servers = [self._rest_server.start(), self._grpc_server.start()]
            self.setup_event_loop()
            self.register_signal_handler()
            asyncio.run(self._serve())

    # A refused token is 401 on HTTP too (kserve would answer 500 for an unknown exception).
    from fastapi.responses import JSONResponse
    from grpc_interceptor.exceptions import Unauthenticated
    from kserve.model_server import app

    async def unauthenticated(_, exc):
        return JSONResponse(status_code=401, content={"error": str(exc.details)})

    app.add_exception_handler(Unauthenticated, unauthenticated)
    kserve_args.enable_grpc = False  # the gRPC listener is ours (bound to host)
    return BoundModelServer(
        http_port=http_port,
        grpc_port=grpc_port,
        workers=1,
        enable_grpc=False,
        enable_latency_logging=False,
        enable_docs_url=False,
        grace_period=1,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m vlad_kserve.server", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--release", required=True, help="release folder (contract.toml + the ONNX artifact) or host/repo@sha256:..."
    )
    ap.add_argument("--keys", help="trusted release keys, for a registry reference (required with one)")
    ap.add_argument("--model-dir", default="/mnt/models", help="where a registry reference is pulled to")
    ap.add_argument("--plain-http", action="store_true", help="the registry speaks HTTP, not HTTPS")
    ap.add_argument("--ca-file", help="CA certificate(s) for the registry's TLS")
    ap.add_argument("--artifact", help="ONNX file in the release (default: the manifest's, or the only .onnx)")
    ap.add_argument("--model-name", help="name served under (default: the contract's model id)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    ap.add_argument("--fault-file", help="JSON fault to inject (tests only; see the module docstring)")
    ap.add_argument("--tls-cert", help="server certificate (PEM): serve gRPC and HTTP over TLS")
    ap.add_argument("--tls-key", help="server private key (PEM)")
    ap.add_argument("--tls-client-ca", help="require client certificates signed by this CA (PEM)")
    ap.add_argument("--token-file", help="require this bearer token on inference requests")
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        ap.error("--tls-cert and --tls-key go together")
    # kserve parses sys.argv when it is imported: give it none of ours.
    sys.argv = sys.argv[:1]
    name, onnx_path = release_model(release_folder(args), args.artifact)
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    model = build_model(args.model_name or name, onnx_path, args.threads, FaultFile(args.fault_file), token)
    server = build_server(
        args.host,
        args.http_port,
        args.grpc_port,
        {"cert": args.tls_cert, "key": args.tls_key, "client_ca": args.tls_client_ca},
    )
    level = getattr(logging, args.log_level.upper(), logging.WARNING)
    for logger in ("kserve", "kserve.trace", "uvicorn", "uvicorn.access", "uvicorn.error"):
        logging.getLogger(logger).setLevel(level)
    print(
        f"vlad_kserve.server: serving {model.name} ({onnx_path}) on grpc{'s' if args.tls_cert else ''}://"
        f"{args.host}:{args.grpc_port} and http{'s' if args.tls_cert else ''}://{args.host}:{args.http_port}",
        flush=True,
    )
    server.start([model])
    return 0


if __name__ == "__main__":
    sys.exit(main())
