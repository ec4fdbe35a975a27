"""An artificially slowed backend, loaded as a plugin (``VLAD_PLUGIN_MODULES=tests.slow_plugin``).

Backend ``slow`` wraps a real backend (``options.inner``, default ``onnxruntime``) and
makes every inference take at least ``options.delay_ms`` milliseconds: it runs the real
engine, then sleeps for the rest. With ``options.delay_file`` the delay is read from that
file before each inference (a number in ms; missing or empty: ``delay_ms``), so one daemon
can switch between the real speed (0) and a slow one without restarting.

Used by ``scripts/bench_async.py`` (inference longer than a chunk's execution) and its
test. Nothing here is imported by vlad itself.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vlad.backend import Availability, Backend, Session, SessionDescription, Timing
from vlad.errors import BackendError
from vlad.hookspecs import hookimpl


class SlowSession(Session):
    backend_name = "slow"

    def __init__(self, inner: Session, delay_ms: float, delay_file: Path | None) -> None:
        super().__init__(inner.contract, inner.artifact, {})
        self.inner = inner
        self.delay_ms = delay_ms
        self.delay_file = delay_file

    def _delay_s(self) -> float:
        if self.delay_file is not None:
            try:
                text = self.delay_file.read_text().strip()
                return float(text) / 1000 if text else self.delay_ms / 1000
            except FileNotFoundError:
                pass
            except ValueError as exc:
                raise BackendError(f"slow backend: {self.delay_file} does not hold a number of ms") from exc
        return self.delay_ms / 1000

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        out = self.inner.infer(inputs)
        # Sleep, not spin: the wait stands for a slower accelerator, not for CPU load
        # that would slow the simulator and the daemon's other threads too.
        rest = self._delay_s() - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)
        self.last_timing = Timing(compute_ms=(time.perf_counter() - t0) * 1000)
        return out

    def describe(self) -> SessionDescription:
        d = self.inner.describe()
        return SessionDescription(
            backend="slow",
            runtime=d.runtime,
            runtime_version=d.runtime_version,
            device=d.device,
            precision=d.precision,
            providers=d.providers,
        )

    def close(self) -> None:
        self.inner.close()


class SlowBackend(Backend):
    name = "slow"

    def availability(self) -> Availability:
        return Availability(usable=True, runtime="artificial delay", version="1")

    def load(self, artifact: Path, contract, options: Mapping[str, Any] | None = None) -> Session:
        from vlad.plugins import get_backend

        opts = dict(options or {})
        delay_ms = float(opts.pop("delay_ms", 0.0))
        delay_file = opts.pop("delay_file", None)
        inner = get_backend(opts.pop("inner", "onnxruntime")).load(artifact, contract, opts)
        return SlowSession(inner, delay_ms, Path(delay_file) if delay_file else None)


@hookimpl
def vlad_backends() -> list[Backend]:
    return [SlowBackend()]
