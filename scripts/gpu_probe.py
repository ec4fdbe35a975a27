#!/usr/bin/env python3
"""The probe of scripts/gpu-check: what a GPU run must show, measured, with its conditions.

Run inside gpu-check's venv (it needs the GPU stack); writes one JSON with table rows,
figures, speed-ups and conditions:

- **precision**: max |error| of the demo's actions against the fp32 reference (golden
  fixtures) per backend and precision label, judged by vlad_tools.testing.golden.MAX_ABS; a label
  a backend cannot honour here is N/A with the reason;
- **tf32**: fp32 within the fp32 budget with TF32 off, TF32 as its own label; plus a
  4096x4096 matmul with TF32 off and on against float64, which shows the switch works;
- **cuda-graph**: TensorRT graph replay against plain runs, new data on every call, over
  a sequence of batch sizes;
- **load/close**: 10 cycles per backend, device memory before and after;
- **outputs after close**: read in a child process (a crash fails the check, not the probe);
- **corrupted engine**: refused, then rebuilt with ``on_mismatch = "rebuild"``;
- **timing split**: h2d + compute + d2h against the wall time of each call;
- **latency**: cold (fresh process: import, load, first call) and warm p50/p95/p99 per
  backend, and the speed-ups over torch eager.

    python scripts/gpu_probe.py --out probe.json [--engine-cache DIR] [--smoke]

``--smoke`` runs the same code on ONNX Runtime's CPU provider only (a few seconds): the
test suite uses it to keep the probe working on machines without a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlad_tools.testing.golden import MAX_ABS, load_golden

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "manifests" / "demo"
AOTI_CACHE = ROOT / ".cache" / "vlad-aoti"
CUDA_EP, TRT_EP, CPU_EP = "CUDAExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider"
LOAD_CYCLES = 10
MEMORY_GROWTH_LIMIT = 64 * 2**20
WARMUP, CALLS = 20, 200
SMOKE_WARMUP, SMOKE_CALLS = 5, 20
REPLAY_BATCHES = (1, 1, 3, 1, 8, 2, 1, 1, 5, 1)
TIMER_SLACK_MS = 0.05  # CUDA event resolution is ~0.5 us; wall clock reads add a little


@dataclass
class Row:
    check: str
    status: str  # PASS, FAIL, SKIP, N/A
    detail: str = ""
    figures: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """A backend on a device at one precision."""

    id: str
    backend: str
    artifact: Path
    options: dict
    precision: str

    @property
    def name(self) -> str:
        return f"{self.id} {self.precision}"


def plan_targets(engine_cache: Path, smoke: bool = False, ampere: bool = True) -> list[Target]:
    """Every (backend, precision) the probe measures. ``ampere``: the GPU has TF32/bf16,
    so ORT's TensorRT provider is labelled tf32 (it cannot turn TF32 off)."""
    onnx, pt2 = DEMO / "policy.onnx", DEMO / "policy.pt2"
    if smoke:
        return [Target("onnxruntime[cpu]", "onnxruntime", onnx, {"providers": [CPU_EP], "intra_op_threads": 1}, "fp32")]
    trt_cache = {"cache_dir": str(engine_cache / "tensorrt"), "progress": False}
    ort_trt = {"providers": [TRT_EP, CUDA_EP], "cache_dir": str(engine_cache / "onnxruntime")}
    targets = [Target("torch[cuda]", "torch", pt2, {"device": "cuda"}, p) for p in ("fp32", "tf32", "fp16", "bf16")]
    aoti = sorted(AOTI_CACHE.glob("aoti-*-cuda.pt2"))
    if aoti:  # compiled by the conformance suite's torch-aoti[cuda] variant
        targets.append(Target("torch-aoti[cuda]", "torch-aoti", aoti[-1], {"device": "cuda"}, "fp32"))
    targets += [Target("onnxruntime[cuda]", "onnxruntime", onnx, {"providers": [CUDA_EP]}, p) for p in ("fp32", "tf32")]
    targets += [
        Target("onnxruntime[tensorrt]", "onnxruntime", onnx, ort_trt, p)
        for p in ("tf32" if ampere else "fp32", "fp16", "bf16")
    ]
    targets += [Target("tensorrt", "tensorrt", onnx, trt_cache, p) for p in ("fp32", "tf32", "fp16", "bf16")]
    return targets


def speedups(latency: dict[str, dict]) -> dict[str, float]:
    """warm p50 of torch eager fp32 on CUDA divided by each target's warm p50."""
    base = latency.get("torch[cuda] fp32", {}).get("p50_ms")
    if not base:
        return {}
    return {name: round(base / fig["p50_ms"], 2) for name, fig in latency.items() if fig.get("p50_ms")}


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def golden() -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    from vlad.contract import load_contract

    contract = load_contract(DEMO / "contract.toml")
    return [
        (
            {s.name: c["inputs"][s.name] for s in contract.inputs},
            {s.name: c["outputs"][s.name] for s in contract.outputs},
        )
        for c in load_golden()
    ]


def load(target: Target, **extra):
    from vlad import plugins
    from vlad.contract import load_contract

    backend = plugins.get_backend(target.backend, plugins.make_plugin_manager())
    options = {**target.options, "precision": target.precision, **extra}
    return backend.load(target.artifact, load_contract(DEMO / "contract.toml"), options)


def max_abs(session, cases) -> float:
    worst = 0.0
    for inputs, ref in cases:
        out = session.infer(inputs)
        worst = max(worst, max(float(np.abs(out[k].astype(np.float64) - r).max()) for k, r in ref.items()))
    return worst


def fresh_inputs(batch: int, seed: int) -> dict[str, np.ndarray]:
    from vlad.backend import example_inputs
    from vlad.contract import load_contract

    rng = np.random.default_rng(seed)
    x = example_inputs(load_contract(DEMO / "contract.toml"), batch=batch)
    vocab = json.loads((DEMO / "model_config.json").read_text())["vocab_size"]  # token ids index an embedding
    return {
        k: (
            rng.integers(0, vocab, v.shape, dtype=np.int64)
            if v.dtype == np.int64
            else rng.standard_normal(v.shape).astype(v.dtype)
        )
        for k, v in x.items()
    }


def device_used_bytes() -> int | None:
    """Device memory in use on GPU 0 as the driver sees it (all allocators), or None."""
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # torch's cache is not a leak; measure what the driver holds
            free, total = torch.cuda.mem_get_info(0)
            return int(total - free)
    except Exception:  # noqa: BLE001 (a probe figure; absence is reported as None)
        pass
    return None


def _refusal(exc: BaseException) -> tuple[str, str]:
    from vlad.errors import BackendUnavailable

    status = "SKIP" if isinstance(exc, BackendUnavailable) else "N/A"
    return status, str(exc).splitlines()[0][:200]


# ---------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------


def check_precision_and_latency(
    targets: list[Target], cases, warmup: int = WARMUP, calls: int = CALLS
) -> tuple[list[Row], dict[str, dict], dict[str, float]]:
    """Golden error per target against its label's budget, then warm latency and the
    timing split on the same session."""
    from vlad.errors import BackendError

    rows, latency, errors = [], {}, {}
    for t in targets:
        try:
            session = load(t)
        except BackendError as exc:
            status, why = _refusal(exc)
            rows.append(Row(f"precision {t.name}", status, why))
            continue
        try:
            label = session.describe().precision
            err = max_abs(session, cases)
            errors[t.name] = err
            budget = MAX_ABS[label]
            ok = label == t.precision and err <= budget
            rows.append(
                Row(
                    f"precision {t.name}",
                    "PASS" if ok else "FAIL",
                    f"label {label}, max |err| {err:.3g} (budget {budget:g})",
                    {"max_abs": err, "label": label},
                )
            )
            latency[t.name], split_row = warm_latency_and_split(session, t, cases[0][0], warmup, calls)
            rows.append(split_row)
        except Exception as exc:  # noqa: BLE001 (one target's failure is a row, not the end)
            rows.append(Row(f"precision {t.name}", "FAIL", f"{type(exc).__name__}: {str(exc)[:200]}"))
        finally:
            session.close()
    return rows, latency, errors


def warm_latency_and_split(session, target: Target, inputs, warmup: int, calls: int) -> tuple[dict, Row]:
    for _ in range(warmup):
        session.infer(inputs)
    walls, splits, inconsistent = [], [], 0
    for _ in range(calls):
        t0 = time.perf_counter()
        session.infer(inputs)
        wall = (time.perf_counter() - t0) * 1e3
        t = session.last_timing
        walls.append(wall)
        splits.append((t.h2d_ms or 0.0, t.compute_ms, t.d2h_ms or 0.0))
        inconsistent += t.total_ms > wall + TIMER_SLACK_MS
    w = np.array(walls)
    s = np.median(np.array(splits), axis=0)
    fig = {
        "p50_ms": float(np.percentile(w, 50)),
        "p95_ms": float(np.percentile(w, 95)),
        "p99_ms": float(np.percentile(w, 99)),
        "max_ms": float(w.max()),
        "calls": calls,
        "warmup": warmup,
        "batch": 1,
        "h2d_p50_ms": float(s[0]),
        "compute_p50_ms": float(s[1]),
        "d2h_p50_ms": float(s[2]),
    }
    detail = (
        f"median h2d {s[0]:.3f} + compute {s[1]:.3f} + d2h {s[2]:.3f} ms vs wall p50 {fig['p50_ms']:.3f} ms; "
        f"{inconsistent}/{calls} calls with split > wall"
    )
    return fig, Row(f"timing split {target.name}", "FAIL" if inconsistent else "PASS", detail, fig)


def check_tf32(errors: dict[str, float]) -> list[Row]:
    """fp32 (TF32 off) within the fp32 budget beside the tf32 error, per backend; and a
    matmul that shows the TF32 switch itself works."""
    rows = []
    for backend in sorted({name.split(" ")[0] for name in errors}):
        fp32, tf32 = errors.get(f"{backend} fp32"), errors.get(f"{backend} tf32")
        if fp32 is None or tf32 is None:
            continue
        ok = fp32 <= MAX_ABS["fp32"]
        rows.append(
            Row(
                f"tf32 off/on {backend}",
                "PASS" if ok else "FAIL",
                f"fp32 (TF32 off) {fp32:.3g}, tf32 {tf32:.3g}",
                {"fp32": fp32, "tf32": tf32},
            )
        )
    try:
        import torch

        from vlad_torch.session import set_tf32
    except ImportError:
        return rows
    if not torch.cuda.is_available():
        return rows
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(4096, 4096, device="cuda", generator=g)
    b = torch.randn(4096, 4096, device="cuda", generator=g)
    ref = a.double() @ b.double()
    figs = {}
    for on in (False, True):
        set_tf32(torch, on)
        figs["tf32" if on else "ieee"] = float(((a @ b).double() - ref).abs().max() / ref.abs().max())
    set_tf32(torch, False)
    ampere = torch.cuda.get_device_capability() >= (8, 0)
    ok = figs["ieee"] < 1e-5 and (not ampere or figs["tf32"] > 10 * figs["ieee"])
    rows.append(
        Row(
            "tf32 switch (4096^2 matmul)",
            "PASS" if ok else "FAIL",
            f"relative max err TF32 off {figs['ieee']:.2e}, on {figs['tf32']:.2e}",
            figs,
        )
    )
    return rows


def check_graph_replay(engine_cache: Path) -> list[Row]:
    from vlad.errors import BackendError

    target = Target(
        "tensorrt",
        "tensorrt",
        DEMO / "policy.onnx",
        {"cache_dir": str(engine_cache / "tensorrt"), "progress": False},
        "fp32",
    )
    try:
        plain, graphed = load(target), load(target, cuda_graph=True)
    except BackendError as exc:
        return [Row("cuda-graph replay tensorrt", *_refusal(exc))]
    worst, mismatches = 0.0, []
    try:
        for i, batch in enumerate(REPLAY_BATCHES):
            x = fresh_inputs(batch, 100 + i)
            want = plain.infer(x)["actions"].copy()
            diff = float(np.abs(graphed.infer(x)["actions"] - want).max())
            worst = max(worst, diff)
            if diff > 1e-6:
                mismatches.append(f"call {i} batch {batch}: {diff:.3g}")
        launches = (graphed.graph_launches, graphed.plain_launches)
    finally:
        plain.close()
        graphed.close()
    expected = (REPLAY_BATCHES.count(1), len(REPLAY_BATCHES) - REPLAY_BATCHES.count(1))
    ok = not mismatches and launches == expected
    detail = (
        f"{len(REPLAY_BATCHES)} calls, batches {list(REPLAY_BATCHES)}, new data each; max diff {worst:.3g}; "
        f"graph/plain launches {launches} (expected {expected})" + (f"; {mismatches[:3]}" if mismatches else "")
    )
    return [Row("cuda-graph replay tensorrt", "PASS" if ok else "FAIL", detail, {"max_diff": worst})]


def check_load_close(targets: list[Target]) -> list[Row]:
    from vlad.errors import BackendError

    rows = []
    for t in targets:
        try:
            with load(t) as s:  # warm: CUDA context, libraries, engine cache
                s.infer(fresh_inputs(1, 0))
        except BackendError as exc:
            rows.append(Row(f"10x load/close {t.name}", *_refusal(exc)))
            continue
        gc.collect()
        before = device_used_bytes()
        t0 = time.perf_counter()
        for i in range(LOAD_CYCLES):
            with load(t) as s:
                s.infer(fresh_inputs(1, i))
        seconds = time.perf_counter() - t0
        gc.collect()
        after = device_used_bytes()
        if before is None or after is None:
            rows.append(Row(f"10x load/close {t.name}", "SKIP", "device memory not readable (no torch CUDA)"))
            continue
        growth = after - before
        rows.append(
            Row(
                f"10x load/close {t.name}",
                "PASS" if growth < MEMORY_GROWTH_LIMIT else "FAIL",
                f"device memory {before / 2**20:.0f} -> {after / 2**20:.0f} MiB ({growth / 2**20:+.1f}); "
                f"{seconds / LOAD_CYCLES:.2f} s per cycle",
                {"before_bytes": before, "after_bytes": after, "seconds_per_cycle": seconds / LOAD_CYCLES},
            )
        )
    return rows


# The child processes load this very file as the module ``gpu_probe`` (it is a script, not
# part of an installed package), so they run the same code as the probe.
_LOAD_PROBE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("gpu_probe", {script!r})
p = importlib.util.module_from_spec(spec)
sys.modules["gpu_probe"] = p
spec.loader.exec_module(p)
"""

_CHILD = (
    """
import gc, json, sys
import numpy as np
"""
    + _LOAD_PROBE
    + """
t = p.Target(**json.loads(sys.argv[1]))
t = p.Target(t.id, t.backend, p.Path(t.artifact), t.options, t.precision)
s = p.load(t)
out = s.infer(p.fresh_inputs(3, 1))["actions"]
want = out.copy()
s.close()
del s
gc.collect()
junk = [np.ones(1 << 20, np.float32) for _ in range(64)]  # reuse freed host memory, if any was freed
assert np.array_equal(out, want), "output changed after close()"
print("ok")
"""
)


def check_outputs_after_close(targets: list[Target]) -> list[Row]:
    rows = []
    code = _CHILD.format(script=str(Path(__file__).resolve()))
    for t in targets:
        arg = json.dumps({**asdict(t), "artifact": str(t.artifact)})
        proc = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, timeout=600)
        ok = proc.returncode == 0 and proc.stdout.strip().endswith("ok")
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:200]
        rows.append(
            Row(
                f"outputs after close {t.name}",
                "PASS" if ok else "FAIL",
                "read in a child process after close(): unchanged" if ok else f"exit {proc.returncode}: {last}",
            )
        )
    return rows


def check_corrupted_engine(engine_cache: Path, cases) -> list[Row]:
    from vlad.errors import BackendError
    from vlad_tensorrt.cache import EngineMismatch

    with tempfile.TemporaryDirectory(prefix="vlad-probe-") as tmp:
        target = Target("tensorrt", "tensorrt", DEMO / "policy.onnx", {"cache_dir": tmp, "progress": False}, "fp32")
        shared = engine_cache / "tensorrt"
        if shared.is_dir():  # start from the engines already built, so only the rebuild builds
            shutil.copytree(shared, tmp, dirs_exist_ok=True)
        try:
            with load(target) as s:
                engine = Path(s.describe().extra["engine"])
        except BackendError as exc:
            return [Row("corrupted engine tensorrt", *_refusal(exc))]
        data = bytearray(engine.read_bytes())
        data[len(data) // 2] ^= 0xFF
        engine.write_bytes(bytes(data))
        try:
            load(target).close()
            return [Row("corrupted engine tensorrt", "FAIL", "a corrupted engine was loaded")]
        except EngineMismatch:
            pass
        t0 = time.perf_counter()
        with load(target, on_mismatch="rebuild") as s:
            seconds = time.perf_counter() - t0
            built = s.describe().extra["built"]
            err = max_abs(s, cases)
    ok = built and err <= MAX_ABS["fp32"]
    return [
        Row(
            "corrupted engine tensorrt",
            "PASS" if ok else "FAIL",
            f"refused (engine_sha256), rebuilt in {seconds:.1f} s, max |err| {err:.3g}",
            {"rebuild_seconds": seconds, "max_abs": err},
        )
    ]


_COLD = (
    """
import sys, time, json
t0 = time.perf_counter()
"""
    + _LOAD_PROBE
    + """
t = p.Target(**json.loads(sys.argv[1]))
t = p.Target(t.id, t.backend, p.Path(t.artifact), t.options, t.precision)
s = p.load(t)
t1 = time.perf_counter()
s.infer(p.fresh_inputs(1, 0))
t2 = time.perf_counter()
print(json.dumps({{"load_s": t1 - t0, "first_ms": (t2 - t1) * 1e3}}))
"""
)


def check_cold(targets: list[Target]) -> tuple[list[Row], dict[str, dict]]:
    rows, figs = [], {}
    code = _COLD.format(script=str(Path(__file__).resolve()))
    for t in targets:
        arg = json.dumps({**asdict(t), "artifact": str(t.artifact)})
        proc = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, timeout=600)
        try:
            fig = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            rows.append(Row(f"cold start {t.name}", "FAIL", (proc.stderr.strip().splitlines() or ["?"])[-1][:200]))
            continue
        figs[t.name] = fig
        rows.append(
            Row(
                f"cold start {t.name}",
                "PASS",
                f"fresh process: import + load {fig['load_s']:.2f} s, first call {fig['first_ms']:.1f} ms "
                f"(engine cache warm)",
                fig,
            )
        )
    return rows, figs


# ---------------------------------------------------------------------------------------
# Conditions and main
# ---------------------------------------------------------------------------------------


def conditions() -> dict:
    """The gates' record of the conditions (:func:`vlad_tools.gates.conditions.capture`: CPU, GPU
    clocks, temperature, power and memory, load, versions of the GPU stack), the other
    processes on the GPU, and how the figures were measured."""
    from vlad_tools.gates.conditions import capture

    cond: dict[str, Any] = capture()
    smi = shutil.which("nvidia-smi")
    if smi:
        procs = subprocess.run(
            [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        )
        cond["other_gpu_processes"] = [p.strip() for p in procs.stdout.splitlines() if str(os.getpid()) not in p]
    cond["method"] = (
        f"golden fixtures (batch 1) for errors; warm latency: {WARMUP} warm-up then {CALLS} calls of "
        f"Session.infer at batch 1, wall clock per call; cold: a fresh process per target"
    )
    return cond


def run(out: Path, engine_cache: Path, smoke: bool) -> dict:
    cases = golden()
    ampere = True
    if not smoke:
        try:
            import torch

            ampere = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)
        except ImportError:
            pass
    targets = plan_targets(engine_cache, smoke, ampere)
    rows, latency, errors = check_precision_and_latency(
        targets, cases, *((SMOKE_WARMUP, SMOKE_CALLS) if smoke else (WARMUP, CALLS))
    )
    # One target per backend for the checks below: its first, highest precision (fp32, or
    # tf32 for ORT's TensorRT provider on Ampere+).
    fp32 = list({t.id: t for t in reversed(targets)}.values())[::-1]
    if not smoke:
        rows += check_tf32(errors)
        rows += check_graph_replay(engine_cache)
        rows += check_corrupted_engine(engine_cache, cases)
    rows += check_load_close(fp32)
    rows += check_outputs_after_close(fp32)
    cold_rows, cold = check_cold(fp32)
    rows += cold_rows
    for name, fig in cold.items():
        latency.setdefault(name, {}).update({"cold_load_s": fig["load_s"], "cold_first_ms": fig["first_ms"]})
    report = {
        "rows": [asdict(r) for r in rows],
        "latency": latency,
        "speedups": speedups(latency),
        "conditions": conditions(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--engine-cache", type=Path, default=None, help="engine cache shared with the GPU tests")
    parser.add_argument("--smoke", action="store_true", help="ONNX Runtime CPU only: the probe's own code, no GPU")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vlad-probe-cache-") as tmp:
        report = run(args.out, args.engine_cache or Path(tmp), args.smoke)
    failed = [r for r in report["rows"] if r["status"] == "FAIL"]
    print(f"gpu_probe: {len(report['rows'])} checks, {len(failed)} failed; {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
