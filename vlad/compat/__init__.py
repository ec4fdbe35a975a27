"""Endpoints beside the native ZeroMQ protocol, all off by default, each in its own process:
an openpi-compatible websocket server (:mod:`vlad.compat.openpi`) and Prometheus metrics
(:mod:`vlad.compat.metrics`).

``python -m vlad.compat openpi|metrics`` is what :mod:`vlad.daemon.endpoints` starts: the
process reads its spec on stdin, applies its own resource limits and talks to the daemon
through the daemon's sockets like any controller (:mod:`vlad.compat.endpoint`). Nothing in
this package runs inside the daemon.
"""
