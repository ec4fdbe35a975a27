"""``vlad.testing``: what vlad's tests, gates and benchmarks (and a plugin author's tests) use
to run the real thing.

* :mod:`vlad.testing.daemon`: ``vlad serve`` as a subprocess on its real sockets, from a
  typed :class:`~vlad.config.Config` or a config file, with a real datagram notify socket
  standing in for systemd (``READY=1``, ``WATCHDOG=1``, ``STATUS=``);
* :mod:`vlad.testing.controller`: a simulated controller streaming at the control rate and
  recording every chunk it gets;
* :mod:`vlad.testing.plugin`: one wrapper backend for faults and delays around a real one,
  an injected sensor, and the fault rig built on them (``VLAD_PLUGIN_MODULES=vlad.testing.plugin``);
* :mod:`vlad.testing.releases` and :mod:`vlad.testing.golden`: the demo release of this
  checkout, unsigned copies of it, benchmark payloads, the golden fixtures and the error
  budgets engines are judged by;
* :mod:`vlad.testing.kserve`: KServe v2 servers for the remote backend: the real one as a
  process with injected faults, and a hostile one (trickling, huge, malformed answers);
* :mod:`vlad.testing.fuzz`: fuzz targets and input generators (``tests/testing/test_fuzz.py``,
  ``scripts/fuzz.py``);
* :mod:`vlad.testing.toml`: a config (or any mapping) written as TOML, so nobody formats a
  daemon config by hand;
* :mod:`vlad.testing.wait`: waiting for a condition instead of sleeping.
"""

from vlad.testing.controller import (
    PERIOD_S,
    WATCHDOG_ENV,
    ControllerSim,
    FollowingController,
    Received,
    Ticker,
    assert_core_unaffected,
    max_gap,
    watchdog_gap,
)
from vlad.testing.daemon import (
    QUIET_MONITORS,
    DaemonFailed,
    DaemonProcess,
    NotifyListener,
    busy_port,
    daemon_command,
    endpoints_in,
    free_port,
    free_ports,
    launch,
    start_daemon,
    tcp_endpoints,
    vlad_command,
)
from vlad.testing.golden import MAX_ABS, GoldenCase, load_golden
from vlad.testing.plugin import PLUGIN_ENV, FaultRig, write_fault_rig
from vlad.testing.releases import DEMO, DEMO_CONFIG, DEMO_KEYS, REPO, unsigned_copy
from vlad.testing.toml import config_toml, dumps
from vlad.testing.wait import wait_until

__all__ = [
    "DEMO",
    "DEMO_CONFIG",
    "DEMO_KEYS",
    "MAX_ABS",
    "PERIOD_S",
    "PLUGIN_ENV",
    "QUIET_MONITORS",
    "REPO",
    "WATCHDOG_ENV",
    "ControllerSim",
    "DaemonFailed",
    "DaemonProcess",
    "FaultRig",
    "FollowingController",
    "GoldenCase",
    "NotifyListener",
    "Received",
    "Ticker",
    "assert_core_unaffected",
    "busy_port",
    "config_toml",
    "daemon_command",
    "dumps",
    "endpoints_in",
    "free_port",
    "free_ports",
    "launch",
    "load_golden",
    "max_gap",
    "start_daemon",
    "tcp_endpoints",
    "unsigned_copy",
    "vlad_command",
    "wait_until",
    "watchdog_gap",
    "write_fault_rig",
]
