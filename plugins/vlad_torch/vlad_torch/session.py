"""The PyTorch session shared by the ``torch`` and ``torch-aoti`` backends.

Both run a callable that takes the contract's input tensors positionally and returns the
output tensor(s); they differ only in how that callable is built (``torch.export`` program
vs AOTInductor package). This module owns what they share: device choice, thread count,
precision, numpy <-> tensor conversion (zero-copy on CPU; pinned staging buffers and CUDA
events on a GPU) and the timing split.

Precision labels are what the session computes in. On CUDA, cuDNN convolutions default to
TF32 (and matmuls may be set to it by any code in the process), so an ``fp32`` session sets
TF32 off before every call: the flags are process-wide and another session (``tf32``) may
have turned them on. ``tf32`` sets them on (compute capability >= 8.0); ``fp16`` /
``bf16`` run the model under ``torch.autocast`` (eager ``torch`` only).

torch is imported inside functions only, so importing the plugin costs nothing when the
daemon runs on another engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from vlad.backend import MemoryStats, Session, SessionDescription, Timing, host_rss_bytes, parse_options
from vlad.contract import Contract
from vlad.errors import BackendError
from vlad.schema import bounded

#: The precisions a torch session can compute in (the ``precision`` option takes exactly
#: these; which of them a device and a program allow is resolve_precision's).
Precision = Literal["fp32", "tf32", "fp16", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
_AUTOCAST = {"fp16": "float16", "bf16": "bfloat16"}


def set_tf32(torch: Any, enabled: bool) -> None:
    """Allow or forbid TF32 for CUDA matmuls and cuDNN convolutions / RNNs.

    Uses the per-backend ``fp32_precision`` API where torch has it (2.9+): mixing it with
    the legacy ``allow_tf32`` flags makes torch raise, so only one of the two is ever used.
    """
    matmul = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    if hasattr(matmul, "fp32_precision") and hasattr(cudnn, "conv"):
        value = "tf32" if enabled else "ieee"
        matmul.fp32_precision = value
        cudnn.conv.fp32_precision = value
        cudnn.rnn.fp32_precision = value
    else:
        matmul.allow_tf32 = enabled
        cudnn.allow_tf32 = enabled


def tf32_state(torch: Any) -> dict[str, str]:
    """The TF32 settings in effect, per backend (``tf32`` or ``ieee``)."""
    matmul = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    if hasattr(matmul, "fp32_precision") and hasattr(cudnn, "conv"):
        return {
            "matmul": matmul.fp32_precision,
            "cudnn_conv": cudnn.conv.fp32_precision,
            "cudnn_rnn": cudnn.rnn.fp32_precision,
        }
    return {"matmul": "tf32" if matmul.allow_tf32 else "ieee", "cudnn": "tf32" if cudnn.allow_tf32 else "ieee"}


def resolve_precision(
    backend: str, precision: Precision, device: Any, *, autocast: bool = True, weights: str = "fp32"
) -> str:
    """Check the ``precision`` option against the device and the weights; returns the label.

    A program whose weights are bf16 or fp16 (``weights``) computes in that precision on
    any device, CPU included: ``precision`` must then say so. With fp32 weights, CPU
    sessions compute in fp32 only; tf32 and bf16 need compute capability >= 8.0; fp16 /
    bf16 (autocast) only where ``autocast`` is offered (eager torch).
    """
    if weights != "fp32" and precision != weights:
        raise BackendError(
            f"{backend}: the program's weights are {weights}, so it computes in {weights}; "
            f"set option precision = {weights!r}"
        )
    if precision == "fp32" or (weights != "fp32" and device.type != "cuda"):
        return precision
    if device.type != "cuda":
        raise BackendError(
            f"{backend}: precision {precision} needs device 'cuda'; on {device.type} sessions compute in fp32"
        )
    if precision in _AUTOCAST and not autocast and weights == "fp32":
        raise BackendError(
            f"{backend}: precision {precision} is compiled in, not switched at load; export and compile a {precision} program"
        )
    if precision in ("tf32", "bf16"):
        import torch

        cc = torch.cuda.get_device_capability(device)
        if cc < (8, 0):
            raise BackendError(
                f"{backend}: precision {precision} needs compute capability >= 8.0 (Ampere); {device} has {cc[0]}.{cc[1]}"
            )
    return precision


def weights_precision(tensors: Any) -> str:
    """``bf16`` / ``fp16`` when every floating-point weight is of that type, else ``fp32``."""
    import torch

    kinds = {t.dtype for t in tensors if t.is_floating_point()}
    return {frozenset({torch.bfloat16}): "bf16", frozenset({torch.float16}): "fp16"}.get(frozenset(kinds), "fp32")


@dataclass(frozen=True)
class TorchOptions:
    """The options of the ``torch`` and ``torch-aoti`` backends (:func:`vlad.backend.parse_options`)."""

    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    threads: int | None = field(default=None, metadata=bounded(1))  # torch intra-op threads (process-wide)
    precision: Precision = "fp32"  # checked against the device and the weights by resolve_precision
    # Real-time chunking by guidance (vlad_torch.guided): the flow head's two programs, file
    # names beside the artifact, and the guidance clip. The ``torch`` backend only.
    rtc_encoder: str | None = None
    rtc_velocity: str | None = None
    rtc_guidance: float = field(default=5.0, metadata=bounded(0.0, 1000.0))

    @classmethod
    def parse(cls, backend: str, options: Mapping[str, Any] | None) -> TorchOptions:
        return parse_options(backend, cls, options)


def resolve_device(backend: str, requested: str) -> Any:
    """``"cpu"`` / ``"cuda"`` / ``"cuda:N"`` -> a ``torch.device``; refuses what is not there."""
    import torch

    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError) as exc:
        raise BackendError(f"{backend}: invalid device {requested!r} (use 'cpu' or 'cuda[:N]')") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise BackendError(
                f"{backend}: device {requested!r} requested but CUDA is not available to torch {torch.__version__}"
            )
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise BackendError(
                f"{backend}: device {requested!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
        device = torch.device("cuda", index)
    elif device.type != "cpu":
        raise BackendError(f"{backend}: device type {device.type!r} is not supported (use 'cpu' or 'cuda[:N]')")
    return device


def apply_threads(threads: int | None) -> int:
    """Set torch's intra-op thread count if asked; returns the count in effect.

    ``torch.set_num_threads`` is process-wide: the last session loaded wins. On a loaded
    machine more threads than free cores is far slower (spinning OpenMP workers), so
    deployments should set this explicitly.
    """
    import torch

    if threads is not None:
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
        precision: str = "fp32",
        autocast: bool = True,
    ) -> None:
        import torch

        super().__init__(contract, artifact, options)
        self.precision = precision
        self.backend_name = backend_name
        self._torch = torch
        self._fn: Callable[..., Any] | None = fn
        self._input_order = list(input_order)
        self._output_names = [spec.name for spec in contract.outputs]
        self._output_dtypes = {spec.name: np.dtype(spec.dtype) for spec in contract.outputs}
        self._device = device
        self._threads = threads
        self._extra = dict(extra or {})
        self._cache_key = cache_key
        self._cuda = device.type == "cuda"
        # Staging buffers per input-shape signature (one set per batch size seen), so the
        # hot path never allocates pinned or device memory after the first call.
        self._buffers: dict[tuple, dict[str, Any]] = {}
        # Autocast only where the precision is switched at run time, not compiled into the weights.
        self._autocast = getattr(torch, _AUTOCAST[precision]) if autocast and precision in _AUTOCAST else None
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
        assert self._fn is not None  # _run checked that the session is open
        torch = self._torch
        key = tuple(inputs[n].shape for n in self._input_order)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = self._allocate(inputs)
        # Process-wide flags another session may have changed: set them for this call.
        set_tf32(torch, self.precision != "fp32")
        # Host-side staging first, so h2d_ms times only the device copy.
        for name in self._input_order:
            np.copyto(buf["host_np"][name], inputs[name], casting="no")
        start, h2d_done, compute_done, d2h_done = self._events
        host_out = buf["out"]
        with torch.cuda.stream(self._stream), torch.inference_mode():
            start.record()
            for name in self._input_order:
                buf["dev"][name].copy_(buf["host"][name], non_blocking=True)
            h2d_done.record()
            if self._autocast is not None:
                with torch.autocast("cuda", dtype=self._autocast):
                    out = self._fn(*(buf["dev"][n] for n in self._input_order))
            else:
                out = self._fn(*(buf["dev"][n] for n in self._input_order))
            outs = out if isinstance(out, (list, tuple)) else (out,)
            self._check_count(outs)
            for name, t in zip(self._output_names, outs, strict=True):
                pinned = host_out.get(name)
                if pinned is None or pinned.shape != t.shape or pinned.dtype != t.dtype:
                    # Only when the contract could not size it (or autocast changed the
                    # dtype): a one-off allocation, before the timed copies below.
                    host_out[name] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            compute_done.record()
            for name, t in zip(self._output_names, outs, strict=True):
                host_out[name].copy_(t, non_blocking=True)
            d2h_done.record()
        d2h_done.synchronize()
        self.last_timing = Timing(
            h2d_ms=start.elapsed_time(h2d_done),
            compute_ms=h2d_done.elapsed_time(compute_done),
            d2h_ms=compute_done.elapsed_time(d2h_done),
        )
        return {name: self._as_contract_dtype(host_out[name].numpy(), name) for name in self._output_names}

    def _as_contract_dtype(self, array: np.ndarray, name: str) -> np.ndarray:
        """Autocast may return fp16/bf16 outputs; callers get the contract's dtype."""
        want = self._output_dtypes[name]
        return array if array.dtype == want else array.astype(want)

    def _allocate(self, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Pinned staging and device buffers for one input-shape signature, and pinned
        outputs sized from the contract (dynamic axes sized like the inputs' axes)."""
        torch = self._torch
        host, host_np, dev = {}, {}, {}
        for name in self._input_order:
            x = inputs[name]
            dtype = torch.from_numpy(np.empty(0, dtype=x.dtype)).dtype
            host[name] = torch.empty(x.shape, dtype=dtype, pin_memory=True)
            host_np[name] = host[name].numpy()
            dev[name] = torch.empty(x.shape, dtype=dtype, device=self._device)
        sizes = {ax.name: inputs[spec.name].shape[ax.axis] for spec in self.contract.inputs for ax in spec.dynamic}
        out = {}
        for spec in self.contract.outputs:
            if any(ax.name not in sizes for ax in spec.dynamic):
                continue  # an axis only the model knows: sized at the first call
            shape = list(spec.shape)
            for ax in spec.dynamic:
                shape[ax.axis] = sizes[ax.name]
            dtype = torch.from_numpy(np.empty(0, dtype=np.dtype(spec.dtype))).dtype
            out[spec.name] = torch.empty(tuple(shape), dtype=dtype, pin_memory=True)
        return {"host": host, "host_np": host_np, "dev": dev, "out": out}

    def _outputs_to_numpy(self, out: Any) -> dict[str, np.ndarray]:
        outs = out if isinstance(out, (list, tuple)) else (out,)
        self._check_count(outs)
        return {name: t.numpy() for name, t in zip(self._output_names, outs, strict=True)}

    def _check_count(self, outs: Sequence[Any]) -> None:
        if len(outs) != len(self._output_names):
            raise BackendError(
                f"{self.backend_name}: the model returned {len(outs)} output(s), the contract declares {self._output_names}"
            )

    # -- introspection ---------------------------------------------------------------------

    def describe(self) -> SessionDescription:
        """Runtime torch and its version, the device actually used, the precision it computes
        in (TF32 on or off on CUDA), no providers."""
        torch = self._torch
        device = str(self._device)
        extra = {"threads": self._threads, **self._extra}
        if self._cuda:
            device = f"{device} ({torch.cuda.get_device_name(self._device)})"
            extra["tf32"] = "on" if self.precision != "fp32" else "off"
        return SessionDescription(
            backend=self.backend_name,
            runtime=self.runtime_name,
            runtime_version=torch.__version__,
            device=device,
            precision=self.precision,
            providers=(),
            cache_key=self._cache_key,
            artifact=str(self.artifact),
            extra=extra,
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
