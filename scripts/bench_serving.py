#!/usr/bin/env python3
"""Serving overhead of the daemon: latency a controller sees minus the backend's compute.

Starts ``vlad serve`` on the demo release and a controller (vlad.client) in this process.
For each scenario it prints, over the chunks answering fresh observations:

* controller latency = receive time - sensor time (sensor -> action received);
* engine time = the chunk's own ``timings_ms.infer`` (backend compute for that cycle);
* serving overhead = controller latency - engine time (transport both ways, intake,
  preprocess, decode, guard, publish, thread hand-offs);

as p50/p95/p99/max, at 50 Hz and at the highest rate the demo policy sustains (lock-step:
the next observation goes out when the previous chunk arrived), quiet and with a second
process loading one CPU core plus debug logging on.

    .venv/bin/python scripts/bench_serving.py [--seconds 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import load_golden  # noqa: E402
from tests.daemon_harness import start_daemon  # noqa: E402


def conditions() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    gov = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    return {"cpu": cpu, "cores": os.cpu_count(), "governor": gov.read_text().strip() if gov.exists() else "n/a",
            "loadavg_before": os.getloadavg()[0], "python": platform.python_version()}


def pct(a) -> dict:
    a = np.asarray(a)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max()), "n": int(a.size)}


def run(client, case, rate_hz: float | None, seconds: float) -> dict:
    raw = case["raw"]
    lat, eng = [], []
    period = 1.0 / rate_hz if rate_hz else 0.0
    t_end = time.monotonic() + seconds
    next_t = time.monotonic()
    seq = 0
    while time.monotonic() < t_end:
        seq += 1
        client.publish_observation(dict(raw.images), proprio=raw.proprio, instruction=raw.instruction, seq=seq)
        wait_ms = int(max(period, 0.1) * 1000)
        chunk = client.recv_actions(timeout_ms=wait_ms)
        while chunk is not None and chunk.obs_seq != seq:
            chunk = client.recv_actions(timeout_ms=wait_ms)
        if chunk is not None and not chunk.is_hold:
            lat.append((chunk.t_receive_ns - chunk.t_sensor_ns) / 1e6)
            eng.append(chunk.timings_ms["engine"])
        if rate_hz:
            next_t += period
            time.sleep(max(0.0, next_t - time.monotonic()))
    lat, eng = np.asarray(lat), np.asarray(eng)
    return {"rate_hz": rate_hz or round(len(lat) / seconds, 1), "controller_ms": pct(lat), "engine_ms": pct(eng),
            "overhead_ms": pct(lat - eng)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    case = load_golden()[0]
    cond = conditions()
    results = []
    for loaded in (False, True):
        extra = ["--set", "logging.level=\"debug\""] if loaded else []
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if loaded else None
        with tempfile.TemporaryDirectory(prefix="vlad-bench-") as tmp:
            # A steady 50 Hz stream is what the daemon sees in the field; the sensor-stall
            # monitor stays on (the controller never stops sending).
            d = start_daemon(Path(tmp), extra=extra)
            client = d.client()
            try:
                run(client, case, 50, 1.0)  # warm-up + slow joiner
                for rate in (50, None):
                    r = run(client, case, rate, args.seconds)
                    r["scenario"] = ("CPU hog + debug logging" if loaded else "quiet") + (
                        ", 50 Hz" if rate else ", max rate (lock-step)")
                    results.append(r)
                    if not args.json:
                        o, c, e = r["overhead_ms"], r["controller_ms"], r["engine_ms"]
                        print(f"{r['scenario']:<44} {r['rate_hz']:>7.1f} Hz  controller p50 {c['p50']:.2f} p99 {c['p99']:.2f}"
                              f"  engine p50 {e['p50']:.2f} p99 {e['p99']:.2f}  overhead p50 {o['p50']:.3f}"
                              f" p95 {o['p95']:.3f} p99 {o['p99']:.3f} max {o['max']:.2f} ms  (n={o['n']})", flush=True)
            finally:
                client.close()
                d.stop()
                if hog:
                    hog.kill()
    cond["loadavg_after"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"conditions": cond, "results": results}, indent=2))
    else:
        print(f"conditions: {json.dumps(cond)}; backend onnxruntime CPU, 1 intra-op thread, batch 1, ipc sockets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
