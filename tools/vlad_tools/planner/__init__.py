"""The latency planner: will a VLA meet its control rate on this hardware, here?

An analytical roofline model after VLA-Perf (Jiang et al., arXiv 2602.18397): per
operator ``t = max(2 * MACs / peak, bytes / bandwidth)``, summed per component (vision,
backbone prefill, action head), plus host <-> device copies and the network for edge
and cloud placement, in synchronous, asynchronous or dual-system mode. See
``docs/planner.md``.

    from vlad_tools import planner
    p = planner.predict("pi0", "rtx-4090")
    p.components["vision"].ms, p.e2e_ms, p.hz, p.fits
    planner.feasibility(contract, "vlad-demo", "jetson-thor")   # dict for release gates
"""

from vlad_tools.planner.predict import MODES, PLACEMENTS, Prediction, align_to_contract, feasibility, predict
from vlad_tools.planner.spec import (
    Hardware,
    Network,
    PlannerError,
    VLAModel,
    builtin_models,
    load_hardware,
    load_hardware_file,
    load_model,
    load_network,
    load_network_file,
)

__all__ = [
    "MODES", "PLACEMENTS", "Hardware", "Network", "PlannerError", "Prediction", "VLAModel", "align_to_contract",
    "builtin_models", "feasibility", "load_hardware", "load_hardware_file", "load_model", "load_network",
    "load_network_file", "predict",
]  # fmt: skip
