"""The ``onnxruntime`` backend: an ONNX model on an explicit, checked list of execution providers.

ONNX Runtime's default is to fall back silently: a provider that fails to register is
dropped from the session, and nodes a GPU provider cannot run land on the CPU provider.
Either changes latency (and possibly numerics) without a word, so this backend refuses to
start instead:

1. every requested provider must be offered by the installed build
   (``get_available_providers``), else the load fails before a session is made;
2. after the session is made, every requested provider must be registered in it
   (``get_providers``); ORT drops a provider whose library or device fails to load. The
   CUDA / cuDNN / TensorRT libraries of the pip wheels are loaded first
   (``onnxruntime.preload_dlls``), so registration does not depend on torch having been
   imported before;
3. node placement is read back from one profiled inference at load
   (``check_node_placement``, default on; see :mod:`vlad_onnxruntime.placement`): nodes
   per provider go into ``describe()``; the load fails if the first requested provider
   runs no node at all (e.g. TensorRT that rejected every subgraph), or if compute nodes
   ran on the CPU although CPU was not requested. Small integer shape computations, which
   ORT places on the CPU on purpose, are allowed there (``session.disable_cpu_ep_fallback``
   is not used: it refuses those too, and with them models such as the demo policy).

Options (all optional; parsed once into :class:`vlad_onnxruntime.options.OrtOptions`, every
problem at once):

``providers``
    ordered list; items are a provider name or ``[name, {provider options}]``.
    Default ``["CPUExecutionProvider"]``.
``provider_options``
    ``{provider name: {option: value}}``, merged over options given inline.
``precision``
    ``"fp32"`` (default), ``"tf32"``, ``"fp16"`` or ``"bf16"``: the label the session
    reports is what it computes in (see :mod:`vlad_onnxruntime.gpu`; e.g. ``use_tf32=0``
    on the CUDA provider for fp32). A precision that cannot be honoured is refused.
``cache_dir``
    TensorRT provider only: engines and timing caches go to
    ``<cache_dir>/onnxruntime-trt/<key>/``, the key covering the model, ONNX Runtime,
    TensorRT, GPU, precision and the contract's profile. Default ``/var/lib/vlad/engines``.
``intra_op_threads`` / ``inter_op_threads``
    ORT thread pools (0 = ORT's default).
``graph_optimization_level``
    ``"disable" | "basic" | "extended" | "all"`` (default ``"all"``).
``optimized_model_path``
    write the optimized graph there (a cache of the optimization, for inspection or for
    loading with ``graph_optimization_level="disable"`` next time).
``check_node_placement``
    bool, default true (see 3.).
``memory_map``
    bool, default false. A model with external data (``policy.onnx.data``) is read by ONNX
    Runtime through a memory map; by default its CPU provider then copies the weights of
    every MatMul into its own packed layout (anonymous memory) and drops the map. With
    ``memory_map = true`` that packing is off (``session.disable_prepacking``): the
    weights stay file-backed pages of the map, the session is created in a fraction of
    the time, and other processes mapping the same file share them. The pages are the
    kernel's to evict under memory pressure (a re-read is a latency spike): lock them with
    ``realtime.mlockall`` on a robot. Figures: docs/benchmarks.md, "π0-sized release".

With the TensorRT provider the contract's min/opt/max input shapes become its
optimization profile (``trt_profile_*_shapes``), so it builds one engine for the whole
range instead of one per new shape.

Execution: with a CUDA or TensorRT provider, inputs and outputs are bound to preallocated
device ``OrtValue``\\s (one set per batch size) through IOBinding, so the timing splits
into host-to-device, compute and device-to-host. On CPU, inputs are bound zero-copy and
outputs are written into preallocated numpy arrays that are reused per batch size.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vlad.backend import Availability, Backend, Session, SessionDescription, Timing, example_inputs
from vlad.contract import Contract
from vlad.errors import BackendError, BackendUnavailable
from vlad.files import sha256_file
from vlad_onnxruntime import gpu as gpu_paths
from vlad_onnxruntime.options import CPU, OPT_LEVELS, OrtOptions
from vlad_onnxruntime.placement import Placement, judge_placement

GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _fail(msg: str) -> BackendError:
    return BackendError(f"onnxruntime: {msg}")


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime with a checked provider list (no silent fallback)."""

    name = "onnxruntime"

    def availability(self) -> Availability:
        """onnxruntime importable; its available providers; devices cpu (+ cuda with a GPU provider)."""
        if importlib.util.find_spec("onnxruntime") is None:
            return Availability(
                False, "onnxruntime", reason="onnxruntime is not installed (pip install 'vlad[cpu]' or 'vlad[gpu]')"
            )
        both = gpu_paths.installed_runtime_distributions()
        if len(both) > 1:
            return Availability(
                False,
                "onnxruntime",
                reason=(
                    f"{' and '.join(both)} are both installed and overwrite each other's files; "
                    f"pip uninstall -y {' '.join(both)}, then install one ('vlad[cpu]' or 'vlad[gpu]')"
                ),
            )
        try:
            import onnxruntime as ort
        except Exception as exc:
            return Availability(False, "onnxruntime", reason=f"onnxruntime does not import: {exc}")
        providers = tuple(ort.get_available_providers())
        devices = ["cpu"]
        if any(p in providers for p in GPU_PROVIDERS):
            devices.append("cuda")
        return Availability(True, "onnxruntime", version=ort.__version__, devices=tuple(devices), providers=providers)

    def artifact_suffixes(self) -> tuple[str, ...]:
        """An ONNX model file."""
        return (".onnx",)

    def load(self, artifact: Path, contract: Contract, options: Mapping[str, Any] | None = None) -> OnnxRuntimeSession:
        """Create an ORT session on exactly the requested providers, or refuse with the reason."""
        opts = OrtOptions.parse(options)
        availability = self.availability()
        if not availability.usable:
            raise BackendUnavailable(f"onnxruntime: {availability.reason}")
        return OnnxRuntimeSession(contract, Path(artifact), dict(options or {}), opts)


class OnnxRuntimeSession(Session):
    """One ORT ``InferenceSession`` with IOBinding (device buffers on GPU, reused outputs on CPU)."""

    backend_name = "onnxruntime"

    def __init__(self, contract: Contract, artifact: Path, options: Mapping[str, Any], opts: OrtOptions) -> None:
        import onnxruntime as ort

        super().__init__(contract, artifact, options)
        self.opts = opts
        self._ort = ort
        self._sess = None
        self._digest: str | None = None  # the artifact's sha256, hashed once (describe())
        if not self.artifact.is_file():
            raise _fail(f"artifact {self.artifact} does not exist")
        names, provider_opts = opts.provider_list()
        self.requested = names
        all_known = set(ort.get_all_providers())
        available = ort.get_available_providers()
        for name in names:
            if name not in all_known:
                raise _fail(
                    f"unknown execution provider {name!r} (known to onnxruntime {ort.__version__}: {', '.join(sorted(all_known))})"
                )
            if name not in available:
                raise _fail(
                    f"requested {name} but this onnxruntime {ort.__version__} build only offers {available}; refusing to fall back"
                )
        primary = names[0]
        self._gpu = primary in GPU_PROVIDERS
        self._device_id = int(provider_opts[0].get("device_id", 0)) if self._gpu else 0
        self.precision, self.trt_cache_key, self.trt_cache_dir = self._plan_providers(names, provider_opts)
        library_notes = gpu_paths.prepare_gpu_libraries(ort, names) if any(n in GPU_PROVIDERS for n in names) else ""
        so = self._session_options()
        profile_dir = tempfile.mkdtemp(prefix="vlad-ort-profile-") if opts.check_node_placement else None
        if profile_dir:
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(profile_dir, "load")
        self.placement = Placement({}, (), ())
        try:
            try:
                self._sess = ort.InferenceSession(
                    str(self.artifact), so, providers=names, provider_options=provider_opts
                )
            except Exception as exc:
                hint = f" ({library_notes})" if library_notes else ""
                raise _fail(
                    f"cannot create a session for {self.artifact} on {names}: {_first_line(exc)}{hint}"
                ) from exc
            in_use = self._sess.get_providers()
            missing = [p for p in names if p not in in_use]
            if missing:
                hint = f"; library loading said: {library_notes}" if library_notes else ""
                raise _fail(
                    f"requested providers {names} but the session runs on {in_use}: {missing} failed to register "
                    f"(ORT would fall back silently); refusing to start{hint}"
                )
            self._check_io()
            if profile_dir:
                self.placement = self._profile_placement(names)
        finally:
            if profile_dir:
                for f in Path(profile_dir).glob("*"):
                    f.unlink(missing_ok=True)
                os.rmdir(profile_dir)
        self.nodes_per_provider = dict(self.placement.nodes_per_provider)
        self.providers_in_use = tuple(
            p for p in in_use if not self.nodes_per_provider or self.nodes_per_provider.get(p)
        )
        self._output_names = [spec.name for spec in contract.outputs]
        self._input_names = [spec.name for spec in contract.inputs]
        # One binding (and its buffers) per input-shape signature, i.e. per batch size:
        # after the first call of a size, the hot path allocates nothing.
        self._bindings: dict[tuple, tuple[Any, dict[str, Any], dict[str, Any]]] = {}

    # -- load-time checks --------------------------------------------------------------------

    def _plan_providers(
        self, names: list[str], provider_opts: list[dict[str, str]]
    ) -> tuple[str, str | None, str | None]:
        """Fill in the provider options that make the precision label true, and for the
        TensorRT provider its profile and keyed engine cache. Returns (label, cache key,
        cache folder)."""
        precision = self.opts.precision
        needs_gpu_identity = names[0] == gpu_paths.TENSORRT or (self._gpu and precision != "fp32")
        gpu = gpu_paths.gpu_identity(self._device_id) if needs_gpu_identity else None
        label, extra = gpu_paths.precision_plan(names, precision, gpu)
        key = folder = None
        if gpu_paths.TENSORRT in names:
            profile = gpu_paths.trt_profile_options(self.contract)
            if gpu is None:
                raise _fail(
                    "cannot identify the GPU for the TensorRT engine cache key; install nvidia-ml-py (pip install 'vlad[gpu]')"
                )
            key = gpu_paths.trt_cache_key(
                hashlib.sha256(self.artifact.read_bytes()).hexdigest(),
                self._ort.__version__,
                gpu_paths.tensorrt_version(),
                gpu,
                label,
                profile,
            )
            cache = gpu_paths.trt_cache_options(Path(self.opts.cache_dir), key)
            folder = cache["trt_engine_cache_path"]
            Path(folder).mkdir(parents=True, exist_ok=True)
            extra.setdefault(gpu_paths.TENSORRT, {}).update({**profile, **cache})
        for name, opts in zip(names, provider_opts, strict=True):
            opts.update(extra.get(name, {}))
        return label, key, folder

    def _session_options(self):
        ort = self._ort
        so = ort.SessionOptions()
        so.log_severity_level = 3  # errors only; our own messages say what matters
        opts = self.opts
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[opts.graph_optimization_level])
        if opts.intra_op_threads is not None:
            so.intra_op_num_threads = opts.intra_op_threads
        if opts.inter_op_threads is not None:
            so.inter_op_num_threads = opts.inter_op_threads
        if opts.memory_map:
            so.add_session_config_entry("session.disable_prepacking", "1")
        if opts.optimized_model_path:
            path = Path(opts.optimized_model_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            so.optimized_model_filepath = str(path)
        return so

    def _check_io(self) -> None:
        assert self._sess is not None  # called from __init__ once the session exists
        got_in = sorted(i.name for i in self._sess.get_inputs())
        got_out = sorted(o.name for o in self._sess.get_outputs())
        want_in = sorted(s.name for s in self.contract.inputs)
        want_out = sorted(s.name for s in self.contract.outputs)
        if got_in != want_in or got_out != want_out:
            raise _fail(
                f"{self.artifact} has inputs {got_in} / outputs {got_out}, the contract declares {want_in} / {want_out}"
            )

    def _profile_placement(self, names: list[str]) -> Placement:
        """Run once under ORT's profiler and judge where each node ran."""
        inputs = example_inputs(self.contract)
        assert self._sess is not None  # called from __init__ once the session exists
        self._sess.run(None, inputs)
        profile = self._sess.end_profiling()  # also turns profiling off for later runs
        with open(profile) as f:
            events = json.load(f)
        placement, refusal = judge_placement(events, names)
        if refusal:
            raise _fail(refusal + "; refusing to start")
        return placement

    # -- hot path ------------------------------------------------------------------------------

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._sess is None:
            raise _fail("session is closed")
        key = tuple(inputs[n].shape for n in self._input_names)
        entry = self._bindings.get(key)
        if entry is None:
            entry = self._bindings[key] = self._bind(inputs)
        binding, dev_in, outputs = entry
        if self._gpu:
            t0 = time.perf_counter()
            for name in self._input_names:
                dev_in[name].update_inplace(np.ascontiguousarray(inputs[name]))
            # The copies may still be in flight on another stream than the provider's:
            # the run must not start before they land.
            binding.synchronize_inputs()
            t1 = time.perf_counter()
            self._sess.run_with_iobinding(binding)
            binding.synchronize_outputs()
            t2 = time.perf_counter()
            result = {name: ov.numpy() for name, ov in outputs.items()}
            t3 = time.perf_counter()
            self.last_timing = Timing(h2d_ms=(t1 - t0) * 1e3, compute_ms=(t2 - t1) * 1e3, d2h_ms=(t3 - t2) * 1e3)
            return result
        binding.clear_binding_inputs()
        for name in self._input_names:
            # bind_cpu_input wraps the array's memory; ORT needs it C-contiguous.
            binding.bind_cpu_input(name, np.ascontiguousarray(inputs[name]))
        t0 = time.perf_counter()
        self._sess.run_with_iobinding(binding)
        self.last_timing = Timing(compute_ms=(time.perf_counter() - t0) * 1e3)
        if outputs:
            return outputs
        return dict(zip(self._output_names, binding.copy_outputs_to_cpu(), strict=True))

    def _output_shapes(self, inputs: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]] | None:
        """Output shapes from the contract, dynamic axes sized like the inputs' axes of that name."""
        sizes = {}
        for spec in self.contract.inputs:
            for ax in spec.dynamic:
                sizes[ax.name] = inputs[spec.name].shape[ax.axis]
        shapes = {}
        for spec in self.contract.outputs:
            shape = list(spec.shape)
            for ax in spec.dynamic:
                if ax.name not in sizes:
                    return None  # an axis only the model knows: let ORT allocate
                shape[ax.axis] = sizes[ax.name]
            shapes[spec.name] = tuple(shape)
        return shapes

    def _bind(self, inputs: Mapping[str, np.ndarray]):
        ort = self._ort
        assert self._sess is not None  # _run checked that the session is open
        binding = self._sess.io_binding()
        shapes = self._output_shapes(inputs)
        dtypes = {spec.name: np.dtype(spec.dtype) for spec in self.contract.outputs}
        if self._gpu:
            dev_in = {
                name: ort.OrtValue.ortvalue_from_shape_and_type(
                    inputs[name].shape, inputs[name].dtype, "cuda", self._device_id
                )
                for name in self._input_names
            }
            for name, ov in dev_in.items():
                binding.bind_ortvalue_input(name, ov)
            if shapes is None:
                raise _fail(
                    "on a GPU provider every output axis must be sized by the contract (IOBinding needs fixed outputs)"
                )
            outputs = {
                name: ort.OrtValue.ortvalue_from_shape_and_type(shapes[name], dtypes[name], "cuda", self._device_id)
                for name in self._output_names
            }
            for name, ov in outputs.items():
                binding.bind_ortvalue_output(name, ov)
            return binding, dev_in, outputs
        outputs = {}
        for name in self._output_names:
            if shapes is None:
                binding.bind_output(name, "cpu")
                continue
            buf = np.empty(shapes[name], dtype=dtypes[name])
            outputs[name] = buf
            binding.bind_output(name, "cpu", 0, buf.dtype, buf.shape, buf.ctypes.data)
        return binding, {}, outputs if shapes is not None else {}

    # -- introspection -------------------------------------------------------------------------

    def describe(self) -> SessionDescription:
        """Providers that actually run nodes, the device, the true precision label and the
        node placement."""
        ort = self._ort
        if self._digest is None:  # once: the status calls this every build, a model can be GBs
            self._digest = sha256_file(self.artifact)[:16] if self.artifact.is_file() else "?"
        digest = self._digest
        level = self.opts.graph_optimization_level
        effective = {}
        if self._sess is not None and hasattr(self._sess, "get_provider_options"):
            effective = {p: dict(o) for p, o in self._sess.get_provider_options().items() if p != CPU}
        return SessionDescription(
            backend="onnxruntime",
            runtime="onnxruntime",
            runtime_version=ort.__version__,
            device=f"cuda:{self._device_id}" if self._gpu else "cpu",
            precision=self.precision,
            providers=self.providers_in_use,
            # What an optimized-model or TensorRT engine cache must match.
            cache_key=self.trt_cache_key or f"{digest}-ort{ort.__version__}-{'+'.join(self.requested)}-opt{level}",
            artifact=str(self.artifact),
            extra={
                "requested_providers": tuple(self.requested),
                "registered_providers": tuple(self._sess.get_providers()) if self._sess else (),
                "nodes_per_provider": dict(self.nodes_per_provider),
                "cpu_shape_nodes": [str(n) for n in self.placement.cpu_shape_nodes],
                "provider_options": effective,
                "trt_engine_cache": self.trt_cache_dir,
                "intra_op_threads": self.opts.intra_op_threads or 0,
                "inter_op_threads": self.opts.inter_op_threads or 0,
                "graph_optimization_level": level,
                "memory_map": self.opts.memory_map,
            },
        )

    def close(self) -> None:
        """Release the ORT session and the bound buffers (idempotent)."""
        self._bindings.clear()
        self._sess = None
