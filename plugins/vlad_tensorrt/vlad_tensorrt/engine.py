"""TensorRT 10 build and execution (tensorrt and cuda-python are imported lazily).

This module imports without TensorRT; every function that needs it imports it and turns
an ImportError into :class:`~vlad.errors.BackendUnavailable` with the install hint.

Memory is managed with cuda-python (``cudart``), which comes with TensorRT in vlad's
``tensorrt`` extra; torch is not used, so a TensorRT robot image needs no torch. Device
buffers are allocated once for the profile's max shapes (``cudaMalloc``) and zeroed (a
CUDA-graph capture at load runs the engine on them: uninitialised int64 token ids would be
out-of-range embedding indices). Host staging buffers are pinned (``cudaMallocHost``) so
copies are truly asynchronous; they are owned by :class:`~vlad_tensorrt.buffers.HostBuffer`
objects, so outputs (views of them) stay valid after ``close()``. Tensor addresses are
bound once (stable addresses are what makes CUDA-graph replay valid), and each call runs
H2D copies, ``execute_async_v3`` (or the captured graph) and D2H copies on one dedicated
non-blocking stream, timed with four CUDA events. Every GPU object is released once, by
``close()`` or by the garbage collector (:class:`~vlad_tensorrt.buffers.DeviceResources`).

CUDA graph (option ``cuda_graph``): at load the engine is captured at the profile's opt
shape on an execution context of its own whose input shapes are set once and never
changed, so a replay can never run with shapes other than the captured ones. A call whose
input shapes equal the captured ones replays the graph; any other shape inside the profile
runs ``execute_async_v3`` on the main context, because a captured graph bakes in the
shapes it was recorded with. That is a documented execution-path choice, not a precision
or provider fallback: both paths run the same engine (the graph context costs one more
activation allocation, counted in ``memory()``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlad.backend import MemoryStats, Session, SessionDescription, Timing, host_rss_bytes
from vlad.contract import Contract
from vlad.errors import BackendError, BackendUnavailable
from vlad_tensorrt.buffers import DeviceResources, HostBuffer
from vlad_tensorrt.cache import CacheIngredients, PreparedEngine
from vlad_tensorrt.precision import BUILDER_FLAG, format_cc
from vlad_tensorrt.profiles import Profile, check_profile

TENSORRT_MISSING = "tensorrt is not installed (pip install 'vlad[tensorrt]' on a machine with an NVIDIA GPU)"
CUDA_PYTHON_MISSING = "cuda-python is not installed (pip install 'vlad[tensorrt]' on a machine with an NVIDIA GPU)"

# Precisions built as strongly typed networks: every tensor keeps the type the ONNX gives
# it (fp32 everywhere, or the FP8 of explicit Q/DQ nodes); tf32 only lets fp32 matmuls use
# TF32 tensor cores. fp16 / bf16 use TensorRT 10's builder flags on the fp32 ONNX instead.
STRONGLY_TYPED = frozenset({"fp32", "tf32", "fp8"})


# ---------------------------------------------------------------------------------------
# Imports and device probing
# ---------------------------------------------------------------------------------------


def import_tensorrt():
    """``import tensorrt``, or BackendUnavailable saying how to install it."""
    try:
        import tensorrt
    except ImportError as exc:
        detail = "" if isinstance(exc, ModuleNotFoundError) and exc.name == "tensorrt" else f": {exc}"
        raise BackendUnavailable(TENSORRT_MISSING + detail) from exc
    return tensorrt


def import_cudart():
    """cuda-python's runtime bindings (``cuda.bindings.runtime`` from 12.6 on, else the
    older ``cuda.cudart``), or BackendUnavailable."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart
        except ImportError as exc:
            raise BackendUnavailable(CUDA_PYTHON_MISSING) from exc
    return cudart


def cuda_check(cudart, result: tuple, what: str) -> Any:
    """Unpack a cuda-python result ``(err, *values)``; raise BackendError on an error."""
    err, *values = result
    if err != cudart.cudaError_t.cudaSuccess:
        _, name = cudart.cudaGetErrorName(err)
        _, text = cudart.cudaGetErrorString(err)
        raise BackendError(f"{what} failed: {_text(name)} ({_text(text)})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode(errors="replace")
    return str(value)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """The GPU a session runs on, and the TensorRT that runs it."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    tensorrt_version: str
    all_devices: tuple[tuple[int, str, tuple[int, int]], ...] = ()
    #: Names in this TensorRT's ``BuilderFlag`` that precisions need (TensorRT 11 has no FP16/BF16).
    builder_flags: frozenset[str] = frozenset()


def probe(device: int = 0) -> DeviceInfo:
    """Import TensorRT and cuda-python and describe CUDA device ``device``.

    Raises BackendUnavailable with the reason when either is missing or no GPU is visible.
    """
    trt = import_tensorrt()
    cudart = import_cudart()
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess or count == 0:
        detail = "" if err == cudart.cudaError_t.cudaSuccess else f" ({_text(cudart.cudaGetErrorName(err)[1])})"
        raise BackendUnavailable(f"no CUDA GPU visible{detail}")
    devices = []
    for i in range(count):
        prop = cuda_check(cudart, cudart.cudaGetDeviceProperties(i), f"cudaGetDeviceProperties({i})")
        devices.append((i, _text(prop.name), (int(prop.major), int(prop.minor))))
    if not 0 <= device < count:
        raise BackendUnavailable(f"CUDA device {device} is not visible ({count} GPU(s) visible)")
    _, name, cc = devices[device]
    return DeviceInfo(device, name, cc, str(trt.__version__), tuple(devices), builder_flags(trt))


def builder_flags(trt) -> frozenset[str]:
    """The precision-related ``BuilderFlag`` names the installed TensorRT has."""
    wanted = {f for f in BUILDER_FLAG.values() if f}
    return frozenset(f for f in wanted if hasattr(trt.BuilderFlag, f))


# ---------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------


def make_progress_monitor(trt, write: Callable[[str], None]):
    """A ``trt.IProgressMonitor`` that writes one line per phase start, step and finish.

    TensorRT calls it from several builder threads, hence the lock; returning True from
    ``step_complete`` lets the build continue.
    """

    class _ProgressMonitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self._lock = threading.Lock()
            self._phases: dict[str, tuple[int, int]] = {}  # name -> (depth, steps)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            with self._lock:
                depth = self._phases[parent_phase][0] + 1 if parent_phase in self._phases else 0
                self._phases[phase_name] = (depth, num_steps)
                write(f"{'  ' * depth}{phase_name}: started ({num_steps} steps)")

        def step_complete(self, phase_name: str, step: int) -> bool:
            with self._lock:
                depth, steps = self._phases.get(phase_name, (0, 0))
                write(f"{'  ' * depth}{phase_name}: step {step + 1}/{steps}")
            return True

        def phase_finish(self, phase_name: str) -> None:
            with self._lock:
                depth, _ = self._phases.pop(phase_name, (0, 0))
                write(f"{'  ' * depth}{phase_name}: finished")

    return _ProgressMonitor()


def format_parser_errors(parser, source: str) -> str:
    """All OnnxParser errors in one message, each with its node index, name and operator.

    TensorRT 10's ``ParserError`` has ``node_name()`` / ``node_operator()``; older
    bindings only give the node index, which is then looked up in the ONNX (when the
    ``onnx`` package is installed) so the message still names the node.
    """
    lines = []
    onnx_nodes: list[tuple[str, str]] | None = None
    for i in range(parser.num_errors):
        e = parser.get_error(i)
        index = e.node()
        node_name = e.node_name() if hasattr(e, "node_name") else ""
        node_op = e.node_operator() if hasattr(e, "node_operator") else ""
        if not node_name and index >= 0:
            if onnx_nodes is None:
                onnx_nodes = _onnx_node_names(source)
            if index < len(onnx_nodes):
                node_name, node_op = onnx_nodes[index]
        where = f"node {index}" + (f" {node_name!r}" if node_name else "") + (f" ({node_op})" if node_op else "")
        lines.append(f"{where}: {e.desc()} [{e.code()}]")
    return f"TensorRT could not parse {source}: " + ("; ".join(lines) or "no error detail")


def _onnx_node_names(source: str) -> list[tuple[str, str]]:
    try:
        import onnx

        graph = onnx.load(source, load_external_data=False).graph
    except Exception:  # only used to decorate an error message; never hide the error itself
        return []
    return [(n.name, n.op_type) for n in graph.node]


def build_serialized_engine(
    onnx_path: str | Path,
    profile: Profile,
    precision: str,
    timing_cache: bytes | None = None,
    *,
    device: int = 0,
    progress: Callable[[str], None] | None = None,
) -> tuple[bytes, bytes | None]:
    """Build a serialized engine from ``onnx_path``.

    Returns ``(engine plan, serialized timing cache)``. Raises BackendError with the
    parser's errors (node names included), when the network's inputs do not match the
    profile, when fp8 is asked of a network without FP8 Q/DQ layers, or when TensorRT
    has no builder flag for the precision (TensorRT 11 removed FP16/BF16).
    """
    trt = import_tensorrt()
    cudart = import_cudart()
    # The builder times kernels on the current device: make it the session's GPU.
    cuda_check(cudart, cudart.cudaSetDevice(device), "cudaSetDevice")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    precision_flag = None
    flag_name = BUILDER_FLAG.get(precision)
    if flag_name is not None:
        precision_flag = getattr(trt.BuilderFlag, flag_name, None)
        if precision_flag is None:
            raise BackendError(
                f"TensorRT {trt.__version__} has no BuilderFlag.{flag_name} (weakly typed "
                f"{precision} was removed in TensorRT 11): export a {precision} ONNX and build it "
                f"strongly typed, or use TensorRT 10"
            )
    # EXPLICIT_BATCH is deprecated and ignored in TensorRT 10 (networks are always explicit
    # batch), so only STRONGLY_TYPED is ever set.
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if precision in STRONGLY_TYPED else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        raise BackendError(format_parser_errors(parser, str(onnx_path)))
    _check_network_inputs(network, profile, str(onnx_path))
    if precision == "fp8":
        _require_fp8_layers(trt, network, str(onnx_path))

    config = builder.create_builder_config()
    opt_profile = builder.create_optimization_profile()
    for t in profile.tensors:
        opt_profile.set_shape(t.name, t.min, t.opt, t.max)
    config.add_optimization_profile(opt_profile)
    tf32 = getattr(trt.BuilderFlag, "TF32", None)
    if tf32 is not None and precision != "tf32":
        # TF32 is on by default and rounds matmul inputs to 10 mantissa bits: an engine
        # labelled fp32 (or fp16/bf16/fp8, whose fp32 layers stay fp32) must not use it.
        config.clear_flag(tf32)
    if precision_flag is not None:
        config.set_flag(precision_flag)
    cache = attach_timing_cache(config, timing_cache, progress)
    monitor = make_progress_monitor(trt, progress) if progress else None
    if monitor is not None:
        config.progress_monitor = monitor  # kept alive by `monitor` until the build returns
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BackendError(
            f"TensorRT could not build a {precision} engine from {onnx_path} (the TensorRT log above says why)"
        )
    # The attached cache now also holds this build's new timings (TensorRT docs,
    # "Optimizing Builder Performance": serialize it after the build for the next one).
    timing = bytes(memoryview(cache.serialize()))
    return bytes(memoryview(plan)), timing


def attach_timing_cache(config, stored: bytes | None, progress: Callable[[str], None] | None = None):
    """Attach ``stored`` (or a fresh, empty timing cache) to the builder ``config``.

    ``set_timing_cache(..., ignore_mismatch=False)`` returns False when TensorRT refuses
    the stored cache (made by another TensorRT or device, or damaged): the build then
    starts from an empty cache instead of silently running without one, and says so.
    Returns the attached cache (serialized after the build for the next one).
    """
    if stored:
        cache = config.create_timing_cache(stored)
        if cache is not None and config.set_timing_cache(cache, False):
            return cache
        if progress is not None:
            progress("stored timing cache refused by TensorRT (other version or device, or damaged); starting empty")
    cache = config.create_timing_cache(b"")
    if cache is None or not config.set_timing_cache(cache, False):
        raise BackendError("TensorRT refused an empty timing cache (out of memory?); cannot build")
    return cache


def _check_network_inputs(network, profile: Profile, source: str) -> None:
    """The ONNX inputs must be the contract's, with ranks equal and every static dim
    (-1 marks a dynamic one) equal to a fixed axis of the profile."""
    names = [network.get_input(i).name for i in range(network.num_inputs)]
    expected = [t.name for t in profile.tensors]
    if sorted(names) != sorted(expected):
        raise BackendError(f"{source}: network inputs {names} do not match the contract inputs {expected}")
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        t = profile[tensor.name]
        dims = tuple(tensor.shape)
        fits = len(dims) == len(t.min) and all(d == -1 or t.min[a] == t.max[a] == d for a, d in enumerate(dims))
        if not fits:
            raise BackendError(
                f"{source}: input {tensor.name!r} has shape {list(dims)} in the ONNX, which does not "
                f"fit the contract profile min {list(t.min)} max {list(t.max)}"
            )


def _require_fp8_layers(trt, network, source: str) -> None:
    """The parsed network must contain Quantize layers that quantize to FP8; otherwise an
    "fp8" engine would hold no fp8 at all."""
    q = fp8 = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type == trt.LayerType.QUANTIZE:
            q += 1
            if quantize_output_type(trt, layer) == trt.DataType.FP8:
                fp8 += 1
    if fp8 == 0:
        raise BackendError(
            f"precision fp8: the TensorRT network parsed from {source} has {q} Quantize layers and "
            f"none quantizes to FP8; export FP8 Q/DQ nodes (e.g. with NVIDIA ModelOpt)"
        )


def quantize_output_type(trt, layer):
    """The type a Quantize layer quantizes to (``IQuantizeLayer.to_type``).

    ``network.get_layer`` returns a plain ``ILayer``; the Python bindings expose a layer's
    own attributes only after its class is set to the specific interface. Before the
    build, the output tensor's dtype of a parsed network need not say FP8 yet, so the
    layer's own ``to_type`` decides; the output dtype is the answer only for bindings
    without it.
    """
    layer.__class__ = trt.IQuantizeLayer
    to_type = getattr(layer, "to_type", None)
    return to_type if to_type is not None else layer.get_output(0).dtype


# ---------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Binding:
    name: str
    is_input: bool
    dtype: np.dtype
    max_shape: tuple[int, ...]
    nbytes: int
    device: int = 0
    host_ptr: int = 0
    host: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint8))  # pinned, flat uint8


class TensorRTSession(Session):
    """One deserialized engine with its contexts, stream, buffers and (optional) graph."""

    backend_name = "tensorrt"

    def __init__(
        self,
        contract: Contract,
        artifact: Path,
        options: Mapping[str, Any],
        *,
        opts,
        prepared: PreparedEngine,
        device: DeviceInfo,
        profile: Profile,
        ingredients: CacheIngredients,
    ) -> None:
        super().__init__(contract, artifact, options)
        self._trt = import_tensorrt()
        self._cudart = import_cudart()
        self.opts = opts
        self.prepared = prepared
        self.device = device
        self.profile = profile
        self.ingredients = ingredients
        self.graph_launches = 0  # calls served by CUDA-graph replay
        self.plain_launches = 0  # calls served by execute_async_v3
        self.weights_bytes = 0
        self.weights_source = ""
        # Every GPU object lives in `_res`, released once by close() or, for a session
        # dropped without close(), by this finalizer (which must not reference `self`).
        self._res = DeviceResources(self._cudart)
        self._release = weakref.finalize(self, self._res.release)
        self._bindings: list[_Binding] = []
        self._inputs: list[_Binding] = []
        self._outputs: list[_Binding] = []
        self._host_buffers: list[HostBuffer] = []
        self._graph_exec = None
        self._graph_shapes: dict[str, tuple[int, ...]] | None = None
        self._shapes: dict[str, tuple[int, ...]] = {}
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    # -- setup ---------------------------------------------------------------------------

    def _open(self) -> None:
        trt, cudart, res = self._trt, self._cudart, self._res
        cuda_check(cudart, cudart.cudaSetDevice(self.device.index), "cudaSetDevice")
        res.logger = trt.Logger(trt.Logger.WARNING)
        res.runtime = trt.Runtime(res.logger)
        res.engine = res.runtime.deserialize_cuda_engine(self.prepared.plan)
        if res.engine is None:
            raise BackendError(f"TensorRT could not deserialize {self.prepared.path}")
        self.weights_bytes, self.weights_source = engine_weights_bytes(trt, res.engine, len(self.prepared.plan))
        self._check_engine_io()
        res.context = self._new_context()
        res.stream = cuda_check(
            cudart, cudart.cudaStreamCreateWithFlags(getattr(cudart, "cudaStreamNonBlocking", 1)), "cudaStreamCreate"
        )
        for _ in range(4):
            res.events.append(cuda_check(cudart, cudart.cudaEventCreate(), "cudaEventCreate"))
        self._allocate()
        if self.opts.cuda_graph:
            self._capture_graph()

    def _new_context(self):
        context = self._res.engine.create_execution_context()
        if context is None:
            raise BackendError("TensorRT could not create an execution context (out of device memory?)")
        return context

    def _check_engine_io(self) -> None:
        """The engine must have exactly the contract's tensors, dtypes and our profile."""
        trt, engine = self._trt, self._res.engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = {n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT}
        outputs = set(names) - inputs
        want_in = {s.name for s in self.contract.inputs}
        want_out = {s.name for s in self.contract.outputs}
        if inputs != want_in or outputs != want_out:
            raise BackendError(
                f"engine tensors (inputs {sorted(inputs)}, outputs {sorted(outputs)}) do not match the "
                f"contract (inputs {sorted(want_in)}, outputs {sorted(want_out)})"
            )
        for spec in (*self.contract.inputs, *self.contract.outputs):
            dt = engine.get_tensor_dtype(spec.name)
            try:
                got = np.dtype(trt.nptype(dt))
            except TypeError:
                got = None
            if got != np.dtype(spec.dtype):
                raise BackendError(f"engine tensor {spec.name!r} is {dt}, the contract requires {spec.dtype}")
        for t in self.profile.tensors:
            lo, opt, hi = (tuple(d) for d in engine.get_tensor_profile_shape(t.name, 0))
            if (lo, opt, hi) != (t.min, t.opt, t.max):
                raise BackendError(
                    f"engine profile for {t.name!r} is {list(lo)}/{list(opt)}/{list(hi)}, expected "
                    f"{list(t.min)}/{list(t.opt)}/{list(t.max)}"
                )

    def _allocate(self) -> None:
        """Device and pinned host buffers sized for the profile's max shapes, zeroed, bound once."""
        cudart, res = self._cudart, self._res
        ctx = res.context
        for name, shape in self.profile.max_shapes().items():
            self._set_shape(name, shape)
        specs = [(s, True) for s in self.contract.inputs] + [(s, False) for s in self.contract.outputs]
        for spec, is_input in specs:
            shape = tuple(int(d) for d in ctx.get_tensor_shape(spec.name))
            if any(d < 0 for d in shape):
                raise BackendError(f"output {spec.name!r} has a data-dependent shape {list(shape)}; not supported")
            dtype = np.dtype(spec.dtype)
            nbytes = max(int(np.prod(shape, dtype=np.int64)), 1) * dtype.itemsize
            b = _Binding(spec.name, is_input, dtype, shape, nbytes)
            self._bindings.append(b)
            b.device = int(cuda_check(cudart, cudart.cudaMalloc(nbytes), f"cudaMalloc({spec.name})"))
            res.device_ptrs.append(b.device)  # registered at once, so a failure later frees it
            # Zeroed: the graph capture at load runs the engine on these buffers, and int64
            # token ids are embedding indices (garbage would index out of range).
            cuda_check(cudart, cudart.cudaMemset(b.device, 0, nbytes), f"cudaMemset({spec.name})")
            host = HostBuffer(
                cuda_check(cudart, cudart.cudaMallocHost(nbytes), f"cudaMallocHost({spec.name})"),
                nbytes,
                cudart.cudaFreeHost,
            )
            self._host_buffers.append(host)
            b.host_ptr, b.host = host.ptr, host.array()
            b.host.fill(0)
            if not ctx.set_tensor_address(spec.name, b.device):
                raise BackendError(f"set_tensor_address({spec.name!r}) failed")
        self._inputs = [b for b in self._bindings if b.is_input]
        self._outputs = [b for b in self._bindings if not b.is_input]
        self._h2d = self._cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._d2h = self._cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost

    def _set_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if self._shapes.get(name) != shape:
            if not self._res.context.set_input_shape(name, shape):
                raise BackendError(f"set_input_shape({name!r}, {list(shape)}) refused by TensorRT")
            self._shapes[name] = shape

    def _capture_graph(self) -> None:
        """Capture one execute_async_v3 at the opt shape into a CUDA graph, on a context of
        its own whose shapes are set here once and never changed afterwards."""
        cudart, stream = self._cudart, self._res.stream
        ctx = self._res.graph_context = self._new_context()
        opt = self.profile.opt_shapes()
        for name, shape in opt.items():
            if not ctx.set_input_shape(name, shape):
                raise BackendError(f"set_input_shape({name!r}, {list(shape)}) refused by TensorRT (graph context)")
        for b in self._bindings:
            if not ctx.set_tensor_address(b.name, b.device):
                raise BackendError(f"set_tensor_address({b.name!r}) failed (graph context)")
        # After a shape change TensorRT may do one-off work in the next enqueue, which must
        # not end up in the graph: run once, uncaptured, before capturing.
        if not ctx.execute_async_v3(int(stream)):
            raise BackendError("execute_async_v3 failed before CUDA-graph capture")
        cuda_check(cudart, cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        # Thread-local capture mode: CUDA calls other threads make meanwhile (other
        # backends, logging) are not pulled into, or invalidated by, this capture.
        cuda_check(
            cudart,
            cudart.cudaStreamBeginCapture(stream, cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal),
            "cudaStreamBeginCapture",
        )
        ok = False
        try:
            ok = ctx.execute_async_v3(int(stream))
        finally:
            graph = cuda_check(cudart, cudart.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
        try:
            if not ok:
                raise BackendError("execute_async_v3 failed during CUDA-graph capture (engine not capturable?)")
            self._graph_exec = cuda_check(cudart, cudart.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
            self._res.graph_execs.append(self._graph_exec)
        finally:
            cuda_check(cudart, cudart.cudaGraphDestroy(graph), "cudaGraphDestroy")
        self._graph_shapes = dict(opt)

    # -- the hot path --------------------------------------------------------------------

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._res.released:
            raise BackendError("session is closed")
        check_profile(self.profile, inputs)
        cudart, res = self._cudart, self._res
        stream, ev = res.stream, res.events
        if self.device.index:
            cuda_check(cudart, cudart.cudaSetDevice(self.device.index), "cudaSetDevice")
        graph = self._graph_exec is not None and all(
            inputs[name].shape == shape for name, shape in self._graph_shapes.items()
        )
        for b in self._inputs:
            x = inputs[b.name]
            if not graph:
                self._set_shape(b.name, x.shape)
            np.copyto(b.host[: x.nbytes].view(b.dtype).reshape(x.shape), x)
        cuda_check(cudart, cudart.cudaEventRecord(ev[0], stream), "cudaEventRecord")
        for b in self._inputs:
            n = inputs[b.name].nbytes
            cuda_check(cudart, cudart.cudaMemcpyAsync(b.device, b.host_ptr, n, self._h2d, stream), "H2D copy")
        cuda_check(cudart, cudart.cudaEventRecord(ev[1], stream), "cudaEventRecord")
        if graph:
            ctx = res.graph_context
            cuda_check(cudart, cudart.cudaGraphLaunch(self._graph_exec, stream), "cudaGraphLaunch")
            self.graph_launches += 1
        else:
            ctx = res.context
            if not ctx.execute_async_v3(int(stream)):
                raise BackendError("execute_async_v3 failed (the TensorRT log says why)")
            self.plain_launches += 1
        cuda_check(cudart, cudart.cudaEventRecord(ev[2], stream), "cudaEventRecord")
        outputs: dict[str, np.ndarray] = {}
        for b in self._outputs:
            shape = tuple(ctx.get_tensor_shape(b.name))
            out = b.host.view(b.dtype)[: int(np.prod(shape, dtype=np.int64))].reshape(shape)
            n = out.nbytes
            cuda_check(cudart, cudart.cudaMemcpyAsync(b.host_ptr, b.device, n, self._d2h, stream), "D2H copy")
            outputs[b.name] = out
        cuda_check(cudart, cudart.cudaEventRecord(ev[3], stream), "cudaEventRecord")
        cuda_check(cudart, cudart.cudaEventSynchronize(ev[3]), "cudaEventSynchronize")
        self.last_timing = Timing(
            h2d_ms=cuda_check(cudart, cudart.cudaEventElapsedTime(ev[0], ev[1]), "cudaEventElapsedTime"),
            compute_ms=cuda_check(cudart, cudart.cudaEventElapsedTime(ev[1], ev[2]), "cudaEventElapsedTime"),
            d2h_ms=cuda_check(cudart, cudart.cudaEventElapsedTime(ev[2], ev[3]), "cudaEventElapsedTime"),
        )
        return outputs

    # -- reporting and teardown ----------------------------------------------------------

    def describe(self) -> SessionDescription:
        """What runs: TensorRT version, GPU and cc, precision, cache key, engine file,
        whether it was built now, the profile and the captured CUDA-graph shapes."""
        graph = self._graph_shapes
        return SessionDescription(
            backend="tensorrt",
            runtime="tensorrt",
            runtime_version=self.device.tensorrt_version,
            device=f"cuda:{self.device.index} {self.device.name} (cc {format_cc(self.device.compute_capability)})",
            precision=self.opts.precision,
            providers=("tensorrt",),
            cache_key=self.prepared.key,
            artifact=str(self.artifact),
            extra={
                "engine": str(self.prepared.path),
                "built": self.prepared.built,
                "build_seconds": self.prepared.build_seconds,
                "replaced": [str(m) for m in self.prepared.replaced],
                "profile": self.profile.to_dict(),
                "cuda_graph": None if graph is None else {k: list(v) for k, v in graph.items()},
                "onnx_sha256": self.ingredients.onnx_sha256,
                "weights_bytes": self.weights_bytes,
                "weights_bytes_source": self.weights_source,
            },
        )

    def memory(self) -> MemoryStats:
        """Host RSS; device bytes = engine weights + activation memory of each execution
        context + the I/O buffers."""
        res = self._res
        activation = weights = 0
        if res.engine is not None:
            weights = self.weights_bytes
            engine = res.engine
            per_context = int(getattr(engine, "device_memory_size_v2", 0) or getattr(engine, "device_memory_size", 0))
            activation = per_context * sum(c is not None for c in (res.context, res.graph_context))
        buffers = sum(b.nbytes for b in self._bindings)
        return MemoryStats(host_rss_bytes(), weights + activation + buffers, self.device.name)

    def close(self) -> None:
        """Release the GPU objects now (idempotent). Outputs already returned stay readable:
        their pinned memory is freed when the last of them is gone."""
        self._graph_exec = None
        self._release()
        # Drop the session's own references to the pinned buffers; outputs a caller still
        # holds keep theirs alive.
        self._bindings, self._inputs, self._outputs, self._host_buffers = [], [], [], []


def engine_weights_bytes(trt, engine, plan_bytes: int) -> tuple[int, str]:
    """Device bytes the engine's weights take, and where the figure comes from.

    TensorRT 10.8+ reports it (``get_engine_stat(EngineStat.TOTAL_WEIGHTS_SIZE)``); older
    versions do not, and the serialized plan size (weights plus kernels, copied to the
    device at deserialization) stands in for it.
    """
    stat = getattr(trt, "EngineStat", None)
    getter = getattr(engine, "get_engine_stat", None)
    if stat is not None and getter is not None and hasattr(stat, "TOTAL_WEIGHTS_SIZE"):
        try:
            return int(getter(stat.TOTAL_WEIGHTS_SIZE)), "engine_stat"
        except (TypeError, RuntimeError):
            pass
    return int(plan_bytes), "plan_size"
