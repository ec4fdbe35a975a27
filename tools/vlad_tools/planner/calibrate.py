"""Micro-benchmarks for this machine's own roofline: matmul FLOP/s and memory bandwidth.

Peaks are measured, not taken from a datasheet: the best of several repetitions of a
square float32 matrix multiply (NumPy's BLAS, and PyTorch when asked, then also in
bfloat16) and of a large array copy (bytes read + bytes written). Each benchmark runs in a child process whose
BLAS / OpenMP thread count is fixed by environment before NumPy loads, because a
library's thread pool cannot be resized reliably once loaded; the child prints JSON.

    python -m vlad_tools.planner.calibrate [--threads 1] [--short]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from vlad_tools.gates.conditions import cpu_model
from vlad_tools.planner.spec import Hardware, HardwareConventions, PlannerError

# (matrix size, repetitions, copy MiB, repetitions): short keeps a CI run under a second.
SIZES = {"short": (384, 8, 32, 4), "full": (1024, 10, 256, 8)}
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


@dataclass(frozen=True)
class Peaks:
    """Measured peaks of this machine at ``threads`` threads."""

    matmul_flops: dict[str, float]  # {"numpy": FLOP/s, "torch": FLOP/s, "torch_bf16": FLOP/s}
    bandwidth: float  # bytes/s, copy (read + write)
    threads: int
    conditions: dict[str, Any] = field(default_factory=dict)

    @property
    def peak_flops(self) -> float:
        """The best float32 matmul rate measured (the roofline's fp32 compute ceiling)."""
        return max(v for k, v in self.matmul_flops.items() if not k.endswith("_bf16"))

    def hardware(self, memory_bytes: float | None = None) -> Hardware:
        """This machine as planner :class:`Hardware` (fp32 only; no host link: CPU)."""
        if memory_bytes is None:
            import psutil

            memory_bytes = float(psutil.virtual_memory().total)
        peaks = {"fp32": self.peak_flops}
        if "torch_bf16" in self.matmul_flops:
            peaks["bf16"] = self.matmul_flops["torch_bf16"]
        gb = HardwareConventions().bytes_per_gb
        return Hardware(
            key="this-machine",
            name=f"this machine ({self.threads} thread{'s' * (self.threads > 1)})",
            tflops={p: v / 1e12 for p, v in peaks.items()},
            bandwidth_gb_s=self.bandwidth / gb,
            memory_gb=memory_bytes / gb,
            kind="measured",
            source="micro-benchmarks (vlad_tools.planner.calibrate)",
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary in GFLOP/s and GB/s (10^9)."""
        return {
            "matmul_gflops": {k: round(v / 1e9, 3) for k, v in self.matmul_flops.items()},
            "bandwidth_gb_s": round(self.bandwidth / 1e9, 3),
            "threads": self.threads,
            "conditions": self.conditions,
        }


def _best(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _child(size: str, use_torch: bool, threads: int) -> dict[str, Any]:
    """The benchmarks themselves (run in the child process)."""
    import numpy as np

    n, reps, mib, copies = SIZES[size]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, b, out=out)  # warm the BLAS up
    result: dict[str, Any] = {"numpy": 2 * n**3 / _best(lambda: np.matmul(a, b, out=out), reps)}
    src = np.ones(mib * (1 << 20) // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    result["bandwidth"] = 2 * src.nbytes / _best(lambda: np.copyto(dst, src), copies)
    result["numpy_version"] = np.__version__
    if use_torch:
        import torch

        torch.set_num_threads(threads)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        torch.matmul(ta, tb)
        result["torch"] = 2 * n**3 / _best(lambda: torch.matmul(ta, tb), reps)
        ha, hb = ta.bfloat16(), tb.bfloat16()
        torch.matmul(ha, hb)
        result["torch_bf16"] = 2 * n**3 / _best(lambda: torch.matmul(ha, hb), reps)
        result["torch_version"] = torch.__version__
    return result


def measure_peaks(threads: int = 1, short: bool = False, use_torch: bool = False, timeout: float = 120.0) -> Peaks:
    """Run the micro-benchmarks in a child process pinned to ``threads`` threads."""
    if threads < 1:
        raise PlannerError("threads must be >= 1")
    env = {**os.environ, **{v: str(threads) for v in _THREAD_VARS}}
    cmd = [sys.executable, "-m", "vlad_tools.planner.calibrate", "--child", "--threads", str(threads)]
    cmd += ["--short"] if short else []
    cmd += ["--torch"] if use_torch else []
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise PlannerError(f"micro-benchmarks did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise PlannerError(f"micro-benchmarks failed: {last}")
    r = json.loads(proc.stdout)
    n, reps, mib, copies = SIZES["short" if short else "full"]
    flops = {k: r[k] for k in ("numpy", "torch", "torch_bf16") if k in r}
    conditions = {
        "cpu": cpu_model(), "logical_cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
        "load_avg": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version(),
        "numpy": r.get("numpy_version"), "torch": r.get("torch_version"),
        "matmul": f"{n}x{n} float32 (torch also bfloat16), best of {reps}", "copy": f"{mib} MiB float32, best of {copies}",
    }  # fmt: skip
    return Peaks(matmul_flops=flops, bandwidth=r["bandwidth"], threads=threads, conditions=conditions)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--short", action="store_true", help="small sizes, well under a second")
    ap.add_argument("--torch", action="store_true", help="also time torch.matmul")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child("short" if args.short else "full", args.torch, args.threads)))
        return 0
    try:
        print(json.dumps(measure_peaks(args.threads, args.short, args.torch).to_dict(), indent=2))
    except PlannerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
