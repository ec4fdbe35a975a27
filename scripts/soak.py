#!/usr/bin/env python3
"""Soak: vlad serving at 50 Hz for a long time; does the daemon's memory grow?

Two phases, each a fresh ``vlad serve`` subprocess driven by a controller in this process
(observation + heartbeat every 20 ms, the newest chunk taken each period):

1. **RSS** (``--minutes``, default 30): the daemon's resident set size (psutil) sampled
   every ``--sample-s`` seconds; growth is judged after ``--warmup-s`` (allocators, caches
   and ONNX Runtime's arena settle first): growth from the end of warm-up to the end, the
   slope of a least-squares line in MiB/hour, and the maximum. Latency (sensor -> chunk in
   the controller), missed and hold chunks are reported too.
2. **Allocations** (``--trace-minutes``, default 3; 0 skips it): the daemon runs with
   ``VLAD_ALLOC_TRACE`` (vlad/serving/alloctrace.py): tracemalloc on, every serving cycle's
   retained and transient allocation measured, a baseline snapshot after the warm-up
   cycles and the growth of allocations made under the serving loop since then, reported
   every 30 s. tracemalloc slows the daemon: this phase's latencies are not comparable.

    .venv/bin/python scripts/soak.py [--minutes 30] [--trace-minutes 3] [--payload demo|synthetic] [--json]
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
from pathlib import Path

import numpy as np

from vlad.config import Config, LoggingConfig, ReleaseConfig, ServeConfig
from vlad_tools.testing import PERIOD_S, DaemonProcess, Ticker, launch
from vlad_tools.testing.releases import Payload, demo_payload, synthetic_payload


def start(payload: Payload, folder: Path, env: dict | None = None) -> DaemonProcess:
    """``vlad serve`` on the payload's signed release, in ``folder``."""
    config = Config(
        release=ReleaseConfig(path=str(payload.release), keys_dir=str(payload.keys_dir)),
        serve=ServeConfig(warmup=10),
        logging=LoggingConfig(journald="off"),
    )
    return launch(config, folder=folder, env=env)


def drive(d, payload, seconds: float, on_sample=None, sample_s: float = 5.0) -> dict:
    """50 Hz for ``seconds``; ``on_sample(t)`` every ``sample_s``. Returns latency figures."""
    client = d.client("soak")
    lat, missed, holds, seq = [], 0, 0, 0
    t_start = time.monotonic()
    ticker, next_sample = Ticker(PERIOD_S), t_start
    try:
        while True:
            now = time.monotonic()
            if now - t_start >= seconds:
                break
            if on_sample is not None and now >= next_sample:
                on_sample(now - t_start)
                next_sample += sample_s
            seq += 1
            t0 = time.monotonic_ns()
            client.publish_observation(
                payload.images, proprio=payload.proprio, instruction=payload.instruction, seq=seq, t_sensor_ns=t0
            )
            client.heartbeat()
            chunk = None
            deadline = ticker.next + PERIOD_S
            while time.monotonic() < deadline:
                c = client.recv_actions(timeout_ms=max(0, int((deadline - time.monotonic()) * 1000)), drop_stale=False)
                if c is None:
                    break
                if c.obs_seq == seq:
                    chunk = c
                    break
            if chunk is None:
                missed += 1
            elif chunk.is_hold:
                holds += 1
            else:
                lat.append((chunk.t_receive_ns - t0) / 1e6)
            ticker.wait()
        status = client.status()
        # What the daemon decided during the run (fallbacks, faults): a soak that ends in
        # FALLBACK must say why.
        try:
            events = [
                {k: e.get(k) for k in ("kind", "state_from", "state_to", "reason")}
                for e in client.control("events", limit=50)
                if e.get("kind") != "operator"
            ]
        except Exception as exc:  # a report without events beats no report
            events = [{"kind": "error", "reason": f"events unavailable: {exc}"}]
    finally:
        client.close()
    a = np.asarray(lat) if lat else np.asarray([np.nan])
    return {
        "observations": seq,
        "chunks": len(lat),
        "missed": missed,
        "holds": holds,
        "latency_ms": {
            "p50": round(float(np.percentile(a, 50)), 3),
            "p99": round(float(np.percentile(a, 99)), 3),
            "max": round(float(np.max(a)), 3),
        },
        "daemon": {
            "state": status.get("state"),
            "counters": status.get("counters"),
            "e2e_ms": status.get("latency_ms", {}).get("e2e"),
            "events": events,
        },
    }


def rss_phase(payload, folder: Path, minutes: float, warmup_s: float, sample_s: float) -> dict:
    import psutil

    d = start(payload, folder)
    proc = psutil.Process(d.proc.pid)
    samples: list[tuple[float, float]] = []

    def sample(t: float) -> None:
        samples.append((round(t, 1), proc.memory_info().rss / 2**20))

    try:
        lat = drive(d, payload, minutes * 60, sample, sample_s)
        sample(minutes * 60)
    finally:
        d.stop()
    t = np.asarray([s[0] for s in samples])
    rss = np.asarray([s[1] for s in samples])
    after = t >= warmup_s
    out = {
        "minutes": minutes,
        "warmup_s": warmup_s,
        "samples": len(samples),
        "rss_mib_start": round(float(rss[0]), 1),
        "rss_mib_end_of_warmup": None,
        "rss_mib_end": round(float(rss[-1]), 1),
        "rss_mib_max": round(float(rss.max()), 1),
        **lat,
    }
    if after.sum() >= 2:
        ta, ra = t[after], rss[after]
        slope = np.polyfit(ta, ra, 1)[0] * 3600
        out.update(
            rss_mib_end_of_warmup=round(float(ra[0]), 1),
            growth_after_warmup_mib=round(float(ra[-1] - ra[0]), 2),
            slope_mib_per_hour=round(float(slope), 2),
            rss_mib_range_after_warmup=[round(float(ra.min()), 1), round(float(ra.max()), 1)],
        )
    out["rss_series"] = samples[:: max(1, len(samples) // 60)]
    return out


def trace_phase(payload, folder: Path, minutes: float) -> dict:
    report = folder.parent / "alloc.jsonl"
    env = {"VLAD_ALLOC_TRACE": str(report), "VLAD_ALLOC_TRACE_EVERY": "1500", "VLAD_ALLOC_TRACE_WARMUP": "500"}
    d = start(payload, folder, env)
    try:
        lat = drive(d, payload, minutes * 60)
    finally:
        d.stop()
    lines = [json.loads(x) for x in report.read_text().splitlines()] if report.exists() else []
    return {"minutes": minutes, "reports": lines, "latency_under_tracemalloc": lat}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--trace-minutes", type=float, default=3.0)
    ap.add_argument("--warmup-s", type=float, default=60.0)
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--payload", choices=("demo", "synthetic"), default="demo")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import onnxruntime
    import psutil

    tmp = Path(tempfile.mkdtemp(prefix="vlad-soak-"))
    try:
        payload = demo_payload() if args.payload == "demo" else synthetic_payload(tmp / "synthetic")
        cond = {
            "utc_start": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "payload": payload.name,
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__,
            "psutil": psutil.__version__,
            "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        }
        result = {
            "conditions": cond,
            "rss": rss_phase(payload, tmp / "rss", args.minutes, args.warmup_s, args.sample_s),
        }
        if not args.json:
            print_rss(result["rss"])
        if args.trace_minutes > 0:
            result["allocations"] = trace_phase(payload, tmp / "trace", args.trace_minutes)
            if not args.json:
                print_trace(result["allocations"])
        cond["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        cond["utc_end"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"conditions: {json.dumps(cond)}")
    return 0


def print_rss(r: dict) -> None:
    print(
        f"RSS phase: {r['minutes']} min at 50 Hz, {r['observations']} observations, {r['chunks']} chunks, "
        f"{r['missed']} missed, {r['holds']} holds; latency p50 {r['latency_ms']['p50']} p99 {r['latency_ms']['p99']} "
        f"max {r['latency_ms']['max']} ms"
    )
    print(
        f"  RSS MiB: start {r['rss_mib_start']}, end of warm-up ({r['warmup_s']} s) {r['rss_mib_end_of_warmup']}, "
        f"end {r['rss_mib_end']}, max {r['rss_mib_max']}; growth after warm-up {r.get('growth_after_warmup_mib')} MiB, "
        f"slope {r.get('slope_mib_per_hour')} MiB/h, range after warm-up {r.get('rss_mib_range_after_warmup')}"
    )
    print(f"  daemon: state {r['daemon']['state']}, e2e {r['daemon']['e2e_ms']}", flush=True)
    for e in r["daemon"].get("events", []):
        print(f"  event {e['kind']}: {e.get('state_from')} -> {e.get('state_to')}: {e['reason']}", flush=True)


def print_trace(a: dict) -> None:
    print(f"Allocation phase: {a['minutes']} min under tracemalloc, {len(a['reports'])} reports")
    for line in a["reports"]:
        pc = line["per_cycle"]
        print(
            f"  cycles {line['cycles']}: per cycle retained mean {pc['retained_mean']} B (min {pc['retained_min']}, "
            f"max {pc['retained_max']}), transient p50 {pc['transient_p50']:.0f} p99 {pc['transient_p99']:.0f} "
            f"max {pc['transient_max']} B; traced {line['traced_bytes']} B; growth since baseline: all "
            f"{line.get('traced_growth_since_baseline')} B, under the serving loop "
            f"{line.get('serving_growth_since_baseline')} B"
        )
    if a["reports"] and a["reports"][-1].get("top_growth"):
        print("  top growth under the serving loop (last report):")
        for g in a["reports"][-1]["top_growth"]:
            print(f"    {g['size_diff']:+d} B ({g['count_diff']:+d} blocks) {g['where']}")
    lat = a["latency_under_tracemalloc"]
    print(
        f"  latency under tracemalloc p50 {lat['latency_ms']['p50']} p99 {lat['latency_ms']['p99']} ms, "
        f"{lat['chunks']} chunks, {lat['missed']} missed, {lat['holds']} holds; daemon state {lat['daemon']['state']}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
