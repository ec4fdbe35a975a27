"""The ``kserve`` backend's options, parsed once into a frozen :class:`RemoteOptions`.

They come from the release manifest's ``[backend.options]`` (or ``release.options`` in the
config for an unsigned development release) and go through :func:`vlad.backend.parse_options`:
types, bounds and unknown keys are :mod:`vlad.schema`'s (a misspelt ``timout_ms`` must not
silently leave the default in force), :func:`check` adds the endpoint's and the TLS rules,
and every problem is reported at once, in one line. Two defaults come from the release's
contract, so :func:`parse_options` fills them in after parsing: the model name (the
contract's model id) and the request timeout (its end-to-end deadline).

Secrets never sit in the options: a bearer token is read from ``token_file``. A signed
manifest is copied to every robot, kept in the release store and shown by ``vladctl``; a
token inline would leak with it and could not be rotated without re-signing the release.
A file (mode 0600, owned by the vlad user) is per robot and is re-read when it changes.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from vlad import backend
from vlad.backend import Precision
from vlad.contract import Contract
from vlad.schema import bounded, join, on_partial, shown

RUNTIME = "kserve"
Protocol = Literal["grpc", "http"]
# scheme -> (protocol, TLS)
SCHEMES: dict[str, tuple[Protocol, bool]] = {
    "grpc": ("grpc", False),
    "grpcs": ("grpc", True),
    "http": ("http", False),
    "https": ("http", True),
}
_INTERNAL = {"internal": True}  # derived from endpoint, not read from the options
_FILE = {"allow_empty": True, "max_len": 4096}  # "": the same as not set (a site config clearing a file)
# Model names and versions go into the v2 URL paths as they are: RFC 3986 unreserved
# characters only, so none can add a path segment, a query or a header line.
_NAME_RE = re.compile(r"[A-Za-z0-9._~-]{1,256}")


@dataclass(frozen=True)
class RemoteOptions:
    """Where the model is served and how long vlad waits for it."""

    REFUSED_KEYS = {
        "token": "a bearer token must not be inline in the options (it would be copied with the release); "
        "put it in a file readable only by vlad and set token_file"
    }

    # As given, e.g. grpc://gpu-server:8001 (a bare host:port is gRPC). Required: check()
    # refuses the default with an example (a given "" is refused as empty).
    endpoint: str = field(default="", metadata={"max_len": 1024})
    protocol: Protocol | None = None  # must agree with the endpoint's scheme; None: the scheme's
    model_name: str = ""  # "": the contract's model id (filled in by parse_options)
    model_version: str = field(default="", metadata={"allow_empty": True, "max_len": 256})  # "": the server's choice
    tls_ca_file: str | None = field(default=None, metadata=_FILE)
    tls_cert_file: str | None = field(default=None, metadata=_FILE)
    tls_key_file: str | None = field(default=None, metadata=_FILE)
    token_file: str | None = field(default=None, metadata=_FILE)
    #: Request timeout when the caller gives no deadline (warm-up excepted); 0: the
    #: contract's end-to-end deadline (filled in by parse_options; a given 0 is refused).
    timeout_ms: float = field(default=0.0, metadata=bounded(0.1))
    #: Less time than this left before the deadline: refused at once, not sent.
    min_timeout_ms: float = field(default=1.0, metadata=bounded(0.0))
    #: Upper bound of any request's timeout, whatever the deadline says.
    max_timeout_ms: float = field(default=1000.0, metadata=bounded(0.1))
    #: Metadata, readiness and warm-up requests at load (connection set-up included).
    connect_timeout_ms: float = field(default=5000.0, metadata=bounded(1.0))
    #: gRPC reconnect backoff cap: a restarted server is found again within about this.
    reconnect_backoff_ms: float = field(default=250.0, metadata=bounded(10.0))
    #: While the link is lost, check it this often (0: never; the core then probes itself).
    probe_interval_ms: float = field(default=50.0, metadata=bounded(0.0))
    #: Consecutive probes answered within the deadline before a lost link is healthy again
    #: (doubled after each relapse within RELAPSE_S of a recovery, up to 32).
    recover_after: int = field(default=3, metadata=bounded(1, 100))
    #: The largest response read (gRPC's receive limit; HTTP: checked before the body is read).
    max_response_mb: float = field(default=16.0, metadata=bounded(0.001))
    #: Requests in the rolling latency percentiles and error rate.
    stats_window: int = field(default=200, metadata=bounded(10))
    #: The precision the server computes in, as declared by whoever deployed it.
    precision: Precision = "fp32"
    # From the endpoint (parse_options).
    host: str = field(default="", metadata=_INTERNAL)
    port: int = field(default=0, metadata=_INTERNAL)
    tls: bool = field(default=False, metadata=_INTERNAL)

    @property
    def max_response_bytes(self) -> int:
        return int(self.max_response_mb * 2**20)

    @property
    def url(self) -> str:
        """The endpoint in the form the clients take (host:port)."""
        return f"{self.host}:{self.port}"


def split_endpoint(endpoint: str) -> tuple[Protocol, bool, str, int]:
    """(protocol, TLS, host, port) of an endpoint; ValueError with the reason."""
    if not endpoint.isprintable() or any(c.isspace() for c in endpoint):
        raise ValueError(f"{shown(endpoint)}: must not contain spaces or control characters")
    try:
        parts = urlsplit(endpoint if "://" in endpoint else f"grpc://{endpoint}")
    except ValueError as exc:  # an unbalanced IPv6 bracket
        raise ValueError(f"{shown(endpoint)}: not a URL ({exc})") from None
    if parts.scheme not in SCHEMES:
        raise ValueError(f"{shown(endpoint)}: scheme must be grpc, grpcs, http or https")
    protocol, tls = SCHEMES[parts.scheme]
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{shown(endpoint)}: the port is not a number (1..65535)") from None
    if not parts.hostname or port is None:
        raise ValueError(f"{shown(endpoint)}: needs a host and a port, e.g. grpc://127.0.0.1:8001")
    if parts.path not in ("", "/"):
        raise ValueError(f"{shown(endpoint)}: a path is not supported (the v2 paths are fixed)")
    return protocol, tls, parts.hostname, port


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@on_partial
def check(o: RemoteOptions, path: str, problems: list[str]) -> None:
    """The endpoint parses and agrees with ``protocol``; model names are URL-safe; TLS files
    exist and only with TLS; a client certificate comes with its key; a token never crosses
    the network in clear; the timeout bounds are in order. Also run when other keys did not
    parse (every problem at once): a key that did not parse is None here, its rules skipped."""
    endpoint: tuple[Protocol, bool, str, int] | None = None
    if o.endpoint is None:
        pass  # given, but not a string: already a problem
    elif not o.endpoint:
        problems.append(
            f'{join(path, "endpoint")}: required, e.g. endpoint = "grpc://gpu-server:8001" or "https://gpu-server:8000"'
        )
    else:
        try:
            endpoint = split_endpoint(o.endpoint)
        except ValueError as exc:
            problems.append(f"{join(path, 'endpoint')}: {exc}")
    for key in ("model_name", "model_version"):
        value = getattr(o, key)
        if value and not _NAME_RE.fullmatch(value) or value in (".", ".."):
            problems.append(
                f"{join(path, key)}: {shown(value)} is not a model name (letters, digits, '.', '_', '-', '~')"
            )
    for key in ("tls_ca_file", "tls_cert_file", "tls_key_file", "token_file"):
        value = getattr(o, key)
        if value and not Path(value).is_file():
            problems.append(f"{join(path, key)}: {shown(value)} does not exist or is not a file")
    if bool(o.tls_cert_file) != bool(o.tls_key_file):
        problems.append(f"{path}: a client certificate needs both tls_cert_file and tls_key_file")
    if o.min_timeout_ms is not None and o.max_timeout_ms is not None and o.min_timeout_ms > o.max_timeout_ms:
        problems.append(
            f"{join(path, 'min_timeout_ms')}: {o.min_timeout_ms:g} is above max_timeout_ms {o.max_timeout_ms:g}"
        )
    if endpoint is None:
        return  # the rules below depend on the endpoint
    protocol, tls, host, _ = endpoint
    if o.protocol is not None and o.protocol != protocol:
        problems.append(f"{join(path, 'protocol')}: '{o.protocol}' but the endpoint {shown(o.endpoint)} is {protocol}")
    if (o.tls_ca_file or o.tls_cert_file or o.tls_key_file) and not tls:
        problems.append(
            f"{path}: TLS files are set but the endpoint {shown(o.endpoint)} is plaintext; use grpcs:// or https://"
        )
    if o.token_file and not tls and not _loopback(host):
        problems.append(
            f"{join(path, 'token_file')}: set but {shown(o.endpoint)} is plaintext to another host: the token would "
            "cross the network in clear; use grpcs:// or https://"
        )


def parse_options(options: Mapping[str, Any] | None, contract: Contract) -> RemoteOptions:
    """Validate ``options`` into :class:`RemoteOptions` (one :class:`~vlad.errors.BackendError`
    line listing every problem); the model name defaults to the contract's model id, the
    request timeout to the contract's end-to-end deadline."""
    opts = backend.parse_options(RUNTIME, RemoteOptions, options, check)
    protocol, tls, host, port = split_endpoint(opts.endpoint)
    return dataclasses.replace(
        opts,
        protocol=protocol,
        host=host,
        port=port,
        tls=tls,
        model_name=opts.model_name or contract.model.id,
        timeout_ms=opts.timeout_ms or float(contract.timing.e2e_deadline_ms),
        tls_ca_file=opts.tls_ca_file or None,
        tls_cert_file=opts.tls_cert_file or None,
        tls_key_file=opts.tls_key_file or None,
        token_file=opts.token_file or None,
    )
