"""Performance gate: latency and memory of the release as the robot would get them.

Through the real daemon (``vlad serve``) and its sockets, with a controller publishing
observations at the contract's control rate:

* **cold start**: process start -> READY=1 and -> the first policy action chunk;
* **warm steady state**: observations every control period; end-to-end latency
  (sensor time -> chunk received by the controller), each stage the daemon stamps into
  the chunk (transport, queue, preprocess, engine, decode, guard) and engine-only time;
* **burst**: several observations back to back (a multi-camera burst, a controller
  catching up): latency of the newest one's chunk, whose deadline is the contract's plus
  the one inference it may have to wait for (the daemon never preempts one);
* **CPU-hog neighbour**: the steady state with another process spinning a core;
* **debug logging**: the steady state in a second daemon logging at debug level;
* **shape switches** (engine only, in process): calls alternating between batch sizes
  inside the contract's dynamic profile; the first call after each switch;

plus the daemon's peak resident memory (the kernel's high-water mark) and GPU memory where
there is a GPU, recorded as the release's memory need (:func:`measured_memory`), and the
latency planner's feasibility on the plan's target hardware.
Budgets: the contract's end-to-end deadline (p99) and control period (engine p99), the
plan's deadline-miss rates (nominal: the warm steady state; stress: bursts, the CPU hog,
debug logging), cold-start and memory limits. A chunk that never comes counts as a
deadline miss.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from vlad.client import ActionChunk, Client
from vlad.daemon.child import DaemonProcess
from vlad.snapshot import parse_status
from vlad_tools.evaluation import percentiles
from vlad_tools.gates.conditions import cpu_hog
from vlad_tools.gates.launcher import serve
from vlad_tools.gates.plan import GatePlan
from vlad_tools.gates.results import GateError, GateResult, check
from vlad_tools.gates.subject import Subject

# Observations after a cold start (or a new neighbour) that are not measured: the first
# calls after warm-up still run on cold caches and freshly faulted-in pages.
SETTLE = 25
BURST_EVERY = 5  # periods between bursts, so each one is answered before the next
STAGES = ("transport", "queue", "preprocess", "engine", "decode", "guard")  # vlad.serving.tracing names


def observations(subject: Subject, plan: GatePlan) -> list[tuple[dict, Any, str | None, bool]]:
    """What the controller publishes: recorded observations, else the golden fixtures, else
    contract-shaped synthetic ones (mid-grey image, zero joint state); with each, whether it
    announces a joint-state jump (a recording's episode start)."""
    for rel in plan.equivalence.recordings:
        from vlad_tools.gates.recording import read_recording

        path = plan.path(rel)
        if path is None:
            raise GateError("equivalence.recordings: an entry is an empty path")
        rec = read_recording(path, limit=200)
        if rec.observations:
            return [(o.images, o.proprio, o.instruction, o.reanchor) for o in rec.observations]
    golden = plan.path(plan.equivalence.golden)
    if golden is not None and golden.is_file():
        from vlad_tools.gates.equivalence import load_golden

        return [(fx["raw"].images, fx["raw"].proprio, fx["raw"].instruction, False) for fx in load_golden(golden)]
    c = subject.contract
    images = {
        cam.name: np.full(
            (cam.raw.height, cam.raw.width, 3) if cam.raw.layout == "HWC" else (3, cam.raw.height, cam.raw.width),
            128,
            dtype=cam.raw.dtype,
        )
        for cam in c.cameras
    }
    proprio = np.zeros(c.proprio.dim, np.float32) if c.proprio else None
    from vlad_tools.gates.closed_loop import task_instructions

    return [(images, proprio, task_instructions(plan.closed_loop.task)[0] if c.language else None, False)]


def _stats(sent: dict[int, int], chunks: list[ActionChunk], deadline_ms: float, refused: int = 0) -> dict[str, Any]:
    """Latency per stage over the policy chunks answering ``sent`` observations; observations
    the daemon refused (``refused``, from its counters) are not late, they are reported apart."""
    first: dict[int, ActionChunk] = {}
    holds = 0
    for c in chunks:
        if c.is_hold:
            holds += 1
        elif c.obs_seq in sent and c.obs_seq not in first:
            first[c.obs_seq] = c
    e2e = [(c.t_receive_ns - sent[s]) / 1e6 for s, c in first.items()]
    stages = {stage: percentiles(c.timings_ms.get(stage) for c in first.values()) for stage in STAGES}
    late = sum(1 for x in e2e if x > deadline_ms)
    refused = min(max(0, refused), len(sent) - len(first))
    unanswered = len(sent) - len(first) - refused
    return {
        "observations": len(sent),
        "answered": len(first),
        "refused": refused,
        "unanswered": unanswered,
        "hold_chunks": holds,
        "e2e_ms": percentiles(e2e),
        "stages_ms": stages,
        "engine_ms": stages["engine"],
        "deadline_misses": late + unanswered,
        "deadline_miss_rate": (late + unanswered) / max(1, len(sent)),
        "samples": {
            "e2e": [round(x, 4) for x in e2e],
            **{s: [c.timings_ms.get(s) for c in first.values()] for s in STAGES},
        },
    }


def stream(
    ctl: Client,
    obs: list,
    n: int,
    period_ns: int,
    deadline_ms: float,
    progress,
    label: str,
    burst_every: int = 0,
    burst_size: int = 1,
    settle: int = 0,
) -> dict:
    """Observations every control period, like a robot: ``settle`` unmeasured ones first,
    then ``n`` measured periods, then unmeasured ones while late answers still arrive (a
    controller that falls silent is a fault the daemon answers with its hold posture).

    An observation that announces a re-anchor (a recording's episode start) is sent but not
    measured: its chunk waits for the next observation to confirm the jump, which is then
    answered instead (docs/protocol.md); they are counted as ``announced``.

    With ``burst_every``, every that many periods the observation is replaced by a burst
    of ``burst_size`` back to back with the same sensor time; only the newest one of each
    burst is measured (the daemon answers the newest and supersedes the rest).
    """
    sent: dict[int, int] = {}
    announced = 0
    chunks: list[ActionChunk] = []
    refused_before = _refused(ctl)
    tail = int(max(5 * deadline_ms, 200) * 1e6 // period_ns) + 1
    next_tick = time.monotonic_ns()
    for k in range(settle + n + tail):
        measured = settle <= k < settle + n
        is_burst = measured and burst_every and (k - settle) % burst_every == 0
        t = time.monotonic_ns()
        for j in range(burst_size if is_burst else 1):
            images, proprio, instruction, reanchor = obs[(k + j) % len(obs)]
            seq = ctl.publish_observation(images, proprio, instruction, t_sensor_ns=t, reanchor=reanchor)
        if measured and (is_burst or not burst_every):
            if reanchor:
                announced += 1
            else:
                sent[seq] = t
        ctl.heartbeat()
        next_tick += period_ns
        chunks += ctl.recv_until(next_tick)
        if measured and (k - settle + 1) % max(1, n // 4) == 0:
            progress(f"  performance: {label} {k - settle + 1}/{n} periods")
    return {**_stats(sent, chunks, deadline_ms, refused=_refused(ctl) - refused_before), "announced": announced}


def burst_deadline_ms(deadline_ms: float, warm: dict[str, Any]) -> float:
    """The deadline of a burst's newest observation, given the warm scenario's figures.

    The daemon never preempts an inference: that observation may wait for the one in
    flight, so its deadline is the contract's plus one (warm p99) inference; more than that
    means a backlog. A release that answered nothing warm (every observation went to a
    fallback hold, as a slow one's do on a loaded machine) has no inference time to allow:
    its NaN p99 would end the gate in an error instead of the failure it is.
    """
    engine_p99 = warm["engine_ms"]["p99"]
    return deadline_ms + (engine_p99 if math.isfinite(engine_p99) else 0.0)


def _refused(ctl: Client) -> int:
    """Observations the daemon refused for their content (counted, answered with an advisory
    hold: e.g. a golden fixture's joint state far from the previous one)."""
    return parse_status(ctl.status()).counters.input_rejected


def cold_start(daemon: DaemonProcess, ctl: Client, obs: list, period_ns: int, timeout_s: float) -> dict:
    """Seconds from process start to READY=1 and to the first policy chunk received."""
    deadline = time.monotonic() + timeout_s
    i = 0
    while time.monotonic() < deadline:
        if daemon.proc.poll() is not None:
            raise GateError(
                f"vlad serve exited with status {daemon.proc.returncode} during cold start: {daemon.log_tail()}"
            )
        images, proprio, instruction, reanchor = obs[i % len(obs)]
        i += 1
        ctl.publish_observation(images, proprio, instruction, reanchor=reanchor)
        ctl.heartbeat()
        for c in ctl.recv_until(time.monotonic_ns() + period_ns):
            if not c.is_hold:
                ready = daemon.wait_ready(1.0)
                return {
                    "ready_s": round(ready, 3),
                    "first_chunk_s": round((c.t_receive_ns - daemon.t_start_ns) / 1e9, 3),
                }
    return {"ready_s": None, "first_chunk_s": float("inf")}


def shape_switches(subject: Subject, plan: GatePlan, progress) -> dict[str, Any] | None:
    """Engine-only calls alternating between batch sizes of the contract's dynamic profile."""
    from vlad.backend import example_inputs
    from vlad.plugins import get_backend

    axes = [ax for spec in subject.contract.inputs for ax in spec.dynamic]
    if not axes:
        return None
    ax = axes[0]
    shapes = sorted({ax.min, ax.opt, ax.max, (ax.min + ax.max) // 2})
    order = [s for other in shapes if other != ax.opt for s in (other, ax.opt)]  # opt -> x -> opt -> y ...
    s = subject.serving
    session = get_backend(s.backend).load(subject.artifact_path(s.artifact), subject.contract, dict(s.options))
    per_shape: dict[int, list[float]] = {b: [] for b in shapes}
    first_after_switch: list[dict[str, float]] = []
    try:
        session.warmup(3)
        inputs = {b: example_inputs(subject.contract, batch=b) for b in shapes}
        for b in order:
            for k in range(plan.performance.shape_switch_calls):
                t0 = time.perf_counter()
                session.infer(inputs[b])
                ms = (time.perf_counter() - t0) * 1e3
                per_shape[b].append(ms)
                if k == 0:
                    first_after_switch.append({"batch": b, "ms": round(ms, 4)})
    finally:
        session.close()
    progress(
        f"  performance: shape switches {' -> '.join(map(str, order))} ({ax.name}), "
        f"{plan.performance.shape_switch_calls} engine calls each"
    )
    return {
        "axis": ax.name,
        "shapes": shapes,
        "opt": ax.opt,
        "order": order,
        "first_call_after_switch": first_after_switch,
        "per_shape_ms": {str(b): percentiles(v) for b, v in per_shape.items()},
    }


def _serve(subject: Subject, plan: GatePlan, obs: list, progress, keys_dir, log_level: str, scenarios) -> dict:
    """Start a daemon, measure its cold start, run ``scenarios(ctl, period_ns)``, read its memory."""
    pp = plan.performance
    with serve(subject, warmup=pp.warmup, log_level=log_level, keys_dir=keys_dir) as daemon:
        e = daemon.endpoints
        # Every observation of a burst sent (a queue of 64), and connected the moment the
        # starting daemon binds (the cold-start figure).
        with Client(
            observations=e["observations"],
            actions=e["actions"],
            control=e["control"],
            name="gate-performance",
            send_hwm=64,
            reconnect_ms=10,
        ) as ctl:
            period_ns = int(subject.contract.timing.control_period_ms * 1e6)
            cold = cold_start(daemon, ctl, obs, period_ns, max(60.0, 2 * pp.max_cold_start_s))
            progress(
                f"  performance: cold start ({log_level} logging): READY after {cold['ready_s']} s, "
                f"first action chunk after {cold['first_chunk_s']} s"
            )
            out = {"cold_start": cold, **scenarios(ctl, period_ns)}
            status = parse_status(ctl.status()).to_dict()  # a status this vlad reads, or one line why not
        out["status"] = {k: status[k] for k in ("counters", "latency_ms", "backend", "memory")}
        out["peak_rss_bytes"] = daemon.peak_rss_bytes()
        out["gpu_memory_bytes"] = daemon.gpu_memory_bytes()
    return out


def run_performance_gate(candidate: Subject, plan: GatePlan, progress=print, keys_dir: str | None = None) -> GateResult:
    """Measure every scenario and judge it against the contract's timing and the plan's limits."""
    pp, t = plan.performance, candidate.contract.timing
    deadline = pp.p99_e2e_ms or t.e2e_deadline_ms
    engine_limit = pp.max_engine_p99_ms or t.control_period_ms
    result = GateResult("performance")
    obs = observations(candidate, plan)
    n_side = max(50, pp.warm_calls // 3)
    progress(
        f"  performance: vlad serve on {candidate.serving.backend} ({candidate.serving.artifact}), control period "
        f"{t.control_period_ms:g} ms, deadline {t.e2e_deadline_ms:g} ms; {pp.warm_calls} warm observations"
    )

    def main_scenarios(ctl: Client, period_ns: int) -> dict:
        deadline_ms = t.e2e_deadline_ms
        out = {
            "warm": stream(
                ctl, obs, pp.warm_calls, period_ns, deadline_ms, progress, "warm steady state", settle=SETTLE
            )
        }
        burst_ms = burst_deadline_ms(deadline_ms, out["warm"])
        out["burst"] = {
            **stream(
                ctl,
                obs,
                pp.bursts * BURST_EVERY,
                period_ns,
                burst_ms,
                progress,
                f"bursts of {pp.burst_size}",
                BURST_EVERY,
                pp.burst_size,
            ),
            "burst_size": pp.burst_size,
            "deadline_ms": round(burst_ms, 3),
        }
        if pp.cpu_hog:
            with cpu_hog():
                out["cpu_hog"] = stream(
                    ctl, obs, n_side, period_ns, deadline_ms, progress, "with a CPU hog", settle=SETTLE
                )
        return out

    runs = {"info": _serve(candidate, plan, obs, progress, keys_dir, "info", main_scenarios)}
    if pp.debug_logging:
        runs["debug"] = _serve(
            candidate,
            plan,
            obs,
            progress,
            keys_dir,
            "debug",
            lambda ctl, p: {
                "debug_logging": stream(
                    ctl, obs, n_side, p, t.e2e_deadline_ms, progress, "with debug logging", settle=SETTLE
                )
            },
        )
    switches = shape_switches(candidate, plan, progress) if pp.shape_switch_calls else None

    scenarios = {name: runs["info"][name] for name in ("warm", "burst", "cpu_hog") if name in runs["info"]}
    if "debug" in runs:
        scenarios["debug_logging"] = runs["debug"]["debug_logging"]
    cold = max((r["cold_start"]["first_chunk_s"] for r in runs.values()), default=0.0)
    result.add(check("cold start: process start -> first action chunk", cold, pp.max_cold_start_s, unit="s"))
    for name, sc in scenarios.items():
        e2e = f"p50 {sc['e2e_ms']['p50']} ms, p99 {sc['e2e_ms']['p99']} ms, max {sc['e2e_ms']['max']} ms"
        answered = f"{sc['deadline_misses']} of {sc['observations']} late or unanswered"
        if sc.get("announced"):
            answered += f" ({sc['announced']} announced re-anchors not measured)"
        if name == "warm":
            result.add(
                check(
                    "warm: end-to-end p99",
                    sc["e2e_ms"]["p99"] if sc["answered"] else float("inf"),
                    deadline,
                    unit="ms",
                    note=f"{e2e}, {sc['answered']}/{sc['observations']} answered",
                )
            )
            result.add(
                check(
                    "warm: deadline miss rate",
                    round(sc["deadline_miss_rate"], 6),
                    pp.max_deadline_miss_rate,
                    note=answered,
                )
            )
        else:  # stress: a bounded share of late chunks, judged on the rate (p99 of a few is noise)
            late = (
                f"later than {sc['deadline_ms']} ms (deadline + one inference in flight)"
                if "deadline_ms" in sc
                else "late or unanswered"
            )
            result.add(
                check(
                    f"{name}: deadline miss rate",
                    round(sc["deadline_miss_rate"], 6),
                    pp.max_stress_miss_rate,
                    note=f"{sc['deadline_misses']} of {sc['observations']} {late}; {e2e}",
                )
            )
    warm = scenarios["warm"]
    result.add(
        check(
            "warm: engine-only p99",
            warm["engine_ms"]["p99"],
            engine_limit,
            unit="ms",
            note="must fit one control period",
        )
    )
    if switches is not None:
        back = [x["ms"] for x in switches["first_call_after_switch"] if x["batch"] == switches["opt"]]
        result.add(
            check(
                "shape switch: slowest first call back at the serving shape (engine only)",
                max(back, default=0.0),
                t.e2e_deadline_ms,
                unit="ms",
                note=f"batch sizes {switches['shapes']}, serving {switches['opt']}",
            )
        )
    peak = max((r["peak_rss_bytes"] or 0) for r in runs.values())
    result.add(check("peak resident memory of the daemon", round(peak / 2**20, 1), pp.memory_limit_mib, unit="MiB"))
    gpu = [r["gpu_memory_bytes"] for r in runs.values() if r["gpu_memory_bytes"] is not None]
    if gpu and pp.gpu_memory_limit_mib:
        result.add(check("GPU memory of the daemon", round(max(gpu) / 2**20, 1), pp.gpu_memory_limit_mib, unit="MiB"))
    measured_p50 = warm["e2e_ms"]["p50"]
    planner = _planner(candidate, plan, measured_p50 if math.isfinite(measured_p50) else None, result)
    result.details = {
        "deadline_ms": t.e2e_deadline_ms,
        "control_period_ms": t.control_period_ms,
        "p99_budget_ms": deadline,
        "scenarios": scenarios,
        "cold_start": {k: r["cold_start"] for k, r in runs.items()},
        "daemon_status": {k: r["status"] for k, r in runs.items()},
        "peak_rss_mib": round(peak / 2**20, 1),
        "gpu_memory_mib": round(max(gpu) / 2**20, 1) if gpu else None,
        "shape_switches": switches,
        "planner": planner,
        "setup": {
            "warmup": pp.warmup,
            "batch": 1,
            "warm_observations": pp.warm_calls,
            "side_observations": n_side,
            "settle_observations": SETTLE,
            "bursts": pp.bursts,
            "burst_size": pp.burst_size,
            "burst_every_periods": BURST_EVERY,
            "serving": candidate.identity()["serving"],
        },
    }
    return result


def measured_memory(details: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's ``[memory]`` table from this gate's details: the daemon's peak resident
    memory and GPU memory while it served the release (``vladctl gate --record`` writes it).

    The whole daemon's peak, so it also counts the runtime's own few hundred MB: planning
    with it errs on the safe side. None when the gate measured no peak."""
    peak = details.get("peak_rss_mib")
    if not peak:
        return None
    gpu = details.get("gpu_memory_mib") or 0
    return {"host_bytes": int(peak * 2**20), "device_bytes": int(gpu * 2**20), "source": "performance-gate"}


def _planner(subject: Subject, plan: GatePlan, measured_p50: float | None, result: GateResult) -> list[dict]:
    """The latency planner's verdict on each target hardware, with the measured e2e."""
    from vlad_tools import planner

    pp, out = plan.performance, []
    for hw in pp.target_hardware:
        try:
            f = planner.feasibility(
                subject.contract, None, hw, placement=pp.placement, mode=pp.mode, measured_e2e_ms=measured_p50
            )
        except planner.PlannerError as exc:
            result.fail(f"planner on {hw}: {exc}")
            continue
        out.append(
            {
                "hardware": hw,
                "flagged": f["flagged"],
                "reasons": f["reasons"],
                "e2e_ms": f["e2e_ms"],
                "hz": f["hz"],
                "fits": f["fits"],
            }
        )
        result.add(
            check(
                f"planner on {hw}: feasibility flags",
                len(f["reasons"]),
                0,
                note="; ".join(f["reasons"]) or f"predicted e2e {f['e2e_ms']:.3g} ms",
            )
        )
    return out
