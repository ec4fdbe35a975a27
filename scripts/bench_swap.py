#!/usr/bin/env python3
"""Hot-swap time: how fast vlad moves from a faulting policy to its fallback.

Runs the daemon with the release on the fault-injecting wrapper backend
(:func:`vlad_tools.testing.write_fault_rig`) and a previous release (real ONNX Runtime) as
fallback, a controller at 50 Hz, and for each fault kind repeats: inject -> wait for the
swap -> fix -> ``resume`` -> wait for ACTIVE. Prints:

* switch: the swap itself (route to the already-warm fallback), from the event log;
* first command: swap decision -> first command published by the fallback policy;
* detection: fault injected -> swap decision (dominated by the monitor tick, 50 ms);
* max gap: the longest the controller went without a chunk during the episode.

    .venv/bin/python scripts/bench_swap.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from vlad_tools.testing import ControllerSim, launch, load_golden, max_gap, write_fault_rig


def wait(client, pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = client.status()
        if pred(st):
            return st
        time.sleep(0.01)
    raise SystemExit(
        f"bench_swap: timed out waiting; state {st['state']} serving {st['serving']}, "
        f"quarantined {st['quarantined']}, findings {[f['message'] for f in st['findings']]}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--modes", default="raise,nan,oob,hang", help="faults to inject, comma-separated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vlad-swap-") as tmp:
        rig = write_fault_rig(Path(tmp))
        d = launch(rig.config, folder=Path(tmp), env=rig.env)
        client = d.client()
        ctl = ControllerSim(client, load_golden()[0]).start()
        try:
            wait(client, lambda s: s["state"] == "ACTIVE")
            print(f"{'fault':<8} {'switch µs':>10} {'first command ms':>17} {'detection ms':>13} {'max gap ms':>11}")
            for mode in args.modes.split(","):
                rows = []
                for _ in range(args.repeats):
                    wait(client, lambda s: s["state"] == "ACTIVE" and s["serving"].startswith("release"))
                    time.sleep(0.3)
                    # status keeps the latest swaps only (a bounded list): wait for a new last one
                    last = (client.status()["swaps_ms"] or [None])[-1]
                    t0 = time.monotonic()
                    rig.control.write_text(mode)
                    st = wait(client, lambda s, last=last: bool(s["swaps_ms"]) and s["swaps_ms"][-1] != last)
                    detect_ms = (time.monotonic() - t0) * 1000  # upper bound: includes status polling
                    time.sleep(0.3)
                    gap = max_gap(ctl.since(t0)) * 1000
                    swap = next(e for e in reversed(client.control("events", limit=50)) if e["kind"] == "swap")
                    rows.append((swap["details"]["switch_us"], st["swaps_ms"][-1]["first_command_ms"], detect_ms, gap))
                    rig.control.write_text("ok")
                    client.control("resume", who="bench", why="measured")
                r = np.asarray(rows)
                print(
                    f"{mode:<8} " + " ".join(f"{np.median(r[:, i]):>8.2f} (max {r[:, i].max():.2f})" for i in range(4)),
                    flush=True,
                )
            print(
                f"{args.repeats} repeats each; controller at 50 Hz; fallback = previous release on onnxruntime CPU;"
                " monitor tick 50 ms; median (max)"
            )
        finally:
            ctl.stop()
            client.close()
            d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
