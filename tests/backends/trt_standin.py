"""A stand-in for TensorRT and cuda-python's runtime, for hardware that cannot exist here.

It implements only the calls :class:`vlad_tensorrt.engine.TensorRTSession` makes, with the
same signatures and return conventions (``(err, *values)`` tuples, ``int(stream)``),
so the session's own logic runs on a CPU: buffer allocation and zeroing, the two execution
contexts, CUDA-graph capture and replay, output ownership and the release order. "Device"
memory is host memory from ``malloc`` filled with garbage (as real ``cudaMalloc`` memory may
hold anything), copies are synchronous, and a graph replays the operations recorded at
capture, with the shapes they were captured with.

The "engine" computes a simple known function of its inputs (see :func:`reference`) and,
like an embedding lookup, fails on a token id outside the vocabulary. Nothing here says
anything about TensorRT's numerics; the hardware tests do that.
"""

from __future__ import annotations

import ctypes
import itertools
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]

VOCAB = 8  # like the demo policy's embedding
GARBAGE = 0xAB


def reference(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """What the stand-in engine computes: ``actions[b, t, d]`` from every input of row b."""
    batch = inputs["proprio"].shape[0]
    img = inputs["image_overhead"].reshape(batch, -1).mean(axis=1, dtype=np.float64)
    tok = inputs["tokens"].sum(axis=1).astype(np.float64) * 0.01
    prop = inputs["proprio"].sum(axis=1, dtype=np.float64)
    base = (img + tok + prop)[:, None, None]
    return (base + inputs["noise"].astype(np.float64)).astype(np.float32)


class FakeCudart:
    """cuda-python ``cudart`` calls used by the session; every call is logged."""

    cudaError_t = SimpleNamespace(cudaSuccess=0, cudaErrorInvalidValue=1)  # noqa: N815
    cudaMemcpyKind = SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2)  # noqa: N815
    cudaStreamCaptureMode = SimpleNamespace(cudaStreamCaptureModeThreadLocal=1)  # noqa: N815
    cudaStreamNonBlocking = 1  # noqa: N815

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.live_device: dict[int, int] = {}
        self.live_host: dict[int, int] = {}
        self._ids = itertools.count(1)
        self.streams: dict[int, list | None] = {}  # stream -> recorded ops while capturing
        self.graphs: dict[int, list] = {}
        self.events: dict[int, float] = {}

    # -- errors, devices --------------------------------------------------------------
    def cudaGetErrorName(self, err):  # noqa: N802
        return (0, b"cudaErrorFake")

    def cudaGetErrorString(self, err):  # noqa: N802
        return (0, b"stand-in error")

    def cudaSetDevice(self, index):  # noqa: N802
        return (0,)

    # -- memory -----------------------------------------------------------------------
    def _alloc(self, nbytes: int, table: dict[int, int]) -> int:
        ptr = _libc.malloc(nbytes)
        ctypes.memset(ptr, GARBAGE, nbytes)
        table[ptr] = nbytes
        return ptr

    def cudaMalloc(self, nbytes):  # noqa: N802
        ptr = self._alloc(nbytes, self.live_device)
        self.log.append(("cudaMalloc", ptr))
        return (0, ptr)

    def cudaMallocHost(self, nbytes):  # noqa: N802
        ptr = self._alloc(nbytes, self.live_host)
        self.log.append(("cudaMallocHost", ptr))
        return (0, ptr)

    def cudaFree(self, ptr):  # noqa: N802
        self.log.append(("cudaFree", ptr))
        del self.live_device[ptr]
        _libc.free(ptr)
        return (0,)

    def cudaFreeHost(self, ptr):  # noqa: N802
        self.log.append(("cudaFreeHost", ptr))
        del self.live_host[ptr]
        _libc.free(ptr)
        return (0,)

    def cudaMemset(self, ptr, value, nbytes):  # noqa: N802
        ctypes.memset(ptr, value, nbytes)
        return (0,)

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):  # noqa: N802
        self._enqueue(stream, lambda: ctypes.memmove(dst, src, nbytes))
        return (0,)

    # -- streams, events, graphs ------------------------------------------------------
    def cudaStreamCreateWithFlags(self, flags):  # noqa: N802
        s = next(self._ids)
        self.streams[s] = None
        return (0, s)

    def cudaStreamSynchronize(self, stream):  # noqa: N802
        return (0,)

    def cudaStreamDestroy(self, stream):  # noqa: N802
        self.log.append(("cudaStreamDestroy", stream))
        del self.streams[stream]
        return (0,)

    def _enqueue(self, stream, op: Callable[[], object]) -> None:
        recording = self.streams[int(stream)]
        if recording is None:
            op()
        else:
            recording.append(op)

    def cudaEventCreate(self):  # noqa: N802
        e = next(self._ids)
        self.events[e] = 0.0
        return (0, e)

    def cudaEventRecord(self, event, stream):  # noqa: N802
        self.events[event] = time.perf_counter()
        return (0,)

    def cudaEventSynchronize(self, event):  # noqa: N802
        return (0,)

    def cudaEventElapsedTime(self, a, b):  # noqa: N802
        return (0, (self.events[b] - self.events[a]) * 1e3)

    def cudaEventDestroy(self, event):  # noqa: N802
        self.log.append(("cudaEventDestroy", event))
        return (0,)

    def cudaStreamBeginCapture(self, stream, mode):  # noqa: N802
        self.streams[int(stream)] = []
        return (0,)

    def cudaStreamEndCapture(self, stream):  # noqa: N802
        ops, self.streams[int(stream)] = self.streams[int(stream)], None
        g = next(self._ids)
        self.graphs[g] = ops
        return (0, g)

    def cudaGraphInstantiate(self, graph, flags):  # noqa: N802
        e = next(self._ids)
        self.graphs[e] = list(self.graphs[graph])
        return (0, e)

    def cudaGraphDestroy(self, graph):  # noqa: N802
        del self.graphs[graph]
        return (0,)

    def cudaGraphLaunch(self, graph_exec, stream):  # noqa: N802
        for op in self.graphs[graph_exec]:
            op()
        return (0,)

    def cudaGraphExecDestroy(self, graph_exec):  # noqa: N802
        self.log.append(("cudaGraphExecDestroy", graph_exec))
        del self.graphs[graph_exec]
        return (0,)


def fake_tensorrt(contract, profile, cudart: FakeCudart) -> SimpleNamespace:
    """A ``tensorrt`` module stand-in whose engine runs :func:`reference` on the contract."""
    specs = {s.name: s for s in (*contract.inputs, *contract.outputs)}
    input_names = [s.name for s in contract.inputs]
    output_names = [s.name for s in contract.outputs]
    log = cudart.log

    class Context:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple[int, ...]] = {}
            self.addresses: dict[str, int] = {}

        def __del__(self) -> None:
            log.append(("context deleted",))

        def set_input_shape(self, name, shape):
            t = profile[name]
            if not t.accepts(tuple(shape)):
                return False
            self.shapes[name] = tuple(shape)
            return True

        def get_tensor_shape(self, name):
            if name in self.shapes:
                return self.shapes[name]
            batch = self.shapes[input_names[0]][0]
            return (batch, *specs[name].shape[1:])

        def set_tensor_address(self, name, ptr):
            self.addresses[name] = ptr
            return True

        def execute_async_v3(self, stream):
            # Like a kernel launch, the shapes are read now: a graph replays what it
            # captured, whatever the context says later.
            shapes = dict(self.shapes)
            cudart._enqueue(stream, lambda: self._compute(shapes))
            return True

        def _compute(self, shapes) -> None:
            inputs = {}
            for name in input_names:
                dtype = np.dtype(specs[name].dtype)
                n = int(np.prod(shapes[name])) * dtype.itemsize
                raw = ctypes.string_at(self.addresses[name], n)
                inputs[name] = np.frombuffer(raw, dtype=dtype).reshape(shapes[name])
            if inputs["tokens"].min() < 0 or inputs["tokens"].max() >= VOCAB:
                raise RuntimeError("embedding index out of range (uninitialised token ids?)")
            out = reference(inputs)
            for name in output_names:
                ctypes.memmove(self.addresses[name], out.ctypes.data, out.nbytes)

    class Engine:
        num_io_tensors = len(input_names) + len(output_names)
        device_memory_size_v2 = 4096

        def __del__(self) -> None:
            log.append(("engine deleted",))

        def get_tensor_name(self, i):
            return (input_names + output_names)[i]

        def get_tensor_mode(self, name):
            return trt.TensorIOMode.INPUT if name in input_names else trt.TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name):
            return np.dtype(specs[name].dtype)

        def get_tensor_profile_shape(self, name, index):
            t = profile[name]
            return (t.min, t.opt, t.max)

        def create_execution_context(self):
            return Context()

    class Runtime:
        def __init__(self, logger) -> None:
            self.logger = logger

        def __del__(self) -> None:
            log.append(("runtime deleted",))

        def deserialize_cuda_engine(self, plan):
            return Engine() if plan.startswith(b"fake-plan") else None

    class Logger:
        WARNING = 2

        def __init__(self, level) -> None:
            pass

    trt = SimpleNamespace(
        __version__="10.99.0-standin",
        Logger=Logger,
        Runtime=Runtime,
        TensorIOMode=SimpleNamespace(INPUT=1, OUTPUT=2),
        nptype=lambda dt: dt,
        BuilderFlag=SimpleNamespace(TF32=1, FP16=2, BF16=3),
    )
    return trt
