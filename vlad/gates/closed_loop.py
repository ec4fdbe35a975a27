"""Closed-loop gate: seeded episodes of the simulated task through the real daemon.

Candidate and baseline each serve from their own ``vlad serve`` process; a controller
drives the MuJoCo arm in real time at the contract's control period (:mod:`vlad.gates.controller`).
Per instruction: success rate with its Wilson interval, final distances; over the run:
guard interventions and safety events (bound violations, deadline misses, fallbacks,
hold chunks). The no-motion baseline (hold the starting pose) runs on the same seeds.

Thresholds (plan ``[closed_loop]``): on *every* instruction the candidate succeeds in at
least ``min_success_rate`` of the episodes, beats no motion by ``min_margin_over_no_motion``
and is not more than ``max_regression_vs_baseline`` below the baseline; out-of-bounds
chunks, fallbacks and the deadline-miss rate stay within their limits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlad.gates.controller import Controller, EpisodeLog, run_episode
from vlad.gates.launcher import RunningDaemon
from vlad.gates.metrics import percentiles, wilson_interval
from vlad.gates.plan import ClosedLoopPlan, GatePlan
from vlad.gates.results import GateError, GateResult, check
from vlad.gates.subject import Subject

TASKS = ("reacher",)


def task_instructions(name: str) -> tuple[str, ...]:
    """The instructions a task's episodes cycle through."""
    if name not in TASKS:
        raise GateError(f"closed_loop.task = {name!r}: unknown task (known: {', '.join(TASKS)})")
    from vlad.demo import sim

    return sim.INSTRUCTIONS


def make_task(name: str, render: bool = True):
    """The simulated task and its instructions; only the demo's Reacher exists so far."""
    instructions = task_instructions(name)
    from vlad.demo import sim

    return sim.ReacherTask(render=render), instructions


def seeds(plan: ClosedLoopPlan) -> range:
    """Evaluation seeds: disjoint from the demo's training seeds (0..) by default."""
    return range(plan.seed, plan.seed + plan.episodes)


def run_episodes(
    subject: Subject, plan: GatePlan, label: str, progress=print, keys_dir: str | None = None, recorder: Any = None
) -> dict[str, Any]:
    """Serve ``subject`` and run ``plan.closed_loop.episodes`` per instruction through it."""
    cl = plan.closed_loop
    task, instructions = make_task(cl.task)
    logs: list[EpisodeLog] = []
    try:
        with RunningDaemon(subject, warmup=plan.performance.warmup, keys_dir=keys_dir) as daemon:
            daemon.wait_ready()
            with Controller(daemon.endpoints, name=f"gate-{label}", recorder=recorder) as ctl:
                before = ctl.status()
                period_ns = int(before["control_period_ms"] * 1e6)
                for instruction in instructions:
                    ok = 0
                    for i, seed in enumerate(seeds(cl)):
                        log = run_episode(ctl, task, seed, instruction, period_ns, cl.exec_steps)
                        logs.append(log)
                        ok += log.success
                        progress(
                            f"  closed loop {label}: {instruction!r} episode {i + 1}/{cl.episodes}, {ok} successes"
                        )
                after = ctl.status()
    finally:
        task.close()
    return summarize(logs, instructions, before, after)


def summarize(logs: list[EpisodeLog], instructions, before: dict, after: dict) -> dict[str, Any]:
    """Success per instruction (with Wilson intervals) and the run's safety events."""
    per: dict[str, Any] = {}
    for instruction in instructions:
        mine = [e for e in logs if e.instruction == instruction]
        ok = sum(e.success for e in mine)
        lo, hi = wilson_interval(ok, len(mine))
        per[instruction] = {
            "episodes": len(mine),
            "successes": ok,
            "rate": ok / len(mine) if mine else 0.0,
            "wilson95": [lo, hi],
            "mean_final_distance_m": sum(e.final_distance for e in mine) / max(1, len(mine)),
        }
    c0, c1 = before.get("counters", {}), after.get("counters", {})

    def delta(key: str) -> int:
        return int(c1.get(key, 0)) - int(c0.get(key, 0))

    published = delta("published")
    fallbacks = sum(int(v) - int(c0.get(k, 0)) for k, v in c1.items() if k.startswith("published_fallback"))
    safety = {
        "published": published,
        "deadline_misses": delta("deadline_misses"),
        "deadline_miss_rate": delta("deadline_misses") / published if published else 0.0,
        "bound_clamps": delta("guard_bounds"),
        "out_of_bounds": delta("guard_out_of_bounds"),
        "rate_clamps": delta("guard_rate"),
        "interventions": delta("interventions"),
        "intervention_rate": delta("interventions") / published if published else 0.0,
        "hold_chunks": delta("published_hold"),
        "fallbacks": fallbacks + (0 if str(after.get("serving", "release")).startswith("release") else 1),
        "held_periods": sum(e.held_periods for e in logs),
        "final_state": after.get("state"),
    }
    latencies = [x for e in logs for x in e.latencies_ms]
    return {
        "per_instruction": per,
        "safety": safety,
        "episodes": [e.to_dict() for e in logs],
        "latency_ms": percentiles(latencies),
    }


def no_motion(plan: ClosedLoopPlan) -> dict[str, Any]:
    """The no-motion baseline on the same seeds (in process: it needs no policy server)."""
    from vlad.demo import sim

    task, instructions = make_task(plan.task, render=False)
    per = {}
    try:
        for instruction in instructions:
            results = [
                sim.run_episode(task, sim.zero_policy(task), s, instruction, plan.exec_steps) for s in seeds(plan)
            ]
            ok = sum(r.success for r in results)
            per[instruction] = {
                "episodes": len(results),
                "successes": ok,
                "rate": ok / len(results),
                "wilson95": list(wilson_interval(ok, len(results))),
                "mean_final_distance_m": sum(r.final_distance for r in results) / len(results),
            }
    finally:
        task.close()
    return {"per_instruction": per}


def run_closed_loop_gate(
    candidate: Subject, baseline: Subject, plan: GatePlan, progress=print, keys_dir: str | None = None
) -> GateResult:
    """Candidate vs baseline vs no motion, judged by the plan's thresholds."""
    cl = plan.closed_loop
    result = GateResult("closed_loop")
    progress(
        f"  closed loop: {cl.episodes} episodes per instruction, seeds {cl.seed}..{cl.seed + cl.episodes - 1}, "
        f"real time through vlad serve"
    )
    cand = run_episodes(candidate, plan, "candidate", progress, keys_dir)
    if Path(baseline.path) == Path(candidate.path):
        base, same = cand, True  # the same release: its episodes are the baseline's
    else:
        base, same = run_episodes(baseline, plan, "baseline", progress, keys_dir), False
    zero = no_motion(cl)
    for instruction, c in cand["per_instruction"].items():
        b = base["per_instruction"][instruction]["rate"]
        z = zero["per_instruction"][instruction]["rate"]
        lo, hi = c["wilson95"]
        ci = f"{c['successes']}/{c['episodes']}, 95 % CI {lo:.2f}-{hi:.2f}"
        result.add(check(f"success rate {instruction!r}", c["rate"], cl.min_success_rate, ">=", note=ci))
        result.add(
            check(
                f"margin over no motion {instruction!r}",
                round(c["rate"] - z, 6),
                cl.min_margin_over_no_motion,
                ">=",
                note=f"no motion {z:.2f}",
            )
        )
        result.add(
            check(
                f"regression vs baseline {instruction!r}",
                round(b - c["rate"], 6),
                cl.max_regression_vs_baseline,
                "<=",
                note=f"baseline {b:.2f}",
            )
        )
    s = cand["safety"]
    result.add(check("out-of-bounds chunks", s["out_of_bounds"], cl.max_out_of_bounds))
    result.add(check("fallbacks", s["fallbacks"], cl.max_fallbacks))
    result.add(
        check(
            "deadline miss rate",
            round(s["deadline_miss_rate"], 6),
            cl.max_deadline_miss_rate,
            note=f"{s['deadline_misses']} of {s['published']} chunks",
        )
    )
    result.details = {
        "candidate": cand,
        "baseline": base,
        "baseline_is_candidate": same,
        "no_motion": zero,
        "seeds": [cl.seed, cl.seed + cl.episodes - 1],
        "exec_steps": cl.exec_steps,
        "task": cl.task,
    }
    return result


def record_demo(
    subject: Subject,
    out: Path,
    episodes: int,
    *,
    max_bytes: int,
    max_seconds: float,
    seed: int = 20_000,
    progress=print,
) -> dict[str, Any]:
    """Record ``episodes`` real-time demo episodes (alternating instructions) served by
    ``subject``, through a controller-side tap: the frames it sends and receives."""
    from vlad.gates.recording import McapRecorder

    plan = GatePlan().with_overrides(closed_loop={"episodes": 1})
    task, instructions = make_task(plan.closed_loop.task)
    meta = {"release": subject.id, "contract_sha256": subject.contract.sha256, "task": plan.closed_loop.task}
    recorder = McapRecorder(out, max_bytes=max_bytes, max_seconds=max_seconds, tap="controller", metadata=meta)
    try:
        with RunningDaemon(subject, warmup=plan.performance.warmup) as daemon:
            daemon.wait_ready()
            with Controller(daemon.endpoints, name="vladctl-record", recorder=recorder) as ctl:
                period_ns = int(ctl.status()["control_period_ms"] * 1e6)
                for i in range(episodes):
                    instruction = instructions[i % len(instructions)]
                    log = run_episode(ctl, task, seed + i, instruction, period_ns, plan.closed_loop.exec_steps)
                    progress(
                        f"  record: episode {i + 1}/{episodes} {instruction!r}: "
                        f"{'success' if log.success else 'miss'}, {recorder.stats()['observations']} observations"
                    )
                    if recorder.stop_reason:
                        progress(f"  record: stopped: {recorder.stop_reason}")
                        break
                ctl.status()
    finally:
        task.close()
        stats = recorder.close()
    return stats
