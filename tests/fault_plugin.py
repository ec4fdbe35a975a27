"""Fault injection for the daemon tests, loaded as a plugin (``VLAD_PLUGIN_MODULES``).

* backend ``faulty``: wraps the real ONNX Runtime backend; before each inference it reads
  a mode from ``options.control_file`` (``ok`` | ``raise`` | ``hang`` | ``nan`` | ``oob``);
* sensor ``injected``: readings from the JSON file named by ``$VLAD_TEST_SENSOR_FILE``
  (stands in for hardware sensors that cannot exist here, behind the real Sensor interface).

Nothing here is imported by vlad itself.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vlad.backend import Availability, Backend, Session, SessionDescription
from vlad.errors import BackendError
from vlad.health.base import Sensor
from vlad.hookspecs import hookimpl


class FaultySession(Session):
    backend_name = "faulty"

    def __init__(self, inner: Session, control: Path) -> None:
        super().__init__(inner.contract, inner.artifact, {})
        self.inner = inner
        self.control = control

    def _mode(self) -> str:
        try:
            return self.control.read_text().strip() or "ok"
        except FileNotFoundError:
            return "ok"

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        mode = self._mode()
        if mode == "raise":
            raise BackendError("injected engine failure")
        if mode == "hang":
            while self._mode() == "hang":  # a wedged engine: never returns while hanging
                time.sleep(0.01)
        out = self.inner.infer(inputs)
        self.last_timing = self.inner.last_timing
        if mode == "nan":
            out = {k: np.full_like(v, np.nan) for k, v in out.items()}
        elif mode == "oob":
            out = {k: v * 1000.0 for k, v in out.items()}
        return out

    def describe(self) -> SessionDescription:
        d = self.inner.describe()
        return SessionDescription(
            backend="faulty",
            runtime=d.runtime,
            runtime_version=d.runtime_version,
            device=d.device,
            precision=d.precision,
            providers=d.providers,
        )

    def close(self) -> None:
        self.inner.close()


class FaultyBackend(Backend):
    name = "faulty"

    def availability(self) -> Availability:
        return Availability(usable=True, runtime="fault-injection", version="1")

    def load(self, artifact: Path, contract, options: Mapping[str, Any] | None = None) -> Session:
        from vlad.plugins import get_backend

        opts = dict(options or {})
        control = Path(opts.pop("control_file"))
        inner = get_backend(opts.pop("inner", "onnxruntime")).load(artifact, contract, opts)
        return FaultySession(inner, control)


class InjectedSensor(Sensor):
    name = "injected"

    def read(self) -> dict[str, float]:
        path = os.environ.get("VLAD_TEST_SENSOR_FILE")
        if not path:
            return {}
        try:
            return {k: float(v) for k, v in json.loads(Path(path).read_text() or "{}").items()}
        except (FileNotFoundError, ValueError):
            return {}


@hookimpl
def vlad_backends() -> list[Backend]:
    return [FaultyBackend()]


@hookimpl
def vlad_sensors() -> list[Sensor]:
    return [InjectedSensor()]
