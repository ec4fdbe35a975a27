"""Fixtures of the remote-backend tests: the shared real KServe v2 server, sessions on it."""

from __future__ import annotations

import pytest

from tests.kserve.remote_server import kserve_server  # noqa: F401  (one process with tests/backends)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "daemon_remote: the daemon with a remote policy against a real v2 server (fallback and return)"
    )


@pytest.fixture(params=["grpc", "http"])
def protocol(request) -> str:
    return request.param
