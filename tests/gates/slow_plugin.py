"""A backend slowed by a fixed delay, for the performance gate's test (``VLAD_PLUGIN_MODULES``).

Backend ``gate-slow`` wraps a real backend (``options.inner``, default ``onnxruntime``):
it runs the real engine, so its outputs are the real ones, then sleeps until
``options.delay_ms`` have passed since the call began. The gate must fail it on latency
alone, by a wide margin (100 ms against the demo's 20 ms deadline), never on its outputs.
Nothing here is imported by vlad itself.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vlad.backend import Availability, Backend, Session, SessionDescription, Timing
from vlad.hookspecs import hookimpl


class SlowSession(Session):
    backend_name = "gate-slow"

    def __init__(self, inner: Session, delay_ms: float) -> None:
        super().__init__(inner.contract, inner.artifact, {})
        self.inner = inner
        self.delay_s = delay_ms / 1000

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        out = self.inner.infer(inputs)
        # Sleep, not spin: a slower accelerator, not CPU load that would slow everything else.
        time.sleep(max(0.0, self.delay_s - (time.perf_counter() - t0)))
        self.last_timing = Timing(compute_ms=(time.perf_counter() - t0) * 1000)
        return out

    def describe(self) -> SessionDescription:
        d = self.inner.describe()
        return SessionDescription(
            backend=self.backend_name,
            runtime=d.runtime,
            runtime_version=d.runtime_version,
            device=d.device,
            precision=d.precision,
            providers=d.providers,
        )

    def close(self) -> None:
        self.inner.close()


class SlowBackend(Backend):
    name = "gate-slow"

    def availability(self) -> Availability:
        return Availability(usable=True, runtime="artificial delay", version="1")

    def load(self, artifact: Path, contract, options: Mapping[str, Any] | None = None) -> Session:
        from vlad.plugins import get_backend

        opts = dict(options or {})
        delay_ms = float(opts.pop("delay_ms", 100.0))
        inner = get_backend(opts.pop("inner", "onnxruntime")).load(artifact, contract, opts)
        return SlowSession(inner, delay_ms)


@hookimpl
def vlad_backends() -> list[Backend]:
    return [SlowBackend()]
