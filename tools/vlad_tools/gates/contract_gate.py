"""Contract gate: the candidate feeds and reads the model exactly like the baseline.

Reuses :func:`vlad.contract.diff_contracts` (``vladctl contract diff``): any *breaking*
difference (dtype, shape, normalization, units, joint order, frames, tokenizer, layout,
semantics ...) fails the gate with the field named; non-breaking differences (guard
settings, timing, identity) are listed for review.
"""

from __future__ import annotations

from vlad.contract import diff_contracts
from vlad_tools.gates.results import GateResult, check
from vlad_tools.gates.subject import Subject


def run_contract_gate(candidate: Subject, baseline: Subject, progress=print) -> GateResult:
    """Compare the two contracts field by field; fail on the first breaking difference."""
    result = GateResult("contract")
    diffs = diff_contracts(baseline.contract, candidate.contract)
    breaking = [d for d in diffs if d.breaking]
    for d in breaking:
        result.fail(f"{d.path}: {d.old!r} -> {d.new!r} ({d.category}: {d.reason})")
    result.checks.append(
        check("breaking contract differences", len(breaking), 0, "<=", note=", ".join(d.path for d in breaking[:5]))
    )
    result.details = {
        "baseline_contract_sha256": baseline.contract.sha256,
        "candidate_contract_sha256": candidate.contract.sha256,
        "identical": not diffs,
        "differences": [d.to_dict() for d in diffs],
    }
    review = [d for d in diffs if not d.breaking and d.category != "info"]
    progress(f"  contract: {len(diffs)} difference(s), {len(breaking)} breaking, {len(review)} to review")
    return result
