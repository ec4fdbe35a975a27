"""The policy chain: the loaded policies in fallback order, and which one serves.

``[release being served, fallback policies..., hold posture]``. Every policy is loaded and
warm from the start, so :meth:`PolicyChain.serve` is a pointer change on the serving
thread plus a wake-up (the newest observation is answered by the new policy at once);
:meth:`PolicyChain.install` puts a newly deployed or rolled-back release in first place.
The :class:`~vlad.health.policy.HealthPolicy` over the chain decides the position each
health tick and :meth:`PolicyChain.follow_health` moves there.

The chain is the one writer of the serving position: :meth:`PolicyChain.point` moves the
shared :class:`~vlad.serving.position.ServingState` (position and release), the serving
thread's pointer and the swap's record together; everything else reads them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from vlad.daemon.memory import PolicyMemory
from vlad.health.base import Finding
from vlad.health.policy import Decision, HealthPolicy
from vlad.health.state import StateMachine
from vlad.logs import context as log_context
from vlad.release.loading import LoadedPolicy
from vlad.serving.counters import HOLD, PolicyId
from vlad.serving.loop import ServingLoop
from vlad.serving.policy import ServedPolicy
from vlad.serving.position import ServingState


def served(policy: LoadedPolicy, slot: str) -> ServedPolicy:
    """``policy`` as the serving thread runs it in ``slot`` (``release``, ``fallback1``, ``shadow``)."""
    return ServedPolicy(PolicyId(slot, policy.release_id), policy.contract, policy.session, policy.tokenizer)


@dataclass(eq=False)
class ChainPolicy:
    """One model of the chain: what was loaded (release, files), what serves, and the
    memory its load measured (None: not measured)."""

    loaded: LoadedPolicy
    served: ServedPolicy
    memory: PolicyMemory | None = None

    @classmethod
    def of(cls, loaded: LoadedPolicy, slot: str, memory: PolicyMemory | None) -> ChainPolicy:
        return cls(loaded, served(loaded, slot), memory)

    @property
    def id(self) -> PolicyId:
        return self.served.id


class PolicyChain:
    """Owns the chain's policies, the health policy over them and the serving pointer."""

    def __init__(
        self,
        policies: list[ChainPolicy],
        health_window_ns: int,
        state: StateMachine,
        loop: ServingLoop,
        serving: ServingState,
    ) -> None:
        self.policies = policies  # without the hold posture
        self.state = state
        self.loop = loop
        self.serving_state = serving
        self.health = HealthPolicy([p.id for p in policies] + [HOLD], health_window_ns, state, serving)
        self._route(0)  # the release serves from the first observation on

    # -- reading ---------------------------------------------------------------------------

    @property
    def release(self) -> ChainPolicy:
        """The release being served (first in the chain), whether or not it serves now."""
        return self.policies[0]

    @property
    def active(self) -> int:
        return self.serving_state.position

    @property
    def serving(self) -> ChainPolicy | None:
        """The policy answering now; None: the hold posture."""
        return self.at(self.serving_state.position)

    def ids(self) -> list[PolicyId]:
        return list(self.health.chain)

    def at(self, position: int) -> ChainPolicy | None:
        return self.policies[position] if position < len(self.policies) else None

    # -- changing --------------------------------------------------------------------------

    def follow_health(self, findings: list[Finding], now_ns: int) -> Decision:
        """Decide this health tick (:func:`vlad.health.policy.decide`) and move to its target."""
        decision = self.health.update(findings, now_ns)
        if decision.target != self.serving_state.position:
            self.serve(decision.target)
        return decision

    def serve(self, target: int) -> None:
        """Route to chain position ``target`` (a pointer change; every policy is warm)."""
        before = self.health.chain[self.serving_state.position]
        self.point(target, f"{before} -> {self.health.chain[target]}", from_policy=str(before))

    def point(self, target: int, why: str, **details: object) -> None:
        """Point the serving thread at chain position ``target`` and wake it; the swap is
        recorded (the one place the serving position changes)."""
        t0 = time.monotonic_ns()
        new = self.at(target)
        self.loop.publisher.expect_swap(new.id.slot if new else "hold", t0)
        self._route(target)
        self.state.record(
            "swap",
            why,
            to_policy=str(self.health.chain[target]),
            switch_us=round((time.monotonic_ns() - t0) / 1e3, 1),
            **details,
        )

    def _route(self, target: int) -> None:
        new = self.at(target)
        self.serving_state.position = target
        self.serving_state.release = new.id.release if new else "hold"
        self.loop.active = new.served if new else None
        self.loop.wake()

    def install(self, policy: ChainPolicy, reason: str) -> ChainPolicy:
        """Make ``policy`` the release being served; returns the one it replaces."""
        old = self.policies[0]
        self.policies[0] = policy
        self.health.replace(0, policy.id)
        log_context.release = policy.id.release
        if self.serving_state.position == 0:
            self.point(0, f"{old.id} -> {policy.id}: {reason}")
        self.state.record(
            "release",
            f"{old.id.release} -> {policy.id.release}: {reason}",
            from_release=old.id.release,
            to_release=policy.id.release,
        )
        return old
