"""What every endpoint process shares: its spec, its limits, its link to the daemon, its reports.

An endpoint process (``python -m vlad.compat openpi|metrics``) is started by the daemon
(:mod:`vlad.daemon.endpoints`) and talks to it like any other client:

* **stdin**: first one JSON line, the :class:`Spec` (what to serve, the daemon's socket
  endpoints, its limits); then, for the openpi endpoint, one line per observation of its
  own the daemon's intake refused (``obs_seq t_sensor_ns reason``). End of file: the daemon
  is gone, the process ends.
* **stdout**: JSON lines: ``{"ready": ...}`` once it serves, or ``{"error": "one line"}``
  and exit 2 when it cannot; then ``{"report": {...}}`` every second (its counters, shown
  by ``vladctl status`` and the metrics). Written without blocking: a daemon that does
  not read loses reports, never stalls the endpoint. The lines are also its sign of life:
  a process that writes none for :data:`REPORT_TIMEOUT_S` is killed and started again.
* **its listening socket**: bound by the daemon, inherited as the file descriptors the
  spec names (``listen_fds``); the process accepts on it and never binds or removes its
  address, so the address stays the daemon's across the process's deaths and restarts.
* **the daemon's own sockets** (observations, actions, status), connected like a
  controller or ``vladctl`` connects.

Its limits are its own, applied before anything else runs: ``RLIMIT_NOFILE`` (file
descriptors: connections), ``RLIMIT_AS`` (address space), a lower CPU priority (nice),
single-threaded math libraries. Whatever a peer sends, the daemon's CPU share, GIL, memory
and file descriptors are not the endpoint's to spend.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import resource
import signal
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import zmq
import zmq.asyncio

from vlad import schema
from vlad.config import CHECKS, ConfigError

if TYPE_CHECKING:
    from vlad.snapshot import StatusSnapshot

log = logging.getLogger("vlad.endpoint")

ACCEPT_BACKLOG = 64  # the listen backlog: also how many connections asyncio accepts in one go
MAX_SPEC_BYTES = 1 << 20
MAX_LINE = 4096  # a report line: atomic on a pipe (PIPE_BUF)
REPORT_S = 1.0
REPORT_TIMEOUT_S = 5.0  # no report for this long: the daemon kills the process (stopped or hung)
# Environment of an endpoint process: one thread per math library, few malloc arenas (each
# arena reserves 64 MiB of address space per thread, which RLIMIT_AS counts).
CHILD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}


class EndpointStartError(Exception):
    """The endpoint cannot serve (a port in use, a bad certificate): one line for the operator."""


@dataclass(frozen=True)
class Spec:
    """What the daemon tells an endpoint process (JSON on its stdin)."""

    kind: str  # "openpi" | "metrics"
    config: dict[str, Any]  # the endpoint's config section, as parsed (read with :func:`section`)
    sockets: dict[str, str]  # the daemon's endpoints: observations, actions, status
    limits: dict[str, int]  # nofile, address_space_bytes, nice
    contract: dict[str, Any] = field(default_factory=dict)  # what the openpi mapping needs
    curve: dict[str, str] = field(default_factory=dict)  # tcp:// endpoints: public, secret, server (Z85)
    logging: dict[str, str] = field(default_factory=dict)  # level, journald
    status_hz: float = 2.0
    listen_fds: list[int] = field(default_factory=list)  # the daemon's listening sockets, inherited
    token: str = ""  # openpi: what clients must send (the daemon reads compat.openpi.token_file)

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_json(cls, raw: bytes) -> Spec:
        return cls(**json.loads(raw))


S = TypeVar("S")


def section(spec: Spec, cls: type[S], name: str) -> S:
    """The endpoint's config section (``spec.config``) as ``cls``, the daemon's config type
    (:mod:`vlad.config`): parsed with the same schema and checks, so the process reads
    attributes, never keys; :class:`EndpointStartError` lists what does not parse."""
    try:
        return schema.parse(cls, spec.config, name, ConfigError, CHECKS)
    except ConfigError as exc:
        raise EndpointStartError(f"{name}: {'; '.join(exc.problems)}") from None


# -- limits ------------------------------------------------------------------------------------


def apply_limits(limits: dict[str, int]) -> None:
    """The process's own limits (soft and hard: it cannot raise them again)."""
    nofile = limits.get("nofile")
    if nofile:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    space = limits.get("address_space_bytes")
    if space:
        resource.setrlimit(resource.RLIMIT_AS, (space, space))
    nice = limits.get("nice", 0)
    if nice:
        os.nice(nice)
    try:  # end with the daemon even if this process's event loop were stuck
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Admission:
    """Open connections, in all and per peer: one over either cap is closed at accept."""

    def __init__(self, total: int, per_peer: int) -> None:
        self.total = total
        self.per_peer = per_peer
        self.open = 0
        self.by_peer: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()  # "total", "per_peer"

    def admit(self, peer: str) -> bool:
        if self.open >= self.total:
            self.refused["total"] += 1
            return False
        if self.by_peer[peer] >= self.per_peer:
            self.refused["per_peer"] += 1
            return False
        self.open += 1
        self.by_peer[peer] += 1
        return True

    def release(self, peer: str) -> None:
        self.open -= 1
        self.by_peer[peer] -= 1
        if self.by_peer[peer] <= 0:
            del self.by_peer[peer]


def listening_sockets(spec: Spec, name: str) -> list[socket.socket]:
    """The listening sockets the daemon handed this process (``spec.listen_fds``)."""
    if not spec.listen_fds:
        raise EndpointStartError(f"{name}: no listening socket from the daemon (this process is started by vlad serve)")
    socks = []
    for fd in spec.listen_fds:
        try:
            socks.append(socket.socket(fileno=fd))
        except OSError as exc:
            raise EndpointStartError(f"{name}: the daemon's listening socket (fd {fd}): {exc.strerror}") from None
    return socks


def peer_of(transport: asyncio.BaseTransport) -> str:
    """The peer's address without its port ("unix" for a unix socket): the per-peer key."""
    name = transport.get_extra_info("peername")
    if isinstance(name, tuple) and name:
        return str(name[0])
    return "unix"


# -- the daemon's sockets ----------------------------------------------------------------------


def client_socket(ctx: zmq.asyncio.Context, kind: int, endpoint: str, curve: dict[str, str]) -> zmq.asyncio.Socket:
    """A socket for one of the daemon's endpoints, set up as a controller's (not connected yet)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if endpoint.startswith("tcp://"):
        sock.curve_publickey = curve["public"].encode()
        sock.curve_secretkey = curve["secret"].encode()
        sock.curve_serverkey = curve["server"].encode()
    return sock


def connect(ctx: zmq.asyncio.Context, kind: int, endpoint: str, curve: dict[str, str]) -> zmq.asyncio.Socket:
    """A socket connected to one of the daemon's endpoints, as a controller connects."""
    sock = client_socket(ctx, kind, endpoint, curve)
    sock.connect(endpoint)
    return sock


# -- the process -------------------------------------------------------------------------------


async def status_updates(sock: zmq.asyncio.Socket, counts: MutableMapping[str, int]) -> AsyncIterator[StatusSnapshot]:
    """Every status the daemon publishes on ``sock`` (a SUB on its status socket), typed.
    A message that is not a status is skipped; a status this version cannot read (another
    vlad version, another publisher) is counted in ``counts["unreadable"]`` (the first one
    logged with its problems) and skipped."""
    from vlad import protocol
    from vlad.snapshot import StatusUnreadable, parse_status

    while True:
        frames = await sock.recv_multipart()
        try:
            data = protocol.decode(frames, expect=(protocol.TOPIC_STATUS,)).header["status"]
        except (protocol.ProtocolError, KeyError):
            continue
        try:
            st = parse_status(data)
        except StatusUnreadable as exc:
            if not counts.get("unreadable"):
                log.warning("%s", exc)
            counts["unreadable"] = counts.get("unreadable", 0) + 1
            continue
        yield st


def _emit(doc: dict[str, Any]) -> None:
    """One JSON line on stdout, never blocking: dropped when the daemon does not read."""
    line = json.dumps(doc, separators=(",", ":"), default=str).encode() + b"\n"
    if len(line) > MAX_LINE:
        log.warning("report of %d bytes not sent (at most %d)", len(line), MAX_LINE)
        line = b'{"oversized":%d}\n' % len(line)  # still a sign of life for the daemon
    try:
        os.write(1, line)
    except BlockingIOError:
        pass


def read_spec() -> tuple[Spec, bytes]:
    """The spec line from stdin, and whatever followed it in the same reads."""
    buf = b""
    while b"\n" not in buf:
        chunk = os.read(0, 65536)
        if not chunk:
            raise SystemExit("vlad endpoint: no spec on stdin (this process is started by vlad serve)")
        buf += chunk
        if len(buf) > MAX_SPEC_BYTES:
            raise SystemExit("vlad endpoint: spec too large")
    line, _, rest = buf.partition(b"\n")
    return Spec.from_json(line), rest


class Endpoint:
    """The interface an endpoint implements for :func:`serve`."""

    async def start(self) -> str:
        """Listen and connect; what it listens on. :class:`EndpointStartError` when it cannot."""
        raise NotImplementedError

    def report(self) -> dict[str, Any]:
        """Counters for ``vladctl status`` and the metrics."""
        return {}

    async def close(self) -> None:
        """Stop listening and close connections."""


async def serve(endpoint: Endpoint) -> int:
    """Run ``endpoint`` until stdin ends or SIGTERM; the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.set_exception_handler(_loop_exception)
    try:
        where = await endpoint.start()
    except EndpointStartError as exc:
        _emit({"error": str(exc)})
        return 2
    os.set_blocking(1, False)
    _emit({"ready": where, "pid": os.getpid()})
    reader = asyncio.StreamReader(limit=MAX_LINE)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", buffering=0))

    async def daemon_gone() -> None:
        """After the spec the daemon writes nothing; its end of the pipe closing means it is gone."""
        while True:
            try:
                chunk = await reader.read(65536)
            except (ConnectionError, OSError):
                chunk = b""
            if not chunk:
                stop.set()
                return

    async def reports() -> None:
        while True:
            await asyncio.sleep(REPORT_S)
            try:
                _emit({"report": endpoint.report()})
            except Exception:  # a bug in a report must not end the endpoint
                log.exception("endpoint report failed")

    tasks = [asyncio.create_task(daemon_gone(), name="daemon"), asyncio.create_task(reports(), name="reports")]
    await stop.wait()
    for t in tasks:
        t.cancel()
    try:
        await asyncio.wait_for(endpoint.close(), 2.0)
    except (TimeoutError, Exception):
        log.exception("endpoint did not close cleanly")
    return 0


_resource_errors: Counter[str] = Counter()


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's errors: running out of a resource (file descriptors at accept, when a flood
    outruns the caps) is a sampled one-line warning, anything else asyncio's own report."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.errno is not None:
        _resource_errors[exc.strerror or str(exc.errno)] += 1
        n = _resource_errors[exc.strerror or str(exc.errno)]
        if n <= 3 or n % 1000 == 0:
            log.warning("%s (%d so far): %s", context.get("message", "I/O error"), n, exc.strerror)
        return
    loop.default_exception_handler(context)


def main(kind: str, make: Callable[[Spec], Endpoint]) -> int:
    """The process: spec, limits, logging, then :func:`serve`."""
    from vlad.logs import setup_logging

    spec, _ = read_spec()
    if spec.kind != kind:
        raise SystemExit(f"vlad endpoint: spec for {spec.kind!r}, this is {kind!r}")
    try:
        apply_limits(spec.limits)
    except (OSError, ValueError) as exc:  # e.g. a system call filter that refuses setrlimit
        _emit({"error": f"{kind} endpoint: cannot apply its resource limits ({exc}); it does not run without them"})
        return 2
    from vlad.logs import context

    setup_logging(spec.logging.get("level", "info"), spec.logging.get("journald", "auto"))
    context.state = f"endpoint:{kind}"  # its lines read vlad[endpoint:openpi] ...
    context.release = spec.contract.get("release", "-")
    started = time.monotonic()
    try:
        endpoint = make(spec)
    except EndpointStartError as exc:
        _emit({"error": str(exc)})
        return 2
    code = asyncio.run(serve(endpoint))
    log.debug("%s endpoint ran %.1f s", kind, time.monotonic() - started)
    return code
