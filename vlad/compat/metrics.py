"""Prometheus metrics: ``[metrics]``, text exposition over HTTP on a local address or a unix socket.

Nothing here touches the hot path. The collector reads, at scrape time:

* the newest status snapshot the daemon built on its event loop (``Daemon.last_status``,
  at ``serve.status_hz``): state, release, counters, per-policy counters, findings,
  e-stop, latency percentiles over the rolling window;
* the monitor readings (``Daemon.readings``: temperatures, memory), swapped in whole by
  the health task;
* the per-stage latency ring buffers (:class:`vlad.serving.tracing.LatencyStats`), folded
  into cumulative histograms by a 1 s tick of this module's thread and at each scrape, so
  no sample is lost unless more than ``serve.latency_window`` cycles happen in a second
  (counted in ``vlad_latency_samples_lost_total``);
* the state machine's event history, folded the same way into event and transition
  counters (fallbacks, swaps, faults, rollbacks).

Names follow Prometheus conventions: ``vlad_`` prefix, base units (seconds, bytes,
celsius) in the name, ``_total`` for counters.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vlad.config import MetricsConfig, parse_listen
from vlad.errors import StartupError
from vlad.health.state import State
from vlad.serving.tracing import STAGES

if TYPE_CHECKING:
    from vlad.daemon.supervisor import Daemon

log = logging.getLogger("vlad.metrics")

# Seconds. The demo's e2e is ~3 ms; a remote or GPU policy tens of ms; a hang seconds.
BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
TICK_S = 1.0


class _Histograms:
    """Cumulative per-stage histograms fed from the rolling windows (module doc)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.lock = threading.Lock()
        self.edges = np.asarray(BUCKETS) * 1e3  # the windows hold milliseconds
        self.seen = dict.fromkeys(STAGES, 0)
        self.buckets = {s: np.zeros(len(BUCKETS) + 1, dtype=np.int64) for s in STAGES}  # last: +Inf
        self.sum_s = dict.fromkeys(STAGES, 0.0)
        self.count = dict.fromkeys(STAGES, 0)
        self.lost = dict.fromkeys(STAGES, 0)
        # Events folded from the state machine's history.
        self.events: Counter[str] = Counter()
        self.transitions: Counter[str] = Counter()
        self.last_event_ns = daemon.started_ns - 1

    def fold(self) -> None:
        stats = self.daemon.stats
        with self.lock:
            for stage in STAGES:
                samples, total, lost = stats.since(stage, self.seen[stage])
                self.seen[stage] = total
                self.lost[stage] += lost
                if samples.size:
                    idx = np.searchsorted(self.edges, samples, side="left")  # le-bucket of each sample
                    self.buckets[stage] += np.bincount(idx, minlength=len(BUCKETS) + 1)
                    self.sum_s[stage] += float(samples.sum()) / 1e3
                    self.count[stage] += int(samples.size)
            for ev in self.daemon.state.recent(10_000):
                if ev.monotonic_ns <= self.last_event_ns:
                    continue
                self.last_event_ns = ev.monotonic_ns
                if ev.kind == "transition":
                    self.transitions[ev.state_to] += 1
                else:
                    self.events[ev.kind] += 1


class VladCollector:
    """A custom collector: metric families built from the daemon's snapshots at scrape time."""

    def __init__(self, daemon: Daemon, histograms: _Histograms) -> None:
        self.daemon = daemon
        self.h = histograms

    def describe(self) -> list:
        return []  # families vary with the daemon's state (policies, reasons): no fixed description

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            InfoMetricFamily,
        )

        d = self.daemon
        self.h.fold()
        st = d.last_status
        now = time.monotonic_ns()

        def gauge(
            name: str,
            doc: str,
            value: float | None = None,
            labels: list[str] | None = None,
            samples: list[tuple[list[str], float]] | None = None,
        ) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, value=value, labels=labels)
            for lv, v in samples or ():
                g.add_metric(lv, v)
            return g

        def counter(
            name: str,
            doc: str,
            value: float | None = None,
            labels: list[str] | None = None,
            samples: list[tuple[list[str], float]] | None = None,
        ) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, value=value, labels=labels)
            for lv, v in samples or ():
                c.add_metric(lv, v)
            return c

        yield gauge("vlad_up", "1 while the daemon serves metrics", 1)
        yield gauge("vlad_uptime_seconds", "seconds since the daemon started", (now - d.started_ns) / 1e9)
        state = d.state.state.value
        yield gauge(
            "vlad_state",
            "supervisor state: 1 for the current one",
            labels=["state"],
            samples=[([s.value], 1.0 if s.value == state else 0.0) for s in State],
        )
        yield gauge("vlad_state_since_seconds", "seconds in the current state", (now - d.state.since_ns) / 1e9)
        yield gauge("vlad_estop_engaged", "1 while the external e-stop is engaged", 1.0 if d.estop.engaged else 0.0)

        with self.h.lock:
            yield counter(
                "vlad_state_transitions_total",
                "state transitions by target state (FALLBACK: fallbacks)",
                labels=["to"],
                samples=[([k], v) for k, v in sorted(self.h.transitions.items())],
            )
            yield counter(
                "vlad_events_total",
                "recorded events by kind (swap, fault, quarantine, release, canary_abort, operator ...)",
                labels=["kind"],
                samples=[([k], v) for k, v in sorted(self.h.events.items())],
            )
            hist = HistogramMetricFamily(
                "vlad_latency_seconds",
                "per-stage latency of published policy chunks (stages as in docs/protocol.md timings_ms)",
                labels=["stage"],
            )
            for stage in STAGES:
                if not self.h.count[stage]:
                    continue
                cum = np.cumsum(self.h.buckets[stage])
                buckets = [(f"{b:g}", float(c)) for b, c in zip(BUCKETS, cum[:-1], strict=True)]
                buckets.append(("+Inf", float(cum[-1])))
                hist.add_metric([stage], buckets, self.h.sum_s[stage])
            yield hist
            yield counter(
                "vlad_latency_samples_lost_total",
                "latency samples overwritten before the metrics thread read them",
                labels=["stage"],
                samples=[([s], v) for s, v in self.h.lost.items() if v],
            )

        readings = d.readings
        yield gauge(
            "vlad_temperature_celsius",
            "temperatures the health sensors read",
            labels=["sensor"],
            samples=[
                ([k[len("temperature.") :]], v) for k, v in sorted(readings.items()) if k.startswith("temperature.")
            ],
        )
        yield gauge(
            "vlad_memory_bytes",
            "memory readings (rss, host available, GPU used/total)",
            labels=["kind"],
            samples=[
                ([k[len("memory.") :].removesuffix("_bytes")], v)
                for k, v in sorted(readings.items())
                if k.startswith("memory.")
            ],
        )

        if st is None:
            return  # the first status is built within 1 / serve.status_hz of the start
        yield gauge(
            "vlad_status_age_seconds",
            "age of the status snapshot these metrics come from",
            max(0.0, (now - d.started_ns) / 1e9 - st["uptime_s"]),
        )
        backend = st.get("backend", {})
        info = InfoMetricFamily("vlad_release", "the release being served and where", labels=None)
        info.add_metric(
            [],
            {
                "release": st["release"],
                "serving": st["serving"],
                "backend": backend.get("name", ""),
                "runtime": backend.get("runtime", ""),
                "device": str(backend.get("device", "")),
                "version": st["version"],
            },
        )
        yield info
        yield gauge(
            "vlad_fallback_active",
            "1 while a fallback (or the hold posture) serves instead of the release",
            0.0 if st["serving"] == st["chain"][0] else 1.0,
        )
        yield gauge(
            "vlad_findings",
            "active health findings",
            labels=["monitor", "code", "severity"],
            samples=[([f["monitor"], f["code"], f["severity"]], 1.0) for f in st["findings"]],
        )
        c = st["counters"]
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
            yield counter(f"vlad_{key}_total", doc, c.get(key, 0))
        yield counter(
            "vlad_holds_total",
            "hold postures published, by reason",
            labels=["reason"],
            samples=[([k], v) for k, v in sorted(c["holds"].items())],
        )
        yield counter(
            "vlad_rejections_total",
            "messages refused, by reason (docs/protocol.md)",
            labels=["reason"],
            samples=[([k], v) for k, v in sorted(c["rejected"].items())],
        )
        yield counter(
            "vlad_guard_interventions_total",
            "final-guard corrections, by kind",
            labels=["kind"],
            samples=[([k[len("guard_") :]], v) for k, v in sorted(c.items()) if k.startswith("guard_")],
        )
        per_policy: dict[str, list[tuple[list[str], float]]] = {}
        for policy, counts in st["policies"].items():
            for key, value in counts.items():
                if isinstance(value, (int, float)):
                    per_policy.setdefault(key, []).append(([policy], value))
        for key, samples in sorted(per_policy.items()):
            yield counter(
                f"vlad_policy_{key}_total", f"per policy: {key.replace('_', ' ')}", labels=["policy"], samples=samples
            )
        yield gauge(
            "vlad_observations_per_second",
            "observation rate over the last status period",
            st["rates"]["observations_hz"],
        )
        yield gauge(
            "vlad_actions_per_second",
            "action chunk rate (policy and hold) over the last status period",
            st["rates"]["actions_hz"],
        )
        q = gauge(
            "vlad_latency_window_seconds",
            "per-stage latency percentiles over the rolling window",
            labels=["stage", "quantile"],
        )
        for stage, v in st["latency_ms"].items():
            for name, quant in (("p50", "0.5"), ("p95", "0.95"), ("p99", "0.99"), ("max", "1")):
                q.add_metric([stage, quant], v[name] / 1e3)
        yield q
        o = st.get("openpi")
        if o:
            yield gauge("vlad_openpi_clients", "openpi websocket clients connected", o.get("clients", 0))
            yield counter("vlad_openpi_requests_total", "openpi requests received", o.get("requests", 0))
            yield counter(
                "vlad_openpi_replies_total", "openpi requests answered with a policy chunk", o.get("replies", 0)
            )
            yield counter(
                "vlad_openpi_errors_total",
                "openpi requests answered with an error, and refused connections, by reason",
                labels=["reason"],
                samples=[([k], v) for k, v in sorted(o.get("errors", {}).items())],
            )


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _TCPHTTPServer(ThreadingHTTPServer):
    daemon_threads = True


class _TCP6HTTPServer(_TCPHTTPServer):
    address_family = socket.AF_INET6


class MetricsServer:
    """The HTTP endpoint and the fold tick, on their own threads."""

    def __init__(self, cfg: MetricsConfig, daemon: Daemon) -> None:
        from prometheus_client import CollectorRegistry

        self.cfg = cfg
        self.listen = parse_listen(cfg.listen)
        self.histograms = _Histograms(daemon)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(VladCollector(daemon, self.histograms))
        self._server: socketserver.BaseServer | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        from prometheus_client.exposition import MetricsHandler

        handler = MetricsHandler.factory(self.registry)
        try:
            if self.listen.unix:
                Path(self.listen.path).unlink(missing_ok=True)
                self._server = _UnixHTTPServer(self.listen.path, handler)
            else:
                cls = _TCP6HTTPServer if ":" in self.listen.host else _TCPHTTPServer
                self._server = cls((self.listen.host, self.listen.port), handler)
        except OSError as exc:
            raise StartupError(f"metrics: cannot listen on {self.listen}: {exc.strerror or exc}") from None
        for name, target in (("vlad-metrics", self._server.serve_forever), ("vlad-metrics-fold", self._tick)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("metrics on http://%s/metrics", self.listen)

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.histograms.fold()
            except Exception:  # a bug here must not end the metrics, nor the daemon
                log.exception("metrics fold failed")

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.listen.unix:
            Path(self.listen.path).unlink(missing_ok=True)
        for t in self._threads:
            t.join(2.0)
