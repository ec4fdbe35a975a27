"""One small base for the daemon's own threads: named, started once, stopped on request.

The serving thread (one per generation), the e-stop reader, the ZAP handler, the recording
tap, the cadence thread, a shadow run and the gates' neighbour watch each loop on their own
thread until they are asked to stop. :class:`Worker` holds what
they share: the thread (a daemon thread, so a thread stuck in a library call never holds
the process's exit), the stop request, a bounded join, and ``alive`` for the watchdog.
A subclass writes :meth:`Worker.run`, checks :attr:`Worker.stopping` or sleeps with
:meth:`Worker.wait` (which returns at once when a stop is requested), and overrides
:meth:`Worker.wake` when it blocks on something else (a condition variable).
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("vlad.threads")


class Worker:
    """A named background thread running :meth:`run` until :meth:`stop` (module doc)."""

    def __init__(self, name: str) -> None:
        self._stop_requested = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def run(self) -> None:
        """The thread's body; returns once :attr:`stopping` (or when its work is done)."""
        raise NotImplementedError

    def wake(self) -> None:
        """Called by :meth:`stop` after the request: wake a :meth:`run` blocked elsewhere."""

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> bool:
        """Ask the thread to stop and wait at most ``timeout`` s; True when it has ended
        (also when it never started)."""
        self._stop_requested.set()
        self.wake()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self._stop_requested.is_set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True as soon as a stop was requested."""
        return self._stop_requested.wait(seconds)

    def _main(self) -> None:
        try:
            self.run()
        except Exception:  # the subclass's loop let a bug out: the thread ends, said loudly
            log.exception("thread %s ended with an error", self._thread.name)
