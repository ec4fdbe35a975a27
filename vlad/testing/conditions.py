"""Measurement conditions for benchmark scripts: what a figure depends on, printed with it.

:func:`conditions` gives the shared part (UTC date, host, CPU model, core counts, load
average, memory, kernel, Python and package versions); each script adds its own extras
(threads, GPU, governor) to the dict it returns.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import time
from typing import Any

__all__ = ["conditions", "cpu_model"]


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _memory_gb() -> dict[str, float]:
    fields: dict[str, float] = {}
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    fields[name] = round(int(rest.split()[0]) * 1024 / 1e9, 1)
    except (OSError, ValueError, IndexError):
        return {}
    return {"memory_total_gb": fields.get("MemTotal", 0.0), "memory_available_gb": fields.get("MemAvailable", 0.0)}


def conditions(*packages: str) -> dict[str, Any]:
    """The shared measurement conditions, with the versions of ``packages`` (distribution
    names; vlad's own is always there)."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        **_memory_gb(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in ("vlad", *packages)},
    }
