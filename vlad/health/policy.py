"""What the supervisor does with health findings: which policy of the chain serves.

The chain is ``[release being served, fallback policies..., hold posture]``. Each monitor
tick the findings decide the *target* position in the chain, the most conservative one
any fault asks for:

* a **policy** fault (NaN/Inf or out-of-bounds actions, backend exception or hang, an
  artifact changed on disk) quarantines the policy that produced it and moves down the
  chain. A quarantined policy is never re-activated automatically: only an operator
  (``vladctl resume``) or a new release clears the quarantine;
* a **system** fault (temperature, memory pressure, an unreachable remote server) moves
  below the policy it names (or off the release when it names none) until the machine or
  the link is healthy again; the policy is not quarantined;
* a **controller** or **input** fault (a controller's heartbeats lost, sensor stall,
  sustained stale or malformed observations) moves to the hold posture while it lasts:
  without trustworthy input, or with a controller gone, hold still. It says nothing about
  the policies, so it ends as soon as its cause does (the next monitor tick), without a
  healthy window: a controller that is back, or observations that flow again, are served
  by the policy the chain had.

Going back up the chain after a policy or system fault needs a healthy window (no such
fault for ``healthy_window_ns``, or the finding's own ``healthy_window_ns``), so a
flapping fault cannot flap the robot between policies (hysteresis). A remote link's
findings carry a window of 0: the link's prober already requires a run of in-deadline
answers before it calls the link healthy (``vlad_kserve``). Warnings alone only mark the
release DEGRADED.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlad.health.base import Finding
from vlad.health.state import State, StateMachine
from vlad.serving.counters import PolicyId


@dataclass(frozen=True)
class Decision:
    target: int  # position in the chain that should serve now
    state: State  # ACTIVE, DEGRADED or FALLBACK (the e-stop is handled apart)
    reason: str


class HealthPolicy:
    """Fallback decisions with hysteresis over a chain of :class:`PolicyId` (last: hold)."""

    def __init__(self, chain: list[PolicyId], healthy_window_ns: int, events: StateMachine) -> None:
        self.chain = chain
        self.hold = len(chain) - 1
        self.healthy_window_ns = healthy_window_ns
        self.events = events
        self.active = 0  # the position serving now (set by the chain on every swap)
        self.position = 0  # where policy and system faults put the chain (hold for input aside)
        self._decided = 0  # the last active this policy decided: another value was set from outside
        self.quarantined: dict[int, str] = {}  # chain position -> the fault code that caused it
        self.findings: dict[tuple, Finding] = {}
        self.ready_ns = 0  # no going back up the chain before this (healthy windows)
        self.last_fault_reason = ""

    def _next_allowed(self, after: int) -> int:
        for i in range(after + 1, len(self.chain)):
            if i not in self.quarantined:
                return i
        return self.hold

    def index_of(self, policy: PolicyId | None) -> int | None:
        """Chain position of a policy; None when it is no longer in the chain (a deployed or
        rolled-back release must not inherit its faults)."""
        return self.chain.index(policy) if policy in self.chain else None

    def best_allowed(self) -> int:
        return self._next_allowed(-1)

    def replace(self, position: int, policy: PolicyId) -> None:
        """A new policy at ``position`` (deploy, rollback): it starts with a clean record."""
        self.chain[position] = policy
        self.quarantined.pop(position, None)

    def update(self, findings: list[Finding], now_ns: int) -> Decision:
        # Record findings as they appear and clear (edge-triggered: the journal gets one
        # line per fault episode, not one per tick).
        current = {f.key: f for f in findings}
        for key, f in current.items():
            if key not in self.findings:
                self.events.record("fault" if f.severity == "fault" else "warning", f.message, **f.to_dict())
        for key, f in self.findings.items():
            if key not in current:
                self.events.record("cleared", f"{f.code} cleared", monitor=f.monitor, code=f.code)
        self.findings = current

        faults = [f for f in findings if f.severity == "fault"]
        if self.active != self._decided:  # a deploy, rollback or canary abort moved it meanwhile
            self.position = self.active
        target = self.position
        chain_faults, holds = [], []
        for f in faults:
            if f.scope in ("controller", "input"):
                holds.append(f.message)
                continue
            window = self.healthy_window_ns if f.healthy_window_ns is None else f.healthy_window_ns
            self.ready_ns = max(self.ready_ns, now_ns + window)
            chain_faults.append(f.message)
            if f.scope == "policy":
                culprit = self.index_of(f.policy) if f.policy else self.active
                if culprit is not None and culprit != self.hold and culprit not in self.quarantined:
                    self.quarantined[culprit] = f.code
                    self.events.record(
                        "quarantine",
                        f"{self.chain[culprit]} quarantined: {f.message}",
                        policy=str(self.chain[culprit]),
                        code=f.code,
                    )
            else:  # system
                named = self.index_of(f.policy) if f.policy else None
                below = named if named is not None else 0
                target = max(target, self._next_allowed(below))
        if target in self.quarantined:
            target = self._next_allowed(target)
        reasons = list(chain_faults)
        if chain_faults:
            self.last_fault_reason = "; ".join(chain_faults)
        elif now_ns >= self.ready_ns and target > self.best_allowed():
            target = self.best_allowed()
            reasons.append("healthy again")
        self.position = target
        self.active = self._decided = self.hold if holds else target
        if self.active == 0:
            warn = [f.message for f in findings if f.severity == "warn"]
            state = State.DEGRADED if warn else State.ACTIVE
            reason = "; ".join(warn) if warn else "; ".join(reasons) or "healthy"
        else:
            state = State.FALLBACK
            reason = "; ".join(holds + reasons) or self.last_fault_reason
        return Decision(self.active, state, reason)

    def resume(self, who: str, why: str) -> None:
        """Operator command: clear every quarantine (recorded with who and why)."""
        names = [str(self.chain[i]) for i in self.quarantined]
        self.quarantined.clear()
        self.events.record("operator", f"resume by {who}: {why}", who=who, why=why, cleared=names)
