"""Kept while other branches still import it: everything here is :mod:`vlad.testing`'s.

``start_daemon`` returns a :class:`vlad.testing.DaemonProcess` (``RunningDaemon`` is its
former name); ``ROOT`` and ``VLAD`` are :mod:`tests.conftest`'s.
"""

from tests.conftest import ROOT, VLAD
from vlad.testing import (
    PERIOD_S,
    QUIET_MONITORS,
    ControllerSim,
    FaultRig,
    NotifyListener,
    Received,
    daemon_command,
    endpoints_in,
    max_gap,
    start_daemon,
    write_fault_rig,
)
from vlad.testing import DaemonProcess as RunningDaemon

__all__ = [
    "PERIOD_S",
    "QUIET_MONITORS",
    "ROOT",
    "VLAD",
    "ControllerSim",
    "FaultRig",
    "NotifyListener",
    "Received",
    "RunningDaemon",
    "daemon_command",
    "endpoints_in",
    "max_gap",
    "start_daemon",
    "write_fault_rig",
]
