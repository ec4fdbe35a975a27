"""The ``wrapped`` backend: a real backend slowed to a target robot's latency, or made to fail.

Loaded as a plugin module: ``VLAD_PLUGIN_MODULES=vlad_tools.gates.wrapped`` (:data:`PLUGIN_ENV`).
The performance and closed-loop gates serve a release inside it to emulate the inference
latency of the robot's computer (:func:`vlad_tools.gates.launcher.serve`, ``latency_ms``); the
fault tests steer the same backend through its control file.

Backend ``wrapped`` loads a real backend (``options.inner``, default ``onnxruntime``) and
runs it, with, per inference:

- ``control_file``: a fault mode read from that file first: ``ok`` (or no file, or an
  empty one), ``raise`` (a backend error), ``hang`` (a wedged engine: no return while the
  file says so), ``nan`` (every output NaN), ``oob`` (every output times 1000);
- ``delay_ms``: the inference takes at least this long (the real engine, then a sleep for
  the rest: a slower accelerator, not CPU load that would slow everything else);
  ``delay_file``: the delay read from that file instead (a number of ms; missing or
  empty: ``delay_ms``), so one daemon switches speed without a restart; ``jitter``: each
  inference's delay drawn uniformly within ± this fraction of it (``jitter_seed`` seeds
  the draws: a run is reproducible);

every other option goes to the inner backend. Its outputs are the inner engine's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from vlad.backend import Availability, Backend, Session, SessionDescription, Timing, parse_options
from vlad.contract import Contract
from vlad.errors import BackendError
from vlad.hookspecs import hookimpl
from vlad.schema import bounded, shown

NAME = "wrapped"
MODES = ("ok", "raise", "hang", "nan", "oob")
# The environment of a daemon that loads this plugin (vlad is installed: no PYTHONPATH).
PLUGIN_ENV = {"VLAD_PLUGIN_MODULES": __name__}


@dataclass(frozen=True)
class WrappedOptions:
    """The wrapper's own options (its fields); the rest of the options are the inner backend's."""

    inner: str = field(default="onnxruntime", metadata={"allow_empty": True})  # checked by split()
    control_file: str | None = None
    delay_ms: float = field(default=0.0, metadata=bounded(0.0, 3_600_000.0))
    delay_file: str | None = None
    jitter: float = field(default=0.0, metadata=bounded(0.0, 1.0))
    jitter_seed: int = field(default=0, metadata=bounded(0, 2**32 - 1))

    @classmethod
    def split(cls, name: str, options: Mapping[str, Any] | None) -> tuple[WrappedOptions, dict[str, Any]]:
        """(the wrapper's options, parsed by :func:`vlad.backend.parse_options`; the inner
        backend's) from one options table."""
        table = dict(options or {})
        own = {f.name for f in fields(cls)}

        def check(o: WrappedOptions, path: str, problems: list[str]) -> None:
            if not o.inner or o.inner == name:
                problems.append(f"{path}.inner: must name another backend, not {shown(o.inner)}")

        wrap = parse_options(name, cls, {k: v for k, v in table.items() if k in own}, check)
        return wrap, {k: v for k, v in table.items() if k not in own}


class WrappedSession(Session):
    """The inner session, with the fault and the delay of :class:`WrappedOptions`."""

    def __init__(self, name: str, inner: Session, options: WrappedOptions) -> None:
        super().__init__(inner.contract, inner.artifact, {})
        self.backend_name = name
        self.inner = inner
        self.wrap = options
        self._draws = np.random.default_rng(options.jitter_seed)

    def mode(self) -> str:
        """The fault mode the control file asks for now."""
        if self.wrap.control_file is None:
            return "ok"
        try:
            mode = Path(self.wrap.control_file).read_text().strip() or "ok"
        except FileNotFoundError:
            return "ok"
        if mode not in MODES:
            raise BackendError(
                f"{self.backend_name}: {self.wrap.control_file} says {mode!r}; one of {', '.join(MODES)}"
            )
        return mode

    def delay_s(self) -> float:
        """The minimum time of an inference now."""
        if self.wrap.delay_file is not None:
            try:
                text = Path(self.wrap.delay_file).read_text().strip()
            except FileNotFoundError:
                text = ""
            if text:
                try:
                    return float(text) / 1000
                except ValueError:
                    raise BackendError(
                        f"{self.backend_name}: {self.wrap.delay_file} does not hold a number of ms"
                    ) from None
        return self.wrap.delay_ms / 1000

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        mode = self.mode()
        if mode == "raise":
            raise BackendError("injected engine failure")
        if mode == "hang":
            while self.mode() == "hang":  # a wedged engine: never returns while hanging
                time.sleep(0.01)
        out = self.inner.infer(inputs)
        self.last_timing = self.inner.last_timing
        if mode == "nan":
            out = {k: np.full_like(v, np.nan) for k, v in out.items()}
        elif mode == "oob":
            out = {k: v * 1000.0 for k, v in out.items()}
        delay = self.delay_s()
        if delay > 0 and self.wrap.jitter:
            delay *= 1.0 + self._draws.uniform(-self.wrap.jitter, self.wrap.jitter)
        if delay > 0:
            rest = delay - (time.perf_counter() - t0)
            if rest > 0:
                time.sleep(rest)  # sleep, not spin: see the module doc
            self.last_timing = Timing(compute_ms=(time.perf_counter() - t0) * 1000)
        return out

    def describe(self) -> SessionDescription:
        """The wrapped session's own description under this backend's name."""
        return dataclasses.replace(self.inner.describe(), backend=self.backend_name)

    def close(self) -> None:
        self.inner.close()


class WrappedBackend(Backend):
    """Backend ``wrapped`` (see the module doc); ``name`` gives the same wrapper another name."""

    def __init__(self, name: str = NAME) -> None:
        self.name = name

    def availability(self) -> Availability:
        return Availability(usable=True, runtime="faults and delays around a real backend", version="1")

    def load(self, artifact: Path, contract: Contract, options: Mapping[str, Any] | None = None) -> Session:
        from vlad.plugins import get_backend

        wrap, rest = WrappedOptions.split(self.name, options)
        inner = get_backend(wrap.inner).load(artifact, contract, rest)
        return WrappedSession(self.name, inner, wrap)


@hookimpl
def vlad_backends() -> list[Backend]:
    return [WrappedBackend()]
