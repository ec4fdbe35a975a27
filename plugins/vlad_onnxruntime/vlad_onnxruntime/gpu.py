"""GPU execution providers: libraries, precision labels, TensorRT profile and engine cache.

Pure functions except :func:`prepare_gpu_libraries` and :func:`gpu_identity`, which touch
the process and the driver; everything else is decided from plain values so it is
tested without a GPU.

Precision labels are what the session computes, not what was hoped for:

========================= ======== ===================================================
primary provider          label    provider options set
========================= ======== ===================================================
CUDAExecutionProvider     fp32     ``use_tf32=0``: ORT's CUDA provider and cuDNN default
                                   to TF32 (10-bit mantissa matmul inputs) on Ampere+
CUDAExecutionProvider     tf32     ``use_tf32=1`` (compute capability >= 8.0)
TensorrtExecutionProvider tf32     TensorRT's default; the ORT TensorRT provider has no
                                   option to turn TF32 off, so on Ampere+ it is never
                                   "fp32" (on older GPUs, without TF32, it is ``fp32``)
TensorrtExecutionProvider fp16     ``trt_fp16_enable=1``
TensorrtExecutionProvider bf16     ``trt_bf16_enable=1`` (compute capability >= 8.0)
CPUExecutionProvider      fp32     nothing
========================= ======== ===================================================

fp16 / bf16 on the CUDA provider would need a reduced-precision ONNX (ORT runs the
graph's own types there); they are refused with that reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from vlad.contract import Contract
from vlad.errors import BackendError

CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
CPU = "CPUExecutionProvider"
# The labels the backend can honour (the ``precision`` option takes exactly these).
Precision = Literal["fp32", "tf32", "fp16", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
DEFAULT_CACHE_DIR = Path("/var/lib/vlad/engines")
TRT_CACHE_FORMAT = "vlad.ort-trt-cache/1"

# Provider options whose effect is a precision: set through the `precision` option only,
# so the label can never disagree with them.
PRECISION_OPTIONS = {CUDA: ("use_tf32",), TENSORRT: ("trt_fp16_enable", "trt_bf16_enable", "trt_int8_enable")}
# Provider options the backend sets from the contract and the cache folder.
MANAGED_OPTIONS = {
    TENSORRT: (
        "trt_profile_min_shapes",
        "trt_profile_opt_shapes",
        "trt_profile_max_shapes",
        "trt_engine_cache_enable",
        "trt_engine_cache_path",
        "trt_timing_cache_enable",
        "trt_timing_cache_path",
    )
}


def _fail(msg: str) -> BackendError:
    return BackendError(f"onnxruntime: {msg}")


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """The GPU a provider runs on, as far as the engine-cache key and precision rules need."""

    name: str
    compute_capability: tuple[int, int]

    @property
    def cc(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


def precision_plan(
    names: list[str], precision: Precision, gpu: GpuIdentity | None
) -> tuple[str, dict[str, dict[str, str]]]:
    """The precision label this session will truly compute in, and the provider options
    that make it so (``{provider: {option: value}}``, merged over the release's).

    ``gpu`` may be None only when no decision depends on it (CUDA provider at fp32, CPU).
    Raises BackendError when the requested precision cannot be honoured truthfully.
    """
    primary = names[0]
    ampere = gpu is not None and gpu.compute_capability >= (8, 0)

    def need_ampere(what: str) -> None:
        if gpu is None or not ampere:
            have = "unknown" if gpu is None else gpu.cc
            raise _fail(f"precision {what} needs compute capability >= 8.0 (Ampere); this GPU has {have}")

    tf32 = precision != "fp32"
    options: dict[str, dict[str, str]] = {}
    if CUDA in names:
        # Nodes the TensorRT provider leaves to CUDA follow the same rule: TF32 only when
        # the label already admits reduced precision.
        options[CUDA] = {"use_tf32": "1" if tf32 else "0"}
    if primary == CUDA:
        if precision in ("fp16", "bf16"):
            raise _fail(
                f"precision {precision} on {CUDA} needs a {precision} ONNX export (the CUDA provider runs the "
                f"graph's own types); use {TENSORRT} for {precision}, or precision fp32/tf32"
            )
        if precision == "tf32":
            need_ampere("tf32")
        return precision, options
    if primary == TENSORRT:
        if gpu is None:
            raise _fail(f"cannot identify the GPU for {TENSORRT}; install nvidia-ml-py (pip install 'vlad[gpu]')")
        # trt_bf16_enable only when asked: ORT builds before its introduction refuse the
        # unknown option outright.
        trt = {"trt_fp16_enable": "0"}
        if precision == "fp32":
            if ampere:
                raise _fail(
                    f"precision fp32 cannot be guaranteed on {TENSORRT}: it has no option to turn TensorRT's TF32 "
                    f'off, and this GPU (cc {gpu.cc}) has TF32; set precision = "tf32", or use the tensorrt '
                    f"backend or {CUDA} for fp32"
                )
        elif precision == "tf32":
            need_ampere("tf32")
        elif precision == "fp16":
            trt["trt_fp16_enable"] = "1"
        elif precision == "bf16":
            need_ampere("bf16")
            trt["trt_bf16_enable"] = "1"
        options[TENSORRT] = trt
        return precision, options
    if precision != "fp32":
        raise _fail(f"precision {precision} needs a GPU provider first in providers; {primary} computes in fp32")
    return "fp32", options


def provider_option_conflicts(names: list[str], provider_opts: list[dict[str, str]]) -> list[str]:
    """Provider options the backend owns, one problem each: precision options (set
    ``precision`` instead) and the TensorRT profile / cache options (derived from the
    contract and ``cache_dir``)."""
    problems = []
    for name, opts in zip(names, provider_opts, strict=True):
        for key in PRECISION_OPTIONS.get(name, ()):
            if key in opts:
                problems.append(f"{name} option {key} is set by the backend (set the backend option precision instead)")
        for key in MANAGED_OPTIONS.get(name, ()):
            if key in opts:
                problems.append(f"{name} option {key} is set by the backend (derived from the contract and cache_dir)")
    return problems


def trt_profile_options(contract: Contract) -> dict[str, str]:
    """The contract's min/opt/max input shapes as TensorRT-provider options.

    Format ``name:d0xd1x...,name2:...`` (ORT's ``trt_profile_*_shapes``), for every input
    with a dynamic axis (static ones need no profile). Without them the provider builds
    for the first shape it sees and rebuilds on every new one.
    """
    dynamic = [s for s in contract.inputs if s.dynamic]

    def fmt(attr: str) -> str:
        return ",".join(f"{s.name}:{'x'.join(str(d) for d in getattr(s, attr))}" for s in dynamic)

    return {
        "trt_profile_min_shapes": fmt("min_shape"),
        "trt_profile_opt_shapes": fmt("opt_shape"),
        "trt_profile_max_shapes": fmt("max_shape"),
    }


def trt_cache_key(
    onnx_sha256: str,
    ort_version: str,
    tensorrt_version: str,
    gpu: GpuIdentity,
    precision: str,
    profile: Mapping[str, str],
) -> str:
    """sha256 over everything a TensorRT-provider engine depends on.

    ORT's own engine cache names do not cover all of it (a TensorRT upgrade or a swapped GPU
    would load a stale engine), so each combination gets its own folder under ``cache_dir``.
    """
    payload = {
        "format": TRT_CACHE_FORMAT,
        "onnx_sha256": onnx_sha256,
        "onnxruntime": ort_version,
        "tensorrt": tensorrt_version,
        "gpu": gpu.name,
        "cc": gpu.cc,
        "precision": precision,
        "profile": dict(sorted(profile.items())),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def trt_cache_options(cache_root: Path, key: str) -> dict[str, str]:
    """Engine and timing cache of the TensorRT provider, in the folder of this key."""
    folder = str(Path(cache_root) / "onnxruntime-trt" / key)
    return {
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": folder,
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": folder,
    }


# ---------------------------------------------------------------------------------------
# Process and driver
# ---------------------------------------------------------------------------------------


def prepare_gpu_libraries(ort, names: list[str]) -> str:
    """Load the CUDA / cuDNN (and for the TensorRT provider, TensorRT) libraries that the
    pip wheels ship, before the session registers its providers.

    Without this the CUDA provider only registers when torch happened to be imported first
    (torch loads the same libraries). Returns what went wrong, as text to add to a
    registration error (empty when nothing did).
    """
    notes = io.StringIO()
    if (CUDA in names or TENSORRT in names) and hasattr(ort, "preload_dlls"):
        # preload_dlls prints its failures; keep them for the error message instead.
        with contextlib.redirect_stdout(notes):
            try:
                ort.preload_dlls()
            except Exception as exc:  # noqa: BLE001 (a hint for the message, never fatal by itself)
                print(f"preload_dlls failed: {exc}")
    if TENSORRT in names:
        try:
            import tensorrt  # noqa: F401  (its wheel loads libnvinfer, which the provider opens by name)
        except ImportError as exc:
            notes.write(f"tensorrt does not import ({exc}); install vlad[tensorrt]\n")
    return " ".join(line.strip() for line in notes.getvalue().splitlines() if line.strip())


def tensorrt_version() -> str:
    """The installed TensorRT wheel's version (without importing it), or "none"."""
    import importlib.metadata

    for dist in ("tensorrt-cu13", "tensorrt-cu12", "tensorrt", "tensorrt-cu13-libs", "tensorrt-cu12-libs"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


def gpu_identity(device_id: int) -> GpuIdentity | None:
    """Name and compute capability of CUDA device ``device_id`` via NVML (nvidia-ml-py, in
    the gpu extras), or None when NVML is not available."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(device_id)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 (NVML errors mean "unknown", decided by the caller)
        return None
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return GpuIdentity(str(name), (int(major), int(minor)))


RUNTIME_DISTRIBUTIONS = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-directml",
    "onnxruntime-openvino",
    "onnxruntime-qnn",
)


def installed_runtime_distributions(installed: Callable[[str], bool] | None = None) -> list[str]:
    """Which ONNX Runtime wheels are installed (``onnxruntime``, ``onnxruntime-gpu``, ...).

    They all install the same ``onnxruntime`` package: two in one environment overwrite each
    other's files and the import runs a mix of both, which ``availability`` refuses.
    ``installed(name)`` answers for one distribution (default: importlib.metadata).
    """
    if installed is None:
        import importlib.metadata

        def installed(name: str) -> bool:
            try:
                importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                return False
            return True

    return [name for name in RUNTIME_DISTRIBUTIONS if installed(name)]
