"""The control server on its own: real ZeroMQ sockets in process, a :class:`ControlPort` the
test drives.

The server gets a narrow port, not the daemon, so what only timing shows through a running
daemon is checked here exactly: release operations one at a time while ``status`` answers,
the per-peer bound answered "busy" at once, and a handler's failure answered and counted
by kind. The daemon's own port (:class:`vlad.daemon.control.DaemonControls`) is exercised
through the real subprocess daemon in ``test_daemon.py``, ``test_hostile.py`` and the
deploy/rollback tests.
"""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import zmq
import zmq.asyncio

from vlad import protocol
from vlad.config import SocketsConfig
from vlad.daemon.control import ControlServer
from vlad.errors import VladError

ENDPOINT = "inproc://control-server-test"


class Port:
    """A :class:`~vlad.daemon.control.ControlPort` whose deploys wait for :attr:`go` and
    whose ``resume`` raises :attr:`fault` (when set)."""

    def __init__(self) -> None:
        self.releases = self
        self.go = anyio.Event()
        self.entered: list[str] = []
        self.running = 0
        self.most = 0
        self.fault: BaseException | None = None

    def status(self) -> dict[str, Any]:
        return {"state": "ACTIVE"}

    def events(self, limit: int) -> list[dict[str, Any]]:
        return []

    def resume(self, who: str, why: str) -> dict[str, Any]:
        if self.fault is not None:
            raise self.fault
        return {"quarantined": []}

    async def deploy(self, path: str, who: str, why: str, canary: bool, force: bool) -> dict[str, Any]:
        self.entered.append(path)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.go.wait()
        finally:
            self.running -= 1
        return {"deployed": path}

    async def rollback(self, who: str, why: str, force: bool = False) -> dict[str, Any]:
        return {}

    async def history(self) -> list[dict[str, Any]]:
        return []

    async def shadow_start(self, path: str, tolerance: float) -> dict[str, Any]:
        return {}

    def shadow_report(self) -> dict[str, Any]:
        return {}

    async def shadow_stop(self) -> dict[str, Any]:
        return {}


@asynccontextmanager
async def serving(port: Port, **limits: Any) -> AsyncIterator[tuple[zmq.asyncio.Context, ControlServer]]:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(ENDPOINT)
    server = ControlServer(sock, SocketsConfig(**limits))
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(server.run, port)
            yield ctx, server
            tg.cancel_scope.cancel()
    finally:
        sock.close(0)
        ctx.term()


def peer(ctx: zmq.asyncio.Context) -> zmq.asyncio.Socket:
    """A DEALER: unlike REQ it may have several requests in flight."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(ENDPOINT)
    return sock


async def send(sock: zmq.asyncio.Socket, cmd: str, **args: Any) -> None:
    await sock.send_multipart([b"", protocol.encode_request(cmd, **args)])


async def reply(sock: zmq.asyncio.Socket) -> dict[str, Any]:
    with anyio.fail_after(5):
        frames = await sock.recv_multipart()
    assert frames[0] == b"" and len(frames) == 2, frames
    return protocol.decode_reply(frames[1])


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not condition():
            await anyio.sleep(0.001)


def run(test: Callable[[], Any]) -> None:
    anyio.run(test, backend="asyncio")


def test_release_operations_run_one_at_a_time_and_a_peer_over_its_bound_is_answered_busy():
    async def main() -> None:
        port = Port()
        async with serving(port, control_in_flight_per_peer=2) as (ctx, server):
            a, b = peer(ctx), peer(ctx)
            await send(a, "deploy", path="/r/1", why="first")
            await send(a, "deploy", path="/r/2", why="second")
            await send(a, "status")  # a third request in flight from the same peer
            busy = await reply(a)
            assert busy["ok"] is False and busy["error"].startswith("busy"), busy
            await until(lambda: port.running == 1)
            await send(b, "status")  # another peer, and not behind the release lock
            assert (await reply(b))["result"] == {"state": "ACTIVE"}
            assert port.entered == ["/r/1"]  # the second deploy waits for the lock
            port.go.set()
            done = [await reply(a), await reply(a)]
            assert [r["result"] for r in done] == [{"deployed": "/r/1"}, {"deployed": "/r/2"}]
            assert port.most == 1
            assert server.rejected == {"busy": 1}
            a.close()
            b.close()

    run(main)


FAULTS = {
    "bug": (RuntimeError("boom"), "internal_error", "internal error"),
    "file-system": (OSError(errno.EACCES, "Permission denied", "/srv/r"), "refused", "refused: Permission denied"),
    "refusal": (VladError("not now"), "refused", "not now"),
}


@pytest.mark.parametrize("fault,reason,error", FAULTS.values(), ids=FAULTS.keys())
def test_a_failing_command_is_answered_counted_and_the_server_goes_on(fault, reason, error):
    async def main() -> None:
        port = Port()
        port.fault = fault
        async with serving(port) as (ctx, server):
            a = peer(ctx)
            await send(a, "resume", why="test")
            rep = await reply(a)
            assert rep["ok"] is False and rep["error"].startswith(error), rep
            await send(a, "ping")
            assert (await reply(a))["result"]["pong"] is True
            assert server.rejected == {reason: 1}
            a.close()

    run(main)


def test_a_frame_without_an_envelope_is_counted_and_left_unanswered():
    async def main() -> None:
        async with serving(Port()) as (ctx, server):
            a = peer(ctx)
            await a.send(protocol.encode_request("ping"))  # no empty delimiter: not a REQ envelope
            await send(a, "ping")
            assert (await reply(a))["result"]["pong"] is True  # the first reply is the second ping's
            assert server.rejected == {"malformed": 1}
            a.close()

    run(main)
