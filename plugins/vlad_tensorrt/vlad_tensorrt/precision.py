"""Precision candidates and their requirements (pure: no TensorRT import).

Every precision is its own build candidate: its own engine, its own cache key and its own
equivalence-gate evidence. A precision the GPU cannot run, that the installed TensorRT
cannot build, or that the ONNX cannot express is refused with the reason; nothing is
silently built at another precision.

- ``fp32``: strongly typed build from the fp32 ONNX, TF32 disabled (so "fp32" means fp32).
- ``tf32``: the same strongly typed build with TF32 allowed (TensorRT's own default):
  matmul / convolution inputs rounded to 10 mantissa bits on tensor cores. Needs compute
  capability >= 8.0 (Ampere); it has its own error budget.
- ``fp16`` / ``bf16``: TensorRT 10 builder flags (``BuilderFlag.FP16`` / ``BF16``) on the
  fp32 ONNX; TensorRT picks reduced-precision kernels where it judges them fit. bf16
  needs compute capability >= 8.0 (Ampere). TensorRT 11 removed these flags: there the
  precisions are not offered (export a reduced-precision ONNX and build it strongly typed).
- ``fp8``: needs compute capability >= 8.9 (Ada / Hopper and later) *and* an ONNX with
  FP8 Q/DQ (QuantizeLinear / DequantizeLinear) nodes, built as a strongly typed network:
  TensorRT only runs fp8 where the graph says so (explicit quantization).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from vlad.errors import BackendError

# The labels a TensorRT engine is built for (TensorRTOptions.precision takes exactly these).
Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
PRECISIONS: tuple[str, ...] = get_args(Precision)

# Minimum compute capability per precision. fp16 arithmetic is native from sm_53; TF32 and
# bf16 tensor cores arrived with Ampere (8.0); fp8 tensor cores with Ada (8.9) and Hopper (9.0).
MIN_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "fp32": (0, 0),
    "tf32": (8, 0),
    "fp16": (5, 3),
    "bf16": (8, 0),
    "fp8": (8, 9),
}

# The TensorRT builder flag each precision needs (None: built strongly typed, no flag).
BUILDER_FLAG: dict[str, str | None] = {"fp32": None, "tf32": "TF32", "fp16": "FP16", "bf16": "BF16", "fp8": None}

_ARCH_HINT = {
    "tf32": "Ampere or newer",
    "bf16": "Ampere or newer",
    "fp8": "Ada Lovelace / Hopper or newer",
    "fp16": "Maxwell sm_53 or newer",
}

# ONNX ops that mark explicit quantization. ModelOpt's FP8 exports for TensorRT use the
# custom `trt` domain ops; the standard ones carry FP8 through their zero point / output_dtype.
QUANTIZE_OPS = frozenset({"QuantizeLinear", "TRT_FP8QuantizeLinear"})
DEQUANTIZE_OPS = frozenset({"DequantizeLinear", "TRT_FP8DequantizeLinear"})
_FP8_ONLY_OPS = frozenset({"TRT_FP8QuantizeLinear", "TRT_FP8DequantizeLinear"})


def parse_compute_capability(value: str | tuple[int, int]) -> tuple[int, int]:
    """``"8.9"`` or ``(8, 9)`` -> ``(8, 9)``; anything else is a :class:`BackendError`."""
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return value
    if isinstance(value, str):
        major, _, minor = value.partition(".")
        if major.isdigit() and minor.isdigit():
            return int(major), int(minor)
    raise BackendError(f"not a compute capability: {value!r} (expected e.g. '8.9')")


def format_cc(cc: tuple[int, int]) -> str:
    """``(8, 9)`` -> ``"8.9"``."""
    return f"{cc[0]}.{cc[1]}"


def precision_problem(
    precision: str,
    compute_capability: str | tuple[int, int],
    builder_flags: Iterable[str] | None = None,
    tensorrt_version: str = "?",
) -> str | None:
    """Why ``precision`` cannot be built here, or None when it can.

    ``builder_flags`` are the names in the installed TensorRT's ``BuilderFlag`` (None: do
    not check them, e.g. before TensorRT is imported); a precision whose flag is missing
    (fp16/bf16 on TensorRT 11) is refused with that reason.
    """
    if precision not in PRECISIONS:
        return f"unknown TensorRT precision {precision!r}; candidates: {', '.join(PRECISIONS)}"
    cc = parse_compute_capability(compute_capability)
    need = MIN_COMPUTE_CAPABILITY[precision]
    if cc < need:
        return (
            f"precision {precision} needs compute capability >= {format_cc(need)} "
            f"({_ARCH_HINT[precision]}); this GPU has {format_cc(cc)}"
        )
    flag = BUILDER_FLAG[precision]
    if flag is not None and builder_flags is not None and flag not in set(builder_flags):
        return (
            f"precision {precision}: TensorRT {tensorrt_version} has no BuilderFlag.{flag} (TensorRT 11 "
            f"removed the weakly typed fp16/bf16 flags); install TensorRT 10 (pip install "
            f"'vlad[tensorrt]'), or export a {precision} ONNX and build it strongly typed"
        )
    return None


def validate_precision(
    precision: str,
    compute_capability: str | tuple[int, int],
    builder_flags: Iterable[str] | None = None,
    tensorrt_version: str = "?",
) -> str:
    """Check that ``precision`` is a known candidate that this GPU and TensorRT can build.

    Returns the precision; raises :class:`BackendError` naming the requirement otherwise
    (e.g. fp8 on a cc 8.7 Jetson Orin, fp16 on TensorRT 11).
    """
    problem = precision_problem(precision, compute_capability, builder_flags, tensorrt_version)
    if problem:
        raise BackendError(problem)
    return precision


def supported_precisions(
    compute_capability: str | tuple[int, int], builder_flags: Iterable[str] | None = None
) -> tuple[str, ...]:
    """The candidates this GPU (and, given its flags, this TensorRT) can build; fp8
    additionally needs a Q/DQ ONNX."""
    flags = None if builder_flags is None else tuple(builder_flags)
    return tuple(p for p in PRECISIONS if precision_problem(p, compute_capability, flags) is None)


# ---------------------------------------------------------------------------------------
# Explicit quantization (Q/DQ) in the ONNX
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QDQSummary:
    """Explicit-quantization nodes found in an ONNX graph.

    ``fp8`` counts Q/DQ nodes known to be FP8 (by op, zero-point dtype or
    ``output_dtype``); ``None`` when the scan could not tell (no ``onnx`` package).
    """

    quantize: int
    dequantize: int
    fp8: int | None

    @property
    def any(self) -> bool:
        return self.quantize + self.dequantize > 0


def scan_onnx_qdq(path: str | Path) -> QDQSummary:
    """Count Q/DQ nodes in the ONNX at ``path`` (subgraphs and local functions included).

    Uses the ``onnx`` package when installed (exact, and tells FP8 from INT8 Q/DQ);
    otherwise a byte scan for the op names (counts occurrences, FP8 unknown). The build
    re-checks the parsed TensorRT network either way.
    """
    path = Path(path)
    try:
        import onnx
    except ImportError:
        return _scan_bytes(path)
    model = onnx.load(str(path), load_external_data=False)
    fp8_types = {
        getattr(onnx.TensorProto, n)
        for n in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ")
        if hasattr(onnx.TensorProto, n)
    }
    counts = {"q": 0, "dq": 0, "fp8": 0}

    def visit(graph) -> None:
        init_types = {t.name: t.data_type for t in graph.initializer}
        for node in graph.node:
            if node.op_type in QUANTIZE_OPS or node.op_type in DEQUANTIZE_OPS:
                counts["q" if node.op_type in QUANTIZE_OPS else "dq"] += 1
                if _node_is_fp8(node, init_types, fp8_types):
                    counts["fp8"] += 1
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        visit(g)

    visit(model.graph)
    for fn in model.functions:
        for node in fn.node:
            if node.op_type in QUANTIZE_OPS or node.op_type in DEQUANTIZE_OPS:
                counts["q" if node.op_type in QUANTIZE_OPS else "dq"] += 1
                if node.op_type in _FP8_ONLY_OPS:
                    counts["fp8"] += 1
    return QDQSummary(counts["q"], counts["dq"], counts["fp8"])


def _node_is_fp8(node, init_types: dict[str, int], fp8_types: set[int]) -> bool:
    if node.op_type in _FP8_ONLY_OPS:
        return True
    for attr in node.attribute:
        if attr.name == "output_dtype" and attr.i in fp8_types:
            return True
    # QuantizeLinear / DequantizeLinear: the zero point (3rd input) carries the quantized type.
    if len(node.input) >= 3 and node.input[2]:
        return init_types.get(node.input[2]) in fp8_types
    return False


def _scan_bytes(path: Path) -> QDQSummary:
    data = path.read_bytes()
    # Case matters: "DequantizeLinear" contains "quantizeLinear", not "QuantizeLinear".
    # Node names may repeat an op name, so these are upper bounds, used only to refuse.
    return QDQSummary(data.count(b"QuantizeLinear"), data.count(b"DequantizeLinear"), None)


def require_fp8_qdq(summary: QDQSummary, source: str) -> None:
    """Refuse an fp8 build when the ONNX has no (FP8) Q/DQ nodes.

    Without them TensorRT has nowhere it may use fp8 and would quietly build a
    higher-precision engine under the fp8 label.
    """
    if not summary.any:
        raise BackendError(
            f"precision fp8 needs an explicitly quantized ONNX (FP8 QuantizeLinear/"
            f"DequantizeLinear nodes, e.g. from NVIDIA ModelOpt) built as a strongly typed "
            f"network; {source} has no Q/DQ nodes. Quantize the model, or choose fp16/bf16."
        )
    if summary.fp8 == 0:
        raise BackendError(
            f"precision fp8: {source} has {summary.quantize + summary.dequantize} Q/DQ "
            f"nodes but none is FP8 (INT8 quantization?); export FP8 Q/DQ for an fp8 engine"
        )
