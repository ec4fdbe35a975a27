"""The supervisor's state machine and its event history.

    STARTING -> ACTIVE <-> DEGRADED -> FALLBACK -> (healthy window) -> ACTIVE
    any -> ESTOPPED (external e-stop engaged) -> back to the state before, once released
    any -> STOPPING

Every transition is an :class:`Event` with a reason, logged (to journald with structured
fields under systemd) and kept in a bounded history that ``vladctl events`` shows.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast, get_args

from vlad.logs import context as log_context

log = logging.getLogger("vlad.state")


class State(str, enum.Enum):
    STARTING = "STARTING"
    ACTIVE = "ACTIVE"
    DEGRADED = "DEGRADED"
    FALLBACK = "FALLBACK"
    ESTOPPED = "ESTOPPED"
    STOPPING = "STOPPING"


# The states by name, as events and the status carry them.
StateName = Literal["STARTING", "ACTIVE", "DEGRADED", "FALLBACK", "ESTOPPED", "STOPPING"]
assert get_args(StateName) == tuple(s.value for s in State)  # one list of states, two spellings

# Every kind of event (docs/operations.md lists them for journald's VLAD_EVENT field).
EventKind = Literal[
    "transition",  # a state change (the only kind whose states differ)
    "fault",
    "warning",
    "cleared",
    "quarantine",
    "swap",  # another policy serves
    "release",  # deploy or rollback
    "canary",
    "canary_abort",
    "shadow",
    "operator",  # resume, forced deploy, controllers forgotten
    "release_note",
    "release_unverified",
    "memory_swap",
    "endpoint",  # an endpoint process ended, failed to start, stopped reporting, or started again
]

ALLOWED: dict[State, set[State]] = {
    State.STARTING: {State.ACTIVE, State.FALLBACK, State.ESTOPPED, State.STOPPING},
    State.ACTIVE: {State.DEGRADED, State.FALLBACK, State.ESTOPPED, State.STOPPING},
    State.DEGRADED: {State.ACTIVE, State.FALLBACK, State.ESTOPPED, State.STOPPING},
    State.FALLBACK: {State.ACTIVE, State.DEGRADED, State.ESTOPPED, State.STOPPING},
    State.ESTOPPED: {State.ACTIVE, State.DEGRADED, State.FALLBACK, State.STOPPING},
    State.STOPPING: set(),
}


@dataclass(frozen=True)
class Event:
    """One transition or event; the ``events`` answer is a list of :meth:`to_dict` maps,
    read back with :func:`vlad.snapshot.parse_events`."""

    time: float  # wall clock (seconds since the epoch), for humans and logs
    monotonic_ns: int
    kind: EventKind
    state_from: StateName
    state_to: StateName
    reason: str = field(metadata={"allow_empty": True})
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def is_transition(self) -> bool:
        return self.kind == "transition"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _name(state: State) -> StateName:
    return cast(StateName, state.value)


class StateMachine:
    """The supervisor's state and event history. Thread-safe: the e-stop thread and the
    event loop both move it."""

    def __init__(self, history: int = 500) -> None:
        self.state = State.STARTING
        self.since_ns = time.monotonic_ns()
        self.events: deque[Event] = deque(maxlen=history)
        self._lock = threading.RLock()

    def transition(self, to: State, reason: str, **details: Any) -> bool:
        """Move to ``to``; returns False (and changes nothing) if already there or if the
        move is not allowed (STOPPING is final): a late event never resurrects a stopping
        daemon."""
        with self._lock:
            if to == self.state or to not in ALLOWED[self.state]:
                return False
            ev = Event(time.time(), time.monotonic_ns(), "transition", _name(self.state), _name(to), reason, details)
            self.state = to
            self.since_ns = ev.monotonic_ns
            self.events.append(ev)
            log_context.state = to.value
        log.info(
            "state %s -> %s: %s",
            ev.state_from,
            ev.state_to,
            reason,
            extra={"VLAD_EVENT": "transition", "VLAD_REASON": reason},
        )
        return True

    def record(self, kind: EventKind, reason: str, **details: Any) -> Event:
        """Record a non-transition event (a fault, an operator command, a swap)."""
        return self.record_at(logging.INFO, kind, reason, **details)

    def record_at(self, level: int, kind: EventKind, reason: str, **details: Any) -> Event:
        """:meth:`record`, logged at ``level`` (an error the operator must see as one)."""
        with self._lock:
            name = _name(self.state)
            ev = Event(time.time(), time.monotonic_ns(), kind, name, name, reason, details)
            self.events.append(ev)
        extra = {"VLAD_EVENT": kind, "VLAD_REASON": reason}
        policy = details.get("policy") or details.get("to_policy")
        if policy:
            extra["VLAD_POLICY"] = str(policy)
        log.log(level, "%s: %s", kind, reason, extra=extra)
        return ev

    def recent(self, limit: int) -> list[Event]:
        with self._lock:
            return list(self.events)[-limit:] if limit > 0 else []
