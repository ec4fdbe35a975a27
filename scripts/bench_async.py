#!/usr/bin/env python3
"""Chunk execution that waits in the tick vs asynchronous, measured in the simulator through the daemon.

The MuJoCo Reacher arm (``vlad.demo.sim``) runs in real time at the contract's control
period and talks to a real ``vlad serve`` subprocess over its real ZeroMQ sockets, every
episode on the one episode runner (:func:`vlad.episodes.run_episode`, its lock-step clock
and its :class:`~vlad.client.ChunkExecutor`):

* ``wait``: the runner's default rule: ask for the next chunk once ``--execute`` waypoints
  of the current one have run, wait up to 80 % of the period inside the tick for the
  answer, switch hard; an answer that comes later is adopted at its real age (the
  waypoints already past are dropped) while the current chunk keeps running meanwhile
  (the arm holds once it runs out);
* ``async``: a :class:`~vlad.client.ChunkExecutor` that asks for the next chunk when the
  waypoints left fall to the threshold (default: the smallest that never idles at the
  measured latency while replanning every ``--execute`` waypoints, see
  :mod:`vlad.planner.execution`), never waits inside a tick (an answer is taken at the tick
  it arrived by), switches at the index for now and blends.

The controller sends a frame only when it asks for a chunk (``DaemonLink(streams=False)``:
a heartbeat every period declaring the ``request`` cadence), so the policy worker is idle
when a request comes: each answer takes the policy's own latency, which is what the two
rules are compared on.

Each runs against the real backend (the signed demo release, ONNX Runtime) and against
an artificially slowed one (:mod:`vlad.testing.plugin`'s ``wrapped`` backend: every
inference takes at least ``--slow-ms``). At 70 ms, waiting in the tick no longer hides the
latency while async still can (at most half of the chunk's 160 ms horizon, see
:mod:`vlad.planner.execution`); 100 ms is longer than executing the 4 waypoints of a chunk
takes (80 ms) and more than half the horizon: both lose ticks.
Reported per configuration, from the runner's :class:`~vlad.episodes.EpisodeLog`: control
rate (policy waypoints per second once the first chunk arrived; the robot asks for 50),
idle gaps, the command jump at chunk switches, joint jerk, success rate, and latency,
next to the planner's prediction (roofline latency from this machine's micro-benchmarks,
and the measured latency).

    .venv/bin/python scripts/bench_async.py [--episodes 10] [--slow-ms 70,100] [--markdown]
    .venv/bin/python scripts/bench_async.py --ci        # one episode each, real + 70 ms, ~10 s
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

from vlad.client import ActionChunk, ChunkExecutor, Client
from vlad.config import Config, ReleaseConfig, ServeConfig, load_config
from vlad.contract import load_contract
from vlad.demo import sim
from vlad.episodes import DaemonLink, EpisodeLog, run_episode
from vlad.planner.execution import async_threshold, chunk_rate
from vlad.testing import DEMO, DEMO_CONFIG, PLUGIN_ENV, DaemonProcess, launch, unsigned_copy
from vlad.testing.conditions import conditions as shared_conditions

WAIT_FRACTION = 0.8


# This controller asks by request (the episodes' DaemonLink(streams=False) declares it in
# every heartbeat): its heartbeats between episodes say so too, or the daemon would expect a
# stream and call the pause a stalled sensor.
CADENCE = "request"


def wait_for(client: Client, seq: int, until_ns: int) -> ActionChunk | None:
    """The policy chunk answering observation ``seq``, or None at ``until_ns``. Heartbeats
    go on meanwhile (every 10 ms): a controller silent for 5 periods counts as gone."""
    while True:
        left_ms = (until_ns - time.monotonic_ns()) / 1e6
        chunk = client.recv_actions(timeout_ms=max(0, min(10, int(left_ms))))
        if chunk is None and left_ms > 10:
            client.heartbeat(CADENCE)
            continue
        if chunk is not None and chunk.obs_seq == seq and not chunk.is_hold:
            return chunk
        if left_ms <= 0 or (chunk is None and time.monotonic_ns() >= until_ns):
            return None


def settle(client: Client, seconds: float = 0.15) -> None:
    """Between episodes: heartbeats on, answers to the last episode's frames drained, so
    that the next episode starts with an idle policy worker."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        client.heartbeat(CADENCE)
        client.recv_actions(timeout_ms=10)


def measure_latency(client: Client, task: sim.ReacherTask, frames: int) -> float:
    """Median frame -> chunk latency (ms) over ``frames`` request/answer round trips."""
    obs, lat = task.reset(19_999, sim.INSTRUCTIONS[0], render=True), []
    assert obs.image is not None
    for _ in range(frames):
        seq = client.publish_observation({"overhead": obs.image}, proprio=obs.proprio, instruction=sim.INSTRUCTIONS[0])
        client.heartbeat(CADENCE)
        chunk = wait_for(client, seq, time.monotonic_ns() + 5_000_000_000)
        if chunk is not None:
            lat.append((chunk.t_receive_ns - chunk.t_sensor_ns) / 1e6)
    if not lat:
        raise SystemExit("bench_async: the daemon answered no frame within 5 s")
    return float(np.median(lat))


def policy_ticks(log: EpisodeLog) -> list[bool]:
    """Per tick: a policy waypoint was executed (not the runner's hold, not a hold chunk)."""
    return [not (src == "held" or src.startswith("hold")) for src in log.sources]


def summarize(logs: list[EpisodeLog], period_ms: float) -> dict:
    """Control rate, idle gaps, switch jumps, jerk, success and latency over episodes."""
    rates, gaps, jumps, jerks, idle = [], [], [], [], 0
    for log in logs:
        policy = policy_ticks(log)
        first = policy.index(True) if any(policy) else len(policy)
        steady = policy[first:]
        rates.append(1000.0 / period_ms * sum(steady) / max(1, len(steady)))
        run = 0
        for p in steady + [True]:
            if p:
                if run:
                    gaps.append(run * period_ms)
                run = 0
            else:
                run, idle = run + 1, idle + 1
        cmds = np.asarray(log.commands)
        # a switch: the first tick a new chunk's waypoint is executed
        switches = [t for t in range(first + 1, len(policy)) if policy[t] and log.chunks[t] != log.chunks[t - 1]]
        jumps += [float(np.abs(cmds[t] - cmds[t - 1]).max()) for t in switches]
        q = np.asarray(log.trajectory[:-1])[first:]  # measured joint angles at each tick
        if len(q) > 3:  # third difference of the measured joint angles
            jerks += list(np.abs(np.diff(q, n=3, axis=0)).max(axis=1) / (period_ms / 1000) ** 3)
    lat = np.concatenate([log.latencies_ms for log in logs]) if any(log.latencies_ms for log in logs) else np.zeros(1)
    return {
        "episodes": len(logs), "success": sum(log.success for log in logs),
        "mean_final_distance_mm": round(1000 * float(np.mean([log.final_distance for log in logs])), 1),
        "control_hz": round(float(np.mean(rates)), 2), "idle_ticks": idle,
        "max_gap_ms": round(max(gaps, default=0.0), 1), "gaps": len(gaps),
        "switch_jump_mean_rad": round(float(np.mean(jumps)) if jumps else 0.0, 4),
        "switch_jump_max_rad": round(max(jumps, default=0.0), 4),
        "jerk_rms_rad_s3": round(float(np.sqrt(np.mean(np.square(jerks)))) if jerks else 0.0, 1),
        "jerk_p95_rad_s3": round(float(np.percentile(jerks, 95)) if jerks else 0.0, 1),
        "latency_p50_ms": round(float(np.median(lat)), 2), "latency_max_ms": round(float(lat.max()), 2),
    }  # fmt: skip


def real_config() -> Config:
    """The signed demo release on real ONNX Runtime."""
    return load_config(DEMO_CONFIG)


def slow_config(folder: Path, slow_ms: float, deadline_ms: float) -> Config:
    """Unsigned copy of the demo release on the slowed ``wrapped`` backend. Only the
    contract's e2e deadline changes: the slowness is intended, the daemon's deadline
    monitor should not flag it."""
    release = unsigned_copy(folder / "release", edits={"e2e_deadline_ms = 20.0": f"e2e_deadline_ms = {deadline_ms}"})
    return Config(
        release=ReleaseConfig(
            path=str(release),
            verify=False,
            backend="wrapped",
            artifact="policy.onnx",
            options={"delay_ms": slow_ms, "inner": "onnxruntime", "intra_op_threads": 1},
        ),
        serve=ServeConfig(warmup=2),
    )


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
    if slow_ms is None:
        d = launch(real_config(), folder=folder)
    else:
        d = launch(slow_config(folder, slow_ms, deadline_ms=max(20.0, 1.75 * slow_ms)), folder=folder, env=PLUGIN_ENV)
    period_ms = contract.timing.control_period_ms
    period_ns, chunk = int(period_ms * 1e6), contract.action.chunk_length
    rows = []
    try:
        client = d.client("bench-async")
        link = DaemonLink(client, streams=False)
        with sim.ReacherTask(render=False) as task:
            latency = measure_latency(client, task, 5 if args.ci else 20)  # sets the async threshold
            validity = contract.timing.action_validity_ms
            validity_ns = int(validity * 1e6)  # a frame unanswered this long will never be useful
            threshold = (
                args.threshold
                if args.threshold is not None
                else async_threshold(latency, period_ms, chunk, args.execute, validity)
            )

            def async_executor() -> ChunkExecutor:
                return ChunkExecutor(
                    request_threshold=threshold, overlap=args.overlap, blend=args.blend, request_timeout_ns=validity_ns
                )

            for mode in ("wait", "async"):
                logs = []
                for i in range(args.episodes):
                    seed, instruction = args.seed + i, sim.INSTRUCTIONS[i % len(sim.INSTRUCTIONS)]
                    settle(client)
                    logs.append(
                        run_episode(
                            task,
                            link,
                            seed,
                            instruction,
                            period_ns=period_ns,
                            exec_steps=args.execute,
                            chunk_length=chunk,
                            budget=WAIT_FRACTION,
                            label=f"{label} {mode}",
                            executor=async_executor if mode == "async" else None,
                            wait=mode == "wait",
                        )
                    )
                rows.append(_row(label, mode, threshold, logs, client, d, args, contract, slow_ms))
    finally:
        d.stop()
    if any(r["control_hz"] == 0 for r in rows):  # say why, from the daemon's own log
        print(f"bench_async: {label}: no policy waypoint executed; daemon log:\n{d.log()[-3000:]}", file=sys.stderr)
    return rows


def _row(
    label: str,
    mode: str,
    threshold: int,
    logs: list[EpisodeLog],
    client: Client,
    d: DaemonProcess,
    args,
    contract,
    slow_ms: float | None,
) -> dict:
    """One configuration's figures, the daemon's view and the planner's predictions."""
    period_ms, chunk = contract.timing.control_period_ms, contract.action.chunk_length
    st = client.status()
    row = {
        "backend": label,
        "mode": mode,
        "threshold": threshold if mode == "async" else None,
        **summarize(logs, period_ms),
        "daemon": {
            "state": st["state"],
            "fallbacks": d.log().count("-> FALLBACK"),
            **{k: st["counters"].get(k, 0) for k in ("stale", "superseded", "bridged")},
        },
    }

    def predicted_hz(latency_ms: float) -> float:
        rate = chunk_rate(
            latency_ms,
            period_ms,
            chunk,
            mode=mode,
            execute=args.execute,
            threshold=threshold,
            validity_ms=contract.timing.action_validity_ms,
            wait_fraction=WAIT_FRACTION,
        )
        return round(rate.control_hz, 2)

    row["predicted_hz_measured_latency"] = predicted_hz(row["latency_p50_ms"])
    row["predicted_hz_roofline"] = predicted_hz(max(args.roofline_ms, slow_ms or 0.0))
    return row


def conditions() -> dict:
    return shared_conditions("onnxruntime", "mujoco")


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
