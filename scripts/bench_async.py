#!/usr/bin/env python3
"""The latency sweep: real-time chunking (by inpainting in the graph, and by guidance),
plain asynchronous execution and the waiting rule, through the daemon at injected inference
latencies, against the policy in process.

The MuJoCo Reacher arm (``vlad_tools.demo.sim``) runs in real time at the contract's control
period and talks to a real ``vlad serve`` subprocess over its real ZeroMQ sockets, every
episode on the one episode runner (:func:`vlad_tools.episodes.run_episode`). The daemon serves the
demo release on the ``wrapped`` backend (:mod:`vlad_tools.gates.wrapped`) around a real engine:
every inference takes at least the injected latency, drawn within ±``--jitter`` of it
(0 ms: the engine's own time). Rules, per latency:

* ``rtc``: a streaming controller (an observation and a heartbeat every period, reporting
  the chunk it executes) that executes the newest chunk; the daemon computes each chunk to
  continue it (``serve.rtc = "on"``, :mod:`vlad.serving.rtc`) with the graph's own
  gradient-free inpainting (ONNX Runtime, one thread);
* ``guided``: the same, by guidance (a vector-Jacobian product per denoising step,
  :mod:`vlad_torch.guided`: the torch backend, one thread);
* ``async``: the same controller; every chunk computed plain (``serve.rtc = "off"``);
* ``wait``: the runner's default rule: ask for a chunk every ``--execute`` waypoints (an
  observation only then, heartbeats declaring the ``request`` cadence), wait up to 80 % of
  the period for it inside the tick, switch hard (``serve.rtc = "off"``).

The reference: the same release in this process (ONNX Runtime, one thread), the ``wait``
rule at zero latency, on the same seeds (unseen in training, ``--episodes`` per
instruction). Per row: success per instruction, and the seeds it lost and gained against
the reference; idle ticks (no valid waypoint: the arm held; an episode starts once its
first plan came, the mean wait for it reported apart); the seam step (the change of the
executed command where a new chunk takes over, the episode's start from the still arm
included): max, p99 and how many exceed the contract's rate limit; the joint jerk (third
difference of the measured joint angles); chunks the guard changed, by kind; the latency
from sensor time to the chunk received.

    .venv/bin/python scripts/bench_async.py [--episodes 100] [--latency 0,50,100,200] [--hog] [--markdown]
    .venv/bin/python scripts/bench_async.py --ci     # one episode per row at 0 and 100 ms (~1 min)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

from vlad.config import Config, ReleaseConfig, ServeConfig
from vlad.contract import Contract, load_contract
from vlad.plugins import get_backend
from vlad.processing import Tokenizer
from vlad_tools.demo import sim
from vlad_tools.episodes import DaemonLink, EpisodeLog, InProcessLink, contract_infer, run_episode
from vlad_tools.gates.conditions import cpu_hog
from vlad_tools.testing import DEMO, PLUGIN_ENV, launch, unsigned_copy
from vlad_tools.testing.conditions import conditions as shared_conditions

WAIT_FRACTION = 0.8
RULES = ("rtc", "guided", "async", "wait")
ONNX = {"inner": "onnxruntime", "intra_op_threads": 1}
GUIDED = {"inner": "torch", "threads": 1, "rtc_encoder": "policy_encoder.pt2", "rtc_velocity": "policy_velocity.pt2"}
# The engine each rule is served by: artifact, the inner backend and its options, serve.rtc.
ENGINES = {
    "inpainting": ("policy.onnx", ONNX, "on"),
    "guidance": ("policy.pt2", GUIDED, "on"),
    "plain": ("policy.onnx", ONNX, "off"),
}
ENGINE = {"rtc": "inpainting", "guided": "guidance", "async": "plain", "wait": "plain"}


def daemon_config(folder: Path, latency_ms: float, jitter: float, engine: str, contract: Contract) -> Config:
    """An unsigned copy of the demo release on the delayed ``wrapped`` backend around
    ``engine`` (:data:`ENGINES`). Only the contract's e2e deadline changes (the slowness is the point: the
    deadline monitor should not call it a fault)."""
    deadline = max(contract.timing.e2e_deadline_ms, 1.5 * latency_ms * (1 + jitter) + 20.0)
    line = f"e2e_deadline_ms = {contract.timing.e2e_deadline_ms}"
    release = unsigned_copy(folder / "release", edits={line: f"e2e_deadline_ms = {deadline}"})
    artifact, options, rtc = ENGINES[engine]
    for name in (artifact, options.get("rtc_encoder"), options.get("rtc_velocity")):
        if name and not (release / name).exists():  # the copy holds the ONNX graph only
            shutil.copy(DEMO / name, release / name)
    return Config(
        release=ReleaseConfig(
            path=str(release),
            verify=False,
            backend="wrapped",
            artifact=artifact,
            options={"delay_ms": latency_ms, "jitter": jitter, **options},
        ),
        serve=ServeConfig(warmup=2, rtc=rtc),
    )


def jerks(log: EpisodeLog, period_s: float) -> list[float]:
    q = np.asarray(log.trajectory)
    if len(q) < 4:
        return []
    return list(np.abs(np.diff(q, n=3, axis=0)).max(axis=1) / period_s**3)


def summarize(logs: list[EpisodeLog], contract: Contract) -> dict:
    """One row's figures."""
    rate = min(j.rate_limit for j in contract.action.joints)
    period_s = contract.timing.control_period_ms / 1000
    seams = [s for log in logs for s in log.seam_steps()]
    jerk = [j for log in logs for j in jerks(log, period_s)]
    lat = [x for log in logs for x in log.latencies_ms]
    interventions: Counter[str] = Counter()
    for log in logs:
        interventions.update(log.interventions)
    by_instruction = {
        i: sum(log.success for log in logs if log.instruction == i)
        for i in dict.fromkeys(log.instruction for log in logs)
    }
    return {
        "episodes": len(logs),
        "success": sum(log.success for log in logs),
        "success_by_instruction": by_instruction,
        "failed": sorted([log.instruction, log.seed] for log in logs if not log.success),
        "idle_ticks": sum(log.held for log in logs),
        "first_plan_ms": round(float(np.mean([log.first_plan_ms for log in logs])), 1),
        "ticks": sum(len(log.commands) for log in logs),
        "seam_max_rad": round(max(seams, default=0.0), 4),
        "seam_p99_rad": round(float(np.percentile(seams, 99)) if seams else 0.0, 4),
        "seams": len(seams),
        "seams_over_rate_limit": sum(s > rate + 1e-4 for s in seams),
        "jerk_rms_rad_s3": round(float(np.sqrt(np.mean(np.square(jerk)))) if jerk else 0.0, 1),
        "interventions": dict(interventions),
        "latency_p50_ms": round(float(np.median(lat)), 1) if lat else None,
        "latency_p99_ms": round(float(np.percentile(lat, 99)), 1) if lat else None,
    }


def plan(episodes: int, seed: int) -> list[tuple[int, str]]:
    return [(seed + i, instruction) for instruction in sim.INSTRUCTIONS for i in range(episodes)]


def in_process(contract: Contract, seeds: list[tuple[int, str]], execute: int) -> dict:
    """The reference: the release in this process at zero latency, the waiting rule."""
    tokenizer = Tokenizer.from_contract(contract)
    session = get_backend("onnxruntime").load(DEMO / "policy.onnx", contract, {"intra_op_threads": 1})
    link = InProcessLink.for_contract(contract, contract_infer(contract, tokenizer, session))
    period_ns = int(contract.timing.control_period_ms * 1e6)
    try:
        with sim.ReacherTask(render=False) as task:
            logs = [
                run_episode(
                    task,
                    link,
                    seed,
                    instruction,
                    period_ns=period_ns,
                    exec_steps=execute,
                    chunk_length=contract.action.chunk_length,
                    label="in process",
                )
                for seed, instruction in seeds
            ]
    finally:
        session.close()
    return {"latency_ms": 0, "rule": "in process", "hog": False, **summarize(logs, contract)}


def through_vlad(
    contract: Contract, seeds: list[tuple[int, str]], latency_ms: float, rules: list[str], args, hog: bool
) -> list[dict]:
    """Every rule at one latency, one daemon per engine (rules sharing one share it)."""
    period_ns = int(contract.timing.control_period_ms * 1e6)
    rows = []
    for engine in dict.fromkeys(ENGINE[r] for r in rules):
        mine = [r for r in rules if ENGINE[r] == engine]
        with tempfile.TemporaryDirectory() as tmp:
            d = launch(
                daemon_config(Path(tmp), latency_ms, args.jitter, engine, contract), folder=Path(tmp), env=PLUGIN_ENV
            )
            try:
                client = d.client("bench")
                with sim.ReacherTask(render=False) as task:
                    task.reset(seeds[0][0], seeds[0][1])
                    for rule in mine:
                        link = DaemonLink(client, streams=rule != "wait")
                        logs = []
                        for k, (seed, instruction) in enumerate(seeds):
                            logs.append(
                                run_episode(
                                    task,
                                    link,
                                    seed,
                                    instruction,
                                    period_ns=period_ns,
                                    exec_steps=args.execute,
                                    chunk_length=contract.action.chunk_length,
                                    budget=WAIT_FRACTION,
                                    label=rule,
                                    wait=rule == "wait",
                                    follow=rule != "wait",
                                )
                            )
                            if (k + 1) % 20 == 0:
                                ok = sum(log.success for log in logs)
                                print(f"  {latency_ms:g} ms {rule}: {k + 1}/{len(seeds)} episodes, {ok} successes",
                                      file=sys.stderr)  # fmt: skip
                        st = client.status()
                        row = {"latency_ms": latency_ms, "rule": rule, "hog": hog, **summarize(logs, contract)}
                        row["daemon"] = {
                            "state": st["state"],
                            "fallbacks": d.log().count("-> FALLBACK"),
                            "heartbeat_lost": d.log().count("no heartbeat from"),
                            **{k: st["counters"].get(k, 0) for k in ("guided", "stale", "superseded", "expired")},
                        }
                        rows.append(row)
                client.close()
            finally:
                d.stop()
    return rows


COLUMNS = (
    "latency",
    "rule",
    "success",
    "vs in process: lost / gained",
    "idle ticks",
    "first plan after ms",
    "seam step max / p99 rad",
    "seams over the rate limit",
    "jerk RMS rad/s³",
    "guard changes",
    "latency p50 / p99 ms",
)


def _cells(r: dict, reference: dict) -> list[str]:
    by = " / ".join(str(v) for v in r["success_by_instruction"].values())
    failed, failed_ref = {tuple(f) for f in r["failed"]}, {tuple(f) for f in reference["failed"]}
    return [
        "–" if r["rule"] == "in process" else f"{r['latency_ms']:g} ms",
        r["rule"],
        f"{r['success']}/{r['episodes']} ({by})",
        "–" if r is reference else f"{len(failed - failed_ref)} / {len(failed_ref - failed)}",
        f"{r['idle_ticks']} of {r['ticks']}",
        f"{r['first_plan_ms']:.0f}",
        f"{r['seam_max_rad']:.3f} / {r['seam_p99_rad']:.3f}",
        f"{r['seams_over_rate_limit']} of {r['seams']}",
        f"{r['jerk_rms_rad_s3']:.0f}",
        ", ".join(f"{k} {v}" for k, v in sorted(r["interventions"].items())) or "none",
        "–" if r["latency_p50_ms"] is None else f"{r['latency_p50_ms']:.1f} / {r['latency_p99_ms']:.1f}",
    ]


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    reference = next(r for r in rows if r["rule"] == "in process")
    lines += ["| " + " | ".join(_cells(r, reference)) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=100, help="episodes per instruction, per row")
    ap.add_argument("--seed", type=int, default=10_000, help="first seed (unseen in training)")
    ap.add_argument("--latency", default="0,50,100,200", help="injected inference latencies, ms, comma-separated")
    ap.add_argument("--jitter", type=float, default=0.1, help="each inference's latency within ± this fraction")
    ap.add_argument("--rules", default=",".join(RULES), help="rules to run: rtc, async, wait")
    ap.add_argument("--execute", type=int, default=4, help="the waiting rule: waypoints executed per chunk")
    ap.add_argument("--hog", action="store_true", help="run every row again beside a process spinning one core")
    ap.add_argument("--ci", action="store_true", help="one episode per row, at 0 and 100 ms")
    ap.add_argument("--json", type=Path, help="also write the results as JSON")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table (for docs/benchmarks.md)")
    args = ap.parse_args(argv)
    if args.ci:
        args.episodes, args.latency = 1, "0,100"
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    unknown = set(rules) - set(RULES)
    if unknown:
        ap.error(f"--rules: unknown {sorted(unknown)} (known: {', '.join(RULES)})")
    latencies = [float(x) for x in args.latency.split(",") if x.strip()]
    contract = load_contract(DEMO / "contract.toml")
    seeds = plan(args.episodes, args.seed)
    t0 = time.monotonic()
    cond = {
        **shared_conditions("onnxruntime", "mujoco"),
        "period_ms": contract.timing.control_period_ms,
        "chunk": contract.action.chunk_length,
        "rate_limit_rad": min(j.rate_limit for j in contract.action.joints),
        "episodes_per_instruction": args.episodes,
        "seeds": f"{args.seed}..{args.seed + args.episodes - 1}",
        "jitter": args.jitter,
    }
    print(f"bench_async: in process, {len(seeds)} episodes", file=sys.stderr)
    rows = [in_process(contract, seeds, args.execute)]
    for hog in (False, True) if args.hog else (False,):
        with cpu_hog() if hog else contextlib.nullcontext():
            for latency in latencies:
                print(f"bench_async: {latency:g} ms{' beside a CPU hog' if hog else ''}", file=sys.stderr)
                rows += through_vlad(contract, seeds, latency, rules, args, hog)
    cond["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    cond["minutes"] = round((time.monotonic() - t0) / 60, 1)
    result = {"conditions": cond, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        for hog in (False, True) if args.hog else (False,):
            picked = [r for r in rows if r["hog"] == hog or r["rule"] == "in process"]
            print(("\nBeside a process spinning one core:\n\n" if hog else "") + markdown(picked))
        print(f"\nConditions: {json.dumps(cond)}")
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
