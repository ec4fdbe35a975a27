"""Measurement conditions: without them, latency and memory figures are not comparable.

Captured at the start of a gate run and written beside every figure: CPU model and cores,
frequency governor, GPU model, clocks and temperature (where there is one), temperatures,
load average and other busy processes, memory, kernel and the versions of everything that
runs the policy.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vlad.threads import Worker

# The distributions a figure depends on (those installed are recorded): the serving stack,
# and the GPU stack under the names its wheels carry per CUDA major.
VERSIONED = (
    "vlad",
    "numpy",
    "torch",
    "onnxruntime",
    "onnxruntime-gpu",
    "tensorrt",
    "tensorrt-cu13",
    "tensorrt-cu12",
    "cuda-python",
    "cuda-bindings",
    "nvidia-cudnn-cu13",
    "nvidia-cudnn-cu12",
    "pyzmq",
    "mujoco",
    "tokenizers",
)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else what platform knows)."""
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def gpus() -> list[dict[str, Any]] | str:
    """Model, clocks, temperature, power and memory of each NVIDIA GPU (nvidia-smi), or why not."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no NVIDIA GPU (nvidia-smi not found)"
    query = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,memory.used,memory.total,pstate"
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"
    if out.returncode != 0:
        return f"nvidia-smi failed: {out.stderr.strip() or out.returncode}"
    keys = query.split(",")
    return [
        dict(zip(keys, (v.strip() for v in line.split(",")), strict=False)) for line in out.stdout.strip().splitlines()
    ]


def busy_processes(sample_s: float = 0.3, threshold: float = 5.0) -> list[str]:
    """Other processes using the CPU right now (sampled over ``sample_s``): a shared
    machine skews tail latency, so the report names who else was running."""
    import psutil

    procs = list(psutil.process_iter(["pid", "name"]))
    for p in procs:
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(sample_s)
    busy = []
    for p in procs:
        try:
            pct = p.cpu_percent(None)
        except psutil.Error:
            continue
        if pct >= threshold and p.pid != os.getpid():
            busy.append(f"{p.info['name']} ({pct:.0f}%)")
    return busy


def temperatures() -> dict[str, list[float]] | str:
    """Temperature sensors readable here, per chip (°C)."""
    import psutil

    try:
        found = {
            chip: [round(e.current, 1) for e in entries]
            for chip, entries in (psutil.sensors_temperatures() or {}).items()
        }
    except (AttributeError, OSError):
        found = {}
    return found or "no sensors readable"


@contextlib.contextmanager
def cpu_hog() -> Iterator[subprocess.Popen]:
    """A process spinning one core for the duration: the "busy machine" condition of the
    closed-loop and performance gates and the serving benchmark."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield spinner
    finally:
        spinner.kill()
        spinner.wait()


def capture() -> dict[str, Any]:
    """The conditions now, as a JSON-able dict."""
    import psutil

    governor = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") or "unreadable"
    freq = psutil.cpu_freq()
    return {
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "cpu": cpu_model(),
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "governor": governor,
        "cpu_mhz": round(freq.current) if freq else "unreadable",
        "gpu": gpus(),
        "temperatures_c": temperatures(),
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "other_busy_processes": busy_processes(),
        "memory_total_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "memory_available_gib": round(psutil.virtual_memory().available / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": {d: v for d in VERSIONED if (v := version(d))},
    }


def capture_after() -> dict[str, Any]:
    """What may have changed during a run: load, other busy processes, temperatures.

    A neighbour that started mid-run shows up here, not in :func:`capture`.
    """
    return {
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "other_busy_processes": busy_processes(),
        "temperatures_c": temperatures(),
        "gpu": gpus(),
    }


class NeighbourWatch(Worker):
    """Samples, while a run goes on, which processes outside this one's own tree (the gate,
    its daemons, its CPU hog) use the CPU: a neighbour that comes and goes mid-run skews
    tail latency and would otherwise stay invisible in the report."""

    def __init__(self, every_s: float = 2.0, threshold: float = 20.0) -> None:
        super().__init__("gate-neighbours")
        self.every_s, self.threshold = every_s, threshold
        self.peaks: dict[str, float] = {}
        self.samples = 0
        self.busy_samples = 0

    def run(self) -> None:
        import psutil

        me = psutil.Process()
        known: dict[int, psutil.Process] = {}
        while not self.wait(self.every_s):
            try:
                own = {me.pid} | {c.pid for c in me.children(recursive=True)}
            except psutil.Error:
                own = {me.pid}
            busy = False
            for p in psutil.process_iter(["name", "cmdline"]):
                if p.pid in own:
                    continue
                proc = known.setdefault(p.pid, p)
                try:
                    pct = proc.cpu_percent(None)  # since this process's previous sample
                except psutil.Error:
                    continue
                if pct >= self.threshold:
                    busy = True
                    name = " ".join((p.info.get("cmdline") or [p.info.get("name") or "?"])[:3])[:80]
                    self.peaks[name] = max(self.peaks.get(name, 0.0), round(pct))
            self.samples += 1
            self.busy_samples += busy

    def __enter__(self) -> NeighbourWatch:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(5)

    def summary(self) -> dict[str, Any]:
        """Share of samples with a busy neighbour, and each neighbour's peak CPU %."""
        return {
            "sampled_every_s": self.every_s,
            "samples": self.samples,
            "share_with_busy_neighbour": round(self.busy_samples / self.samples, 3) if self.samples else 0.0,
            "peak_cpu_percent": dict(sorted(self.peaks.items(), key=lambda kv: -kv[1])[:8]),
        }
