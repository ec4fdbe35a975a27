"""``./scripts/demo --remote``: the demo policy served by a real KServe v2 server on 127.0.0.1.

:func:`start_remote_demo` starts :mod:`vlad_kserve.server` on the demo release's ONNX model
and returns the daemon config for an unsigned development copy of the release whose
backend is ``kserve`` (gRPC to that server), with the signed demo release on local ONNX
Runtime as its fallback and the hold posture last: the demo's own config with the release
and the fallback chain replaced, so the sockets are those of the config the demo was
given and the simulated robot connects exactly as in the local demo.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from vlad.config import ChainEntry, Config, FallbackConfig, ReleaseConfig, load_config
from vlad_kserve.testing import free_ports


def start_remote_demo(config: Path, workdir: Path, timeout_s: float = 90.0) -> tuple[Config, subprocess.Popen]:
    """Start the v2 server; returns (the remote demo's daemon config, the server process)."""
    cfg = load_config(config)
    demo = Path(cfg.release.path)
    release = workdir / "release"
    release.mkdir(parents=True, exist_ok=True)
    for name in ("contract.toml", "tokenizer.json", "policy.onnx"):
        shutil.copy(demo / name, release / name)
    grpc_port, http_port = free_ports(2)  # distinct: bound together while chosen
    log = open(workdir / "server.log", "wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vlad_kserve.server",
            "--release",
            str(release),
            "--artifact",
            "policy.onnx",
            "--grpc-port",
            str(grpc_port),
            "--http-port",
            str(http_port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{http_port}/v2/health/ready"
    deadline = time.monotonic() + timeout_s
    while True:
        if server.poll() is not None:
            raise SystemExit(
                f"demo: the v2 server exited with status {server.returncode}; see {workdir / 'server.log'}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            server.kill()
            raise SystemExit(
                f"demo: the v2 server was not ready within {timeout_s:.0f} s; see {workdir / 'server.log'}"
            )
        time.sleep(0.2)
    from vlad.contract import load_contract

    # timeout_ms: a late answer is still used up to the contract's max observation age (the
    # robot follows each chunk for several periods). Until the daemon passes every cycle's
    # deadline to the backend, this is also what keeps one slow request on this shared machine
    # from counting as a backend failure (docs/remote.md, "What the core does").
    timeout_ms = load_contract(release / "contract.toml").timing.max_observation_age_ms
    remote = replace(
        cfg,
        # an unsigned development copy: its backend differs from the signed manifest's
        release=ReleaseConfig(
            path=str(release),
            verify=False,
            backend="kserve",
            artifact="policy.onnx",
            options={"endpoint": f"grpc://127.0.0.1:{grpc_port}", "timeout_ms": timeout_ms},
        ),
        fallback=FallbackConfig(
            chain=(
                ChainEntry(
                    kind="release",
                    path=str(demo),
                    backend="onnxruntime",
                    artifact="policy.onnx",
                    options={"intra_op_threads": 1},
                ),
                ChainEntry(kind="hold"),
            )
        ),
    )
    print(
        f"demo: KServe v2 server (vlad_kserve.server, ONNX Runtime) on grpc://127.0.0.1:{grpc_port} "
        f"and http://127.0.0.1:{http_port}",
        flush=True,
    )
    return remote, server
