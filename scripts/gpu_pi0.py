#!/usr/bin/env python3
"""π0 on an NVIDIA GPU: measured vs the planner's prediction, per component, in bf16.

Run from a checkout on the GPU machine; it needs only PyTorch with CUDA there (the model
is built from the planner's description, tools/vlad_tools/planner/data/models/pi0.toml, with the
release's random weights from the seed: nothing to copy):

    python scripts/gpu_pi0.py                      # full size, bf16, cuda:0
    python scripts/gpu_pi0.py --compile            # also torch.compile (minutes of compiling)
    python scripts/gpu_pi0.py --json out.json      # the figures as JSON too

What it does, each step timed with CUDA events after warm-up (p50 and p95 of ``--calls``):

1. builds the model (``vlad_tools.pi0.model``) in bf16 on the GPU;
2. eager: vision, backbone prefill (KV cache), action expert (10 steps) and end to end;
3. CUDA graphs: each component and the whole forward captured once and replayed (the
   expert launches thousands of small kernels; a graph launches them as one);
4. with ``--compile``: ``torch.compile`` of the forward (default mode, Inductor's Triton
   kernels), replayed under a CUDA graph;
5. the torch backend itself when vlad's own dependencies are installed (``pip install -e
   . plugins/vlad_torch``): the model exported with ``torch.export`` (streamed, as the
   release is) and loaded by ``vlad_torch`` with ``device = "cuda"``, ``precision =
   "bf16"``; timed through ``Session.infer`` (host copies included);
6. prints measured vs predicted (``vlad_tools.planner.predict`` on the matching hardware entry:
   H200, H100, A100, RTX 4090, B100, Jetson; ``--hardware`` to choose) for the built
   model's description and for pi0.toml as published (source A counts a second Q/K/V
   projection and no embedding table), and peak GPU memory vs the planner's memory fit.

``--device cpu --scale 0.125 --layers 1`` runs the same steps on a CPU at a tiny size
(CUDA graphs skipped), which is how its pieces are tested without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# The GPU machine has a checkout and PyTorch, not vlad installed: the checkout's vlad is
# imported from here (vlad_tools.pi0.model and vlad_tools.planner import nothing but torch and stdlib).
ROOT = Path(__file__).resolve().parent.parent
if not any(Path(p).resolve() == ROOT for p in sys.path if p):
    sys.path.insert(0, str(ROOT))

from vlad_tools.pi0.model import Pi0, Pi0Shape, build, parameter_count, scaled  # noqa: E402
from vlad_tools.planner.predict import predict  # noqa: E402
from vlad_tools.planner.roofline import memory_footprint  # noqa: E402
from vlad_tools.planner.spec import VLAModel, load_model  # noqa: E402

COMPONENTS = ("vision", "backbone", "action")
PI0_VOCAB = 257_152  # as vlad_tools.pi0.release builds it (importing that needs numpy)
STATE_DIM = 14
# GPU name fragments -> planner hardware keys (tools/vlad_tools/planner/data/hardware.toml)
HARDWARE = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("4090", "rtx-4090"), ("B100", "b100"),
            ("Thor", "jetson-thor"), ("Orin", "jetson-agx-orin-64gb"))  # fmt: skip


def hardware_key(device_name: str) -> str | None:
    """The planner's hardware entry for a CUDA device name, if it has one."""
    for fragment, key in HARDWARE:
        if fragment.lower() in device_name.lower():
            return key
    return None


def description(scale: float, layers: int | None, vocab: int | None) -> VLAModel:
    """The built model's planner description (as vlad_tools.pi0.release writes it)."""
    spec = scaled(load_model("pi0"), scale, vision_layers=layers, backbone_layers=layers, action_layers=layers)
    small = scale != 1.0 or layers is not None
    return dataclasses.replace(
        spec,
        precision="bf16",
        backbone=dataclasses.replace(spec.backbone, vocab=vocab or (64 if small else PI0_VOCAB)),
        action=dataclasses.replace(spec.action, qkv_passes=1),
    )


def inputs(spec: VLAModel, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Contract-shaped inputs: three camera images, 32 tokens (4 real), state, noise."""
    g = torch.Generator().manual_seed(0)
    v, a = spec.vision, spec.action
    images = [torch.rand(1, 3, v.image_height, v.image_width, generator=g) * 2 - 1 for _ in range(v.cameras)]
    tokens = torch.zeros(1, spec.backbone.language_tokens, dtype=torch.int64)
    tokens[0, :4] = torch.tensor([5, 9, 2, 7])
    state = torch.randn(1, STATE_DIM, generator=g)
    noise = torch.randn(1, a.chunk, a.dof, generator=g)
    return tuple(t.to(device) for t in (*images, tokens, state, noise))


def components(model: Pi0, args: tuple[torch.Tensor, ...]) -> dict[str, Callable[[], Any]]:
    """Each component as a call on fixed inputs (the previous component's real outputs)."""
    *images, tokens, state, noise = args
    with torch.inference_mode():
        vis = model.image_tokens(*images)
        cache = model.prefix_cache(vis, tokens)
    return {
        "vision": lambda: model.image_tokens(*images),
        "backbone": lambda: model.prefix_cache(vis, tokens),
        "action": lambda: model.denoise(cache, tokens, state, noise),
        "e2e": lambda: model(*args),
    }


class Timer:
    """Wall time of a call in ms: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], Any], calls: int, warmup: int) -> dict[str, float]:
        with torch.inference_mode():
            for _ in range(warmup):
                fn()
            times = []
            for _ in range(calls):
                if self.cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn()
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end))
                else:
                    t0 = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        return {"p50_ms": statistics.median(times), "p95_ms": times[min(len(times) - 1, int(0.95 * len(times)))]}


def graphed(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` captured once in a CUDA graph (its inputs are fixed tensors): replay only."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode():
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm up outside the capture (allocator, cuBLAS workspaces)
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    return graph.replay


def through_backend(args: argparse.Namespace, spec: VLAModel, x: tuple[torch.Tensor, ...], log) -> dict | None:
    """The vlad_torch backend on the exported program (needs vlad's dependencies)."""
    try:
        import numpy as np

        from vlad.plugins import get_backend
        from vlad_tools.pi0.release import Pi0Options, build_release
    except ImportError as exc:
        log(f"torch backend: skipped ({exc.name} is not installed; pip install -e . plugins/vlad_torch)")
        return None
    import tempfile

    from vlad.contract import load_contract

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "release"
        log("torch backend: exporting the release (streamed .pt2) ...")
        n = args.layers
        opts = Pi0Options(width=args.scale, vision_layers=n, backbone_layers=n, action_layers=n,
                          vocab=spec.backbone.vocab, dtype="bf16", formats=("pt2",))  # fmt: skip
        build_release(out, opts, log=lambda m: None)
        contract = load_contract(out / "contract.toml")
        session = get_backend("torch").load(
            out / "policy.pt2", contract, {"device": args.device, "precision": "bf16", "threads": 1}
        )
        try:
            names = [s.name for s in contract.inputs]
            feed = {name: np.ascontiguousarray(t.cpu().numpy()) for name, t in zip(names, x, strict=True)}
            session.warmup(args.warmup)
            wall, engine = [], []
            for _ in range(args.calls):
                t0 = time.perf_counter()
                session.infer(feed)
                wall.append((time.perf_counter() - t0) * 1e3)
                engine.append(session.last_timing.compute_ms)
            mem = session.memory()
        finally:
            session.close()
    wall.sort()
    return {
        "p50_ms": statistics.median(wall),
        "p95_ms": wall[min(len(wall) - 1, int(0.95 * len(wall)))],
        "engine_p50_ms": statistics.median(engine),
        "device_peak_bytes": mem.device_peak_bytes,
        "describe": "vlad_torch TorchSession, device cuda, precision bf16, Session.infer wall time",
    }


def run(args: argparse.Namespace, log=print) -> dict[str, Any]:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"error: CUDA is not available to torch {torch.__version__}; use --device cpu to try it out")
    spec = description(args.scale, args.layers, args.vocab)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    hw = args.hardware or hardware_key(name)
    shape = Pi0Shape(spec, STATE_DIM, spec.backbone.vocab)
    dtype = "bf16" if device.type == "cuda" or args.cpu_bf16 else "fp32"
    log(
        f"building {spec.name}: {parameter_count(shape)['total'] / 1e9:.3f} B parameters, {dtype}, on {device} ({name})"
    )
    t0 = time.monotonic()
    model = build(shape, seed=0, dtype=dtype, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    built_s = time.monotonic() - t0
    x = inputs(spec, device)
    timer = Timer(device)
    calls, warmup = args.calls, args.warmup
    out: dict[str, Any] = {
        "device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "model": spec.name,
        "dtype": dtype, "parameters": parameter_count(shape), "build_s": round(built_s, 1),
        "calls": calls, "warmup": warmup, "hardware": hw, "measured": {},
    }  # fmt: skip
    fns = components(model, x)
    log(f"eager: {calls} calls after {warmup} warm-up, per component and end to end")
    out["measured"]["eager"] = {k: timer(fn, calls, warmup) for k, fn in fns.items()}
    if device.type == "cuda":
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
        log("CUDA graphs: each component and the forward captured once, replayed")
        out["measured"]["cuda_graph"] = {k: timer(graphed(fn), calls, warmup) for k, fn in fns.items()}
        if args.compile:
            log("torch.compile of the forward, replayed in a CUDA graph ...")
            t0 = time.monotonic()
            compiled = torch.compile(model, fullgraph=True)
            fn = graphed(lambda: compiled(*x))
            out["compile_s"] = round(time.monotonic() - t0, 1)
            out["measured"]["compiled_cuda_graph"] = {"e2e": timer(fn, calls, warmup)}
    if args.backend:
        del fns
        result = through_backend(args, spec, x, log) if device.type == "cuda" else None
        if result is not None:
            out["measured"]["torch_backend"] = {"e2e": result}
    if hw is not None:
        out["predicted"] = {}
        for label, desc in (("built model", spec), ("pi0.toml (source A)", load_model("pi0"))):
            p = predict(desc, hw, precision="bf16")
            out["predicted"][label] = {
                **{k: round(p.components[k].ms, 4) for k in COMPONENTS},
                "e2e": round(p.compute_ms, 4),
                "memory_bytes": int(memory_footprint(p.model)["total"]),
            }
    return out


def table(out: dict[str, Any]) -> str:
    """Measured (p50) vs predicted per component, one column per execution mode."""
    modes = list(out["measured"])
    preds = out.get("predicted", {})
    head = ["component", *modes, *[f"predicted: {k}" for k in preds]]
    rows = []
    for comp in (*COMPONENTS, "e2e"):
        row = [comp]
        for m in modes:
            v = out["measured"][m].get(comp)
            row.append("-" if v is None else f"{v['p50_ms']:.2f}")
        row += [f"{preds[k][comp]:.2f}" for k in preds]
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(
        f"ms, p50 of {out['calls']} calls after {out['warmup']} warm-up; {out['device']}, torch {out['torch']}"
    )
    if "peak_memory_bytes" in out:
        fit = ", ".join(f"{k} {v['memory_bytes'] / 1e9:.2f} GB" for k, v in preds.items())
        lines.append(f"peak GPU memory (eager) {out['peak_memory_bytes'] / 1e9:.2f} GB; planner memory fit: {fit}")
    if out.get("hardware") is None:
        lines.append("no planner hardware entry for this device: give --hardware to predict")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--hardware", help="planner hardware key (default: from the GPU's name)")
    p.add_argument("--scale", type=float, default=1.0, help="width factor (default 1: full size)")
    p.add_argument("--layers", type=int, help="layers of every stack (default: pi0's)")
    p.add_argument("--vocab", type=int, help="embedding rows (default: pi0's 257152 at full size)")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--compile", action="store_true", help="also torch.compile the forward")
    p.add_argument("--no-backend", dest="backend", action="store_false", help="skip the vlad_torch backend step")
    p.add_argument("--cpu-bf16", action="store_true", help="on --device cpu, build in bf16 (default fp32)")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    args = p.parse_args(argv)
    out = run(args)
    print(table(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
