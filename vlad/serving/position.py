"""What serves now, shared: the chain position, the release answering and the supervisor's state.

One object, made once by the supervisor and handed to the parts that decide, label or
report by it: the health policy reads the position it decides from, the publisher labels
every chunk with the release and the state, the status shows them. Each value has one
writer: the policy chain moves the position and the release together
(:meth:`vlad.daemon.chain.PolicyChain.point`, the only place a swap happens); the state
machine owns the state. Readers on other threads (the serving thread labels its chunks)
read one attribute at a time, which a swap replaces whole.
"""

from __future__ import annotations

from vlad.health.state import StateMachine


class ServingState:
    """The chain position serving now, the release it runs and the supervisor's state (module doc)."""

    __slots__ = ("_machine", "position", "release")

    def __init__(self, machine: StateMachine, release: str = "hold") -> None:
        self._machine = machine
        self.position = 0  # the chain position serving now (the last one: the hold posture)
        self.release = release  # the release id of the policy answering now; "hold" for the hold posture

    @property
    def state(self) -> str:
        """The supervisor's state (``ACTIVE``, ``FALLBACK``, ...), as chunks carry it."""
        return self._machine.state.value
