"""The built-in health monitors, registered through the ``vlad_monitors`` hook.

Each reads the typed :class:`~vlad.health.base.HealthView` and returns findings; the
thresholds come from the contract (timing) and the ``[monitors]`` config table
(:class:`vlad.config.MonitorsConfig`, defaults in docs/health.md).
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path

from vlad.files import HASH_BLOCK, open_regular, sha256_file
from vlad.health.base import Finding, HealthView, Monitor
from vlad.hookspecs import hookimpl
from vlad.serving.counters import IntakeCounts, PublishCounts
from vlad.snapshot import split_readings


class ThermalMonitor(Monitor):
    name = "thermal"

    def check(self, v: HealthView) -> list[Finding]:
        t = v.thresholds
        out = []
        temperatures, _ = split_readings(v.readings)
        for sensor, value in temperatures.items():
            key = f"temperature.{sensor}"
            gpu = sensor.startswith("gpu")
            warn, fault = (t.gpu_temp_warn_c, t.gpu_temp_fault_c) if gpu else (t.cpu_temp_warn_c, t.cpu_temp_fault_c)
            if value >= fault:
                out.append(
                    Finding(self.name, "temperature_high", "fault", "system", f"{key} at {value:.1f} °C", value, fault)
                )
            elif value >= warn:
                out.append(
                    Finding(self.name, "temperature_warm", "warn", "system", f"{key} at {value:.1f} °C", value, warn)
                )
        return out


class MemoryMonitor(Monitor):
    name = "memory"

    def check(self, v: HealthView) -> list[Finding]:
        t = v.thresholds
        out = []
        # Any sensor may report available memory (host, a cgroup limit, a board's shared
        # CPU/GPU pool): the tightest one counts.
        _, memory = split_readings(v.readings)
        avail = min((x for kind, x in memory.items() if kind.endswith("available")), default=None)
        if avail is not None and avail < t.min_available_memory_mb * 2**20:
            out.append(
                Finding(
                    self.name,
                    "memory_pressure",
                    "fault",
                    "system",
                    f"only {avail / 2**20:.0f} MiB host memory available",
                    avail / 2**20,
                    t.min_available_memory_mb,
                )
            )
        rss = memory.get("rss")
        if rss is not None and rss > t.max_rss_mb * 2**20:
            out.append(
                Finding(
                    self.name,
                    "rss_high",
                    "warn",
                    "system",
                    f"vlad uses {rss / 2**20:.0f} MiB",
                    rss / 2**20,
                    t.max_rss_mb,
                )
            )
        return out


class HeartbeatMonitor(Monitor):
    """Each controller that sent a heartbeat must keep sending them (vlad.health.liveness):
    one whose heartbeats stopped is gone, whatever the other controllers do. Until it is
    back, or said goodbye (``bye``), the hold posture serves."""

    name = "heartbeat"

    def check(self, v: HealthView) -> list[Finding]:
        limit = v.thresholds.heartbeat_missing_periods * v.period_ns
        out = []
        read = v.read_until_ns  # a heartbeat may wait unread behind a long inference
        for name, beat in sorted(v.controllers.items()):
            age = read - beat.last_ns
            if age > limit:
                who = f"controller {name!r}" if name else "the controller (no client name)"
                out.append(
                    Finding(
                        self.name,
                        "heartbeat_lost",
                        "fault",
                        "controller",
                        f"no heartbeat from {who} for {age / 1e6:.0f} ms",
                        age / 1e6,
                        limit / 1e6,
                        subject=name,
                    )
                )
        return out


class SensorStreamMonitor(Monitor):
    """Observations stopped arriving, or arrive stale or out of contract, at a sustained rate.

    Judged over ``input_window_s`` (a sliding window of monitor ticks) and only once
    ``min_input_events`` observations arrived in it: one stale or malformed message is
    counted, not an outage, so a second process in the ``vlad`` group cannot deny service
    by sending the odd bad message.
    """

    name = "sensors"

    def __init__(self) -> None:
        self._history: deque[tuple[int, IntakeCounts, int]] = deque()

    def check(self, v: HealthView) -> list[Finding]:
        out = []
        t = v.thresholds
        streaming_since = self._streaming_since(v)
        if v.last_observation_ns and streaming_since is not None:
            limit = t.sensor_stall_periods * v.period_ns
            age = v.read_until_ns - max(v.last_observation_ns, streaming_since)
            if age > limit:
                out.append(
                    Finding(
                        self.name,
                        "sensor_stall",
                        "fault",
                        "input",
                        f"no observation for {age / 1e6:.0f} ms",
                        age / 1e6,
                        limit / 1e6,
                    )
                )
        stale_total = sum(c.stale for c in v.policies.values())
        self._history.append((v.now_ns, v.intake.snapshot(), stale_total))
        window_ns = int(t.input_window_s * 1e9)
        while len(self._history) > 1 and v.now_ns - self._history[0][0] > window_ns:
            self._history.popleft()
        _, first, stale_first = self._history[0]
        d = v.intake.minus(first)
        seen = d.observations + d.input_rejected
        if seen >= t.min_input_events:
            stale = stale_total - stale_first
            if stale / seen > t.stale_fraction_fault:
                out.append(
                    Finding(
                        self.name,
                        "stale_observations",
                        "fault",
                        "input",
                        f"{stale} of {seen} observations stale in the last {t.input_window_s:g} s",
                        stale / seen,
                        t.stale_fraction_fault,
                    )
                )
            # A warning, not a fault: while valid observations keep arriving the policy
            # serves them (junk next to them changes nothing); when they stop, the stall
            # check above moves to the hold posture.
            if d.input_rejected / seen > t.rejected_fraction_warn:
                out.append(
                    Finding(
                        self.name,
                        "input_out_of_contract",
                        "warn",
                        "input",
                        f"{d.input_rejected} of {seen} observations refused in the last "
                        f"{t.input_window_s:g} s ({_top(d.rejected)})",
                        d.input_rejected / seen,
                        t.rejected_fraction_warn,
                    )
                )
        return out

    @staticmethod
    def _streaming_since(v: HealthView) -> int | None:
        """Since when silence on the observation socket is a stall (None: it is not). Unless
        every live controller said it asks only when it needs a chunk (``cadence =
        "request"``), it is, from when the first of those that stream declared it (one that
        streams again after asking by request owes an observation from then on); with none
        live, unless the last one said goodbye after the last observation (it left)."""
        limit = v.thresholds.heartbeat_missing_periods * v.period_ns
        live = [b for b in v.controllers.values() if v.read_until_ns - b.last_ns <= limit]
        if not live:
            return 0 if v.last_observation_ns > v.controllers_left_ns else None
        streaming = [b.since_ns for b in live if b.cadence != "request"]
        return min(streaming) if streaming else None


def _top(reasons: dict[str, int], n: int = 3) -> str:
    items = sorted(((k, c) for k, c in reasons.items() if c > 0), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {c}" for k, c in items) or "no reason recorded"


class PolicyOutputMonitor(Monitor):
    """NaN/Inf or out-of-bounds actions, backend exceptions and hangs: the policy is at fault.

    Counters are kept per policy, so a chunk still in flight from a policy that was just
    swapped out is blamed on it, not on its successor. A remote backend that cannot be
    reached is not the policy's fault: that is a system finding (it comes back by itself).
    """

    name = "policy"
    FAULTS = (
        ("nonfinite_outputs", "nonfinite_output"),
        ("out_of_bounds", "out_of_bounds_output"),
        ("backend_errors", "backend_exception"),
        ("cycle_errors", "cycle_error"),  # vlad's own code failed on this policy's cycle
    )

    def check(self, v: HealthView) -> list[Finding]:
        out = []
        for policy, counts in v.policies_window.items():
            for attr, code in self.FAULTS:
                n = getattr(counts, attr)
                if n > 0:
                    out.append(
                        Finding(
                            self.name,
                            code,
                            "fault",
                            "policy",
                            f"{policy}: {n} × {code.replace('_', ' ')}",
                            n,
                            policy=policy,
                        )
                    )
            if counts.remote_errors > 0 and policy == v.serving:
                out.append(
                    Finding(
                        self.name,
                        "remote_unavailable",
                        "fault",
                        "system",
                        f"{policy}: {counts.remote_errors} request(s) to its server failed or were late",
                        counts.remote_errors,
                        policy=policy,
                        # the link's own state (lost until its prober sees it answer in time
                        # again) is the hysteresis: no extra window on top
                        healthy_window_ns=0,
                    )
                )
        f = v.in_flight
        if f is not None and v.now_ns - f.since_ns > v.hang_timeout_ns:
            age = (v.now_ns - f.since_ns) / 1e6
            out.append(
                Finding(
                    self.name,
                    "backend_hang",
                    "fault",
                    "policy",
                    f"{f.policy}: inference running for {age:.0f} ms",
                    age,
                    v.hang_timeout_ns / 1e6,
                    policy=f.policy,
                )
            )
        return out


class DeadlineMonitor(Monitor):
    """Deadline misses as a rate over the sliding ``input_window_s`` window, and the rolling
    e2e p99 against the deadline budget (both warnings).

    A window of monitor ticks, not one tick: at 50 Hz control and a 20 Hz monitor a tick
    sees two or three chunks, never the :data:`MIN_CYCLES` a rate needs."""

    name = "deadline"
    MIN_CYCLES = 5  # chunks in the window before the miss rate means anything

    def __init__(self) -> None:
        self._history: deque[tuple[int, PublishCounts]] = deque()

    def check(self, v: HealthView) -> list[Finding]:
        out = []
        t = v.thresholds
        self._history.append((v.now_ns, v.publish.snapshot()))
        window_ns = int(t.input_window_s * 1e9)
        while len(self._history) > 1 and v.now_ns - self._history[0][0] > window_ns:
            self._history.popleft()
        d = v.publish.minus(self._history[0][1])
        published, misses = d.policy_chunks, d.deadline_misses
        if published >= self.MIN_CYCLES and misses / published > t.deadline_miss_fraction_warn:
            out.append(
                Finding(
                    self.name,
                    "deadline_misses",
                    "warn",
                    "system",
                    f"{misses} of {published} cycles missed the {v.deadline_ns / 1e6:g} ms deadline "
                    f"in the last {t.input_window_s:g} s",
                    misses / published,
                    t.deadline_miss_fraction_warn,
                )
            )
        e2e = v.latency.get("e2e")
        budget = v.deadline_ns / 1e6 * t.p99_budget_fraction
        if e2e and e2e["count"] >= 50 and e2e["p99"] > budget:
            out.append(
                Finding(
                    self.name,
                    "p99_over_budget",
                    "warn",
                    "system",
                    f"rolling e2e p99 {e2e['p99']:.2f} ms over the {budget:.2f} ms budget",
                    e2e["p99"],
                    budget,
                )
            )
        return out


# Release bytes re-hashed per health tick at most (one read block). Re-hashing every file in
# one tick took ~10 ms of CPU every check interval on the 4 MB demo model, in one burst beside
# the serving thread, and seconds on a multi-GB model, during which the health tick was stalled.
ARTIFACT_BYTES_PER_TICK = HASH_BLOCK


class ArtifactMonitor(Monitor):
    """Watches the release artifacts on disk: a file changed under a running daemon means
    the release on disk no longer is the release being served.

    Every ``artifact_check_interval_s`` each file's identity (size, inode, modification and
    change times) is compared with the previous look, and a file whose identity changed is
    hashed at once. The contents are also re-hashed continuously, at most
    :data:`ARTIFACT_BYTES_PER_TICK` per health tick, a pass over every file starting at most
    every interval: a change that kept the identity (times set back) is found within a pass."""

    name = "artifacts"

    def __init__(self) -> None:
        self._folder: Path | None = None  # the release looked at
        self._artifacts: Mapping[str, str] = {}
        self._start()

    def _start(self) -> None:
        self._last_ns = 0
        self._bad: dict[str, bool] = {}
        self._identity: dict[str, tuple[int, ...] | None] = {}
        self._queue: list[str] = []  # files the content pass has still to hash
        self._job: tuple[str, Iterator[int | str]] | None = None  # the file being hashed

    def check(self, v: HealthView) -> list[Finding]:
        if v.release_dir is None or not v.artifacts:
            return []
        folder, artifacts = v.release_dir, v.artifacts
        if folder != self._folder or (artifacts is not self._artifacts and artifacts != self._artifacts):
            self._start()  # another release serves (a deploy): look at its files from scratch
            self._folder, self._artifacts = folder, artifacts
        if v.now_ns - self._last_ns >= v.thresholds.artifact_check_interval_s * 1e9:
            self._last_ns = v.now_ns
            for rel, digest in artifacts.items():
                ident = _identity(folder / rel)
                if rel in self._identity and ident != self._identity[rel]:
                    self._bad[rel] = _sha256(folder / rel) != digest
                    if self._job is not None and self._job[0] == rel:
                        self._job = None  # hashed whole just now
                self._identity[rel] = ident
            if self._job is None and not self._queue:
                self._queue = list(artifacts)  # the next content pass
        budget = ARTIFACT_BYTES_PER_TICK
        while budget > 0 and (self._job is not None or self._queue):
            if self._job is None:
                rel = self._queue.pop(0)
                self._job = (rel, _hash_steps(folder / rel))
            rel, steps = self._job
            step = next(steps)
            if isinstance(step, str):
                self._bad[rel] = step != artifacts[rel]
                self._job = None
            else:
                budget -= step
        return [
            Finding(
                self.name,
                "artifact_modified",
                "fault",
                "policy",
                f"release artifact {rel} changed on disk",
                policy=v.release,
            )
            for rel, bad in self._bad.items()
            if bad
        ]


def _sha256(path) -> str:
    try:
        return sha256_file(path)
    except Exception:  # missing, not a regular file, unreadable: all mean "changed"
        return "unreadable"


def _identity(path: Path) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns)


def _hash_steps(path: Path) -> Iterator[int | str]:
    """Hash ``path`` a block per step: yields each block's byte count, then the hex sha256
    ("unreadable": missing, not a regular file, a read error)."""
    try:
        fd = open_regular(path)
    except Exception:
        yield "unreadable"
        return
    try:
        h = hashlib.sha256()
        buf = bytearray(HASH_BLOCK)
        view = memoryview(buf)
        while n := os.readv(fd, [buf]):
            h.update(view[:n])  # releases the GIL
            yield n
    except OSError:
        yield "unreadable"
        return
    finally:
        os.close(fd)
    yield h.hexdigest()


BUILTIN: tuple[type[Monitor], ...] = (
    ThermalMonitor,
    MemoryMonitor,
    HeartbeatMonitor,
    SensorStreamMonitor,
    PolicyOutputMonitor,
    DeadlineMonitor,
    ArtifactMonitor,
)


@hookimpl
def vlad_monitors(config: dict) -> list[Monitor]:
    return [cls() for cls in BUILTIN]
