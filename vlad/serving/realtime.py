"""Real-time knobs for the serving threads (vlad.serving.loop): CPU affinity, SCHED_FIFO, mlockall.

Each is off by default where it needs privileges (docs/operations.md, "Real-time"). A knob
that is configured but cannot be applied stops the start with one clear line saying
what is missing: a robot silently running without the priority it was tuned with is
worse than one that does not start.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from vlad.config import RealtimeConfig
from vlad.errors import StartupError

MCL_CURRENT, MCL_FUTURE = 1, 2


def apply_thread_knobs(cfg: RealtimeConfig) -> None:
    """Pin and prioritise the *calling* thread (Linux applies both per thread)."""
    if cfg.cpu_affinity:
        try:
            os.sched_setaffinity(0, set(cfg.cpu_affinity))
        except (OSError, ValueError) as exc:
            usable = sorted(os.sched_getaffinity(0))
            raise StartupError(
                f"realtime.cpu_affinity = {list(cfg.cpu_affinity)}: cannot pin the serving thread "
                f"({getattr(exc, 'strerror', None) or exc}); CPUs usable here: {usable}"
            ) from None
    if cfg.fifo_priority:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(cfg.fifo_priority))
        except PermissionError:
            raise StartupError(
                f"realtime.fifo_priority = {cfg.fifo_priority}: SCHED_FIFO not allowed here: "
                "under systemd install the drop-in systemd/realtime.conf (RestrictRealtime=no, "
                'LimitRTPRIO; see docs/operations.md, "Real-time"), elsewhere raise RLIMIT_RTPRIO '
                "or grant CAP_SYS_NICE; or set it to 0"
            ) from None
        except OSError as exc:
            raise StartupError(f"realtime.fifo_priority = {cfg.fifo_priority}: {exc.strerror}") from None


def lock_memory(cfg: RealtimeConfig) -> None:
    """mlockall(MCL_CURRENT | MCL_FUTURE) for the whole process, when configured."""
    if not cfg.mlockall:
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.mlockall(MCL_CURRENT | MCL_FUTURE) != 0:
        err = ctypes.get_errno()
        raise StartupError(
            f"realtime.mlockall: {os.strerror(err)} (needs LimitMEMLOCK=infinity, as the unit sets, "
            'or CAP_IPC_LOCK; see docs/operations.md, "Real-time") or set it to false'
        )
