"""A simulated robot controller on the daemon's sockets that records every chunk it gets.

:class:`ControllerSim` streams one observation (a golden case's raw observation, see
:mod:`vlad.testing.golden`) and one heartbeat every control period on its own thread, and
keeps every chunk that arrives as a :class:`Received`, stamped with this process's
``time.monotonic()``. The fault, deploy and flood tests and ``scripts/bench_swap.py`` judge
what a robot would have got from that record: the longest gap between chunks
(:func:`max_gap`), where each chunk came from, what it commanded.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PERIOD_S = 0.02  # the demo contract's control period


@dataclass
class Received:
    """One chunk as the controller got it."""

    t: float  # time.monotonic() at arrival, in this process
    source: str
    state: str
    actions: np.ndarray
    interventions: tuple[str, ...]
    t_issue_ns: int = 0  # the daemon's CLOCK_MONOTONIC, comparable with time.monotonic_ns() here
    obs_seq: int = 0


@dataclass
class ControllerSim:
    """Publishes observations and heartbeats every :data:`PERIOD_S` and records every chunk.

    ``case`` is a golden case (``case["raw"]`` is sent); the flags change what is sent while
    it runs: no observations, no heartbeats, observations a second old (``stale``), or an
    image of the wrong shape (``bad_shape``).
    """

    client: Any  # a vlad.client.Client
    case: Any  # a vlad.testing.golden.GoldenCase
    send_obs: bool = True
    send_heartbeat: bool = True
    stale: bool = False
    bad_shape: bool = False
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vlad-controller-sim", daemon=True)

    def start(self) -> ControllerSim:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        raw = self.case["raw"]
        next_t = time.monotonic()
        seq = 0
        while not self._stop.is_set():
            seq += 1
            if self.send_obs:
                t_sensor = time.monotonic_ns() - (int(1e9) if self.stale else 0)
                img = raw.images["overhead"]
                if self.bad_shape:
                    img = np.zeros((32, 32, 3), np.uint8)
                self.client.publish_observation(
                    {"overhead": img}, proprio=raw.proprio, instruction=raw.instruction, seq=seq, t_sensor_ns=t_sensor
                )
            if self.send_heartbeat:
                self.client.heartbeat()
            next_t += PERIOD_S
            while True:
                chunk = self.client.recv_actions(timeout_ms=max(0, int((next_t - time.monotonic()) * 1000)))
                if chunk is None:
                    break
                self.received.append(
                    Received(
                        time.monotonic(),
                        chunk.source,
                        chunk.state,
                        chunk.actions.copy(),
                        chunk.interventions,
                        chunk.t_issue_ns,
                        chunk.obs_seq,
                    )
                )
                if time.monotonic() >= next_t:
                    break

    def since(self, t0: float) -> list[Received]:
        """The chunks received at or after ``t0`` (``time.monotonic()``)."""
        return [r for r in list(self.received) if r.t >= t0]


def max_gap(chunks: list[Received]) -> float:
    """The longest time (s) between two consecutive chunks; inf with fewer than two."""
    ts = [c.t for c in chunks]
    return float(max(np.diff(ts))) if len(ts) > 1 else float("inf")
