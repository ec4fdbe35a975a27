"""Health monitor for remote policies: an unreachable, slow or failing inference server.

It reads ``view.backend_stats`` (each loaded policy's ``Session.stats()``, keyed by a
policy id with ``.slot`` and ``.release``) and looks only at the remote ones
(``SessionStats.remote``, see :mod:`vlad_kserve.stats`). Findings are ``system`` scoped: a
network or a server in trouble is not the policy's fault, so the supervisor falls back
without quarantining. ``remote_unreachable`` carries a healthy window of 0: the session's
prober marks the link "connected" only after a run of answers within the deadline
(``recover_after``, doubled after a relapse; :mod:`vlad_kserve.stats`), and that run is
the hysteresis, so the remote policy serves again at the next monitor tick.

* ``remote_unreachable`` (fault): the link is lost;
* ``remote_slow`` (warn): rolling network p99 above ``slow_fraction`` of the contract's
  end-to-end deadline (the network alone eats most of the budget);
* ``remote_errors`` (warn): more than ``error_rate_warn`` of the recent requests failed.

Its thresholds are the ``[monitors.remote]`` table of the daemon config
(:class:`RemoteLinkSettings`, parsed by the config parser like every section).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlad.health.base import Finding, HealthView, Monitor
from vlad.schema import bounded


@dataclass(frozen=True)
class RemoteLinkSettings:
    """``[monitors.remote]``: when a reachable link is slow or failing (warnings)."""

    # Network p99 above this fraction of the contract's end-to-end deadline: remote_slow.
    slow_fraction: float = field(default=0.5, metadata=bounded(0.01, 10.0))
    # More than this fraction of the recent requests failed: remote_errors.
    error_rate_warn: float = field(default=0.05, metadata=bounded(0.0, 1.0))
    # Requests in the link's window before either rate is judged.
    min_samples: int = field(default=20, metadata=bounded(1, 1_000_000))


class RemoteLinkMonitor(Monitor):
    """Remote-link findings from each remote policy's session stats."""

    name = "remote"
    Settings = RemoteLinkSettings

    def __init__(self, settings: RemoteLinkSettings | None = None) -> None:
        self.settings: RemoteLinkSettings = settings or RemoteLinkSettings()

    def check(self, view: HealthView) -> list[Finding]:
        """Findings for every remote policy whose link is lost, slow or failing."""
        out: list[Finding] = []
        t = self.settings
        budget_ms = view.deadline_ns / 1e6 * t.slow_fraction
        for pid, s in view.backend_stats.items():
            if not s.remote:
                continue
            who = pid
            where = s.endpoint or "the server"
            if s.lost:
                out.append(
                    Finding(
                        self.name,
                        "remote_unreachable",
                        "fault",
                        "system",
                        f"{who}: {where} unreachable for {s.state_for_s:.1f} s ({s.last_error})",
                        s.state_for_s,
                        None,
                        policy=who,
                        healthy_window_ns=0,
                    )
                )
                continue
            net = s.network_ms or s.round_trip_ms
            if net and net.count >= t.min_samples and net.p99 > budget_ms:
                out.append(
                    Finding(
                        self.name,
                        "remote_slow",
                        "warn",
                        "system",
                        f"{who}: network p99 {net.p99:.1f} ms to {where}, over {t.slow_fraction:.0%} of the "
                        f"{view.deadline_ns / 1e6:g} ms deadline",
                        net.p99,
                        budget_ms,
                        policy=who,
                    )
                )
            if s.window >= t.min_samples and s.error_rate > t.error_rate_warn:
                out.append(
                    Finding(
                        self.name,
                        "remote_errors",
                        "warn",
                        "system",
                        f"{who}: {s.error_rate:.0%} of the last {s.window} requests to {where} failed",
                        s.error_rate,
                        t.error_rate_warn,
                        policy=who,
                    )
                )
        return out
