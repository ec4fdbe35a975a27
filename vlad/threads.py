"""One small base for the daemon's own threads: named, started once, stopped on request.

The serving thread (one per generation), the e-stop reader, the ZAP handler, the recording
tap, the cadence thread, a shadow run and the gates' neighbour watch each loop on their own
thread until they are asked to stop. :class:`Worker` holds what
they share: the thread (a daemon thread, so a thread stuck in a library call never holds
the process's exit), the stop request, a bounded join, and ``alive`` for the watchdog.
A subclass writes :meth:`Worker.run`, checks :attr:`Worker.stopping` or sleeps with
:meth:`Worker.wait` (which returns at once when a stop is requested), registers
:meth:`Worker.wake_fd` beside its sockets when it blocks in a ZeroMQ poll (the poll then
returns at once on a stop, so a daemon's shutdown never waits out a poll's timeout per
thread), and overrides :meth:`Worker.wake` when it blocks on something else (a condition
variable).
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("vlad.threads")


class Worker:
    """A named background thread running :meth:`run` until :meth:`stop` (module doc)."""

    def __init__(self, name: str) -> None:
        self._stop_requested = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._pipe: tuple[int, int] | None = None  # wake_fd's pipe, made on first use
        self._pipe_lock = threading.Lock()  # a descriptor is written or closed, never both

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
        self._signal_pipe()
        self.wake()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        ended = not self._thread.is_alive()
        if ended:
            with self._pipe_lock:
                if self._pipe is not None:
                    for fd in self._pipe:
                        os.close(fd)
                    self._pipe = None
        return ended

    def wake_fd(self) -> int:
        """A file descriptor that turns readable once a stop is requested: a :meth:`run`
        blocked in ``zmq.Poller.poll`` registers it beside its sockets (``POLLIN``). Made on
        the first call; it lives until :meth:`stop` has seen the thread end."""
        with self._pipe_lock:
            if self._pipe is None:
                self._pipe = os.pipe()
                os.set_blocking(self._pipe[1], False)
            fd = self._pipe[0]
        if self.stopping:
            self._signal_pipe()  # a stop requested before the pipe existed
        return fd

    def _signal_pipe(self) -> None:
        with self._pipe_lock:
            if self._pipe is not None:
                try:
                    os.write(self._pipe[1], b"s")
                except BlockingIOError:
                    pass  # full: it is readable already

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
