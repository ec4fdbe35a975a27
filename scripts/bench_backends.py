#!/usr/bin/env python3
"""Engine-time benchmark of every usable backend on the demo policy, with its conditions.

For each backend (each in a fresh subprocess, so imports, cold load and peak RSS are not
shared between engines) it measures:

- cold start: runtime import, artifact load, first inference;
- warm latency of ``Session.infer`` over ``--calls`` calls after ``--warmup`` calls:
  p50 / p95 / p99 / max (the engine's own ``last_timing`` p50 beside it);
- peak RSS of the process.

Inputs are the golden fixtures' model inputs (batch 1) in rotation: engine time on real
tensors, without preprocessing, decoding or transport. The conditions (CPU, cores,
threads, governor, temperatures, load, versions) are printed with the figures: without
them, numbers are not comparable.

    .venv/bin/python scripts/bench_backends.py [--calls 1000] [--threads 1] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from vlad.files import sha256_file
from vlad_tools.gates.conditions import capture, version

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "manifests" / "demo"
GOLDEN = ROOT / "manifests" / "demo" / "golden.npz"
AOTI_CACHE = ROOT / ".cache" / "vlad-aoti"
ARTIFACTS = {"torch": "policy.pt2", "onnxruntime": "policy.onnx"}


# ---------------------------------------------------------------------------------------
# Conditions
# ---------------------------------------------------------------------------------------


def conditions(threads: int) -> dict:
    """What the figures depend on: hardware, clocks, heat, other load, software versions (the
    gates' record, :func:`vlad_tools.gates.conditions.capture`), and the session threads."""
    return {**capture(), "threads": threads}


# ---------------------------------------------------------------------------------------
# One backend (runs in its own subprocess)
# ---------------------------------------------------------------------------------------


def _aoti_package() -> Path:
    source = DEMO / "policy.pt2"
    digest = sha256_file(source)[:16]
    # The version from metadata, not `import torch`: the cold-start figure includes the import.
    out = AOTI_CACHE / f"aoti-{digest}-torch{version('torch')}.pt2"
    if not out.exists():
        from vlad_torch import compile_aoti

        print(f"bench: compiling {source.name} with AOTInductor (once; tens of seconds) ...", file=sys.stderr)
        compile_aoti(source, out)
    return out


def _options(name: str, threads: int) -> dict:
    if name in ("torch", "torch-aoti"):
        return {"threads": threads}
    if name == "onnxruntime":
        return {"intra_op_threads": threads, "inter_op_threads": 1}
    return {}


def _artifact(name: str, backend) -> Path | None:
    if name == "torch-aoti":
        return _aoti_package()
    if name in ARTIFACTS:
        return DEMO / ARTIFACTS[name]
    for suffix in backend.artifact_suffixes():
        found = sorted(DEMO.glob(f"*{suffix}"))
        if found:
            return found[0]
    return None


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q))


def bench_one(name: str, calls: int, warmup: int, threads: int) -> dict:
    """Cold start, warm latency and peak RSS of one backend in this (fresh) process."""
    from vlad import plugins
    from vlad.contract import load_contract

    backend = plugins.get_backend(name)
    artifact = _artifact(name, backend)
    if artifact is None:
        avail = backend.availability()
        reason = avail.reason if not avail.usable else f"no demo artifact with suffix {backend.artifact_suffixes()}"
        return {"backend": name, "skipped": reason}
    contract = load_contract(DEMO / "contract.toml")
    data = np.load(GOLDEN, allow_pickle=False)
    feeds = []
    i = 0
    while f"{i}/inputs/{contract.inputs[0].name}" in data.files:
        feeds.append({s.name: data[f"{i}/inputs/{s.name}"] for s in contract.inputs})
        i += 1

    t0 = time.perf_counter()
    avail = backend.availability()  # imports the runtime: part of a cold start
    if not avail.usable:
        return {"backend": name, "skipped": avail.reason}
    session = backend.load(artifact, contract, _options(name, threads))
    t1 = time.perf_counter()
    session.infer(feeds[0])
    t2 = time.perf_counter()

    for k in range(warmup):
        session.infer(feeds[k % len(feeds)])
    wall = np.empty(calls)
    engine = np.empty(calls)
    for k in range(calls):
        s = time.perf_counter_ns()
        session.infer(feeds[k % len(feeds)])
        wall[k] = (time.perf_counter_ns() - s) / 1e6
        engine[k] = session.last_timing.total_ms
    desc = session.describe()
    session.close()
    return {
        "backend": name,
        "artifact": str(artifact.relative_to(ROOT) if artifact.is_relative_to(ROOT) else artifact),
        "device": desc.device,
        "providers": list(desc.providers),
        "runtime": f"{desc.runtime} {desc.runtime_version}",
        # Includes importing the runtime (it is imported lazily by load()).
        "cold_load_s": round(t1 - t0, 3),
        "first_inference_ms": round((t2 - t1) * 1e3, 2),
        "cold_total_s": round(t2 - t0, 3),
        "warm_calls": calls,
        "warmup_calls": warmup,
        "batch": 1,
        "p50_ms": round(_pct(wall, 50), 3),
        "p95_ms": round(_pct(wall, 95), 3),
        "p99_ms": round(_pct(wall, 99), 3),
        "max_ms": round(float(wall.max()), 3),
        "engine_p50_ms": round(_pct(engine, 50), 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


# ---------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------


def markdown(cond: dict, results: list[dict], args: argparse.Namespace) -> str:
    """The ``## Backends (engine time)`` section for docs/benchmarks.md."""
    lines = [
        "## Backends (engine time)",
        "",
        f"`scripts/bench_backends.py --calls {args.calls} --threads {args.threads}` on the demo policy "
        f"(`manifests/demo`), {time.strftime('%Y-%m-%d')}. Engine time only: `Session.infer` on the golden "
        "fixtures' model inputs (batch 1, in rotation), input checks included; no preprocessing, decoding or "
        f"transport. Each backend in a fresh process; {args.warmup} warm-up calls, then {args.calls} timed calls. "
        "Cold = import of the runtime + artifact load; first = the first inference after it.",
        "",
        "| backend | device / providers | cold load s | first ms | p50 ms | p95 ms | p99 ms | max ms | engine p50 ms | peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    skipped = []
    for r in results:
        if "skipped" in r:
            skipped.append(f"- `{r['backend']}` not measured: {r['skipped']}")
            continue
        dev = r["device"] + (f" ({', '.join(r['providers'])})" if r["providers"] else "")
        lines.append(
            f"| `{r['backend']}` | {dev} | {r['cold_load_s']:.2f} | {r['first_inference_ms']:.1f} | {r['p50_ms']:.3f} | "
            f"{r['p95_ms']:.3f} | {r['p99_ms']:.3f} | {r['max_ms']:.3f} | {r['engine_p50_ms']:.3f} | {r['peak_rss_mib']:.0f} |"
        )
    lines += ["", *skipped] if skipped else []
    v = cond["versions"]
    lines += [
        "",
        "Conditions:",
        "",
        f"- CPU: {cond['cpu']}; {cond['logical_cores']} logical / {cond['physical_cores']} physical cores "
        f"({cond['affinity_cores']} usable by the process); governor: {cond['governor']}",
        f"- threads per engine: {cond['threads']} (torch `set_num_threads`, ORT intra-op; inter-op 1)",
        f"- temperatures (°C): {cond['temperatures_c']}",
        f"- load average (1/5/15 min) before: {cond['loadavg_1_5_15']}; after: {cond.get('loadavg_after')}; "
        f"other busy processes: {', '.join(cond['other_busy_processes']) or 'none above 5 %'}",
        f"- memory: {cond['memory_total_gib']} GiB; kernel {cond['kernel']}; Python {cond['python']}",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val),
        "",
        "`torch-aoti` is the same `policy.pt2` compiled by AOTInductor (`vlad_torch.compile_aoti`, ~40-55 s on this "
        "machine, cached under `.cache/vlad-aoti/`); eager `torch` pays Python dispatch for each of the graph's "
        "~1000 operators per call. Figures from a shared 2-core VM are indicative only: compare them only with "
        "figures taken under the same conditions.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=1000, help="timed warm calls per backend (>= 1000 for a p99)")
    ap.add_argument("--warmup", type=int, default=100, help="untimed calls before timing")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per engine")
    ap.add_argument("--backends", help="comma-separated backend names (default: every backend offered)")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON document")
    out.add_argument("--markdown", action="store_true", help="print the docs/benchmarks.md section")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one backend, print JSON
    args = ap.parse_args(argv)

    if args.one:
        print(json.dumps(bench_one(args.one, args.calls, args.warmup, args.threads)))
        return 0

    from vlad import plugins

    names = args.backends.split(",") if args.backends else sorted(plugins.backends())
    cond = conditions(args.threads)
    results = []
    for name in names:
        cmd = [
            sys.executable,
            __file__,
            "--one",
            name,
            "--calls",
            str(args.calls),
            "--warmup",
            str(args.warmup),
            "--threads",
            str(args.threads),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            results.append({"backend": name, "skipped": f"benchmark failed: {tail}"})
        else:
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        if not args.json and not args.markdown:
            r = results[-1]
            if "skipped" in r:
                print(f"{name:12s} skipped: {r['skipped']}")
            else:
                print(
                    f"{name:12s} cold {r['cold_load_s']:.2f} s + first {r['first_inference_ms']:.1f} ms | "
                    f"p50 {r['p50_ms']:.3f} p95 {r['p95_ms']:.3f} p99 {r['p99_ms']:.3f} max {r['max_ms']:.3f} ms | "
                    f"peak RSS {r['peak_rss_mib']:.0f} MiB | {r['device']} {r['providers'] or ''}"
                )
    cond["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps({"conditions": cond, "results": results}, indent=2))
    elif args.markdown:
        print(markdown(cond, results, args), end="")
    else:
        print(json.dumps(cond, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
