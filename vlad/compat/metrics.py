"""Prometheus metrics: ``[metrics]``, text exposition over HTTP on a local address or a unix socket.

It runs in an endpoint process (:mod:`vlad.compat.endpoint`, started and watched by
:mod:`vlad.daemon.endpoints`), serves on the listening socket the daemon bound and handed
it, and reads nothing but the status the daemon publishes on its
status socket (``serve.status_hz``), as any subscriber would: state, release, counters,
per-policy counters, findings, e-stop, the latency percentiles of the rolling window, the
health readings, and the cumulative per-stage histograms and event counts the daemon folds
for it (:class:`vlad.daemon.status.Tallies`), each status parsed into a
:class:`vlad.snapshot.StatusSnapshot` (one it cannot parse, from another vlad version, is
counted as ``unreadable`` and not shown). So gauges may be up to one status period old
(``vlad_status_age_seconds``), and ``vlad_up`` is 1 only while readable statuses keep coming.

A scrape costs the daemon nothing. The text is rendered here at most once per status
(a scrape flood re-sends the same bytes); the HTTP server is one asyncio protocol, no
thread per connection: at most ``max_connections`` connections (``max_connections_per_peer``
per address; beyond, closed at accept), a request head of at most 8 KiB that must be
complete within ``idle_timeout_s`` of the connection or of the previous answer, and a
client that does not read its answers is not read from either.

Names follow Prometheus conventions: ``vlad_`` prefix, base units (seconds, bytes,
celsius) in the name, ``_total`` for counters.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import fields
from typing import Any, get_args

import zmq
import zmq.asyncio

from vlad import protocol
from vlad.compat.endpoint import (
    ACCEPT_BACKLOG,
    Admission,
    Endpoint,
    EndpointStartError,
    Spec,
    connect,
    listening_sockets,
    peer_of,
    section,
    status_updates,
)
from vlad.config import MetricsConfig, parse_listen
from vlad.health.state import StateName
from vlad.snapshot import StatusSnapshot

log = logging.getLogger("vlad.metrics")

STATES: tuple[str, ...] = get_args(StateName)
MAX_HEAD = 8192
WRITE_HIGH = 256 * 1024  # answers buffered for a client before it is read from again


def families(st: StatusSnapshot) -> Iterator[Any]:
    """The metric families of one status (prometheus_client's collector protocol)."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        InfoMetricFamily,
    )

    def gauge(name: str, doc: str, value: float | None = None, labels=None, samples=()) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, value=value, labels=labels)
        for lv, v in samples:
            g.add_metric(lv, v)
        return g

    def counter(name: str, doc: str, value: float | None = None, labels=None, samples=()) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, value=value, labels=labels)
        for lv, v in samples:
            c.add_metric(lv, v)
        return c

    yield gauge("vlad_uptime_seconds", "seconds since the daemon started", st.uptime_s)
    yield gauge(
        "vlad_state",
        "supervisor state: 1 for the current one",
        labels=["state"],
        samples=[([s], 1.0 if s == st.state else 0.0) for s in STATES],
    )
    yield gauge("vlad_state_since_seconds", "seconds in the current state", st.state_since_s)
    yield gauge("vlad_estop_engaged", "1 while the external e-stop is engaged", 1.0 if st.estop.engaged else 0.0)
    yield counter(
        "vlad_state_transitions_total",
        "state transitions by target state (FALLBACK: fallbacks)",
        labels=["to"],
        samples=[([k], v) for k, v in sorted(st.transition_counts.items())],
    )
    yield counter(
        "vlad_events_total",
        "recorded events by kind (swap, fault, quarantine, release, canary_abort, operator ...)",
        labels=["kind"],
        samples=[([k], v) for k, v in sorted(st.event_counts.items())],
    )
    hist = HistogramMetricFamily(
        "vlad_latency_seconds",
        "per-stage latency of published policy chunks (stages as in docs/protocol.md timings_ms)",
        labels=["stage"],
    )
    lost = []
    for stage, h in st.histograms.items():
        lost.append(([stage], h.lost))
        if not h.count or len(h.cumulative) != len(st.bucket_edges_s) + 1:
            continue
        buckets = [(f"{b:g}", float(c)) for b, c in zip(st.bucket_edges_s, h.cumulative[:-1], strict=True)]
        buckets.append(("+Inf", float(h.cumulative[-1])))
        hist.add_metric([stage], buckets, h.sum_s)
    yield hist
    yield counter(
        "vlad_latency_samples_lost_total",
        "latency samples overwritten before the daemon folded them",
        labels=["stage"],
        samples=[s for s in lost if s[1]],
    )
    yield gauge(
        "vlad_temperature_celsius",
        "temperatures the health sensors read",
        labels=["sensor"],
        samples=[([k], v) for k, v in sorted(st.temperatures_c.items())],
    )
    yield gauge(
        "vlad_memory_bytes",
        "memory readings (rss, host available, GPU used/total)",
        labels=["kind"],
        samples=[([k], v) for k, v in sorted(st.memory.readings_bytes.items())],
    )
    backend = st.backend
    info = InfoMetricFamily("vlad_release", "the release being served and where", labels=None)
    info.add_metric(
        [],
        {
            "release": st.release,
            "serving": st.serving,
            "backend": backend.name,
            "runtime": backend.runtime,
            "device": backend.device,
            "version": st.version,
        },
    )
    yield info
    yield gauge(
        "vlad_fallback_active",
        "1 while a fallback (or the hold posture) serves instead of the release",
        1.0 if st.on_fallback else 0.0,
    )
    yield gauge(
        "vlad_findings",
        "active health findings",
        labels=["monitor", "code", "severity"],
        samples=[([f.monitor, f.code, f.severity], 1.0) for f in st.findings],
    )
    c = st.counters
    for key, doc in (
        ("messages", "messages received on the observation socket"),
        ("observations", "observations that passed every check"),
        ("heartbeats", "controller heartbeats"),
        ("superseded", "valid observations replaced by a newer one before inference"),
        ("input_rejected", "observations refused for their content"),
        ("published", "policy action chunks published"),
        ("interventions", "chunks the final guard changed"),
        ("deadline_misses", "published chunks later than the contract's e2e deadline"),
        ("stale", "observations too old when inference would start"),
        ("backend_errors", "inferences that failed in the engine"),
        ("remote_errors", "remote backend requests that failed or were late"),
        ("expired", "chunks past valid_until before they could be sent"),
        ("estop_blocked", "policy chunks withheld by the e-stop"),
        ("bridged", "hold postures sent while an inference was late"),
        ("cycle_errors", "serving cycles that failed on a bug (see the log)"),
    ):
        yield counter(f"vlad_{key}_total", doc, getattr(c, key))
    yield counter(
        "vlad_holds_total",
        "hold postures published, by reason",
        labels=["reason"],
        samples=[([k], v) for k, v in sorted(c.holds.items())],
    )
    yield counter(
        "vlad_rejections_total",
        "messages refused, by reason (docs/protocol.md)",
        labels=["reason"],
        samples=[([k], v) for k, v in sorted(c.rejected.items())],
    )
    yield counter(
        "vlad_guard_interventions_total",
        "final-guard corrections, by kind",
        labels=["kind"],
        samples=[([k], v) for k, v in sorted(c.guard().items())],
    )
    per_policy: dict[str, list[tuple[list[str], float]]] = {}
    for policy, counts in st.policies.items():
        for f in fields(counts):
            per_policy.setdefault(f.name, []).append(([policy], getattr(counts, f.name)))
    for key, samples in sorted(per_policy.items()):
        yield counter(
            f"vlad_policy_{key}_total", f"per policy: {key.replace('_', ' ')}", labels=["policy"], samples=samples
        )
    yield gauge(
        "vlad_observations_per_second", "observation rate over the last status period", st.rates.observations_hz
    )
    yield gauge(
        "vlad_actions_per_second",
        "action chunk rate (policy and hold) over the last status period",
        st.rates.actions_hz,
    )
    q = gauge(
        "vlad_latency_window_seconds",
        "per-stage latency percentiles over the rolling window",
        labels=["stage", "quantile"],
    )
    for stage, v in st.latency_ms.items():
        for ms, quant in ((v.p50, "0.5"), (v.p95, "0.95"), (v.p99, "0.99"), (v.max, "1")):
            q.add_metric([stage, quant], ms / 1e3)
    yield q
    yield gauge(
        "vlad_controllers",
        "controllers known by their heartbeats, 1 while alive (docs/health.md)",
        labels=["client"],
        samples=[([name], 1.0 if ctl.alive else 0.0) for name, ctl in sorted(st.controllers.items())],
    )
    o = st.openpi
    if o:
        yield gauge("vlad_openpi_clients", "openpi websocket clients connected", o.clients)
        yield counter("vlad_openpi_requests_total", "openpi requests received", o.requests)
        yield counter("vlad_openpi_replies_total", "openpi requests answered with a policy chunk", o.replies)
        yield counter(
            "vlad_openpi_errors_total",
            "openpi requests answered with an error, and refused connections, by reason",
            labels=["reason"],
            samples=[([k], v) for k, v in sorted(o.errors.items())],
        )
    for name, e in (("openpi", st.openpi), ("metrics", st.metrics)):
        if e:
            yield counter(
                f"vlad_{name}_refused_connections_total",
                f"connections to the {name} endpoint closed at accept (over a connection cap), by cap",
                labels=["cap"],
                samples=[([k], v) for k, v in sorted(e.refused_connections.items())],
            )
            yield gauge(
                f"vlad_{name}_running", f"1 while the {name} endpoint process serves", 1.0 if e.running else 0.0
            )
            yield counter(f"vlad_{name}_restarts_total", f"restarts of the {name} endpoint process", e.restarts)
            yield counter(
                f"vlad_{name}_failed_starts_total",
                f"starts of the {name} endpoint process again that did not serve",
                e.failed_starts,
            )
            yield counter(
                f"vlad_{name}_unresponsive_total",
                f"{name} endpoint processes killed for sending no report (stopped or hung)",
                e.unresponsive,
            )


class _Collector:
    def __init__(self, status: StatusSnapshot) -> None:
        self.status = status

    def collect(self) -> Iterator[Any]:
        return families(self.status)

    def describe(self) -> list:
        return []  # families vary with the daemon's state (policies, reasons): no fixed description


def render(status: StatusSnapshot) -> bytes:
    """The exposition text of one status (without the two live gauges)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(status))
    return generate_latest(registry)


class MetricsEndpoint(Endpoint):
    """The status subscriber and the HTTP server (module doc)."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        cfg = section(spec, MetricsConfig, "metrics")
        self.listen = parse_listen(cfg.listen)
        self.admission = Admission(cfg.max_connections, cfg.max_connections_per_peer)
        self.idle_s = cfg.idle_timeout_s
        self.status_period_s = 1.0 / spec.status_hz
        self.status: StatusSnapshot | None = None
        self.status_at = 0.0  # time.monotonic() when it arrived
        self._text: bytes | None = None  # rendered from self.status (None: not yet)
        self.counts: dict[str, int] = {"scrapes": 0, "renders": 0, "bad_requests": 0, "timeouts": 0, "unreadable": 0}
        self._servers: list[asyncio.AbstractServer] = []
        self._task: asyncio.Task | None = None

    async def start(self) -> str:
        # The daemon's listening sockets: the address is never this process's to bind or free.
        socks = listening_sockets(self.spec, "metrics")
        self.ctx = zmq.asyncio.Context()
        self._st = connect(self.ctx, zmq.SUB, self.spec.sockets["status"], self.spec.curve)
        self._st.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_STATUS)
        self._st.setsockopt(zmq.MAXMSGSIZE, 4 << 20)
        self._st.setsockopt(zmq.RCVHWM, 2)
        loop = asyncio.get_running_loop()
        try:
            for sock in socks:
                self._servers.append(await loop.create_server(lambda: _HTTP(self), sock=sock, backlog=ACCEPT_BACKLOG))
        except OSError as exc:
            self._st.close(0)
            raise EndpointStartError(f"metrics: cannot serve on {self.listen}: {exc.strerror or exc}") from None
        self._task = asyncio.create_task(self._read_status(), name="status")
        log.info("metrics on http://%s/metrics", self.listen)
        return str(self.listen)

    async def _read_status(self) -> None:
        # An unreadable status (another vlad version) is counted and skipped: vlad_up falls to 0.
        async for st in status_updates(self._st, self.counts):
            self.status, self.status_at, self._text = st, time.monotonic(), None

    def page(self) -> bytes:
        """``/metrics``: the rendered status and the live ``vlad_up`` / ``vlad_status_age_seconds``."""
        self.counts["scrapes"] += 1
        age = time.monotonic() - self.status_at if self.status is not None else float("inf")
        up = 1 if age <= 5 * self.status_period_s else 0
        live = (
            "# HELP vlad_up 1 while the daemon publishes its status (within 5 status periods)\n"
            f"# TYPE vlad_up gauge\nvlad_up {up}\n"
        )
        if self.status is None:
            return live.encode()
        if self._text is None:
            try:
                self._text = render(self.status)
                self.counts["renders"] += 1
            except Exception:  # a bug in a family: say so, keep serving the live gauges
                log.exception("metrics: rendering the status failed")
                self._text = b""
        live += (
            "# HELP vlad_status_age_seconds age of the status these metrics come from\n"
            f"# TYPE vlad_status_age_seconds gauge\nvlad_status_age_seconds {age:.3f}\n"
        )
        return live.encode() + self._text

    def report(self) -> dict[str, Any]:
        return {
            "listen": str(self.listen),
            "open_connections": self.admission.open,
            "refused_connections": dict(self.admission.refused),
            **self.counts,
        }

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for server in self._servers:
            server.close()
        self._st.close(0)
        self.ctx.term()


class _HTTP(asyncio.Protocol):
    """One HTTP/1.1 connection: GET /metrics, GET /healthz, keep-alive, every bound above."""

    def __init__(self, ep: MetricsEndpoint) -> None:
        self.ep = ep
        self.peer: str | None = None
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peer = peer_of(transport)
        if not self.ep.admission.admit(peer):
            transport.abort()
            return
        self.peer, self.transport = peer, transport
        transport.set_write_buffer_limits(high=WRITE_HIGH)
        self._arm()

    def _arm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(self.ep.idle_s, self._idle)

    def _idle(self) -> None:
        self.ep.counts["timeouts"] += 1
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is None:
            return  # refused at accept
        self.ep.admission.release(self.peer)
        self.peer = None
        if self.timer is not None:
            self.timer.cancel()

    def pause_writing(self) -> None:  # the client does not read: stop reading its requests
        self.paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.transport is not None:
            self.transport.resume_reading()
            self._serve()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > MAX_HEAD and b"\r\n\r\n" not in self.buf[: MAX_HEAD + 4]:
            self._answer(431, b"request head too large\n", close=True)
            return
        self._serve()

    def _serve(self) -> None:
        while not self.paused and self.transport is not None and b"\r\n\r\n" in self.buf:
            head, _, self.buf = self.buf.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ")
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
                self._answer(400, b"bad request\n", close=True)
                return
            method, target, version = parts
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(b":")
                if not sep:
                    self._answer(400, b"bad header\n", close=True)
                    return
                headers[name.strip().lower()] = value.strip().lower()
            if headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers:
                self._answer(400, b"no request body expected\n", close=True)
                return
            keep = (
                headers.get(b"connection") != b"close"
                if version == b"HTTP/1.1"
                else headers.get(b"connection") == b"keep-alive"
            )
            path = target.split(b"?", 1)[0]
            if method not in (b"GET", b"HEAD"):
                self._answer(405, b"method not allowed\n", close=not keep, head=method == b"HEAD")
            elif path == b"/metrics":
                self._answer(200, self.ep.page(), close=not keep, head=method == b"HEAD", metrics=True)
            elif path == b"/healthz":
                self._answer(200, b"OK\n", close=not keep, head=method == b"HEAD")
            else:
                self._answer(404, b"not found: try /metrics\n", close=not keep, head=method == b"HEAD")
            self._arm()

    def _answer(self, code: int, body: bytes, close: bool, head: bool = False, metrics: bool = False) -> None:
        if code >= 400:
            self.ep.counts["bad_requests"] += 1
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Large"}[code]
        ctype = b"text/plain; version=0.0.4; charset=utf-8" if metrics else b"text/plain; charset=utf-8"
        out = (
            f"HTTP/1.1 {code} {reason}\r\n".encode()
            + b"Content-Type: "
            + ctype
            + f"\r\nContent-Length: {len(body)}\r\nConnection: {'close' if close else 'keep-alive'}\r\n\r\n".encode()
        )
        assert self.transport is not None
        self.transport.write(out if head else out + body)
        if close:
            self.buf = b""
            self.transport.close()
            self.transport = None
