"""vlad.threads.Worker: the base of the daemon's own threads."""

from __future__ import annotations

import logging
import threading

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
