"""systemd integration: the notify protocol and journald logging.

``Notifier`` speaks the sd_notify datagram protocol directly (``$NOTIFY_SOCKET``, a unix
datagram socket, ``@`` for the abstract namespace), so it works with or without
systemd-python and can be tested against a real socket. Outside systemd it does nothing.

Logging (journald or stderr) is :mod:`vlad.logs`.
"""

from __future__ import annotations

import os
import socket


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
