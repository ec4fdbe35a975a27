"""Endpoints beside the native ZeroMQ protocol, all off by default: an openpi-compatible
websocket server (:mod:`vlad.compat.openpi`) and Prometheus metrics (:mod:`vlad.compat.metrics`).

:func:`attach` is the supervisor's one call: it runs in :func:`vlad.daemon.supervisor.assemble`
after the daemon is built and *before* the serving thread starts, because the openpi bridge
adds ``inproc://`` endpoints to the observation and action sockets, and those sockets belong
to other threads once serving runs.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vlad.daemon.supervisor import Daemon


def _need(module: str, extra: str, section: str) -> None:
    import importlib.util

    from vlad.errors import StartupError

    if importlib.util.find_spec(module) is None:
        raise StartupError(f"[{section}] is enabled but the {module} package is missing: pip install 'vlad[{extra}]'")


def attach(daemon: Daemon, obs_sock: Any, actions_sock: Any, stack: AsyncExitStack) -> None:
    cfg = daemon.cfg
    if cfg.compat.openpi.enabled:
        _need("websockets", "openpi", "compat.openpi")
        from vlad.compat.openpi import OpenPIBridge

        bridge = OpenPIBridge(cfg.compat.openpi, daemon)
        bridge.bind_inproc(obs_sock, actions_sock)
        bridge.start()
        stack.callback(bridge.stop)
        daemon.openpi = bridge
    if cfg.metrics.enabled:
        _need("prometheus_client", "metrics", "metrics")
        from vlad.compat.metrics import MetricsServer

        server = MetricsServer(cfg.metrics, daemon)
        server.start()
        stack.callback(server.stop)
        daemon.metrics = server
