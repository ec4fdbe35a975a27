"""Live release changes on a running daemon: deploy, rollback, shadow runs and canaries.

* **deploy**: authenticate (the signature checked and the manifest parsed, once) -> plan
  the memory from that manifest -> stage into the store (each artifact hashed once, while
  copied; the gate evidence judged once, on the copy) -> admit (the store's evidence rule,
  :mod:`vlad.release.evidence`, applied once) -> load and warm beside the serving release
  -> activate in the store -> hot-swap (a pointer change: the action stream never stops).
  The staging's :class:`~vlad.release.store.StagedRelease` and the admission made of it
  are what the loader and the store's switch take: neither verifies, parses or judges
  again. Each multi-second step is progress in the status (``operation``) and the log.
* **rollback**: the same path (:meth:`ReleaseManager._bring_in`) with the store's previous
  release, verified once in the store instead of staged, and the store's one-step
  rollback instead of an activation. The way back is never blocked by the previous
  release's validity date (recorded as an event); a target without passing gate evidence
  needs ``force`` and a reason, like an activation.
* **evidence** of the serving release, for the status: ``passed``, ``forced`` (the store's
  journal holds who overrode what, and why) or ``unverified``. A daemon started on a
  release that has neither passing evidence nor a recorded override serves it (refusing
  would leave the robot without its policy and without vlad's hold posture and status)
  but says so loudly: an error in the log at start, an event, ``evidence.status =
  "unverified"`` in every status with the chunks it published so.
* **shadow**: a candidate runs on the same observations as the serving policy, on its own
  thread; its actions are never published, only compared.
* **canary**: a deploy whose first ``window_s`` is watched against the manifest's
  auto-abort thresholds (deadline miss rate, NaN/bound interventions, divergence from the
  previous release, which runs as a shadow meanwhile, heartbeat faults). Crossing one
  swaps back to the previous release (still loaded and warm) and rolls the store back,
  recording why.

Release operations run one at a time (the control registry holds the release lock);
store I/O, verification, loading and warm-up all run in worker threads, off the loop.
Each first checks that the release fits in memory beside what is loaded
(:mod:`vlad.daemon.memory`): refused with the numbers, or, for a deploy or rollback with
``memory.swap = "fallback"``, done by serving the fallback chain while it loads.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio

from vlad.config import Config
from vlad.daemon.chain import ChainPolicy, PolicyChain, served
from vlad.daemon.memory import (
    MemoryBudget,
    Plan,
    PolicyMemory,
    claimed_manifest,
    measured_load,
    stated_need,
    swap_gap,
)
from vlad.errors import VladError
from vlad.health.base import Finding
from vlad.health.state import StateMachine
from vlad.release.loading import LoadedPolicy, PolicySource, compatible, load_policy
from vlad.release.manifest import Manifest
from vlad.release.signing import authenticate
from vlad.release.store import HistoryEntry, ReleaseStore, StagedRelease
from vlad.schema import LINE_MAX_LEN, one_line
from vlad.serving.policy import ServedPolicy
from vlad.serving.publisher import Publisher
from vlad.serving.shadow import ShadowRun
from vlad.snapshot import CanaryStatus, Evidence, Operation, plain

log = logging.getLogger("vlad.releases")


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

    policy: ServedPolicy
    previous: ChainPolicy
    thresholds: CanaryThresholds
    started_ns: int = field(default_factory=time.monotonic_ns)
    heartbeat_faults: int = 0

    def elapsed_s(self, now_ns: int) -> float:
        return (now_ns - self.started_ns) / 1e9

    def check(self, shadow: ShadowRun | None) -> str | None:
        t, c = self.thresholds, self.policy.counts  # counted from the canary's first cycle
        if c.published >= 20 and c.deadline_misses / c.published > t.max_deadline_miss_rate:
            return f"deadline miss rate {c.deadline_misses / c.published:.3f} > {t.max_deadline_miss_rate}"
        interventions = c.nonfinite_outputs + c.out_of_bounds
        if interventions > t.max_interventions:
            return f"{interventions} NaN/bound interventions > {t.max_interventions}"
        d = shadow.divergence if shadow is not None else None
        if d is not None and d.pairs >= 10 and d.mean_abs > t.max_divergence:
            return f"mean divergence from {self.previous.id.release} {d.mean_abs:.4f} > {t.max_divergence}"
        if self.heartbeat_faults > t.max_heartbeat_faults:
            return f"{self.heartbeat_faults} heartbeat faults > {t.max_heartbeat_faults}"
        return None

    def status(self, now_ns: int) -> CanaryStatus:
        return CanaryStatus(
            release=self.policy.id.release,
            previous=self.previous.id.release,
            elapsed_s=round(self.elapsed_s(now_ns), 3),
            window_s=self.thresholds.window_s,
            heartbeat_faults=self.heartbeat_faults,
        )


class ReleaseManager:
    """Deploy, rollback, shadow and canary on top of the :class:`PolicyChain`."""

    def __init__(
        self,
        cfg: Config,
        chain: PolicyChain,
        publisher: Publisher,
        state: StateMachine,
    ) -> None:
        self.cfg = cfg
        self.chain = chain
        self.publisher = publisher
        self.state = state
        self.shadow: ShadowRun | None = None
        self.canary: Canary | None = None
        self._seen_findings: set[tuple] = set()
        m = cfg.memory
        self.budget = MemoryBudget(m.host_budget_mb, m.device_budget_mb, m.swap)
        self.shadow_memory: PolicyMemory | None = None
        # The release operation in progress, for the status: what, since when, its last step.
        self.operation: dict[str, Any] | None = None
        self.evidence = self._evidence_of(chain.release.loaded)
        if self.evidence.status == "unverified":
            message = (
                f"release {self.evidence.release} serves WITHOUT passing gate evidence and without a recorded "
                f"override ({'; '.join(self.evidence.problems[:4])}): gate it, or activate it with "
                "--force --why to record the decision"
            )
            log.error(message)
            state.record("release_unverified", message, problems=list(self.evidence.problems))

    async def close(self) -> None:
        """Stop a shadow run's thread (at shutdown, from the supervisor's exit stack)."""
        run = self.shadow
        if run is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(run.stop, self.cfg.serve.shutdown_timeout_s)

    def store(self) -> ReleaseStore:
        s = self.cfg.store
        return ReleaseStore(s.root, self.cfg.release.keys_dir, lock_timeout_s=s.lock_timeout_s)

    async def history(self) -> list[dict[str, Any]]:
        """Activations and rollbacks (reads the journal only: no lock, no recovery)."""
        s = self.cfg.store

        def read() -> list[dict[str, Any]]:
            store = ReleaseStore(s.root, self.cfg.release.keys_dir, create=False, recover=False)
            return [dataclasses.asdict(e) for e in store.history()]

        return await self._in_thread(read)

    async def _in_thread(self, fn: Callable[[], Any]) -> Any:
        return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)

    async def _load(
        self, folder: Path, check_time: bool = True, staged: StagedRelease | None = None
    ) -> tuple[LoadedPolicy, PolicyMemory]:
        """Load and warm a release beside the serving one (off the event loop), with the
        memory its load measured. ``staged``: the release as this operation staged and
        verified it, loaded as it is; otherwise the folder is verified here (signed) or
        run as configured (``release.verify = false``)."""
        r = self.cfg.release
        keys_dir = r.keys_dir if r.verify else None
        source = PolicySource(
            folder,
            keys_dir,
            *(("", "", {}) if keys_dir else (r.backend, r.artifact, r.options)),
            site_options=r.site_options,
            check_time=check_time,
            staged=staged if keys_dir else None,
        )
        policy, memory = await self._in_thread(
            lambda: measured_load(lambda: load_policy(source, self.cfg.serve.warmup, self._progress))
        )
        breaking = compatible(self.chain.release.loaded.contract, policy.contract)
        if breaking:
            policy.session.close()
            raise VladError(
                f"{policy.release_id} changes the contract ({', '.join(breaking[:5])}): "
                "controllers would break; deploy it with a restart instead"
            )
        for note in policy.notes:
            self.state.record("release_note", note, release=policy.release_id)
        return policy, memory

    # -- memory ----------------------------------------------------------------------------

    def loaded_memory(self) -> dict[str, PolicyMemory]:
        """What every loaded policy holds: the chain's and a shadow's (status, planning)."""
        out = {str(p.id): p.memory or PolicyMemory(0, 0, "not measured") for p in self.chain.policies}
        if self.shadow is not None and self.shadow_memory is not None:
            out[str(self.shadow.policy.id)] = self.shadow_memory
        return out

    def _plan(self, operation: str, folder: Path, manifest: Manifest | None, replaces: bool) -> Plan:
        """Refuse (with the numbers) what would not fit beside the loaded policies; say when
        the release must be swapped in instead (see :mod:`vlad.daemon.memory`)."""
        need = stated_need(folder, manifest)
        release = str(self.chain.release.id) if replaces else None
        return self.budget.plan(operation, str(folder), need, self.loaded_memory(), release)

    async def _swap_out(self, incoming: str) -> tuple[int, ChainPolicy]:
        """Serve the fallback chain and close the serving release, to make room for ``incoming``."""
        health, old = self.chain.health, self.chain.release
        health.quarantined[0] = "memory_swap"  # never re-activated while it is closed
        t0 = time.monotonic_ns()
        self.chain.serve(health.best_allowed())
        self._progress(f"closing {old.id} to make room (memory.swap)")
        await self._retire(old)
        serving = health.chain[health.active]
        self.state.record("memory_swap", f"{old.id} closed to make room for {incoming}; {serving} serves meanwhile")
        return t0, old

    async def _swap_back(self, swapped: tuple[int, ChainPolicy] | None) -> None:
        """After a failed swap: load the closed release again (the fallback serves until then)."""
        if swapped is None:
            return
        old = swapped[1]
        try:
            loaded, memory = await self._load(old.loaded.folder, check_time=False)  # a new load: verified afresh
        except VladError as exc:
            self.state.record("memory_swap", f"{old.id} could not be loaded again ({exc}); the fallback chain serves")
            return
        self.chain.install(ChainPolicy.of(loaded, "release", memory), "swap failed")
        self.chain.serve(0)

    def _swapped_in(self, swapped: tuple[int, ChainPolicy]) -> float:
        self.chain.serve(0)
        gap = swap_gap(swapped[0])
        self.state.record("memory_swap", f"{self.chain.release.id} serves after {gap:.3f} s on the fallback chain")
        return gap

    async def _retire(self, policy: ChainPolicy | ShadowRun | None) -> None:
        """Close a policy that no longer serves, once no thread runs it any more."""
        if policy is None:
            return
        timeout = self.cfg.serve.shutdown_timeout_s
        if isinstance(policy, ShadowRun):
            finished = await self._in_thread(lambda: policy.stop(timeout))
            session = policy.policy.session
        else:
            policy.served.retired = True  # a chunk still in flight from it is dropped, not sent
            finished = await self._in_thread(lambda: self.chain.loop.wait_not_running(policy.served, timeout))
            session = policy.served.session
        if not finished:
            log.error("%s: an inference still runs after %.1f s; its session is left open", policy, timeout)
            return
        await self._in_thread(session.close)

    # -- deploy and rollback ---------------------------------------------------------------

    def _begin(self, kind: str, target: str) -> None:
        self.operation = {"kind": kind, "target": target, "started_ns": time.monotonic_ns(), "step": "starting"}

    def _progress(self, line: str) -> None:
        """A step of the release operation in progress (called from its worker thread)."""
        op = self.operation
        if op is not None and line:
            self.operation = {**op, "step": line}
            log.info("%s %s: %s", op["kind"], op["target"], line)

    def operation_status(self, now_ns: int) -> Operation | None:
        op = self.operation
        if op is None:
            return None
        return Operation(
            kind=op["kind"], target=op["target"], step=op["step"], elapsed_s=round((now_ns - op["started_ns"]) / 1e9, 1)
        )

    async def deploy(self, path: str, who: str, why: str, canary: bool, force: bool) -> dict[str, Any]:
        """verify and stage -> evidence -> load and warm -> activate in the store -> hot-swap."""
        if self.canary is not None:
            raise VladError(f"a canary of {self.canary.policy.id.release} is running; wait for it to pass or abort")
        if canary and self.shadow is not None:
            raise VladError(f"a shadow of {self.shadow.policy.id.release} is running; stop it before a canary")
        return await self._bring_in("deploy", path, who, why, force, canary)

    async def rollback(self, who: str, why: str, force: bool = False) -> dict[str, Any]:
        """The store's one-step rollback, then serve that release (loaded and warmed first)."""
        if self.canary is not None:
            return await self.abort_canary(f"rollback by {who}: {why}", who)
        store = await self._in_thread(self.store)
        target = store.previous()
        if target is None:
            raise VladError("nothing to roll back to: the store has no previous release")
        return await self._bring_in("rollback", target, who, why, force)

    async def _bring_in(
        self, kind: Literal["deploy", "rollback"], target: str, who: str, why: str, force: bool, canary: bool = False
    ) -> dict[str, Any]:
        """Deploy (``target``: a release folder) or roll back (``target``: the store's
        previous release) in one pass: authenticate -> plan the memory -> stage (or verify
        the store's copy) -> admit (the evidence rule) -> load and warm -> activate or roll
        back in the store -> hot-swap. The release is verified once, by the store, into one
        :class:`~vlad.release.store.StagedRelease` that the loader and the store's switch
        take as it is: the signature is checked and the manifest parsed once, the evidence
        judged once."""
        self._begin(kind, target)
        try:
            store = await self._in_thread(self.store)
            folder = Path(target) if kind == "deploy" else store.release_path(target)
            # The one signature check and manifest parse of the operation: the memory plan
            # reads the need from it before a byte of the release is copied or hashed.
            signed = await self._in_thread(lambda: authenticate(folder, self.cfg.release.keys_dir))
            plan = self._plan("canary" if canary else kind, folder, signed.manifest, replaces=not canary)
            if kind == "deploy":
                staged = await self._in_thread(lambda: store.stage_release(signed, progress=self._progress))
                retry = f"vladctl deploy {target} --force --why '...'"
            else:
                staged = await self._in_thread(lambda: store.verify_staged(signed, progress=self._progress))
                retry = "vladctl rollback --force --why '...'"
            # The store's rule, applied before a second is spent loading; the store's switch
            # below records this admission as it is.
            self._progress("checking gate evidence")
            admission = store.admit(staged, who, why, force=force, retry=retry)
            swapped = await self._swap_out(staged.id) if plan.action == "swap" else None
            try:
                loaded, memory = await self._load(staged.path, check_time=kind == "deploy", staged=staged)
            except BaseException:
                await self._swap_back(swapped)
                raise
            try:
                if canary and loaded.manifest is None:
                    raise VladError("a canary needs a signed release (its manifest holds the canary thresholds)")
                if kind == "deploy":
                    self._progress("activating in the store")
                    entry = await self._in_thread(lambda: store.activate(admission))
                else:
                    self._progress("rolling back in the store")
                    entry = await self._in_thread(lambda: store.rollback(admission=admission))
            except BaseException:
                loaded.session.close()
                await self._swap_back(swapped)
                raise
        finally:
            self.operation = None
        self._note_forced(entry, kind)
        new = ChainPolicy.of(loaded, "release", memory)
        old = self.chain.install(new, f"{kind} by {who}: {why}")
        self.evidence = self._evidence_of(loaded, entry)
        result: dict[str, Any] = {"release": new.id.release}
        if kind == "deploy":
            result.update(previous=old.id.release, canary=canary)
        else:
            result["rolled_back_from"] = old.id.release
        result["evidence"] = plain(self.evidence)  # as the status shows it
        if canary:
            assert loaded.manifest is not None
            c = loaded.manifest.canary
            thresholds = CanaryThresholds(
                c.window_s, c.max_deadline_miss_rate, c.max_interventions, c.max_divergence, c.max_heartbeat_faults
            )
            # The previous release keeps running as a shadow: the divergence reference,
            # and the warm policy an abort swaps back to.
            self._start_shadow(old.served, old.loaded, "canary-reference", thresholds.max_divergence)
            self.shadow_memory = old.memory
            self.canary = Canary(new.served, old, thresholds)
            self.state.record("canary", f"canary of {new.id.release} for {thresholds.window_s:g} s", **vars(thresholds))
        elif swapped is not None:
            result["swap_gap_s"] = self._swapped_in(swapped)
        else:
            await self._retire(old)
        return result

    def _note_forced(self, entry: HistoryEntry, what: str) -> None:
        """An event for every override the store recorded (the journal holds it too)."""
        if entry.forced and entry.overrides:
            self.state.record(
                "operator",
                f"{what} of {entry.to_release} forced by {entry.who} ({'; '.join(entry.overrides)}): {entry.why}",
                who=entry.who,
                why=entry.why,
                overrides=list(entry.overrides),
                evidence=entry.evidence,
            )

    # -- evidence of the serving release -----------------------------------------------------

    def _evidence_of(self, loaded: LoadedPolicy, entry: HistoryEntry | None = None) -> Evidence:
        """``passed``, ``forced`` (with the journal's who, why and when) or ``unverified``."""
        manifest, evidence = loaded.manifest, loaded.evidence
        if manifest is None or evidence is None:
            return Evidence(
                status="unverified",
                release=loaded.release_id,
                gate_evidence=None,
                problems=("unsigned release (release.verify = false): no gate evidence is checked",),
            )
        out = Evidence(
            status="passed" if evidence.ok else "unverified",
            release=manifest.id,
            gate_evidence=evidence.status,
            problems=tuple(evidence.problems),
        )
        if evidence.ok:
            return out
        entry = entry or self._journal_entry(loaded.folder, manifest.id)
        if entry is not None and entry.to_release == manifest.id and entry.forced and entry.evidence == evidence.status:
            return dataclasses.replace(out, status="forced", who=entry.who, why=entry.why, time=entry.time)
        return out

    def _journal_entry(self, folder: Path, release_id: str) -> HistoryEntry | None:
        """The store's record of how ``release_id`` became active, when it is served from the store."""
        root = Path(self.cfg.store.root)
        try:
            if folder.resolve().parent != (root / "releases").resolve():
                return None
            store = ReleaseStore(root, self.cfg.release.keys_dir, create=False, recover=False)
            return store.last_activation(release_id)
        except (OSError, VladError) as exc:
            log.warning("cannot read the release store's journal in %s: %s", root, exc)
            return None

    def evidence_status(self) -> Evidence:
        """The serving release's evidence for the status; unverified ones count their chunks."""
        if self.evidence.status != "unverified":
            return self.evidence
        return dataclasses.replace(self.evidence, published_unverified=self.chain.release.served.counts.published)

    # -- shadow ----------------------------------------------------------------------------

    def _start_shadow(self, served: ServedPolicy, loaded: LoadedPolicy, purpose: str, tolerance: float) -> None:
        run = ShadowRun(served.renamed("shadow"), purpose, tolerance, self.cfg.serve.latency_window)
        run.start()
        self.shadow = run
        self.publisher.observers.append(run.divergence.reference)
        self.chain.loop.shadow = run

    def _stop_shadow(self) -> ShadowRun | None:
        run, self.shadow, self.shadow_memory = self.shadow, None, None
        if run is not None:
            self.chain.loop.shadow = None
            self.publisher.observers.remove(run.divergence.reference)
        return run

    async def shadow_start(self, path: str, tolerance: float) -> dict[str, Any]:
        if self.shadow is not None:
            raise VladError(
                f"a shadow of {self.shadow.policy.id.release} is running ({self.shadow.purpose}); stop it first"
            )
        r = self.cfg.release
        folder = Path(path)
        manifest = await self._in_thread(lambda: claimed_manifest(folder, r.keys_dir if r.verify else None))
        self._plan("shadow", folder, manifest, replaces=False)
        loaded, self.shadow_memory = await self._load(folder)
        self._start_shadow(served(loaded, "shadow"), loaded, "shadow", tolerance)
        self.state.record("shadow", f"shadow run of {loaded.release_id} started")
        return {"shadow": loaded.release_id, "tolerance": tolerance}

    def shadow_report(self) -> dict[str, Any]:
        """The shadow run's status (:meth:`ShadowRun.status`) as its wire map."""
        if self.shadow is None:
            raise VladError("no shadow run (start one with `vladctl shadow start RELEASE`)")
        return plain(self.shadow.status())

    async def shadow_stop(self) -> dict[str, Any]:
        if self.shadow is None or self.shadow.purpose != "shadow":
            raise VladError("no shadow run to stop")
        final = self.shadow.status()
        run = self._stop_shadow()
        await self._retire(run)
        self.state.record("shadow", f"shadow run of {final.release} stopped", pairs=final.divergence.pairs)
        return plain(final)

    # -- canary ----------------------------------------------------------------------------

    async def check_canary(self, findings: list[Finding]) -> None:
        """Every monitor tick: abort the canary when a threshold is crossed, end it after its window."""
        canary = self.canary
        if canary is None:
            return
        keys = {f.key for f in findings if f.code == "heartbeat_lost"}
        if keys - self._seen_findings:
            canary.heartbeat_faults += 1
        self._seen_findings = keys
        health = self.chain.health
        quarantined = health.quarantined.get(0) if health.chain[0] == canary.policy.id else None
        reason = canary.check(self.shadow)
        if reason is None and quarantined:
            reason = f"quarantined by the health monitors ({quarantined})"
        if reason is not None:
            await self.abort_canary(reason, "canary")
        elif canary.elapsed_s(time.monotonic_ns()) >= canary.thresholds.window_s:
            self.canary = None
            run = self._stop_shadow()
            self.state.record(
                "canary", f"canary of {canary.policy.id.release} passed after {canary.thresholds.window_s:g} s"
            )
            await self._retire(run)

    @staticmethod
    def _roll_back_to(store: ReleaseStore, previous: ChainPolicy, who: str, why: str) -> HistoryEntry:
        """The store's rollback, forced, to ``previous``: taken as it was staged when it came
        in through this daemon (a deploy or rollback), else verified by the store."""
        staged = previous.loaded.staged
        if staged is None:
            return store.rollback(who, why, force=True)
        admission = store.admit(staged, who, why, force=True, retry="vladctl rollback --force --why '...'")
        return store.rollback(admission=admission)

    async def abort_canary(self, reason: str, who: str) -> dict[str, Any]:
        """Swap back to the previous release (still warm in the shadow) and roll the store back."""
        canary, self.canary = self.canary, None
        assert canary is not None
        run = self._stop_shadow()
        if run is not None:
            await self._in_thread(lambda: run.stop(self.cfg.serve.shutdown_timeout_s))
        previous = canary.previous
        restored = ChainPolicy(previous.loaded, previous.served)
        bad = self.chain.install(restored, f"canary aborted: {reason}")
        # The faults that moved us down the chain came from the canary, which is gone: the
        # previous release serves at once (the next monitor tick re-judges everything else).
        if self.chain.active != 0:
            self.chain.serve(0)
        self.state.record(
            "canary_abort", f"canary of {canary.policy.id.release} aborted: {reason}", release=canary.policy.id.release
        )
        # The store follows what is served now: the previous release, which ran before the
        # canary. Forced (recorded as such, with what it overrode): an automatic abort must
        # not be refused for evidence or a bad mark of the release it returns to, nor for
        # its reason, made one line of at most LINE_MAX_LEN characters (an operator's
        # rollback reason is already that long at most; the event above holds all of it).
        why = one_line(f"canary aborted: {reason}", LINE_MAX_LEN)
        try:
            store = await self._in_thread(self.store)
            entry = await self._in_thread(lambda: self._roll_back_to(store, previous, who, why))
            self._note_forced(entry, "canary abort")
            self.evidence = self._evidence_of(previous.loaded, entry)
        except VladError as exc:
            log.error("canary aborted but the store could not roll back: %s", exc)
        await self._retire(bad)
        return {"release": previous.id.release, "aborted": canary.policy.id.release, "reason": reason}
