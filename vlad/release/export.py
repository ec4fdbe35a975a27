"""Export a PyTorch policy to the release artifacts: a ``torch.export`` program and ONNX.

An export that produced a file proves nothing, so every export here is checked:

1. shapes are fixed first (every axis at the contract's ``opt`` value) and only the axes
   the contract declares dynamic are opened in a second export;
2. ``onnx.checker`` runs in full-check mode;
3. ONNX Runtime is compared with PyTorch on the given inputs: the final outputs, and the
   trunk's prefix embedding as an intermediate (from a verification-only export);
4. an operator the exporter cannot translate fails the export with its name, never an
   approximation.

The exporter is noisy (progress prints, warnings, logged tracebacks from native code): what
it writes to stdout and stderr while it runs is kept from the terminal, and a failure is one
:class:`ExportError` line carrying the root cause.

The exporter, opset, torch, onnx and vlad versions are written into the ONNX metadata.

A model whose weights exceed :data:`EXTERNAL_DATA_ABOVE` (a SmolVLA at SmolVLM2-500M's size:
~1.8 GB in fp32) keeps them in ``<path>.data`` beside the ``.onnx`` (ONNX's external data),
which ONNX Runtime reads from the model's folder.

A model too large to hold twice (a π0-sized release: 6.5 GB in bf16, 13 GB in fp32) is
exported *streamed* (:func:`export_program_streamed`, :func:`export_onnx_streamed`): traced
on fake tensors, so no weight is allocated while tracing, then written one tensor at a
time from a function that produces each weight; ONNX weights go to an external data file
(a protobuf cannot exceed 2 GB), large tensors at page-aligned offsets so a runtime can
map them.
"""

from __future__ import annotations

import importlib.metadata
import io
import math
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vlad.contract import Contract
from vlad.errors import ExportError

OPSET = 18
#: Weights above this many bytes go to an external data file (``policy.onnx.data``). A protobuf
#: cannot exceed 2 GiB, and the exported graph holds more than the module's parameters
#: (constants folded by the optimizer, e.g. transposed or cast copies of weights), so the
#: switch comes at half the limit, not near it; below it one self-contained file is simpler.
EXTERNAL_DATA_ABOVE = 1 << 30


@dataclass(frozen=True)
class Comparison:
    """Worst-case difference between a runtime's output and the PyTorch reference."""

    name: str
    max_abs: float
    mean_abs: float
    max_rel: float

    def line(self) -> str:
        return f"{self.name}: max abs {self.max_abs:.3g}, mean abs {self.mean_abs:.3g}, max rel {self.max_rel:.3g}"


def compare(name: str, ref: np.ndarray, got: np.ndarray) -> Comparison:
    if ref.shape != got.shape:
        raise ExportError(f"{name}: shape {list(got.shape)} differs from the reference {list(ref.shape)}")
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    rel = err / np.maximum(np.abs(ref.astype(np.float64)), 1e-6)
    return Comparison(
        name, float(err.max(initial=0.0)), float(err.mean()) if err.size else 0.0, float(rel.max(initial=0.0))
    )


def _input_names(contract: Contract) -> list[str]:
    return [spec.name for spec in contract.inputs]


def _dynamic_shapes(contract: Contract, dynamic: bool):
    """torch.export dynamic_shapes from the contract: one Dim per declared dynamic axis."""
    import torch

    shapes = {}
    dims: dict[tuple[str, int, int], object] = {}
    for spec in contract.inputs:
        axes = {}
        if dynamic:
            for ax in spec.dynamic:
                # Axes that share a name (e.g. "batch") share one symbolic Dim.
                key = (ax.name, ax.min, ax.max)
                if key not in dims:
                    dims[key] = torch.export.Dim(ax.name, min=ax.min, max=ax.max)
                axes[ax.axis] = dims[key]
        shapes[spec.name] = axes or None
    return shapes


def _torch_versions() -> dict[str, str]:
    import onnx
    import torch

    return {
        "vlad.exporter": "torch.onnx.export(dynamo=True)",
        "vlad.opset": str(OPSET),
        "vlad.torch_version": torch.__version__,
        "vlad.onnx_version": onnx.__version__,
        "vlad.onnxscript_version": importlib.metadata.version("onnxscript"),
        "vlad.version": importlib.metadata.version("vlad") if _has_dist("vlad") else "dev",
        "vlad.python": sys.version.split()[0],
    }


def _has_dist(name: str) -> bool:
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def _traced(contract: Contract, examples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The inputs to trace: a batch of two when the contract opens the batch axis (torch.export
    specializes a size-1 axis to a constant), else the first example as it is."""
    if not any(spec.dynamic for spec in contract.inputs):
        return examples[0]
    names = _input_names(contract)
    return {n: np.concatenate([examples[0][n], examples[-1][n]]) for n in names}


def _to_torch(inputs: dict[str, np.ndarray], names: list[str]):
    import torch

    return tuple(torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in names)


@contextmanager
def _quiet() -> Iterator[None]:
    """Keep what runs meanwhile from writing to the terminal: Python's ``sys.stdout`` and
    ``sys.stderr``, and file descriptors 1 and 2 (native code and logging handlers that hold
    the original streams write there). Warnings are ignored as well."""
    try:
        saved = (os.dup(1), os.dup(2))
    except OSError:  # no standard streams to protect
        saved = None
    sink = io.StringIO()
    with tempfile.TemporaryFile() as tmp:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            _flush(stream)
        if saved is not None:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
        try:
            with warnings.catch_warnings(), redirect_stdout(sink), redirect_stderr(sink):
                warnings.simplefilter("ignore")
                yield
        finally:
            for stream in (sys.__stdout__, sys.__stderr__):
                _flush(stream)
            if saved is not None:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])


def _flush(stream: Any) -> None:
    try:
        if stream is not None:
            stream.flush()
    except (OSError, ValueError):
        pass


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def root_cause(exc: BaseException) -> str:
    """The line that says why ``exc`` happened: the first line of the innermost exception it
    was raised from (the exporter wraps the real error in pages of advice), with its type."""
    inner = exc
    seen = {id(exc)}
    while True:
        nxt = inner.__cause__ or (None if inner.__suppress_context__ else inner.__context__)
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(nxt))
        inner = nxt
    lines = [ln.strip() for ln in _ANSI.sub("", str(inner)).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if len(text) > 300:
        text = text[:300].rsplit(" ", 1)[0] + " ..."
    return f"{type(inner).__name__}: {text}" if text else type(inner).__name__


def export_program(model, contract: Contract, example: dict[str, np.ndarray], path: Path) -> None:
    """Save a ``torch.export`` program (``.pt2``) with the contract's dynamic axes.

    ``example`` holds batch-of-one inputs; with a dynamic batch axis they are traced as a
    batch of two, because torch.export specializes a size-1 axis to a constant.
    """
    import torch

    names = _input_names(contract)
    model.eval()
    traced = _traced(contract, [example])
    try:
        with _quiet():
            ep = torch.export.export(model, _to_torch(traced, names), dynamic_shapes=_dynamic_shapes(contract, True))
    except Exception as exc:  # the exporter's errors are long; keep the line that says why
        raise ExportError(f"torch.export failed: {root_cause(exc)}") from exc
    torch.export.save(ep, str(path))


def _onnx_program(module, args, input_names, output_names, dynamic_shapes, *, optimize: bool) -> Any:
    """``torch.onnx.export`` (dynamo) of ``module``: its program, or an :class:`ExportError`
    naming the root cause. Its warnings, progress prints and logged tracebacks are kept out of
    the user's terminal."""
    import logging

    import torch

    # The exporter warns about every torchvision operator it cannot register; irrelevant here.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with _quiet():
        try:
            prog = torch.onnx.export(
                module,
                args,
                dynamo=True,
                opset_version=OPSET,
                input_names=input_names,
                output_names=output_names,
                dynamic_shapes=dynamic_shapes,
                optimize=optimize,
                verify=False,
                report=False,
            )
        except Exception as exc:
            raise ExportError(f"ONNX export failed: {root_cause(exc)}") from exc
    if prog is None:
        raise ExportError("ONNX export returned no program")
    return prog


def _weight_bytes(module) -> int:
    """The bytes of ``module``'s parameters and buffers, a tensor shared by two names once."""
    seen = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return sum(t.numel() * t.element_size() for t in seen.values())


def _onnx_export(module, args, path: Path, input_names, output_names, dynamic_shapes, *, external: bool) -> None:
    """``external``: the weights go to ``<path>.data`` (the exporter's name for it).

    Optimized by :func:`_light_optimize`, not the exporter's full optimizer: its pattern
    rewriter is quadratic in the graph's nodes, and a flow-matching VLA's graph (a SmolVLA:
    10 denoising steps unrolled through its expert) is large enough for it to take most of
    an export (tiny SmolVLA: 10.0 s with it, 5.9 s without, same outputs); ONNX Runtime does
    the operator fusions at session creation."""
    prog = _onnx_program(module, args, input_names, output_names, dynamic_shapes, optimize=False)
    _light_optimize(prog.model)
    prog.save(str(path), external_data=external)


def export_onnx(
    model,
    contract: Contract,
    fixtures: list[dict[str, np.ndarray]],
    path: Path,
    *,
    tolerance: float = 1e-4,
    external_data_above: int = EXTERNAL_DATA_ABOVE,
    log=print,
) -> list[Comparison]:
    """Export ``model`` to ONNX at ``path`` and prove it matches PyTorch on ``fixtures``.

    ``model.prefix`` (the trunk's intermediate) takes the same inputs as ``model.forward``.
    Weights of more than ``external_data_above`` bytes are written to ``<path>.data``.
    Returns the comparisons (final outputs and the prefix intermediate); raises
    :class:`ExportError` when a check fails or an output differs by more than ``tolerance``.
    """
    import onnx
    import onnxruntime as ort
    import torch

    names = _input_names(contract)
    out_names = [spec.name for spec in contract.outputs]
    model.eval()
    example = _to_torch(fixtures[0], names)  # batch of one: every axis at its opt value
    # torch.export specializes a size-1 axis to a constant, so the dynamic export traces
    # a batch of two; the comparisons below then cover both batch sizes.
    batch2 = _traced(contract, [fixtures[0], fixtures[-1]])
    weights = _weight_bytes(model)
    external = weights > external_data_above
    if external:
        log(f"export: weights {weights / 2**20:.0f} MiB: ONNX with external data ({path.name}.data)")

    with tempfile.TemporaryDirectory() as tmp:
        # 1. Fixed shapes: every dimension at its opt value.
        fixed = Path(tmp) / "fixed.onnx"
        log("export: fixed-shape ONNX ...")
        _onnx_export(model, example, fixed, names, out_names, None, external=external)
        onnx.checker.check_model(str(fixed), full_check=True)
        fixed_cmp = _compare_onnx(model, fixed, names, out_names, fixtures[:1])
        log("export: fixed shapes OK (" + "; ".join(c.line() for c in fixed_cmp) + ")")

        # 2. Intermediate: a verification-only graph that also returns the trunk prefix.
        class _WithPrefix(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, *args):
                return self.inner(*args), self.inner.prefix(*args)

        inter = Path(tmp) / "intermediate.onnx"
        _onnx_export(_WithPrefix(model), example, inter, names, [*out_names, "prefix"], None, external=external)
        inter_cmp = _compare_onnx(_WithPrefix(model), inter, names, [*out_names, "prefix"], fixtures)
        inter_cmp = [c for c in inter_cmp if c.name == "prefix"]

    # 3. The release artifact: only the contract's dynamic axes opened.
    log("export: ONNX with the contract's dynamic axes ...")
    dynamic = _dynamic_shapes(contract, True)
    _onnx_export(model, _to_torch(batch2, names), path, names, out_names, dynamic, external=external)
    # Not the weights: external ones stay in <path>.data (saving this proto keeps the references).
    proto = onnx.load(str(path), load_external_data=False)
    for key, value in {
        **_torch_versions(),
        "vlad.contract_model": f"{contract.model.id}@{contract.model.version}",
    }.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(path))
    onnx.checker.check_model(str(path), full_check=True)
    _check_dynamic_axes(proto, contract)

    final_cmp = _compare_onnx(model, path, names, out_names, [*fixtures, batch2])
    comparisons = final_cmp + inter_cmp
    for c in comparisons:
        log(f"export: ORT vs PyTorch {c.line()}")
    for c in final_cmp:
        if c.max_abs > tolerance:
            raise ExportError(f"ONNX output {c.name} differs from PyTorch by {c.max_abs:.3g} > {tolerance:g}")
    del ort
    return comparisons


def _check_dynamic_axes(proto, contract: Contract) -> None:
    """The exported graph must have symbolic dims exactly where the contract has dynamic axes."""
    declared = {spec.name: {ax.axis for ax in spec.dynamic} for spec in [*contract.inputs, *contract.outputs]}
    problems = []
    for vi in [*proto.graph.input, *proto.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        symbolic = {i for i, d in enumerate(dims) if not d.HasField("dim_value")}
        if vi.name in declared and symbolic != declared[vi.name]:
            problems.append(
                f"{vi.name}: symbolic axes {sorted(symbolic)}, contract declares {sorted(declared[vi.name])}"
            )
    if problems:
        raise ExportError("exported ONNX dynamic axes differ from the contract: " + "; ".join(problems))


def _compare_onnx(model, path: Path, names, out_names, fixtures) -> list[Comparison]:
    import onnxruntime as ort
    import torch

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    worst: dict[str, Comparison] = {}
    for fx in fixtures:
        feeds = {n: fx[n] for n in names}
        got = sess.run(out_names, feeds)
        with torch.inference_mode():
            ref = model(*_to_torch(fx, names))
        ref = ref if isinstance(ref, tuple) else (ref,)
        for n, r, g in zip(out_names, ref, got, strict=True):
            c = compare(n, r.numpy(), g)
            if n not in worst or c.max_abs > worst[n].max_abs:
                worst[n] = c
    return list(worst.values())


# ---------------------------------------------------------------------------------------
# Streamed export: models too large to hold twice
# ---------------------------------------------------------------------------------------

#: ``values(name, shape, dtype) -> torch.Tensor``: the value of one parameter or buffer.
Values = Callable[[str, tuple[int, ...], Any], Any]
# Tensors above this size start at a multiple of 64 KiB in the external data file, so a
# runtime can map them page-aligned (and huge-page friendly) instead of copying.
ALIGNMENT, ALIGN_ABOVE = 65536, 1 << 20


class _Progress:
    """One line per tenth of the weights written: a streamed export runs for minutes."""

    def __init__(self, total: int, log) -> None:
        self.total, self.log = total, log  # total 0: not counting yet
        self.done = 0

    def add(self, nbytes: int) -> None:
        if self.total <= 0:
            return
        before = 10 * self.done // self.total
        self.done += nbytes
        after = min(10, 10 * self.done // self.total)
        if after > before:
            self.log(f"export: weights {10 * after} % ({self.done / 1e9:.2f} of {self.total / 1e9:.2f} GB)")


def _is_fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def export_program_streamed(
    module, contract: Contract, example: dict[str, np.ndarray], path: Path, values: Values, *, log=print
) -> None:
    """``torch.export`` of ``module`` whose parameters and buffers are fake tensors (built
    under a ``FakeTensorMode``, so nothing was allocated), written as a ``.pt2`` whose
    weights come from ``values`` one tensor at a time.

    The program is traced and saved with empty weight records, then the archive is copied
    record by record with each weight filled in (torch's own archive writer keeps its
    alignment). Peak memory: the graph plus the largest single weight.
    """
    import torch

    names = _input_names(contract)
    traced = _traced(contract, [example])
    try:
        ep = torch.export.export(module, _to_torch(traced, names), dynamic_shapes=_dynamic_shapes(contract, True))
    except Exception as exc:
        raise ExportError(f"torch.export failed: {str(exc).splitlines()[0]}") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        skeleton = Path(tmp) / "skeleton.pt2"
        torch.export.save(ep, str(skeleton))
        partial = Path(tmp) / path.name
        total = sum(t.numel() * t.element_size() for t in (*ep.state_dict.values(), *ep.constants.values()))
        _fill_archive(skeleton, partial, values, _Progress(total, log))
        os.replace(partial, path)


def _fill_archive(src: Path, dst: Path, values: Values, progress: _Progress) -> None:
    """Copy a ``.pt2`` archive, giving every weight and constant its own record filled by ``values``.

    A program traced on fake tensors is saved with every weight pointing at one empty
    record; each gets its own record (``weight_<i>``, ``tensor_<i>``) and its config entry
    is rewritten to name it.
    """
    import json

    import torch
    from torch._export.serde.serialize import deserialize_scalar_type

    reader = torch._C.PyTorchFileReader(str(src))
    writer = torch._C.PyTorchFileWriter(str(dst))
    replaced = set()
    for config_name, folder, prefix in (
        ("data/weights/model_weights_config.json", "data/weights/", "weight_"),
        ("data/constants/model_constants_config.json", "data/constants/", "tensor_"),
    ):
        if config_name not in reader.get_all_records():
            continue
        config = json.loads(reader.get_record(config_name))
        for i, (fqn, meta) in enumerate(config["config"].items()):
            tm = meta["tensor_meta"]
            if meta.get("use_pickle") or tm is None:
                raise ExportError(f"{fqn}: only plain tensors can be streamed into a .pt2")
            replaced.add(folder + meta["path_name"])
            shape = tuple(int(s["as_int"]) for s in tm["sizes"])
            tensor = values(fqn, shape, deserialize_scalar_type(tm["dtype"])).contiguous()
            if tuple(tensor.shape) != shape:
                raise ExportError(f"{fqn}: values gave shape {list(tensor.shape)}, the program has {list(shape)}")
            meta["path_name"] = f"{prefix}{i}"
            tm["strides"] = [{"as_int": s} for s in tensor.stride()]
            tm["storage_offset"] = {"as_int": 0}
            nbytes = tensor.numel() * tensor.element_size()
            writer.write_record(folder + meta["path_name"], tensor.untyped_storage(), nbytes)
            progress.add(nbytes)
            del tensor
        replaced.add(config_name)
        data = json.dumps(config).encode()
        writer.write_record(config_name, data, len(data))
    for name in reader.get_all_records():
        if name not in replaced:
            data = reader.get_record(name)
            writer.write_record(name, data, len(data))
    writer.write_end_of_file()


def export_onnx_streamed(
    module, contract: Contract, example: dict[str, np.ndarray], path: Path, values: Values, *, log=print
) -> Path:
    """ONNX export of ``module`` built on fake tensors (see :func:`export_program_streamed`),
    with every weight in the external data file ``<path>.data`` written one tensor at a time
    from ``values``. Returns that file's path.

    The graph is exported unoptimized (the optimizer would read the fake weights), the
    fake initializers are replaced by lazily computed ones, and constants are folded then
    (:func:`_light_optimize`; folding touches only tensors below its size limit). Checked with
    ``onnx.checker`` (full check, on the file) and against the contract's dynamic axes.
    """

    import onnx
    import onnx_ir as ir

    names = _input_names(contract)
    out_names = [spec.name for spec in contract.outputs]
    traced = _traced(contract, [example])
    log("export: ONNX graph (weights not allocated) ...")
    prog = _onnx_program(
        module, _to_torch(traced, names), names, out_names, _dynamic_shapes(contract, True), optimize=False
    )
    model = prog.model
    progress = _Progress(0, log)
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        raw = getattr(tensor, "raw", None)
        if tensor is None or raw is None or not _is_fake(raw):
            continue
        shape, dtype, kind = tuple(int(d) for d in raw.shape), raw.dtype, type(tensor)

        def produce(name=name, shape=shape, dtype=dtype, kind=kind):
            t = values(name, shape, dtype)
            progress.add(t.numel() * t.element_size())
            return kind(t, name)

        value.const_value = ir.LazyTensor(
            produce, dtype=tensor.dtype, shape=ir.Shape([int(d) for d in shape]), name=name
        )
    log("export: folding constants ...")
    _light_optimize(model)
    model.metadata_props.update(
        {**_torch_versions(), "vlad.contract_model": f"{contract.model.id}@{contract.model.version}"}
    )
    data = path.with_name(path.name + ".data")
    log(f"export: writing {path.name} and its weights to {data.name} ...")
    path.parent.mkdir(parents=True, exist_ok=True)
    # What is left after folding (dead weights dropped; folding read a few small ones).
    lazy = [v.const_value for v in model.graph.initializers.values() if isinstance(v.const_value, ir.LazyTensor)]
    progress.total, progress.done = max(1, int(sum(math.prod(t.shape.numpy()) * t.dtype.itemsize for t in lazy))), 0
    ir.save(model, str(path), external_data=data.name, alignment=ALIGNMENT, align_threshold=ALIGN_ABOVE)
    onnx.checker.check_model(str(path), full_check=True)
    _check_dynamic_axes(onnx.load(str(path), load_external_data=False), contract)
    return data


def _light_optimize(model) -> None:
    """onnxscript's optimizer without the passes that do not scale to a π0-sized graph.

    Its pattern rewriter is quadratic in the graph's nodes (4,851 nodes: 13 s, 9,015: 55 s,
    a π0 graph of ~20,000 nodes: most of an hour on two cores), and de-duplicating
    initializers compares their contents, which would produce every streamed weight once
    more. What remains (inlining, constant folding with shape inference, dead code and
    unused opsets removed, constants lifted) is linear; ONNX Runtime's own graph
    optimizer does the operator fusions at session creation.
    """
    import onnx_ir.passes.common as common
    from onnxscript.optimizer import _constant_folding

    passes = [
        common.InlinePass(),
        _constant_folding.FoldConstantsPass(
            shape_inference=True,
            input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
            output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
        ),
        common.RemoveUnusedNodesPass(),
        common.RemoveUnusedFunctionsPass(),
        common.RemoveUnusedOpsetsPass(),
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.OutputFixPass(),
        common.NameFixPass(),
    ]
    for p in passes:
        p(model)
