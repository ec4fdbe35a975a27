"""systemd integration: the notify protocol and journald logging.

``Notifier`` speaks the sd_notify datagram protocol directly (``$NOTIFY_SOCKET``, a unix
datagram socket, ``@`` for the abstract namespace), so it works with or without
systemd-python and can be tested against a real socket. Outside systemd it does nothing.

Logging goes to journald with structured fields (``VLAD_RELEASE``, ``VLAD_STATE``) when
the process was started by systemd and systemd-python is installed, else to stderr.
"""

from __future__ import annotations

import logging
import os
import socket
import sys


class Notifier:
    """Sends ``READY=1``, ``STATUS=...``, ``WATCHDOG=1``, ``STOPPING=1`` to systemd."""

    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        self._sock: socket.socket | None = None
        self._addr: str | bytes = ""
        if address:
            self._addr = "\0" + address[1:] if address.startswith("@") else address
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        # The watchdog applies to us only if WATCHDOG_PID is unset or names this process.
        self.watchdog_usec = int(usec) if usec and usec.isdigit() and (not pid or pid == str(os.getpid())) else 0

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, **fields: object) -> bool:
        """Send ``KEY=value`` lines, e.g. ``notify(READY=1, STATUS="serving")``."""
        if self._sock is None:
            return False
        msg = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            self._sock.sendto(msg, self._addr)
            return True
        except OSError:
            # systemd went away or the socket is gone: nothing to tell, keep serving.
            return False

    def ready(self, status: str) -> None:
        self.notify(READY=1, STATUS=status, MAINPID=os.getpid())

    def status(self, text: str) -> None:
        self.notify(STATUS=text)

    def watchdog(self) -> None:
        self.notify(WATCHDOG=1)

    def stopping(self, status: str = "stopping") -> None:
        self.notify(STOPPING=1, STATUS=status)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def under_systemd() -> bool:
    """True when systemd started this process (it sets INVOCATION_ID and JOURNAL_STREAM)."""
    return bool(os.environ.get("INVOCATION_ID") and os.environ.get("JOURNAL_STREAM"))


class _ContextFilter(logging.Filter):
    """Adds the current release and state to every record (journald fields)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = "-"
        self.state = "STARTING"

    def filter(self, record: logging.LogRecord) -> bool:
        record.VLAD_RELEASE = self.release
        record.VLAD_STATE = self.state
        return True


context = _ContextFilter()


def setup_logging(level: str = "info", journald: str = "auto") -> str:
    """Route vlad's logs to journald or stderr; returns ``"journald"`` or ``"stderr"``."""
    root = logging.getLogger("vlad")
    root.setLevel(level.upper())
    for h in list(root.handlers):
        root.removeHandler(h)
    handler: logging.Handler | None = None
    target = "stderr"
    if journald == "on" or (journald == "auto" and under_systemd()):
        try:
            from systemd.journal import JournalHandler  # systemd-python

            handler = JournalHandler(SYSLOG_IDENTIFIER="vlad")
            target = "journald"
        except ImportError:
            if journald == "on":
                print("vlad: journald logging requested but systemd-python is not installed; logging to stderr", file=sys.stderr)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s vlad[%(VLAD_STATE)s] %(levelname)s %(message)s"))
    handler.addFilter(context)
    root.addHandler(handler)
    root.propagate = False
    return target
