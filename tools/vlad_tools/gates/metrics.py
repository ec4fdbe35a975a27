"""The numbers gates are judged by: tensor errors and guard decisions (percentiles and success
intervals: :mod:`vlad_tools.evaluation`).

Pure numpy, no I/O: every function here is a definition the report and docs/gates.md
refer to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from vlad.contract import Contract
from vlad.serving.guard import ActionGuard

# Relative error divides by |reference|; below this floor the relative error of a value
# near zero says nothing (0.001 vs 0.002 is "100 %"), so the floor is used instead.
REL_FLOOR = 1e-3


@dataclass
class ErrorStats:
    """Running worst-case error of a candidate tensor against its reference, over samples."""

    max_abs: float = 0.0
    sum_abs: float = 0.0
    count: int = 0
    max_rel: float = 0.0
    min_cosine: float = 1.0
    samples: int = 0

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        """Fold one sample (same shape) into the statistics; a NaN anywhere poisons them."""
        r = np.asarray(ref, dtype=np.float64).ravel()
        g = np.asarray(got, dtype=np.float64).ravel()
        if r.shape != g.shape:
            raise ValueError(f"shape {got.shape} differs from the reference {ref.shape}")
        err = np.abs(g - r)
        if not np.isfinite(err).all():
            self.max_abs = self.max_rel = math.inf
            self.min_cosine = -math.inf
        else:
            self.max_abs = max(self.max_abs, float(err.max(initial=0.0)))
            self.max_rel = max(self.max_rel, float((err / np.maximum(np.abs(r), REL_FLOOR)).max(initial=0.0)))
            self.min_cosine = min(self.min_cosine, cosine(r, g))
        self.sum_abs += float(err.sum()) if np.isfinite(err).all() else math.inf
        self.count += err.size
        self.samples += 1

    @property
    def mean_abs(self) -> float:
        return self.sum_abs / self.count if self.count else 0.0

    def to_dict(self) -> dict[str, float]:
        return {
            "max_abs": self.max_abs,
            "mean_abs": self.mean_abs,
            "max_rel": self.max_rel,
            "min_cosine": self.min_cosine,
            "samples": self.samples,
        }


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two flattened tensors; two zero tensors count as identical."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


@dataclass
class JointErrors:
    """Absolute action errors per joint in contract units, every waypoint of every sample."""

    names: tuple[str, ...]
    values: list[np.ndarray] = field(default_factory=list)  # each [H, J]

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        self.values.append(np.abs(np.asarray(got, np.float64) - np.asarray(ref, np.float64)))

    def per_joint(self) -> np.ndarray:
        """``[N * H, J]`` array of every error (empty ``[0, J]`` without samples)."""
        if not self.values:
            return np.zeros((0, len(self.names)))
        return np.concatenate([v.reshape(-1, len(self.names)) for v in self.values])

    def max_per_joint(self) -> list[float]:
        e = self.per_joint()
        if e.size and not np.isfinite(e).all():
            return [math.inf] * len(self.names)
        return [float(x) for x in (e.max(axis=0) if len(e) else np.zeros(len(self.names)))]


# ---- guard decisions ------------------------------------------------------------------


@dataclass
class DecisionStats:
    """Flips between reference and candidate guard decisions, and how many reference
    decisions lay near a threshold (within ``near`` in contract units). The decisions are
    the guard's own (:meth:`vlad.serving.guard.ActionGuard.decisions`, ``bool[H, J, 3]``:
    below the lower bound, above the upper bound, rate limit exceeded from the previous
    waypoint or the measured position): one that differs between reference and candidate
    is a *flip*, the same observation clamped by one and not by the other."""

    near: float
    guard: ActionGuard | None = field(default=None, repr=False)  # the last contract's
    flips: int = 0
    decisions: int = 0
    near_boundary: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, contract: Contract, ref: np.ndarray, got: np.ndarray, proprio: np.ndarray | None, label: str) -> None:
        if self.guard is None or self.guard.contract is not contract:
            self.guard = ActionGuard(contract)
        dr = self.guard.decisions(ref, proprio)
        dg = self.guard.decisions(got, proprio)
        diff = dr != dg
        self.flips += int(diff.sum())
        self.decisions += dr.size
        self.near_boundary += int((self.guard.margins(ref, proprio) < self.near).sum())
        if diff.any() and len(self.examples) < 5:
            k, j, kind = (int(x) for x in np.argwhere(diff)[0])
            what = ("below lower bound", "above upper bound", "rate limit")[kind]
            joint = contract.action.joints[j].name
            self.examples.append(
                f"{label}: waypoint {k} {joint} {what}: reference {bool(dr[k, j, kind])}, "
                f"candidate {bool(dg[k, j, kind])}"
            )

    def to_dict(self) -> dict:
        return {
            "flips": self.flips,
            "decisions": self.decisions,
            "near_boundary": self.near_boundary,
            "near_threshold": self.near,
            "examples": self.examples,
        }
