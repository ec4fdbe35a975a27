"""What a gate produces: checks against budgets, a verdict, and the details behind it.

Every gate returns one :class:`GateResult`. Its verdict is computed from its
:class:`Check` list (a value, the budget it is held to, the comparison), so the report
can show each number beside the limit it was judged against, and a failed gate names
the check that failed in one readable line.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from vlad.errors import VladError
from vlad.release.evidence import REPORT_FORMAT
from vlad.release.manifest import GATES

#: The gates, in the order they run: the cheap, decisive ones first (the manifest's list).
GATE_ORDER = GATES
__all__ = ["GATE_ORDER", "REPORT_FORMAT", "Check", "GateError", "GateResult", "Timer", "check"]

_OPS = {
    "<=": lambda v, lim: v <= lim,
    ">=": lambda v, lim: v >= lim,
    "==": lambda v, lim: v == lim,
}


class GateError(VladError):
    """A gate could not run (bad plan, unreadable release, missing input); says what to do."""


@dataclass(frozen=True)
class Check:
    """One measured value held to one budget: ``value <op> limit``."""

    name: str
    value: Any
    limit: Any
    op: str = "<="
    unit: str = ""
    passed: bool = True
    note: str = ""

    def line(self) -> str:
        """``name value unit (limit op budget)``: the reason a human reads."""
        unit = f" {self.unit}" if self.unit else ""
        verdict = "ok" if self.passed else "FAILED"
        note = f"; {self.note}" if self.note else ""
        return f"{self.name}: {_fmt(self.value)}{unit}, budget {self.op} {_fmt(self.limit)}{unit} ({verdict}{note})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "value": _json_number(self.value),
            "limit": _json_number(self.limit),
            "op": self.op,
            "unit": self.unit,
            "passed": self.passed,
            "note": self.note,
        }


def check(name: str, value: Any, limit: Any, op: str = "<=", unit: str = "", note: str = "") -> Check:
    """A :class:`Check` with its verdict computed; a non-finite value never passes."""
    if isinstance(value, float) and not math.isfinite(value):
        passed = False
    else:
        passed = bool(_OPS[op](value, limit))
    return Check(name, value, limit, op, unit, passed, note)


@dataclass
class GateResult:
    """The outcome of one gate. ``status``: passed, failed, skipped or error."""

    gate: str
    status: str = "passed"
    checks: list[Check] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        """True only for a gate that ran and met every budget."""
        return self.status == "passed"

    def add(self, c: Check) -> Check:
        """Record a check; a failed one fails the gate with its line as a reason."""
        self.checks.append(c)
        if not c.passed:
            self.fail(c.line())
        return c

    def fail(self, reason: str) -> None:
        """Fail the gate with a human-readable reason."""
        if self.status != "error":
            self.status = "failed"
        self.reasons.append(reason)

    def summary(self) -> str:
        """One line: the verdict and, when it failed, the first reason."""
        head = f"{self.gate}: {self.status.upper()}"
        if self.reasons:
            more = f" (+{len(self.reasons) - 1} more)" if len(self.reasons) > 1 else ""
            return f"{head}: {self.reasons[0]}{more}"
        return f"{head} ({len(self.checks)} checks)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "gate": self.gate,
            "status": self.status,
            "passed": self.passed,
            "reasons": self.reasons,
            "checks": [c.to_dict() for c in self.checks],
            "details": self.details,
            "duration_s": round(self.duration_s, 3),
        }


class Timer:
    """Wall-clock duration of a ``with`` block, in seconds."""

    def __enter__(self) -> Timer:
        self.t0 = time.monotonic()
        self.s = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.s = time.monotonic() - self.t0


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if 0.99 <= abs(v) < 1.0:
            return f"{v:.7g}"  # cosine similarities: the digits that matter are the last ones
        if v == 0 or (1e-3 <= abs(v) < 1e5):
            return f"{v:.4g}"
        return f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _json_number(v: Any) -> Any:
    """JSON has no NaN/Inf: write them as strings rather than produce invalid JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [_json_number(x) for x in v]
    return v
