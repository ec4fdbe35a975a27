"""A policy ready to serve: its session, its preallocated buffers and its counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from vlad.backend import Session
from vlad.contract import Contract
from vlad.processing import ActionDecoder, Preprocessor, Tokenizer
from vlad.serving.counters import PolicyCounts, PolicyId


@dataclass(eq=False)
class ServedPolicy:
    """One loaded, warm policy as the serving thread uses it. Built once at load; a swap
    between policies is a pointer change, never a load."""

    id: PolicyId
    contract: Contract
    session: Session
    tokenizer: Tokenizer | None
    counts: PolicyCounts = field(default_factory=PolicyCounts)
    retired: bool = False  # replaced (deploy, rollback): a chunk still in flight is dropped
    pre: Preprocessor = field(init=False)
    decoder: ActionDecoder = field(init=False)
    max_age_ns: int = field(init=False)
    deadline_ns: int = field(init=False)
    name: str = field(init=False)  # str(id), formatted once: every chunk header carries it

    def __post_init__(self) -> None:
        self.name = str(self.id)
        self.pre = Preprocessor(self.contract, self.tokenizer)
        self.decoder = ActionDecoder(self.contract)
        t = self.contract.timing
        self.max_age_ns = int(t.max_observation_age_ms * 1e6)
        self.deadline_ns = int(t.e2e_deadline_ms * 1e6)

    def renamed(self, slot: str) -> ServedPolicy:
        """The same loaded policy under another chain slot (a shadow promoted to release);
        it keeps its session and counters."""
        other = ServedPolicy(PolicyId(slot, self.id.release), self.contract, self.session, self.tokenizer, self.counts)
        return other
