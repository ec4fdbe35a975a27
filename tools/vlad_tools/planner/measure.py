"""Calibration against reality: a release measured on this machine, next to the roofline.

``vladctl plan --measure RELEASE``:

1. verifies the release (signature, hashes; ``verify=False`` only loads it);
2. measures this machine's peaks with micro-benchmarks (:mod:`vlad_tools.planner.calibrate`)
   at the thread count the release's backend uses, and predicts every component of the
   release's model description on them;
3. runs the release through its own backend (warm-up, then timed ``Session.infer``
   calls on the contract's example inputs): the measured end to end;
4. when the release has an ONNX artifact, times each component alone: a node belongs
   to the component whose torch module scope (``pkg.torch.onnx.name_scopes``, written
   by the exporter) the model file lists under ``[measure]``, an unscoped node to the
   component of the node before it; each component's sub-graph is cut out at the
   tensors crossing its boundary and run in ONNX Runtime on the values those tensors
   take in a full run. (Per-node profiling was tried first: its per-node overhead
   inflated the 1300-node graph about 4x, most of all the many small nodes of the
   action expert.)

Efficiency = roofline time / measured time (1.0 would be the machine's peak).

The model description is the one the release carries (an artifact named
``planner-model.toml``, as :mod:`vlad_tools.pi0.release` writes), else ``--model``, else the
built-in file listing the contract's ``model.id``. The report also says what the measured
latency means for a robot executing the release's chunks at its control period,
synchronously and asynchronously (:mod:`vlad_tools.planner.execution`). ONNX artifacts with
external data (above 2 GB) are cut without loading their weights into the graph; ONNX
Runtime reads them from the release folder.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlad_tools.planner.calibrate import Peaks, measure_peaks
from vlad_tools.planner.execution import chunk_rate
from vlad_tools.planner.predict import Prediction, align_to_contract, predict
from vlad_tools.planner.spec import PlannerError, VLAModel, load_model

COMPONENTS = ("vision", "backbone", "action")
_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
RELEASE_MODEL_FILE = "planner-model.toml"  # the description a release carries (vlad_tools.pi0)


@dataclass
class Measurement:
    """Measured vs predicted for one release on this machine. Times in ms."""

    release: str
    backend: str
    model: VLAModel
    peaks: Peaks
    prediction: Prediction
    e2e: dict[str, float]  # wall p50/p95/mean of Session.infer, engine p50
    components: dict[str, float] = field(default_factory=dict)  # measured p50 ms per component
    profile: dict[str, Any] = field(default_factory=dict)  # how the components were measured
    notes: list[str] = field(default_factory=list)
    execution: dict[str, Any] = field(default_factory=dict)  # chunk execution at the measured p50

    def efficiency(self, name: str) -> float | None:
        """Roofline / measured for a component (``"e2e"`` for the whole model)."""
        measured = self.e2e["p50_ms"] if name == "e2e" else self.components.get(name)
        predicted = self.prediction.compute_ms if name == "e2e" else self.prediction.components[name].ms
        return predicted / measured if measured else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able report."""
        rows = {}
        for name in (*COMPONENTS, "e2e"):
            predicted = self.prediction.compute_ms if name == "e2e" else self.prediction.components[name].ms
            measured = self.e2e["p50_ms"] if name == "e2e" else self.components.get(name)
            eff = self.efficiency(name)
            rows[name] = {
                "predicted_ms": round(predicted, 6),
                "measured_ms": None if measured is None else round(measured, 6),
                "efficiency": None if eff is None else round(eff, 4),
                "bound": self.prediction.components[name].bound if name != "e2e" else None,
            }
        return {
            "release": self.release,
            "backend": self.backend,
            "model": self.model.name,
            "precision": self.prediction.precision,
            "peaks": self.peaks.to_dict(),
            "rows": rows,
            "e2e": {k: round(v, 6) for k, v in self.e2e.items()},
            "profile": self.profile,
            "execution": self.execution,
            "notes": self.notes,
        }


def _load_release(release: Path, keys_dir: str | Path | None, verify: bool):
    from vlad.contract import load_contract
    from vlad.release.manifest import load_manifest

    if verify:
        from vlad.release.signing import DEFAULT_KEYS_DIR, verify_release

        v = verify_release(release, keys_dir or DEFAULT_KEYS_DIR)
        return v.manifest, v.contract
    manifest = load_manifest(release)
    return manifest, load_contract(release / manifest.contract.path)


def _precision(contract: Any, options: dict[str, Any]) -> str:
    """What the release computes in: its backend's ``precision`` option, else its inputs' dtype."""
    if options.get("precision") in ("fp32", "bf16", "fp16"):
        return str(options["precision"])
    for t in contract.inputs:
        if t.dtype in _PRECISION:
            return _PRECISION[t.dtype]
    return "fp32"


def time_backend(release: Path, manifest: Any, contract: Any, calls: int, warmup: int) -> dict[str, float]:
    """Wall time of ``Session.infer`` through the release's own backend."""
    from vlad.backend import example_inputs
    from vlad.plugins import get_backend

    session = get_backend(manifest.backend.name).load(
        release / manifest.backend.artifact, contract, dict(manifest.backend.options)
    )
    try:
        inputs = example_inputs(contract)
        session.warmup(warmup)
        wall, engine = [], []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            session.infer(inputs)
            wall.append((time.perf_counter_ns() - t0) / 1e6)
            engine.append(session.last_timing.total_ms)
    finally:
        session.close()
    q = np.percentile(wall, [50, 95])
    return {
        "p50_ms": float(q[0]),
        "p95_ms": float(q[1]),
        "mean_ms": statistics.fmean(wall),
        "engine_p50_ms": float(np.median(engine)),
        "calls": float(calls),
    }


def assign_components(graph: Any, scopes: dict[str, tuple[str, ...]]) -> list[str]:
    """Component of every node of ``graph`` (in graph order): by the exporter's module
    scope where the model file lists it, else that of the node before it."""
    by_scope = {s: comp for comp, names in scopes.items() for s in names}
    found: list[str | None] = []
    for node in graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        try:
            names = json.loads(meta.get("pkg.torch.onnx.name_scopes", "[]").replace("'", '"'))
        except ValueError:
            names = []
        # names: ['', 'expert.0', 'expert.0.cross', ...]; the top module is what counts.
        found.append(by_scope.get(names[1].split(".")[0]) if len(names) > 1 else None)
    first = next((c for c in found if c), None)
    if first is None:
        raise PlannerError("no node of the ONNX graph carries a module scope listed under [measure]")
    out, current = [], first
    for comp in found:
        current = comp or current
        out.append(current)
    return out


def component_graphs(model: Any, owners: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """Inputs and outputs of each component's sub-graph: tensors that cross a boundary."""
    init = {t.name for t in model.graph.initializer}
    producer = {out: owners[i] for i, node in enumerate(model.graph.node) for out in node.output}
    graph_out = {o.name for o in model.graph.output}
    io: dict[str, tuple[list[str], list[str]]] = {}
    for i, node in enumerate(model.graph.node):
        ins, outs = io.setdefault(owners[i], ([], []))
        for t in node.input:
            if t and t not in init and producer.get(t) != owners[i] and t not in ins:
                ins.append(t)
                if t in producer:
                    src = io.setdefault(producer[t], ([], []))[1]
                    if t not in src:
                        src.append(t)
        outs.extend(t for t in node.output if t in graph_out and t not in outs)
    return io


def time_components(
    onnx_path: Path, contract: Any, scopes: dict[str, tuple[str, ...]], threads: int, calls: int, warmup: int
) -> tuple[dict[str, float], dict[str, Any]]:
    """Per-component time: each component's sub-graph cut out of the ONNX artifact at its
    boundary tensors, run alone in ONNX Runtime (same threads) on the boundary values of
    a full run, p50 of ``calls`` runs. External weights stay in their file: the graphs
    refer to them and ONNX Runtime reads them from the artifact's folder, one session at
    a time (a π0-sized graph's weights fit once, not twice)."""
    import onnx
    import onnx.utils
    import onnxruntime as ort

    from vlad.backend import example_inputs

    model = onnx.load(str(onnx_path), load_external_data=False)
    owners = assign_components(model.graph, scopes)
    io = component_graphs(model, owners)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    # Graphs given as bytes find their external data here (ONNX Runtime >= 1.18).
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(onnx_path.parent))
    feeds = {k: v for k, v in example_inputs(contract).items() if k in {i.name for i in model.graph.input}}
    # One full run that also returns every boundary tensor: the sub-graphs' inputs.
    boundary = sorted(
        {t for ins, outs in io.values() for t in ins + outs} - set(feeds) - {o.name for o in model.graph.output}
    )
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {v.name: v for v in probe.graph.value_info}
    missing = [t for t in boundary if t not in known]
    if missing:
        raise PlannerError(f"{onnx_path.name}: no type information for boundary tensors {', '.join(missing[:3])}")
    probe.graph.output.extend(known[t] for t in boundary)
    full = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    values = dict(zip([o.name for o in full.get_outputs()], full.run(None, feeds), strict=True))
    values.update(feeds)
    del full, probe  # one model's weights in memory at a time
    extractor = onnx.utils.Extractor(model)
    out: dict[str, float] = {}
    info: dict[str, Any] = {
        "method": "sub-graph per component at its boundary tensors, onnxruntime CPUExecutionProvider",
        "threads": threads,
        "calls": calls,
        "boundaries": {},
    }
    for comp in COMPONENTS:
        if comp not in io:
            continue
        ins, outs = io[comp]
        sub = extractor.extract_model(ins, outs)
        sess = ort.InferenceSession(sub.SerializeToString(), so, providers=["CPUExecutionProvider"])
        sub_feeds = {t: values[t] for t in ins}
        for _ in range(warmup):
            sess.run(None, sub_feeds)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            sess.run(None, sub_feeds)
            times.append((time.perf_counter_ns() - t0) / 1e6)
        out[comp] = float(np.median(times))
        info["boundaries"][comp] = {"inputs": ins, "outputs": outs, "nodes": owners.count(comp)}
        del sess, sub
    return out, info


def release_model(release: Path, manifest: Any) -> Path | None:
    """The planner description the release carries (artifact ``planner-model.toml``), if any."""
    for a in manifest.artifacts:
        if Path(a.path).name == RELEASE_MODEL_FILE:
            return release / a.path
    return None


def execution(latency_ms: float, contract: Any) -> dict[str, Any]:
    """What a robot executing the release's chunks gets at ``latency_ms``, sync and async."""
    t, chunk = contract.timing, contract.action.chunk_length
    out: dict[str, Any] = {
        "latency_ms": round(latency_ms, 3),
        "control_period_ms": t.control_period_ms,
        "chunk": chunk,
        "action_validity_ms": t.action_validity_ms,
    }
    for mode in ("sync", "async"):
        out[mode] = chunk_rate(
            latency_ms, t.control_period_ms, chunk, mode=mode, validity_ms=t.action_validity_ms
        ).to_dict()
    return out


def measure_release(
    release: str | Path,
    *,
    model: str | Path | VLAModel | None = None,
    keys_dir: str | Path | None = None,
    verify: bool = True,
    short: bool = False,
    threads: int | None = None,
    use_torch: bool | None = None,
    calls: int | None = None,
    warmup: int | None = None,
) -> Measurement:
    """Measure ``release`` on this machine against the planner's roofline (see module).

    ``calls`` / ``warmup``: timed and untimed inferences (default 300 / 50, ``short``
    50 / 10); a π0-sized release on a CPU takes seconds to minutes per call."""
    release = Path(release)
    if not release.is_dir():
        raise PlannerError(f"{release}: no such release folder")
    manifest, contract = _load_release(release, keys_dir, verify)
    vla = align_to_contract(load_model(model or release_model(release, manifest) or contract.model.id), contract)
    options = dict(manifest.backend.options)
    threads = threads or int(options.get("intra_op_threads") or options.get("threads") or 1)
    precision = _precision(contract, options)
    if use_torch is None:
        use_torch = not short or precision == "bf16"  # a bf16 peak comes from torch
    peaks = measure_peaks(threads, short=short, use_torch=use_torch)
    notes = []
    if precision != vla.precision:
        notes.append(f"the release runs {precision}; the model file says {vla.precision}: predicted at {precision}")
    prediction = predict(vla, peaks.hardware(), precision=precision)
    calls = calls or (50 if short else 300)
    warmup = (10 if short else 50) if warmup is None else warmup
    e2e = time_backend(release, manifest, contract, calls, warmup)
    m = Measurement(
        release=manifest.id,
        backend=manifest.backend.name,
        model=vla,
        peaks=peaks,
        prediction=prediction,
        e2e=e2e,
        notes=notes,
        execution=execution(e2e["p50_ms"], contract),
    )
    onnx_artifacts = [a.path for a in manifest.artifacts if a.path.endswith(".onnx")]
    if not any(vla.measure_scopes.values()):
        notes.append(f"model {vla.name} has no [measure] scopes: components not measured")
    elif not onnx_artifacts:
        notes.append("the release has no ONNX artifact: components not measured")
    else:
        try:
            m.components, m.profile = time_components(
                release / onnx_artifacts[0],
                contract,
                dict(vla.measure_scopes),
                threads,
                calls,
                warmup,
            )
            m.profile["artifact"] = onnx_artifacts[0]
        except ImportError as exc:
            notes.append(f"components not measured: {exc.name} is not installed")
        except Exception as exc:  # e.g. a bf16 graph ONNX Runtime's CPU provider has no kernels for
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            notes.append(f"components not measured: ONNX Runtime cannot run {onnx_artifacts[0]}: {first}")
    return m
