"""Fixtures of the backend conformance suite: every backend, the demo release, golden data.

Tests that take ``backend_name`` run once per backend the loaded plugins offer (ids are
backend names); a backend whose runtime is not usable here skips with its own reason.
Sessions are loaded once per backend (session scope) because loading is the slow part.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from vlad import plugins
from vlad.contract import Contract, load_contract

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "manifests" / "demo"
GOLDEN = ROOT / "tests" / "fixtures" / "golden.npz"
# Compiled artifacts are derived data: cached by source hash, outside version control.
CACHE = ROOT / ".cache" / "vlad-aoti"
# Where a test run may keep its engine caches (TensorRT engines, ORT TensorRT-EP engines):
# a folder the caller created for the run, so scripts/gpu-check's tests and probe share
# one cache. Unset: a fresh temporary folder per session.
ENGINE_CACHE_ENV = "VLAD_TEST_ENGINE_CACHE"
# The robot's real cache: tests must never write there.
PRODUCTION_STATE = Path("/var/lib/vlad")


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

# Demo artifact per backend; a backend not listed gets the demo file matching its
# artifact_suffixes(), or skips when none exists (e.g. a TensorRT engine is built per GPU).
ARTIFACTS = {"torch": "policy.pt2", "onnxruntime": "policy.onnx"}

# One thread everywhere: the test machines have 2 cores shared with other jobs, where
# more threads than free cores makes spinning thread pools far slower, not faster.
OPTIONS = {
    "torch": {"threads": 1},
    "torch-aoti": {"threads": 1},
    "onnxruntime": {"intra_op_threads": 1, "inter_op_threads": 1},
}

# Backends whose 10,000-call soak takes over a minute on a 2-core machine (~6 ms/call).
SLOW_SOAK = {"torch"}


def all_backends() -> dict:
    """Every backend the installed plugins offer (honours VLAD_PLUGINS)."""
    return plugins.backends(plugins.make_plugin_manager())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_name" not in metafunc.fixturenames:
        return
    names = sorted(all_backends())
    slow = metafunc.function.__name__ == "test_soak"
    params = [pytest.param(n, id=n, marks=[pytest.mark.slow] if slow and n in SLOW_SOAK else []) for n in names]
    metafunc.parametrize("backend_name", params, scope="session")


@pytest.fixture(scope="session")
def contract() -> Contract:
    return load_contract(DEMO / "contract.toml")


@pytest.fixture(scope="session")
def golden(contract: Contract) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """(model inputs, PyTorch fp32 reference outputs) of every golden fixture."""
    data = np.load(GOLDEN, allow_pickle=False)
    out = []
    i = 0
    while f"{i}/outputs/{contract.outputs[0].name}" in data.files:
        inputs = {s.name: data[f"{i}/inputs/{s.name}"] for s in contract.inputs}
        outputs = {s.name: data[f"{i}/outputs/{s.name}"] for s in contract.outputs}
        out.append((inputs, outputs))
        i += 1
    assert out, f"{GOLDEN} holds no fixtures"
    return out


@pytest.fixture(scope="session")
def raw_golden() -> np.lib.npyio.NpzFile:
    return np.load(GOLDEN, allow_pickle=False)


@pytest.fixture(scope="session")
def backend(backend_name: str):
    """The backend object; skips with the backend's own reason when unusable here."""
    b = all_backends()[backend_name]
    avail = b.availability()
    if not avail.usable:
        pytest.skip(f"{backend_name}: {avail.reason}")
    return b


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _aoti_package() -> Path:
    """The demo program compiled by AOTInductor, cached by source hash and torch version."""
    import torch

    from vlad_torch import compile_aoti

    source = DEMO / "policy.pt2"
    out = CACHE / f"aoti-{_sha256(source)[:16]}-torch{torch.__version__}.pt2"
    if not out.exists():
        compile_aoti(source, out)  # ~40-60 s on 2 cores, once per source artifact
    return out


@pytest.fixture(scope="session")
def artifact(backend, backend_name: str) -> Path:
    """The demo artifact this backend loads."""
    if backend_name == "torch-aoti":
        return _aoti_package()
    if backend_name in ARTIFACTS:
        return DEMO / ARTIFACTS[backend_name]
    for suffix in backend.artifact_suffixes():
        found = sorted(DEMO.glob(f"*{suffix}"))
        if found:
            return found[0]
    pytest.skip(f"{backend_name}: no demo artifact with suffix {backend.artifact_suffixes()} in {DEMO}")


@pytest.fixture(scope="session")
def options(backend_name: str) -> dict:
    return dict(OPTIONS.get(backend_name, {}))


@pytest.fixture(scope="session")
def session(backend, artifact: Path, contract: Contract, options: dict):
    """One loaded, warmed session per backend, shared by the tests."""
    sess = backend.load(artifact, contract, options)
    sess.warmup(3)
    yield sess
    sess.close()
