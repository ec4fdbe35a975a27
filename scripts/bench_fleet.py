#!/usr/bin/env python3
"""A fleet on one machine: a real OCI registry on loopback (Debian's docker-registry) and N
``vlad serve`` daemons, each with its own release store and sockets, in three waves:

1. install: every robot pulls the base release by digest (``vladctl pull``) into its
   store, then its daemon starts serving it;
2. variant: every robot deploys a variant over the same weights (``vladctl deploy REF``,
   a pull then the daemon's deploy): only the files that differ cross the network;
3. canary, phased: a third release with ``--canary``, ``--phase`` robots at a time, each
   fed by a controller; one robot's engine turns out-of-bounds (the fault-injecting test
   backend): its canary aborts, only that robot rolls back, and the rollout stops after
   that phase (as a fleet engine's failure threshold stops it).

Prints the bytes moved, the wall time per wave and per robot, the registry's CPU time,
memory and requests, with the conditions. Usage::

    MUJOCO_GL=egl .venv/bin/python scripts/bench_fleet.py [--robots 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlad.config import Config, ReleaseConfig, ServeConfig, StoreConfig  # noqa: E402
from vlad.daemon.child import launch  # noqa: E402
from vlad.release.store import ReleaseStore  # noqa: E402
from vlad_tools.testing import DEMO, PLUGIN_ENV, ControllerSim, load_golden  # noqa: E402
from vlad_tools.testing.conditions import conditions  # noqa: E402
from vlad_tools.testing.registry import RegistryProcess, registry_unavailable  # noqa: E402
from vlad_tools.testing.releases import DEMO_KEYS, signed_demo_copy  # noqa: E402

VLADCTL = str(Path(sys.executable).parent / "vladctl")
SUMMARY = re.compile(r"([\d.]+) MB: ([\d.]+) MB moved, ([\d.]+) MB already there .*, ([\d.]+) s, (\d+) requests")


def registry_usage(pid: int) -> tuple[float, float]:
    """(CPU seconds, peak resident MiB) of the registry process so far."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    hwm = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM"))
    return cpu, int(hwm.split()[1]) / 1024


def vladctl(*args: str, timeout: float = 600) -> tuple[float, dict, str]:
    """Run vladctl; (seconds, the transfer summary it printed, stdout)."""
    t0 = time.monotonic()
    out = subprocess.run([VLADCTL, *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"bench_fleet: vladctl {' '.join(args[:2])} failed: {out.stderr.strip()[-400:]}")
    m = SUMMARY.search(out.stderr)
    summary = (
        {"total_mb": float(m[1]), "moved_mb": float(m[2]), "local_mb": float(m[3]), "requests": int(m[5])} if m else {}
    )
    return time.monotonic() - t0, summary, out.stdout


def wave(name: str, jobs: list, registry: RegistryProcess, parallel: int) -> dict:
    """Run ``jobs`` (callables returning (seconds, summary)) ``parallel`` at a time."""
    cpu0, _ = registry_usage(registry.proc.pid)
    t0 = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(lambda job: job(), jobs))
    wall = time.monotonic() - t0
    cpu1, hwm = registry_usage(registry.proc.pid)
    seconds = sorted(r[0] for r in results)
    row = {
        "wave": name,
        "robots": len(jobs),
        "parallel": parallel,
        "wall_s": round(wall, 2),
        "per_robot_s_p50": round(seconds[len(seconds) // 2], 2),
        "per_robot_s_max": round(seconds[-1], 2),
        "moved_mb": round(sum(r[1].get("moved_mb", 0) for r in results), 2),
        "local_mb": round(sum(r[1].get("local_mb", 0) for r in results), 2),
        "release_mb": results[0][1].get("total_mb", 0),
        "registry_requests": sum(r[1].get("requests", 0) for r in results),
        "registry_cpu_s": round(cpu1 - cpu0, 2),
        "registry_peak_rss_mib": round(hwm, 1),
    }
    print(
        f"{name}: {row['robots']} robots ({parallel} at a time) in {row['wall_s']} s "
        f"(per robot p50 {row['per_robot_s_p50']} s, max {row['per_robot_s_max']} s); "
        f"{row['moved_mb']} MB moved, {row['local_mb']} MB already on the robots; registry "
        f"{row['registry_requests']} requests, {row['registry_cpu_s']} s CPU, peak RSS {row['registry_peak_rss_mib']} MiB",
        flush=True,
    )
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--robots", type=int, default=20)
    p.add_argument("--parallel", type=int, default=5, help="robots pulling or deploying at once")
    p.add_argument("--faulty", type=int, default=7, help="the robot whose canary fails")
    p.add_argument("--phase", type=int, default=5, help="robots per phase of the canary rollout")
    p.add_argument("--canary-window-s", type=float, default=20.0)
    p.add_argument("--obs-every", type=int, default=5, help="controllers observe every this many periods")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    if (why := registry_unavailable()) is not None:
        raise SystemExit(f"bench_fleet: {why}")
    work = Path(tempfile.mkdtemp(prefix="vlad-fleet-"))
    registry = RegistryProcess(work / "registry")
    daemons, controllers, clients = [], [], []
    try:
        # The releases: the demo, a variant over the same weights, a canary on the fault backend.
        variant = signed_demo_copy(work / "releases" / "v1.1.0", "1.1.0", 2)
        canary = signed_demo_copy(
            work / "releases" / "v1.2.0",
            "1.2.0",
            3,
            backend="wrapped",
            options=json.dumps({"control_file": "fault", "intra_op_threads": 1}),  # relative: each robot's own
            canary_window_s=args.canary_window_s,
            # A canary runs beside the previous release on the same cores (both infer every
            # cycle); with many daemons on 2 cores deadlines are missed by the machine, not
            # the release: the verdict here rests on the guard's interventions.
            canary_max_deadline_miss_rate=1.0,
        )
        refs = {}
        for folder, tag in ((DEMO, "1.0.0"), (variant, "1.1.0"), (canary, "1.2.0")):
            _, summary, out = vladctl(
                "push", str(folder), f"{registry.host}/fleet/reacher:{tag}", "--keys", str(DEMO_KEYS), "--plain-http"
            )
            refs[tag] = out.strip()
            print(f"pushed {tag}: {refs[tag]}", flush=True)
        stored = registry.stored_bytes()
        robots = [work / f"robot-{i:02d}" for i in range(args.robots)]

        def install(robot: Path):
            def job():
                r = vladctl(
                    "pull", refs["1.0.0"], "--out", str(robot / "base"), "--root", str(robot / "store"),
                    "--keys", str(DEMO_KEYS), "--plain-http",
                )  # fmt: skip
                store = ReleaseStore(robot / "store", DEMO_KEYS)
                store.activate(store.stage(robot / "base"), who="bench", why="install")
                shutil.rmtree(robot / "base")
                return r[0], r[1]

            return job

        rows = [wave("install (pull the base)", [install(r) for r in robots], registry, args.parallel)]
        t0 = time.monotonic()
        for robot in robots:
            cfg = Config(
                release=ReleaseConfig(path=str(robot / "store" / "releases" / "active"), keys_dir=str(DEMO_KEYS)),
                serve=ServeConfig(warmup=3),
                store=StoreConfig(root=str(robot / "store")),
            )
            daemons.append(launch(cfg, folder=robot / "daemon", env=PLUGIN_ENV, cwd=robot, wait_ready=False))
        for d in daemons:
            d.wait_ready(300)
        started = time.monotonic() - t0
        print(f"{len(daemons)} daemons ready in {started:.1f} s", flush=True)

        def deploy(i: int, ref: str, *extra: str):
            def job():
                r = vladctl(
                    "deploy", ref, "--endpoint", daemons[i].endpoints["control"], "--root", str(robots[i] / "store"),
                    "--keys", str(DEMO_KEYS), "--plain-http", "--who", "fleet", "--why", "bench wave", *extra,
                )  # fmt: skip
                return r[0], r[1]

            return job

        rows.append(
            wave(
                "variant (deploy by digest)",
                [deploy(i, refs["1.1.0"]) for i in range(len(robots))],
                registry,
                args.parallel,
            )
        )
        # The canary wave as a phased rollout: --phase robots at a time, each phase's robots
        # fed by a controller until their verdicts; a phase with an aborted canary stops
        # the rollout (what a fleet engine's failure threshold does).
        golden = load_golden()[0]
        (robots[args.faulty] / "fault").write_text("oob")
        verdicts: dict[int, str] = {}
        reasons: dict[int, str] = {}
        phases = []
        for start in range(0, len(robots), args.phase):
            members = list(range(start, min(start + args.phase, len(robots))))
            feeding = []
            for i in members:
                client = daemons[i].client()
                clients.append(client)
                feeding.append(ControllerSim(client, golden, obs_every=args.obs_every).start())
            controllers.extend(feeding)
            row = wave(
                f"canary phase {len(phases) + 1} (deploy --canary)",
                [deploy(i, refs["1.2.0"], "--canary") for i in members],
                registry,
                args.parallel,
            )
            deadline = time.monotonic() + args.canary_window_s + 60
            while time.monotonic() < deadline and not all(i in verdicts for i in members):
                for i in members:
                    st = clients[i].status()
                    if i not in verdicts and st.get("canary") is None:
                        verdicts[i] = st["release"]
                        aborts = [e for e in clients[i].control("events", limit=50) if e["kind"] == "canary_abort"]
                        if aborts:
                            reasons[i] = aborts[-1]["reason"]
                time.sleep(0.5)
            for c in feeding:
                c.stop()
            failed = [i for i in members if verdicts.get(i) != "vlad-demo-reacher@1.2.0"]
            row["kept"] = len(members) - len(failed)
            row["rolled_back"] = {str(i): reasons.get(i, verdicts.get(i, "no verdict")) for i in failed}
            rows.append(row)
            phases.append(members)
            print(
                f"  phase {len(phases)}: robots {members[0]}-{members[-1]}: {row['kept']} kept 1.2.0"
                + "".join(f"; robot {i} rolled back ({row['rolled_back'][str(i)]})" for i in failed),
                flush=True,
            )
            if failed:
                print(f"  rollout stopped after phase {len(phases)}", flush=True)
                break
        rolled_back = sorted(i for i, rel in verdicts.items() if rel != "vlad-demo-reacher@1.2.0")
        kept = sum(rel == "vlad-demo-reacher@1.2.0" for rel in verdicts.values())
        untouched = [i for i in range(len(robots)) if i not in verdicts]
        print(
            f"canary: {kept} robots kept 1.2.0, rolled back: {rolled_back}, not reached (rollout stopped): "
            f"{len(untouched)}",
            flush=True,
        )
        result = {
            "conditions": {
                **conditions(),
                "robots": len(robots),
                "release_files": 15,
                "registry": "docker-registry 2.8 (Debian), filesystem storage, loopback, plain HTTP",
                "controllers": f"one per robot of the canary phase, observations every {args.obs_every} periods of 20 ms",
            },
            "registry_stored_mb": round(stored / 1e6, 2),
            "daemons_ready_s": round(started, 1),
            "waves": rows,
            "canary": {
                "faulty_robot": args.faulty,
                "phase_size": args.phase,
                "kept": kept,
                "rolled_back": {str(i): reasons.get(i, verdicts[i]) for i in rolled_back},
                "not_reached": untouched,
            },
        }
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        faulty_phase = args.faulty // args.phase
        ok = rolled_back == [args.faulty] and kept == (faulty_phase + 1) * args.phase - 1
        print("fleet: only the faulty robot rolled back" if ok else "fleet: UNEXPECTED canary verdicts", flush=True)
        for i, why in sorted(reasons.items()):
            print(f"  robot {i}: {why}", flush=True)
        return 0 if ok else 1
    finally:
        for c in controllers:
            c.stop()
        for c in clients:
            c.close()
        for d in daemons:
            d.stop()
        registry.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
