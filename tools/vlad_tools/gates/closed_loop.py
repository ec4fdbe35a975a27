"""Closed-loop gate: seeded episodes of the simulated task, through the real daemon and in process.

Every episode runs on the one runner, :func:`vlad_tools.episodes.run_episode`, in the episode sets
of :mod:`vlad_tools.evaluation` (which also summarizes and pairs them): the candidate and
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlad_tools.episodes import DaemonLink, EpisodeLog, InProcessLink, NoMotionLink, SimTask, contract_infer
from vlad_tools.evaluation import EpisodeSet, fidelity, summarize
from vlad_tools.gates.conditions import cpu_hog
from vlad_tools.gates.launcher import serve
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


def episode_set(plan: ClosedLoopPlan, instructions: tuple[str, ...]) -> EpisodeSet:
    """``plan.episodes`` seeds per instruction, disjoint from the demo's training seeds (0..) by default."""
    return EpisodeSet.grid(range(plan.seed, plan.seed + plan.episodes), instructions, plan.exec_steps)


def _progress(progress: Callable[[str], None]) -> Callable[[str], None]:
    return lambda line: progress(f"  closed loop {line}")


def run_daemon_episodes(
    subject: Subject,
    plan: GatePlan,
    label: str,
    progress: Callable[[str], None] = print,
    keys_dir: str | None = None,
    hog: bool = False,
    tap: Any = None,
    latency_ms: float = 0.0,
) -> tuple[list[EpisodeLog], dict[str, Any]]:
    """Serve ``subject`` from ``vlad serve`` and run the plan's episodes through it (beside a
    process spinning one core when ``hog``; with ``latency_ms`` injected into every inference,
    to a controller that executes the newest chunk): every episode's log and the summary."""
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
                logs = episode_set(cl, instructions).run(
                    task,
                    DaemonLink(client),
                    period_ns=int(before.control_period_ms * 1e6),
                    chunk_length=subject.contract.action.chunk_length,
                    label=label,
                    follow=latency_ms > 0,
                    progress=_progress(progress),
                )
                after = client.snapshot()
    finally:
        task.close()
    return logs, summarize(logs, instructions, before, after, rate_limit=_rate_limit(subject))


def _rate_limit(subject: Subject) -> float:
    return min(j.rate_limit for j in subject.contract.action.joints)


def run_in_process_episodes(
    subject: Subject, plan: GatePlan, progress: Callable[[str], None] = print
) -> tuple[list[EpisodeLog], dict[str, Any]]:
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
            logs = episode_set(cl, instructions).run(
                task,
                link,
                period_ns=link.period_ns,
                chunk_length=subject.contract.action.chunk_length,
                label="in process",
                progress=_progress(progress),
            )
        finally:
            session.close()
    finally:
        task.close()
    return logs, summarize(logs, instructions)


def no_motion(plan: ClosedLoopPlan, subject: Subject) -> dict[str, Any]:
    """The no-motion baseline on the same seeds (in process)."""
    task, instructions = make_task(plan.task)
    link = NoMotionLink(subject.contract)
    try:
        logs = episode_set(plan, instructions).run(
            task, link, period_ns=link.period_ns, chunk_length=link.chunk_length, label="no motion"
        )
    finally:
        task.close()
    return summarize(logs, instructions)


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
    reference_logs, reference = run_in_process_episodes(candidate, plan, progress)
    cand_logs, cand = run_daemon_episodes(candidate, plan, "candidate", progress, keys_dir)
    quiet = fidelity(reference_logs, cand_logs, instructions)
    hogged = loaded = None
    if cl.fidelity_under_hog:
        hogged_logs, hogged = run_daemon_episodes(candidate, plan, "candidate+hog", progress, keys_dir, hog=True)
        loaded = fidelity(reference_logs, hogged_logs, instructions)
    if Path(baseline.path) == Path(candidate.path):
        base, same = cand, True  # the same release: its episodes are the baseline's
    else:
        base, same = run_daemon_episodes(baseline, plan, "baseline", progress, keys_dir)[1], False
    late = None
    if cl.latency_ms > 0:
        late = run_daemon_episodes(
            candidate, plan, f"candidate at {cl.latency_ms:g} ms", progress, keys_dir, latency_ms=cl.latency_ms
        )[1]
    zero = no_motion(cl, candidate)
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
                episodes = EpisodeSet.alternating(seed, episodes_, instructions, plan.closed_loop.exec_steps)
                played = episodes.play(
                    task,
                    DaemonLink(client),
                    period_ns=int(st.control_period_ms * 1e6),
                    chunk_length=subject.contract.action.chunk_length,
                )
                for i, log in enumerate(played):
                    progress(
                        f"  record: episode {i + 1}/{episodes_} {log.instruction!r}: "
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
