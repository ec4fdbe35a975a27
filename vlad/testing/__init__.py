"""``vlad.testing``: what vlad's tests, gates and benchmarks (and a plugin author's tests) use
to run the real thing.

* :mod:`vlad.testing.daemon`: ``vlad serve`` as a subprocess on its real sockets, from a
  typed :class:`~vlad.config.Config` or a config file, with a real datagram notify socket
  standing in for systemd (``READY=1``, ``WATCHDOG=1``, ``STATUS=``);
* :mod:`vlad.testing.toml`: a config (or any mapping) written as TOML, so nobody formats a
  daemon config by hand;
* :mod:`vlad.testing.wait`: waiting for a condition instead of sleeping.
"""

from vlad.testing.daemon import DaemonProcess, NotifyListener, launch
from vlad.testing.toml import config_toml, dumps
from vlad.testing.wait import wait_until

__all__ = ["DaemonProcess", "NotifyListener", "config_toml", "dumps", "launch", "wait_until"]
