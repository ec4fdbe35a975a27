"""The TensorRT backend object the plugin registers (importable without TensorRT).

``availability()`` and ``load()`` import TensorRT and cuda-python lazily (through
:mod:`vlad_tensorrt.engine`), so the plugin registers on any machine and says why it is
unusable where TensorRT or a GPU is missing.

Options (the manifest's backend options table, parsed once into :class:`TensorRTOptions`):

==================== ========================= =============================================
option               default                   meaning
==================== ========================= =============================================
precision            "fp32"                    fp32 | tf32 | fp16 | bf16 | fp8 (one engine each)
cache_dir            "/var/lib/vlad/engines"   where engines and timing caches live
on_mismatch          "error"                   error | rebuild, for a stored engine whose
                                               sidecar does not match this machine
profile_max_batch    none (contract max)       build a narrower batch range than the contract
cuda_graph           false                     capture the opt shape as a CUDA graph
allow_build          true                      false: refuse to build at load (robot start)
engine               none                      a prebuilt engine file (sidecar beside it)
device               0                         CUDA device index
progress             true                      print build phases and steps to stderr
==================== ========================= =============================================
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlad.backend import Availability, Backend, Session, parse_options
from vlad.contract import Contract
from vlad.errors import BackendError, BackendUnavailable
from vlad.schema import bounded
from vlad_tensorrt.cache import (
    DEFAULT_CACHE_DIR,
    CacheIngredients,
    EngineCache,
    OnMismatch,
    file_sha256,
    prepare_engine,
)
from vlad_tensorrt.precision import (
    Precision,
    format_cc,
    require_fp8_qdq,
    scan_onnx_qdq,
    validate_precision,
)
from vlad_tensorrt.profiles import derive_profile

RUNTIME = "tensorrt"


@dataclass(frozen=True, slots=True)
class TensorRTOptions:
    """The backend options of one release, parsed once by :func:`vlad.backend.parse_options`
    (unknown keys and wrong types are errors, every one at once)."""

    precision: Precision = "fp32"
    cache_dir: str = str(DEFAULT_CACHE_DIR)
    on_mismatch: OnMismatch = "error"
    profile_max_batch: int | None = field(default=None, metadata=bounded(1))
    cuda_graph: bool = False
    allow_build: bool = True
    engine: str | None = None  # a pinned engine file instead of the cache
    device: int = field(default=0, metadata=bounded(0))
    progress: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None) -> TensorRTOptions:
        """Validate a TOML-shaped options table; every problem is reported at once."""
        return parse_options(RUNTIME, cls, options)


class TensorRTBackend(Backend):
    """TensorRT engines built from the release ONNX and cached per machine."""

    name = RUNTIME

    def availability(self) -> Availability:
        """Usable when tensorrt and cuda-python import and a CUDA GPU is visible."""
        try:
            info = self._probe(0)
        except BackendUnavailable as exc:
            return Availability(False, RUNTIME, version=_installed_version(), reason=str(exc))
        return Availability(
            True,
            RUNTIME,
            version=info.tensorrt_version,
            devices=tuple(f"cuda:{i} {n} (cc {format_cc(cc)})" for i, n, cc in info.all_devices),
        )

    def artifact_suffixes(self) -> tuple[str, ...]:
        return (".onnx",)

    def load(self, artifact: Path, contract: Contract, options: Mapping[str, Any] | None = None) -> Session:
        """Find or build the engine for ``artifact`` (ONNX) on this GPU and open a session.

        Order: options; runtime and GPU (BackendUnavailable with the reason); profile from
        the contract; precision against the GPU (and Q/DQ nodes for fp8); cache key; a
        verified cached / pinned engine or a fresh build; the session.
        """
        opts = TensorRTOptions.parse(options)
        artifact = Path(artifact)
        if not artifact.is_file():
            raise BackendError(f"tensorrt: ONNX artifact {artifact} does not exist")
        from vlad_tensorrt import engine as trt_engine

        device = self._probe(opts.device)
        profile = derive_profile(contract, opts.profile_max_batch)
        validate_precision(opts.precision, device.compute_capability, device.builder_flags, device.tensorrt_version)
        if opts.precision == "fp8":
            require_fp8_qdq(scan_onnx_qdq(artifact), str(artifact))
        ingredients = CacheIngredients(
            onnx_sha256=file_sha256(artifact),
            tensorrt_version=device.tensorrt_version,
            gpu_name=device.name,
            compute_capability=format_cc(device.compute_capability),
            precision=opts.precision,
            profile=profile.canonical_json(),
        )
        progress = _print_progress if opts.progress else None
        build = functools.partial(
            trt_engine.build_serialized_engine,
            artifact,
            profile,
            opts.precision,
            device=opts.device,
            progress=progress,
        )
        prepared = prepare_engine(
            EngineCache(Path(opts.cache_dir)),
            ingredients,
            build,
            on_mismatch=opts.on_mismatch,
            pinned=Path(opts.engine) if opts.engine is not None else None,
            allow_build=opts.allow_build,
        )
        return trt_engine.TensorRTSession(
            contract,
            artifact,
            dict(options or {}),
            opts=opts,
            prepared=prepared,
            device=device,
            profile=profile,
            ingredients=ingredients,
        )

    # A seam for tests: the real probe imports tensorrt / cuda-python and asks the driver.
    def _probe(self, device: int):
        from vlad_tensorrt import engine as trt_engine

        return trt_engine.probe(device)


def _print_progress(line: str) -> None:
    print(f"[tensorrt build] {line}", file=sys.stderr, flush=True)


def _installed_version() -> str | None:
    """The installed tensorrt distribution's version, without importing it."""
    import importlib.metadata

    for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
