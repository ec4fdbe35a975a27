"""The ``kserve`` backend's options, parsed once into a frozen :class:`RemoteOptions`.

They come from the release manifest's ``[backend.options]`` (or ``release.options`` in the
config for an unsigned development release). Unknown keys are refused: a misspelt
``timout_ms`` must not silently leave the default in force.

Secrets never sit in the options: a bearer token is read from ``token_file``. A signed
manifest is copied to every robot, kept in the release store and shown by ``vladctl``; a
token inline would leak with it and could not be rotated without re-signing the release.
A file (mode 0600, owned by the vlad user) is per robot and is re-read when it changes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vlad.contract import Contract
from vlad.errors import BackendError

KNOWN_OPTIONS = frozenset(
    {
        "endpoint",
        "protocol",
        "model_name",
        "model_version",
        "tls_ca_file",
        "tls_cert_file",
        "tls_key_file",
        "token_file",
        "timeout_ms",
        "min_timeout_ms",
        "max_timeout_ms",
        "connect_timeout_ms",
        "reconnect_backoff_ms",
        "probe_interval_ms",
        "recover_after",
        "max_response_mb",
        "stats_window",
        "precision",
    }
)


def _fail(msg: str) -> BackendError:
    return BackendError(f"kserve: {msg}")


@dataclass(frozen=True)
class RemoteOptions:
    """Where the model is served and how long vlad waits for it."""

    endpoint: str  # as given, e.g. grpc://gpu-server:8001
    protocol: str  # "grpc" | "http"
    host: str
    port: int
    tls: bool
    model_name: str
    model_version: str = ""  # "" : the server's choice (KServe has no versions; Triton: latest)
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    token_file: str | None = None
    #: Request timeout when the caller gives no deadline (warm-up excepted).
    timeout_ms: float = 20.0
    #: Less time than this left before the deadline: refused at once, not sent.
    min_timeout_ms: float = 1.0
    #: Upper bound of any request's timeout, whatever the deadline says.
    max_timeout_ms: float = 1000.0
    #: Metadata, readiness and warm-up requests at load (connection set-up included).
    connect_timeout_ms: float = 5000.0
    #: gRPC reconnect backoff cap: a restarted server is found again within about this.
    reconnect_backoff_ms: float = 250.0
    #: While the link is lost, check it this often (0: never; the core then probes itself).
    probe_interval_ms: float = 50.0
    #: Consecutive probes answered within the deadline before a lost link is healthy again
    #: (doubled after each relapse within RELAPSE_S of a recovery, up to 32).
    recover_after: int = 3
    #: The largest response read (gRPC's receive limit; HTTP: checked before the body is read).
    max_response_mb: float = 16.0
    #: Requests in the rolling latency percentiles and error rate.
    stats_window: int = 200
    #: The precision the server computes in, as declared by whoever deployed it.
    precision: str = "fp32"

    @property
    def max_response_bytes(self) -> int:
        return int(self.max_response_mb * 2**20)

    @property
    def url(self) -> str:
        """The endpoint in the form the clients take (host:port)."""
        return f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


def _number(options: Mapping[str, Any], key: str, default: float, minimum: float = 0.0) -> float:
    value = options.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < minimum:
        raise _fail(f"option {key} must be a number >= {minimum:g}, got {value!r}")
    return float(value)


def _file(options: Mapping[str, Any], key: str) -> str | None:
    value = options.get(key)
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise _fail(f"option {key} must be a file path, got {value!r}")
    if not Path(value).is_file():
        raise _fail(f"option {key}: {value} does not exist or is not a file")
    return value


def parse_options(options: Mapping[str, Any], contract: Contract) -> RemoteOptions:
    """Validate ``options`` into :class:`RemoteOptions`; the model name defaults to the
    contract's model id, the request timeout to the contract's end-to-end deadline."""
    options = dict(options)
    if "token" in options:
        raise _fail(
            "a bearer token must not be inline in the options (it would be copied with the release); "
            "put it in a file readable only by vlad and set token_file"
        )
    unknown = sorted(set(options) - KNOWN_OPTIONS)
    if unknown:
        raise _fail(f"unknown option(s) {unknown}; known: {sorted(KNOWN_OPTIONS)}")
    endpoint = options.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise _fail(
            'option endpoint is required, e.g. endpoint = "grpc://gpu-server:8001" or "https://gpu-server:8000"'
        )
    parts = urlsplit(endpoint if "://" in endpoint else f"grpc://{endpoint}")
    scheme = parts.scheme
    schemes = {"grpc": ("grpc", False), "grpcs": ("grpc", True), "http": ("http", False), "https": ("http", True)}
    if scheme not in schemes:
        raise _fail(f"endpoint {endpoint!r}: scheme must be grpc, grpcs, http or https")
    protocol, tls = schemes[scheme]
    wanted = options.get("protocol", protocol)
    if wanted != protocol:
        raise _fail(f"option protocol = {wanted!r} but the endpoint {endpoint!r} is {protocol}")
    try:
        port = parts.port
    except ValueError:
        raise _fail(f"endpoint {endpoint!r}: the port is not a number") from None
    if not parts.hostname or port is None:
        raise _fail(f"endpoint {endpoint!r}: needs a host and a port, e.g. grpc://127.0.0.1:8001")
    if parts.path not in ("", "/"):
        raise _fail(f"endpoint {endpoint!r}: a path is not supported (the v2 paths are fixed)")
    ca, cert, key = (_file(options, k) for k in ("tls_ca_file", "tls_cert_file", "tls_key_file"))
    if (ca or cert or key) and not tls:
        raise _fail(f"TLS files are set but the endpoint {endpoint!r} is plaintext; use grpcs:// or https://")
    if bool(cert) != bool(key):
        raise _fail("a client certificate needs both tls_cert_file and tls_key_file")
    name = options.get("model_name", contract.model.id)
    version = options.get("model_version", "")
    if not isinstance(name, str) or not name or not isinstance(version, str):
        raise _fail(f"model_name must be a non-empty string and model_version a string, got {name!r} / {version!r}")
    deadline = float(contract.timing.e2e_deadline_ms)
    window = options.get("stats_window", 200)
    if not isinstance(window, int) or isinstance(window, bool) or window < 10:
        raise _fail(f"option stats_window must be an integer >= 10, got {window!r}")
    recover_after = options.get("recover_after", 3)
    if not isinstance(recover_after, int) or isinstance(recover_after, bool) or not 1 <= recover_after <= 100:
        raise _fail(f"option recover_after must be an integer 1..100, got {recover_after!r}")
    precision = options.get("precision", "fp32")
    if not isinstance(precision, str):
        raise _fail(f"option precision must be a string, got {precision!r}")
    opts = RemoteOptions(
        endpoint=endpoint,
        protocol=protocol,
        host=parts.hostname,
        port=port,
        tls=tls,
        model_name=name,
        model_version=version,
        tls_ca_file=ca,
        tls_cert_file=cert,
        tls_key_file=key,
        token_file=_file(options, "token_file"),
        timeout_ms=_number(options, "timeout_ms", deadline, 0.1),
        min_timeout_ms=_number(options, "min_timeout_ms", 1.0),
        max_timeout_ms=_number(options, "max_timeout_ms", 1000.0, 0.1),
        connect_timeout_ms=_number(options, "connect_timeout_ms", 5000.0, 1.0),
        reconnect_backoff_ms=_number(options, "reconnect_backoff_ms", 250.0, 10.0),
        probe_interval_ms=_number(options, "probe_interval_ms", 50.0),
        recover_after=recover_after,
        max_response_mb=_number(options, "max_response_mb", 16.0, 0.001),
        stats_window=window,
        precision=precision,
    )
    if opts.token_file and not opts.tls and not opts.loopback:
        raise _fail(
            f"token_file is set but {endpoint!r} is plaintext to another host: the token would cross the "
            "network in clear; use grpcs:// or https://"
        )
    if opts.min_timeout_ms > opts.max_timeout_ms:
        raise _fail(f"min_timeout_ms {opts.min_timeout_ms:g} is above max_timeout_ms {opts.max_timeout_ms:g}")
    return opts
