"""The demo: ``vlad serve`` on the embedded demo release, a simulated robot as controller.

The MuJoCo arm runs in real time at the contract's control period. Every period it
captures a frame and its joint state, publishes them through :mod:`vlad.client`, sends a
heartbeat, takes the newest fresh action chunk and executes the waypoint for the current
time (holding position when it has none). Between episodes it prints what happened; at
the end the success rate, the latency the controller saw, and ``vladctl status``.

    ./scripts/demo [--episodes 10] [--config etc/vlad/demo.toml] [--no-daemon-log] [--remote] [--openpi]

``--remote`` serves the policy from a real KServe v2 server on 127.0.0.1 instead
(:mod:`vlad_kserve.demo`; local ONNX Runtime is its fallback). ``--openpi`` drives the arm
with openpi's own client through vlad's openpi-compatible endpoint (:mod:`vlad.demo.openpi`).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

from vlad.cli.daemon import format_status
from vlad.client import Client, ClientError
from vlad.config import load_config
from vlad.demo import sim

ROOT = Path(__file__).resolve().parents[2]
OPENPI_PORT = 8000  # openpi's default


def start_daemon(config: Path, quiet: bool, settings: list[str] | None = None) -> subprocess.Popen:
    vlad = Path(sys.executable).parent / "vlad"
    out = subprocess.DEVNULL if quiet else None
    sets = [a for item in settings or [] for a in ("--set", item)]
    return subprocess.Popen([str(vlad), "serve", "--config", str(config), *sets], stdout=out, stderr=out)


def wait_ready(client: Client, proc: subprocess.Popen, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"demo: vlad exited with status {proc.returncode} before it was ready")
        try:
            st = client.status(timeout_ms=500)
            if st["state"] == "ACTIVE":
                return st
        except ClientError:
            pass
        time.sleep(0.2)
    raise SystemExit("demo: vlad did not become ready in time")


def run_episode(
    client: Client, task: sim.ReacherTask, seed: int, instruction: str, period_ns: int, exec_steps: int = 4
) -> dict:
    """One real-time episode. vlad answers every observation, but like the policy was
    trained (and like pi0 executes its chunks), the controller commits to a chunk for
    ``exec_steps`` periods before taking the newest one: replanning every period lets a
    flow-matching policy switch between modes (here: the two goals) on fresh noise."""
    obs = task.reset(seed, instruction)
    chunk = None
    latencies, held = [], 0
    first_seq = None
    next_tick = time.monotonic_ns()
    for _ in range(sim.EPISODE_STEPS):
        t_sensor = time.monotonic_ns()
        assert obs.image is not None  # the demo's task renders every step
        seq = client.publish_observation(
            {"overhead": obs.image}, proprio=obs.proprio, instruction=instruction, t_sensor_ns=t_sensor
        )
        first_seq = seq if first_seq is None else first_seq
        client.heartbeat()
        # Wait for this observation's chunk until shortly before the period ends; keep
        # executing the previous one if it does not come in time.
        newest = client.recv_actions(timeout_ms=max(1, int((next_tick + period_ns * 0.8 - time.monotonic_ns()) / 1e6)))
        while newest is not None and newest.obs_seq < seq:
            more = client.recv_actions(
                timeout_ms=max(0, int((next_tick + period_ns * 0.8 - time.monotonic_ns()) / 1e6))
            )
            if more is None:
                break
            newest = more
        now = time.monotonic_ns()
        if newest is not None and newest.obs_seq < first_seq:
            # Computed before the reset (e.g. a hold of the old pose): never executed. vlad
            # refuses the jump of the reset arm until a few observations confirm it.
            newest = None
        if newest is not None:
            if newest.obs_seq == seq:
                latencies.append((newest.t_receive_ns - newest.t_sensor_ns) / 1e6)
            if chunk is None or chunk.is_stale(now) or (now - chunk.t_sensor_ns) // period_ns >= exec_steps:
                chunk = newest
        command = chunk.action_at(now) if chunk is not None else None
        if command is None:  # nothing fresh to execute: hold where we are
            command, held = obs.proprio[:2], held + 1
        obs = task.step(np.asarray(command, dtype=np.float64))
        next_tick += period_ns
        time.sleep(max(0.0, (next_tick - time.monotonic_ns()) / 1e9))
    d = task.distance()
    return {"success": d < sim.SUCCESS_RADIUS, "distance": d, "latencies": latencies, "held": held}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=10, help="episodes, alternating the two instructions")
    ap.add_argument("--config", type=Path, default=ROOT / "etc" / "vlad" / "demo.toml")
    ap.add_argument("--seed", type=int, default=20_000)
    ap.add_argument("--exec-steps", type=int, default=4, help="periods to follow one chunk before the next")
    ap.add_argument("--no-daemon-log", action="store_true", help="hide the daemon's log lines")
    ap.add_argument(
        "--remote",
        action="store_true",
        help="serve the policy from a KServe v2 server on 127.0.0.1 (gRPC), local ONNX Runtime as fallback",
    )
    ap.add_argument(
        "--openpi",
        action="store_true",
        help="drive the arm with openpi's client (WebsocketClientPolicy + ActionChunkBroker) through "
        "vlad's openpi-compatible endpoint on 127.0.0.1:8000",
    )
    args = ap.parse_args(argv)

    server = None
    if args.remote:
        from vlad_kserve.demo import start_remote_demo

        args.config, server = start_remote_demo(args.config, Path(tempfile.mkdtemp(prefix="vlad-demo-remote-")))
    try:
        return run_demo(args)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)


def run_demo(args: argparse.Namespace) -> int:
    """Start the daemon on ``args.config``, run the episodes, print what happened."""
    cfg = load_config(args.config)
    print(f"demo: starting vlad serve --config {args.config}", flush=True)
    openpi = getattr(args, "openpi", False)
    if openpi:
        from vlad.demo import openpi as demo_openpi

        settings = [*demo_openpi.OPENPI_SETTINGS, f"compat.openpi.listen='127.0.0.1:{OPENPI_PORT}'"]
        cfg = load_config(args.config, settings)
    proc = start_daemon(args.config, args.no_daemon_log, settings if openpi else None)
    client = Client.from_config(cfg, name="mujoco-reacher")
    results = []
    try:
        st = wait_ready(client, proc)
        period_ns = int(st["control_period_ms"] * 1e6)
        print(f"demo: vlad is {st['state']}: {st['release']} on {st['backend']['name']} ({st['backend']['runtime']})")
        print(
            f"demo: simulated Reacher arm at {1e3 / st['control_period_ms']:.0f} Hz, {sim.EPISODE_STEPS} periods per episode,"
            f" success = fingertip within {sim.SUCCESS_RADIUS * 1000:.0f} mm of the goal at the end\n",
            flush=True,
        )
        policy = None
        if openpi:
            policy = demo_openpi.connect("127.0.0.1", OPENPI_PORT, action_horizon=args.exec_steps)
            print(
                f"demo: openpi's WebsocketClientPolicy + ActionChunkBroker(action_horizon={args.exec_steps}) on "
                f"ws://127.0.0.1:{OPENPI_PORT}\n",
                flush=True,
            )
        with sim.ReacherTask(render=True) as task:
            for i in range(args.episodes):
                instruction = sim.INSTRUCTIONS[i % len(sim.INSTRUCTIONS)]
                if policy is not None:
                    r = demo_openpi.run_episode(policy, task, args.seed + i, instruction, period_ns)
                else:
                    r = run_episode(client, task, args.seed + i, instruction, period_ns, args.exec_steps)
                results.append(r)
                lat = np.asarray(r["latencies"]) if r["latencies"] else np.asarray([np.nan])
                print(
                    f"episode {i + 1:>3}  {instruction!r:<42} {'SUCCESS' if r['success'] else 'miss   '}"
                    f"  final distance {r['distance'] * 1000:6.1f} mm   sensor->action p50 {np.median(lat):5.2f} ms"
                    f"  max {lat.max():5.2f} ms   held {r['held']}",
                    flush=True,
                )
        all_lat = np.concatenate([np.asarray(r["latencies"]) for r in results if r["latencies"]] or [np.zeros(1)])
        ok = sum(r["success"] for r in results)
        print(
            f"\ndemo: {ok}/{len(results)} episodes succeeded; latency seen by the controller (sensor -> action received):"
            f" p50 {np.percentile(all_lat, 50):.2f} ms, p95 {np.percentile(all_lat, 95):.2f} ms,"
            f" p99 {np.percentile(all_lat, 99):.2f} ms over {len(all_lat)} chunks\n"
        )
        print("vladctl status:")
        print(format_status(client.status()))
    finally:
        client.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
