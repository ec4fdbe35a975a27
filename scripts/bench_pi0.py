#!/usr/bin/env python3
"""A π0-sized release on this machine: stage, verify, load, first chunk, memory, swap.

Opt-in (minutes to an hour at full size; figures in docs/benchmarks.md, "π0-sized
release"). Build the release first (``scripts/pi0_release.py``), then:

    .venv/bin/python scripts/bench_pi0.py stage RELEASE      # stage into a fresh store, then verify it again
    .venv/bin/python scripts/bench_pi0.py load RELEASE       # the backend alone: load time, memory, one inference
    .venv/bin/python scripts/bench_pi0.py serve RELEASE      # the daemon: READY, first chunk, then async execution
    .venv/bin/python scripts/bench_pi0.py swap SMALL LARGE   # deploy LARGE over SMALL under a budget: the gap

``serve`` drives the daemon like a robot at the contract's control period with
:class:`vlad.client.ChunkExecutor` (one request in flight, the planner's request
threshold) for ``--seconds``, counting the ticks that executed a policy waypoint and
those the daemon's hold commands covered, beside the planner's prediction for the
measured latency. ``swap`` serves SMALL with ``memory.host_budget_mb`` set so LARGE fits
only in its place and ``memory.swap = "fallback"``, deploys LARGE and reports how long
the robot got hold commands instead of a policy.

Every figure is printed with its conditions (CPU, load average, free memory); ``--json``
writes them to a file. Run one at a time, under ``nice``, with an address-space cap.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from vlad.client import ChunkExecutor
from vlad.config import Config, MemoryConfig, MonitorsConfig, ReleaseConfig, ServeConfig, StoreConfig
from vlad.contract import load_contract
from vlad_tools.pi0.release import INSTRUCTIONS
from vlad_tools.planner.execution import async_threshold, chunk_rate
from vlad_tools.testing import REPO, start_daemon
from vlad_tools.testing.conditions import conditions as shared_conditions

ROOT = REPO
KEYS = ROOT / "etc" / "vlad" / "keys.d"
GB = 1e9


def conditions() -> dict[str, Any]:
    return shared_conditions("torch", "onnxruntime", "tokenizers")


def _proc_memory(pid: int | str = "self") -> dict[str, int]:
    """Resident memory split (anonymous vs file-backed, i.e. memory-mapped files) and peak."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def release_bytes(release: Path) -> int:
    return sum(p.stat().st_size for p in release.iterdir() if p.is_file())


# -- stage and verify ------------------------------------------------------------------------


def cmd_stage(args: argparse.Namespace) -> dict[str, Any]:
    from vlad.release.signing import verify_release
    from vlad.release.store import ReleaseStore

    size = release_bytes(args.release)
    with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
        store = ReleaseStore(Path(tmp) / "store", KEYS)
        t0 = time.monotonic()
        rid = store.stage(args.release)
        staged = time.monotonic() - t0
        t0 = time.monotonic()
        verify_release(store.release_path(rid), KEYS)
        verified = time.monotonic() - t0
        t0 = time.monotonic()
        store.activate(rid, who="bench", why="stage benchmark (random weights, not gated)", force=True)
        activated = time.monotonic() - t0
    return {
        "release": rid,
        "bytes": size,
        "stage_s": round(staged, 2),
        "verify_s": round(verified, 2),
        "activate_s": round(activated, 2),
        "verify_gb_s": round(size / GB / verified, 2),
    }


# -- the backend alone -----------------------------------------------------------------------


def cmd_load(args: argparse.Namespace) -> dict[str, Any]:
    from vlad.backend import example_inputs
    from vlad.plugins import get_backend
    from vlad.release.manifest import load_manifest

    m = load_manifest(args.release)
    contract = load_contract(args.release / m.contract.path)
    options = {**m.backend.options, **dict(_option(o) for o in args.option)}
    before = _proc_memory()
    t0 = time.monotonic()
    session = get_backend(m.backend.name).load(args.release / m.backend.artifact, contract, options)
    loaded_s = time.monotonic() - t0
    after_load = _proc_memory()
    t0 = time.monotonic()
    session.infer(example_inputs(contract))
    first_s = time.monotonic() - t0
    after = _proc_memory()
    session.close()
    return {
        "release": m.id,
        "backend": m.backend.name,
        "options": options,
        "bytes": release_bytes(args.release),
        "load_s": round(loaded_s, 2),
        "first_inference_s": round(first_s, 2),
        "rss_after_load_gb": round((after_load["VmRSS"] - before["VmRSS"]) / GB, 2),
        "anon_after_load_gb": round((after_load["RssAnon"] - before["RssAnon"]) / GB, 2),
        "file_backed_after_load_gb": round((after_load["RssFile"] - before["RssFile"]) / GB, 2),
        "rss_after_inference_gb": round((after["VmRSS"] - before["VmRSS"]) / GB, 2),
        "anon_after_inference_gb": round((after["RssAnon"] - before["RssAnon"]) / GB, 2),
        "file_backed_after_inference_gb": round((after["RssFile"] - before["RssFile"]) / GB, 2),
        "peak_rss_gb": round(after["VmHWM"] / GB, 2),
        "manifest_memory": m.to_dict().get("memory"),
    }


def _option(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    return key, json.loads(value)


# -- the daemon: cold start, first chunk, asynchronous execution ---------------------------------


def _config(release: Path, warmup: int, memory: MemoryConfig | None = None, store: Path | None = None) -> Config:
    """The daemon for a release that computes for seconds to minutes per chunk."""
    return Config(
        release=ReleaseConfig(path=str(release), keys_dir=str(KEYS)),
        serve=ServeConfig(warmup=warmup, hang_timeout_s=600.0),  # one inference: a minute on a CPU
        monitors=MonitorsConfig(
            max_rss_mb=65536.0,
            artifact_check_interval_s=86400.0,  # re-hashing gigabytes every few seconds would be the benchmark
            sensor_stall_periods=1_000_000,  # the executor sends a frame only when it wants a chunk
            stale_fraction_fault=1.0,
            # A 3 B-parameter model computing on both of a 2-core machine's cores starves the
            # controller process for more than 5 periods now and then: liveness is not measured here.
            heartbeat_missing_periods=1_000_000,
        ),
        memory=memory or MemoryConfig(),
        store=StoreConfig(root=str(store)) if store is not None else StoreConfig(),
    )


def _frames(contract) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(0)
    images = {c.name: rng.integers(0, 255, (c.raw.height, c.raw.width, 3), dtype=np.uint8) for c in contract.cameras}
    return images, np.zeros(contract.proprio.dim, np.float32)


def cmd_serve(args: argparse.Namespace) -> dict[str, Any]:
    contract = load_contract(args.release / "contract.toml")
    images, state = _frames(contract)
    period_ns = int(contract.timing.control_period_ms * 1e6)
    with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
        cfg = _config(args.release.resolve(), args.warmup)
        t_start = time.monotonic()
        d = start_daemon(Path(tmp), config=cfg, wait_ready=False)
        try:
            d.notify.wait_for("READY", "1", timeout=args.timeout, proc=d.proc)
            ready_s = time.monotonic() - t_start
            client = d.client("bench-pi0")
            try:
                first = _first_chunk(client, images, state, args.timeout)
                first_s = time.monotonic() - t_start
                status = client.status()
                execution = _async_run(client, contract, images, state, period_ns, first, args.seconds)
                after = client.status()
                execution["daemon_counters"] = {
                    k: after["counters"].get(k) for k in ("observations", "published", "published_hold", "stale")
                }
                execution["daemon_policies"] = after.get("policies")
            finally:
                client.close()
            peak = _proc_memory(d.proc.pid)["VmHWM"]
        finally:
            d.stop()
    return {
        "ready_s": round(ready_s, 1),
        "first_chunk_s": round(first_s, 1),
        "first_chunk_latency_s": round(first / 1e3, 2),
        "warmup_inferences": args.warmup,
        "daemon_peak_rss_gb": round(peak / GB, 2),
        "status_memory": status["memory"],
        "async": execution,
    }


def _first_chunk(client, images, state, timeout: float) -> float:
    """One frame to the idle daemon; ms from its sensor time to its chunk.

    Sent again only until the daemon has taken it (its ``observations`` counter moved: a
    subscriber misses what is sent before its connection is up), not while the policy
    computes: a frame sent then would be the newest one when it finishes, and one fresher
    than ``max_observation_age`` would start another inference (seconds long here) that
    the asynchronous run would have to wait behind."""
    taken = client.status()["counters"]["observations"]
    deadline = time.monotonic() + timeout
    sent: dict[int, int] = {}
    resend_at = time.monotonic()
    while time.monotonic() < deadline:
        if resend_at is not None and time.monotonic() >= resend_at:
            if sent and client.status()["counters"]["observations"] > taken:
                resend_at = None  # taken: wait for its answer
            else:
                now = time.monotonic_ns()
                sent[client.publish_observation(images, state, INSTRUCTIONS[0], t_sensor_ns=now)] = now
                resend_at = time.monotonic() + 0.5
        client.heartbeat()
        chunk = client.recv_actions(timeout_ms=20)
        if chunk is not None and not chunk.is_hold and chunk.obs_seq in sent:
            return (chunk.t_receive_ns - sent[chunk.obs_seq]) / 1e6
    raise SystemExit(f"error: no policy chunk within {timeout:.0f} s")


def _async_run(client, contract, images, state, period_ns: int, latency_ms: float, seconds: float) -> dict[str, Any]:
    """A robot ticking at the control period with ChunkExecutor for ``seconds``."""
    period_ms = period_ns / 1e6
    chunk, validity = contract.action.chunk_length, contract.timing.action_validity_ms
    threshold = async_threshold(latency_ms, period_ms, chunk, 4, validity)
    # A request the daemon skipped (its frame went stale while another inference ran) is
    # sent again after two latencies.
    ex = ChunkExecutor(request_threshold=threshold, request_timeout_ns=int(2 * latency_ms * 1e6) + 1_000_000_000)
    ticks = policy = holds = idle = 0
    latencies: list[float] = []
    next_tick = time.monotonic_ns()
    end = next_tick + int(seconds * 1e9)
    while next_tick < end:
        while (c := client.recv_actions(timeout_ms=0)) is not None:
            if not c.is_hold:
                latencies.append((c.t_receive_ns - c.t_sensor_ns) / 1e6)
            ex.offer(c)
        command = ex.step()
        ticks += 1
        if command is None:
            idle += 1  # nothing valid: the robot keeps its last command
        elif ex.current is not None and ex.current.is_hold:
            holds += 1  # the daemon's hold posture (a bridge or a fallback)
        else:
            policy += 1
        if ex.should_request():
            ex.request_sent(client.publish_observation(images, state, INSTRUCTIONS[0]))
        client.heartbeat()
        next_tick += period_ns
        time.sleep(max(0.0, (next_tick - time.monotonic_ns()) / 1e9))
    measured = float(np.median(latencies)) if latencies else latency_ms
    predicted = chunk_rate(measured, period_ms, chunk, mode="async", threshold=threshold, validity_ms=validity)
    return {
        "seconds": seconds,
        "ticks": ticks,
        "policy_ticks": policy,
        "hold_ticks": holds,
        "idle_ticks": idle,
        "policy_hz": round(policy / seconds, 2),
        "chunks": len(latencies),
        "latency_p50_ms": round(measured, 1),
        "threshold": threshold,
        "planner": predicted.to_dict(),
    }


# -- the swap strategy -----------------------------------------------------------------------------


def cmd_swap(args: argparse.Namespace) -> dict[str, Any]:
    from vlad.release.manifest import load_manifest
    from vlad.release.store import ReleaseStore

    large = load_manifest(args.large)
    need = large.memory.host_bytes if large.memory else release_bytes(args.large)
    contract = load_contract(args.small / "contract.toml")
    images, state = _frames(contract)
    with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
        root = Path(tmp) / "store"
        store = ReleaseStore(root, KEYS)
        store.activate(
            store.stage(args.small), who="bench", why="swap benchmark (random weights, not gated)", force=True
        )
        budget_mb = -(-need // 2**20)  # LARGE fits alone, not beside anything that holds memory
        memory = MemoryConfig(host_budget_mb=float(budget_mb), swap="fallback")
        cfg = _config(root / "releases" / "active", args.warmup, memory, root)
        d = start_daemon(Path(tmp), config=cfg, wait_ready=False)
        seen: list[tuple[float, str]] = []
        stop = threading.Event()
        try:
            d.notify.wait_for("READY", "1", timeout=args.timeout, proc=d.proc)
            client = d.client("bench-swap")
            robot = threading.Thread(target=_robot, args=(d, images, state, contract, seen, stop), daemon=True)
            robot.start()
            time.sleep(2.0)
            t0 = time.monotonic()
            # A random-weight release has no gate evidence: forced, with the reason recorded.
            result = client.control(
                "deploy",
                timeout_ms=int(args.timeout * 1e3),
                path=str(args.large),
                who="bench",
                why="swap benchmark (random weights, not gated)",
                force=True,
            )
            deploy_s = time.monotonic() - t0
            time.sleep(1.0)
            stop.set()
            robot.join(10)
            events = [e for e in client.control("events", limit=50) if e["kind"] == "memory_swap"]
            status = client.status()
            client.close()
        finally:
            stop.set()
            d.stop()
    during = [(t, s) for t, s in seen if t >= t0]
    gaps = np.diff([t for t, _ in during]) if len(during) > 1 else np.array([0.0])
    return {
        "budget_mb": budget_mb,
        "need_bytes": need,
        "deploy_s": round(deploy_s, 1),
        "swap_gap_s": result.get("swap_gap_s"),
        "hold_commands": sum(1 for _, s in during if s.startswith("hold")),
        "policy_commands": sum(1 for _, s in during if not s.startswith("hold")),
        "longest_silence_ms": round(float(gaps.max()) * 1e3, 1),
        "events": [e["reason"] for e in events],
        "status_memory": status["memory"],
    }


def _robot(d, images, state, contract, seen, stop) -> None:
    """Frames and heartbeats every period; every command received, with its source."""
    client = d.client("bench-robot")
    period = contract.timing.control_period_ms / 1e3
    try:
        while not stop.is_set():
            client.publish_observation(images, state, INSTRUCTIONS[0])
            client.heartbeat()
            until = time.monotonic() + period
            while (left := until - time.monotonic()) > 0:
                c = client.recv_actions(timeout_ms=max(0, int(left * 1e3)))
                if c is not None:
                    seen.append((time.monotonic(), c.source))
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("stage", "load", "serve"):
        s = sub.add_parser(name)
        s.add_argument("release", type=Path)
        if name == "load":
            s.add_argument(
                "--option", action="append", default=[], help="KEY=JSON: a backend option over the manifest's"
            )
    s = sub.add_parser("swap")
    s.add_argument("small", type=Path)
    s.add_argument("large", type=Path)
    p.add_argument("--scratch", type=Path, default=ROOT / "runs", help="where the store copies go (GBs)")
    p.add_argument("--warmup", type=int, default=1, help="daemon warm-up inferences (default 1)")
    p.add_argument("--seconds", type=float, default=60.0, help="serve: seconds of asynchronous execution")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for READY / a chunk / a deploy")
    p.add_argument("--json", type=Path, help="append the figures to this file (JSON lines)")
    args = p.parse_args(argv)
    args.scratch.mkdir(parents=True, exist_ok=True)
    run = {"stage": cmd_stage, "load": cmd_load, "serve": cmd_serve, "swap": cmd_swap}[args.cmd]
    before = conditions()
    figures = run(args)
    out = {"command": args.cmd, "conditions": before, **figures}
    print(json.dumps(out, indent=2))
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps(out) + "\n")
    shutil.rmtree(args.scratch / "__pycache__", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
