#!/usr/bin/env python3
"""Synchronous vs asynchronous chunk execution, measured in the simulator through the daemon.

The MuJoCo Reacher arm (``vlad.demo.sim``) runs in real time at the contract's control
period and talks to a real ``vlad serve`` subprocess over its real ZeroMQ sockets:

* ``sync``: send a frame, hold still until its chunk arrives (waiting up to 80 % of a
  period inside the tick, like ``./scripts/demo``), execute ``--execute`` waypoints from
  the chunk's start (never past ``valid_until``), repeat;
* ``async``: :class:`vlad.client.ChunkExecutor` keeps executing and sends the next frame
  when the waypoints left fall to the threshold (default: the smallest that never idles
  at the measured latency while replanning every ``--execute`` waypoints, see
  :mod:`vlad.planner.execution`); it switches at the index for now and blends.

Each runs against the real backend (the signed demo release, ONNX Runtime) and against
an artificially slowed one (``tests/slow_plugin.py``: every inference takes at least
``--slow-ms``). At 70 ms sync loses ticks while async still hides the latency (at most
half of the chunk's 160 ms horizon, see :mod:`vlad.planner.execution`); 100 ms is longer
than executing the 4 waypoints of a chunk takes (80 ms) and more than half the horizon:
both lose ticks.
Reported per configuration: control rate (policy waypoints per second once the first
chunk arrived; the robot asks for 50), idle gaps, the command jump at chunk switches,
joint jerk, success rate, and latency, next to the planner's prediction (roofline
latency from this machine's micro-benchmarks, and the measured latency).

    .venv/bin/python scripts/bench_async.py [--episodes 10] [--slow-ms 70,100] [--markdown]
    .venv/bin/python scripts/bench_async.py --ci        # one episode each, real + 70 ms, ~10 s
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.daemon_harness import start_daemon  # noqa: E402
from vlad.client import ChunkExecutor  # noqa: E402
from vlad.contract import load_contract  # noqa: E402
from vlad.demo import sim  # noqa: E402
from vlad.planner.execution import async_threshold, chunk_rate  # noqa: E402

DEMO = ROOT / "manifests" / "demo"
WAIT_FRACTION = 0.8
# A controller that sends a frame only when it needs a chunk sends one every few periods,
# and none while an episode resets; the daemon's sensor-stall monitor (5 periods by
# default) would call that a stalled stream and fall back to the hold posture for the
# 2 s it takes to recover. One second of silence is allowed here instead.
STALL_PERIODS = 50


@dataclass
class Episode:
    success: bool = False
    distance: float = 0.0
    policy: list[bool] = field(default_factory=list)  # per tick: a policy waypoint was executed
    commands: list[np.ndarray] = field(default_factory=list)
    joints: list[np.ndarray] = field(default_factory=list)
    switches: list[int] = field(default_factory=list)  # ticks where a new chunk took over
    latencies: list[float] = field(default_factory=list)  # ms, frame -> its chunk received


def wait_for(client, seq: int, until_ns: int):
    """The policy chunk answering observation ``seq``, or None at ``until_ns``. Heartbeats
    go on meanwhile (every 10 ms): a controller silent for 5 periods counts as gone."""
    while True:
        left_ms = (until_ns - time.monotonic_ns()) / 1e6
        chunk = client.recv_actions(timeout_ms=max(0, min(10, int(left_ms))))
        if chunk is None and left_ms > 10:
            client.heartbeat()
            continue
        if chunk is not None and chunk.obs_seq == seq and not chunk.is_hold:
            return chunk
        if left_ms <= 0 or (chunk is None and time.monotonic_ns() >= until_ns):
            return None


def settle(client, seconds: float = 0.15) -> None:
    """Between episodes: heartbeats on, answers to the last episode's frames drained, so
    that the next episode starts with an idle policy worker."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        client.heartbeat()
        client.recv_actions(timeout_ms=10)


def run_sync(
    client, task, seed: int, instruction: str, period_ns: int, execute: int, resend_ns: int = 500_000_000
) -> Episode:
    ep, obs = Episode(), task.reset(seed, instruction)
    plan, k, pending, sent_at = None, 0, None, 0
    next_tick = time.monotonic_ns()
    for tick in range(sim.EPISODE_STEPS):
        now = time.monotonic_ns()
        if pending is not None and now - sent_at > resend_ns:
            pending = None  # never answered (the daemon skipped it as stale): send anew
        if plan is None and pending is None:
            pending = client.publish_observation(
                {"overhead": obs.image}, proprio=obs.proprio, instruction=instruction, t_sensor_ns=now
            )
            sent_at = now
        client.heartbeat()
        if pending is not None:  # the robot holds still while it waits
            chunk = wait_for(client, pending, next_tick + int(WAIT_FRACTION * period_ns))
            if chunk is not None:
                ep.latencies.append((chunk.t_receive_ns - chunk.t_sensor_ns) / 1e6)
                plan, k, pending = chunk, 0, None
                ep.switches.append(tick)
        command = None
        if plan is not None and not plan.is_stale(time.monotonic_ns()) and k < min(execute, len(plan.actions)):
            command, k = plan.actions[k], k + 1
        # The next tick comes one period after this one (give or take jitter, hence a tenth
        # of a period of margin): a waypoint due after valid_until would never run.
        if plan is not None and (
            command is None
            or k >= min(execute, len(plan.actions))
            or now + period_ns + period_ns // 10 > plan.valid_until_ns
        ):
            plan = None  # executed, or the next waypoint would be too late: send a new frame
        obs = _apply(ep, task, obs, command)
        next_tick += period_ns
        time.sleep(max(0.0, (next_tick - time.monotonic_ns()) / 1e9))
    return _finish(ep, task)


def run_async(client, task, seed: int, instruction: str, executor: ChunkExecutor) -> Episode:
    ep, obs = Episode(), task.reset(seed, instruction)
    period_ns = int(sim.CONTROL_DT * 1e9)
    next_tick = time.monotonic_ns()
    sent: dict[int, int] = {}
    mine: set[int] = set()
    adopted = False
    for tick in range(sim.EPISODE_STEPS):
        now = time.monotonic_ns()
        if adopted:
            ep.switches.append(tick)
        command = executor.step(now)
        if command is not None and executor.current.is_hold:
            command = None  # a hold posture is not a policy waypoint
        if executor.should_request(now):
            seq = client.publish_observation(
                {"overhead": obs.image}, proprio=obs.proprio, instruction=instruction, t_sensor_ns=now
            )
            executor.request_sent(seq, now)
            sent[seq] = now
            mine.add(seq)
        client.heartbeat()
        obs = _apply(ep, task, obs, command)
        next_tick += period_ns
        # Until the next tick, take chunks as they arrive: a chunk is adopted at its
        # arrival time, as a controller thread receiving in the background would.
        adopted = False
        while (left_ms := (next_tick - time.monotonic_ns()) / 1e6) > 0:
            chunk = client.recv_actions(timeout_ms=int(left_ms))
            if chunk is None:
                time.sleep(max(0.0, (next_tick - time.monotonic_ns()) / 1e9))
                break
            if not chunk.is_hold and chunk.obs_seq not in mine:
                continue  # answers a frame of the previous episode: another arm pose
            adopted |= executor.offer(chunk) and not chunk.is_hold
            if chunk.obs_seq in sent and not chunk.is_hold:
                ep.latencies.append((chunk.t_receive_ns - sent.pop(chunk.obs_seq)) / 1e6)
    return _finish(ep, task)


def measure_latency(client, task, frames: int) -> float:
    """Median frame -> chunk latency (ms) over ``frames`` request/answer round trips."""
    obs, lat = task.reset(19_999, sim.INSTRUCTIONS[0]), []
    for _ in range(frames):
        seq = client.publish_observation({"overhead": obs.image}, proprio=obs.proprio, instruction=sim.INSTRUCTIONS[0])
        client.heartbeat()
        chunk = wait_for(client, seq, time.monotonic_ns() + 5_000_000_000)
        if chunk is not None:
            lat.append((chunk.t_receive_ns - chunk.t_sensor_ns) / 1e6)
    if not lat:
        raise SystemExit("bench_async: the daemon answered no frame within 5 s")
    return float(np.median(lat))


def _apply(ep: Episode, task, obs, command):
    q = obs.proprio[:2].astype(np.float64)
    ep.policy.append(command is not None)
    cmd = q if command is None else np.asarray(command, dtype=np.float64)  # hold: stay where we are
    ep.commands.append(cmd)
    ep.joints.append(q)
    return task.step(cmd)


def _finish(ep: Episode, task) -> Episode:
    ep.distance = task.distance()
    ep.success = ep.distance < sim.SUCCESS_RADIUS
    return ep


def summarize(eps: list[Episode], period_ms: float) -> dict:
    """Control rate, idle gaps, switch jumps, jerk, success and latency over episodes."""
    rates, gaps, jumps, jerks, idle = [], [], [], [], 0
    for ep in eps:
        first = ep.policy.index(True) if any(ep.policy) else len(ep.policy)
        steady = ep.policy[first:]
        rates.append(1000.0 / period_ms * sum(steady) / max(1, len(steady)))
        run = 0
        for p in steady + [True]:
            if p:
                if run:
                    gaps.append(run * period_ms)
                run = 0
            else:
                run, idle = run + 1, idle + 1
        cmds = np.asarray(ep.commands)
        jumps += [float(np.abs(cmds[t] - cmds[t - 1]).max()) for t in ep.switches if t > first]
        q = np.asarray(ep.joints)[first:]
        if len(q) > 3:  # third difference of the measured joint angles
            jerks += list(np.abs(np.diff(q, n=3, axis=0)).max(axis=1) / (period_ms / 1000) ** 3)
    lat = np.concatenate([e.latencies for e in eps]) if any(e.latencies for e in eps) else np.zeros(1)
    return {
        "episodes": len(eps), "success": sum(e.success for e in eps),
        "mean_final_distance_mm": round(1000 * float(np.mean([e.distance for e in eps])), 1),
        "control_hz": round(float(np.mean(rates)), 2), "idle_ticks": idle,
        "max_gap_ms": round(max(gaps, default=0.0), 1), "gaps": len(gaps),
        "switch_jump_mean_rad": round(float(np.mean(jumps)) if jumps else 0.0, 4),
        "switch_jump_max_rad": round(max(jumps, default=0.0), 4),
        "jerk_rms_rad_s3": round(float(np.sqrt(np.mean(np.square(jerks)))) if jerks else 0.0, 1),
        "jerk_p95_rad_s3": round(float(np.percentile(jerks, 95)) if jerks else 0.0, 1),
        "latency_p50_ms": round(float(np.median(lat)), 2), "latency_max_ms": round(float(lat.max()), 2),
    }  # fmt: skip


def write_slow_rig(folder: Path, slow_ms: float, deadline_ms: float) -> tuple[Path, dict[str, str]]:
    """Unsigned copy of the demo release on the ``slow`` test backend, and its daemon config.
    Only the contract's e2e deadline changes: the slowness is intended, the daemon's
    deadline monitor should not flag it."""
    release = folder / "release"
    release.mkdir()
    for name in ("tokenizer.json", "policy.onnx"):
        shutil.copy(DEMO / name, release / name)
    text = (DEMO / "contract.toml").read_text()
    assert "e2e_deadline_ms = 20.0" in text
    (release / "contract.toml").write_text(text.replace("e2e_deadline_ms = 20.0", f"e2e_deadline_ms = {deadline_ms}"))
    config = folder / "slow.toml"
    config.write_text(f"""
[release]
path = "{release}"
verify = false
backend = "slow"
artifact = "policy.onnx"
options = {{ delay_ms = {slow_ms}, inner = "onnxruntime", intra_op_threads = 1 }}

[serve]
warmup = 2

[monitors]
sensor_stall_periods = {STALL_PERIODS}
""")
    return config, {"VLAD_PLUGIN_MODULES": "tests.slow_plugin", "PYTHONPATH": str(ROOT)}


def roofline_latency_ms(short: bool) -> tuple[float, dict]:
    """The planner's compute prediction for the demo on this machine's measured peaks."""
    from vlad.planner import align_to_contract, load_model, predict
    from vlad.planner.calibrate import measure_peaks

    peaks = measure_peaks(threads=1, short=short)
    model = align_to_contract(load_model("vlad-demo-reacher"), load_contract(DEMO / "contract.toml"))
    return predict(model, peaks.hardware()).compute_ms, peaks.to_dict()


def run_backend(label: str, tmp: Path, args, contract, slow_ms: float | None) -> list[dict]:
    """Both modes against one daemon; returns a row per mode."""
    folder = tmp / label.replace(" ", "-")
    folder.mkdir()
    if slow_ms is None:
        # The signed demo release on real ONNX Runtime.
        d = start_daemon(folder, extra=["--set", f"monitors.sensor_stall_periods={STALL_PERIODS}"])
    else:
        config, env = write_slow_rig(folder, slow_ms, deadline_ms=max(20.0, 1.75 * slow_ms))
        d = start_daemon(folder, config=config, env=env)
    period_ms = contract.timing.control_period_ms
    period_ns, chunk = int(period_ms * 1e6), contract.action.chunk_length
    rows = []
    try:
        client = d.client("bench-async")
        with sim.ReacherTask(render=True) as task:
            latency = measure_latency(client, task, 5 if args.ci else 20)  # sets the async threshold
            validity = contract.timing.action_validity_ms
            validity_ns = int(validity * 1e6)  # a frame unanswered this long will never be useful
            threshold = (
                args.threshold
                if args.threshold is not None
                else async_threshold(latency, period_ms, chunk, args.execute, validity)
            )
            for mode in ("sync", "async"):
                eps = []
                for i in range(args.episodes):
                    seed, instruction = args.seed + i, sim.INSTRUCTIONS[i % len(sim.INSTRUCTIONS)]
                    settle(client)
                    if mode == "sync":
                        eps.append(run_sync(client, task, seed, instruction, period_ns, args.execute, validity_ns))
                    else:
                        ex = ChunkExecutor(
                            request_threshold=threshold,
                            overlap=args.overlap,
                            blend=args.blend,
                            request_timeout_ns=validity_ns,
                        )
                        eps.append(run_async(client, task, seed, instruction, ex))
                st = client.status()
                row = {
                    "backend": label,
                    "mode": mode,
                    "threshold": threshold if mode == "async" else None,
                    **summarize(eps, period_ms),
                    "daemon": {
                        "state": st["state"],
                        "fallbacks": d.log().count("-> FALLBACK"),
                        **{k: st["counters"].get(k, 0) for k in ("stale", "superseded", "bridged")},
                    },
                }
                predicted = chunk_rate(
                    row["latency_p50_ms"],
                    period_ms,
                    chunk,
                    mode=mode,
                    execute=args.execute,
                    threshold=threshold,
                    validity_ms=contract.timing.action_validity_ms,
                    wait_fraction=WAIT_FRACTION,
                )
                row["predicted_hz_measured_latency"] = round(predicted.control_hz, 2)
                row["predicted_hz_roofline"] = round(
                    chunk_rate(
                        max(args.roofline_ms, slow_ms or 0.0),
                        period_ms,
                        chunk,
                        mode=mode,
                        execute=args.execute,
                        threshold=threshold,
                        validity_ms=contract.timing.action_validity_ms,
                        wait_fraction=WAIT_FRACTION,
                    ).control_hz,
                    2,
                )
                rows.append(row)
    finally:
        d.stop()
    if any(r["control_hz"] == 0 for r in rows):  # say why, from the daemon's own log
        print(f"bench_async: {label}: no policy waypoint executed; daemon log:\n{d.log()[-3000:]}", file=sys.stderr)
    return rows


def conditions() -> dict:
    import mujoco
    import onnxruntime

    return {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": _cpu(),
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "mujoco": mujoco.__version__,
    }


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


COLUMNS = [
    ("backend", "backend"),
    ("mode", "mode"),
    ("control Hz", "control_hz"),
    ("predicted Hz (measured latency)", "predicted_hz_measured_latency"),
    ("predicted Hz (roofline)", "predicted_hz_roofline"),
    ("max idle gap ms", "max_gap_ms"),
    ("switch jump mean / max rad", None),
    ("joint jerk RMS / p95 rad/s³", None),
    ("success", None),
    ("latency p50 / max ms", None),
]


def _cells(r: dict) -> list[str]:
    extra = {
        "switch jump mean / max rad": f"{r['switch_jump_mean_rad']:.3f} / {r['switch_jump_max_rad']:.3f}",
        "joint jerk RMS / p95 rad/s³": f"{r['jerk_rms_rad_s3']:.0f} / {r['jerk_p95_rad_s3']:.0f}",
        "success": f"{r['success']}/{r['episodes']}",
        "latency p50 / max ms": f"{r['latency_p50_ms']:.1f} / {r['latency_max_ms']:.1f}",
    }
    return [str(r[key]) if key else extra[head] for head, key in COLUMNS]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=10, help="episodes per backend and mode (alternating instructions)")
    ap.add_argument("--seed", type=int, default=20_000)
    ap.add_argument("--slow-ms", default="70,100", help="inference times of the slowed backend, ms, comma-separated")
    ap.add_argument("--execute", type=int, default=4, help="waypoints executed per chunk (sync; async cadence)")
    ap.add_argument("--threshold", type=int, help="async: request when this many waypoints are left (default: auto)")
    ap.add_argument("--overlap", type=int, default=2, help="async: waypoints blended after a switch")
    ap.add_argument("--blend", default="linear", choices=("linear", "exponential", "none"))
    ap.add_argument("--no-real", action="store_true", help="only the slowed backend")
    ap.add_argument(
        "--ci",
        action="store_true",
        help="one episode per configuration, the first --slow-ms only, short micro-benchmarks",
    )
    ap.add_argument("--json", type=Path, help="also write the results as JSON")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table (for docs/benchmarks.md)")
    args = ap.parse_args(argv)
    slow = [float(x) for x in args.slow_ms.split(",") if x.strip()]
    if args.ci:
        args.episodes, slow = 1, slow[:1]
    contract = load_contract(DEMO / "contract.toml")
    args.roofline_ms, peaks = roofline_latency_ms(short=args.ci)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vlad-async-") as tmp:
        for delay in ([] if args.no_real else [None]) + slow:
            label = "real" if delay is None else f"slow {delay:g} ms"
            rows += run_backend(label, Path(tmp), args, contract, delay)
    result = {
        "conditions": {
            **conditions(),
            "episodes": args.episodes,
            "execute": args.execute,
            "overlap": args.overlap,
            "blend": args.blend,
            "slow_ms": slow,
            "roofline_ms": round(args.roofline_ms, 4),
            "peaks": peaks,
            "period_ms": contract.timing.control_period_ms,
            "chunk": contract.action.chunk_length,
        },
        "rows": rows,
    }
    heads = [h for h, _ in COLUMNS]
    if args.markdown:
        print("| " + " | ".join(heads) + " |")
        print("|" + "|".join("---" for _ in heads) + "|")
        for r in rows:
            print("| " + " | ".join(_cells(r)) + " |")
    else:
        for r in rows:
            print("  ".join(f"{h}: {c}" for h, c in zip(heads, _cells(r), strict=True)))
    print(json.dumps(result["conditions"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
