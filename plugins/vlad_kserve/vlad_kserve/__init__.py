"""vlad backend plugin for remote inference: the ``kserve`` backend.

The model runs on a server that speaks the KServe v2 inference protocol (NVIDIA Triton,
KServe, MLServer, or :mod:`vlad_kserve.server` for tests and the demo); vlad sends the
contract's model inputs and gets its outputs back, over gRPC (default) or HTTP, binary
tensors only. See ``docs/remote.md``.

Registered through the ``vlad`` entry-point group like any third-party plugin. Importing
this package imports no client library; the backend imports tritonclient when it loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlad.hookspecs import hookimpl
from vlad_kserve.backend import KServeBackend, KServeSession
from vlad_kserve.monitor import RemoteLinkMonitor
from vlad_kserve.options import RemoteOptions, parse_options

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable
    from pathlib import Path

    from vlad.config import Config

__all__ = [
    "KServeBackend",
    "KServeSession",
    "RemoteLinkMonitor",
    "RemoteOptions",
    "parse_options",
    "vlad_backends",
    "vlad_monitors",
    "vlad_remote_demo",
]


@hookimpl
def vlad_backends() -> list:
    """The remote KServe v2 backend."""
    return [KServeBackend()]


@hookimpl
def vlad_monitors(config: dict) -> list:
    """The remote-link monitor (it looks only at remote policies' session stats); its
    thresholds: ``[monitors.remote]`` (:class:`vlad_kserve.monitor.RemoteLinkSettings`)."""
    return [RemoteLinkMonitor()]


@hookimpl
def vlad_remote_demo() -> Callable[[Path, Path], tuple[Config, subprocess.Popen]]:
    """``./scripts/demo --remote``: :func:`vlad_kserve.demo.start_remote_demo` (a v2 server
    on the demo release; imported when asked for, not with the plugin)."""
    from vlad_kserve.demo import start_remote_demo

    return start_remote_demo
