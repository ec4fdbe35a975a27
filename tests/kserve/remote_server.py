"""The session-wide KServe v2 test server (:class:`vlad_kserve.testing.ServerProcess`).

The fixture :func:`kserve_server` is shared by the backend conformance suite (tests/backends)
and tests/kserve: both conftests import it, and the module-level cache makes them one
process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vlad_kserve.testing import MODEL, ServerProcess, server_unavailable
from vlad_tools.testing import DEMO, free_port

__all__ = [
    "MODEL",
    "ServerProcess",
    "free_port",
    "kserve_server",
    "require_server",
    "started_server",
    "server_unavailable",
]

_shared: ServerProcess | None = None


@pytest.fixture(scope="session")
def kserve_server(tmp_path_factory) -> ServerProcess:
    """The session's test server (demo release); faults cleared around every use."""
    global _shared
    require_server()
    if _shared is None or _shared.proc is None or _shared.proc.poll() is not None:
        _shared = ServerProcess(tmp_path_factory.mktemp("kserve-server"), DEMO).start()
    _shared.fault()
    yield _shared
    _shared.stop()


def require_server() -> None:
    """Skip the test where no KServe test server can run here (the reason from :func:`server_unavailable`)."""
    why = server_unavailable()
    if why:
        pytest.skip(f"no KServe test server: {why}")


@contextlib.contextmanager
def started_server(folder: Path, **options: Any) -> Iterator[ServerProcess]:
    """A server of the caller's own (one its tests kill, or start with other ``options``),
    stopped afterwards; the test is skipped where none can run."""
    require_server()
    server = ServerProcess(folder, **{"release": DEMO, **options}).start()
    try:
        yield server
    finally:
        server.stop()
