"""What ``vladctl status`` shows and the status socket publishes: one JSON-able dict.

Built on the event loop from snapshots of the serving thread's counters (no locks on the
hot path). The ``counters`` map keeps the flat names earlier versions published
(``published``, ``stale``, ``superseded``, ``rejected`` by reason ...), so dashboards and
scripts keep working; ``policies`` has every loaded policy's own counters.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from vlad import __version__

if TYPE_CHECKING:
    from vlad.daemon.supervisor import Daemon


class Rates:
    """Observations and actions per second, over at least half a second."""

    def __init__(self) -> None:
        self._prev = (time.monotonic_ns(), 0, 0)
        self.value = {"observations_hz": 0.0, "actions_hz": 0.0}

    def update(self, now: int, observations: int, actions: int) -> dict[str, float]:
        t_prev, obs_prev, act_prev = self._prev
        dt = (now - t_prev) / 1e9
        if dt >= 0.5:
            self.value = {
                "observations_hz": round((observations - obs_prev) / dt, 2),
                "actions_hz": round((actions - act_prev) / dt, 2),
            }
            self._prev = (now, observations, actions)
        return self.value


def counters(d: Daemon) -> dict[str, Any]:
    """The flat counter map (names kept stable across versions)."""
    intake, pub = d.intake.counts.snapshot(), d.publisher.counts.snapshot()
    policies = [p.served.counts for p in d.chain.policies]
    out: dict[str, Any] = {
        "messages": intake.messages,
        "observations": intake.observations,
        "heartbeats": intake.heartbeats,
        "superseded": intake.superseded,
        "input_rejected": intake.input_rejected,
        "reanchors": intake.reanchors + d.guard.reanchors,
        "published": pub.policy_chunks,
        "published_hold": sum(pub.holds.values()),
        "holds": dict(pub.holds),
        "interventions": pub.interventions,
        "deadline_misses": pub.deadline_misses,
        "bridged": d.cadence.bridged,
        "cycle_errors": d.loop.cycle_errors + sum(c.cycle_errors for c in policies),
    }
    for attr in ("stale", "backend_errors", "remote_errors", "expired", "estop_blocked"):
        out[attr] = sum(getattr(c, attr) for c in policies)
    for kind, n in d.guard.counts.items():
        out[f"guard_{kind}"] = n
    rejected = dict(intake.rejected)
    for role, n in d.gatekeeper.denied.items():
        rejected[f"unauthorized_{role}"] = n
    rejected.update({f"control_{k}": v for k, v in d.control_rejected.items()})
    if d.estop.counts.get("garbled"):
        rejected["estop_garbled"] = d.estop.counts["garbled"]
    out["rejected"] = rejected
    return out


def build(d: Daemon) -> dict[str, Any]:
    now = time.monotonic_ns()
    c = counters(d)
    rates = d.rates.update(now, c["observations"], c["published"] + c["published_hold"])
    release = d.chain.release
    desc = release.served.session.describe()
    latency = d.stats.summary()
    health = d.chain.health
    serving = d.chain.serving
    policies = {str(p.id): p.served.counts.to_dict() for p in d.chain.policies}
    backend_stats = {str(p.id): dict(p.served.session.stats()) for p in d.chain.policies}
    return {
        "version": __version__,
        "pid": os.getpid(),
        "state": d.state.state.value,
        "state_since_s": round((now - d.state.since_ns) / 1e9, 3),
        "uptime_s": round((now - d.started_ns) / 1e9, 3),
        "release": release.id.release,
        "serving": str(health.chain[health.active]),
        "serving_backend": serving.served.session.describe().backend if serving else "hold",
        "chain": [str(p) for p in health.chain],
        "quarantined": {str(health.chain[i]): code for i, code in health.quarantined.items()},
        "estop": {
            "engaged": d.estop.engaged,
            "source": d.estop.source,
            "reason": d.estop.reason,
            "counts": dict(d.estop.counts),
        },
        "findings": [f.to_dict() for f in d.findings],
        "swaps_ms": list(d.publisher.swap_ms),
        "shadow": d.releases.shadow.report() if d.releases.shadow else None,
        "canary": d.releases.canary.report(now) if d.releases.canary else None,
        "backend": {
            "name": desc.backend,
            "runtime": f"{desc.runtime} {desc.runtime_version}",
            "device": desc.device,
            "providers": list(desc.providers),
            "precision": desc.precision,
            "stats": backend_stats.get(str(release.id), {}),
        },
        "backend_stats": backend_stats,
        "control_period_ms": d.contract.timing.control_period_ms,
        "rates": rates,
        "counters": c,
        "policies": policies,
        "heartbeat_age_s": round((now - d.intake.last_heartbeat_ns) / 1e9, 3) if d.intake.last_heartbeat_ns else None,
        "latency_ms": latency,
        "engine_ms": latency.get("engine"),
        "temperatures_c": {k[len("temperature.") :]: v for k, v in d.readings.items() if k.startswith("temperature.")},
        "memory": {
            "host_rss_bytes": int(d.readings.get("memory.rss_bytes", 0))
            or release.served.session.memory().host_rss_bytes,
            # Per loaded policy (measured at its load), the sum and the [memory] budget.
            **d.releases.budget.to_dict(d.releases.loaded_memory()),
        },
        "realtime": d.realtime_report,
        "openpi": d.openpi.report() if d.openpi is not None else None,
    }
