"""The demo release's golden fixtures, and the error budgets engines are judged by against them.

``manifests/demo/golden.npz`` (written by :mod:`vlad_tools.demo.release`) holds, per case, a raw
observation, the model inputs the reference preprocessing makes of it, the PyTorch fp32
reference's outputs and the decoded actions. Tests (the GPU suite included) and benchmarks
read it with :func:`load_golden` (no pickle: plain arrays only).

:data:`MAX_ABS` is the largest absolute error of the model's ``actions`` output against the
fp32 reference that a precision label may show: the output budget of the gates' default
equivalence budgets (:data:`vlad_tools.gates.plan.DEFAULT_BUDGETS`), so the backend tests, the GPU
probe and the equivalence gate judge by one table. ``fp32`` is tight on purpose: TF32 left on
gives errors around 1e-3 on the demo, so an "fp32" session that silently computes in TF32
fails it. These budgets only catch a broken engine or a wrong label; a release's own
equivalence gate owns its approved budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import numpy as np

from vlad.processing import RawObservation
from vlad_tools.gates.equivalence import load_golden as gate_golden
from vlad_tools.gates.plan import DEFAULT_BUDGETS
from vlad_tools.testing.releases import DEMO

GOLDEN = DEMO / "golden.npz"

MAX_ABS: dict[str, float] = {precision: b.output_max_abs for precision, b in DEFAULT_BUDGETS.items()}


class GoldenCase(TypedDict):
    """One case: raw observation -> model inputs -> model outputs -> actions."""

    raw: RawObservation
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    actions: np.ndarray


def load_golden(path: Path = GOLDEN) -> list[GoldenCase]:
    """Every case of the golden fixtures at ``path``, in order (read by the equivalence
    gate's :func:`~vlad_tools.gates.equivalence.load_golden`)."""
    return [
        {"raw": c["raw"], "inputs": c["inputs"], "outputs": c["outputs"], "actions": c["actions"]}
        for c in gate_golden(path)
    ]


def golden_inputs(path: Path = GOLDEN) -> list[dict[str, np.ndarray]]:
    """The model inputs of every case (what an engine is fed), in order."""
    return [case["inputs"] for case in load_golden(path)]
