"""The ``example-onnx`` backend: the smallest complete vlad backend (ONNX Runtime, CPU).

A plugin offers backends through the ``vlad_backends`` hook. A :class:`~vlad.backend.Backend`
says whether its runtime is usable here and loads a release artifact into a
:class:`~vlad.backend.Session`, which runs one inference at a time. vlad checks every input
against the release contract (names, dtypes, shapes) before ``_run`` sees it, so ``_run``
only runs the model and records how long it took.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlad.backend import Availability, Backend, Session, SessionDescription, Timing, parse_options
from vlad.contract import Contract
from vlad.errors import BackendUnavailable
from vlad.hookspecs import hookimpl
from vlad.schema import bounded

NAME = "example-onnx"


@dataclass(frozen=True)
class ExampleOptions:
    """Every option this backend takes (vlad.schema refuses any other key, a wrong type or a
    value out of bounds, in one line naming the key)."""

    threads: int = field(default=1, metadata=bounded(1, 256))  # ONNX Runtime intra-op threads


class ExampleSession(Session):
    backend_name = NAME

    def __init__(self, contract: Contract, artifact: Path, options: Mapping[str, Any], opts: ExampleOptions) -> None:
        import onnxruntime as ort  # imported when a release loads, not when vlad loads plugins

        super().__init__(contract, artifact, options)
        so = ort.SessionOptions()
        so.intra_op_num_threads = opts.threads
        self._sess: Any = ort.InferenceSession(str(artifact), so, providers=["CPUExecutionProvider"])
        self._version = ort.__version__
        self._outputs = [spec.name for spec in contract.outputs]

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        values = self._sess.run(self._outputs, dict(inputs))
        self.last_timing = Timing(compute_ms=(time.perf_counter() - t0) * 1000)
        return dict(zip(self._outputs, values, strict=True))

    def describe(self) -> SessionDescription:
        """What runs, as it really is (``vladctl status`` shows it)."""
        return SessionDescription(
            backend=NAME,
            runtime="onnxruntime",
            runtime_version=self._version,
            device="cpu",
            precision="fp32",
            providers=("CPUExecutionProvider",),
            artifact=str(self.artifact),
        )

    def close(self) -> None:
        self._sess = None


class ExampleBackend(Backend):
    name = NAME

    def availability(self) -> Availability:
        if importlib.util.find_spec("onnxruntime") is None:
            return Availability(False, "onnxruntime", reason="onnxruntime is not installed (pip install onnxruntime)")
        import onnxruntime as ort

        return Availability(True, "onnxruntime", version=ort.__version__, devices=("cpu",))

    def artifact_suffixes(self) -> tuple[str, ...]:
        return (".onnx",)

    def load(self, artifact: Path, contract: Contract, options: Mapping[str, Any] | None = None) -> Session:
        opts = parse_options(NAME, ExampleOptions, options)  # BackendError: one line, every problem
        available = self.availability()
        if not available.usable:
            raise BackendUnavailable(f"{NAME}: {available.reason}")
        return ExampleSession(contract, Path(artifact), dict(options or {}), opts)


@hookimpl
def vlad_backends() -> list[Backend]:
    """The one backend this plugin offers."""
    return [ExampleBackend()]
