"""The gate plan: defaults, where it is read from, and validation that reports every problem."""

from __future__ import annotations

import os
import typing

import pytest

from vlad_tools.gates.plan import (
    DEFAULT_BUDGETS,
    PRECISIONS,
    EngineSpec,
    Gate,
    GatePlan,
    PlanError,
    load_plan,
    parse_plan,
)
from vlad_tools.gates.results import GATE_ORDER, check


def test_defaults_require_every_gate_with_a_budget_per_precision():
    plan = GatePlan()
    assert plan.required == GATE_ORDER == typing.get_args(Gate) and plan.source == "defaults"
    assert set(plan.equivalence.budgets) >= {"fp32", "fp16", "bf16", "int8", "fp8"}
    # Looser precisions get looser budgets, never tighter ones.
    order = ["fp32", "tf32", "fp16", "bf16", "int8"]
    for a, b in zip(order, order[1:], strict=False):
        assert DEFAULT_BUDGETS[a].output_max_abs <= DEFAULT_BUDGETS[b].output_max_abs


def test_demo_plan_file_parses_and_resolves_paths_next_to_it(tmp_path):
    from tests.gates.conftest import DEMO_PLAN, RECORDING, ROOT

    plan = load_plan(tmp_path, DEMO_PLAN)
    assert plan.closed_loop.min_success_rate == 0.5 and plan.closed_loop.min_margin_over_no_motion == 0.2
    assert plan.performance.memory_limit_mib == 1024 and plan.performance.target_hardware == ("jetson-thor",)
    assert plan.path(plan.equivalence.recordings[0]) == RECORDING
    assert plan.path(plan.equivalence.golden) == ROOT / "manifests" / "demo" / "golden.npz"
    assert plan.equivalence.reference.backend == "torch" and plan.equivalence.reference.artifact == "policy.pt2"


def test_plan_comes_from_the_file_then_the_manifest_then_the_release_folder(tmp_path):
    (tmp_path / "gates.toml").write_text("[closed_loop]\nepisodes = 7\n")
    assert load_plan(tmp_path).closed_loop.episodes == 7
    doc = {"gate_plan": {"closed_loop": {"episodes": 9}}}
    assert load_plan(tmp_path, manifest_document=doc).closed_loop.episodes == 9
    explicit = tmp_path / "other.toml"
    explicit.write_text('required = ["contract"]\n')
    plan = load_plan(tmp_path, explicit, doc)
    assert plan.required == ("contract",) and plan.closed_loop.episodes == 50
    assert load_plan(tmp_path / "nothing-here").source == "defaults"


def test_a_plan_file_that_is_not_a_plain_toml_file_is_a_one_line_error(tmp_path):
    fifo, bomb = tmp_path / "fifo.toml", tmp_path / "bomb.toml"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    bomb.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")  # tomllib would overflow the stack
    for path, why in ((fifo, "not a regular file"), (bomb, "nested deeper than"), (tmp_path / "no", "no such plan")):
        with pytest.raises(PlanError, match=why):
            load_plan(tmp_path, path)


def test_every_problem_is_reported_at_once():
    with pytest.raises(PlanError) as exc:
        parse_plan(
            {
                "required": ["contract", "vibes"],
                "performance": {"memory_limit_mib": "lots", "warm_calls": -3},
                "closed_loop": {"episdoes": 5},
                "equivalence": {"budgets": {"fp12": {}, "fp16": {"output_max_abs": True}}},
                "extra": 1,
            },
            "plan.toml",
        )
    text = str(exc.value)
    for part in (
        "required",
        "memory_limit_mib",
        "warm_calls: must be >= 0",
        "episdoes: unknown key",
        "fp12: unknown precision",
        "fp16.output_max_abs",
        "extra: unknown key",
    ):
        assert part in text, part
    assert len(exc.value.problems) == 7


def test_candidates_are_auto_or_engine_tables():
    plan = parse_plan({"equivalence": {"candidates": [{"backend": "onnxruntime", "precision": "fp16"}]}}, "x")
    assert plan.equivalence.candidates == (EngineSpec("onnxruntime", precision="fp16"),)
    assert parse_plan({"equivalence": {"candidates": "auto"}}, "x").equivalence.candidates == "auto"
    with pytest.raises(PlanError) as exc:
        parse_plan({"equivalence": {"candidates": "all"}}, "x")
    assert exc.value.problems == ['equivalence.candidates: expected "auto" or an array of engine tables, got a string']
    with pytest.raises(PlanError) as exc:
        parse_plan(
            {"equivalence": {"candidates": [{"artifact": "a.onnx"}, {"backend": "trt", "precision": "fp7"}]}}, "x"
        )
    assert exc.value.problems == [
        "equivalence.candidates[0].backend: missing",
        f"equivalence.candidates[1].precision: unknown precision 'fp7' (known: {', '.join(PRECISIONS)})",
    ]


def test_overrides_and_budget_lookup():
    plan = GatePlan().with_overrides(closed_loop={"episodes": 3, "seed": None}, performance={"cpu_hog": False})
    assert plan.closed_loop.episodes == 3 and plan.closed_loop.seed == 10_000 and not plan.performance.cpu_hog
    custom = parse_plan({"equivalence": {"budgets": {"fp16": {"action_max_abs": 0.01}}}}, "x")
    assert custom.budget("fp16").action_max_abs == 0.01
    assert custom.budget("fp16").output_max_abs == DEFAULT_BUDGETS["fp16"].output_max_abs
    with pytest.raises(PlanError, match="no budget for precision 'fp4'"):
        custom.budget("fp4")


def test_check_verdicts_and_lines():
    assert check("x", 1.0, 2.0).passed and not check("x", 3.0, 2.0).passed
    assert check("cos", 0.999991, 0.99999, ">=").passed
    assert not check("nan", float("nan"), 1.0).passed and not check("inf", float("inf"), 1.0, ">=").passed
    line = check("warm: end-to-end p99", 104.2, 20.0, unit="ms", note="p50 100 ms").line()
    assert line == "warm: end-to-end p99: 104.2 ms, budget <= 20 ms (FAILED; p50 100 ms)"
