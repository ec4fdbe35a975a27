"""Who owns the TensorRT session's memory, and when it is freed (pure: no CUDA import).

Two rules, both independent of ``close()`` being called:

- **Pinned host buffers belong to the arrays that view them.** Outputs are numpy views of
  the session's page-locked staging buffers (no copy on the hot path). A
  :class:`HostBuffer` frees its memory only when the last view of it is gone, so an output
  read after ``close()`` (or after the session was dropped) reads valid memory, never
  freed pinned memory. Its values are still overwritten by the session's next call while
  the session lives: a caller that keeps outputs past the next call copies them.
- **Everything else on the GPU is released exactly once**, in a fixed order, by
  :class:`DeviceResources`: by ``close()``, or by the garbage collector when a session is
  dropped without ``close()`` (a ``weakref.finalize`` that holds the resources, not the
  session).

The free functions are passed in (cuda-python's ``cudaFreeHost`` / ``cudaFree`` ...), so
these rules are tested here with stand-ins, and run on a GPU with the real ones.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class HostBuffer:
    """``nbytes`` of host memory at ``ptr``, freed with ``free(ptr)`` once nothing uses it.

    :meth:`array` returns a flat uint8 numpy view whose ``base`` is this object, so every
    view (and every view of a view) keeps the memory alive.
    """

    def __init__(self, ptr: int, nbytes: int, free: Callable[[int], Any]) -> None:
        self.ptr = int(ptr)
        self.nbytes = int(nbytes)
        self._finalizer = weakref.finalize(self, free, self.ptr)

    @property
    def __array_interface__(self) -> dict[str, Any]:
        # numpy keeps a reference to the object that exposes the interface (array.base).
        return {"data": (self.ptr, False), "shape": (self.nbytes,), "typestr": "|u1", "version": 3}

    def array(self) -> np.ndarray:
        """A writable flat uint8 view of the whole buffer that keeps it alive."""
        return np.asarray(self)

    @property
    def freed(self) -> bool:
        """Whether the memory has been given back."""
        return not self._finalizer.alive


@dataclass
class DeviceResources:
    """The GPU objects of one session, released in a safe order exactly once.

    The session holds its TensorRT objects only here (never in its own attributes), so
    whichever way it ends, they are dropped in the order TensorRT needs: execution
    contexts, then the engine, then the runtime, then the logger it reports to. The stream
    is drained first, and graph executables go before the contexts and buffers they
    replay into.
    """

    cudart: Any
    stream: Any = None
    events: list = field(default_factory=list)
    graph_execs: list = field(default_factory=list)
    device_ptrs: list[int] = field(default_factory=list)
    context: Any = None
    graph_context: Any = None
    engine: Any = None
    runtime: Any = None
    logger: Any = None
    released: bool = False

    def release(self) -> None:
        """Give everything back (idempotent; errors from a broken context are ignored,
        since nothing else could free these resources either)."""
        if self.released:
            return
        self.released = True
        cudart = self.cudart
        if self.stream is not None:
            _quiet(cudart.cudaStreamSynchronize, self.stream)
        for g in self.graph_execs:
            _quiet(cudart.cudaGraphExecDestroy, g)
        self.graph_execs.clear()
        # Contexts before the engine, the engine before the runtime: drop them in order.
        self.graph_context = None
        self.context = None
        self.engine = None
        self.runtime = None
        self.logger = None
        for ptr in self.device_ptrs:
            _quiet(cudart.cudaFree, ptr)
        self.device_ptrs.clear()
        for e in self.events:
            _quiet(cudart.cudaEventDestroy, e)
        self.events.clear()
        if self.stream is not None:
            _quiet(cudart.cudaStreamDestroy, self.stream)
            self.stream = None


def _quiet(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 (teardown: nothing left to report to)
        pass
