#!/usr/bin/env python3
"""How fast a remote policy's link comes back, and how often a flapping server swaps it.

Against the hostile v2 HTTP server of the tests (``vlad_kserve.testing.HostileServer``: the
demo model on ONNX Runtime, answering in ~2 ms, or trickling its answer a byte every 8 ms
when told to), one ``kserve`` session on 127.0.0.1 with the options a release would use:

1. **return after one late request**: the server trickles one request (the link is lost),
   then answers properly again; measured: from "answers again" to the link "connected"
   (the prober's run of ``recover_after`` in-deadline answers, one every
   ``probe_interval_ms``). In the daemon one monitor tick (at most 50 ms at 20 Hz) follows.
2. **a flapping server**: every Nth inference late, requests at 50 Hz for ``--seconds``
   while the link is connected (the local fallback serves otherwise): link losses per
   minute, returns per minute and the share of periods the remote policy served, with the
   relapse rule (``recover_after`` doubled after a loss within 10 s of a recovery) and
   without it (``MAX_STREAK = recover_after``).

    .venv/bin/python scripts/bench_remote_recovery.py [--seconds 20] [--late-every 10]

Benchmarks print; they never assert timings.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from vlad_tools.testing import DEMO
from vlad_tools.testing.conditions import conditions


def session(endpoint: str, probe_ms: float, recover_after: int):
    from vlad.contract import load_contract
    from vlad_kserve import KServeBackend

    contract = load_contract(DEMO / "contract.toml")
    options = {"endpoint": endpoint, "probe_interval_ms": probe_ms, "recover_after": recover_after}
    return contract, KServeBackend().load(DEMO / "policy.onnx", contract, options)


def wait(pred, timeout: float = 10.0) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError
        time.sleep(0.0005)
    return time.monotonic() - t0


def return_after_one_late(server, args) -> list[float]:
    """A fresh session each time: no earlier loss counts as a relapse."""
    from vlad.backend import example_inputs
    from vlad.errors import RemoteUnavailable

    out = []
    for _ in range(args.repeats):
        contract, s = session(server.endpoint, args.probe_ms, args.recover_after)
        try:
            inputs = example_inputs(contract)
            server.mode = "trickle"
            try:
                s.infer(inputs, deadline_ns=time.monotonic_ns() + 20_000_000)
            except RemoteUnavailable:
                pass
            server.mode = "proxy"
            out.append(wait(lambda s=s: s.stats()["state"] == "connected"))
        finally:
            s.close()
    return out


def flapping(server, args, relapse: bool) -> dict[str, float]:
    from vlad.backend import example_inputs
    from vlad.errors import RemoteUnavailable
    from vlad_kserve import stats

    saved = stats.MAX_STREAK
    if not relapse:
        stats.MAX_STREAK = args.recover_after
    contract, s = session(server.endpoint, args.probe_ms, args.recover_after)
    inputs = example_inputs(contract)
    server.late_every = args.late_every
    remote = local = 0
    try:
        end, next_t = time.monotonic() + args.seconds, time.monotonic()
        while time.monotonic() < end:
            if s.stats()["state"] == "connected":
                try:
                    s.infer(inputs, deadline_ns=time.monotonic_ns() + 20_000_000)
                    remote += 1
                except RemoteUnavailable:
                    local += 1
            else:
                local += 1
            next_t += 0.02
            time.sleep(max(0.0, next_t - time.monotonic()))
        st = s.stats()
    finally:
        server.late_every = 0
        stats.MAX_STREAK = saved
        s.close()
    minutes = args.seconds / 60
    losses = st["errors"].get("timeout", 0)
    return {
        "losses_per_min": losses / minutes,
        "returns_per_min": st["reconnects"] / minutes,
        "remote_share": remote / max(1, remote + local),
        "needed_at_end": st["recovery"]["needed"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--late-every", type=int, default=10, help="flapping server: every Nth inference late")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--probe-ms", type=float, default=50.0)
    ap.add_argument("--recover-after", type=int, default=3)
    args = ap.parse_args(argv)
    from vlad_kserve.testing import HostileServer

    c = conditions("onnxruntime")
    print(
        f"conditions: {c['date']}, {c['host']}, {c['cpu']}, {c['cpus']} CPUs, load average {c['load_avg']}; "
        f"HTTP to 127.0.0.1, demo model (ONNX Runtime, 1 thread) answering in ~2 ms; "
        f"probe_interval_ms {args.probe_ms:g}, recover_after {args.recover_after}"
    )
    server = HostileServer(DEMO / "policy.onnx")
    try:
        back = np.asarray(return_after_one_late(server, args)) * 1e3
        print(
            f"return after one late request ({args.repeats}x, a fresh session each): "
            f"p50 {np.median(back):.0f} ms, max {back.max():.0f} ms (link connected; the daemon adds one monitor tick)"
        )
        for relapse in (True, False):
            r = flapping(server, args, relapse)
            print(
                f"every {args.late_every}th inference late, {args.seconds:g} s at 50 Hz, relapse rule "
                f"{'on ' if relapse else 'off'}: {r['losses_per_min']:.0f} losses/min, {r['returns_per_min']:.0f} "
                f"returns/min, remote served {r['remote_share']:.0%} of periods, streak needed at the end "
                f"{r['needed_at_end']}"
            )
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
