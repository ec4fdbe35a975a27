"""What a GPU run must show beside the conformance suite, measured: every (GPU backend,
precision label) against the golden fixtures and its label's budget, with warm latency and
the timing split; the TF32 switch on a large matmul; 10 load/close cycles without device
memory growth; outputs read after close in a child process; cold start in a fresh process.

Every test here is marked ``gpu`` and skips with the backend's or device's reason where it
cannot run (no GPU: all of them). Figures are recorded as JUnit properties
(``record_property``): ``scripts/gpu_check.py`` turns them into its report's figures and
speed-ups (warm p50 of each target against ``torch[cuda] fp32``).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.backends.conftest import VARIANTS, Variant, _auto_precision, all_backends, variant_unavailable
from vlad.contract import Contract
from vlad.errors import BackendError
from vlad_tools.testing.golden import MAX_ABS
from vlad_tools.testing.releases import DEMO

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
LOAD_CYCLES = 10
MEMORY_GROWTH_LIMIT = 64 * 2**20
WARMUP, CALLS = 20, 200
TIMER_SLACK_MS = 0.05  # CUDA event resolution is ~0.5 us; wall clock reads add a little
# The labels each GPU variant is measured at; a label the GPU or backend cannot honour
# skips with the refusal (ORT's TensorRT provider cannot turn TF32 off on Ampere+).
PRECISIONS = {
    "torch[cuda]": ("fp32", "tf32", "fp16", "bf16"),
    "onnxruntime[cuda]": ("fp32", "tf32"),
    "onnxruntime[tensorrt]": ("fp32", "tf32", "fp16", "bf16"),
    "tensorrt": ("fp32", "tf32", "fp16", "bf16"),
}
GPU_VARIANTS = [v for vs in VARIANTS.values() for v in vs if v.gpu and v.id in PRECISIONS]
TARGETS = [(v, p) for v in GPU_VARIANTS for p in PRECISIONS[v.id]]


def _target_id(v: Variant, precision: str) -> str:
    return f"{v.id} {precision}"


def _backend(v: Variant):
    """The backend of ``v``; skips with the reason where it cannot run here."""
    backends = all_backends()
    if v.backend not in backends:
        pytest.skip(f"{v.id}: the {v.backend} plugin is not installed")
    backend = backends[v.backend]
    avail = backend.availability()
    if not avail.usable:
        pytest.skip(f"{v.id}: {avail.reason}")
    if why := variant_unavailable(v):
        pytest.skip(f"{v.id}: {why}")
    return backend


def _top_precision(v: Variant) -> str:
    """The highest label ``v`` honours here: fp32, or tf32 for ORT's TensorRT provider on
    Ampere+ (it cannot turn TF32 off)."""
    _backend(v)
    return _auto_precision(v) if "precision" in v.needs else "fp32"


def _load(v: Variant, precision: str, contract: Contract, engine_cache: Path, **extra):
    """A session of ``v`` at ``precision``; skips with the reason where it cannot run here."""
    backend = _backend(v)
    options = {**v.options, "precision": precision, **extra}
    if "cache_dir" in v.needs:
        options.setdefault("cache_dir", str(engine_cache / v.backend))
    try:
        return backend.load(DEMO / (v.artifact or "policy.onnx"), contract, options)
    except BackendError as exc:  # a label this GPU or backend cannot honour
        pytest.skip(f"{_target_id(v, precision)}: {str(exc).splitlines()[0][:200]}")


def _max_abs(session, golden) -> float:
    worst = 0.0
    for inputs, ref in golden:
        out = session.infer(inputs)
        worst = max(worst, max(float(np.abs(out[k].astype(np.float64) - r).max()) for k, r in ref.items()))
    return worst


def _fresh_inputs(contract: Contract, batch: int, seed: int) -> dict[str, np.ndarray]:
    from vlad.backend import example_inputs

    rng = np.random.default_rng(seed)
    vocab = json.loads((DEMO / "model_config.json").read_text())["vocab_size"]  # token ids index an embedding
    return {
        k: rng.integers(0, vocab, x.shape, dtype=np.int64)
        if x.dtype == np.int64
        else rng.standard_normal(x.shape).astype(x.dtype)
        for k, x in example_inputs(contract, batch=batch).items()
    }


def _device_used_bytes() -> int | None:
    """Device memory in use on GPU 0 as the driver sees it (all allocators), or None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.cuda.empty_cache()  # torch's cache is not a leak; measure what the driver holds
    free, total = torch.cuda.mem_get_info(0)
    return int(total - free)


@pytest.mark.parametrize(("v", "precision"), TARGETS, ids=[f"{v.id}-{p}" for v, p in TARGETS])
def test_gpu_golden_error_within_the_label_budget_and_warm_latency(
    v, precision, contract, golden, engine_cache_root, record_property
):
    session = _load(v, precision, contract, engine_cache_root)
    try:
        label = session.describe().precision
        err = _max_abs(session, golden)
        record_property("target", _target_id(v, precision))
        record_property("max_abs", err)
        assert label == precision, f"asked for {precision}, the session says {label}"
        assert err <= MAX_ABS[label], f"max |err| {err:.3g} > {MAX_ABS[label]:g} ({label})"
        inputs = golden[0][0]
        for _ in range(WARMUP):
            session.infer(inputs)
        walls, splits, inconsistent = [], [], 0
        for _ in range(CALLS):
            t0 = time.perf_counter()
            session.infer(inputs)
            wall = (time.perf_counter() - t0) * 1e3
            t = session.last_timing
            walls.append(wall)
            splits.append((t.h2d_ms or 0.0, t.compute_ms, t.d2h_ms or 0.0))
            inconsistent += t.total_ms > wall + TIMER_SLACK_MS
    finally:
        session.close()
    w, s = np.array(walls), np.median(np.array(splits), axis=0)
    for q in (50, 95, 99):
        record_property(f"p{q}_ms", float(np.percentile(w, q)))
    for name, value in zip(("h2d_p50_ms", "compute_p50_ms", "d2h_p50_ms"), s, strict=True):
        record_property(name, float(value))
    assert not inconsistent, f"{inconsistent}/{CALLS} calls with h2d + compute + d2h > wall time"


def test_gpu_tf32_switch_shows_on_a_large_matmul(record_property):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"no CUDA device visible to torch {torch.__version__}")
    from vlad_torch.session import set_tf32

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(4096, 4096, device="cuda", generator=g)
    b = torch.randn(4096, 4096, device="cuda", generator=g)
    ref = a.double() @ b.double()
    errs = {}
    try:
        for on in (False, True):
            set_tf32(torch, on)
            errs["tf32" if on else "ieee"] = float(((a @ b).double() - ref).abs().max() / ref.abs().max())
    finally:
        set_tf32(torch, False)
    record_property("relative_max_err", errs)
    assert errs["ieee"] < 1e-5
    if torch.cuda.get_device_capability() >= (8, 0):
        assert errs["tf32"] > 10 * errs["ieee"], errs


@pytest.mark.parametrize("v", GPU_VARIANTS, ids=[v.id for v in GPU_VARIANTS])
def test_gpu_load_close_cycles_keep_device_memory(v, contract, engine_cache_root, record_property):
    precision = _top_precision(v)
    with _load(v, precision, contract, engine_cache_root) as s:  # warm: CUDA context, libraries, engines
        s.infer(_fresh_inputs(contract, 1, 0))
    gc.collect()
    before = _device_used_bytes()
    if before is None:
        pytest.skip("device memory not readable (no torch CUDA)")
    t0 = time.perf_counter()
    for i in range(LOAD_CYCLES):
        with _load(v, precision, contract, engine_cache_root) as s:
            s.infer(_fresh_inputs(contract, 1, i))
    seconds = time.perf_counter() - t0
    gc.collect()
    after = _device_used_bytes()
    assert after is not None
    record_property("before_bytes", before)
    record_property("after_bytes", after)
    record_property("seconds_per_cycle", seconds / LOAD_CYCLES)
    assert after - before < MEMORY_GROWTH_LIMIT, f"device memory {before / 2**20:.0f} -> {after / 2**20:.0f} MiB"


# A fresh interpreter per check: a crash or a process-wide state fails the test, not the run.
_CHILD = """
import gc, json, sys, time
t0 = time.perf_counter()
import numpy as np
from vlad import plugins
from vlad.contract import load_contract
args = json.loads(sys.argv[1])
contract = load_contract(args["contract"])
backend = plugins.get_backend(args["backend"], plugins.make_plugin_manager())
s = backend.load(args["artifact"], contract, args["options"])
t1 = time.perf_counter()
inputs = {k: np.asarray(v, dtype=np.dtype(args["dtypes"][k])) for k, v in args["inputs"].items()}
out = s.infer(inputs)["actions"]
t2 = time.perf_counter()
want = out.copy()
s.close()
del s
gc.collect()
junk = [np.ones(1 << 20, np.float32) for _ in range(64)]  # reuse freed host memory, if any was freed
assert np.array_equal(out, want), "output changed after close()"
print(json.dumps({"load_s": t1 - t0, "first_ms": (t2 - t1) * 1e3}))
"""


@pytest.mark.parametrize("v", GPU_VARIANTS, ids=[v.id for v in GPU_VARIANTS])
def test_gpu_cold_start_and_outputs_after_close_in_a_child_process(
    v, contract, golden, engine_cache_root, record_property
):
    """A fresh process: import, load, first call (engine cache warm from the tests above),
    then the outputs are read after close()."""
    precision = _top_precision(v)
    _load(v, precision, contract, engine_cache_root).close()  # skips here, or warms the engine cache
    options = {**v.options, "precision": precision}
    if "cache_dir" in v.needs:
        options["cache_dir"] = str(engine_cache_root / v.backend)
    inputs = golden[0][0]
    arg = {
        "contract": str(DEMO / "contract.toml"),
        "backend": v.backend,
        "artifact": str(DEMO / (v.artifact or "policy.onnx")),
        "options": options,
        "inputs": {k: x.tolist() for k, x in inputs.items()},
        "dtypes": {k: str(x.dtype) for k, x in inputs.items()},
    }
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(arg)], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert proc.returncode == 0, (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    fig = json.loads(proc.stdout.strip().splitlines()[-1])
    record_property("cold_load_s", fig["load_s"])
    record_property("cold_first_ms", fig["first_ms"])
