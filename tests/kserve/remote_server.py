"""The session-wide KServe v2 test server (:class:`vlad.testing.kserve.ServerProcess`).

The fixture :func:`kserve_server` is shared by the backend conformance suite (tests/backends)
and tests/kserve: both conftests import it, and the module-level cache makes them one
process.
"""

from __future__ import annotations

import pytest

from vlad.testing.kserve import MODEL, ServerProcess, free_port, server_unavailable

__all__ = ["MODEL", "ServerProcess", "free_port", "kserve_server", "server_unavailable"]

_shared: ServerProcess | None = None


@pytest.fixture(scope="session")
def kserve_server(tmp_path_factory) -> ServerProcess:
    """The session's test server (demo release); faults cleared around every use."""
    global _shared
    why = server_unavailable()
    if why:
        pytest.skip(f"no KServe test server: {why}")
    if _shared is None or _shared.proc is None or _shared.proc.poll() is not None:
        _shared = ServerProcess(tmp_path_factory.mktemp("kserve-server")).start()
    _shared.fault()
    yield _shared
    _shared.stop()
