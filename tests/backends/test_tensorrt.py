"""Tests of the TensorRT backend plugin (plugins/vlad_tensorrt).

The pure logic (profiles, precision rules, Q/DQ scan, cache keys, sidecars, the
load-or-build policy, options, availability) runs everywhere. The hardware tests at the
end build and run the demo ONNX with real TensorRT and compare with ONNX Runtime on CPU;
they are marked ``gpu`` and skip with the backend's own reason where TensorRT or a CUDA
GPU is missing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from vlad.backend import Session, SessionDescription, example_inputs
from vlad.contract import Contract, load_contract
from vlad.errors import BackendError, BackendUnavailable, InputRejected
from vlad_tensorrt import TensorRTBackend, TensorRTOptions
from vlad_tensorrt import engine as trt_engine
from vlad_tensorrt.cache import (
    SIDECAR_FORMAT,
    CacheIngredients,
    EngineCache,
    EngineMismatch,
    atomic_write,
    cache_key,
    file_sha256,
    prepare_engine,
    timing_cache_key,
)
from vlad_tensorrt.precision import (
    PRECISIONS,
    QDQSummary,
    parse_compute_capability,
    precision_problem,
    require_fp8_qdq,
    scan_onnx_qdq,
    supported_precisions,
    validate_precision,
)
from vlad_tensorrt.profiles import Profile, check_profile, derive_profile
from vlad_tools.testing.golden import MAX_ABS

ROOT = Path(__file__).resolve().parents[2]
DEMO_DIR = ROOT / "manifests" / "demo"
DEMO_ONNX = DEMO_DIR / "policy.onnx"
# Token ids are embedding indices: outside [0, vocab_size) ONNX Runtime refuses them.
DEMO_VOCAB = json.loads((DEMO_DIR / "model_config.json").read_text())["vocab_size"]


@pytest.fixture(scope="module")
def contract() -> Contract:
    return load_contract(DEMO_DIR / "contract.toml")


def _with_batch_min(contract: Contract, new_min: int) -> Contract:
    """The demo contract with every batch axis starting at ``new_min``."""

    def fix(spec):
        dyn = tuple(dataclasses.replace(d, min=new_min, opt=max(d.opt, new_min)) for d in spec.dynamic)
        shape = list(spec.shape)
        for d in dyn:
            shape[d.axis] = d.opt
        return dataclasses.replace(spec, dynamic=dyn, shape=tuple(shape))

    return dataclasses.replace(
        contract,
        inputs=tuple(fix(s) for s in contract.inputs),
        outputs=tuple(fix(s) for s in contract.outputs),
    )


# ---------------------------------------------------------------------------------------
# Optimization profiles
# ---------------------------------------------------------------------------------------


def test_profile_from_demo_contract(contract):
    profile = derive_profile(contract)
    # every contract input, in its order (the names themselves: tests/contract/test_contract.py)
    assert [t.name for t in profile.tensors] == [s.name for s in contract.inputs]
    assert profile["image_overhead"].min == (1, 3, 64, 64)
    assert profile["image_overhead"].opt == (1, 3, 64, 64)
    assert profile["image_overhead"].max == (8, 3, 64, 64)
    assert (profile["tokens"].min, profile["tokens"].max) == ((1, 8), (8, 8))
    assert (profile["proprio"].min, profile["proprio"].max) == ((1, 4), (8, 4))
    assert (profile["noise"].min, profile["noise"].opt, profile["noise"].max) == ((1, 50, 2), (1, 50, 2), (8, 50, 2))
    assert (profile["rtc_weights"].min, profile["rtc_weights"].max) == ((1, 50), (8, 50))
    assert not profile.narrowed
    # Static axes equal the contract shape at min, opt and max.
    for spec in contract.inputs:
        t = profile[spec.name]
        static = [a for a in range(len(spec.shape)) if a not in {d.axis for d in spec.dynamic}]
        assert all(t.min[a] == t.opt[a] == t.max[a] == spec.shape[a] for a in static)


def test_profile_canonical_json_is_stable_and_sorted(contract):
    a, b = derive_profile(contract), derive_profile(contract)
    assert a.canonical_json() == b.canonical_json()
    data = json.loads(a.canonical_json())
    assert list(data) == sorted(data)
    assert data["noise"] == {"max": [8, 50, 2], "min": [1, 50, 2], "opt": [1, 50, 2]}
    assert " " not in a.canonical_json()


def test_profile_max_batch_narrows_the_batch_axes(contract):
    profile = derive_profile(contract, max_batch=4)
    assert profile.narrowed
    assert all(t.max[0] == 4 and t.min[0] == 1 and t.opt[0] == 1 for t in profile.tensors)
    assert profile.canonical_json() != derive_profile(contract).canonical_json()
    # At or above the contract maximum nothing changes.
    assert derive_profile(contract, max_batch=8) == derive_profile(contract)
    assert derive_profile(contract, max_batch=64) == derive_profile(contract)


def test_profile_max_batch_clamps_opt_and_refuses_below_min(contract):
    c = _with_batch_min(contract, 2)
    assert derive_profile(c, max_batch=2)["proprio"].opt == (2, 4)
    with pytest.raises(BackendError, match="below the contract's minimum batch 2"):
        derive_profile(c, max_batch=1)
    for bad in (0, -3, True, 2.0):
        with pytest.raises(BackendError, match="positive integer"):
            derive_profile(contract, max_batch=bad)


def test_check_profile_accepts_inside_and_rejects_outside(contract):
    narrow = derive_profile(contract, max_batch=2)
    check_profile(narrow, example_inputs(contract, batch=2))
    with pytest.raises(InputRejected, match=r"outside the engine's optimization profile.*profile_max_batch"):
        check_profile(narrow, example_inputs(contract, batch=3))
    full = derive_profile(contract)
    check_profile(full, example_inputs(contract, batch=8))
    with pytest.raises(InputRejected, match="missing"):
        check_profile(full, {})


class _ProfileCheckedSession(Session):
    """A stand-in for the engine session: the same profile check as TensorRTSession._run,
    then records that the call would have been enqueued."""

    backend_name = "profile-test"

    def __init__(self, contract, profile: Profile):
        super().__init__(contract, Path("unused.onnx"), {})
        self.profile = profile
        self.enqueued = 0

    def _run(self, inputs):
        check_profile(self.profile, inputs)
        self.enqueued += 1
        return {}

    def describe(self) -> SessionDescription:
        raise NotImplementedError


def test_narrow_profile_refuses_contract_valid_input_before_enqueue(contract):
    """Batch 3 is inside the contract (1..8) but outside an engine built for 1..2: the
    refusal is InputRejected (not a wrapped BackendError) and nothing is enqueued."""
    session = _ProfileCheckedSession(contract, derive_profile(contract, max_batch=2))
    session.infer(example_inputs(contract, batch=2))
    assert session.enqueued == 1
    with pytest.raises(InputRejected, match="profile_max_batch"):
        session.infer(example_inputs(contract, batch=3))
    assert session.enqueued == 1
    # Outside the contract itself, Session.infer's contract check refuses first.
    with pytest.raises(InputRejected, match="outside the contract's range"):
        session.infer(example_inputs(contract, batch=9))


# ---------------------------------------------------------------------------------------
# Precision candidates
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "cc", "ok"),
    [
        ("fp32", "6.1", True),
        ("tf32", "7.5", False),
        ("tf32", "8.0", True),
        ("fp16", "7.5", True),
        ("fp16", "5.2", False),
        ("bf16", "7.5", False),
        ("bf16", "8.0", True),
        ("bf16", "8.7", True),  # Jetson Orin
        ("fp8", "8.0", False),
        ("fp8", "8.7", False),
        ("fp8", "8.9", True),  # Ada
        ("fp8", "9.0", True),  # Hopper
        ("fp8", "12.0", True),
    ],
)
def test_precision_needs_compute_capability(precision, cc, ok):
    if ok:
        assert validate_precision(precision, cc) == precision
    else:
        with pytest.raises(BackendError, match=rf"{precision} needs compute capability >= .*this GPU has {cc}"):
            validate_precision(precision, cc)


def test_fp8_refusal_names_the_requirement():
    with pytest.raises(BackendError) as info:
        validate_precision("fp8", (8, 7))
    assert ">= 8.9" in str(info.value) and "Ada" in str(info.value) and "8.7" in str(info.value)


def test_unknown_precision_and_bad_compute_capability_are_refused():
    with pytest.raises(
        BackendError, match="unknown TensorRT precision 'int8'; candidates: fp32, tf32, fp16, bf16, fp8"
    ):
        validate_precision("int8", "9.0")
    for bad in ("nine", "9", "9.x", (9,), ("9", "0")):
        with pytest.raises(BackendError, match="not a compute capability"):
            parse_compute_capability(bad)  # type: ignore[arg-type]


def test_supported_precisions_per_gpu():
    assert PRECISIONS == ("fp32", "tf32", "fp16", "bf16", "fp8")
    assert supported_precisions("7.5") == ("fp32", "fp16")
    assert supported_precisions("8.7") == ("fp32", "tf32", "fp16", "bf16")
    assert supported_precisions("9.0") == PRECISIONS


def test_precisions_follow_the_installed_tensorrt():
    """TensorRT 11 has no BuilderFlag.FP16/BF16: fp16/bf16 are not offered there, and a
    request for them is refused before any build, with the reason and the way out."""
    trt10, trt11 = {"TF32", "FP16", "BF16"}, {"TF32"}
    assert supported_precisions("9.0", trt10) == PRECISIONS
    assert supported_precisions("9.0", trt11) == ("fp32", "tf32", "fp8")
    assert supported_precisions("8.7", set()) == ("fp32",)
    assert precision_problem("fp32", "9.0", trt11, "11.4.0") is None
    why = precision_problem("fp16", "9.0", trt11, "11.4.0")
    assert why.startswith("precision fp16: TensorRT 11.4.0 has no BuilderFlag.FP16")
    assert "pip install 'vlad[tensorrt]'" in why
    with pytest.raises(BackendError, match="bf16: TensorRT 11.4.0 has no BuilderFlag.BF16"):
        validate_precision("bf16", "9.0", trt11, "11.4.0")
    # The GPU is judged first: a cc 7.5 GPU cannot run bf16 whatever TensorRT offers.
    assert "compute capability >= 8.0" in precision_problem("bf16", "7.5", trt10)


def _qdq_model(path: Path, zero_point_type: int) -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [0.1])
    zp = helper.make_tensor("zp", zero_point_type, [], [0])
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], name="quant_x"),
            helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], name="dequant_x"),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[scale, zp],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    onnx.save(model, str(path))
    return path


def test_fp8_refused_for_demo_onnx_without_qdq():
    pytest.importorskip("onnx")
    summary = scan_onnx_qdq(DEMO_ONNX)
    assert summary == QDQSummary(0, 0, 0)
    with pytest.raises(BackendError, match="needs an explicitly quantized ONNX.*has no Q/DQ nodes"):
        require_fp8_qdq(summary, str(DEMO_ONNX))


def test_fp8_qdq_detection(tmp_path):
    onnx = pytest.importorskip("onnx")
    fp8 = scan_onnx_qdq(_qdq_model(tmp_path / "fp8.onnx", onnx.TensorProto.FLOAT8E4M3FN))
    assert (fp8.quantize, fp8.dequantize, fp8.fp8) == (1, 1, 2)
    require_fp8_qdq(fp8, "fp8.onnx")
    int8 = scan_onnx_qdq(_qdq_model(tmp_path / "int8.onnx", onnx.TensorProto.INT8))
    assert (int8.quantize, int8.dequantize, int8.fp8) == (1, 1, 0)
    with pytest.raises(BackendError, match="none is FP8"):
        require_fp8_qdq(int8, "int8.onnx")


def test_qdq_byte_scan_without_onnx_package(tmp_path, monkeypatch):
    onnx = pytest.importorskip("onnx")
    fp8_path = _qdq_model(tmp_path / "fp8.onnx", onnx.TensorProto.FLOAT8E4M3FN)
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` now fails
    demo = scan_onnx_qdq(DEMO_ONNX)
    assert (demo.quantize, demo.dequantize, demo.fp8) == (0, 0, None)
    with pytest.raises(BackendError, match="no Q/DQ nodes"):
        require_fp8_qdq(demo, "demo")
    found = scan_onnx_qdq(fp8_path)
    assert found.quantize >= 1 and found.dequantize >= 1 and found.fp8 is None
    require_fp8_qdq(found, "fp8.onnx")  # undecidable here; the build re-checks the network


# ---------------------------------------------------------------------------------------
# Cache keys, sidecars and the load-or-build policy
# ---------------------------------------------------------------------------------------


def _ingredients(contract: Contract, **changes) -> CacheIngredients:
    base = CacheIngredients(
        onnx_sha256=hashlib.sha256(b"policy").hexdigest(),
        tensorrt_version="10.7.0",
        gpu_name="NVIDIA Jetson AGX Orin",
        compute_capability="8.7",
        precision="fp16",
        profile=derive_profile(contract).canonical_json(),
    )
    return dataclasses.replace(base, **changes)


CHANGES = {
    "onnx_sha256": hashlib.sha256(b"retrained policy").hexdigest(),
    "tensorrt_version": "10.8.0",
    "gpu_name": "NVIDIA RTX 4000 Ada Generation",
    "compute_capability": "8.9",
    "precision": "fp32",
    "profile": None,  # filled per test: the profile narrowed to batch 4
}
FIELDS = list(CHANGES)


def _change(contract: Contract, field: str) -> dict:
    value = CHANGES[field]
    if field == "profile":
        value = derive_profile(contract, max_batch=4).canonical_json()
    return {field: value}


class _FakeBuild:
    """Stands in for the TensorRT build in policy tests: returns distinct bytes per call
    and records the timing cache it was offered. No TensorRT result is claimed here."""

    def __init__(self) -> None:
        self.calls: list[bytes | None] = []

    def __call__(self, timing: bytes | None) -> tuple[bytes, bytes | None]:
        self.calls.append(timing)
        n = len(self.calls)
        return f"plan-{n}".encode(), f"timing-{n}".encode()


def test_cache_key_is_stable_and_hex(contract):
    a, b = _ingredients(contract), _ingredients(contract)
    assert cache_key(a) == cache_key(b)
    assert len(cache_key(a)) == 64 and int(cache_key(a), 16) >= 0
    # Pinned value: the key format must not drift silently (engines on robots use it).
    assert cache_key(a) == cache_key(CacheIngredients.from_dict(json.loads(json.dumps(a.to_dict()))))


@pytest.mark.parametrize("field", FIELDS)
def test_cache_key_changes_with_each_ingredient(contract, field):
    base = _ingredients(contract)
    changed = _ingredients(contract, **_change(contract, field))
    assert cache_key(changed) != cache_key(base)


def test_all_single_ingredient_changes_give_distinct_keys(contract):
    keys = {cache_key(_ingredients(contract, **_change(contract, f))) for f in FIELDS}
    keys.add(cache_key(_ingredients(contract)))
    assert len(keys) == len(FIELDS) + 1


def test_timing_cache_key_ignores_model_but_not_machine(contract):
    base = _ingredients(contract)
    for field in ("onnx_sha256", "profile"):
        assert timing_cache_key(_ingredients(contract, **_change(contract, field))) == timing_cache_key(base)
    for field in ("tensorrt_version", "gpu_name", "compute_capability", "precision"):
        assert timing_cache_key(_ingredients(contract, **_change(contract, field))) != timing_cache_key(base)


def test_build_then_load_from_cache(contract, tmp_path):
    cache = EngineCache(tmp_path / "engines")
    ing = _ingredients(contract)
    build = _FakeBuild()
    first = prepare_engine(cache, ing, build)
    assert first.built and first.plan == b"plan-1" and build.calls == [None]
    assert first.path == tmp_path / "engines" / f"{cache_key(ing)}.engine"
    sidecar = json.loads(first.path.with_suffix(".json").read_text())
    assert sidecar["format"] == SIDECAR_FORMAT
    assert sidecar["key"] == cache_key(ing)
    assert sidecar["ingredients"] == ing.to_dict()
    assert sidecar["engine_sha256"] == hashlib.sha256(b"plan-1").hexdigest()
    second = prepare_engine(cache, ing, build)
    assert not second.built and second.plan == b"plan-1" and len(build.calls) == 1
    assert not [p for p in (tmp_path / "engines").rglob("*") if p.name.endswith(".tmp")]


def test_timing_cache_is_stored_and_offered_to_the_next_build(contract, tmp_path):
    cache = EngineCache(tmp_path)
    build = _FakeBuild()
    prepare_engine(cache, _ingredients(contract), build)
    # A retrained model on the same machine: new engine key, same timing cache.
    prepare_engine(cache, _ingredients(contract, **_change(contract, "onnx_sha256")), build)
    assert build.calls == [None, b"timing-1"]
    # Another TensorRT version: no timing cache offered.
    prepare_engine(cache, _ingredients(contract, tensorrt_version="10.9.0"), build)
    assert build.calls[-1] is None


def _pinned_engine(contract: Contract, tmp_path: Path) -> Path:
    """An engine + sidecar built "elsewhere" for the base ingredients."""
    return EngineCache(tmp_path / "shipped").store(_ingredients(contract), b"foreign-plan")


@pytest.mark.parametrize("field", FIELDS)
def test_pinned_engine_mismatch_is_refused_naming_the_field(contract, tmp_path, field):
    pinned = _pinned_engine(contract, tmp_path)
    here = _ingredients(contract, **_change(contract, field))
    build = _FakeBuild()
    with pytest.raises(EngineMismatch) as info:
        prepare_engine(EngineCache(tmp_path / "cache"), here, build, pinned=pinned)
    assert [m.field for m in info.value.mismatches] == [field]
    assert field in str(info.value) and 'on_mismatch = "error"' in str(info.value)
    assert build.calls == []  # refused, not rebuilt
    assert isinstance(info.value, BackendError)


@pytest.mark.parametrize("field", FIELDS)
def test_pinned_engine_mismatch_rebuilds_when_asked(contract, tmp_path, field):
    pinned = _pinned_engine(contract, tmp_path)
    here = _ingredients(contract, **_change(contract, field))
    build = _FakeBuild()
    cache = EngineCache(tmp_path / "cache")
    got = prepare_engine(cache, here, build, pinned=pinned, on_mismatch="rebuild")
    assert got.built and got.plan == b"plan-1" and got.path == cache.engine_path(cache_key(here))
    assert [m.field for m in got.replaced] == [field]
    assert pinned.read_bytes() == b"foreign-plan"  # the pinned file is never overwritten


def test_matching_pinned_engine_is_loaded(contract, tmp_path):
    pinned = _pinned_engine(contract, tmp_path)
    got = prepare_engine(EngineCache(tmp_path / "cache"), _ingredients(contract), _FakeBuild(), pinned=pinned)
    assert not got.built and got.plan == b"foreign-plan" and got.path == pinned


def test_pinned_engine_without_sidecar_is_refused(contract, tmp_path):
    pinned = tmp_path / "policy.engine"
    pinned.write_bytes(b"who built this?")
    with pytest.raises(EngineMismatch, match="sidecar"):
        prepare_engine(EngineCache(tmp_path / "cache"), _ingredients(contract), _FakeBuild(), pinned=pinned)


def test_tampered_sidecar_in_cache_is_refused_or_rebuilt(contract, tmp_path):
    cache = EngineCache(tmp_path)
    ing = _ingredients(contract)
    prepare_engine(cache, ing, _FakeBuild())
    sidecar_path = cache.sidecar_path(cache.engine_path(cache_key(ing)))
    sidecar = json.loads(sidecar_path.read_text())
    sidecar["ingredients"]["gpu_name"] = "NVIDIA GeForce RTX 3060"  # copied from another robot
    sidecar_path.write_text(json.dumps(sidecar))
    with pytest.raises(EngineMismatch) as info:
        prepare_engine(cache, ing, _FakeBuild())
    assert {m.field for m in info.value.mismatches} == {"key", "gpu_name"}
    build = _FakeBuild()
    got = prepare_engine(cache, ing, build, on_mismatch="rebuild")
    assert got.built and build.calls
    assert not prepare_engine(cache, ing, _FakeBuild()).built  # repaired


def test_corrupted_engine_bytes_are_refused(contract, tmp_path):
    cache = EngineCache(tmp_path)
    ing = _ingredients(contract)
    path = prepare_engine(cache, ing, _FakeBuild()).path
    path.write_bytes(b"plan-X")
    with pytest.raises(EngineMismatch, match="engine_sha256"):
        prepare_engine(cache, ing, _FakeBuild())


def test_unknown_sidecar_format_is_refused(contract, tmp_path):
    cache = EngineCache(tmp_path)
    ing = _ingredients(contract)
    path = prepare_engine(cache, ing, _FakeBuild()).path
    path.with_suffix(".json").write_text(json.dumps({"format": "vlad.tensorrt-engine/99"}))
    with pytest.raises(EngineMismatch, match="format"):
        prepare_engine(cache, ing, _FakeBuild())


def test_engine_without_sidecar_in_cache_is_rebuilt_not_loaded(contract, tmp_path):
    """An interrupted store leaves the engine but not its sidecar: it is never loaded."""
    cache = EngineCache(tmp_path)
    ing = _ingredients(contract)
    cache.engine_path(cache_key(ing)).parent.mkdir(parents=True, exist_ok=True)
    cache.engine_path(cache_key(ing)).write_bytes(b"half-written")
    got = prepare_engine(cache, ing, _FakeBuild())
    assert got.built and got.plan == b"plan-1"


def test_miss_without_allow_build_is_an_error(contract, tmp_path):
    with pytest.raises(BackendError, match="allow_build is false.*python -m vlad_tensorrt build"):
        prepare_engine(EngineCache(tmp_path), _ingredients(contract), _FakeBuild(), allow_build=False)


def test_bad_on_mismatch_and_missing_pinned_file(contract, tmp_path):
    with pytest.raises(BackendError, match="on_mismatch must be one of error, rebuild"):
        prepare_engine(EngineCache(tmp_path), _ingredients(contract), _FakeBuild(), on_mismatch="ignore")
    with pytest.raises(BackendError, match="does not exist"):
        prepare_engine(EngineCache(tmp_path), _ingredients(contract), _FakeBuild(), pinned=tmp_path / "nope.engine")


def test_atomic_write_replaces_whole_file_or_nothing(tmp_path, monkeypatch):
    target = tmp_path / "sub" / "x.engine"
    atomic_write(target, b"old")
    assert target.read_bytes() == b"old"
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"

    def boom(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, b"torn")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.engine"]


def test_file_sha256_matches_hashlib(tmp_path):
    p = tmp_path / "blob"
    p.write_bytes(b"x" * 3_000_001)
    assert file_sha256(p, chunk=1 << 16) == hashlib.sha256(b"x" * 3_000_001).hexdigest()


# ---------------------------------------------------------------------------------------
# Options, registration and availability
# ---------------------------------------------------------------------------------------


def test_options_defaults():
    opts = TensorRTOptions.parse(None)
    assert opts.precision == "fp32"
    assert opts.cache_dir == "/var/lib/vlad/engines"
    assert opts.on_mismatch == "error"
    assert opts.profile_max_batch is None and opts.cuda_graph is False and opts.allow_build is True


def test_options_report_every_problem_at_once():
    with pytest.raises(BackendError) as info:
        TensorRTOptions.parse(
            {"precision": "int8", "cuda_graph": "yes", "profile_max_batch": 0, "device": True, "cache_dri": "/x"}
        )
    msg = str(info.value)
    for part in (
        "options.cache_dri: unknown key (did you mean 'cache_dir'?)",
        "options.precision: unknown value 'int8'",
        "options.cuda_graph: expected true or false, got a string",
        "options.profile_max_batch: must be >= 1",
        "options.device: expected an integer, got a boolean",
    ):
        assert part in msg, msg
    assert msg.startswith("tensorrt: ") and "\n" not in msg


def test_plugin_registers_through_the_entry_point():
    from vlad.plugins import backends, make_plugin_manager

    found = backends(make_plugin_manager())
    assert isinstance(found["tensorrt"], TensorRTBackend)
    assert found["tensorrt"].artifact_suffixes() == (".onnx",)


def test_availability_when_tensorrt_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError
    avail = TensorRTBackend().availability()
    assert not avail.usable and avail.runtime == "tensorrt"
    assert avail.reason.startswith(
        "tensorrt is not installed (pip install 'vlad[tensorrt]' on a machine with an NVIDIA GPU)"
    )


def test_availability_when_cuda_python_is_missing(monkeypatch):
    # Reaching the cuda-python check needs `import tensorrt` to succeed; a bare module
    # stands in for it (nothing of TensorRT is called).
    monkeypatch.setattr(trt_engine, "import_tensorrt", lambda: object())
    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    avail = TensorRTBackend().availability()
    assert not avail.usable and avail.reason.startswith("cuda-python is not installed")


def test_availability_when_no_gpu_is_visible(monkeypatch):
    class _NoDevice:
        class cudaError_t:  # noqa: N801 (mirrors cuda-python's enum)
            cudaSuccess = 0
            cudaErrorNoDevice = 100

        @staticmethod
        def cudaGetDeviceCount():  # noqa: N802
            return (100, 0)

        @staticmethod
        def cudaGetErrorName(err):  # noqa: N802
            return (0, b"cudaErrorNoDevice")

    monkeypatch.setattr(trt_engine, "import_tensorrt", lambda: object())
    monkeypatch.setattr(trt_engine, "import_cudart", lambda: _NoDevice)
    avail = TensorRTBackend().availability()
    assert not avail.usable and avail.reason == "no CUDA GPU visible (cudaErrorNoDevice)"


def test_availability_on_this_machine_gives_a_clear_reason():
    avail = TensorRTBackend().availability()
    if avail.usable:
        assert avail.devices and avail.version
        return
    assert avail.reason.startswith(
        ("tensorrt is not installed", "cuda-python is not installed", "no CUDA GPU", "CUDA device")
    )


def test_load_without_runtime_raises_unavailable_after_checking_options(contract, tmp_path):
    backend = TensorRTBackend()
    with pytest.raises(BackendError, match="options.precison: unknown key"):
        backend.load(DEMO_ONNX, contract, {"precison": "fp16"})
    if backend.availability().usable:
        pytest.skip("TensorRT is usable here; the unavailable path is covered by the monkeypatched tests")
    with pytest.raises(BackendUnavailable) as info:
        backend.load(DEMO_ONNX, contract, {"cache_dir": str(tmp_path)})
    assert str(info.value) == backend.availability().reason
    assert not list(tmp_path.iterdir())  # nothing built or written


def test_build_cli_reports_one_line_errors(capsys, tmp_path):
    from vlad_tensorrt.__main__ import main

    demo = ["--contract", str(DEMO_DIR / "contract.toml"), "--onnx", str(DEMO_ONNX), "--cache-dir", str(tmp_path)]
    assert main(["build", *demo, "--profile-max-batch", "0"]) == 1
    assert capsys.readouterr().err.strip() == "vlad_tensorrt: tensorrt: options.profile_max_batch: must be >= 1, got 0"
    avail = TensorRTBackend().availability()
    if avail.usable:
        return
    assert main(["info"]) == 1
    assert capsys.readouterr().err.strip() == f"vlad_tensorrt: {avail.reason}"


# ---------------------------------------------------------------------------------------
# The session's own logic, on a stand-in for TensorRT and the CUDA runtime
# (tests/backends/trt_standin.py): buffers, contexts, graphs, ownership, release order.
# ---------------------------------------------------------------------------------------


@pytest.fixture
def standin(contract, monkeypatch, tmp_path):
    """Load the demo through TensorRTBackend.load with TensorRT and cudart replaced by the
    stand-in; returns a loader and the fake cudart (whose log records frees)."""
    from .trt_standin import FakeCudart, fake_tensorrt

    cudart = FakeCudart()
    profile = derive_profile(contract)
    trt = fake_tensorrt(contract, profile, cudart)
    device = trt_engine.DeviceInfo(
        0, "Stand-in GPU", (9, 0), trt.__version__, ((0, "Stand-in GPU", (9, 0)),), frozenset({"TF32", "FP16", "BF16"})
    )
    monkeypatch.setattr(trt_engine, "import_tensorrt", lambda: trt)
    monkeypatch.setattr(trt_engine, "import_cudart", lambda: cudart)
    monkeypatch.setattr(trt_engine, "build_serialized_engine", lambda *a, **k: (b"fake-plan" + b"\0" * 1000, None))
    monkeypatch.setattr(TensorRTBackend, "_probe", lambda self, index: device)

    def load(**options):
        opts = {"cache_dir": str(tmp_path / "engines"), "progress": False, **options}
        return TensorRTBackend().load(DEMO_ONNX, contract, opts)

    return load, cudart


def _random_inputs(contract, batch: int, seed: int, vocab: int) -> dict[str, np.ndarray]:
    """Contract inputs with new random data (token ids below ``vocab``)."""
    rng = np.random.default_rng(seed)
    x = example_inputs(contract, batch=batch)
    for name, v in x.items():
        if v.dtype == np.int64:
            x[name] = rng.integers(0, vocab, v.shape, dtype=np.int64)
        else:
            x[name] = rng.standard_normal(v.shape).astype(v.dtype)
    return x


def test_standin_device_buffers_are_zeroed_before_the_graph_capture(standin):
    """cudaMalloc memory holds garbage; the capture at load runs the engine on it, and
    garbage int64 token ids are out-of-range embedding indices. Zeroed, the capture works."""
    import ctypes

    load, cudart = standin
    with load(cuda_graph=True) as s:
        for b in s._bindings:
            assert ctypes.string_at(b.device, b.nbytes) == bytes(b.nbytes), b.name
        assert s.graph_launches == 0 and s.describe().extra["cuda_graph"]


def test_standin_graph_replays_new_data_and_never_a_stale_shape(standin, contract):
    """A sequence of batch sizes with fresh data each call: batch 1 (the captured opt
    shape) replays the graph on its own context, any other batch runs the main context;
    every output equals the reference computed from that call's own inputs."""
    from .trt_standin import VOCAB, reference

    load, _ = standin
    batches = [1, 1, 3, 1, 8, 2, 1, 1, 5, 1]
    with load(cuda_graph=True) as s:
        for i, batch in enumerate(batches):
            inputs = _random_inputs(contract, batch, seed=i, vocab=VOCAB)
            got = s.infer(inputs)["actions"]
            np.testing.assert_allclose(got, reference(inputs), rtol=0, atol=1e-6)
        assert s.graph_launches == batches.count(1)
        assert s.plain_launches == len(batches) - batches.count(1)
        assert s.last_timing.h2d_ms is not None and s.last_timing.d2h_ms is not None


def test_standin_outputs_stay_readable_after_close(standin, contract):
    """Outputs are views of pinned staging memory: close() must not free memory that a
    caller still reads. The memory goes back once the last output is dropped."""
    import gc

    from .trt_standin import VOCAB

    load, cudart = standin
    s = load()
    inputs = _random_inputs(contract, 2, seed=7, vocab=VOCAB)
    out = s.infer(inputs)["actions"]
    want = out.copy()
    s.close()
    s.close()  # idempotent
    assert not cudart.live_device  # every device buffer is freed at close
    gc.collect()
    np.testing.assert_array_equal(out, want)
    assert len(cudart.live_host) == 1  # only the pinned buffer behind `out` is still held
    del out
    gc.collect()
    assert not cudart.live_host
    with pytest.raises(BackendError, match="session is closed"):
        s.infer(inputs)


def test_standin_session_dropped_without_close_releases_the_gpu(standin):
    """A session that is garbage collected without close() frees its device memory, graph,
    events and stream, and drops its contexts before the engine before the runtime."""
    import gc

    load, cudart = standin
    s = load(cuda_graph=True)
    assert cudart.live_device and cudart.live_host
    del s
    gc.collect()
    assert not cudart.live_device and not cudart.live_host
    names = [entry[0] for entry in cudart.log]
    assert "cudaGraphExecDestroy" in names and "cudaStreamDestroy" in names
    order = [n for n in names if n.endswith("deleted")]
    assert order == ["context deleted", "context deleted", "engine deleted", "runtime deleted"]
    assert names.index("cudaGraphExecDestroy") < names.index("context deleted")


def test_standin_memory_counts_weights_contexts_and_buffers(standin):
    load, _ = standin
    with load() as plain, load(cuda_graph=True) as graphed:
        buffers = sum(b.nbytes for b in plain._bindings)
        plan = len(plain.prepared.plan)
        assert plain.describe().extra["weights_bytes_source"] == "plan_size"
        assert plain.memory().device_peak_bytes == plan + 4096 + buffers
        assert graphed.memory().device_peak_bytes == plan + 2 * 4096 + buffers  # two contexts
    assert plain.memory().device_peak_bytes == 0  # closed: nothing held on the device


def test_timing_cache_refused_by_tensorrt_falls_back_to_an_empty_one():
    """set_timing_cache returns False for a cache TensorRT will not use; the build must not
    go on as if it had one."""
    from types import SimpleNamespace

    from vlad_tensorrt.engine import attach_timing_cache

    class Config:
        def __init__(self, accept_stored: bool, accept_empty: bool = True) -> None:
            self.accept = {True: accept_stored, False: accept_empty}
            self.attached = None

        def create_timing_cache(self, data):
            return SimpleNamespace(data=data)

        def set_timing_cache(self, cache, ignore_mismatch):
            assert ignore_mismatch is False
            ok = self.accept[bool(cache.data)]
            self.attached = cache if ok else self.attached
            return ok

    notes: list[str] = []
    good = Config(accept_stored=True)
    assert attach_timing_cache(good, b"stored", notes.append).data == b"stored" and not notes
    refused = Config(accept_stored=False)
    assert attach_timing_cache(refused, b"foreign", notes.append).data == b""
    assert refused.attached.data == b"" and "refused" in notes[0]
    assert attach_timing_cache(Config(True), None).data == b""
    with pytest.raises(BackendError, match="refused an empty timing cache"):
        attach_timing_cache(Config(False, accept_empty=False), b"x")


def test_fp8_is_judged_by_the_quantize_layer_output_type():
    """Before the build a parsed network's Quantize output tensor may still say FLOAT; the
    layer's own to_type (IQuantizeLayer) says what it quantizes to."""
    from types import SimpleNamespace

    from vlad_tensorrt.engine import _require_fp8_layers, quantize_output_type

    DataType = SimpleNamespace(FLOAT=0, INT8=1, FP8=2)  # noqa: N806

    class ILayer:
        def __init__(self, kind, out_dtype, to_type=None):
            self.type, self._out, self._to = kind, out_dtype, to_type

        def get_output(self, i):
            return SimpleNamespace(dtype=self._out)

    class IQuantizeLayer(ILayer):
        @property
        def to_type(self):
            return self._to

    trt = SimpleNamespace(
        LayerType=SimpleNamespace(QUANTIZE="Q", MATMUL="MM"), DataType=DataType, IQuantizeLayer=IQuantizeLayer
    )

    def network(*layers):
        return SimpleNamespace(num_layers=len(layers), get_layer=lambda i: layers[i])

    assert quantize_output_type(trt, ILayer("Q", DataType.FLOAT, DataType.FP8)) == DataType.FP8
    _require_fp8_layers(trt, network(ILayer("MM", DataType.FLOAT), ILayer("Q", DataType.FLOAT, DataType.FP8)), "m")
    with pytest.raises(BackendError, match="2 Quantize layers and none quantizes to FP8"):
        _require_fp8_layers(
            trt, network(ILayer("Q", DataType.FLOAT, DataType.INT8), ILayer("Q", DataType.FP8, DataType.INT8)), "m"
        )


def test_host_buffer_is_freed_by_its_last_view_not_before():
    import ctypes
    import gc

    from vlad_tensorrt.buffers import HostBuffer

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    freed: list[int] = []
    ptr = libc.malloc(64)
    buf = HostBuffer(ptr, 64, lambda p: (freed.append(p), libc.free(p)))
    flat = buf.array()
    assert flat.base is buf and flat.flags.writeable and flat.nbytes == 64
    view = flat.view(np.float32)[:4].reshape(2, 2)
    view[:] = 1.5
    del buf, flat
    gc.collect()
    assert not freed  # a view still reads it
    assert view.sum() == 6.0
    del view
    gc.collect()
    assert freed == [ptr]


# ---------------------------------------------------------------------------------------
# Hardware: real TensorRT on a CUDA GPU (skipped elsewhere, with the reason)
# ---------------------------------------------------------------------------------------

# Initial error budgets against ONNX Runtime CPU fp32 (vlad_tools.testing.golden.MAX_ABS): fp32 is
# tight enough to catch TF32 left on. The release's equivalence gate owns the approved budget.
ATOL = MAX_ABS


@pytest.fixture(scope="module")
def trt_backend() -> TensorRTBackend:
    backend = TensorRTBackend()
    avail = backend.availability()
    if not avail.usable:
        if avail.reason.startswith("tensorrt"):
            pytest.skip(f"TensorRT not installed: {avail.reason}")
        pytest.skip(avail.reason)
    return backend


@pytest.fixture(scope="module")
def engine_dir(engine_cache_root) -> Path:
    """Engines built by these tests: a temporary folder (never /var/lib/vlad), shared with
    the conformance suite and gpu-check's probe through VLAD_TEST_ENGINE_CACHE."""
    return engine_cache_root / "tensorrt"


@pytest.fixture(scope="module")
def ort_session():
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(DEMO_ONNX), providers=["CPUExecutionProvider"])


def _reference(ort_session, inputs):
    return ort_session.run(["actions"], dict(inputs))[0]


def _skip_unless_gpu_supports(backend: TensorRTBackend, precision: str) -> None:
    """Skip, with the reason, a precision this GPU or the installed TensorRT cannot build."""
    device = backend._probe(0)
    why = precision_problem(precision, device.compute_capability, device.builder_flags, device.tensorrt_version)
    if why:
        pytest.skip(why)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
def test_gpu_engine_matches_onnxruntime(trt_backend, engine_dir, ort_session, contract, precision):
    _skip_unless_gpu_supports(trt_backend, precision)
    with trt_backend.load(DEMO_ONNX, contract, {"precision": precision, "cache_dir": str(engine_dir)}) as s:
        for batch in (1, 3, 8):
            inputs = example_inputs(contract, batch=batch)
            inputs["tokens"] = np.random.default_rng(batch).integers(
                0, DEMO_VOCAB, inputs["tokens"].shape, dtype=np.int64
            )
            got = s.infer(inputs)["actions"].copy()
            want = _reference(ort_session, inputs)
            assert got.shape == want.shape == (batch, 8, 2)
            np.testing.assert_allclose(got, want, atol=ATOL[precision], rtol=0)
            t = s.last_timing
            assert t.h2d_ms is not None and t.d2h_ms is not None and min(t.h2d_ms, t.compute_ms, t.d2h_ms) >= 0
        d = s.describe()
        device = trt_backend._probe(0)
        assert (d.backend, d.runtime, d.precision) == ("tensorrt", "tensorrt", precision)
        assert d.runtime_version == device.tensorrt_version
        major, minor = device.compute_capability
        assert device.name in d.device and f"cc {major}.{minor}" in d.device
        assert d.cache_key == cache_key(s.ingredients)
        assert Path(d.extra["engine"]).is_file() and Path(d.extra["engine"]).with_suffix(".json").is_file()
        assert s.memory().device_peak_bytes > 0


@pytest.mark.gpu
def test_gpu_engine_cache_is_reused(trt_backend, engine_dir, contract):
    opts = {"precision": "fp32", "cache_dir": str(engine_dir)}
    with trt_backend.load(DEMO_ONNX, contract, opts) as first:
        key = first.describe().cache_key
    with trt_backend.load(DEMO_ONNX, contract, {**opts, "allow_build": False}) as second:
        assert second.describe().cache_key == key
        assert second.describe().extra["built"] is False


@pytest.mark.gpu
def test_gpu_foreign_engine_is_refused(trt_backend, engine_dir, contract, tmp_path):
    with trt_backend.load(DEMO_ONNX, contract, {"precision": "fp32", "cache_dir": str(engine_dir)}) as s:
        built = Path(s.describe().extra["engine"])
    pinned = tmp_path / "shipped.engine"
    shutil.copy(built, pinned)
    sidecar = json.loads(built.with_suffix(".json").read_text())
    sidecar["ingredients"]["tensorrt_version"] = "9.9.9"
    sidecar["key"] = cache_key(CacheIngredients.from_dict(sidecar["ingredients"]))
    pinned.with_suffix(".json").write_text(json.dumps(sidecar))
    with pytest.raises(EngineMismatch, match="tensorrt_version: engine 9.9.9"):
        trt_backend.load(
            DEMO_ONNX, contract, {"precision": "fp32", "cache_dir": str(engine_dir), "engine": str(pinned)}
        )


@pytest.mark.gpu
def test_gpu_fp8_is_refused_for_the_demo_onnx(trt_backend, contract, tmp_path):
    with pytest.raises(BackendError, match="compute capability >= 8.9|no Q/DQ nodes"):
        trt_backend.load(DEMO_ONNX, contract, {"precision": "fp8", "cache_dir": str(tmp_path)})
    assert not list(tmp_path.iterdir())


@pytest.mark.gpu
def test_gpu_narrow_profile_rejects_before_enqueue(trt_backend, engine_dir, ort_session, contract):
    opts = {"precision": "fp32", "cache_dir": str(engine_dir), "profile_max_batch": 2}
    with trt_backend.load(DEMO_ONNX, contract, opts) as s:
        inputs = example_inputs(contract, batch=2)
        want = _reference(ort_session, inputs)
        np.testing.assert_allclose(s.infer(inputs)["actions"], want, atol=ATOL["fp32"], rtol=0)
        launches = s.plain_launches
        with pytest.raises(InputRejected, match="profile_max_batch"):
            s.infer(example_inputs(contract, batch=3))
        assert s.plain_launches == launches


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_equals_normal_execution(trt_backend, engine_dir, contract):
    opts = {"precision": "fp32", "cache_dir": str(engine_dir)}
    with (
        trt_backend.load(DEMO_ONNX, contract, opts) as plain,
        trt_backend.load(DEMO_ONNX, contract, {**opts, "cuda_graph": True}) as graphed,
    ):
        assert graphed.describe().extra["cuda_graph"] == {t.name: list(t.opt) for t in graphed.profile.tensors}
        opt_inputs = example_inputs(contract)
        want = plain.infer(opt_inputs)["actions"].copy()
        for _ in range(3):  # replays, not a one-off
            np.testing.assert_allclose(graphed.infer(opt_inputs)["actions"], want, atol=1e-6, rtol=0)
        assert graphed.graph_launches == 3 and graphed.plain_launches == 0
        other = example_inputs(contract, batch=4)  # not the captured shape: normal execution
        np.testing.assert_allclose(graphed.infer(other)["actions"], plain.infer(other)["actions"], atol=1e-6, rtol=0)
        assert graphed.graph_launches == 3 and graphed.plain_launches == 1
        # Back at the captured shape, the graph is replayed again.
        np.testing.assert_allclose(graphed.infer(opt_inputs)["actions"], want, atol=1e-6, rtol=0)
        assert graphed.graph_launches == 4


@pytest.mark.gpu
def test_gpu_graph_replays_new_data_over_a_sequence_of_batch_sizes(trt_backend, engine_dir, contract):
    """Fresh data on every call, batch sizes switching between the captured one and
    others: every graphed output equals the plain session's for the same inputs."""
    opts = {"precision": "fp32", "cache_dir": str(engine_dir)}
    batches = [1, 1, 3, 1, 8, 2, 1, 1, 5, 1]
    with (
        trt_backend.load(DEMO_ONNX, contract, opts) as plain,
        trt_backend.load(DEMO_ONNX, contract, {**opts, "cuda_graph": True}) as graphed,
    ):
        for i, batch in enumerate(batches):
            inputs = _random_inputs(contract, batch, seed=100 + i, vocab=DEMO_VOCAB)
            want = plain.infer(inputs)["actions"].copy()
            np.testing.assert_allclose(
                graphed.infer(inputs)["actions"], want, atol=1e-6, rtol=0, err_msg=f"call {i}, batch {batch}"
            )
        assert graphed.graph_launches == batches.count(1)
        assert graphed.plain_launches == len(batches) - batches.count(1)


@pytest.mark.gpu
def test_gpu_input_buffers_are_zeroed_after_allocation(trt_backend, engine_dir, contract):
    cudart = trt_engine.import_cudart()
    with trt_backend.load(DEMO_ONNX, contract, {"precision": "fp32", "cache_dir": str(engine_dir)}) as s:
        for b in s._inputs:
            host = np.ones(b.nbytes, np.uint8)
            kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
            trt_engine.cuda_check(cudart, cudart.cudaMemcpy(host.ctypes.data, b.device, b.nbytes, kind), "D2H")
            assert not host.any(), f"{b.name}: device buffer not zeroed"


_CHILD_READS_AFTER_CLOSE = """
import gc, sys
import numpy as np
from vlad.backend import example_inputs
from vlad.contract import load_contract
from vlad_tensorrt import TensorRTBackend
contract = load_contract(sys.argv[1])
s = TensorRTBackend().load(sys.argv[2], contract, {"cache_dir": sys.argv[3], "progress": False})
out = s.infer(example_inputs(contract, batch=3))["actions"]
want = out.copy()
s.close()
del s
gc.collect()
junk = [np.ones(1 << 20, np.float32) for _ in range(64)]  # reuse freed host memory, if any was freed
assert np.array_equal(out, want), "output changed after close()"
print("ok", float(out.sum()))
"""


@pytest.mark.gpu
def test_gpu_outputs_read_after_close_in_a_child_process(trt_backend, engine_dir, contract):
    """Outputs are views of pinned memory; reading them after close() must neither crash
    nor see other data. Run in a child so a crash fails this test, not the session."""
    import subprocess

    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD_READS_AFTER_CLOSE,
            str(DEMO_DIR / "contract.toml"),
            str(DEMO_ONNX),
            str(engine_dir),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-2000:]


def _device_free_bytes() -> int:
    cudart = trt_engine.import_cudart()
    free, _total = trt_engine.cuda_check(cudart, cudart.cudaMemGetInfo(), "cudaMemGetInfo")
    return int(free)


@pytest.mark.gpu
def test_gpu_session_dropped_without_close_gives_the_memory_back(trt_backend, engine_dir, contract):
    import gc

    opts = {"precision": "fp32", "cache_dir": str(engine_dir), "cuda_graph": True}
    with trt_backend.load(DEMO_ONNX, contract, opts) as warm:  # CUDA context and libraries loaded
        warm.infer(example_inputs(contract))
    gc.collect()
    before = _device_free_bytes()
    for _ in range(3):
        s = trt_backend.load(DEMO_ONNX, contract, opts)
        s.infer(example_inputs(contract))
        del s  # no close()
        gc.collect()
    lost = before - _device_free_bytes()
    assert lost < 16 * 2**20, f"{lost / 2**20:.1f} MiB of device memory not given back"


@pytest.mark.gpu
def test_gpu_corrupted_cached_engine_is_refused_then_rebuilt(trt_backend, engine_dir, contract, tmp_path, ort_session):
    if engine_dir.is_dir():  # start from the engines (and timing cache) already built: only the rebuild builds
        shutil.copytree(engine_dir, tmp_path, dirs_exist_ok=True)
    opts = {"precision": "fp32", "cache_dir": str(tmp_path), "progress": False}
    with trt_backend.load(DEMO_ONNX, contract, opts) as s:
        engine = Path(s.describe().extra["engine"])
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0xFF
    engine.write_bytes(bytes(data))
    with pytest.raises(EngineMismatch, match="engine_sha256"):
        trt_backend.load(DEMO_ONNX, contract, opts)
    with trt_backend.load(DEMO_ONNX, contract, {**opts, "on_mismatch": "rebuild"}) as s:
        assert s.describe().extra["built"] is True
        inputs = _random_inputs(contract, 2, seed=5, vocab=DEMO_VOCAB)
        np.testing.assert_allclose(
            s.infer(inputs)["actions"], _reference(ort_session, inputs), atol=ATOL["fp32"], rtol=0
        )
