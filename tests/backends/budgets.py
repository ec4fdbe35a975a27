"""Initial error budgets per precision label, for the demo policy (shared by the tests and
scripts/gpu-check).

Max absolute error of the ``actions`` output against the fp32 reference (the golden
fixtures' PyTorch fp32 outputs, or ONNX Runtime fp32 on the CPU). The demo's actions are
~N(0, 0.4) with max |a| ~1.3 after 10 denoising steps. These budgets only catch a broken
engine or a wrong label; a release's equivalence gate owns its approved budget.

``fp32`` is tight on purpose: TF32 left on (10-bit mantissa inputs) gives errors around
1e-3 on this model, so an "fp32" session that silently computes in TF32 fails it. A TF32
run is its own label with its own budget.
"""

from __future__ import annotations

MAX_ABS: dict[str, float] = {
    "fp32": 1e-4,
    "tf32": 1e-2,
    "fp16": 3e-2,
    "bf16": 1e-1,
}
