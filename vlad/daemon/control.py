"""Control commands and the server that answers them on the control socket.

One registry of name, argument schema, release lock and handler (:data:`COMMANDS`), and
:class:`ControlServer`, the component that reads the ROUTER socket and answers each request.

A request is ``{"v": 1, "cmd": NAME, "args": {...}}`` (docs/protocol.md). Its arguments are
parsed by :mod:`vlad.schema` into the command's frozen argument class before anything
runs: a wrong type, a missing or unknown key, an over-long string, a control character
(NUL, newline, DEL, a bidi override ...) or a path the file system cannot hold (a name
over 255 bytes, the whole over 4095) is a reply ``{"ok": false, "error": "..."}``, never
an exception in the daemon. ``vladctl`` and the protocol page's command table follow
:data:`COMMANDS`.

Handlers are ``async def handler(port, args) -> JSON-able result``, where ``port`` is a
:class:`ControlPort`: the status, the event history, the operator's resume and the release
operations, all a command may reach (the supervisor builds :class:`DaemonControls`).
Commands that change releases take the release lock (one at a time) and have the longer
release-operation time limit.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import zmq
from anyio.abc import TaskStatus

from vlad import __version__, protocol, schema
from vlad.errors import ProblemsError, VladError

if TYPE_CHECKING:
    import zmq.asyncio

    from vlad.config import SocketsConfig
    from vlad.health.liveness import Controllers
    from vlad.health.policy import HealthPolicy
    from vlad.health.state import StateMachine

log = logging.getLogger("vlad.daemon")

# Every string argument is one line of text (schema.line_problem: the rule the release
# store applies to who and why as well), of at most max_len characters.
_TEXT = {"max_len": schema.LINE_MAX_LEN}
_PATH = {"max_len": 4096, "path": True}
NAME_MAX = 255  # bytes of one path component (Linux)
PATH_MAX = 4095  # bytes of a whole path (PATH_MAX less the terminating NUL)


class BadArguments(ProblemsError):
    """A control request's arguments do not fit the command's schema."""


@dataclass(frozen=True)
class NoArgs:
    """A command without arguments."""


@dataclass(frozen=True)
class EventsArgs:
    limit: int = field(default=100, metadata=schema.bounded(1, 500))


@dataclass(frozen=True)
class OperatorArgs:
    why: str = field(metadata=_TEXT)
    who: str = field(default="operator", metadata=_TEXT)


@dataclass(frozen=True)
class RollbackArgs:
    why: str = field(metadata=_TEXT)
    who: str = field(default="operator", metadata=_TEXT)
    force: bool = False  # a target without passing gate evidence, or marked bad (recorded)


@dataclass(frozen=True)
class DeployArgs:
    path: str = field(metadata=_PATH)
    why: str = field(metadata=_TEXT)
    who: str = field(default="operator", metadata=_TEXT)
    canary: bool = False
    force: bool = False


@dataclass(frozen=True)
class ShadowStartArgs:
    path: str = field(metadata=_PATH)
    tolerance: float = field(default=0.05, metadata=schema.bounded(0.0, 1e6))


class ReleaseOps(Protocol):
    """The release operations a command runs (:class:`vlad.daemon.releases.ReleaseManager`)."""

    async def deploy(self, path: str, who: str, why: str, canary: bool, force: bool) -> dict[str, Any]: ...
    async def rollback(self, who: str, why: str, force: bool = False) -> dict[str, Any]: ...
    async def history(self) -> list[dict[str, Any]]: ...
    async def shadow_start(self, path: str, tolerance: float) -> dict[str, Any]: ...
    def shadow_report(self) -> dict[str, Any]: ...
    async def shadow_stop(self) -> dict[str, Any]: ...


class ControlPort(Protocol):
    """Everything a control command may read or change in the daemon."""

    @property
    def releases(self) -> ReleaseOps: ...
    def status(self) -> dict[str, Any]: ...
    def events(self, limit: int) -> list[dict[str, Any]]: ...
    def resume(self, who: str, why: str) -> dict[str, Any]: ...


@dataclass(eq=False, kw_only=True)
class DaemonControls:
    """The :class:`ControlPort` of the running daemon, built by the supervisor from the
    parts the commands touch."""

    releases: ReleaseOps
    status: Callable[[], dict[str, Any]]
    state: StateMachine
    health: HealthPolicy
    controllers: Controllers
    heartbeat_limit_ns: int

    def events(self, limit: int) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.state.recent(limit)]

    def resume(self, who: str, why: str) -> dict[str, Any]:
        """Clear every quarantine; every name silent past the heartbeat limit is forgotten
        (judged controllers gone without a goodbye: the operator says so; names that never
        became controllers: they hold nothing, but take a place in the table)."""
        forgotten = self.controllers.forget_silent(time.monotonic_ns(), self.heartbeat_limit_ns)
        self.health.resume(who, why)
        if forgotten:
            self.state.record(
                "operator", f"controllers forgotten by {who}: {', '.join(forgotten)}", forgotten=forgotten
            )
        return {"quarantined": [], "forgotten_controllers": forgotten, "state": self.state.state.value}


Handler = Callable[[ControlPort, Any], Awaitable[Any]]


@dataclass(frozen=True)
class Command:
    name: str
    args: type
    handler: Handler
    help: str
    release_op: bool = False  # takes the release lock and the release-operation time limit


async def _ping(p: ControlPort, a: NoArgs) -> Any:
    return {"pong": True, "pid": os.getpid(), "version": __version__}


async def _status(p: ControlPort, a: NoArgs) -> Any:
    return p.status()


async def _events(p: ControlPort, a: EventsArgs) -> Any:
    return p.events(a.limit)


async def _resume(p: ControlPort, a: OperatorArgs) -> Any:
    return p.resume(a.who, a.why)


async def _deploy(p: ControlPort, a: DeployArgs) -> Any:
    return await p.releases.deploy(a.path, a.who, a.why, a.canary, a.force)


async def _rollback(p: ControlPort, a: RollbackArgs) -> Any:
    return await p.releases.rollback(a.who, a.why, a.force)


async def _history(p: ControlPort, a: NoArgs) -> Any:
    return await p.releases.history()


async def _shadow_start(p: ControlPort, a: ShadowStartArgs) -> Any:
    return await p.releases.shadow_start(a.path, a.tolerance)


async def _shadow_report(p: ControlPort, a: NoArgs) -> Any:
    return p.releases.shadow_report()


async def _shadow_stop(p: ControlPort, a: NoArgs) -> Any:
    return await p.releases.shadow_stop()


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command("ping", NoArgs, _ping, "is the daemon there (pid, version)"),
        Command("status", NoArgs, _status, "state, release, backend, rates, latency, counters"),
        Command("events", EventsArgs, _events, "the last `limit` state transitions and events"),
        Command(
            "resume",
            OperatorArgs,
            _resume,
            "clear every quarantine and forget silent controllers (operator decision, recorded)",
        ),
        Command("deploy", DeployArgs, _deploy, "verify, stage, warm and hot-swap a release", release_op=True),
        Command("rollback", RollbackArgs, _rollback, "back to the previous release", release_op=True),
        Command("history", NoArgs, _history, "activations and rollbacks from the release store"),
        Command(
            "shadow_start", ShadowStartArgs, _shadow_start, "run a candidate beside the serving policy", release_op=True
        ),
        Command("shadow_report", NoArgs, _shadow_report, "divergence, latency and faults of the shadow run"),
        Command("shadow_stop", NoArgs, _shadow_stop, "stop the shadow run and report", release_op=True),
    )
}


def parse_request(frame: Any) -> tuple[Command, Any]:
    """A request frame -> (command, parsed arguments); :class:`protocol.ProtocolError` or
    :class:`BadArguments` (both :class:`VladError`) say what is wrong."""
    name, raw_args = protocol.decode_request(frame)
    cmd = COMMANDS.get(name)
    if cmd is None:
        raise protocol.ProtocolError(
            protocol.Rejection.UNKNOWN_COMMAND, f"unknown control command {name[:64]!r} (known: {', '.join(COMMANDS)})"
        )
    args: Any = schema.parse(cmd.args, raw_args, f"{name}", BadArguments)
    problems = text_problems(args)
    if problems:
        raise BadArguments(name, problems)
    return cmd, args


def text_problems(args: Any) -> list[str]:
    """What the schema does not check in a parsed argument object's strings: each is one
    line of text (:func:`vlad.schema.line_problem`: no control or format character), and a
    path one the file system could hold."""
    out = []
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if not isinstance(value, str):
            continue
        problem = schema.line_problem(value, f.metadata.get("max_len", schema.LINE_MAX_LEN))
        if problem is not None:
            out.append(f"{f.name}: {problem}")
            continue
        if f.metadata.get("path"):
            encoded = os.fsencode(value)
            if len(encoded) > PATH_MAX:
                out.append(f"{f.name}: {len(encoded)} bytes, over the {PATH_MAX} a path may have")
            long = next((part for part in encoded.split(b"/") if len(part) > NAME_MAX), None)
            if long is not None:
                out.append(
                    f"{f.name}: a component of {len(long)} bytes ({os.fsdecode(long[:24])}...), over the "
                    f"{NAME_MAX} a file name may have"
                )
    return out


def error_reason(exc: VladError) -> str:
    """The counter key of a refused request."""
    if isinstance(exc, protocol.ProtocolError):
        return exc.reason
    if isinstance(exc, BadArguments):
        return "bad_arguments"
    return "refused"


class ControlServer:
    """Control requests on a ROUTER socket (REQ clients see plain REP behaviour), each
    answered in its own task so ``status`` answers while a deploy warms a release.

    Bounded: at most ``control_in_flight_per_peer`` per peer and ``control_in_flight`` in
    all; beyond that a request is answered "busy" at once, never queued. Every refusal is
    counted in :attr:`rejected` by reason (the status shows them as ``control_*``). The
    port is given to :meth:`run`, not here: the daemon's port answers ``status``, which
    shows this server's counts, so the server exists first."""

    def __init__(self, sock: zmq.asyncio.Socket, limits: SocketsConfig) -> None:
        self.sock = sock
        self.limits = limits
        self.rejected: Counter[str] = Counter()  # written here only; the status reads it
        self._release_lock = anyio.Lock()

    async def run(self, port: ControlPort, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Answer requests through ``port`` until cancelled."""
        s = self.limits
        in_flight: Counter[bytes] = Counter()
        async with anyio.create_task_group() as tg:
            task_status.started()
            while True:
                frames = await self.sock.recv_multipart()
                delimiter = frames.index(b"", 1) if b"" in frames[1:] else 0
                if not delimiter:
                    self.rejected["malformed"] += 1  # not a REQ envelope: nothing to answer
                    continue
                envelope, body, peer = frames[: delimiter + 1], frames[delimiter + 1 :], frames[0]
                if len(body) != 1:  # a REQ peer that sent a multipart request: answer, never leave it waiting
                    self.rejected["malformed"] += 1
                    await self._reply(
                        envelope,
                        protocol.encode_reply(
                            False, error=f"malformed: a control request is one frame, got {len(body)}"
                        ),
                    )
                    continue
                frame = body[0]
                if in_flight[peer] >= s.control_in_flight_per_peer or sum(in_flight.values()) >= s.control_in_flight:
                    self.rejected["busy"] += 1
                    await self._reply(
                        envelope, protocol.encode_reply(False, error="busy: too many requests in flight; try again")
                    )
                    continue
                in_flight[peer] += 1
                tg.start_soon(self._answer, port, envelope, frame, peer, in_flight)

    async def _answer(
        self, port: ControlPort, envelope: list[bytes], frame: bytes, peer: bytes, in_flight: Counter[bytes]
    ) -> None:
        s = self.limits
        try:
            try:
                cmd, args = parse_request(frame)
                if cmd.release_op:
                    # Release operations run one at a time and to the end once started
                    # (cancelling a half-loaded release would leak it); only the wait for
                    # the lock is bounded.
                    with anyio.fail_after(s.release_op_timeout_s):
                        await self._release_lock.acquire()
                    try:
                        result = await cmd.handler(port, args)
                    finally:
                        self._release_lock.release()
                else:
                    with anyio.fail_after(s.control_timeout_s):
                        result = await cmd.handler(port, args)
                reply = protocol.encode_reply(True, result)
            except TimeoutError:
                self.rejected["timeout"] += 1
                reply = protocol.encode_reply(False, error="timed out; the daemon is busy, try again")
            except VladError as exc:
                self.rejected[error_reason(exc)] += 1
                reply = protocol.encode_reply(False, error=str(exc))
            except OSError as exc:  # the file system said no (a path, permissions): a refusal, not a bug
                self.rejected["refused"] += 1
                where = f" ({exc.filename})" if exc.filename else ""
                reply = protocol.encode_reply(False, error=f"refused: {exc.strerror or exc}{where}")
            except Exception:  # a bug: answered and logged, never the end of the daemon
                self.rejected["internal_error"] += 1
                log.exception("control request failed")
                reply = protocol.encode_reply(False, error="internal error (see the daemon's log)")
            await self._reply(envelope, reply)
        finally:
            in_flight[peer] -= 1
            if in_flight[peer] <= 0:
                del in_flight[peer]

    async def _reply(self, envelope: list[bytes], reply: bytes) -> None:
        try:
            await self.sock.send_multipart([*envelope, reply], flags=zmq.NOBLOCK)
        except zmq.Again:
            self.rejected["reply_dropped"] += 1  # the peer does not read its replies
