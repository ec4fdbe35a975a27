"""``vlad_tools.testing``: what vlad's tests and benchmarks (and a plugin author's tests) use to
run the real thing. The top layer: nothing in vlad or its plugins imports it
(``tests/test_layers.py``).

* :mod:`vlad_tools.testing.daemon`: the tests' way to start ``vlad serve`` (the demo config of this
  checkout, ``--set`` arguments) on :mod:`vlad.daemon.child` (the daemon as a child process
  behind a real datagram notify socket: ``READY=1``, ``WATCHDOG=1``, ``STATUS=``), whose
  names are re-exported here; free loopback ports;
* :mod:`vlad_tools.testing.controller`: a simulated controller streaming at the control rate and
  recording every chunk it gets;
* :mod:`vlad_tools.testing.plugin`: an injected sensor and the fault rig, on the ``wrapped``
  backend of the gates (:mod:`vlad_tools.gates.wrapped`: faults and delays around a real one);
  :data:`PLUGIN_ENV` loads both;
* :mod:`vlad_tools.testing.releases` and :mod:`vlad_tools.testing.golden`: the demo release of this
  checkout, unsigned copies of it, benchmark payloads, the golden fixtures and the error
  budgets engines are judged by;
* :mod:`vlad_tools.testing.registry`: a real OCI registry on loopback;
* :mod:`vlad_tools.testing.lerobot`: random-weight LeRobot checkpoints (ACT, Diffusion, SmolVLA
  with its VLM folder at any size) for the importer's tests and ``scripts/smolvla_full.py``;
* :mod:`vlad_tools.testing.fuzz`: fuzz targets and input generators (``tests/testing/test_fuzz.py``,
  ``scripts/fuzz.py``);
* :func:`config_toml` (:func:`vlad.config.config_toml`) and :func:`dumps`
  (:func:`vlad.tomlwrite.dumps`): a config (or any mapping) written as TOML, so nobody
  formats a daemon config by hand;
* :mod:`vlad_tools.testing.wait`: waiting for a condition instead of sleeping.

The KServe v2 test servers are the kserve plugin's: :mod:`vlad_kserve.testing`.
"""

from vlad.config import config_toml
from vlad.daemon.child import DaemonFailed, DaemonProcess, NotifyListener, endpoints_in, launch, vlad_command
from vlad.tomlwrite import dumps
from vlad_tools.testing.controller import (
    PERIOD_S,
    WATCHDOG_ENV,
    ControllerSim,
    FollowingController,
    Ticker,
    assert_core_unaffected,
    explain_gap,
    max_gap,
    watchdog_gap,
)
from vlad_tools.testing.daemon import (
    QUIET_MONITORS,
    busy_port,
    daemon_command,
    free_port,
    free_ports,
    start_daemon,
    tcp_endpoints,
)
from vlad_tools.testing.golden import MAX_ABS, GoldenCase, load_golden
from vlad_tools.testing.plugin import PLUGIN_ENV, FaultRig, write_fault_rig
from vlad_tools.testing.releases import DEMO, DEMO_CONFIG, DEMO_KEYS, REPO, unsigned_copy
from vlad_tools.testing.wait import wait_until

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
    "Ticker",
    "assert_core_unaffected",
    "busy_port",
    "config_toml",
    "daemon_command",
    "dumps",
    "endpoints_in",
    "explain_gap",
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
