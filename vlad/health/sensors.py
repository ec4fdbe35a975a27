"""Built-in sensors: host temperatures and memory (psutil), GPUs (NVML).

Registered through the ``vlad_sensors`` hook like any plugin's sensors. A sensor whose
library or hardware is absent is simply not offered; one that fails to read returns ``{}``.
"""

from __future__ import annotations

import os

from vlad.health.base import Sensor
from vlad.hookspecs import hookimpl


class PsutilSensor(Sensor):
    """CPU/board temperatures and host memory via psutil."""

    name = "psutil"
    interval_s = 0.5  # a hwmon scan and /proc/meminfo: ~0.25 ms of interpreter time a read (py-spy, 2 vCPUs)

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
    interval_s = 0.25  # six NVML calls per GPU; throttling still shows within a quarter second

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


@hookimpl
def vlad_sensors() -> list[Sensor]:
    sensors: list[Sensor] = [PsutilSensor()]
    try:
        sensors.append(NvmlSensor())
    except Exception:  # no nvidia-ml-py, no driver, no GPU: nothing to read
        pass
    return sensors
