"""Kept while other branches still import it: everything here is :mod:`vlad.testing`'s.

``start_daemon`` returns a :class:`vlad.testing.DaemonProcess` (``RunningDaemon`` is its
former name); ``ROOT`` and ``VLAD`` are :mod:`tests.conftest`'s.
"""

from tests.conftest import ROOT, VLAD
from vlad.testing import (
    PERIOD_S,
    QUIET_MONITORS,
    WATCHDOG_ENV,
    ControllerSim,
    FaultRig,
    NotifyListener,
    Received,
    assert_core_unaffected,
    daemon_command,
    endpoints_in,
    max_gap,
    start_daemon,
    watchdog_gap,
    write_fault_rig,
)
from vlad.testing import DaemonProcess as RunningDaemon

__all__ = [
    "PERIOD_S",
    "QUIET_MONITORS",
    "ROOT",
    "VLAD",
    "WATCHDOG_ENV",
    "ControllerSim",
    "FaultRig",
    "NotifyListener",
    "Received",
    "RunningDaemon",
    "assert_core_unaffected",
    "daemon_command",
    "endpoints_in",
    "goodbye",
    "max_gap",
    "start_daemon",
    "watchdog_gap",
    "write_fault_rig",
]


def goodbye(client) -> None:
    """The controller leaves on purpose: :meth:`vlad.client.Client.heartbeat` with ``bye``."""
    client.heartbeat(bye=True)
