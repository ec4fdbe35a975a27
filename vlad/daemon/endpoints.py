"""The endpoint processes: the openpi websocket server and the Prometheus metrics, each its own child.

Endpoints that speak to untrusted or less-trusted peers never run inside the daemon. Each
family is a child process (``python -m vlad.compat openpi|metrics``, :mod:`vlad.compat`)
that the daemon starts before ``READY=1``, watches, restarts and stops at shutdown. It has
its own limits (file descriptors from its connection caps, address space, a lower CPU
priority) and its own GIL, and it reaches the daemon only through the daemon's sockets,
like a controller. Whatever a peer sends to it, the serving thread, the event loop and the
watchdog never wait for it, and the daemon's file descriptors and memory are not its to
spend.

**The listening socket is the daemon's.** :func:`listen` binds each endpoint's address at
start, before the release loads (a taken port refuses the start with one line), and the
daemon holds it until it exits; every child it starts inherits it (``pass_fds``, its
number in the spec) and accepts on it. So the address is never free while vlad runs: no
other local process can bind it when a child dies, and connections made while a child
restarts wait in the listen backlog for the next one instead of being refused.

**Alive means reporting.** Between the daemon and each child there are two private pipes:
its stdin (the spec; its closing tells the child the daemon is gone) and its stdout (ready,
then a report a second, shown under ``openpi`` / ``metrics`` in the status). A child that
exits, that does not reach its ready line (killed while starting, an error, nothing within
:data:`START_TIMEOUT_S`), or that sends no report for :data:`REPORT_TIMEOUT_S` (stopped or
hung: killed) is started again after a backoff (:data:`BACKOFF_S`), for as long as the
daemon runs. Each of these is counted in the status (``restarts``, ``failed_starts``,
``unresponsive``, ``last_failure``) and recorded as an ``endpoint`` event (the journal,
``vladctl events``). The daemon's ZAP handler admits the openpi child to the observation
socket by its pid (ipc) or by a key pair made for it (tcp), whatever
``sockets.observation_producers`` says.

File descriptors: :func:`check_fd_limit` refuses the start with one line when the
process's ``RLIMIT_NOFILE`` cannot hold what the configuration needs (:func:`fd_budget`);
``systemd/vlad.service`` sets ``LimitNOFILE=`` for the defaults with room to spare.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import resource
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
import zmq
from anyio.abc import TaskStatus

from vlad import schema
from vlad.compat.endpoint import ACCEPT_BACKLOG, CHILD_ENV, MAX_LINE, REPORT_TIMEOUT_S, Spec
from vlad.config import Config, Listen, parse_listen
from vlad.daemon.sockets import listen_sockets
from vlad.errors import StartupError
from vlad.snapshot import EndpointStatus, MetricsStatus, OpenpiStatus

if TYPE_CHECKING:
    from vlad.contract import Contract
    from vlad.daemon.sockets import Gatekeeper
    from vlad.health.state import StateMachine

log = logging.getLogger("vlad.endpoints")
E = TypeVar("E", bound=EndpointStatus)

# File descriptors the daemon itself may use: libraries and model files, ZeroMQ's own, and
# the connections of controllers and vladctl on its ipc/tcp sockets.
DAEMON_FDS = 1024
# An endpoint process's own descriptors beside its connections (Python, ZeroMQ, pipes), and
# room for one batch of accepts: asyncio accepts up to the listen backlog in one go, before
# the ones over the caps are closed.
CHILD_BASE_FDS = 64 + 2 * ACCEPT_BACKLOG
START_TIMEOUT_S = 20.0  # spawn to its ready line
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 10.0)  # before each start again; the last one repeats
STABLE_S = 30.0  # a child that ran this long restarts from the first backoff again


def fd_budget(cfg: Config) -> dict[str, int]:
    """File descriptors each process needs with this configuration."""
    out = {"daemon": DAEMON_FDS}
    if cfg.compat.openpi.enabled:
        out["openpi"] = CHILD_BASE_FDS + cfg.compat.openpi.max_connections
    if cfg.metrics.enabled:
        out["metrics"] = CHILD_BASE_FDS + cfg.metrics.max_connections
    return out


def check_fd_limit(cfg: Config) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` as far as the configuration needs (up to the hard
    limit); :class:`StartupError` when the hard limit is below it. Returns the soft limit."""
    need = max(fd_budget(cfg).values())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        raise StartupError(
            f"file descriptor limit {hard} is below the {need} this configuration needs "
            f"(the daemon, or compat.openpi / metrics max_connections + {CHILD_BASE_FDS}): "
            f"raise LimitNOFILE= in the unit or lower the caps"
        )
    want = max(need, min(hard, 8192) if hard != resource.RLIM_INFINITY else 8192)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    return soft


@dataclass
class Listener:
    """An endpoint's listening sockets, bound by the daemon and held until it exits (module doc)."""

    address: Listen
    socks: list[socket.socket]

    @property
    def fds(self) -> list[int]:
        return [s.fileno() for s in self.socks]

    def close(self) -> None:
        for s in self.socks:
            s.close()
        if self.address.unix:
            Path(self.address.path).unlink(missing_ok=True)


def listen(cfg: Config) -> dict[str, Listener]:
    """The listening sockets of the enabled endpoints, bound now; :class:`StartupError` with
    one line when an address is taken or cannot be bound (none is left open then)."""
    wanted = []
    if cfg.compat.openpi.enabled:
        wanted.append(("openpi", "compat.openpi.listen", cfg.compat.openpi.listen))
    if cfg.metrics.enabled:
        wanted.append(("metrics", "metrics.listen", cfg.metrics.listen))
    out: dict[str, Listener] = {}
    try:
        for kind, key, text in wanted:
            address = parse_listen(text)  # checked when the config was parsed
            out[kind] = Listener(address, listen_sockets(address, key, ACCEPT_BACKLOG))
    except BaseException:
        for lst in out.values():
            lst.close()
        raise
    return out


def _exit_text(code: int | None) -> str:
    """How a process ended, for a status line: ``exited with status 1``, ``killed by SIGKILL``."""
    if code is None:
        return "ended"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def _address_space(max_message_mb: float, clients: int) -> int:
    """RLIMIT_AS of an endpoint process: Python with numpy and ZeroMQ (~160 MiB of address
    space here), plus a few messages of the largest size per client (buffered, decoded)."""
    return int((384 + 4 * max_message_mb * clients) * 2**20)


class EndpointProcess:
    """One endpoint family's child: started, watched, restarted, stopped (module doc)."""

    def __init__(self, kind: str, spec: Spec, gatekeeper: Gatekeeper, events: StateMachine) -> None:
        self.kind = kind
        self.spec = spec
        self.gatekeeper = gatekeeper
        self.events = events
        self.proc: asyncio.subprocess.Process | None = None
        self.report: dict[str, Any] = self._no_report()
        self.ready = False  # its ready line came and it has not ended since
        self.restarts = 0  # started again after it ended, failed to start or stopped reporting
        self.failed_starts = 0  # starts again that did not reach the ready line
        self.unresponsive = 0  # killed for sending no report within REPORT_TIMEOUT_S
        self.last_failure = ""  # why it last ended or failed to start, one line
        self._unparsed = False  # its last report did not parse (logged once)
        self.started_at = 0.0
        self._stdin: int | None = None  # our end of its stdin (non-blocking)
        self._lock = threading.Lock()  # the serving thread writes, the event loop closes
        self._stopping = False

    def _no_report(self) -> dict[str, Any]:
        """Until a process's first report, the keys readers expect (vladctl status --watch)."""
        report: dict[str, Any] = {"listen": self.spec.config.get("listen", ""), "refused_connections": {}}
        if self.kind == "openpi":
            report.update(clients=0, requests=0, replies=0, errors={})
        return report

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def start(self) -> None:
        """Spawn it and wait for its ready line; :class:`StartupError` with its one line
        (the process ended) when it does not get there."""
        self.ready = False
        self.report = self._no_report()
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        env.update(CHILD_ENV)
        r, w = os.pipe()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "vlad.compat",
                self.kind,
                stdin=r,
                stdout=asyncio.subprocess.PIPE,
                env=env,
                limit=MAX_LINE * 4,
                pass_fds=self.spec.listen_fds,  # the daemon's listening socket: the child accepts on it
            )
        except OSError as exc:
            os.close(w)
            raise StartupError(f"{self._name}: cannot start the endpoint process: {exc.strerror or exc}") from None
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self.gatekeeper.endpoint_pids.add(self.proc.pid)
        try:
            os.write(w, self.spec.to_json())  # well under a pipe's buffer: never blocks
        except BrokenPipeError:
            pass  # it died already (killed while starting): its stdout ends, a failed start below
        os.set_blocking(w, False)
        with self._lock:
            self._stdin = w
        self.started_at = time.monotonic()
        try:
            with anyio.fail_after(START_TIMEOUT_S):
                first = await self._line()
        except TimeoutError:
            await self._end()
            raise StartupError(
                f"{self._name}: the endpoint process did not start within {START_TIMEOUT_S:g} s"
            ) from None
        if first is None or "ready" not in first:
            code = await self._end()
            why = first.get("error") if first else None
            raise StartupError(why or f"{self._name}: the endpoint process {_exit_text(code)} at start (see the log)")
        self.ready = True
        log.info("%s endpoint process %d serving on %s", self.kind, self.proc.pid, first["ready"])

    @property
    def _name(self) -> str:
        return "compat.openpi" if self.kind == "openpi" else "metrics"

    async def _line(self) -> dict[str, Any] | None:
        """The next JSON line from its stdout; None when it ended (or broke the protocol)."""
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            try:
                raw = await self.proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                log.error("%s endpoint process wrote an over-long line: stopped", self.kind)
                return None
            if not raw:
                return None
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            if isinstance(doc, dict):
                return doc

    async def run(self) -> None:
        """Watch it; whenever it ends, fails to start or stops reporting, start it again
        after a backoff, for as long as the daemon runs (returns only once stopped)."""
        attempt = 0
        while True:
            why = await self._watch()
            if self._stopping:
                return
            while True:
                if time.monotonic() - self.started_at >= STABLE_S:
                    attempt = 0
                delay = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                attempt += 1
                self.last_failure = why
                self._event(logging.ERROR, f"{why}; starting it again in {delay:g} s", attempt=attempt)
                await anyio.sleep(delay)
                try:
                    await self.start()
                except StartupError as exc:
                    self.failed_starts += 1
                    why = f"did not start: {exc}"
                    continue
                self.restarts += 1
                self._event(logging.WARNING, f"started again as pid {self.pid} (restart {self.restarts})")
                break

    async def _watch(self) -> str:
        """Read its reports until it ends, or writes nothing for :data:`REPORT_TIMEOUT_S` (a
        stopped or hung process: killed); how it ended, one line."""
        pid = self.pid
        while True:
            with anyio.move_on_after(REPORT_TIMEOUT_S) as waited:
                doc = await self._line()
            if waited.cancelled_caught:
                self.unresponsive += 1
                if self.proc is not None and self.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        self.proc.kill()  # SIGKILL ends a stopped process too
                await self._reap()
                return f"process {pid} sent no report for {REPORT_TIMEOUT_S:g} s (stopped or hung): killed"
            if doc is None:
                return f"process {pid} {_exit_text(await self._reap())}"
            if isinstance(doc.get("report"), dict):
                self.report = doc["report"]

    def _event(self, level: int, what: str, **details: Any) -> None:
        """An ``endpoint`` event: the event history (vladctl events) and the journal."""
        self.events.record_at(level, "endpoint", f"{self.kind} endpoint {what}", endpoint=self.kind, **details)

    async def _reap(self) -> int | None:
        """Wait for the process to end (killing it when its pipe broke first); its exit code."""
        if self.proc is None:
            return None
        try:
            with anyio.fail_after(2.0):
                code = await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            code = await self.proc.wait()
        self._forget()
        return code

    def _forget(self) -> None:
        self.ready = False
        if self.proc is not None:
            self.gatekeeper.endpoint_pids.discard(self.proc.pid)
        with self._lock:
            if self._stdin is not None:
                os.close(self._stdin)
                self._stdin = None

    async def stop(self) -> None:
        """End it for good (shutdown): :meth:`run` does not start it again."""
        self._stopping = True
        await self._end()

    async def _end(self) -> int | None:
        """End the process: stdin closed (it finishes), then SIGTERM, then SIGKILL; its exit code."""
        proc = self.proc
        with self._lock:
            if self._stdin is not None:
                os.close(self._stdin)
                self._stdin = None
        if proc is None or proc.returncode is not None:
            self._forget()
            return proc.returncode if proc is not None else None
        for sig, wait_s in ((None, 2.0), (signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            if sig is not None:
                try:
                    proc.send_signal(sig)
                except ProcessLookupError:
                    break
            with anyio.move_on_after(wait_s):
                await proc.wait()
            if proc.returncode is not None:
                break
        self._forget()
        return proc.returncode

    def status(self, cls: type[E]) -> E:
        """Its report with the daemon's part (``running`` once ready and until it ends),
        typed: the report is JSON from another process, parsed here with the status's own
        schema. A report that does not parse (logged once until one parses again: the
        status is built several times a second) leaves the daemon's part alone."""
        running = self.ready and self.proc is not None and self.proc.returncode is None
        own: dict[str, Any] = {
            "pid": self.pid if running else None,
            "running": running,
            "restarts": self.restarts,
            "failed_starts": self.failed_starts,
            "unresponsive": self.unresponsive,
            "last_failure": self.last_failure,
        }
        problems: list[str] = []
        parsed = schema.convert(cls, {**self.report, **own}, self.kind, problems)
        if not problems:
            self._unparsed = False
            return cast(E, parsed)
        if not self._unparsed:
            self._unparsed = True
            log.warning("the %s endpoint's report does not parse: %s", self.kind, "; ".join(problems[:3]))
        return cls(**own)


class Endpoints:
    """The daemon's endpoint processes (none, openpi, metrics)."""

    def __init__(self, processes: dict[str, EndpointProcess]) -> None:
        self.processes = processes

    async def start(self) -> None:
        for p in self.processes.values():
            await p.start()

    async def stop(self) -> None:
        for p in self.processes.values():
            with anyio.CancelScope(shield=True):
                await p.stop()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            for name, p in self.processes.items():
                tg.start_soon(p.run, name=f"endpoint-{name}")
            task_status.started()

    def openpi(self) -> OpenpiStatus | None:
        """The openpi endpoint's part of the status (None: not enabled)."""
        p = self.processes.get("openpi")
        return p.status(OpenpiStatus) if p is not None else None

    def metrics(self) -> MetricsStatus | None:
        """The metrics endpoint's part of the status (None: not enabled)."""
        p = self.processes.get("metrics")
        return p.status(MetricsStatus) if p is not None else None


def build(
    cfg: Config,
    contract: Contract,
    release: str,
    gatekeeper: Gatekeeper,
    server_curve: tuple[bytes, bytes] | None,
    listeners: dict[str, Listener],
    events: StateMachine,
) -> Endpoints:
    """The configured endpoint processes (not started) on the sockets :func:`listen` bound;
    every config problem as one line."""
    s = cfg.sockets
    sockets = {"observations": s.observations, "actions": s.actions, "status": s.status}
    curve: dict[str, str] = {}
    if server_curve is not None and any(e.startswith("tcp://") for e in sockets.values()):
        public, secret = zmq.curve_keypair()
        gatekeeper.curve_keys.add(public)
        gatekeeper.endpoint_keys.add(public)
        curve = {"public": public.decode(), "secret": secret.decode(), "server": server_curve[1].decode()}
    logging_cfg: dict[str, str] = {"level": cfg.logging.level, "journald": cfg.logging.journald}
    processes: dict[str, EndpointProcess] = {}
    if cfg.compat.openpi.enabled:
        _need("websockets", "openpi", "compat.openpi")
        o = cfg.compat.openpi
        limits = {
            "nofile": CHILD_BASE_FDS + o.max_connections,
            "address_space_bytes": _address_space(o.max_message_mb, o.max_clients),
            "nice": 10,
        }
        spec = Spec(
            "openpi",
            dataclasses.asdict(o),
            sockets,
            limits,
            _openpi_contract(o.cameras, o.proprio, contract, release),
            curve,
            logging_cfg,
            cfg.serve.status_hz,
            listeners["openpi"].fds,
            _read_token(o.token_file),
        )
        processes["openpi"] = EndpointProcess("openpi", spec, gatekeeper, events)
    if cfg.metrics.enabled:
        _need("prometheus_client", "metrics", "metrics")
        m = cfg.metrics
        limits = {"nofile": CHILD_BASE_FDS + m.max_connections, "address_space_bytes": _address_space(1, 1), "nice": 10}
        spec = Spec(
            "metrics",
            dataclasses.asdict(m),
            sockets,
            limits,
            {},
            curve,
            logging_cfg,
            cfg.serve.status_hz,
            listeners["metrics"].fds,
        )
        processes["metrics"] = EndpointProcess("metrics", spec, gatekeeper, events)
    return Endpoints(processes)


def _need(module: str, extra: str, section: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise StartupError(f"[{section}] is enabled but the {module} package is missing: pip install 'vlad[{extra}]'")


def _read_token(path: str) -> str:
    from pathlib import Path

    if not path:
        return ""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise StartupError(f"compat.openpi.token_file {path}: {exc.strerror}") from None
    if len(token) < 16:
        raise StartupError(f"compat.openpi.token_file {path}: the token needs >= 16 characters")
    return token


def _openpi_contract(
    cameras: dict[str, Any], proprio: tuple[str, ...], contract: Contract, release: str
) -> dict[str, Any]:
    """What the openpi mapping needs of the contract; the mapping checked against it."""
    names = [c.name for c in contract.cameras]
    missing = [n for n in names if n not in cameras]
    unknown = [n for n in cameras if n not in names]
    if missing or unknown:
        wrong = [f"missing {', '.join(missing)}"] if missing else []
        wrong += [f"not in the contract: {', '.join(unknown)}"] if unknown else []
        raise StartupError(
            f"compat.openpi.cameras must name every contract camera ({', '.join(names)}): {'; '.join(wrong)}"
        )
    if contract.proprio is not None and not proprio:
        raise StartupError(
            f"compat.openpi.proprio: the contract needs a proprio vector of {contract.proprio.dim}; "
            "name the openpi key(s) that hold it"
        )
    return {
        "release": release,
        "action_dim": contract.action.dim,
        "chunk_length": contract.action.chunk_length,
        "control_period_ms": contract.timing.control_period_ms,
        "language": contract.language is not None,
        "proprio_dim": contract.proprio.dim if contract.proprio is not None else None,
        "expect": {
            f"image/{c.name}": f"{c.raw.dtype}[{c.raw.height}, {c.raw.width}, 3]"
            if c.raw.layout == "HWC"
            else f"{c.raw.dtype}[3, {c.raw.height}, {c.raw.width}]"
            for c in contract.cameras
        },
    }
