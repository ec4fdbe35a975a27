"""The PyTorch session shared by the ``torch`` and ``torch-aoti`` backends.

Both run a callable that takes the contract's input tensors positionally and returns the
output tensor(s); they differ only in how that callable is built (``torch.export`` program
vs AOTInductor package). This module owns what they share: device choice, thread count,
numpy <-> tensor conversion (zero-copy on CPU; pinned staging buffers and CUDA events on a
GPU) and the timing split.

torch is imported inside functions only, so importing the plugin costs nothing when the
daemon runs on another engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlad.backend import MemoryStats, Session, SessionDescription, Timing, host_rss_bytes
from vlad.contract import Contract
from vlad.errors import BackendError

#: Options every torch session understands; anything else is refused (a typo must not
#: silently fall back to a default).
COMMON_OPTIONS = frozenset({"device", "threads"})


def check_options(backend: str, options: Mapping[str, Any], known: frozenset[str]) -> None:
    """Refuse option keys this backend does not know."""
    unknown = sorted(set(options) - known)
    if unknown:
        raise BackendError(f"{backend}: unknown option(s) {unknown}; known: {sorted(known)}")


def resolve_device(backend: str, requested: str) -> Any:
    """``"cpu"`` / ``"cuda"`` / ``"cuda:N"`` -> a ``torch.device``; refuses what is not there."""
    import torch

    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError) as exc:
        raise BackendError(f"{backend}: invalid device {requested!r} (use 'cpu' or 'cuda[:N]')") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise BackendError(f"{backend}: device {requested!r} requested but CUDA is not available to torch {torch.__version__}")
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise BackendError(f"{backend}: device {requested!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
        device = torch.device("cuda", index)
    elif device.type != "cpu":
        raise BackendError(f"{backend}: device type {device.type!r} is not supported (use 'cpu' or 'cuda[:N]')")
    return device


def apply_threads(backend: str, threads: Any) -> int:
    """Set torch's intra-op thread count if asked; returns the count in effect.

    ``torch.set_num_threads`` is process-wide: the last session loaded wins. On a loaded
    machine more threads than free cores is far slower (spinning OpenMP workers), so
    deployments should set this explicitly.
    """
    import torch

    if threads is not None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise BackendError(f"{backend}: option threads must be a positive integer, got {threads!r}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def check_names(backend: str, what: str, got: Sequence[str], contract_names: Sequence[str]) -> list[str]:
    """The model's input names, which must be exactly the contract's (any order)."""
    if sorted(got) != sorted(contract_names):
        raise BackendError(
            f"{backend}: the artifact's {what} {list(got)} are not the contract's {list(contract_names)}; "
            "wrong artifact for this contract?"
        )
    return list(got)


class TorchSession(Session):
    """A torch callable on one device; subclasses build :attr:`_fn` and say what it is."""

    runtime_name = "torch"

    def __init__(
        self,
        contract: Contract,
        artifact: Path,
        options: Mapping[str, Any],
        *,
        backend_name: str,
        fn: Callable[..., Any],
        input_order: Sequence[str],
        device: Any,
        threads: int,
        extra: Mapping[str, Any] | None = None,
        cache_key: str | None = None,
    ) -> None:
        import torch

        super().__init__(contract, artifact, options)
        self.backend_name = backend_name
        self._torch = torch
        self._fn = fn
        self._input_order = list(input_order)
        self._output_names = [spec.name for spec in contract.outputs]
        self._device = device
        self._threads = threads
        self._extra = dict(extra or {})
        self._cache_key = cache_key
        self._cuda = device.type == "cuda"
        # Staging buffers per input-shape signature (one set per batch size seen), so the
        # hot path never allocates pinned or device memory after the first call.
        self._buffers: dict[tuple, dict[str, Any]] = {}
        if self._cuda:
            self._stream = torch.cuda.Stream(device)
            self._events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            torch.cuda.reset_peak_memory_stats(device)

    # -- hot path ----------------------------------------------------------------------

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._fn is None:
            raise BackendError(f"{self.backend_name}: session is closed")
        if self._cuda:
            return self._run_cuda(inputs)
        torch = self._torch
        args = []
        for name in self._input_order:
            x = inputs[name]
            # from_numpy shares memory; it needs a writable array with non-negative strides
            # (a read-only view, e.g. cached token ids, is copied: small and rare).
            if not x.flags.writeable or not x.flags.c_contiguous:
                x = np.ascontiguousarray(x).copy()
            args.append(torch.from_numpy(x))
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self._fn(*args)
        t1 = time.perf_counter()
        self.last_timing = Timing(h2d_ms=None, compute_ms=(t1 - t0) * 1e3, d2h_ms=None)
        return self._outputs_to_numpy(out)

    def _run_cuda(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        key = tuple(inputs[n].shape for n in self._input_order)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = self._allocate(inputs)
        start, h2d_done, compute_done, d2h_done = self._events
        with torch.cuda.stream(self._stream), torch.inference_mode():
            start.record()
            for name in self._input_order:
                np.copyto(buf["host_np"][name], inputs[name], casting="no")
                buf["dev"][name].copy_(buf["host"][name], non_blocking=True)
            h2d_done.record()
            out = self._fn(*(buf["dev"][n] for n in self._input_order))
            compute_done.record()
            outs = out if isinstance(out, (list, tuple)) else (out,)
            host_out = buf.setdefault("out", {})
            for name, t in zip(self._output_names, outs):
                pinned = host_out.get(name)
                if pinned is None or pinned.shape != t.shape:
                    pinned = host_out[name] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                pinned.copy_(t, non_blocking=True)
            d2h_done.record()
        d2h_done.synchronize()
        self.last_timing = Timing(
            h2d_ms=start.elapsed_time(h2d_done),
            compute_ms=h2d_done.elapsed_time(compute_done),
            d2h_ms=compute_done.elapsed_time(d2h_done),
        )
        self._check_count(outs)
        return {name: host_out[name].numpy() for name in self._output_names}

    def _allocate(self, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        torch = self._torch
        host, host_np, dev = {}, {}, {}
        for name in self._input_order:
            x = inputs[name]
            dtype = torch.from_numpy(np.empty(0, dtype=x.dtype)).dtype
            host[name] = torch.empty(x.shape, dtype=dtype, pin_memory=True)
            host_np[name] = host[name].numpy()
            dev[name] = torch.empty(x.shape, dtype=dtype, device=self._device)
        return {"host": host, "host_np": host_np, "dev": dev}

    def _outputs_to_numpy(self, out: Any) -> dict[str, np.ndarray]:
        outs = out if isinstance(out, (list, tuple)) else (out,)
        self._check_count(outs)
        return {name: t.numpy() for name, t in zip(self._output_names, outs)}

    def _check_count(self, outs: Sequence[Any]) -> None:
        if len(outs) != len(self._output_names):
            raise BackendError(
                f"{self.backend_name}: the model returned {len(outs)} output(s), the contract declares {self._output_names}"
            )

    # -- introspection ---------------------------------------------------------------------

    def describe(self) -> SessionDescription:
        """Runtime torch and its version, the device actually used, fp32, no providers."""
        torch = self._torch
        device = str(self._device)
        if self._cuda:
            device = f"{device} ({torch.cuda.get_device_name(self._device)})"
        return SessionDescription(
            backend=self.backend_name,
            runtime=self.runtime_name,
            runtime_version=torch.__version__,
            device=device,
            precision="fp32",
            providers=(),
            cache_key=self._cache_key,
            artifact=str(self.artifact),
            extra={"threads": self._threads, **self._extra},
        )

    def memory(self) -> MemoryStats:
        """Host RSS, plus the device's peak allocation since load on CUDA."""
        if not self._cuda:
            return MemoryStats(host_rss_bytes=host_rss_bytes())
        torch = self._torch
        return MemoryStats(
            host_rss_bytes=host_rss_bytes(),
            device_peak_bytes=int(torch.cuda.max_memory_allocated(self._device)),
            device_name=torch.cuda.get_device_name(self._device),
        )

    def close(self) -> None:
        """Drop the model and the staging buffers (idempotent)."""
        self._fn = None
        self._buffers.clear()
