"""The one backend interface every inference engine plugin implements.

A :class:`Backend` is what a plugin returns from the ``vlad_backends`` hook: it names an
engine, says whether the engine's runtime is usable here (and why not), and loads a
release artifact into a :class:`Session`. A session runs the model:

    session = backend.load(artifact, contract, options)
    session.warmup(10)
    outputs = session.infer({"image_overhead": ..., "tokens": ..., ...})
    session.last_timing, session.memory(), session.describe()

:meth:`Session.infer` refuses inputs with a wrong name, dtype or shape (outside the
contract's dynamic ranges) before they reach the engine; nothing is ever reshaped or cast.
Engines implement only :meth:`Session._run`.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import numpy as np

from vlad import schema
from vlad.contract import Contract, TensorSpec
from vlad.errors import BackendError, InputRejected

OptionsT = TypeVar("OptionsT")

#: Every precision label there is: what a release's manifest may ask for (backend option
#: ``precision``), what a session reports in :class:`SessionDescription`, what the gates
#: hold budgets for. Each backend honours a subset and refuses the rest when it loads
#: (tests/backends/test_precisions.py checks every backend's subset against this set).
Precision = Literal["fp32", "tf32", "fp16", "bf16", "int8", "fp8", "mixed"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


@dataclass(frozen=True)
class Availability:
    """Whether a backend's runtime can run on this machine; ``reason`` says why not."""

    usable: bool
    runtime: str
    version: str | None = None
    reason: str = ""
    devices: tuple[str, ...] = ()
    #: Sub-engines the runtime offers here (e.g. ONNX Runtime execution providers).
    providers: tuple[str, ...] = ()


@dataclass(frozen=True)
class SessionDescription:
    """What a loaded session actually runs on (not what was requested)."""

    backend: str
    runtime: str
    runtime_version: str
    device: str
    precision: str
    providers: tuple[str, ...] = ()
    cache_key: str | None = None
    artifact: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Timing:
    """Per-call time split in milliseconds; ``None`` where the runtime does not expose it.

    A remote backend reports the whole round trip as ``compute_ms`` and splits it into
    ``network_ms`` (round trip minus the server's own time) and ``server_ms`` (the
    server's compute, from its response statistics) when the server says.
    """

    h2d_ms: float | None = None
    compute_ms: float = 0.0
    d2h_ms: float | None = None
    network_ms: float | None = None
    server_ms: float | None = None

    @property
    def total_ms(self) -> float:
        return (self.h2d_ms or 0.0) + self.compute_ms + (self.d2h_ms or 0.0)


@dataclass(frozen=True)
class MemoryStats:
    host_rss_bytes: int
    device_peak_bytes: int | None = None
    device_name: str | None = None


def host_rss_bytes() -> int:
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss


# ---------------------------------------------------------------------------------------
# Input checks (shared by every engine)
# ---------------------------------------------------------------------------------------


def check_inputs(specs: tuple[TensorSpec, ...], inputs: Mapping[str, np.ndarray]) -> None:
    """Refuse inputs that do not match the contract exactly.

    Names must be exactly the contract's inputs; dtypes must be equal (no casting); every
    static axis must equal the contract's shape and every dynamic axis must lie in its
    ``[min, max]``; axes that share a dynamic-axis name (e.g. ``batch``) must agree.
    """
    expected = {s.name for s in specs}
    got = set(inputs)
    if got != expected:
        missing, extra = sorted(expected - got), sorted(got - expected)
        parts = ([f"missing {missing}"] if missing else []) + ([f"unexpected {extra}"] if extra else [])
        raise InputRejected("inputs do not match the contract: " + ", ".join(parts))
    shared: dict[str, tuple[str, int]] = {}
    for spec in specs:
        x = inputs[spec.name]
        if not isinstance(x, np.ndarray):
            raise InputRejected(f"input {spec.name!r}: expected a numpy array, got {type(x).__name__}")
        if x.dtype != np.dtype(spec.dtype):
            raise InputRejected(f"input {spec.name!r}: dtype {x.dtype}, the contract requires {spec.dtype}")
        if x.ndim != len(spec.shape):
            raise InputRejected(
                f"input {spec.name!r}: rank {x.ndim} {list(x.shape)}, the contract requires rank {len(spec.shape)} {list(spec.shape)}"
            )
        dynamic = {ax.axis: ax for ax in spec.dynamic}
        for axis, (size, want) in enumerate(zip(x.shape, spec.shape, strict=True)):
            ax = dynamic.get(axis)
            if ax is None:
                if size != want:
                    raise InputRejected(
                        f"input {spec.name!r}: axis {axis} is {size}, the contract fixes it at {want} (shape {list(spec.shape)})"
                    )
                continue
            if not ax.min <= size <= ax.max:
                raise InputRejected(
                    f"input {spec.name!r}: axis {axis} ({ax.name}) is {size}, outside the contract's range [{ax.min}, {ax.max}]"
                )
            first = shared.setdefault(ax.name, (spec.name, size))
            if first[1] != size:
                raise InputRejected(
                    f"input {spec.name!r}: {ax.name} is {size} but {first[0]!r} has {ax.name} {first[1]}"
                )


@dataclass(frozen=True, kw_only=True)
class RollingLatency:
    """Latency percentiles over a rolling window of answered requests, milliseconds (a
    remote link's, the openpi endpoint's)."""

    p50: float
    p99: float
    count: int


@dataclass(frozen=True, kw_only=True)
class LinkRecovery:
    """How far a lost link is on its way back (``vlad_kserve.stats``: the hysteresis)."""

    streak: int  # answers within the deadline in a row
    needed: int  # answers in a row before it counts as connected again
    relapses: int  # losses soon after a recovery, each doubling ``needed``


# Strings in the stats may be empty (no error yet): the schema's default refuses empty ones.
_TEXT: dict[str, Any] = {"allow_empty": True}


@dataclass(frozen=True, kw_only=True)
class SessionStats:
    """Live figures of one session for ``vladctl status``, the status socket and the monitors.

    A local engine has none (``kind = "local"``; on the wire ``{}``). A remote backend
    (``kind = "remote"``) fills the link's figures: connected or lost and for how long,
    counters, errors by kind, rolling latency, where it talks to. Readers branch on
    :attr:`kind` (or :attr:`remote`), never on which keys a map happens to hold."""

    kind: Literal["local", "remote"] = "local"
    state: Literal["connected", "lost"] = "connected"
    state_for_s: float = 0.0
    requests: int = 0
    ok: int = 0
    errors: Mapping[str, int] = field(default_factory=dict)  # failed requests by kind
    reconnects: int = 0
    recovery: LinkRecovery | None = None
    last_error: str = field(default="", metadata=_TEXT)
    last_ok_age_s: float | None = None
    window: int = 0  # requests in the rolling window
    error_rate: float = 0.0  # failed fraction of the window
    round_trip_ms: RollingLatency | None = None
    network_ms: RollingLatency | None = None
    server_ms: RollingLatency | None = None
    endpoint: str = field(default="", metadata=_TEXT)
    protocol: str = field(default="", metadata=_TEXT)
    model: str = field(default="", metadata=_TEXT)

    @property
    def remote(self) -> bool:
        return self.kind == "remote"

    @property
    def lost(self) -> bool:
        return self.remote and self.state == "lost"

    def to_dict(self) -> dict[str, Any]:
        """The wire form: ``{}`` for a local session, every figure for a remote one."""
        if not self.remote:
            return {}
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value: Any) -> Any:
    """A stats value as JSON-able data (nested dataclasses as maps)."""
    if isinstance(value, (RollingLatency, LinkRecovery)):
        return asdict(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


# ---------------------------------------------------------------------------------------
# The interface
# ---------------------------------------------------------------------------------------


class Session(abc.ABC):
    """A loaded model on one engine. Not thread-safe: one inference at a time."""

    backend_name: str = "?"

    def __init__(self, contract: Contract, artifact: Path, options: Mapping[str, Any]) -> None:
        self.contract = contract
        self.artifact = Path(artifact)
        self.options = dict(options)
        self.last_timing = Timing()
        self.deadline_ns: int | None = None

    def infer(self, inputs: Mapping[str, np.ndarray], deadline_ns: int | None = None) -> dict[str, np.ndarray]:
        """Run the model on contract-conforming inputs; refuses anything else before the engine.

        ``deadline_ns`` (``time.monotonic_ns()`` clock) is when the answer is no longer
        useful: the serving path passes the observation's sensor time plus the contract's
        end-to-end deadline. Engines that can give up early (a remote backend's request
        timeout) read it from :attr:`deadline_ns`; local engines ignore it.
        """
        check_inputs(self.contract.inputs, inputs)
        self.deadline_ns = deadline_ns
        try:
            return self._run(inputs)
        except (InputRejected, BackendError):
            raise  # already says what failed (a remote backend's RemoteUnavailable keeps its class)
        except Exception as exc:
            raise BackendError(f"{self.backend_name}: inference failed: {exc}") from exc

    @abc.abstractmethod
    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Engine-specific inference; must set :attr:`last_timing`. Outputs may be reused
        buffers: a caller that keeps them past the next call copies them."""

    @abc.abstractmethod
    def describe(self) -> SessionDescription:
        """Runtime, version, device, providers in use, precision and engine cache key."""

    def warmup(self, n: int = 10) -> None:
        """Run ``n`` inferences on the contract's opt-shape inputs (zeros, and fixed noise)."""
        inputs = example_inputs(self.contract)
        for _ in range(n):
            self.infer(inputs)

    def memory(self) -> MemoryStats:
        return MemoryStats(host_rss_bytes=host_rss_bytes())

    def stats(self) -> SessionStats:
        """Live figures for ``vladctl status`` and the monitors (a remote backend's
        connection state, network latency percentiles and error rate; a local engine has
        none). Called from the event loop while inferences run: must be cheap and thread-safe."""
        return SessionStats()

    def close(self) -> None:  # noqa: B027 - optional override: most sessions have nothing to free
        """Release engine resources (idempotent)."""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Backend(abc.ABC):
    """An engine offered by a plugin (returned from the ``vlad_backends`` hook)."""

    name: str = "?"

    @abc.abstractmethod
    def availability(self) -> Availability:
        """Whether this engine's runtime is usable on this machine, and if not, why."""

    @abc.abstractmethod
    def load(self, artifact: Path, contract: Contract, options: Mapping[str, Any] | None = None) -> Session:
        """Load ``artifact`` (path relative to nothing: absolute or cwd-relative) for ``contract``."""

    def artifact_suffixes(self) -> tuple[str, ...]:
        """File suffixes this backend loads (for error messages and manifest checks)."""
        return ()

    def compile(self, source: Path, out: Path, device: str = "cpu") -> Path:
        """Build this backend's artifact at ``out`` from a portable one at ``source`` (e.g. an
        AOTInductor package from a ``torch.export`` program); the gates call it to test an
        engine the release does not ship. A backend that loads portable artifacts as they
        are has nothing to build."""
        raise BackendError(f"{self.name}: builds no artifact; it loads its files as they are")


def parse_options(
    backend: str,
    cls: type[OptionsT],
    options: Mapping[str, Any] | None,
    check: schema.Check | None = None,
) -> OptionsT:
    """A backend's ``options`` table (manifest or config) as the backend's frozen dataclass
    ``cls``, through :mod:`vlad.schema` (types, bounds, unknown keys with a "did you mean");
    ``check(obj, path, problems)`` adds the backend's own rules. Every problem at once, as one
    :class:`BackendError` line naming the backend."""
    problems: list[str] = []
    value = schema.convert(cls, dict(options or {}), "options", problems, checks={cls: check} if check else {})
    if problems or value is schema.BROKEN:
        raise BackendError(f"{backend}: " + "; ".join(problems or ["invalid options"]))
    return value


def example_inputs(contract: Contract, batch: int | None = None) -> dict[str, np.ndarray]:
    """Deterministic inputs at the contract's opt shape (or with batch axis ``batch``)."""
    rng = np.random.default_rng(0)
    out = {}
    for spec in contract.inputs:
        shape = list(spec.opt_shape)
        if batch is not None:
            for ax in spec.dynamic:
                if ax.name == "batch":
                    shape[ax.axis] = batch
        dtype = np.dtype(spec.dtype)
        if np.issubdtype(dtype, np.integer):
            out[spec.name] = np.zeros(shape, dtype=dtype)
        else:
            out[spec.name] = rng.standard_normal(shape).astype(dtype)
    return out
