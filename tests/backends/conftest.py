"""Fixtures of the backend conformance suite: every backend variant, the demo release, golden data.

Tests that take ``variant`` run once per variant of every backend the loaded plugins offer:
the backend on the CPU (``torch``, ``onnxruntime`` ...) and on a GPU (``torch[cuda]``,
``onnxruntime[cuda]``, ``onnxruntime[tensorrt]``, ``tensorrt`` ...). Nothing assumes a CPU
device: ``tensorrt`` only has a GPU one. A variant whose runtime or device is missing here
skips with the reason; GPU variants carry the ``gpu`` mark (``-m gpu`` selects them).
Sessions are loaded once per variant (session scope) because loading is the slow part.
Engine caches go to a temporary folder (:func:`choose_engine_cache`), never /var/lib/vlad.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# The remote backend's variants need a real KServe v2 server (started once per session).
from tests.kserve.remote_server import kserve_server  # noqa: F401
from vlad import plugins
from vlad.contract import Contract, load_contract
from vlad_tools.testing.golden import GOLDEN, load_golden
from vlad_tools.testing.releases import DEMO

ROOT = Path(__file__).resolve().parents[2]
# Compiled artifacts are derived data: cached by source hash, outside version control.
CACHE = ROOT / ".cache" / "vlad-aoti"
# Where a test run may keep its engine caches (TensorRT engines, ORT TensorRT-EP engines):
# a folder the caller created for the run, so scripts/gpu-check's tests and probe share
# one cache. Unset: a fresh temporary folder per session.
ENGINE_CACHE_ENV = "VLAD_TEST_ENGINE_CACHE"
# The robot's real cache: tests must never write there.
PRODUCTION_STATE = Path("/var/lib/vlad")

CUDA_EP, TRT_EP = "CUDAExecutionProvider", "TensorrtExecutionProvider"
# One thread everywhere: the test machines have 2 cores shared with other jobs, where
# more threads than free cores makes spinning thread pools far slower, not faster.
ORT_THREADS = {"intra_op_threads": 1, "inter_op_threads": 1}


@dataclass(frozen=True)
class Variant:
    """One backend with the options that put it on one device."""

    id: str
    backend: str
    device: str  # "cpu" or "cuda": what describe().device starts with
    options: dict[str, Any] = field(default_factory=dict)
    artifact: str | None = None  # demo file; None: by the backend's suffixes
    #: Options added at load time: "cache_dir" (a temporary engine cache) and
    #: "precision" (the truthful label for this GPU, see _auto_precision).
    needs: tuple[str, ...] = ()

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"


VARIANTS: dict[str, list[Variant]] = {
    "torch": [
        Variant("torch", "torch", "cpu", {"threads": 1}, "policy.pt2"),
        Variant("torch[cuda]", "torch", "cuda", {"device": "cuda", "threads": 1}, "policy.pt2"),
    ],
    "torch-aoti": [
        Variant("torch-aoti", "torch-aoti", "cpu", {"threads": 1}),
        Variant("torch-aoti[cuda]", "torch-aoti", "cuda", {"device": "cuda", "threads": 1}),
    ],
    "onnxruntime": [
        Variant("onnxruntime", "onnxruntime", "cpu", dict(ORT_THREADS), "policy.onnx"),
        Variant("onnxruntime[cuda]", "onnxruntime", "cuda", {**ORT_THREADS, "providers": [CUDA_EP]}, "policy.onnx"),
        Variant(
            "onnxruntime[tensorrt]",
            "onnxruntime",
            "cuda",
            {**ORT_THREADS, "providers": [TRT_EP, CUDA_EP]},
            "policy.onnx",
            needs=("cache_dir", "precision"),
        ),
    ],
    "tensorrt": [Variant("tensorrt", "tensorrt", "cuda", {"progress": False}, "policy.onnx", needs=("cache_dir",))],
    # The demo model served by tests/kserve/remote_server.py; "endpoint" is that server's.
    # A generous timeout: the suite checks answers, tests/kserve checks deadlines.
    "kserve": [
        Variant("kserve[grpc]", "kserve", "remote", {"timeout_ms": 2000}, "policy.onnx", needs=("endpoint:grpc",)),
        Variant("kserve[http]", "kserve", "remote", {"timeout_ms": 2000}, "policy.onnx", needs=("endpoint:http",)),
    ],
}

# The remote soak is a loopback round trip through a Python server per call (8-20 ms): even
# the short soak takes ~20 s per protocol, so it runs only under --slow (tests/kserve soaks
# 400 gRPC calls in the default run).
REMOTE_SOAK_SLOW = {"kserve"}
# The AOTInductor variants compile a C++ package first (~3.5 min on 2 cores from a fresh
# clone); they run under --slow. tests/backends/test_torch.py checks the AOTI loader's
# refusals in the default run.
SLOW_BACKENDS = {"torch-aoti"}


def choose_engine_cache(env_value: str | None, make_temp) -> Path:
    """The engine-cache folder for a test run: ``env_value`` when set, else ``make_temp()``.

    Refuses the production state folder (/var/lib/vlad), where a test-built engine would
    sit beside, or replace, the robot's own.
    """
    path = Path(env_value).expanduser().resolve() if env_value else Path(make_temp())
    if path == PRODUCTION_STATE or PRODUCTION_STATE in path.parents:
        raise pytest.UsageError(f"{ENGINE_CACHE_ENV}={path} is inside {PRODUCTION_STATE}; use a temporary folder")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def engine_cache_root(tmp_path_factory) -> Path:
    """A temporary engine-cache folder for this test session (see :func:`choose_engine_cache`)."""
    return choose_engine_cache(os.environ.get(ENGINE_CACHE_ENV), lambda: tmp_path_factory.mktemp("engine-cache"))


def all_backends() -> dict:
    """Every backend the installed plugins offer (honours VLAD_PLUGINS)."""
    return plugins.backends(plugins.make_plugin_manager())


def all_variants() -> list[Variant]:
    """The variants of every installed backend; a third-party backend without an entry in
    VARIANTS runs as-is on whatever device it reports."""
    out = []
    for name in sorted(all_backends()):
        out.extend(VARIANTS.get(name, [Variant(name, name, "")]))
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "variant" not in metafunc.fixturenames:
        return
    soak = metafunc.function.__name__ == "test_soak"
    params = []
    for v in all_variants():
        marks = [pytest.mark.gpu] if v.gpu else []
        if v.backend in SLOW_BACKENDS or (soak and v.backend in REMOTE_SOAK_SLOW):
            marks.append(pytest.mark.slow)
        params.append(pytest.param(v, id=v.id, marks=marks))
    metafunc.parametrize("variant", params, scope="session")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the variant tests variant by variant (each in its collected order, in the slots
    they held), so each variant's session is loaded once: with tests parametrized on more
    than the variant, pytest's own ordering switches variants back and forth and reloads a
    session each time (the torch program takes seconds to load)."""
    slots = [i for i, item in enumerate(items) if "variant" in getattr(getattr(item, "callspec", None), "params", {})]
    order: dict[str, int] = {}
    for i in slots:
        order.setdefault(items[i].callspec.params["variant"].id, len(order))
    grouped = sorted((items[i] for i in slots), key=lambda item: order[item.callspec.params["variant"].id])
    for i, item in zip(slots, grouped, strict=True):
        items[i] = item


def variant_unavailable(variant: Variant) -> str | None:
    """Why a GPU variant cannot run here (its backend's own availability is checked apart)."""
    if not variant.gpu or variant.backend == "tensorrt":
        return None  # the tensorrt backend's availability already requires a GPU
    if variant.backend in ("torch", "torch-aoti"):
        import torch

        if not torch.cuda.is_available():
            return f"no CUDA device visible to torch {torch.__version__}"
        if variant.backend == "torch-aoti":
            from vlad_torch.aoti import cuda_toolkit_problem

            return cuda_toolkit_problem()
        return None
    if variant.backend == "onnxruntime":
        import onnxruntime as ort

        from vlad_onnxruntime.gpu import gpu_identity

        wanted = variant.options["providers"][0]
        if wanted not in ort.get_available_providers():
            return f"onnxruntime {ort.__version__} offers no {wanted} (needs vlad[gpu] and an NVIDIA GPU)"
        if gpu_identity(0) is None:
            return "no NVIDIA GPU visible through NVML (nvidia-ml-py)"
    return None


@pytest.fixture(scope="session")
def contract() -> Contract:
    return load_contract(DEMO / "contract.toml")


@pytest.fixture(scope="session")
def golden(contract: Contract) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """(model inputs, PyTorch fp32 reference outputs) of every golden fixture."""
    out = [
        (
            {s.name: c["inputs"][s.name] for s in contract.inputs},
            {s.name: c["outputs"][s.name] for s in contract.outputs},
        )
        for c in load_golden(GOLDEN)
    ]
    assert out, f"{GOLDEN} holds no fixtures"
    return out


@pytest.fixture(scope="session")
def raw_golden() -> np.lib.npyio.NpzFile:
    return np.load(GOLDEN, allow_pickle=False)


@pytest.fixture(scope="session")
def backend_name(variant: Variant) -> str:
    return variant.backend


@pytest.fixture(scope="session")
def backend(variant: Variant):
    """The backend object; skips with the reason when its runtime or device is missing."""
    b = all_backends()[variant.backend]
    avail = b.availability()
    if not avail.usable:
        pytest.skip(f"{variant.id}: {avail.reason}")
    why = variant_unavailable(variant)
    if why:
        pytest.skip(f"{variant.id}: {why}")
    return b


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _aoti_package(device: str) -> Path:
    """The demo program compiled by AOTInductor, cached by source hash, torch and device."""
    import torch

    from vlad_torch import compile_aoti

    source = DEMO / "policy.pt2"
    suffix = "" if device == "cpu" else f"-{device}"
    out = CACHE / f"aoti-{_sha256(source)[:16]}-torch{torch.__version__}{suffix}.pt2"
    if not out.exists():
        compile_aoti(source, out, device=device)  # ~40-60 s on 2 cores, once per source artifact
    return out


@pytest.fixture(scope="session")
def artifact(backend, variant: Variant) -> Path:
    """The demo artifact this variant loads."""
    if variant.backend == "torch-aoti":
        return _aoti_package(variant.device)
    if variant.artifact:
        return DEMO / variant.artifact
    for suffix in backend.artifact_suffixes():
        found = sorted(DEMO.glob(f"*{suffix}"))
        if found:
            return found[0]
    pytest.skip(f"{variant.id}: no demo artifact with suffix {backend.artifact_suffixes()} in {DEMO}")


def _auto_precision(variant: Variant) -> str:
    """The label a variant can truthfully compute in: ORT's TensorRT provider cannot turn
    TF32 off, so on Ampere and newer it runs as tf32."""
    from vlad_onnxruntime.gpu import gpu_identity

    gpu = gpu_identity(0)
    return "tf32" if gpu is not None and gpu.compute_capability >= (8, 0) else "fp32"


@pytest.fixture(scope="session")
def options(variant: Variant, engine_cache_root: Path, request) -> dict:
    opts = dict(variant.options)
    for need in variant.needs:
        if need.startswith("endpoint:"):
            opts["endpoint"] = request.getfixturevalue("kserve_server").endpoint(need.split(":", 1)[1])
    if "cache_dir" in variant.needs:
        opts["cache_dir"] = str(engine_cache_root / variant.backend)
    if "precision" in variant.needs:
        opts["precision"] = _auto_precision(variant)
    return opts


@pytest.fixture(scope="session")
def session(backend, artifact: Path, contract: Contract, options: dict):
    """One loaded, warmed session per variant, shared by the tests."""
    sess = backend.load(artifact, contract, options)
    sess.warmup(3)
    yield sess
    sess.close()
