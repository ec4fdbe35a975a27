"""The engines the equivalence gate compares: the PyTorch fp32 reference and the candidates.

The reference is the release's ``torch.export`` program run eagerly by PyTorch in fp32 on
the CPU. Candidates (plan ``equivalence.candidates = "auto"``) are the release's serving
backend, then every other installed backend that can load one of the release's model
artifacts here: ONNX Runtime on the CPU, ``torch-aoti`` (an AOTInductor compile of the
program, ~1 min, cached; only when asked or already cached), and on a machine with an
NVIDIA GPU the CUDA variants per precision (torch fp32/fp16/bf16, ONNX Runtime CUDA,
TensorRT fp32/fp16). A candidate that cannot run here is skipped with the reason
(TensorRT without a GPU); the serving backend failing to load fails the gate.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlad.errors import VladError
from vlad.files import sha256_file
from vlad_tools.gates.plan import EngineSpec, GatePlan
from vlad_tools.gates.results import GateError
from vlad_tools.gates.subject import Subject


@dataclass
class Engine:
    """A loaded candidate (or the reference), or why it was skipped."""

    id: str
    spec: EngineSpec
    session: Any = None
    precision: str = "fp32"
    required: bool = False  # the serving backend, or listed by the plan: failing to load fails the gate
    skipped: str = ""

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def cache_dir() -> Path:
    """Where compiled artifacts (AOTInductor packages) are cached: ``$VLAD_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/vlad`` (``~/.cache/vlad``)."""
    root = os.environ.get("VLAD_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vlad"
    return Path(root)


def aoti_package(program: Path, device: str = "cpu", compile_now: bool = False, progress=print) -> Path | None:
    """The AOTInductor package of ``program`` from the cache (keyed by the program's sha256,
    torch version and device); compiled when ``compile_now``, else None if not cached."""
    import torch

    suffix = "" if device == "cpu" else f"-{device}"
    name = f"aoti-{sha256_file(program)[:16]}-torch{torch.__version__}{suffix}.pt2"
    out = cache_dir() / "aoti" / name
    # A checkout's own cache (the conformance tests and benchmarks compile there) is as good.
    for found in (out, Path.cwd() / ".cache" / "vlad-aoti" / name):
        if found.is_file():
            return found
    if not compile_now:
        return None
    from vlad.plugins import get_backend

    progress(
        f"  equivalence: compiling {program.name} with AOTInductor for {device} (about a minute, cached in {out.parent})"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    return get_backend("torch-aoti").compile(program, out, device)


def load_engine(subject: Subject, engine: Engine, progress=print) -> Engine:
    """Load ``engine`` from ``subject``'s folder; on failure mark it skipped (or raise when required)."""
    from vlad.plugins import get_backend

    spec = engine.spec
    try:
        backend = get_backend(spec.backend)
        avail = backend.availability()
        if not avail.usable:
            raise VladError(avail.reason)
        artifact = Path(spec.artifact) if Path(spec.artifact).is_absolute() else subject.artifact_path(spec.artifact)
        session = backend.load(artifact, subject.contract, dict(spec.options))
        session.warmup(2)
        engine.session = session
        engine.precision = spec.precision or getattr(session.describe(), "precision", "fp32") or "fp32"
    except VladError as exc:
        if engine.required:
            raise GateError(f"equivalence: cannot load {engine.id} from {subject.path}: {exc}") from exc
        engine.skipped = str(exc)
        progress(f"  equivalence: {engine.id} skipped: {exc}")
    return engine


def reference_engine(subject: Subject, plan: GatePlan) -> Engine:
    """The PyTorch fp32 reference: the plan's, else torch on the release's first ``.pt2``."""
    spec = plan.equivalence.reference
    if not spec.artifact:
        programs = subject.artifacts((".pt2",))
        if not programs:
            raise GateError(
                f"equivalence: {subject.path} has no torch.export program (.pt2 model artifact) to serve "
                "as the PyTorch fp32 reference; add one or name it in equivalence.reference"
            )
        spec = EngineSpec(spec.backend, programs[0], spec.options, "fp32")
    return Engine(_label(spec), spec, precision="fp32", required=True)


def candidate_engines(subject: Subject, plan: GatePlan, reference: Engine, progress=print) -> list[Engine]:
    """The candidates to compare with the reference (loaded later), serving backend first."""
    eq = plan.equivalence
    s = subject.serving
    if eq.candidates != "auto":
        assert not isinstance(eq.candidates, str)  # "auto" is the only string a plan holds
        return [Engine(_label(c), c, required=True) for c in eq.candidates]
    out = [Engine(_label(s) + " (serving)", s, required=True)]
    from vlad.plugins import backends

    for name, backend in sorted(backends().items()):
        avail = backend.availability()
        suffixes = tuple(backend.artifact_suffixes())
        if not suffixes:
            continue  # wrappers and test backends name no artifact of their own
        artifacts = subject.artifacts(suffixes)
        if name == "torch-aoti":
            out.extend(_aoti_candidates(subject, plan, avail, progress))
            continue
        if not artifacts:
            continue
        if not avail.usable:
            out.append(Engine(f"{name}", EngineSpec(name, artifacts[0]), skipped=avail.reason))
            continue
        for spec in _variants(name, artifacts[0], avail):
            same_as_serving = _key(spec) == _key(s)
            same_as_reference = _key(spec) == _key(reference.spec)
            if not same_as_serving and not same_as_reference:
                out.append(Engine(_label(spec), spec))
    return out


def _device(spec: EngineSpec) -> str:
    gpu_providers = [p for p in spec.options.get("providers", ()) if "CUDA" in p or "Tensorrt" in p]
    return str(spec.options.get("device") or ("cuda" if gpu_providers or spec.backend == "tensorrt" else "cpu"))


def _key(spec: EngineSpec) -> tuple[str, str, str, str]:
    """What makes two engine specs the same computation (threads do not)."""
    return (
        spec.backend,
        spec.artifact,
        _device(spec).split(":")[0],
        spec.precision or str(spec.options.get("precision", "fp32")),
    )


def _label(spec: EngineSpec) -> str:
    precision = spec.precision or str(spec.options.get("precision", "fp32"))
    return f"{spec.backend}[{_device(spec)}] {precision} ({Path(spec.artifact).name})"


def _variants(name: str, artifact: str, avail: Any) -> list[EngineSpec]:
    """One-thread CPU variant, plus the GPU variants this machine offers."""
    cuda = any(d.startswith("cuda") for d in avail.devices)
    if name == "torch":
        out = [EngineSpec(name, artifact, {"threads": 1}, "fp32")]
        if cuda:
            out += [EngineSpec(name, artifact, {"device": "cuda", "precision": p}, p) for p in ("fp32", "fp16", "bf16")]
        return out
    if name == "onnxruntime":
        out = [EngineSpec(name, artifact, {"intra_op_threads": 1, "inter_op_threads": 1}, "fp32")]
        if "CUDAExecutionProvider" in avail.providers:
            out.append(EngineSpec(name, artifact, {"providers": ["CUDAExecutionProvider"]}, "fp32"))
        return out
    if name == "tensorrt":
        cache = str(Path(tempfile.gettempdir()) / "vlad-gate-engines")
        return [
            EngineSpec(name, artifact, {"precision": p, "cache_dir": cache, "progress": False}, p)
            for p in ("fp32", "fp16")
        ]
    return [EngineSpec(name, artifact)]


def _aoti_candidates(subject: Subject, plan: GatePlan, avail: Any, progress) -> list[Engine]:
    programs = subject.artifacts((".pt2",))
    if not programs:
        return []
    if not avail.usable:
        return [Engine("torch-aoti", EngineSpec("torch-aoti", programs[0]), skipped=avail.reason)]
    try:
        package = aoti_package(subject.artifact_path(programs[0]), "cpu", plan.equivalence.compile_aoti, progress)
    except VladError as exc:
        return [Engine("torch-aoti", EngineSpec("torch-aoti", programs[0]), skipped=str(exc))]
    if package is None:
        return [
            Engine(
                "torch-aoti",
                EngineSpec("torch-aoti", programs[0]),
                skipped="not compiled yet (AOTInductor takes about a minute): pass --aoti "
                "or set equivalence.compile_aoti = true",
            )
        ]
    spec = EngineSpec("torch-aoti", str(package), {"threads": 1}, "fp32")
    return [Engine(f"torch-aoti[cpu] fp32 ({programs[0]} compiled)", spec)]
