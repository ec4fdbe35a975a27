"""Health monitors: the interface, the sensors they read, and the built-in set.

A :class:`Monitor` looks at a :class:`HealthView` (a snapshot the supervisor builds every
monitor tick) and returns :class:`Finding` objects for what is wrong right now. The
supervisor decides what a finding means (see :mod:`vlad.supervisor`): its ``scope`` says
whose fault it is, which decides between degrading, falling back and quarantining.

Monitors and sensors are plugins: ``vlad_monitors(config)`` and ``vlad_sensors()`` hooks.
The built-in ones below are registered through the same hooks (:mod:`vlad.plugins`), and
a robot integrator adds theirs the same way (a board temperature, a PLC heartbeat).

Thresholds come from the contract (timing, bounds) and the ``[monitors]`` config table;
the defaults are in :class:`MonitorThresholds` and ``docs/health.md``.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from vlad.hookspecs import hookimpl
from vlad.processing import sha256_file

Severity = Literal["warn", "fault"]
# policy: the model misbehaves (quarantined until an operator or a new release)
# system: the machine (heat, memory, deadlines)   controller: heartbeats   input: sensor data
Scope = Literal["policy", "system", "controller", "input"]


@dataclass(frozen=True)
class Finding:
    monitor: str
    code: str
    severity: Severity
    scope: Scope
    message: str
    value: float | None = None
    threshold: float | None = None
    policy: str | None = None  # for scope "policy": which policy of the chain produced it

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class MonitorThresholds:
    """Defaults for the ``[monitors]`` config table (documented in docs/health.md)."""

    cpu_temp_warn_c: float = 85.0
    cpu_temp_fault_c: float = 95.0
    gpu_temp_warn_c: float = 83.0
    gpu_temp_fault_c: float = 90.0
    min_available_memory_mb: float = 512.0  # host memory left for everything else
    max_rss_mb: float = 4096.0  # vlad's own resident memory
    heartbeat_missing_periods: int = 5  # a controller silent this long is gone
    sensor_stall_periods: int = 5  # no observation for this long: the sensor stream stalled
    stale_fraction_warn: float = 0.2  # of the observations in the last monitor window
    deadline_miss_fraction_warn: float = 0.05
    p99_budget_fraction: float = 1.0  # rolling e2e p99 above deadline * this: warn
    rejected_per_window_fault: int = 1  # bad-shape/dtype observations per monitor tick: input fault
    artifact_check_interval_s: float = 5.0

    @classmethod
    def from_config(cls, table: Mapping[str, Any]) -> MonitorThresholds:
        known = {f.name for f in fields(cls)}
        unknown = set(table) - known - {"enabled"}
        if unknown:
            from vlad.config import ConfigError

            raise ConfigError(f"unknown key(s) in [monitors]: {sorted(unknown)}; known: {sorted(known)}")
        return cls(**{k: type(getattr(cls(), k))(v) for k, v in table.items() if k in known})


@dataclass
class HealthView:
    """What monitors may look at; built by the supervisor, read-only by convention."""

    now_ns: int
    period_ns: int
    deadline_ns: int
    thresholds: MonitorThresholds
    counters: Mapping[str, int]  # cumulative
    window: Mapping[str, int]  # increase since the previous monitor tick
    latency: Mapping[str, Mapping[str, float]]  # LatencyStats.summary()
    last_observation_ns: int
    last_heartbeat_ns: int
    heartbeat_seen: bool
    in_flight_since_ns: int
    in_flight_policy: str | None
    hang_timeout_ns: int
    release_policy: str  # the chain name of the release being served ("release:<id>")
    readings: Mapping[str, float]  # from every sensor, "temperature.cpu.0" -> 61.0 ...
    release_dir: Path | None = None
    artifacts: Mapping[str, str] = field(default_factory=dict)  # relative path -> sha256


class Monitor(abc.ABC):
    """One health check. ``check`` must be cheap; it runs every monitor tick (~50 ms)."""

    name: str = "?"

    @abc.abstractmethod
    def check(self, view: HealthView) -> list[Finding]:
        """Findings for what is wrong now; an empty list means healthy."""


class Sensor(abc.ABC):
    """A source of named readings (``temperature.<where>`` in °C, ``memory.<what>`` in bytes)."""

    name: str = "?"

    @abc.abstractmethod
    def read(self) -> dict[str, float]:
        """Current readings; an unreadable sensor returns ``{}`` rather than raising."""


# ---------------------------------------------------------------------------------------
# Built-in sensors
# ---------------------------------------------------------------------------------------


class PsutilSensor(Sensor):
    """CPU/board temperatures and host memory via psutil."""

    name = "psutil"

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._proc = psutil.Process(os.getpid())

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        try:
            temps = self._psutil.sensors_temperatures() if hasattr(self._psutil, "sensors_temperatures") else {}
        except OSError:
            temps = {}
        for chip, entries in (temps or {}).items():
            for i, t in enumerate(entries):
                if t.current is not None:
                    out[f"temperature.cpu.{chip}.{t.label or i}"] = float(t.current)
        vm = self._psutil.virtual_memory()
        out["memory.available_bytes"] = float(vm.available)
        out["memory.rss_bytes"] = float(self._proc.memory_info().rss)
        return out


class NvmlSensor(Sensor):
    """GPU temperature, clocks, power, throttle reasons and memory via NVML (nvidia-ml-py)."""

    name = "nvml"

    def __init__(self) -> None:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def read(self) -> dict[str, float]:
        n = self._nvml
        out: dict[str, float] = {}
        for i, h in enumerate(self._handles):
            try:
                out[f"temperature.gpu.{i}"] = float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
                mem = n.nvmlDeviceGetMemoryInfo(h)
                out[f"memory.gpu.{i}.used_bytes"] = float(mem.used)
                out[f"memory.gpu.{i}.total_bytes"] = float(mem.total)
                out[f"gpu.{i}.sm_clock_mhz"] = float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
                out[f"gpu.{i}.power_w"] = n.nvmlDeviceGetPowerUsage(h) / 1000.0
                out[f"gpu.{i}.throttle_reasons"] = float(n.nvmlDeviceGetCurrentClocksThrottleReasons(h))
            except n.NVMLError:
                continue
        return out


# ---------------------------------------------------------------------------------------
# Built-in monitors
# ---------------------------------------------------------------------------------------


class ThermalMonitor(Monitor):
    name = "thermal"

    def check(self, v: HealthView) -> list[Finding]:
        t = v.thresholds
        out = []
        for key, value in v.readings.items():
            if not key.startswith("temperature."):
                continue
            warn, fault = (t.gpu_temp_warn_c, t.gpu_temp_fault_c) if key.startswith("temperature.gpu") else (
                t.cpu_temp_warn_c, t.cpu_temp_fault_c)
            if value >= fault:
                out.append(Finding(self.name, "temperature_high", "fault", "system", f"{key} at {value:.1f} °C", value, fault))
            elif value >= warn:
                out.append(Finding(self.name, "temperature_warm", "warn", "system", f"{key} at {value:.1f} °C", value, warn))
        return out


class MemoryMonitor(Monitor):
    name = "memory"

    def check(self, v: HealthView) -> list[Finding]:
        t = v.thresholds
        out = []
        # Any sensor may report available memory (host, a cgroup limit, a board's shared
        # CPU/GPU pool): the tightest one counts.
        avail = min((x for k, x in v.readings.items() if k.startswith("memory.") and k.endswith("available_bytes")),
                    default=None)
        if avail is not None and avail < t.min_available_memory_mb * 2**20:
            out.append(Finding(self.name, "memory_pressure", "fault", "system",
                               f"only {avail / 2**20:.0f} MiB host memory available", avail / 2**20, t.min_available_memory_mb))
        rss = v.readings.get("memory.rss_bytes")
        if rss is not None and rss > t.max_rss_mb * 2**20:
            out.append(Finding(self.name, "rss_high", "warn", "system", f"vlad uses {rss / 2**20:.0f} MiB", rss / 2**20, t.max_rss_mb))
        return out


class HeartbeatMonitor(Monitor):
    """A controller that stopped sending heartbeats is gone (only after it sent one)."""

    name = "heartbeat"

    def check(self, v: HealthView) -> list[Finding]:
        if not v.heartbeat_seen:
            return []
        limit = v.thresholds.heartbeat_missing_periods * v.period_ns
        age = v.now_ns - v.last_heartbeat_ns
        if age > limit:
            return [Finding(self.name, "heartbeat_lost", "fault", "controller",
                            f"no controller heartbeat for {age / 1e6:.0f} ms", age / 1e6, limit / 1e6)]
        return []


class SensorStreamMonitor(Monitor):
    """Observations stopped arriving (after they had started), or arrive stale."""

    name = "sensors"

    def check(self, v: HealthView) -> list[Finding]:
        out = []
        t = v.thresholds
        if v.last_observation_ns:
            limit = t.sensor_stall_periods * v.period_ns
            age = v.now_ns - v.last_observation_ns
            if age > limit:
                out.append(Finding(self.name, "sensor_stall", "fault", "input",
                                   f"no observation for {age / 1e6:.0f} ms", age / 1e6, limit / 1e6))
        seen = v.window.get("observations", 0)
        stale = v.window.get("stale", 0)
        if seen >= 3 and stale / seen > t.stale_fraction_warn:
            out.append(Finding(self.name, "stale_observations", "fault", "input",
                               f"{stale} of {seen} observations stale", stale / seen, t.stale_fraction_warn))
        bad = v.window.get("rejected_shape", 0)
        if bad >= t.rejected_per_window_fault:
            out.append(Finding(self.name, "input_out_of_contract", "fault", "input",
                               f"{bad} observations with shapes or dtypes outside the contract", bad, t.rejected_per_window_fault))
        nonfinite = v.window.get("nonfinite_inputs", 0)
        if nonfinite:
            out.append(Finding(self.name, "nonfinite_input", "warn", "input", f"{nonfinite} observations with NaN/Inf", nonfinite))
        return out


class PolicyOutputMonitor(Monitor):
    """NaN/Inf or out-of-bounds actions, backend exceptions and hangs: the policy is at fault.

    Counters are kept per policy (``nonfinite:<policy>``), so a chunk still in flight from a
    policy that was just swapped out is blamed on it, not on its successor.
    """

    name = "policy"
    CODES = {"nonfinite": "nonfinite_output", "out_of_bounds": "out_of_bounds_output", "backend_errors": "backend_exception"}

    def check(self, v: HealthView) -> list[Finding]:
        out = []
        for key, n in v.window.items():
            kind, _, policy = key.partition(":")
            code = self.CODES.get(kind)
            if code and policy and n > 0:
                out.append(Finding(self.name, code, "fault", "policy", f"{policy}: {n} × {code.replace('_', ' ')}", n,
                                   policy=policy))
        if v.in_flight_since_ns and v.now_ns - v.in_flight_since_ns > v.hang_timeout_ns:
            age = (v.now_ns - v.in_flight_since_ns) / 1e6
            out.append(Finding(self.name, "backend_hang", "fault", "policy",
                               f"{v.in_flight_policy}: inference running for {age:.0f} ms", age,
                               v.hang_timeout_ns / 1e6, policy=v.in_flight_policy))
        return out


class DeadlineMonitor(Monitor):
    name = "deadline"

    def check(self, v: HealthView) -> list[Finding]:
        out = []
        t = v.thresholds
        published = v.window.get("published", 0)
        misses = v.window.get("deadline_misses", 0)
        if published >= 5 and misses / published > t.deadline_miss_fraction_warn:
            out.append(Finding(self.name, "deadline_misses", "warn", "system",
                               f"{misses} of {published} cycles missed the {v.deadline_ns / 1e6:g} ms deadline",
                               misses / published, t.deadline_miss_fraction_warn))
        e2e = v.latency.get("e2e")
        budget = v.deadline_ns / 1e6 * t.p99_budget_fraction
        if e2e and e2e["count"] >= 50 and e2e["p99"] > budget:
            out.append(Finding(self.name, "p99_over_budget", "warn", "system",
                               f"rolling e2e p99 {e2e['p99']:.2f} ms over the {budget:.2f} ms budget", e2e["p99"], budget))
        return out


class ArtifactMonitor(Monitor):
    """Re-hashes the release artifacts on disk: a file changed under a running daemon means
    the release on disk no longer is the release being served."""

    name = "artifacts"

    def __init__(self) -> None:
        self._last_ns = 0
        self._bad: list[str] = []

    def check(self, v: HealthView) -> list[Finding]:
        if v.release_dir is None or not v.artifacts:
            return []
        if v.now_ns - self._last_ns >= v.thresholds.artifact_check_interval_s * 1e9:
            self._last_ns = v.now_ns
            self._bad = [rel for rel, digest in v.artifacts.items() if _sha256(v.release_dir / rel) != digest]
        return [Finding(self.name, "artifact_modified", "fault", "policy", f"release artifact {rel} changed on disk",
                        policy=v.release_policy) for rel in self._bad]


def _sha256(path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError:
        return "unreadable"


# ---------------------------------------------------------------------------------------
# Registration: the built-ins go through the same hooks as any plugin
# ---------------------------------------------------------------------------------------


@hookimpl
def vlad_monitors(config: dict) -> list[Monitor]:
    return [ThermalMonitor(), MemoryMonitor(), HeartbeatMonitor(), SensorStreamMonitor(), PolicyOutputMonitor(),
            DeadlineMonitor(), ArtifactMonitor()]


@hookimpl
def vlad_sensors() -> list[Sensor]:
    sensors: list[Sensor] = [PsutilSensor()]
    try:
        sensors.append(NvmlSensor())
    except Exception:  # no nvidia-ml-py, no driver, no GPU: nothing to read
        pass
    return sensors
