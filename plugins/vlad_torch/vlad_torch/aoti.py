"""The ``torch-aoti`` backend: an AOTInductor package compiled from a ``torch.export`` program.

AOTInductor turns the program into generated C++ (and Triton on GPU) kernels in a shared
library, packaged as a ``.pt2`` zip. It is a *compile candidate*: it removes the eager
per-operator overhead, but the package is specific to the torch version, the device and
the CPU instruction set it was compiled on, so it is produced on (or for) the target with
:func:`compile_aoti` and must pass the same equivalence gate as any other artifact.

Loading uses :func:`torch._inductor.aoti_load_package` only (no pickle, no remote code).
Options: ``device`` (``"cpu"`` default or ``"cuda[:N]"``; must match the compiled device),
``threads`` and ``precision`` (must equal the precision the package was compiled at:
kernels generated for CUDA bake TF32 use in, so it cannot be switched at load).

Compiling for CUDA needs the CUDA toolkit headers (``cuda_runtime_api.h``) besides a C++
compiler: the generated wrapper is C++ that includes them. :func:`cuda_toolkit_problem`
finds them the way torch does (``CUDA_HOME`` / ``CUDA_PATH``, ``nvcc`` on ``PATH``,
``/usr/local/cuda``) and ``availability()`` says what is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vlad.backend import Availability, Backend
from vlad.contract import Contract
from vlad.errors import BackendError
from vlad.files import sha256_file
from vlad_torch.backend import _first_line, require, torch_availability
from vlad_torch.session import (
    TorchOptions,
    TorchSession,
    apply_threads,
    check_names,
    resolve_device,
    resolve_precision,
    set_tf32,
)

# Our own metadata keys in the package, next to AOTInductor's AOTI_* keys.
META_INPUTS = "vlad.inputs"
META_OUTPUTS = "vlad.outputs"
META_SOURCE_SHA256 = "vlad.source_sha256"
META_TORCH = "vlad.torch_version"
META_DEVICE = "vlad.device"
META_PRECISION = "vlad.precision"
CUDA_HEADER = "cuda_runtime_api.h"


def find_cxx() -> str | None:
    """The C++ compiler AOTInductor would use: ``$CXX``, else g++ / clang++ / c++ on PATH."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    for name in ("g++", "clang++", "c++"):
        path = shutil.which(name)
        if path:
            return path
    return None


def cuda_toolkit_problem(
    env: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
    default_root: str = "/usr/local/cuda",
) -> str | None:
    """Why AOTInductor cannot compile for CUDA here (no CUDA headers), or None.

    Looks where torch's ``cpp_extension`` looks: ``$CUDA_HOME`` / ``$CUDA_PATH``, the
    toolkit of the ``nvcc`` on ``PATH``, then ``/usr/local/cuda``; the first root found
    must hold ``include/cuda_runtime_api.h``.
    """
    env = os.environ if env is None else env
    root, source = None, ""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            root, source = env[var], f"${var}"
            break
    if root is None:
        nvcc = which("nvcc")
        if nvcc:
            root, source = os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), f"nvcc at {nvcc}"
    if root is None and os.path.isdir(default_root):
        root, source = default_root, default_root
    if root is None:
        return (
            "no CUDA toolkit found (no $CUDA_HOME, no nvcc on PATH, no /usr/local/cuda): AOTInductor needs the "
            "CUDA headers to compile for cuda; install the CUDA toolkit and set CUDA_HOME"
        )
    header = os.path.join(root, "include", CUDA_HEADER)
    if not os.path.isfile(header):
        return f"the CUDA toolkit at {root} (from {source}) has no include/{CUDA_HEADER}; point CUDA_HOME at a full toolkit"
    return None


def compile_aoti(program_path: str | Path, out_path: str | Path, device: str = "cpu") -> Path:
    """Compile the ``torch.export`` program at ``program_path`` into an AOTInductor package.

    The package records the program's input and output names, the source's sha256, the
    torch version and the device, which :meth:`TorchAOTIBackend.load` checks. Takes tens of
    seconds on a small CPU (the C++ compile dominates). Returns ``out_path``.
    """
    import torch
    import torch._inductor

    cxx = find_cxx()
    if cxx is None:
        raise BackendError(
            "torch-aoti: no C++ compiler found (set $CXX or install g++); AOTInductor needs one to compile"
        )
    program_path, out_path = Path(program_path), Path(out_path)
    if out_path.suffix != ".pt2":
        raise BackendError(f"torch-aoti: the package path must end in .pt2, got {out_path}")
    dev = resolve_device("torch-aoti", device)
    if dev.type == "cuda" and (problem := cuda_toolkit_problem()):
        raise BackendError(f"torch-aoti: cannot compile for cuda: {problem}")
    try:
        program = torch.export.load(str(program_path))
    except Exception as exc:
        raise BackendError(f"torch-aoti: {program_path} is not a torch.export program: {_first_line(exc)}") from exc
    if dev.type != "cpu":
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, dev)
    metadata = {
        META_INPUTS: ",".join(program.graph_signature.user_inputs),
        META_OUTPUTS: str(len(program.graph_signature.user_outputs)),
        META_SOURCE_SHA256: sha256_file(program_path),
        META_TORCH: torch.__version__,
        META_DEVICE: dev.type,
        META_PRECISION: "fp32",
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # Compile next to the destination and rename, so a crash never leaves a half package
    # under the final name (a cache would otherwise pick it up).
    tmp = out_path.with_name(f".{out_path.stem}.partial.pt2")  # AOTInductor wants a .pt2 name
    if dev.type == "cuda":
        # Generated CUDA kernels decide TF32 at compile time: the package is fp32.
        set_tf32(torch, False)
    try:
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(tmp), inductor_configs={"aot_inductor.metadata": metadata}
        )
        os.replace(tmp, out_path)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise BackendError(f"torch-aoti: AOTInductor compile failed: {_first_line(exc)}") from exc
    return out_path


class TorchAOTIBackend(Backend):
    """AOTInductor-compiled package run through ``torch._inductor.aoti_load_package``."""

    name = "torch-aoti"

    def compile(self, source: Path, out: Path, device: str = "cpu") -> Path:
        """The AOTInductor package of the ``torch.export`` program ``source`` (:func:`compile_aoti`)."""
        return compile_aoti(source, out, device)

    def availability(self) -> Availability:
        """torch importable and a C++ compiler on PATH (AOTInductor compiles with it). With
        CUDA devices but no CUDA headers, CUDA packages still load; ``reason`` says that
        compiling for cuda would fail, and why."""
        base = torch_availability(runtime="torch-aoti")
        if not base.usable:
            return base
        if find_cxx() is None:
            return Availability(
                False,
                base.runtime,
                version=base.version,
                reason="no C++ compiler found (set $CXX or install g++): AOTInductor cannot compile packages here",
                devices=base.devices,
            )
        if any(d.startswith("cuda") for d in base.devices) and (problem := cuda_toolkit_problem()):
            return Availability(
                True,
                base.runtime,
                version=base.version,
                devices=base.devices,
                reason=f"cuda packages load, but compiling for cuda fails: {problem}",
            )
        return base

    def artifact_suffixes(self) -> tuple[str, ...]:
        """An AOTInductor package (a ``.pt2`` zip, not a ``torch.export`` program)."""
        return (".pt2",)

    def load(self, artifact: Path, contract: Contract, options: Mapping[str, Any] | None = None) -> TorchSession:
        """Load a package made by :func:`compile_aoti`; refuses one for another torch or device."""
        options = dict(options or {})
        opts = TorchOptions.parse(self.name, options)
        if opts.rtc_encoder or opts.rtc_velocity:
            raise BackendError(f"{self.name}: rtc_encoder / rtc_velocity guide the eager program: use backend 'torch'")
        require(self.availability())
        import torch
        import torch._inductor

        artifact = Path(artifact)
        if not artifact.is_file():
            raise BackendError(f"{self.name}: artifact {artifact} does not exist")
        device = resolve_device(self.name, opts.device)
        precision = resolve_precision(self.name, opts.precision, device, autocast=False)
        threads = apply_threads(opts.threads)
        try:
            model = torch._inductor.aoti_load_package(
                str(artifact), device_index=device.index if device.index is not None else -1
            )
            meta = dict(model.get_metadata())
        except Exception as exc:
            raise BackendError(f"{self.name}: {artifact} is not an AOTInductor package: {_first_line(exc)}") from exc
        if META_INPUTS not in meta:
            raise BackendError(
                f"{self.name}: {artifact} was not made by vlad_torch.compile_aoti (no {META_INPUTS} metadata)"
            )
        # The package is a shared library built against one torch ABI and one device type.
        if meta.get(META_TORCH) != torch.__version__:
            raise BackendError(
                f"{self.name}: {artifact} was compiled with torch {meta.get(META_TORCH)}, this is torch {torch.__version__}; recompile it"
            )
        if meta.get(META_DEVICE) != device.type:
            raise BackendError(
                f"{self.name}: {artifact} was compiled for {meta.get(META_DEVICE)}, device {device.type!r} requested"
            )
        compiled = meta.get(META_PRECISION, "fp32")
        if precision != compiled:
            raise BackendError(
                f"{self.name}: {artifact} was compiled at precision {compiled}, {precision} requested; the precision "
                f"of generated kernels is fixed at compile time"
            )
        names = check_names(self.name, "inputs", meta[META_INPUTS].split(","), [s.name for s in contract.inputs])
        if int(meta.get(META_OUTPUTS, -1)) != len(contract.outputs):
            raise BackendError(
                f"{self.name}: the package has {meta.get(META_OUTPUTS)} output(s), the contract declares "
                f"{[s.name for s in contract.outputs]}"
            )
        extra = {k: v for k, v in meta.items() if k.startswith("AOTI_") or k == META_SOURCE_SHA256}
        return TorchSession(
            contract,
            artifact,
            options,
            backend_name=self.name,
            fn=model,
            input_order=names,
            device=device,
            threads=threads,
            precision=precision,
            extra=extra,
            # What makes two packages interchangeable: same source program, torch, device, ISA.
            cache_key="-".join(
                (
                    meta[META_SOURCE_SHA256][:16],
                    f"torch{meta[META_TORCH]}",
                    device.type,
                    meta.get("AOTI_CPU_ISA", "").replace(" ", "+"),
                )
            ).rstrip("-"),
        )
