"""Measurement conditions for benchmark scripts: what a figure depends on, printed with it
(the short form of :mod:`vlad_tools.gates.conditions`, which the gates record).

:func:`conditions` gives the shared part (UTC date, host, CPU model, core counts, load
average, memory, kernel, Python and package versions); each script adds its own extras
(threads, GPU, governor) to the dict it returns.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from typing import Any

from vlad_tools.gates.conditions import cpu_model, version

__all__ = ["conditions", "cpu_model"]


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
        "packages": {p: version(p) or "not installed" for p in ("vlad", *packages)},
    }
