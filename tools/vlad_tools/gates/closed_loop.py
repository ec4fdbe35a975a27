"""Closed-loop gate: seeded episodes of the simulated task, through the real daemon and in process.

Every episode runs on the one runner, :func:`vlad_tools.episodes.run_episode`: the candidate and
the baseline each serve from their own ``vlad serve`` process (:class:`~vlad_tools.episodes.DaemonLink`,
real time at the contract's control period), and the candidate's artifact also runs in
this process (:class:`~vlad_tools.episodes.InProcessLink`) on the same seeds. Observation
sequence numbers, and so the contract's noise, are the same on both links: the two
episodes on one seed are identical unless serving changed something, and the report lists
every seed whose outcome flipped with the first tick that differed and why (a late answer,
a hold, a guard intervention).

Per instruction: success rate with its Wilson interval, final distances; the candidate
must succeed in at least ``min_success_rate`` of the episodes, beat no motion by
``min_margin_over_no_motion``, stay within ``max_regression_vs_baseline`` of the baseline
and, through vlad, within ``max_fidelity_drop`` of itself in process (**fidelity**), on a
quiet machine and again beside a CPU hog (``fidelity_under_hog``). Over the run:
out-of-bounds chunks, fallbacks and the deadline-miss rate stay within their limits.

**At the target's latency** (``latency_ms``: what the release states its robot's computer
will take): the candidate is served again with that much inference latency injected (±
``latency_jitter``) to a streaming controller that executes the newest chunk, as real-time
chunking serves it, and judged against its own rate in process at zero latency: at most
``max_latency_drop`` lower per instruction, at most ``max_idle_ticks`` periods with no valid
waypoint (an episode starts once its first plan came: the arm is still until then), and no
seam (a switch of chunk) that steps beyond the contract's rate limit.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlad.snapshot import StatusSnapshot
from vlad_tools.episodes import (
    DaemonLink,
    EpisodeLog,
    InProcessLink,
    Link,
    NoMotionLink,
    SimTask,
    Task,
    compare,
    contract_infer,
    run_episode,
)
from vlad_tools.gates.conditions import cpu_hog
from vlad_tools.gates.launcher import serve
from vlad_tools.gates.metrics import percentiles, wilson_interval
from vlad_tools.gates.plan import ClosedLoopPlan, GatePlan
from vlad_tools.gates.results import GateError, GateResult, check
from vlad_tools.gates.subject import Subject


def sim_tasks() -> dict[str, SimTask]:
    """The demo's simulated tasks and those the installed plugins offer (hook ``vlad_sim_tasks``), by name."""
    from vlad.plugins import make_plugin_manager
    from vlad_tools.demo.tasks import demo_tasks

    tasks: dict[str, SimTask] = {}
    for offered in [demo_tasks(), *make_plugin_manager().hook.vlad_sim_tasks()]:
        for task in offered:
            if task.name in tasks:
                raise GateError(f"simulated task {task.name!r} is offered by two plugins")
            tasks[task.name] = task
    return tasks


def _sim_task(name: str) -> SimTask:
    tasks = sim_tasks()
    if name not in tasks:
        raise GateError(f"closed_loop.task = {name!r}: unknown task (known: {', '.join(sorted(tasks)) or 'none'})")
    return tasks[name]


def task_instructions(name: str) -> tuple[str, ...]:
    """The instructions a task's episodes cycle through."""
    return _sim_task(name).instructions()


def make_task(name: str) -> tuple[Any, tuple[str, ...]]:
    """The simulated task (a :class:`vlad_tools.episodes.Task`) and its instructions."""
    task = _sim_task(name)
    return task.make(), task.instructions()


def seeds(plan: ClosedLoopPlan) -> range:
    """Evaluation seeds: disjoint from the demo's training seeds (0..) by default."""
    return range(plan.seed, plan.seed + plan.episodes)


def episodes(
    task: Task,
    link: Link,
    plan: ClosedLoopPlan,
    instructions: tuple[str, ...],
    period_ns: int,
    chunk_length: int,
    label: str,
    progress: Callable[[str], None],
    follow: bool = False,
) -> list[EpisodeLog]:
    """``plan.episodes`` seeded episodes per instruction through ``link`` (``follow``: a
    streaming controller executing the newest chunk, else the plan's waiting rule)."""
    logs = []
    for instruction in instructions:
        ok = 0
        for i, seed in enumerate(seeds(plan)):
            log = run_episode(
                task,
                link,
                seed,
                instruction,
                period_ns=period_ns,
                exec_steps=plan.exec_steps,
                chunk_length=chunk_length,
                label=label,
                follow=follow,
            )
            logs.append(log)
            ok += log.success
            if (i + 1) % 10 == 0 or i + 1 == plan.episodes:
                progress(f"  closed loop {label}: {instruction!r} episode {i + 1}/{plan.episodes}, {ok} successes")
    return logs


def run_daemon_episodes(
    subject: Subject,
    plan: GatePlan,
    label: str,
    progress: Callable[[str], None] = print,
    keys_dir: str | None = None,
    hog: bool = False,
    tap: Any = None,
    latency_ms: float = 0.0,
) -> dict[str, Any]:
    """Serve ``subject`` from ``vlad serve`` and run the plan's episodes through it (beside a
    process spinning one core when ``hog``; with ``latency_ms`` injected into every inference,
    to a controller that executes the newest chunk); the summary, with every episode's log."""
    from vlad.client import Client

    cl = plan.closed_loop
    task, instructions = make_task(cl.task)
    try:
        with (
            cpu_hog() if hog else contextlib.nullcontext(),
            serve(
                subject,
                warmup=plan.performance.warmup,
                keys_dir=keys_dir,
                latency_ms=latency_ms,
                jitter=cl.latency_jitter,
            ) as daemon,
        ):
            daemon.wait_ready()
            e = daemon.endpoints
            with Client(
                observations=e["observations"], actions=e["actions"], control=e["control"], name=f"gate-{label}"
            ) as client:
                client.tap = tap
                before = client.snapshot()
                logs = episodes(
                    task,
                    DaemonLink(client),
                    cl,
                    instructions,
                    int(before.control_period_ms * 1e6),
                    subject.contract.action.chunk_length,
                    label,
                    progress,
                    follow=latency_ms > 0,
                )
                after = client.snapshot()
    finally:
        task.close()
    return summarize(logs, instructions, before, after, rate_limit=_rate_limit(subject))


def _rate_limit(subject: Subject) -> float:
    return min(j.rate_limit for j in subject.contract.action.joints)


def run_in_process_episodes(
    subject: Subject, plan: GatePlan, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """The plan's episodes with ``subject``'s serving artifact called in this process."""
    from vlad.plugins import get_backend

    cl, spec = plan.closed_loop, subject.serving
    task, instructions = make_task(cl.task)
    try:
        backend = get_backend(spec.backend)
        avail = backend.availability()
        if not avail.usable:
            raise GateError(f"closed loop: {spec.backend} cannot run here for the in-process reference: {avail.reason}")
        session = backend.load(subject.artifact_path(spec.artifact), subject.contract, dict(spec.options))
        try:
            session.warmup(2)
            link = InProcessLink.for_contract(
                subject.contract, contract_infer(subject.contract, subject.tokenizer(), session)
            )
            period_ns = int(subject.contract.timing.control_period_ms * 1e6)
            logs = episodes(
                task, link, cl, instructions, period_ns, subject.contract.action.chunk_length, "in process", progress
            )
        finally:
            session.close()
    finally:
        task.close()
    return summarize(logs, instructions)


def summarize(
    logs: list[EpisodeLog],
    instructions: tuple[str, ...],
    before: StatusSnapshot | None = None,
    after: StatusSnapshot | None = None,
    rate_limit: float | None = None,
) -> dict[str, Any]:
    """Success per instruction (with Wilson intervals), every episode, the seams (with
    ``rate_limit``: how many stepped beyond it) and, given the daemon's status before and
    after the run, its safety events (counter differences)."""
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
    holds: Counter[str] = Counter()
    for e in logs:
        holds.update(e.holds_adopted)
    seams = [x for e in logs for x in e.seam_steps()]
    out: dict[str, Any] = {
        "per_instruction": per,
        "episodes": [e.to_dict() for e in logs],
        "seams": {
            "count": len(seams),
            "max_rad": max(seams, default=0.0),
            "p99_rad": percentiles(seams)["p99"] if seams else 0.0,
            "over_rate_limit": None if rate_limit is None else sum(x > rate_limit + 1e-4 for x in seams),
        },
        "held_periods": sum(e.held for e in logs),
        "first_plan_ms": percentiles(e.first_plan_ms for e in logs),  # each episode starts once it came
        "ticks": sum(len(e.commands) for e in logs),
        "late_answers": sum(len(e.late) for e in logs),
        "holds_adopted": dict(holds),
        "logs": logs,  # for pairing; dropped before the report is written
    }
    if before is not None and after is not None:
        c0, c1 = before.counters, after.counters
        published = c1.published - c0.published
        misses = c1.deadline_misses - c0.deadline_misses
        interventions = c1.interventions - c0.interventions
        entered = after.transition_counts.get("FALLBACK", 0) - before.transition_counts.get("FALLBACK", 0)
        out["safety"] = {
            "published": published,
            "deadline_misses": misses,
            "deadline_miss_rate": misses / published if published else 0.0,
            "bound_clamps": c1.guard_bounds - c0.guard_bounds,
            "out_of_bounds": c1.guard_out_of_bounds - c0.guard_out_of_bounds,
            "rate_clamps": c1.guard_rate - c0.guard_rate,
            "seam_clamps": c1.guard_seam - c0.guard_seam,
            "guided": c1.guided - c0.guided,
            "interventions": interventions,
            "intervention_rate": interventions / published if published else 0.0,
            "hold_chunks": c1.published_hold - c0.published_hold,
            # Times the daemon entered FALLBACK during the run (at least 1 when it ends there).
            "fallbacks": max(entered, int(after.on_fallback)),
            "held_periods": out["held_periods"],
            "final_state": after.state,
        }
        out["latency_ms"] = percentiles(x for e in logs for x in e.latencies_ms)
    return out


def fidelity(reference: dict[str, Any], served: dict[str, Any], instructions: tuple[str, ...]) -> dict[str, Any]:
    """The same seeds in process (``reference``) and through vlad (``served``), paired."""
    ref = {(e.instruction, e.seed): e for e in reference["logs"]}
    pairs = [compare(ref[(e.instruction, e.seed)], e) for e in served["logs"] if (e.instruction, e.seed) in ref]
    per = {}
    for instruction in instructions:
        mine = [p for p in pairs if p["instruction"] == instruction]
        n = max(1, len(mine))
        a = sum(p["reference"] for p in mine) / n
        b = sum(p["other"] for p in mine) / n
        per[instruction] = {
            "episodes": len(mine),
            "in_process": a,
            "through_vlad": b,
            "drop": round(a - b, 6),
            "lost": sum(p["reference"] and not p["other"] for p in mine),
            "gained": sum(p["other"] and not p["reference"] for p in mine),
        }
    why = Counter(p["why"] for p in pairs if p["first_divergence"] is not None)
    return {
        "per_instruction": per,
        "identical_episodes": sum(p["first_divergence"] is None for p in pairs),
        "episodes": len(pairs),
        "divergence_causes": dict(why),
        "flipped": [p for p in pairs if p["flipped"]],
    }


def no_motion(plan: ClosedLoopPlan, subject: Subject) -> dict[str, Any]:
    """The no-motion baseline on the same seeds (in process)."""
    task, instructions = make_task(plan.task)
    t, a = subject.contract.timing, subject.contract.action
    period_ns = int(t.control_period_ms * 1e6)
    link = NoMotionLink(period_ns, int(t.action_validity_ms * 1e6), chunk_length=a.chunk_length, action_dim=a.dim)
    try:
        logs = episodes(task, link, plan, instructions, period_ns, a.chunk_length, "no motion", lambda _: None)
    finally:
        task.close()
    out = summarize(logs, instructions)
    out.pop("logs")
    return out


def run_closed_loop_gate(
    candidate: Subject, baseline: Subject, plan: GatePlan, progress=print, keys_dir: str | None = None
) -> GateResult:
    """Candidate vs baseline vs no motion, and the candidate through vlad vs in process."""
    cl = plan.closed_loop
    result = GateResult("closed_loop")
    progress(
        f"  closed loop: {cl.episodes} episodes per instruction, seeds {cl.seed}..{cl.seed + cl.episodes - 1}, "
        "real time through vlad serve, and in process"
    )
    instructions = task_instructions(cl.task)
    reference = run_in_process_episodes(candidate, plan, progress)
    cand = run_daemon_episodes(candidate, plan, "candidate", progress, keys_dir)
    hogged = (
        run_daemon_episodes(candidate, plan, "candidate+hog", progress, keys_dir, hog=True)
        if cl.fidelity_under_hog
        else None
    )
    if Path(baseline.path) == Path(candidate.path):
        base, same = cand, True  # the same release: its episodes are the baseline's
    else:
        base, same = run_daemon_episodes(baseline, plan, "baseline", progress, keys_dir), False
    late = None
    if cl.latency_ms > 0:
        late = run_daemon_episodes(
            candidate, plan, f"candidate at {cl.latency_ms:g} ms", progress, keys_dir, latency_ms=cl.latency_ms
        )
    zero = no_motion(cl, candidate)
    quiet = fidelity(reference, cand, instructions)
    loaded = fidelity(reference, hogged, instructions) if hogged is not None else None
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
        for name, fid in (("fidelity", quiet), ("fidelity beside a CPU hog", loaded)):
            if fid is None:
                continue
            f = fid["per_instruction"][instruction]
            result.add(
                check(
                    f"{name} {instruction!r}",
                    f["drop"],
                    cl.max_fidelity_drop,
                    "<=",
                    note=f"in process {f['in_process']:.2f}, through vlad {f['through_vlad']:.2f} "
                    f"({f['lost']} lost, {f['gained']} gained)",
                )
            )
        if late is not None:
            r, lat = reference["per_instruction"][instruction], late["per_instruction"][instruction]
            result.add(
                check(
                    f"at {cl.latency_ms:g} ms {instruction!r}",
                    round(r["rate"] - lat["rate"], 6),
                    cl.max_latency_drop,
                    "<=",
                    note=f"in process at 0 ms {r['rate']:.2f}, through vlad at {cl.latency_ms:g} ms {lat['rate']:.2f}",
                )
            )
    if late is not None:
        result.add(
            check(
                f"at {cl.latency_ms:g} ms: periods without a valid waypoint",
                late["held_periods"],
                cl.max_idle_ticks,
                note=f"of {late['ticks']} periods (each episode starting once its first plan came)",
            )
        )
        seams = late["seams"]
        result.add(
            check(
                f"at {cl.latency_ms:g} ms: seams beyond the rate limit",
                seams["over_rate_limit"],
                0,
                note=f"{seams['count']} seams, largest {seams['max_rad']:.3f} rad",
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
    for run in (reference, cand, hogged, base, late):
        if run is not None:
            run.pop("logs", None)
    result.details = {
        "candidate": cand,
        "candidate_under_hog": hogged,
        "candidate_at_latency": late,
        "latency_ms": cl.latency_ms,
        "in_process": reference,
        "fidelity": quiet,
        "fidelity_under_hog": loaded,
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
    episodes_: int,
    *,
    max_bytes: int,
    max_seconds: float,
    seed: int = 20_000,
    progress=print,
) -> dict[str, Any]:
    """Record ``episodes_`` real-time demo episodes (alternating instructions) served by
    ``subject``, through a controller-side tap: the frames it sends and receives."""
    from vlad.client import Client
    from vlad_tools.gates.recording import McapRecorder

    plan = GatePlan().with_overrides(closed_loop={"episodes": 1})
    task, instructions = make_task(plan.closed_loop.task)
    meta = {"release": subject.id, "contract_sha256": subject.contract.sha256, "task": plan.closed_loop.task}
    recorder = McapRecorder(out, max_bytes=max_bytes, max_seconds=max_seconds, tap="controller", metadata=meta)
    try:
        with serve(subject, warmup=plan.performance.warmup) as daemon:
            daemon.wait_ready()
            e = daemon.endpoints
            with Client(
                observations=e["observations"], actions=e["actions"], control=e["control"], name="vladctl-record"
            ) as client:
                client.tap = recorder
                st = client.snapshot()
                recorder.state(st.to_dict())
                period_ns = int(st.control_period_ms * 1e6)
                link = DaemonLink(client)
                for i in range(episodes_):
                    instruction = instructions[i % len(instructions)]
                    log = run_episode(
                        task,
                        link,
                        seed + i,
                        instruction,
                        period_ns=period_ns,
                        exec_steps=plan.closed_loop.exec_steps,
                        chunk_length=subject.contract.action.chunk_length,
                    )
                    progress(
                        f"  record: episode {i + 1}/{episodes_} {instruction!r}: "
                        f"{'success' if log.success else 'miss'}, {recorder.stats()['observations']} observations"
                    )
                    if recorder.stop_reason:
                        progress(f"  record: stopped: {recorder.stop_reason}")
                        break
                recorder.state(client.status())
    finally:
        task.close()
        stats = recorder.close()
    return stats
