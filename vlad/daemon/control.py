"""Control commands: one registry of name, argument schema, release lock and handler.

A request is ``{"v": 1, "cmd": NAME, "args": {...}}`` (docs/protocol.md). Its arguments are
parsed by :mod:`vlad.schema` into the command's frozen argument class before anything
runs: a wrong type, a missing or unknown key, an over-long string, a control character
(NUL, newline, DEL, a bidi override ...) or a path the file system cannot hold (a name
over 255 bytes, the whole over 4095) is a reply ``{"ok": false, "error": "..."}``, never
an exception in the daemon. ``vladctl`` and the protocol page's command table follow
:data:`COMMANDS`.

Handlers are ``async def handler(daemon, args) -> JSON-able result``; commands that change
releases take the release lock (one at a time) and have the longer release-operation
time limit.
"""

from __future__ import annotations

import dataclasses
import os
import time
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vlad import __version__, protocol, schema
from vlad.errors import ProblemsError, VladError

if TYPE_CHECKING:
    from vlad.daemon.supervisor import Daemon

_TEXT = {"max_len": 1024}
_PATH = {"max_len": 4096, "path": True}
# Characters no argument may hold: they break the one-line logs and events an argument
# ends up in (newline, DEL and the other controls), or make a line read other than it is
# (bidi overrides and other format characters; line and paragraph separators).
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
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


Handler = Callable[["Daemon", Any], Awaitable[Any]]


@dataclass(frozen=True)
class Command:
    name: str
    args: type
    handler: Handler
    help: str
    release_op: bool = False  # takes the release lock and the release-operation time limit


async def _ping(d: Daemon, a: NoArgs) -> Any:
    return {"pong": True, "pid": os.getpid(), "version": __version__}


async def _status(d: Daemon, a: NoArgs) -> Any:
    return d.status()


async def _events(d: Daemon, a: EventsArgs) -> Any:
    return [e.to_dict() for e in d.state.recent(a.limit)]


async def _resume(d: Daemon, a: OperatorArgs) -> Any:
    limit = d.cfg.monitors.heartbeat_missing_periods * d.period_ns
    now = time.monotonic_ns()
    silent = [n for n, b in d.intake.controllers.snapshot().items() if now - b.last_ns > limit]
    forgotten = d.intake.controllers.forget(silent)  # gone without a goodbye: the operator says so
    d.chain.health.resume(a.who, a.why)
    if forgotten:
        d.state.record("operator", f"controllers forgotten by {a.who}: {', '.join(forgotten)}", forgotten=forgotten)
    return {"quarantined": [], "forgotten_controllers": forgotten, "state": d.state.state.value}


async def _deploy(d: Daemon, a: DeployArgs) -> Any:
    return await d.releases.deploy(a.path, a.who, a.why, a.canary, a.force)


async def _rollback(d: Daemon, a: RollbackArgs) -> Any:
    return await d.releases.rollback(a.who, a.why, a.force)


async def _history(d: Daemon, a: NoArgs) -> Any:
    return await d.releases.history()


async def _shadow_start(d: Daemon, a: ShadowStartArgs) -> Any:
    return await d.releases.shadow_start(a.path, a.tolerance)


async def _shadow_report(d: Daemon, a: NoArgs) -> Any:
    return d.releases.shadow_report()


async def _shadow_stop(d: Daemon, a: NoArgs) -> Any:
    return await d.releases.shadow_stop()


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
            "unknown_command", f"unknown control command {name[:64]!r} (known: {', '.join(COMMANDS)})"
        )
    args: Any = schema.parse(cmd.args, raw_args, f"{name}", BadArguments)
    problems = text_problems(args)
    if problems:
        raise BadArguments(name, problems)
    return cmd, args


def text_problems(args: Any) -> list[str]:
    """What the schema does not check in a parsed argument object's strings: control and
    format characters anywhere, and paths the file system could not hold."""
    out = []
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if not isinstance(value, str):
            continue
        bad = next((c for c in value if unicodedata.category(c) in _REFUSED_CATEGORIES), None)
        if bad is not None:
            out.append(f"{f.name}: control or format character U+{ord(bad):04X} refused (one line of text only)")
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
