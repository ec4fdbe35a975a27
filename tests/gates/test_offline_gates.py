"""The gates that fail a broken candidate without starting a daemon: a changed normalization
at the contract gate, a perturbed weight at the equivalence gate (and its control, the same
rewrite unperturbed, within the fp32 budget). In process, nothing judged by the clock: they
run in the CPU share (tests/conftest.py)."""

from __future__ import annotations

from tests.gates import candidates
from tests.gates.conftest import gate_named, small_plan, why


def test_changed_normalization_fails_the_contract_gate(built):
    from vlad_tools.gates.runner import run_gates

    release = candidates.changed_normalization(built / "normalization")
    report = run_gates(
        release, candidates.DEMO, built / "normalization-report", plan=small_plan(), progress=lambda m: None, html=False
    )
    contract = gate_named(report, "contract")
    assert contract["status"] == "failed"
    assert contract["reasons"][0].startswith("cameras[overhead].model.std: [0.25, 0.25, 0.25] -> [0.25, 0.25, 0.26]")
    assert "normalization" in contract["reasons"][0]
    assert [g["status"] for g in report["gates"][1:]] == ["skipped"] * 3  # stopped at the first failure


def test_perturbed_weight_fails_the_equivalence_gate(built):
    from vlad_tools.gates.runner import run_gates

    release = candidates.perturbed_weight(built / "perturbed")
    report = run_gates(
        release, candidates.DEMO, built / "perturbed-report", plan=small_plan(), progress=lambda m: None, html=False
    )
    assert [g["status"] for g in report["gates"]] == ["passed", "failed", "skipped", "skipped"], why(report)
    eq = gate_named(report, "equivalence")
    failed = [c for c in eq["checks"] if not c["passed"]]
    names = " | ".join(c["name"] for c in failed)
    for what in (
        "golden: output actions max abs",
        "golden: joint0 action max abs",
        "replay demo_recording.mcap",
        "rollouts: joint trajectory divergence",
    ):
        assert what in names, names
    # The reference (the trained program) still reproduces the golden outputs: the ONNX is at fault.
    assert all(c["passed"] for c in eq["checks"] if c["name"].startswith("golden: "))
    worst = max(c["value"] for c in failed if "action max abs" in c["name"])
    assert worst > 100 * 2e-4  # far outside the fp32 budget, not a rounding question


def test_the_unperturbed_rewrite_is_within_the_fp32_budget(built, golden, contract):
    """Control for the test above: the same rewrite of the graph without the perturbation
    matches the recorded PyTorch fp32 outputs, so the failure there is the weight, not the
    rewrite."""
    from vlad.plugins import get_backend

    release = candidates.perturbed_weight(built / "unperturbed", scale=0.0)
    session = get_backend("onnxruntime").load(release / "policy.onnx", contract, {"intra_op_threads": 1})
    try:
        worst = max(
            float(abs(session.infer(case["inputs"])["actions"] - case["outputs"]["actions"]).max()) for case in golden
        )
    finally:
        session.close()
    assert worst <= 1e-4  # the fp32 output budget
