"""The gate plan: which gates a release needs, and the budgets and thresholds they apply.

A plan is a TOML table, read from (first found): an explicit file (``vladctl gate --plan
FILE``), the ``[gate_plan]`` table of the candidate's manifest, a ``gates.toml`` in the
candidate's folder, or the built-in defaults below. Paths inside a plan are relative to
the file holding it (the release folder for a manifest table). A release's own plan (its
manifest's) may only name files of the release, listed as artifacts: a release copied to
a robot re-runs its gates from the copy. The schema
(docs/gates.md)::

    required = ["contract", "equivalence", "performance", "closed_loop"]

    [equivalence]
    reference = { backend = "torch", artifact = "policy.pt2", options = { threads = 1 } }
    candidates = "auto"            # or [{ backend, artifact, options, precision }, ...]
    golden = "golden.npz"          # golden fixtures: raw observations and PyTorch fp32 outputs
    recordings = ["demo.mcap"]     # sensor recordings to replay
    [equivalence.budgets.fp32]     # one table per precision: fp32 tf32 fp16 bf16 int8 fp8 mixed
    output_max_abs = 1e-4

    [performance]
    memory_limit_mib = 1024

    [closed_loop]
    min_success_rate = 0.5
    min_margin_over_no_motion = 0.2

Every key is optional; validation reports every problem at once (:class:`PlanError`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vlad import schema
from vlad.backend import PRECISIONS
from vlad.errors import ProblemsError
from vlad.files import FileRefused, load_toml_or_raise, relative_parts
from vlad.release.manifest import GateName

__all__ = ["DEFAULT_BUDGETS", "PRECISIONS", "GatePlan", "PlanError", "load_plan", "parse_plan"]

#: A gate's name, as ``required`` lists them (vlad_tools.gates.results.GATE_ORDER, in its order).
Gate = GateName  # the gate names a manifest records evidence for
# Every count, rate and limit of a plan is >= 0.
_AT_LEAST_0 = schema.bounded(0)
# Filled in by parse_plan itself, not read by the schema (see _budgets, _candidates).
_OWN = {"internal": True}


class PlanError(ProblemsError):
    """A gate plan is unreadable or invalid; ``problems`` lists every problem."""


def _limit(default: Any) -> Any:
    """A plan field holding a number >= 0."""
    return field(default=default, metadata=_AT_LEAST_0)


@dataclass(frozen=True)
class EquivalenceBudget:
    """How far one precision may stray from the PyTorch fp32 reference.

    Output errors are in the model's output units (normalized actions); action errors and
    rollout divergence in the contract's physical units (rad for the demo's joints).
    """

    output_max_abs: float = field(metadata=_AT_LEAST_0)
    output_mean_abs: float = field(metadata=_AT_LEAST_0)
    min_cosine: float = field(metadata=_AT_LEAST_0)
    action_max_abs: float = field(metadata=_AT_LEAST_0)  # per joint, contract units
    max_decision_flips: int = field(metadata=_AT_LEAST_0)  # guard clamps / rate limits unlike the reference
    rollout_max_divergence: float = field(metadata=_AT_LEAST_0)  # joint positions, max over joints and time
    replay_max_abs: float = field(metadata=_AT_LEAST_0)  # candidate (guarded) vs the actions recorded on the robot


# Initial budgets, by precision. fp32 is tight on purpose (a TF32 or fp16 computation
# labelled fp32 fails it); the others follow tools/vlad_tools/testing/golden.py (MAX_ABS) for the output and
# scale the rest with it. A release's plan owns its approved budget.
DEFAULT_BUDGETS: dict[str, EquivalenceBudget] = {
    "fp32": EquivalenceBudget(1e-4, 1e-5, 0.99999, 2e-4, 0, 0.01, 2e-3),
    "tf32": EquivalenceBudget(1e-2, 1e-3, 0.9999, 2e-2, 2, 0.05, 2e-2),
    "fp16": EquivalenceBudget(3e-2, 3e-3, 0.999, 5e-2, 4, 0.1, 5e-2),
    "mixed": EquivalenceBudget(3e-2, 3e-3, 0.999, 5e-2, 4, 0.1, 5e-2),
    "bf16": EquivalenceBudget(1e-1, 1e-2, 0.995, 0.15, 8, 0.2, 0.15),
    "int8": EquivalenceBudget(0.2, 2e-2, 0.99, 0.3, 16, 0.3, 0.3),
    "fp8": EquivalenceBudget(0.2, 2e-2, 0.99, 0.3, 16, 0.3, 0.3),
}


@dataclass(frozen=True)
class EngineSpec:
    """A backend, the release artifact it loads and its options (``precision`` is the label
    its budget is looked up by; empty: what the loaded session reports)."""

    backend: str
    artifact: str = field(default="", metadata={"allow_empty": True})
    options: Mapping[str, Any] = field(default_factory=dict)
    precision: str = field(default="", metadata={"allow_empty": True})


@dataclass(frozen=True)
class EquivalencePlan:
    reference: EngineSpec = EngineSpec("torch", "", {"threads": 1})
    candidates: tuple[EngineSpec, ...] | str = field(default="auto", metadata=_OWN)  # "auto" or engines
    golden: str = field(default="", metadata={"allow_empty": True})
    check_golden_outputs: bool = True
    recordings: tuple[str, ...] = ()
    replay_limit: int = _limit(0)  # observations per recording; 0 = all
    rollout_episodes: int = _limit(2)  # per instruction
    rollout_seed: int = _limit(30_000)
    compile_aoti: bool = False  # torch-aoti needs a ~1 min AOTInductor compile (cached)
    budgets: Mapping[str, EquivalenceBudget] = field(default_factory=lambda: dict(DEFAULT_BUDGETS), metadata=_OWN)


@dataclass(frozen=True)
class PerformancePlan:
    memory_limit_mib: float = _limit(2048.0)
    gpu_memory_limit_mib: float = _limit(0.0)  # 0: not judged
    p99_e2e_ms: float = _limit(0.0)  # 0: the contract's e2e deadline
    max_engine_p99_ms: float = _limit(0.0)  # 0: the contract's control period
    max_deadline_miss_rate: float = _limit(0.01)  # warm steady state
    max_stress_miss_rate: float = _limit(0.05)  # bursts, CPU hog, debug logging
    max_cold_start_s: float = _limit(30.0)
    warmup: int = _limit(10)  # the daemon's warm-up inferences before READY
    warm_calls: int = _limit(1500)  # observations at the control rate (30 s at 50 Hz)
    bursts: int = _limit(50)
    burst_size: int = _limit(8)
    cpu_hog: bool = True
    debug_logging: bool = True
    shape_switch_calls: int = _limit(20)  # per shape, engine only
    target_hardware: tuple[str, ...] = ()
    placement: str = "on-device"
    mode: str = "sync"


@dataclass(frozen=True)
class ClosedLoopPlan:
    task: str = "reacher"
    episodes: int = _limit(50)  # per instruction, per policy
    seed: int = _limit(10_000)
    exec_steps: int = _limit(4)
    min_success_rate: float = _limit(0.5)
    min_margin_over_no_motion: float = _limit(0.2)
    max_regression_vs_baseline: float = _limit(0.25)
    max_out_of_bounds: int = _limit(0)
    max_fallbacks: int = _limit(0)
    max_deadline_miss_rate: float = _limit(0.02)
    # Through vlad vs the same artifact in process, paired on the same seeds: at most this
    # much lower success rate per instruction (0.03: 3 points), on a quiet machine and, with
    # fidelity_under_hog, again beside a process spinning one core.
    max_fidelity_drop: float = _limit(0.03)
    fidelity_under_hog: bool = True
    # The inference latency the target robot will see, ms (from `vladctl plan` for its
    # hardware, or measured there); 0: not judged. The candidate is served again with that
    # much injected (± latency_jitter), to a streaming controller executing the newest
    # chunk, and judged against its own rate in process at zero latency (same seeds): at
    # most max_latency_drop lower per instruction, at most max_idle_ticks periods without a
    # valid waypoint, no seam stepping beyond the contract's rate limit.
    latency_ms: float = _limit(0.0)
    latency_jitter: float = _limit(0.1)
    max_latency_drop: float = _limit(0.05)
    max_idle_ticks: int = _limit(0)


@dataclass(frozen=True)
class GatePlan:
    """Everything the gates are judged by; ``source`` says where it was read from."""

    required: tuple[Gate, ...] = typing.get_args(Gate)
    equivalence: EquivalencePlan = EquivalencePlan()
    performance: PerformancePlan = PerformancePlan()
    closed_loop: ClosedLoopPlan = ClosedLoopPlan()
    source: str = field(default="defaults", metadata=_OWN)
    base_dir: Path | None = field(default=None, metadata=_OWN)

    def path(self, value: str) -> Path | None:
        """A plan path resolved against the plan's folder; None for an empty value."""
        if not value:
            return None
        p = Path(value).expanduser()
        return p if p.is_absolute() or self.base_dir is None else (self.base_dir / p).resolve()

    def with_overrides(self, **sections: Mapping[str, Any]) -> GatePlan:
        """A copy with some fields replaced, e.g. ``closed_loop={"episodes": 4}`` (CLI options)."""
        out = self
        for name, values in sections.items():
            values = {k: v for k, v in values.items() if v is not None}
            if values:
                out = replace(out, **{name: replace(getattr(out, name), **values)})
        return out

    def budget(self, precision: str) -> EquivalenceBudget:
        """The equivalence budget for ``precision``; a precision without one is an error."""
        try:
            return self.equivalence.budgets[precision]
        except KeyError:
            raise PlanError(
                self.source,
                [f"equivalence.budgets.{precision}: no budget for precision {precision!r}; add one to the plan"],
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for the report)."""
        d = dataclasses.asdict(self)
        d["base_dir"] = str(self.base_dir) if self.base_dir else None
        return _plain(d)


# ---- reading --------------------------------------------------------------------------


def load_plan(
    candidate_dir: Path, plan_file: str | Path | None = None, manifest_document: Mapping[str, Any] | None = None
) -> GatePlan:
    """The plan for a candidate release folder: ``plan_file``, else the manifest's
    ``[gate_plan]``, else ``gates.toml`` beside the manifest, else the defaults."""
    if plan_file is not None:
        path = Path(plan_file)
        return parse_plan(_read_toml(path), str(path), path.resolve().parent)
    if manifest_document and isinstance(manifest_document.get("gate_plan"), Mapping):
        source = f"{candidate_dir}/manifest.toml [gate_plan]"
        plan = parse_plan(manifest_document["gate_plan"], source, Path(candidate_dir).resolve())
        problems = outside_release(plan, manifest_document)
        if problems:
            raise PlanError(source, problems)
        return plan
    local = Path(candidate_dir) / "gates.toml"
    if local.is_file():
        return parse_plan(_read_toml(local), str(local), local.resolve().parent)
    return GatePlan()


def plan_files(plan: GatePlan) -> list[tuple[str, str]]:
    """``(key, path)`` of every file a plan names (golden fixtures, recordings)."""
    eq = plan.equivalence
    files = [("equivalence.golden", eq.golden)] if eq.golden else []
    return files + [(f"equivalence.recordings[{i}]", r) for i, r in enumerate(eq.recordings)]


def outside_release(plan: GatePlan, manifest_document: Mapping[str, Any]) -> list[str]:
    """A release's own plan names only files of the release: plain relative paths listed
    as artifacts (so they are hashed, signed and copied with it). One problem per other."""
    listed = {a.get("path") for a in manifest_document.get("artifacts", []) if isinstance(a, Mapping)}
    problems = []
    for key, value in plan_files(plan):
        try:
            relative_parts(value)
        except FileRefused:
            problems.append(f"{key}: {value!r} lies outside the release folder; copy the file into the release")
            continue
        if value not in listed:
            problems.append(f"{key}: {value!r} is not an artifact of the release; list it in [[artifacts]]")
    return problems


def _read_toml(path: Path) -> dict[str, Any]:
    return load_toml_or_raise(path, lambda problem: PlanError(str(path), [problem]), "no such plan file")


def parse_plan(data: Mapping[str, Any], source: str, base_dir: Path | None = None) -> GatePlan:
    """Validate plan ``data`` (the TOML table); every problem in one :class:`PlanError`."""
    problems: list[str] = []
    data = dict(data)
    budgets: dict[str, EquivalenceBudget] = dict(DEFAULT_BUDGETS)
    candidates: tuple[EngineSpec, ...] | str = "auto"
    if isinstance(data.get("equivalence"), dict):  # else the schema reports it
        eq = data["equivalence"] = dict(data["equivalence"])
        budgets = _budgets(eq.pop("budgets", {}), problems)
        candidates = _candidates(eq.pop("candidates", "auto"), problems)
    plan = schema.convert(GatePlan, data, "", problems, checks=_CHECKS)
    if problems:
        raise PlanError(source, problems)
    equivalence = replace(plan.equivalence, budgets=budgets, candidates=candidates)
    return replace(plan, equivalence=equivalence, source=source, base_dir=base_dir)


def _budgets(raw: Any, problems: list[str]) -> dict[str, EquivalenceBudget]:
    """The default budgets with the plan's tables laid over them, key by key: a plan that
    sets one key of a precision keeps that precision's defaults for the others (a table
    keyed by precision, each over its own defaults: more than the schema's free-form Mapping)."""
    budgets = dict(DEFAULT_BUDGETS)
    tables = schema.convert(Mapping[str, Any], raw, "equivalence.budgets", problems)
    for precision, table in tables.items() if isinstance(tables, dict) else ():
        path = f"equivalence.budgets.{precision}"
        if precision not in PRECISIONS:
            problems.append(f"{path}: unknown precision (known: {', '.join(PRECISIONS)})")
            continue
        base = dataclasses.asdict(DEFAULT_BUDGETS.get(precision, DEFAULT_BUDGETS["fp32"]))
        budget = schema.convert(
            EquivalenceBudget, {**base, **table} if isinstance(table, dict) else table, path, problems
        )
        if isinstance(budget, EquivalenceBudget):
            budgets[precision] = budget
    return budgets


def _candidates(raw: Any, problems: list[str]) -> tuple[EngineSpec, ...] | str:
    """``"auto"`` or the engines an array of tables names (the schema has no "this string
    or an array" type)."""
    if raw == "auto":
        return "auto"
    if not isinstance(raw, list):
        problems.append(f'equivalence.candidates: expected "auto" or an array of engine tables, got {schema.kind(raw)}')
        return "auto"
    engines = schema.convert(tuple[EngineSpec, ...], raw, "equivalence.candidates", problems, checks=_CHECKS)
    return engines if isinstance(engines, tuple) else "auto"


def _check_engine(spec: EngineSpec, path: str, problems: list[str]) -> None:
    if spec.precision and spec.precision not in PRECISIONS:
        problems.append(f"{path}.precision: unknown precision {spec.precision!r} (known: {', '.join(PRECISIONS)})")


_CHECKS: dict[type, schema.Check] = {EngineSpec: _check_engine}


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, Path):
        return str(v)
    return v
