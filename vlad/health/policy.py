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

The decision itself is :func:`decide`, a pure function of the findings, the time and where
the chain stands (:class:`Standing`); :class:`HealthPolicy` keeps that standing between
ticks, journals the findings and applies the :class:`Verdict`, and the policy chain
(:meth:`vlad.daemon.chain.PolicyChain.follow_health`) moves to its target. The position
serving now is the shared :class:`~vlad.serving.position.ServingState`'s, which only the
chain writes: the health policy reads it and never moves it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vlad.health.base import Finding
from vlad.health.state import State, StateMachine
from vlad.serving.counters import PolicyId
from vlad.serving.position import ServingState


@dataclass(frozen=True)
class Decision:
    target: int  # position in the chain that should serve now
    state: State  # ACTIVE, DEGRADED or FALLBACK (the e-stop is handled apart)
    reason: str


@dataclass(frozen=True)
class Standing:
    """Where the chain stands before a tick: all :func:`decide` reads besides the findings."""

    chain: Sequence[PolicyId]  # the last one is the hold posture
    active: int  # the position serving now
    position: int  # where policy and system faults put the chain (hold for input aside)
    decided: int  # the last active decided: another ``active`` was set from outside
    quarantined: Mapping[int, str]  # chain position -> the fault code that caused it
    ready_ns: int  # no going back up the chain before this (healthy windows)
    last_fault_reason: str
    healthy_window_ns: int


@dataclass(frozen=True)
class Verdict:
    """What one tick decided: the decision and the standing it leaves."""

    decision: Decision
    position: int
    ready_ns: int
    last_fault_reason: str
    quarantine: tuple[tuple[int, Finding], ...]  # positions newly quarantined, each by its finding


def _next_allowed(quarantined: Mapping[int, str], length: int, after: int) -> int:
    """The first position after ``after`` that is not quarantined (the hold posture, last, never is)."""
    for i in range(after + 1, length):
        if i not in quarantined:
            return i
    return length - 1


def decide(findings: Sequence[Finding], now_ns: int, standing: Standing) -> Verdict:
    """The tick's decision (module doc): a pure function, nothing it is given changes."""
    st = standing
    hold = len(st.chain) - 1
    quarantined = dict(st.quarantined)
    new: list[tuple[int, Finding]] = []

    def next_allowed(after: int) -> int:
        return _next_allowed(quarantined, len(st.chain), after)

    def index_of(policy: PolicyId | None) -> int | None:
        return st.chain.index(policy) if policy in st.chain else None

    faults = [f for f in findings if f.severity == "fault"]
    position = st.active if st.active != st.decided else st.position  # a deploy, rollback or canary abort moved it
    target, ready_ns, last_fault_reason = position, st.ready_ns, st.last_fault_reason
    chain_faults, holds = [], []
    for f in faults:
        if f.scope in ("controller", "input"):
            holds.append(f.message)
            continue
        window = st.healthy_window_ns if f.healthy_window_ns is None else f.healthy_window_ns
        ready_ns = max(ready_ns, now_ns + window)
        chain_faults.append(f.message)
        if f.scope == "policy":
            culprit = index_of(f.policy) if f.policy else st.active
            if culprit is not None and culprit != hold and culprit not in quarantined:
                quarantined[culprit] = f.code
                new.append((culprit, f))
        else:  # system
            named = index_of(f.policy) if f.policy else None
            below = named if named is not None else 0
            target = max(target, next_allowed(below))
    if target in quarantined:
        target = next_allowed(target)
    reasons = list(chain_faults)
    if chain_faults:
        last_fault_reason = "; ".join(chain_faults)
    elif now_ns >= ready_ns and target > next_allowed(-1):
        target = next_allowed(-1)
        reasons.append("healthy again")
    active = hold if holds else target
    if active == 0:
        warn = [f.message for f in findings if f.severity == "warn"]
        state = State.DEGRADED if warn else State.ACTIVE
        reason = "; ".join(warn) if warn else "; ".join(reasons) or "healthy"
    else:
        state = State.FALLBACK
        reason = "; ".join(holds + reasons) or last_fault_reason
    return Verdict(Decision(active, state, reason), target, ready_ns, last_fault_reason, tuple(new))


class HealthPolicy:
    """Fallback decisions with hysteresis over a chain of :class:`PolicyId` (last: hold)."""

    def __init__(
        self,
        chain: list[PolicyId],
        healthy_window_ns: int,
        events: StateMachine,
        serving: ServingState | None = None,
    ) -> None:
        self.chain = chain
        self.hold = len(chain) - 1
        self.healthy_window_ns = healthy_window_ns
        self.events = events
        # Where the chain serves now: read here, moved only by the policy chain (a health
        # policy of its own, e.g. in a test, gets a state nothing else moves).
        self.serving = serving if serving is not None else ServingState(events)
        self.position = 0  # where policy and system faults put the chain (hold for input aside)
        self._decided = 0  # the last active this policy decided: another value was set from outside
        self.quarantined: dict[int, str] = {}  # chain position -> the fault code that caused it
        self.findings: dict[tuple, Finding] = {}
        self.ready_ns = 0  # no going back up the chain before this (healthy windows)
        self.last_fault_reason = ""

    @property
    def active(self) -> int:
        """The position serving now (the shared :class:`ServingState`'s)."""
        return self.serving.position

    def _next_allowed(self, after: int) -> int:
        return _next_allowed(self.quarantined, len(self.chain), after)

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

        verdict = decide(
            findings,
            now_ns,
            Standing(
                chain=tuple(self.chain),
                active=self.active,
                position=self.position,
                decided=self._decided,
                quarantined=dict(self.quarantined),
                ready_ns=self.ready_ns,
                last_fault_reason=self.last_fault_reason,
                healthy_window_ns=self.healthy_window_ns,
            ),
        )
        for culprit, f in verdict.quarantine:
            self.quarantined[culprit] = f.code
            self.events.record(
                "quarantine",
                f"{self.chain[culprit]} quarantined: {f.message}",
                policy=str(self.chain[culprit]),
                code=f.code,
            )
        self.position, self.ready_ns = verdict.position, verdict.ready_ns
        self.last_fault_reason = verdict.last_fault_reason
        # The chain moves there (PolicyChain.follow_health); a position that differs from
        # this at the next tick was set from outside (a deploy, rollback or canary abort).
        self._decided = verdict.decision.target
        return verdict.decision

    def resume(self, who: str, why: str) -> None:
        """Operator command: clear every quarantine (recorded with who and why)."""
        names = [str(self.chain[i]) for i in self.quarantined]
        self.quarantined.clear()
        self.events.record("operator", f"resume by {who}: {why}", who=who, why=why, cleared=names)
