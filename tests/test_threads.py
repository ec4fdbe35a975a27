"""vlad.threads.Worker: the base of the daemon's own threads."""

from __future__ import annotations

import logging
import os
import threading

import pytest
import zmq

from vlad.threads import Worker


class Ticker(Worker):
    """Counts until asked to stop, sleeping through :meth:`Worker.wait`."""

    def __init__(self) -> None:
        super().__init__("test-ticker")
        self.ticks = 0
        self.started = threading.Event()

    def run(self) -> None:
        self.started.set()
        while not self.wait(10.0):  # a stop must cut this sleep short
            self.ticks += 1


def test_a_worker_runs_on_its_named_thread_and_stops_at_once():
    w = Ticker()
    assert not w.alive and not w.stopping
    w.start()
    assert w.started.wait(5)
    assert w.alive and any(t.name == "test-ticker" and t.daemon for t in threading.enumerate())
    assert w.stop(5.0) is True  # well before the 10 s sleep would end
    assert not w.alive and w.stopping and w.ticks == 0


def test_stop_before_start_is_harmless():
    assert Ticker().stop(0.1) is True


class Waiter(Worker):
    """Blocks on a condition variable: only :meth:`wake` gets it out."""

    def __init__(self) -> None:
        super().__init__("test-waiter")
        self.cond = threading.Condition()
        self.waiting = threading.Event()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def run(self) -> None:
        with self.cond:
            while not self.stopping:
                self.waiting.set()
                self.cond.wait()


def test_wake_reaches_a_run_blocked_elsewhere():
    w = Waiter()
    w.start()
    assert w.waiting.wait(5)
    assert w.stop(5.0) is True


class Broken(Worker):
    def run(self) -> None:
        raise RuntimeError("a bug")


def test_a_run_that_raises_ends_the_thread_and_is_logged(caplog):
    w = Broken("test-broken")
    with caplog.at_level(logging.ERROR, logger="vlad.threads"):
        w.start()
        w._thread.join(5)
    assert not w.alive  # what the watchdog checks
    assert "test-broken ended with an error" in caplog.text and "a bug" in caplog.text


class Poller(Worker):
    """Blocks in a ZeroMQ poll with a long timeout, its stop descriptor beside the socket."""

    def __init__(self, ctx: zmq.Context, register_late: threading.Event | None = None) -> None:
        super().__init__("test-poller")
        self.sock = ctx.socket(zmq.PULL)
        self.sock.bind("inproc://test-poller")
        self.register_late = register_late  # wait for it before taking the descriptor
        self.polling = threading.Event()
        self.polls = 0

    def run(self) -> None:
        if self.register_late is not None:
            self.register_late.wait(5)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.wake_fd(), zmq.POLLIN)
        while True:  # polls at least once, stop requested or not
            self.polling.set()
            self.polls += 1
            poller.poll(60_000)  # a stop must cut this poll short
            if self.stopping:
                return


def test_a_stop_wakes_a_zeromq_poll_and_closes_the_descriptor():
    ctx = zmq.Context()
    w = Poller(ctx)
    try:
        w.start()
        assert w.polling.wait(5)
        fd = w._pipe[0]
        assert w.stop(5.0) is True  # well before the 60 s poll would end
        assert w.polls == 1 and w._pipe is None
        with pytest.raises(OSError):
            os.fstat(fd)  # closed once the thread ended
    finally:
        _close(ctx, w)


def test_a_stop_before_the_descriptor_exists_still_wakes_the_poll():
    ctx = zmq.Context()
    late = threading.Event()
    w = Poller(ctx, register_late=late)
    try:
        w.start()
        w._stop_requested.set()  # stop()'s request, before run() has taken the descriptor
        late.set()
        assert w.stop(5.0) is True and w.polls == 1  # the descriptor was readable from the start
    finally:
        _close(ctx, w)


def _close(ctx: zmq.Context, w: Poller) -> None:
    """The socket and context, once the thread has ended (a failed test leaves them: a
    socket is never closed under a thread polling it, and term would wait for it)."""
    if not w.alive:
        w.sock.close(0)
        ctx.term()
