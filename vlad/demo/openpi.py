"""The demo arm driven through vlad's openpi endpoint by openpi's own, unmodified client.

``openpi_client.websocket_client_policy.WebsocketClientPolicy`` talks to
``[compat.openpi]``; ``openpi_client.action_chunk_broker.ActionChunkBroker`` hands out one
waypoint per control step and asks for a new chunk every ``action_horizon`` steps, the way
openpi's robot runtimes do. The native demo controller (:func:`vlad.demo.run.run_episode`)
commits to a chunk for the same number of periods but asks every period, so vlad sees the
arm every period; docs/operations.md ("Cadence and the guard") says what that changes, and
``tests/test_openpi.py`` compares the two clients at the same cadence.

A request vlad answers with an error (a refused observation after the arm was reset, a
hold, an e-stop) raises ``RuntimeError`` in the client; the arm then holds where it is for
that step and the broker asks again on the next one.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from vlad.demo import sim

# The keys this demo's [compat.openpi] mapping names (tests and etc/vlad/demo-openpi.toml).
IMAGE_KEY = "observation/image"
STATE_KEY = "observation/state"
OPENPI_SETTINGS = [
    "compat.openpi.enabled=true",
    f"compat.openpi.cameras={{overhead='{IMAGE_KEY}'}}",
    f"compat.openpi.proprio=['{STATE_KEY}']",
    # openpi clients send an observation only when their chunk runs out
    # (every action_horizon periods): the stall monitor must allow for that.
    "monitors.sensor_stall_periods=10",
]


def connect(host: str, port: int, action_horizon: int = 4) -> Any:
    from openpi_client.action_chunk_broker import ActionChunkBroker
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    return ActionChunkBroker(WebsocketClientPolicy(host, port), action_horizon=action_horizon)


def run_episode(policy: Any, task: sim.ReacherTask, seed: int, instruction: str, period_ns: int) -> dict:
    """One real-time episode; ``policy`` is an openpi ``BasePolicy`` (the broker)."""
    obs = task.reset(seed, instruction)
    policy.reset()
    held, errors, latencies = 0, [], []
    timing = None  # the broker repeats (a copy of) the server timing for every step of a chunk
    next_tick = time.monotonic_ns()
    for _ in range(sim.EPISODE_STEPS):
        t0 = time.monotonic_ns()
        try:
            out = policy.infer({IMAGE_KEY: obs.image, STATE_KEY: obs.proprio, "prompt": instruction})
            command = np.asarray(out["actions"], dtype=np.float64)
            if out.get("server_timing") != timing:  # this step asked the server (a new infer_ms)
                timing = out.get("server_timing")
                latencies.append((time.monotonic_ns() - t0) / 1e6)
        except RuntimeError as exc:  # vlad's error reply: hold where we are this step
            errors.append(str(exc).splitlines()[-1])
            command, held = obs.proprio[:2], held + 1
        obs = task.step(command)
        next_tick += period_ns
        time.sleep(max(0.0, (next_tick - time.monotonic_ns()) / 1e9))
    d = task.distance()
    return {"success": d < sim.SUCCESS_RADIUS, "distance": d, "latencies": latencies, "held": held, "errors": errors}


def run_episodes(args: Any, period_ns: int, port: int) -> int:
    """``args.episodes`` episodes (alternating instructions) through openpi's client; prints each."""
    policy = connect("127.0.0.1", port, action_horizon=args.exec_steps)
    print(
        f"demo: openpi's WebsocketClientPolicy + ActionChunkBroker(action_horizon={args.exec_steps}) on "
        f"ws://127.0.0.1:{port}\n",
        flush=True,
    )
    results = []
    with sim.ReacherTask(render=True) as task:
        for i in range(args.episodes):
            instruction = sim.INSTRUCTIONS[i % len(sim.INSTRUCTIONS)]
            r = run_episode(policy, task, args.seed + i, instruction, period_ns)
            results.append(r)
            lat = np.asarray(r["latencies"]) if r["latencies"] else np.asarray([np.nan])
            print(
                f"episode {i + 1:>3}  {instruction!r:<42} {'SUCCESS' if r['success'] else 'miss   '}"
                f"  final distance {r['distance'] * 1000:6.1f} mm   request p50 {np.median(lat):5.2f} ms"
                f"  held {r['held']}",
                flush=True,
            )
    ok = sum(r["success"] for r in results)
    print(f"\ndemo: {ok}/{len(results)} episodes succeeded through vlad's openpi endpoint")
    return 0 if results else 1
