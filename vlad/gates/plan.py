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
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from vlad.backend import PRECISIONS
from vlad.errors import ProblemsError
from vlad.gates.results import GATE_ORDER

__all__ = ["DEFAULT_BUDGETS", "PRECISIONS", "GatePlan", "PlanError", "load_plan", "parse_plan"]


class PlanError(ProblemsError):
    """A gate plan is unreadable or invalid; ``problems`` lists every problem."""


@dataclass(frozen=True)
class EquivalenceBudget:
    """How far one precision may stray from the PyTorch fp32 reference.

    Output errors are in the model's output units (normalized actions); action errors and
    rollout divergence in the contract's physical units (rad for the demo's joints).
    """

    output_max_abs: float
    output_mean_abs: float
    min_cosine: float
    action_max_abs: float  # per joint, contract units
    max_decision_flips: int  # guard clamps / rate limits that differ from the reference
    rollout_max_divergence: float  # joint positions, max over joints and time
    replay_max_abs: float  # candidate (guarded) vs the actions recorded on the robot


# Initial budgets, by precision. fp32 is tight on purpose (a TF32 or fp16 computation
# labelled fp32 fails it); the others follow vlad/testing/golden.py (MAX_ABS) for the output and
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
    artifact: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    precision: str = ""


@dataclass(frozen=True)
class EquivalencePlan:
    reference: EngineSpec = EngineSpec("torch", "", {"threads": 1})
    candidates: tuple[EngineSpec, ...] | str = "auto"
    golden: str = ""
    check_golden_outputs: bool = True
    recordings: tuple[str, ...] = ()
    replay_limit: int = 0  # observations per recording; 0 = all
    rollout_episodes: int = 2  # per instruction
    rollout_seed: int = 30_000
    compile_aoti: bool = False  # torch-aoti needs a ~1 min AOTInductor compile (cached)
    budgets: Mapping[str, EquivalenceBudget] = field(default_factory=lambda: dict(DEFAULT_BUDGETS))


@dataclass(frozen=True)
class PerformancePlan:
    memory_limit_mib: float = 2048.0
    gpu_memory_limit_mib: float = 0.0  # 0: not judged
    p99_e2e_ms: float = 0.0  # 0: the contract's e2e deadline
    max_engine_p99_ms: float = 0.0  # 0: the contract's control period
    max_deadline_miss_rate: float = 0.01  # warm steady state
    max_stress_miss_rate: float = 0.05  # bursts, CPU hog, debug logging
    max_cold_start_s: float = 30.0
    warmup: int = 10  # the daemon's warm-up inferences before READY
    warm_calls: int = 1500  # observations at the control rate (30 s at 50 Hz)
    bursts: int = 50
    burst_size: int = 8
    cpu_hog: bool = True
    debug_logging: bool = True
    shape_switch_calls: int = 20  # per shape, engine only
    target_hardware: tuple[str, ...] = ()
    placement: str = "on-device"
    mode: str = "sync"


@dataclass(frozen=True)
class ClosedLoopPlan:
    task: str = "reacher"
    episodes: int = 50  # per instruction, per policy
    seed: int = 10_000
    exec_steps: int = 4
    min_success_rate: float = 0.5
    min_margin_over_no_motion: float = 0.2
    max_regression_vs_baseline: float = 0.25
    max_out_of_bounds: int = 0
    max_fallbacks: int = 0
    max_deadline_miss_rate: float = 0.02
    # Through vlad vs the same artifact in process, paired on the same seeds: at most this
    # much lower success rate per instruction (0.03: 3 points), on a quiet machine and, with
    # fidelity_under_hog, again beside a process spinning one core.
    max_fidelity_drop: float = 0.03
    fidelity_under_hog: bool = True


@dataclass(frozen=True)
class GatePlan:
    """Everything the gates are judged by; ``source`` says where it was read from."""

    required: tuple[str, ...] = GATE_ORDER
    equivalence: EquivalencePlan = EquivalencePlan()
    performance: PerformancePlan = PerformancePlan()
    closed_loop: ClosedLoopPlan = ClosedLoopPlan()
    source: str = "defaults"
    base_dir: Path | None = None

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
        parts = value.split("/")
        if value.startswith("/") or "\\" in value or any(p in ("", ".", "..") for p in parts):
            problems.append(f"{key}: {value!r} lies outside the release folder; copy the file into the release")
        elif value not in listed:
            problems.append(f"{key}: {value!r} is not an artifact of the release; list it in [[artifacts]]")
    return problems


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(str(path), ["no such plan file"]) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PlanError(str(path), [f"cannot read: {exc}"]) from None


def parse_plan(data: Mapping[str, Any], source: str, base_dir: Path | None = None) -> GatePlan:
    """Validate plan ``data`` (the TOML table); every problem in one :class:`PlanError`."""
    problems: list[str] = []
    data = dict(data)
    required = data.pop("required", list(GATE_ORDER))
    if not isinstance(required, list) or any(g not in GATE_ORDER for g in required):
        problems.append(f"required: expected a list of {', '.join(GATE_ORDER)}, got {required!r}")
        required = list(GATE_ORDER)
    eq = dict(data.pop("equivalence", {}) or {})
    budgets = dict(DEFAULT_BUDGETS)
    for precision, table in (eq.pop("budgets", {}) or {}).items():
        if precision not in PRECISIONS:
            problems.append(f"equivalence.budgets.{precision}: unknown precision (known: {', '.join(PRECISIONS)})")
            continue
        base = DEFAULT_BUDGETS.get(precision, DEFAULT_BUDGETS["fp32"])
        budgets[precision] = _struct(EquivalenceBudget, table, f"equivalence.budgets.{precision}", problems, base)
    reference = eq.pop("reference", None)
    candidates = eq.pop("candidates", "auto")
    equivalence = _struct(EquivalencePlan, eq, "equivalence", problems, EquivalencePlan())
    equivalence = replace(equivalence, budgets=budgets)
    if reference is not None:
        equivalence = replace(equivalence, reference=_engine(reference, "equivalence.reference", problems))
    if candidates != "auto":
        if not isinstance(candidates, list):
            problems.append('equivalence.candidates: expected "auto" or a list of { backend, artifact, options }')
        else:
            equivalence = replace(
                equivalence,
                candidates=tuple(
                    _engine(c, f"equivalence.candidates[{i}]", problems) for i, c in enumerate(candidates)
                ),
            )
    performance = _struct(
        PerformancePlan, data.pop("performance", {}) or {}, "performance", problems, PerformancePlan()
    )
    closed_loop = _struct(ClosedLoopPlan, data.pop("closed_loop", {}) or {}, "closed_loop", problems, ClosedLoopPlan())
    for key in data:
        problems.append(f"{key}: unknown key (known: required, equivalence, performance, closed_loop)")
    if problems:
        raise PlanError(source, problems)
    return GatePlan(tuple(required), equivalence, performance, closed_loop, source, base_dir)


def _engine(raw: Any, where: str, problems: list[str]) -> EngineSpec:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("backend"), str):
        problems.append(f'{where}: expected {{ backend = "...", artifact = "...", options = {{...}} }}')
        return EngineSpec("?")
    return _struct(EngineSpec, raw, where, problems, EngineSpec(raw["backend"]))


def _struct(cls: type, table: Any, where: str, problems: list[str], base: Any) -> Any:
    """``base`` with the fields of ``table`` (type-checked against the defaults) replaced."""
    if not isinstance(table, Mapping):
        problems.append(f"{where}: expected a table, got {type(table).__name__}")
        return base
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            problems.append(f"{where}.{key}: unknown key (known: {', '.join(known)})")
            continue
        default = getattr(base, key)
        ok, value = _coerce(value, default)
        if not ok:
            problems.append(f"{where}.{key}: expected {type(default).__name__}, got {value!r}")
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            problems.append(f"{where}.{key}: must be >= 0, got {value}")
            continue
        values[key] = value
    return replace(base, **values)


def _coerce(value: Any, default: Any) -> tuple[bool, Any]:
    if isinstance(default, bool):
        return isinstance(value, bool), value
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool), value
    if isinstance(default, str):
        return isinstance(value, str), value
    if isinstance(default, tuple):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return ok, tuple(value) if ok else value
    if isinstance(default, Mapping):
        return isinstance(value, Mapping), dict(value) if isinstance(value, Mapping) else value
    return False, value


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, Path):
        return str(v)
    return v
