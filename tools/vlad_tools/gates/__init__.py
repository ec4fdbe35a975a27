"""Release gates: evidence that a release may reach a robot.

Four gates, run in this order by :func:`run_gates` (``vladctl gate``, docs/gates.md):

* **contract** (:mod:`.contract_gate`): the candidate's contract equals the baseline's in
  everything that changes how the model is fed or read;
* **equivalence** (:mod:`.equivalence`): every backend/precision candidate against the
  PyTorch fp32 reference on golden fixtures, recorded sensor replays and simulator
  rollouts, within the budget of its precision;
* **performance** (:mod:`.performance`): cold start, warm steady state, bursts, a CPU hog,
  debug logging and shape switches through the real daemon, against the contract's
  deadline and control period and the plan's memory limit;
* **closed loop** (:mod:`.closed_loop`): seeded episodes in the simulator through the real
  daemon, candidate vs baseline vs no motion, success rates with Wilson intervals.

Budgets and thresholds come from the plan (:mod:`.plan`); the report (``report.json`` and
a self-contained ``report.html``, :mod:`.report`) holds every figure with its budget and
the measurement conditions (:mod:`.conditions`). :mod:`.evidence` records a report into a
release and checks it before deploy; :mod:`.recording` and :mod:`.replay` capture and
replay what the daemon receives and publishes (MCAP).
"""

from vlad_tools.gates.evidence import EvidenceMissing, check_evidence, enforce_evidence, record_evidence
from vlad_tools.gates.plan import GatePlan, PlanError, load_plan
from vlad_tools.gates.results import GATE_ORDER, REPORT_FORMAT, Check, GateError, GateResult
from vlad_tools.gates.runner import run_gates

__all__ = [
    "GATE_ORDER",
    "REPORT_FORMAT",
    "Check",
    "EvidenceMissing",
    "GateError",
    "GatePlan",
    "GateResult",
    "PlanError",
    "check_evidence",
    "enforce_evidence",
    "load_plan",
    "record_evidence",
    "run_gates",
]
