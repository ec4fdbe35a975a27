#!/usr/bin/env python3
"""The recording tap under hostile and unlucky subscribers: what one recorder receives,
what the daemon's memory does, what its log says.

A fresh ``vlad serve`` (the demo release) driven by a simulated controller at 50 Hz
(observation + heartbeat each period, so about 150 tap messages/s with the chunks). A
reference recorder (SUB, subscribed to everything, reading as fast as it can) counts the
messages it gets per second, and the gaps in the tap's sequence numbers, while:

1. **leave**: another subscriber (topic ``status``) connects and leaves;
2. **stall**: another subscriber connects and never reads (receive queue 1 message);
3. **memory**: a fresh reference recorder; a producer floods the observation socket with
   multi-frame messages while a fresh stalled subscriber is attached, first 8 frames of
   9 KiB (54 KiB, within the largest legal observation of the demo contract, 77 KiB), then
   ``--frames`` frames of 64 KiB (larger); the daemon's resident set (``/proc/PID/status`` VmRSS)
   before and after each (the stalled subscriber still attached), and its peak (VmHWM);
4. **churn**: one subscriber toggles its subscription ``--toggles`` times; the daemon's
   log lines that mention the tap, during the toggles and in the whole run.

    .venv/bin/python scripts/bench_tap.py [--seconds 4] [--frames 16] [--flood 3000] [--toggles 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq

from vlad_tools.testing import ControllerSim, load_golden, start_daemon
from vlad_tools.testing.conditions import conditions


class Recorder:
    """A SUB on the tap counting what arrives (per second) and the sequence gaps."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 10_000)
        self.sock.connect(endpoint)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.arrivals: list[float] = []
        self.gaps = 0
        self._last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(50):
                continue
            frames = self.sock.recv_multipart()
            seq = int.from_bytes(frames[2], "little")
            if self._last and seq > self._last + 1:
                self.gaps += seq - self._last - 1
            self._last = max(self._last, seq)
            self.arrivals.append(time.monotonic())

    def rate(self, t0: float, t1: float) -> float:
        return sum(1 for t in list(self.arrivals) if t0 <= t < t1) / (t1 - t0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close(0)


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stalled(ctx: zmq.Context, endpoint: str, topic: bytes = b"") -> zmq.Socket:
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(endpoint)
    sock.setsockopt(zmq.SUBSCRIBE, topic)
    return sock


def flood(ctx: zmq.Context, endpoint: str, messages: int, frames: int, frame_bytes: int) -> float:
    """``messages`` observation messages of ``frames`` frames each (refused by the intake,
    offered to the tap first), paced at about 1000/s; returns the seconds it took."""
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 100_000)
    pub.connect(endpoint)
    time.sleep(0.3)  # the slow joiner: the daemon's SUB subscribes after the connect
    header = msgpack.packb({"v": 1, "kind": "obs", "seq": 1, "t_sensor_ns": 1})
    payload = [b"obs", header] + [bytes(frame_bytes)] * (frames - 2)
    t0 = time.monotonic()
    for i in range(messages):
        pub.send_multipart(payload, copy=False)
        if i % 10 == 9:
            time.sleep(0.01)  # paces the flood at about 1000 messages/s
    time.sleep(1.0)  # lets the daemon take what is still queued here before the socket closes
    pub.close(0)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each rate window")
    ap.add_argument("--frames", type=int, default=16, help="frames per flood message")
    ap.add_argument("--flood", type=int, default=3000, help="flood messages")
    ap.add_argument("--toggles", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    out: dict[str, Any] = {"conditions": conditions("pyzmq")}
    out["conditions"]["libzmq"] = zmq.zmq_version()
    ctx = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="vlad-bench-tap-") as tmp:
        d = start_daemon(Path(tmp), extra=["--set", "serve.warmup=3"])
        client = d.client()
        ctl = ControllerSim(client, load_golden()[0]).start()
        try:
            tap = client.status()["tap"]["endpoint"]
            ref = Recorder(ctx, tap)
            time.sleep(1.0)  # the subscription reaches the daemon, the stream settles
            w = args.seconds
            t = time.monotonic()
            time.sleep(w)  # the window measured
            out["alone"] = {"per_s": round(ref.rate(t, t + w), 1)}

            other = ctx.socket(zmq.SUB)
            other.connect(tap)
            other.setsockopt(zmq.SUBSCRIBE, b"status")
            time.sleep(0.5)  # its subscription reaches the daemon
            other.close(0)
            time.sleep(0.5)  # its departure reaches the daemon
            t = time.monotonic()
            time.sleep(w)  # the window measured
            out["leave"] = {"per_s": round(ref.rate(t, t + w), 1), "gaps": ref.gaps}

            # A fresh reference recorder: the previous one may have been cut off.
            ref.close()
            ref = Recorder(ctx, tap)
            time.sleep(1.0)  # its subscription reaches the daemon
            slow = stalled(ctx, tap)
            t = time.monotonic()
            time.sleep(3 * w)  # the window measured (long: the stalled queue fills first)
            per_s = [round(ref.rate(t + i, t + i + 1), 1) for i in range(int(3 * w))]
            out["stall"] = {"per_s_each_second": per_s, "gaps": ref.gaps}

            slow.close(0)
            ref.close()

            ref = Recorder(ctx, tap)
            for name, frame_bytes in (("memory_legal_size", 9 * 2**10), ("memory_oversized", 64 * 2**10)):
                # 9 KiB frames: 8 frames are 54 KiB, within the demo's 77 KiB; 64 KiB frames:
                # larger than any legal observation (16 frames: 1 MiB). A fresh stalled
                # subscriber each time, its queue in the daemon empty.
                frames = args.frames if frame_bytes > 32 * 2**10 else 8
                slow = stalled(ctx, tap)
                time.sleep(0.1)  # its subscription reaches the daemon (the stream fills its queue slowly)
                rss0, gaps0 = rss_mib(d.pid), ref.gaps
                dropped0 = client.status()["tap"]["dropped"]["observations"]
                took = flood(ctx, d.endpoints["observations"], args.flood, frames, frame_bytes)
                out[name] = {
                    "flood": f"{args.flood} messages x {frames} frames of {frame_bytes // 1024} KiB",
                    "flood_s": round(took, 1),
                    "rss_before_mib": round(rss0, 1),
                    "rss_after_mib": round(rss_mib(d.pid), 1),
                    "rss_peak_mib": round(rss_mib(d.pid, "VmHWM"), 1),
                    "tap_dropped_observations": client.status()["tap"]["dropped"]["observations"] - dropped0,
                    "reference_gaps": ref.gaps - gaps0,
                }
                slow.close(0)
            ref.close()

            lines0 = sum(1 for line in d.log().splitlines() if "tap" in line)
            toggler = ctx.socket(zmq.SUB)
            toggler.setsockopt(zmq.LINGER, 0)
            toggler.connect(tap)
            t0 = time.monotonic()
            for i in range(args.toggles):
                (toggler.subscribe if i % 2 == 0 else toggler.unsubscribe)(b"")
                time.sleep(0.01)  # paces the toggles at about 100/s
            toggler.close(0)
            time.sleep(1.0)  # the last toggles reach the daemon's log
            lines = sum(1 for line in d.log().splitlines() if "tap" in line)
            out["churn"] = {
                "toggles": args.toggles,
                "seconds": round(time.monotonic() - t0, 1),
                "log_lines_during_toggles": lines - lines0,
                "log_lines_whole_run": lines,
            }
        finally:
            ctl.stop()
            client.close()
            d.stop()
    ctx.term()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for key, value in out.items():
            print(f"{key}: {json.dumps(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
