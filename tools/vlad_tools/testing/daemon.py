"""The tests' side of running ``vlad serve`` (:mod:`vlad.daemon.child` runs it).

:func:`start_daemon` is the tests' short form of :func:`vlad.daemon.child.launch`: the demo
config of this checkout in a test's folder, ``--set`` arguments (:data:`QUIET_MONITORS`),
run from the checkout; :func:`daemon_command` the bare command line on the demo config, for
starts that are meant to fail. :func:`tcp_endpoints` and :func:`free_ports` choose free
loopback ports (:func:`busy_port` one in use) (CurveZMQ sockets, the openpi and metrics
endpoints, test servers).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from vlad.config import Config
from vlad.daemon import child
from vlad.daemon.child import SOCKETS, DaemonProcess, launch
from vlad_tools.testing.releases import DEMO_CONFIG, REPO

# ``--set`` arguments for a daemon that is sent observations and heartbeats now and then,
# not as steady streams: the monitors that would (rightly) call that a stalled sensor or a
# lost controller are switched off (tests/daemon/test_faults.py covers them).
QUIET_MONITORS = [
    "--set",
    "monitors.sensor_stall_periods=1000000",
    "--set",
    "monitors.stale_fraction_fault=1.0",
    "--set",
    "monitors.heartbeat_missing_periods=1000000",
]


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (bound together while chosen)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    return free_ports(1)[0]


@contextlib.contextmanager
def busy_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that something listens on while the block runs (a start on
    it must be refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def tcp_endpoints() -> dict[str, str]:
    """tcp endpoints on free loopback ports for the daemon's four sockets (as CurveZMQ needs)."""
    return {name: f"tcp://127.0.0.1:{port}" for name, port in zip(SOCKETS, free_ports(len(SOCKETS)), strict=True)}


def daemon_command(
    endpoints: Mapping[str, str], extra: Sequence[str] | None = None, config: Path | str | None = None
) -> list[str]:
    """The ``vlad serve`` command line on ``config`` (default: the demo config) with its
    sockets moved to ``endpoints``, then ``extra`` arguments
    (:func:`vlad.daemon.child.daemon_command`)."""
    return child.daemon_command(config or DEMO_CONFIG, endpoints, extra)


def start_daemon(
    folder: Path,
    extra: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    config: Config | str | Path | None = None,
    wait_ready: bool = True,
    endpoints: Mapping[str, str] | None = None,
    prefix: Sequence[str] | None = None,
) -> DaemonProcess:
    """:func:`launch` as the tests call it: ``config`` (default: the demo config, its signed
    release) in ``folder``, run from the checkout; ``extra`` are ``--set KEY=VALUE`` pairs
    (e.g. :data:`QUIET_MONITORS`)."""
    args = list(extra or [])
    if len(args) % 2 or any(flag != "--set" for flag in args[::2]):
        raise ValueError(f"start_daemon: extra takes --set KEY=VALUE pairs, not {args}")
    return launch(
        DEMO_CONFIG if config is None else config,
        folder=folder,
        settings=args[1::2],
        env=env,
        endpoints=endpoints,
        wait_ready=wait_ready,
        cwd=REPO,
        prefix=prefix,
    )
