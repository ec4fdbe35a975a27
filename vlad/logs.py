"""Logging: journald with structured fields under systemd, stderr otherwise.

Every record carries ``VLAD_RELEASE`` and ``VLAD_STATE`` (the release being served and the
supervisor's state, kept current in :data:`context`); events add ``VLAD_EVENT`` (their
kind: transition, fault, swap, quarantine, release, operator ...), ``VLAD_REASON`` and,
where one policy is concerned, ``VLAD_POLICY``. docs/operations.md shows the
``journalctl`` lines that find a fallback or a rollback by these fields.
"""

from __future__ import annotations

import logging
import os
import sys


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
