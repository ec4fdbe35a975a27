"""Runs the real daemon (``vlad serve``) on a release under test, with its real sockets.

The performance and closed-loop gates judge what a robot would get, so they go through
the daemon process, not an in-process shortcut (:func:`vlad.daemon.child.launch`: ipc sockets in
a private folder, a datagram ``NOTIFY_SOCKET`` standing in for systemd, READY=1 marking the
end of loading and warm-up). A release that is not signed yet (the usual case: evidence is
recorded before signing) is served unverified with the backend, artifact and options of
its manifest; with ``keys_dir`` it is verified first.
"""

from __future__ import annotations

from vlad.config import Config, LoggingConfig, ReleaseConfig, ServeConfig
from vlad.daemon.child import DaemonProcess, launch
from vlad_tools.gates.subject import Subject
from vlad_tools.gates.wrapped import PLUGIN_ENV


def serve(
    subject: Subject,
    *,
    warmup: int = 10,
    log_level: str = "info",
    keys_dir: str | None = None,
    env: dict[str, str] | None = None,
    latency_ms: float = 0.0,
    jitter: float = 0.0,
) -> DaemonProcess:
    """Start ``vlad serve`` on ``subject``; call ``wait_ready()`` on the result (``with`` stops it).

    ``latency_ms``: every inference takes at least this long (± ``jitter`` of it), what the
    target robot's computer will take: the subject's backend inside the ``wrapped`` one
    (:mod:`vlad_tools.gates.wrapped`), served unverified (the wrapper is not the manifest's
    backend)."""
    if latency_ms > 0:
        s = subject.serving
        options = {**dict(s.options), "inner": s.backend, "delay_ms": latency_ms, "jitter": jitter}
        release = ReleaseConfig(
            path=str(subject.path), verify=False, backend="wrapped", artifact=s.artifact, options=options
        )
        env = {**(env or {}), **PLUGIN_ENV}
    elif keys_dir:
        release = ReleaseConfig(path=str(subject.path), verify=True, keys_dir=str(keys_dir))
    else:
        s = subject.serving
        release = ReleaseConfig(
            path=str(subject.path), verify=False, backend=s.backend, artifact=s.artifact, options=dict(s.options)
        )
    if log_level not in ("debug", "info", "warning", "error"):
        raise ValueError(f"log_level {log_level!r}: one of debug, info, warning, error")
    cfg = Config(
        release=release,
        serve=ServeConfig(warmup=int(warmup)),
        logging=LoggingConfig(level=log_level, journald="off"),  # type: ignore[arg-type]  # checked above
    )
    return launch(cfg, env=env, wait_ready=False)
