"""The ``kserve`` backend: the contract's model inputs to a KServe v2 server, its outputs back.

Load: connect, read the model's metadata and refuse it unless names, datatypes and shapes
match the contract (a ``-1`` dimension on the server accepts any size; a fixed one must
equal the contract's, and a dynamic contract axis needs ``-1``), then warm up.

Every request carries a timeout: the time left before ``deadline_ns`` (the cycle's
deadline, set by ``Session.infer``), else ``timeout_ms``, bounded by ``max_timeout_ms``.
With less than ``min_timeout_ms`` left the request is refused at once and never sent.

Failures (:mod:`vlad_kserve.transport`):

* :class:`~vlad.errors.RemoteUnavailable` (the link or the server: refused, lost, late or
  trickling past the deadline, 5xx / UNAVAILABLE, not found, credentials refused, a body
  over ``max_response_mb``, a metadata reply that is not one): a *system* fault, the
  supervisor falls back without blaming the policy. The link is then "lost" and, while
  nothing else uses it, a prober checks it every ``probe_interval_ms`` (readiness,
  metadata, one inference within the contract deadline) and marks it "connected" again
  after ``recover_after`` such answers in a row (:mod:`vlad_kserve.stats`). Whatever a
  probe gets back, the prober goes on;
* plain :class:`~vlad.errors.BackendError` (the server refused the contract's inputs, or
  answered with missing, extra or mis-shaped outputs): the policy is at fault.

**Unreachable at start.** A server that does not answer when the session is made (any
system kind) does not stop the daemon: the session starts "lost", its warm-up is skipped,
and the prober checks the contract against the server's metadata before the link is
"connected"; meanwhile the supervisor serves the fallback (state ``FALLBACK``, finding
``remote_unreachable``). A server that answers with a model that does not match the
contract is refused at load, as before.

Timing: ``compute_ms`` is the whole round trip; ``server_ms`` is the server's own time
when the response says (``vlad_server_ns`` parameter, set by :mod:`vlad_kserve.server`),
``network_ms`` the rest. :meth:`KServeSession.stats` gives the live link state.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vlad.backend import (
    Availability,
    Backend,
    Session,
    SessionDescription,
    SessionStats,
    Timing,
    example_inputs,
)
from vlad.contract import Contract, TensorSpec
from vlad.errors import BackendError, BackendUnavailable, RemoteUnavailable
from vlad.files import sha256_file
from vlad_kserve.options import RemoteOptions, parse_options
from vlad_kserve.stats import LinkStats
from vlad_kserve.transport import SYSTEM_KINDS, TokenSource, TransportError, make_transport, v2_datatype

log = logging.getLogger("vlad.kserve")


def _fail(msg: str) -> BackendError:
    return BackendError(f"kserve: {msg}")


def metadata_problems(md: Mapping[str, Any], contract: Contract) -> list[str]:
    """Every disagreement between a v2 model metadata dict and the contract's signature,
    each naming the field (``inputs.tokens.datatype``); empty when they match."""
    problems = []
    for side, specs in (("inputs", contract.inputs), ("outputs", contract.outputs)):
        served = {t["name"]: t for t in md.get(side, [])}
        want = {s.name for s in specs}
        for name in sorted(set(served) - want):
            problems.append(f"{side}.{name}: served by the model but not in the contract")
        for spec in specs:
            t = served.get(spec.name)
            if t is None:
                problems.append(f"{side}.{spec.name}: in the contract but not served by the model")
                continue
            problems.extend(_tensor_problems(f"{side}.{spec.name}", t, spec))
    return problems


def _tensor_problems(field: str, t: Mapping[str, Any], spec: TensorSpec) -> list[str]:
    out = []
    want_dt = v2_datatype(spec.dtype)
    if t.get("datatype") != want_dt:
        out.append(f"{field}.datatype: server {t.get('datatype')}, contract {want_dt} ({spec.dtype})")
    shape = list(t.get("shape", []))
    if len(shape) != len(spec.shape):
        return out + [
            f"{field}.shape: server {shape} (rank {len(shape)}), contract {list(spec.shape)} (rank {len(spec.shape)})"
        ]
    dynamic = {ax.axis: ax for ax in spec.dynamic}
    for axis, (got, want) in enumerate(zip(shape, spec.shape, strict=True)):
        if got == -1:
            continue  # the server takes any size on this axis
        ax = dynamic.get(axis)
        if ax is not None and not ax.min == ax.max == got:
            out.append(
                f"{field}.shape[{axis}]: server fixes it at {got}, the contract's {ax.name} ranges "
                f"[{ax.min}, {ax.max}] (the server must declare -1)"
            )
        elif ax is None and got != want:
            out.append(f"{field}.shape[{axis}]: server {got}, contract {want} (shape {list(spec.shape)})")
    return out


class KServeBackend(Backend):
    """A model served by a KServe v2 server (Triton, KServe, MLServer) over gRPC or HTTP."""

    name = "kserve"

    def availability(self) -> Availability:
        """Usable when the gRPC client (tritonclient[grpc]) is installed; HTTP needs nothing more."""
        if importlib.util.find_spec("tritonclient") is None or importlib.util.find_spec("grpc") is None:
            return Availability(
                False, "kserve-v2", reason="tritonclient[grpc] is not installed (pip install vlad-kserve)"
            )
        try:
            from importlib.metadata import version

            import tritonclient.grpc  # noqa: F401
        except Exception as exc:
            return Availability(False, "kserve-v2", reason=f"tritonclient.grpc does not import: {exc}")
        return Availability(
            True,
            "kserve-v2",
            version=f"tritonclient {version('tritonclient')}",
            devices=("remote",),
            providers=("grpc", "http"),
        )

    def artifact_suffixes(self) -> tuple[str, ...]:
        """Any file: the artifact is the release's record of the model the server serves."""
        return ()

    def load(self, artifact: Path, contract: Contract, options: Mapping[str, Any] | None = None) -> KServeSession:
        """Connect to the server, check its model metadata against the contract, refuse a mismatch."""
        availability = self.availability()
        if not availability.usable:
            raise BackendUnavailable(f"kserve: {availability.reason}")
        raw = dict(options or {})
        return KServeSession(contract, Path(artifact), raw, parse_options(raw, contract))


class KServeSession(Session):
    """One model on a v2 server: a client, the link's live state and, when lost, a prober."""

    backend_name = "kserve"

    def __init__(self, contract: Contract, artifact: Path, raw_options: Mapping[str, Any], opts: RemoteOptions) -> None:
        super().__init__(contract, artifact, raw_options)
        self.opts = opts
        self._digest: str | None = None  # the artifact's sha256, hashed once (describe())
        self.link = LinkStats(opts.stats_window, opts.recover_after)
        self._token = TokenSource(opts.token_file)
        self._output_names = [s.name for s in contract.outputs]
        self._outputs = {s.name: s for s in contract.outputs}
        self._warming = False
        self._closed = False
        self._probe_lock = threading.Lock()
        self._prober: threading.Thread | None = None
        self._stop = threading.Event()
        self._transport = make_transport(opts, self._token)
        self.server_metadata: dict[str, Any] = {}
        try:
            self.server_metadata = self._verified_metadata(self._transport)
        except RemoteUnavailable as exc:
            # Unreachable at start: served by the fallback until the prober finds it (module doc).
            log.warning("%s; starting with the link lost (the fallback serves until the server answers)", exc)
            self.link.lost_at_start(str(exc))
            self._start_prober()
        except BaseException:
            self._transport.close()
            raise

    # -- load-time checks ------------------------------------------------------------------

    def _verified_metadata(self, transport) -> dict[str, Any]:
        timeout = self.opts.connect_timeout_ms / 1e3
        try:
            md = transport.metadata(timeout)
        except TransportError as exc:
            if exc.kind == "not_found":
                raise RemoteUnavailable(
                    f"kserve: {self.opts.endpoint} serves no model {self.opts.model_name!r}"
                    f"{' version ' + self.opts.model_version if self.opts.model_version else ''}: "
                    f"{exc}; check model_name / model_version"
                ) from None
            if exc.kind in SYSTEM_KINDS:
                raise RemoteUnavailable(
                    f"kserve: cannot reach {self.opts.endpoint} ({exc}); is the server up, "
                    "and the endpoint / TLS / token right?"
                ) from None
            raise _fail(f"model metadata from {self.opts.endpoint}: {exc}") from None
        except OSError as exc:  # the TLS files or the token cannot be read: a configuration problem
            raise _fail(f"{self.opts.endpoint}: {exc}") from None
        problems = metadata_problems(md, self.contract)
        if problems:
            raise _fail(
                f"model {self.opts.model_name!r} on {self.opts.endpoint} does not match the contract: "
                + "; ".join(problems)
            )
        return md

    # -- the hot path ----------------------------------------------------------------------

    def infer(self, inputs: Mapping[str, np.ndarray], deadline_ns: int | None = None) -> dict[str, np.ndarray]:
        """As :meth:`Session.infer`; a :class:`RemoteUnavailable` keeps its class."""
        try:
            return super().infer(inputs, deadline_ns)
        except BackendError as exc:
            # Session.infer wraps whatever _run raises into a plain BackendError; the
            # supervisor needs the system/policy distinction, so hand over our own error.
            if isinstance(exc.__cause__, BackendError):
                raise exc.__cause__ from None
            raise

    def _timeout_s(self) -> float:
        o = self.opts
        if self._warming:
            return o.connect_timeout_ms / 1e3
        if self.deadline_ns is None:
            return min(o.timeout_ms, o.max_timeout_ms) / 1e3
        left_ms = (self.deadline_ns - time.monotonic_ns()) / 1e6
        if left_ms < o.min_timeout_ms:
            msg = f"{left_ms:.2f} ms left before the deadline (min_timeout_ms {o.min_timeout_ms:g}): not sent"
            self.link.failure("deadline", msg, system=True, sent=False)
            raise RemoteUnavailable(f"kserve: {msg}")
        return min(left_ms, o.max_timeout_ms) / 1e3

    def _run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._closed:
            raise _fail("session is closed")
        timeout_s = self._timeout_s()
        t0 = time.perf_counter_ns()
        try:
            outputs, server_ns = self._transport.infer(inputs, self._output_names, timeout_s)
            self._check_outputs(outputs, inputs)
        except TransportError as exc:
            system = exc.kind in SYSTEM_KINDS
            self.link.failure(exc.kind, str(exc), system)
            if system:
                self._start_prober()
                raise RemoteUnavailable(f"kserve: {self.opts.endpoint}: {exc.kind}: {exc}") from None
            raise _fail(f"{self.opts.endpoint}: {exc}") from None
        rtt_ms = (time.perf_counter_ns() - t0) / 1e6
        server_ms = server_ns / 1e6 if server_ns is not None else None
        network_ms = max(rtt_ms - server_ms, 0.0) if server_ms is not None else None
        self.last_timing = Timing(compute_ms=rtt_ms, network_ms=network_ms, server_ms=server_ms)
        self.link.success(rtt_ms, network_ms, server_ms)
        return outputs

    def _check_outputs(self, outputs: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray]) -> None:
        """The answer must be exactly the contract's outputs, batch as sent: the server and
        the contract disagree otherwise (a policy fault, not the link's)."""
        if set(outputs) != set(self._outputs):
            raise TransportError(
                "bad_response", f"outputs {sorted(outputs)}, the contract declares {sorted(self._outputs)}"
            )
        sizes = {ax.name: inputs[s.name].shape[ax.axis] for s in self.contract.inputs for ax in s.dynamic}
        for name, spec in self._outputs.items():
            x = outputs[name]
            if x.dtype != np.dtype(spec.dtype):
                raise TransportError(
                    "bad_response", f"output {name!r} is {x.dtype}, the contract requires {spec.dtype}"
                )
            # A dynamic axis named like an input's (batch) must come back at the size sent.
            dynamic = {ax.axis: sizes.get(ax.name) for ax in spec.dynamic}
            want = [dynamic[axis] if axis in dynamic else d for axis, d in enumerate(spec.shape)]
            if x.ndim != len(want) or any(w is not None and w != g for w, g in zip(want, x.shape, strict=True)):
                raise TransportError(
                    "bad_response",
                    f"output {name!r} has shape {list(x.shape)}, the contract expects "
                    f"{['*' if w is None else w for w in want]}",
                )

    # -- recovery ----------------------------------------------------------------------------

    def _start_prober(self) -> None:
        if self.opts.probe_interval_ms <= 0 or self._closed:
            return
        with self._probe_lock:
            if self._prober is not None and self._prober.is_alive():
                return
            self._prober = threading.Thread(target=self._probe_loop, name="vlad-kserve-probe", daemon=True)
            self._prober.start()

    def _probe_loop(self) -> None:
        """While the link is lost: readiness, metadata (a restarted server may serve another
        model), then one inference that must fit the contract's deadline. Any answer, even
        one no v2 server would give, is a failed probe, never the end of the prober."""
        transport = self._transport if self._transport.thread_safe else make_transport(self.opts, self._token)
        inputs = example_inputs(self.contract)
        budget_s = self.opts.timeout_ms / 1e3
        try:
            while not self._stop.wait(self.opts.probe_interval_ms / 1e3) and self.link.lost:
                try:
                    if not transport.ready(budget_s):
                        self.link.probe_failed("unavailable", "model not ready")
                        continue
                    md = transport.metadata(budget_s)
                    problems = metadata_problems(md, self.contract)
                    if problems:
                        self.link.probe_failed("bad_response", "model changed: " + "; ".join(problems))
                        continue
                    outputs, _ = transport.infer(inputs, self._output_names, budget_s)
                    self._check_outputs(outputs, inputs)
                except TransportError as exc:
                    self.link.probe_failed(exc.kind, str(exc))
                    continue
                except Exception as exc:  # a bug or an answer nothing above expected: keep probing
                    log.exception("kserve: probe of %s failed unexpectedly", self.opts.endpoint)
                    self.link.probe_failed("probe_error", f"{type(exc).__name__}: {exc}")
                    continue
                self.server_metadata = md
                if self.link.recovered():
                    log.info("kserve: %s answers within the deadline again: link connected", self.opts.endpoint)
        finally:
            if transport is not self._transport:
                transport.close()

    # -- introspection -----------------------------------------------------------------------

    def warmup(self, n: int = 10) -> None:
        """Warm-up requests, each allowed ``connect_timeout_ms`` (the first sets up the
        connection); none while the link is lost (the prober's inference warms it up)."""
        if self.link.lost:
            return
        self._warming = True
        try:
            super().warmup(n)
        finally:
            self._warming = False

    def stats(self) -> SessionStats:
        """The link's live state: connected/lost, counters, rolling network p50/p99, error rate."""
        return replace(
            self.link.snapshot(),
            endpoint=self.opts.endpoint,
            protocol=self.opts.protocol or "",
            model=self.opts.model_name,
        )

    def describe(self) -> SessionDescription:
        """The server and model in use; the device is ``remote:<endpoint>``."""
        md = self.server_metadata  # empty while a link lost at start was never connected
        if self._digest is None:  # once: the status calls this every build
            self._digest = sha256_file(self.artifact)[:16] if self.artifact.is_file() else "?"
        digest = self._digest
        return SessionDescription(
            backend="kserve",
            runtime=f"kserve-v2/{self.opts.protocol}",
            runtime_version=md.get("platform") or "v2",
            device=f"remote:{self.opts.endpoint}",
            precision=self.opts.precision,
            providers=(str(self.opts.protocol),),  # set from the endpoint by parse_options
            cache_key=f"{digest}-{self.opts.model_name}@{self.opts.model_version or 'any'}",
            artifact=str(self.artifact),
            extra={
                "endpoint": self.opts.endpoint,
                "model_name": self.opts.model_name,
                "model_version": self.opts.model_version,
                "server_versions": list(md.get("versions", [])),
                "tls": self.opts.tls,
                "client_certificate": bool(self.opts.tls_cert_file),
                "token": bool(self.opts.token_file),
                "timeout_ms": self.opts.timeout_ms,
            },
        )

    def close(self) -> None:
        """Stop the prober and close the connection (idempotent)."""
        self._closed = True
        self._stop.set()
        prober = self._prober
        if prober is not None and prober is not threading.current_thread():
            prober.join(timeout=2.0)
        self._transport.close()
