"""Logging: journald with structured fields under systemd, stderr otherwise.

Every record carries ``VLAD_RELEASE`` and ``VLAD_STATE`` (the release being served and the
supervisor's state, kept current in :data:`context`); events add ``VLAD_EVENT`` (their
kind: transition, fault, swap, quarantine, release, operator ...), ``VLAD_REASON`` and,
where one policy is concerned, ``VLAD_POLICY``. docs/operations.md shows the
``journalctl`` lines that find a fallback or a rollback by these fields.

Records go to journald through systemd-python's ``JournalHandler``, which sends them with
libsystemd to the fixed ``/run/systemd/journal/socket``. ``$VLAD_JOURNAL_SOCKET`` names
another datagram socket for the same native journal protocol (a capture: the journald
test, a log shipper that speaks it); the fields are the same either way.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any


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

            path = os.environ.get("VLAD_JOURNAL_SOCKET")
            if path:
                handler = JournalHandler(SYSLOG_IDENTIFIER="vlad", sender_function=journal_sender(path))
            else:
                handler = JournalHandler(SYSLOG_IDENTIFIER="vlad")
            target = "journald"
        except ImportError:
            if journald == "on":
                print(
                    "vlad: journald logging requested but systemd-python is not installed; logging to stderr",
                    file=sys.stderr,
                )
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s vlad[%(VLAD_STATE)s] %(levelname)s %(message)s"))
    handler.addFilter(context)
    root.addHandler(handler)
    root.propagate = False
    return target


def journal_sender(path: str) -> Callable[..., None]:
    """A ``JournalHandler`` sender that writes what libsystemd's ``sd_journal_sendv`` writes,
    one datagram per record, to the socket at ``path`` instead of journald's.

    The native protocol (systemd.io/JOURNAL_NATIVE_PROTOCOL): one ``KEY=VALUE`` line per
    field; a value with a newline goes binary-safe as ``KEY``, newline, its length as a
    little-endian 64-bit integer, the bytes, newline.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    # The argument names are systemd.journal.send's: JournalHandler passes MESSAGE by position.
    def send(MESSAGE: str, MESSAGE_ID: Any = None, **fields: Any) -> None:
        items: list[tuple[str, Any]] = [("MESSAGE", MESSAGE)]
        if MESSAGE_ID is not None:
            items.append(("MESSAGE_ID", getattr(MESSAGE_ID, "hex", MESSAGE_ID)))
        items += fields.items()
        sock.sendto(b"".join(_journal_field(k, v) for k, v in items), path)

    return send


def _journal_field(key: str, value: Any) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
    if b"\n" in data:
        return key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
    return key.encode() + b"=" + data + b"\n"
