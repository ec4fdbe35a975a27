"""Live release changes on a running daemon: deploy, rollback, shadow runs and canaries.

* **deploy**: verify -> stage into the store -> load and warm beside the serving release
  -> hot-swap (a pointer change: the action stream never stops) -> activate in the store.
* **rollback**: the store's one-step rollback, then the same load-warm-swap.
* **shadow**: a candidate runs on the same observations as the serving policy, on its own
  thread; its actions are never published, only compared (:class:`Divergence`).
* **canary**: a deploy whose first ``window_s`` is watched against the manifest's
  auto-abort thresholds (deadline miss rate, NaN/bound interventions, divergence from the
  previous release, which runs as a shadow meanwhile, heartbeat faults). Crossing one
  swaps back to the previous release (still loaded and warm) and rolls the store back,
  recording why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from vlad.errors import VladError
from vlad.release.loading import LoadedPolicy, compatible, load_policy
from vlad.processing import RawObservation
from vlad.serving.worker import Pending, PolicyWorker
from vlad.daemon.systemd import context as log_context
from vlad.serving.tracing import CycleTimes, LatencyStats

log = logging.getLogger("vlad.deploy")


class Divergence:
    """Pairs two policies' action chunks by observation sequence and accumulates errors."""

    def __init__(self, dim: int, tolerance: float, keep: int = 256) -> None:
        self.tolerance = tolerance
        self._ref: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cand: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.keep = keep
        self.pairs = 0
        self.max_abs = np.zeros(dim)
        self.sum_abs = np.zeros(dim)
        self.values = 0
        self.beyond = 0

    def _add(self, table: OrderedDict, other: OrderedDict, seq: int, actions: np.ndarray, ref_first: bool) -> None:
        with self._lock:
            match = other.pop(seq, None)
            if match is None:
                table[seq] = actions.copy()
                while len(table) > self.keep:
                    table.popitem(last=False)
                return
        ref, cand = (actions, match) if ref_first else (match, actions)
        err = np.abs(cand.astype(np.float64) - ref)
        self.pairs += 1
        self.max_abs = np.maximum(self.max_abs, err.max(axis=0))
        self.sum_abs += err.sum(axis=0)
        self.values += err.shape[0]
        self.beyond += int((err > self.tolerance).sum())

    def reference(self, seq: int, actions: np.ndarray) -> None:
        self._add(self._ref, self._cand, seq, actions, True)

    def candidate(self, seq: int, actions: np.ndarray) -> None:
        self._add(self._cand, self._ref, seq, actions, False)

    @property
    def mean_abs(self) -> float:
        return float(self.sum_abs.sum() / max(1, self.values * len(self.sum_abs)))

    def report(self) -> dict[str, Any]:
        n = max(1, self.values * len(self.sum_abs))
        return {
            "pairs": self.pairs,
            "per_joint_max_abs": [round(float(x), 6) for x in self.max_abs],
            "per_joint_mean_abs": [round(float(x), 6) for x in self.sum_abs / max(1, self.values)],
            "max_abs": round(float(self.max_abs.max(initial=0.0)), 6),
            "mean_abs": round(self.mean_abs, 6),
            "tolerance": self.tolerance,
            "fraction_beyond_tolerance": round(self.beyond / n, 6),
        }


class ShadowSink:
    """Stands where a shadow worker's Publisher would: records, compares, never sends."""

    def __init__(self, divergence: Divergence, window: int = 2000) -> None:
        self.divergence = divergence
        self.stats = LatencyStats(window)
        self.counters: Counter[str] = Counter()

    def publish(self, actions: np.ndarray, obs: RawObservation, t: CycleTimes, source: str, policy: str = "") -> bool:
        t.guard_end = t.publish = time.monotonic_ns()
        self.stats.record(t)
        if not np.isfinite(actions).all():
            self.counters["nonfinite_outputs"] += 1
        self.counters["outputs"] += 1
        self.divergence.candidate(obs.sequence, actions)
        return True

    def publish_hold(self, proprio, obs_seq: int, t_sensor_ns: int, reason: str) -> None:
        self.counters[f"hold_{reason}"] += 1


class NullSink:
    """Where a retired worker's last in-flight chunk goes: nowhere (it must not count)."""

    def publish(self, actions, obs, t, source, policy="") -> bool:
        return False

    def publish_hold(self, proprio, obs_seq, t_sensor_ns, reason) -> None:
        pass


@dataclass
class Shadow:
    """A candidate policy running beside the serving one (see module docstring)."""

    release_id: str
    worker: Any  # PolicyWorker with a ShadowSink
    sink: ShadowSink
    policy: Any  # LoadedPolicy
    purpose: str  # "shadow" or "canary-reference"
    started_ns: int = field(default_factory=time.monotonic_ns)

    def report(self) -> dict[str, Any]:
        w = self.worker
        counters = dict(self.sink.counters)
        for k, v in w.counters.items():
            counters[k] = counters.get(k, 0) + v
        return {
            "release": self.release_id,
            "purpose": self.purpose,
            "running_s": round((time.monotonic_ns() - self.started_ns) / 1e9, 3),
            "divergence": self.sink.divergence.report(),
            "latency_ms": self.sink.stats.summary(),
            "faults": counters,
        }


@dataclass(frozen=True)
class CanaryThresholds:
    window_s: float
    max_deadline_miss_rate: float
    max_interventions: int
    max_divergence: float
    max_heartbeat_faults: int


@dataclass
class Canary:
    """The watch over a freshly deployed release; :meth:`check` says why to abort, if so."""

    release_id: str
    previous_id: str
    thresholds: CanaryThresholds
    start_counters: dict[str, int]
    started_ns: int = field(default_factory=time.monotonic_ns)
    heartbeat_faults: int = 0

    def elapsed_s(self, now_ns: int) -> float:
        return (now_ns - self.started_ns) / 1e9

    def check(self, counters: dict[str, Any], divergence: Divergence | None) -> str | None:
        t = self.thresholds

        def delta(key: str) -> int:
            return int(counters.get(key, 0)) - int(self.start_counters.get(key, 0))

        published = delta("published_release")  # the canary is the release being served
        misses = delta("deadline_misses")
        if published >= 20 and misses / published > t.max_deadline_miss_rate:
            return f"deadline miss rate {misses / published:.3f} > {t.max_deadline_miss_rate}"
        policy = f"release:{self.release_id}"
        interventions = delta(f"nonfinite:{policy}") + delta(f"out_of_bounds:{policy}")
        if interventions > t.max_interventions:
            return f"{interventions} NaN/bound interventions > {t.max_interventions}"
        if divergence is not None and divergence.pairs >= 10 and divergence.mean_abs > t.max_divergence:
            return f"mean divergence from {self.previous_id} {divergence.mean_abs:.4f} > {t.max_divergence}"
        if self.heartbeat_faults > t.max_heartbeat_faults:
            return f"{self.heartbeat_faults} heartbeat faults > {t.max_heartbeat_faults}"
        return None

    def report(self, now_ns: int) -> dict[str, Any]:
        return {"release": self.release_id, "previous": self.previous_id, "elapsed_s": round(self.elapsed_s(now_ns), 3),
                "window_s": self.thresholds.window_s, "heartbeat_faults": self.heartbeat_faults}


class LiveReleases:
    """The daemon's live release operations (a mixin of :class:`vlad.daemon.supervisor.Daemon`, which
    owns the attributes used here: policies, workers, health, publisher, state, shadow,
    canary)."""

    def store(self):
        from vlad.release.store import ReleaseStore

        return ReleaseStore(self.cfg.store.root, self.cfg.release.keys_dir)

    async def _load(self, name: str, folder: Path) -> LoadedPolicy:
        """Verify, load and warm a release beside the serving one (off the event loop)."""
        cfg = self.cfg
        keys_dir = cfg.release.keys_dir if cfg.release.verify else None
        if keys_dir is None:
            backend, artifact, options = cfg.release.backend, cfg.release.artifact, cfg.release.options
        else:  # the signed manifest names them
            backend, artifact, options = "", "", {}
        policy = await anyio.to_thread.run_sync(load_policy, name, folder, backend, artifact, options,
                                                cfg.serve.warmup, keys_dir)
        breaking = compatible(self.contract, policy.contract)
        if breaking:
            policy.session.close()
            raise VladError(f"{policy.release_id} changes the contract ({', '.join(breaking[:5])}): "
                            "controllers would break; deploy it with a restart instead")
        return policy

    def _worker(self, policy: LoadedPolicy, name: str, publisher) -> PolicyWorker:
        w = PolicyWorker(name=name, contract=policy.contract, tokenizer=policy.tokenizer, session=policy.session,
                         release_id=policy.release_id, publisher=publisher)
        w.start()
        return w

    def _install(self, policy: LoadedPolicy, worker: PolicyWorker, reason: str) -> tuple[LoadedPolicy, PolicyWorker]:
        """Make ``policy`` the release being served (a pointer change); returns the old pair."""
        old = (self.policies[0], self.workers[0])
        self.policies[0], self.workers[0] = policy, worker
        self.health.chain[0] = f"release:{policy.release_id}"
        self.health.quarantined.pop(0, None)
        self.release_id = log_context.release = policy.release_id
        self.backend_description = policy.session.describe()
        obs = self.last_obs
        if self.health.active == 0 and obs is not None and time.monotonic_ns() - obs.sensor_time_ns < worker.max_age_ns:
            worker.slot.put(Pending(obs, self.last_observation_ns))
        self.state.record("release", f"{old[0].release_id} -> {policy.release_id}: {reason}",
                          from_release=old[0].release_id, to_release=policy.release_id)
        return old

    async def _retire(self, policy: LoadedPolicy, worker: PolicyWorker | None) -> None:
        if worker is not None:
            worker.publisher = NullSink()  # a cycle still in flight must not publish or count
            await anyio.to_thread.run_sync(worker.stop, self.cfg.serve.shutdown_timeout_s)
        policy.session.close()

    async def deploy(self, path: str, who: str, why: str, canary: bool, force: bool) -> dict[str, Any]:
        """verify -> stage -> load and warm -> activate in the store -> hot-swap."""
        if self.canary is not None:
            raise VladError(f"a canary of {self.canary.release_id} is running; wait for it to pass or abort")
        store = self.store()
        release_id = await anyio.to_thread.run_sync(store.stage, path)
        policy = await self._load("release", store.release_path(release_id))
        try:
            await anyio.to_thread.run_sync(lambda: store.activate(release_id, who, why, force))
        except VladError:
            policy.session.close()
            raise
        thresholds = start = None
        if canary:
            if policy.manifest is None:
                policy.session.close()
                raise VladError("a canary needs a signed release (its manifest holds the canary thresholds)")
            c = policy.manifest.canary
            thresholds = CanaryThresholds(c.window_s, c.max_deadline_miss_rate, c.max_interventions,
                                          c.max_divergence, c.max_heartbeat_faults)
            # Counted from before the swap: the canary's very first chunk already counts.
            start = {k: v for k, v in self.all_counters().items() if isinstance(v, int)}
        worker = self._worker(policy, "release", self.publisher)
        old_policy, old_worker = self._install(policy, worker, f"deploy by {who}: {why}")
        if canary:
            # The previous release keeps running as a shadow: the divergence reference, and
            # the warm policy an abort swaps back to.
            self._start_shadow(old_policy, old_worker, "canary-reference", tolerance=thresholds.max_divergence)
            self.canary = Canary(policy.release_id, old_policy.release_id, thresholds, start)
            self.state.record("canary", f"canary of {policy.release_id} for {thresholds.window_s:g} s", **vars(thresholds))
        else:
            await self._retire(old_policy, old_worker)
        return {"release": policy.release_id, "previous": old_policy.release_id, "canary": canary}

    async def rollback(self, who: str, why: str) -> dict[str, Any]:
        """The store's one-step rollback, then serve that release (loaded and warmed first)."""
        if not why:
            raise VladError("rollback needs a reason (--why)")
        if self.canary is not None:
            return await self._abort_canary(f"rollback by {who}: {why}", who)
        store = self.store()
        target = store.previous()
        if target is None:
            raise VladError("nothing to roll back to: the store has no previous release")
        policy = await self._load("release", store.release_path(target))
        try:
            await anyio.to_thread.run_sync(lambda: store.rollback(who, why))
        except VladError:
            policy.session.close()
            raise
        old_policy, old_worker = self._install(policy, self._worker(policy, "release", self.publisher),
                                               f"rollback by {who}: {why}")
        await self._retire(old_policy, old_worker)
        return {"release": policy.release_id, "rolled_back_from": old_policy.release_id}

    def _start_shadow(self, policy: LoadedPolicy, worker: PolicyWorker | None, purpose: str, tolerance: float) -> None:
        div = Divergence(policy.contract.action.dim, tolerance)
        sink = ShadowSink(div, self.cfg.serve.latency_window)
        if worker is None:
            worker = self._worker(policy, "shadow", sink)
        else:
            worker.publisher, worker.name = sink, "shadow"
        self.shadow = Shadow(policy.release_id, worker, sink, policy, purpose)
        self.publisher.observers.append(div.reference)

    async def _stop_shadow(self) -> Shadow | None:
        shadow, self.shadow = self.shadow, None
        if shadow is not None:
            self.publisher.observers.remove(shadow.sink.divergence.reference)
        return shadow

    async def shadow_start(self, path: str, tolerance: float) -> dict[str, Any]:
        if self.shadow is not None:
            raise VladError(f"a shadow of {self.shadow.release_id} is running ({self.shadow.purpose}); stop it first")
        policy = await self._load("shadow", Path(path))
        self._start_shadow(policy, None, "shadow", tolerance)
        self.state.record("shadow", f"shadow run of {policy.release_id} started")
        return {"shadow": policy.release_id, "tolerance": tolerance}

    async def shadow_stop(self) -> dict[str, Any]:
        if self.shadow is None or self.shadow.purpose != "shadow":
            raise VladError("no shadow run to stop")
        report = self.shadow.report()
        shadow = await self._stop_shadow()
        await self._retire(shadow.policy, shadow.worker)
        self.state.record("shadow", f"shadow run of {shadow.release_id} stopped", pairs=report["divergence"]["pairs"])
        return report

    async def _check_canary(self, findings) -> None:
        canary = self.canary
        if canary is None:
            return
        if any(f.code == "heartbeat_lost" and f"{f.monitor}:{f.code}" not in self._canary_seen for f in findings):
            canary.heartbeat_faults += 1
        self._canary_seen = {f"{f.monitor}:{f.code}" for f in findings}
        quarantined = self.health.quarantined.get(0) if self.health.chain[0] == f"release:{canary.release_id}" else None
        reason = canary.check(self.all_counters(), self.shadow.sink.divergence if self.shadow else None)
        if reason is None and quarantined:
            reason = f"quarantined by the health monitors ({quarantined})"
        if reason is not None:
            await self._abort_canary(reason, "canary")
        elif canary.elapsed_s(time.monotonic_ns()) >= canary.thresholds.window_s:
            self.canary = None
            shadow = await self._stop_shadow()
            self.state.record("canary", f"canary of {canary.release_id} passed after {canary.thresholds.window_s:g} s")
            if shadow is not None:
                await self._retire(shadow.policy, shadow.worker)

    async def _abort_canary(self, reason: str, who: str) -> dict[str, Any]:
        """Swap back to the previous release (still warm in the shadow) and roll the store back."""
        canary, self.canary = self.canary, None
        shadow = await self._stop_shadow()
        shadow.worker.publisher, shadow.worker.name = self.publisher, "release"
        bad_policy, bad_worker = self._install(shadow.policy, shadow.worker, f"canary aborted: {reason}")
        # The faults that moved us down the chain came from the canary, which is gone: the
        # previous release serves at once (the next monitor tick re-judges everything else).
        if self.health.active != 0:
            before, self.health.active = self.health.active, 0
            self._swap(before, 0)
        self.state.record("canary_abort", f"canary of {canary.release_id} aborted: {reason}", release=canary.release_id)
        try:
            await anyio.to_thread.run_sync(lambda: self.store().rollback(who, f"canary aborted: {reason}"))
        except VladError as exc:
            log.error("canary aborted but the store could not roll back: %s", exc)
        await self._retire(bad_policy, bad_worker)
        return {"release": shadow.policy.release_id, "aborted": canary.release_id, "reason": reason}

