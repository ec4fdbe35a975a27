"""Equivalence gate: every backend/precision candidate computes what PyTorch fp32 computes.

Three stages, each held to the budget of the candidate's precision (plan
``equivalence.budgets.<precision>``):

1. **golden fixtures**: the release's raw observations -> the one preprocessing -> the
   reference and each candidate. Per output: max/mean abs error, max rel error, cosine
   similarity; per joint: action error in the contract's units; guard decisions (bound
   clamps, rate limits) that flip between reference and candidate. The reference itself
   must reproduce the recorded PyTorch fp32 outputs and the preprocessing the recorded
   model inputs.
2. **recorded sensor replays** (:mod:`vlad_tools.gates.replay`): the same comparisons on what
   the robot saw, plus the candidate's guarded actions against what the robot received
   and its actions against the baseline release's.
3. **rollouts**: multi-step episodes in the simulator from the same seed and the same
   noise, reference vs candidate: joint trajectories over time, their divergence.

All in process (sessions loaded from the release folder); the daemon path is the
performance gate's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vlad.processing import RawObservation, decode_actions, preprocess
from vlad_tools.gates.engines import Engine, candidate_engines, load_engine, reference_engine
from vlad_tools.gates.metrics import DecisionStats, ErrorStats, JointErrors
from vlad_tools.gates.plan import GatePlan
from vlad_tools.gates.results import GateError, GateResult, check
from vlad_tools.gates.subject import Subject


@dataclass
class Sample:
    """One observation both engines run on."""

    label: str
    raw: RawObservation
    inputs: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]


def load_golden(path: Path) -> list[dict[str, Any]]:
    """Golden fixtures from an ``.npz`` (:func:`save_golden`'s format): per case ``raw``
    (a :class:`RawObservation`), ``inputs``, ``outputs`` and, where recorded, ``actions``."""
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise GateError(f"golden fixtures {path}: cannot read ({exc}); pass --golden FILE") from None
    out = []
    for i in range(len({k.split("/")[0] for k in z.files})):
        p = f"{i}/"
        try:
            case = {
                "raw": RawObservation(
                    images=_under(z, p + "raw/image/"),
                    proprio=z[p + "raw/proprio"],
                    instruction=str(z[p + "raw/instruction"]),
                    sequence=int(z[p + "raw/sequence"]),
                ),
                "inputs": _under(z, p + "inputs/"),
                "outputs": _under(z, p + "outputs/"),
            }
            if p + "actions" in z.files:
                case["actions"] = z[p + "actions"]
        except (KeyError, ValueError, TypeError) as exc:
            raise GateError(f"golden fixtures {path}: case {i} is incomplete or malformed ({exc})") from None
        out.append(case)
    return out


def _under(z: Any, prefix: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` whose names start with ``prefix``, by the rest of the name."""
    return {k[len(prefix) :]: z[k] for k in z.files if k.startswith(prefix)}


def save_golden(path: Path, cases: Iterable[Mapping[str, Any]]) -> None:
    """Write golden fixtures for :func:`load_golden`: per case its ``raw`` observation, the
    model ``inputs`` the contract's preprocessing makes of it, the reference's ``outputs``
    and, where given, the decoded ``actions``. Plain arrays only (no pickle)."""
    arrays: dict[str, np.ndarray] = {}
    for i, case in enumerate(cases):
        raw: RawObservation = case["raw"]
        for cam, img in raw.images.items():
            arrays[f"{i}/raw/image/{cam}"] = img
        arrays[f"{i}/raw/proprio"] = np.asarray(raw.proprio)
        arrays[f"{i}/raw/instruction"] = np.asarray(raw.instruction or "")
        arrays[f"{i}/raw/sequence"] = np.asarray(raw.sequence, dtype=np.int64)
        for group in ("inputs", "outputs"):
            for name, value in case[group].items():
                arrays[f"{i}/{group}/{name}"] = value
        if case.get("actions") is not None:
            arrays[f"{i}/actions"] = case["actions"]
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]  # numpy stubs: a key could be allow_pickle


def _run(engine: Engine, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in engine.session.infer(inputs).items()}


class _Comparison:
    """Accumulates one candidate's errors on one stage."""

    def __init__(self, subject: Subject, near: float) -> None:
        self.subject = subject
        self.outputs: dict[str, ErrorStats] = {}
        self.actions = JointErrors(tuple(j.name for j in subject.contract.action.joints))
        self.decisions = DecisionStats(near)

    def add(self, sample: Sample, got: dict[str, np.ndarray]) -> None:
        c = self.subject.contract
        for name, ref in sample.reference.items():
            self.outputs.setdefault(name, ErrorStats()).add(ref, got[name])
        a_ref, a_got = decode_actions(c, sample.reference), decode_actions(c, got)
        self.actions.add(a_ref, a_got)
        self.decisions.add(c, a_ref, a_got, sample.raw.proprio, sample.label)

    def judge(self, result: GateResult, prefix: str, budget) -> dict[str, Any]:
        joints = self.subject.contract.action.joints
        for name, e in self.outputs.items():
            result.add(
                check(
                    f"{prefix}: output {name} max abs",
                    e.max_abs,
                    budget.output_max_abs,
                    note=f"max rel {e.max_rel:.3g}, {e.samples} samples",
                )
            )
            result.add(check(f"{prefix}: output {name} mean abs", e.mean_abs, budget.output_mean_abs))
            result.add(check(f"{prefix}: output {name} min cosine", e.min_cosine, budget.min_cosine, ">="))
        for joint, err in zip(joints, self.actions.max_per_joint(), strict=True):
            result.add(check(f"{prefix}: {joint.name} action max abs", err, budget.action_max_abs, unit=joint.unit))
        result.add(
            check(
                f"{prefix}: guard decision flips",
                self.decisions.flips,
                budget.max_decision_flips,
                note="; ".join(self.decisions.examples[:2]),
            )
        )
        return {
            "outputs": {k: v.to_dict() for k, v in self.outputs.items()},
            "action_max_abs_per_joint": self.actions.max_per_joint(),
            "action_errors": self.actions.per_joint().tolist(),
            "decisions": self.decisions.to_dict(),
        }


def golden_samples(subject: Subject, plan: GatePlan, reference: Engine, result: GateResult) -> list[Sample]:
    """Golden fixtures preprocessed by the candidate's contract and run by the reference;
    checks that preprocessing and the reference reproduce the recorded tensors."""
    path = plan.path(plan.equivalence.golden) or (subject.path / "golden.npz")
    if not path.is_file():
        result.details.setdefault("skipped_stages", []).append(f"golden: no fixtures ({path}); set equivalence.golden")
        return []
    fixtures = load_golden(path)
    budget = plan.budget("fp32")
    pre, ref_err, samples = ErrorStats(), ErrorStats(), []
    for i, fx in enumerate(fixtures):
        inputs = preprocess(subject.contract, subject.tokenizer(), fx["raw"])
        for name, stored in fx["inputs"].items():
            pre.add(stored, inputs[name])
        out = _run(reference, inputs)
        for name, stored in fx["outputs"].items():
            ref_err.add(stored, out[name])
        samples.append(Sample(f"golden[{i}]", fx["raw"], inputs, out))
    result.add(
        check(
            "golden: preprocessing reproduces the recorded model inputs",
            pre.max_abs,
            1e-6,
            note="a different normalization, resize or tokenizer changes them",
        )
    )
    if plan.equivalence.check_golden_outputs:
        result.add(
            check(
                "golden: reference reproduces the recorded PyTorch fp32 outputs", ref_err.max_abs, budget.output_max_abs
            )
        )
    result.details["golden"] = {
        "path": str(path),
        "fixtures": len(fixtures),
        "preprocessing_max_abs": pre.max_abs,
        "reference_vs_recorded_outputs_max_abs": ref_err.max_abs,
    }
    return samples


def replay_samples(subject: Subject, plan: GatePlan, reference: Engine, progress) -> list[tuple[Any, list[Sample]]]:
    """(recording, samples) for every recording in the plan, run by the reference."""
    from vlad_tools.gates.recording import read_recording
    from vlad_tools.gates.replay import raw_observation

    out = []
    for rel in plan.equivalence.recordings:
        path = plan.path(rel)
        if path is None:
            raise GateError("equivalence.recordings: an entry is an empty path")
        rec = read_recording(path, limit=plan.equivalence.replay_limit).usable()
        samples = []
        for obs in rec.observations:
            raw = raw_observation(obs)
            inputs = preprocess(subject.contract, subject.tokenizer(), raw)
            samples.append(Sample(f"{rec.path.name}[{obs.seq}]", raw, inputs, _run(reference, inputs)))
        refused = f" ({rec.refused} the daemon refused, skipped)" if rec.refused else ""
        progress(f"  equivalence: replay {rec.path.name}: {len(samples)} observations run by the reference{refused}")
        out.append((rec, samples))
    return out


def rollouts(subject: Subject, engine: Engine, plan: GatePlan) -> list[np.ndarray]:
    """Joint trajectories ``[steps + 1, J]`` of seeded episodes driven by ``engine`` in process
    (the episode runner's :class:`~vlad_tools.episodes.InProcessLink`: the same noise on every engine)."""
    from vlad_tools.episodes import InProcessLink, contract_infer, run_episode
    from vlad_tools.gates.closed_loop import make_task

    eq, cl = plan.equivalence, plan.closed_loop
    contract = subject.contract
    task, instructions = make_task(cl.task)
    link = InProcessLink.for_contract(contract, contract_infer(contract, subject.tokenizer(), engine.session))
    trajectories = []
    try:
        for instruction in instructions:
            for k in range(eq.rollout_episodes):
                log = run_episode(
                    task,
                    link,
                    eq.rollout_seed + k,
                    instruction,
                    period_ns=int(contract.timing.control_period_ms * 1e6),
                    exec_steps=cl.exec_steps,
                    chunk_length=contract.action.chunk_length,
                )
                trajectories.append(np.asarray(log.trajectory, dtype=np.float64))
    finally:
        task.close()
    return trajectories


def run_equivalence_gate(candidate: Subject, baseline: Subject, plan: GatePlan, progress=print) -> GateResult:
    """Compare every candidate engine of ``candidate`` with its PyTorch fp32 reference."""
    result = GateResult("equivalence")
    eq = plan.equivalence
    reference = load_engine(candidate, reference_engine(candidate, plan), progress)
    engines = candidate_engines(candidate, plan, reference, progress)
    baseline_engine = None
    try:
        for e in engines:
            if not e.skipped:
                load_engine(candidate, e, progress)
        live = [e for e in engines if e.session is not None]
        progress(
            f"  equivalence: reference {reference.id}; candidates: "
            + ", ".join(e.id for e in live)
            + (f"; skipped: {', '.join(e.id for e in engines if e.skipped)}" if len(live) < len(engines) else "")
        )
        golden = golden_samples(candidate, plan, reference, result)
        replays = replay_samples(candidate, plan, reference, progress)
        if replays:
            baseline_engine = load_engine(
                baseline, Engine(f"baseline {baseline.serving.backend}", baseline.serving, required=True), progress
            )
        ref_rollouts = rollouts(candidate, reference, plan) if eq.rollout_episodes else []
        per_candidate: dict[str, Any] = {}
        for e in live:
            budget = plan.budget(e.precision)
            near = 10 * budget.action_max_abs
            d: dict[str, Any] = {
                "precision": e.precision,
                "spec": {"backend": e.spec.backend, "artifact": e.spec.artifact, "options": dict(e.spec.options)},
                "description": _describe(e),
            }
            if golden:
                comp = _Comparison(candidate, near)
                for s in golden:
                    comp.add(s, _run(e, s.inputs))
                d["golden"] = comp.judge(result, f"{e.id} golden", budget)
                progress(
                    f"  equivalence: {e.id}: golden {len(golden)}/{len(golden)}, "
                    f"max action error {max(d['golden']['action_max_abs_per_joint']):.3g}"
                )
            for rec, samples in replays:
                d.setdefault("replay", {})[rec.path.name] = _replay(
                    candidate, e, baseline_engine, rec, samples, result, budget, near, progress
                )
            if ref_rollouts:
                d["rollouts"] = _rollouts(candidate, e, plan, ref_rollouts, result, budget)
                progress(
                    f"  equivalence: {e.id}: {len(ref_rollouts)} rollouts, max divergence "
                    f"{d['rollouts']['max_divergence']:.3g}"
                )
            per_candidate[e.id] = d
        result.details.update(
            {
                "reference": {"id": reference.id, "description": _describe(reference)},
                "candidates": per_candidate,
                "skipped": {e.id: e.skipped for e in engines if e.skipped},
                "budgets": {p: vars(b) for p, b in eq.budgets.items()},
                "joints": [j.name for j in candidate.contract.action.joints],
                "units": [j.unit for j in candidate.contract.action.joints],
            }
        )
        if not live:
            result.fail("no candidate engine could be loaded")
    finally:
        for engine in [reference, baseline_engine, *engines]:
            if engine is not None:
                engine.close()
    return result


def _describe(e: Engine) -> dict[str, Any]:
    if e.session is None:
        return {}
    d = e.session.describe()
    return {
        "backend": d.backend,
        "runtime": f"{d.runtime} {d.runtime_version}",
        "device": d.device,
        "precision": d.precision,
        "providers": list(d.providers),
    }


def _replay(subject, e: Engine, baseline: Engine | None, rec, samples, result, budget, near, progress) -> dict:
    from vlad_tools.gates.replay import replay_guard

    contract = subject.contract
    comp = _Comparison(subject, near)
    actions, vs_base = {}, JointErrors(tuple(j.name for j in contract.action.joints))
    for s in samples:
        got = _run(e, s.inputs)
        comp.add(s, got)
        actions[s.raw.sequence] = decode_actions(contract, got)
        if baseline is not None:
            vs_base.add(decode_actions(contract, _run(baseline, s.inputs)), actions[s.raw.sequence])
    name = rec.path.name
    d = comp.judge(result, f"{e.id} replay {name}", budget)
    g = replay_guard(contract, rec, actions, {o.seq: o for o in rec.observations})
    worst = max(g.errors.max_per_joint(), default=0.0)
    checks = [
        check(
            f"{e.id} replay {name}: guarded actions vs recorded max abs",
            worst,
            budget.replay_max_abs,
            note=f"{g.compared} chunks",
        ),
        check(
            f"{e.id} replay {name}: interventions differing from recorded",
            g.flips,
            budget.max_decision_flips,
            note="; ".join(g.examples[:2]),
        ),
    ]
    if _same_model(subject, rec):
        for c in checks:
            result.add(c)
    else:  # another model made the recording (a retrain): what it did is context, not a budget
        d["informational"] = [c.line() for c in checks]
    d.update(
        {
            "observations": len(samples),
            "chunks_compared": g.compared,
            "vs_recorded_max_abs_per_joint": g.errors.max_per_joint(),
            "intervention_flips_vs_recorded": g.flips,
            "vs_baseline_max_abs_per_joint": vs_base.max_per_joint() if baseline is not None else None,
        }
    )
    progress(f"  equivalence: {e.id}: replay {name} {len(samples)}/{len(samples)}, guarded vs recorded max {worst:.3g}")
    return d


def _same_model(subject: Subject, rec) -> bool:
    """Whether the recorded actions came from the candidate's own trained weights: the
    recording names this release, or the candidate only re-exports or quantizes its parent."""
    made_by = rec.metadata.get("vlad.recording", {}).get("release")
    return made_by == subject.id or subject.manifest.lineage.change in ("export_only", "quantization")


def _rollouts(subject, e: Engine, plan: GatePlan, ref: list[np.ndarray], result, budget) -> dict:
    got = rollouts(subject, e, plan)
    div = [np.abs(g - r).max(axis=1) for g, r in zip(got, ref, strict=True)]  # [steps + 1] per episode
    worst = float(max(d.max() for d in div)) if div else 0.0
    unit = subject.contract.action.joints[0].unit
    result.add(
        check(
            f"{e.id} rollouts: joint trajectory divergence",
            worst,
            budget.rollout_max_divergence,
            unit=unit,
            note=f"{len(div)} episodes of {len(div[0]) - 1} periods" if div else "",
        )
    )
    return {
        "max_divergence": worst,
        "divergence": [d.tolist() for d in div],
        "period_ms": subject.contract.timing.control_period_ms,
    }
