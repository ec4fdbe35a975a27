#!/usr/bin/env python3
"""Remote inference benchmark: the kserve backend vs local ONNX Runtime, on loopback and
over an emulated Wi-Fi 6 / 5G link, beside the latency planner's prediction.

What it runs (all on 127.0.0.1, nothing leaves the machine):

1. local: the demo release on the ``onnxruntime`` backend, ``Session.infer`` time;
2. loopback: the same model served by ``python -m vlad_kserve.server`` (kserve
   ModelServer + ONNX Runtime, 1 thread), called through the ``kserve`` backend over gRPC
   and over HTTP: round trip (= the backend's ``compute_ms``), the server's own time
   (``server_ms``) and the rest (``network_ms``: both protocol stacks, both ways);
3. emulated links: gRPC through a delay proxy (TCP, in this process) that holds every
   chunk for the link's one-way latency plus its serialisation time at the link's rate,
   per direction (``tc netem`` is the better tool, but this kernel has no ``sch_netem``:
   the script says so when it finds it missing);
4. the planner: ``vlad_tools.planner.network_times`` for the same link and the bytes actually
   seen by the proxy per request, plus the loopback round trip (the stacks and the
   server), against the measured round trip.

    .venv/bin/python scripts/bench_remote.py [--calls 500] [--links wifi-6,5g] [--threads 1]
    .venv/bin/python scripts/bench_remote.py --ci      # 30 calls: a smoke run, seconds

Benchmarks print; they never assert timings.
"""

from __future__ import annotations

import argparse
import heapq
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from vlad_tools.testing import DEMO, load_golden
from vlad_tools.testing.conditions import conditions as shared_conditions

# ---------------------------------------------------------------------------------------
# A link emulator: one-way latency + serialisation at a rate, per direction
# ---------------------------------------------------------------------------------------


class _Pipe:
    """One direction: chunks leave after ``latency + bytes * 8 / rate`` (the link is busy
    while it serialises, so bursts queue up like on a real link)."""

    def __init__(
        self, src: socket.socket, dst: socket.socket, latency_s: float, mbps: float, counter: list[int]
    ) -> None:
        self.src, self.dst, self.latency_s, self.bps = src, dst, latency_s, mbps * 1e6
        self.counter = counter
        self.busy_until = 0.0
        self.queue: list[tuple[float, int, bytes]] = []
        self.cond = threading.Condition()
        self.closed = False
        self.seq = 0

    def reader(self) -> None:
        while True:
            try:
                data = self.src.recv(65536)
            except OSError:
                data = b""
            now = time.perf_counter()
            with self.cond:
                if not data:
                    self.closed = True
                    self.cond.notify()
                    return
                self.counter[0] += len(data)
                start = max(now, self.busy_until)
                self.busy_until = start + len(data) * 8 / self.bps
                self.seq += 1
                heapq.heappush(self.queue, (self.busy_until + self.latency_s, self.seq, data))
                self.cond.notify()

    def writer(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait()
                if not self.queue and self.closed:
                    break
                due, _, data = self.queue[0]
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            with self.cond:
                heapq.heappop(self.queue)
            try:
                self.dst.sendall(data)
            except OSError:
                break
        try:
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class LinkProxy:
    """A TCP proxy on 127.0.0.1 emulating a link to ``target_port`` (up = client -> server)."""

    def __init__(self, target_port: int, latency_ms: float, up_mbps: float, down_mbps: float) -> None:
        self.target_port = target_port
        self.latency_s = latency_ms / 1e3
        self.up_mbps, self.down_mbps = up_mbps, down_mbps
        self.up_bytes, self.down_bytes = [0], [0]
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for pipe in (
                _Pipe(client, server, self.latency_s, self.up_mbps, self.up_bytes),
                _Pipe(server, client, self.latency_s, self.down_mbps, self.down_bytes),
            ):
                threading.Thread(target=pipe.reader, daemon=True).start()
                threading.Thread(target=pipe.writer, daemon=True).start()

    def close(self) -> None:
        self.sock.close()


def netem_available() -> str:
    """Whether ``tc netem`` can run in a network namespace here (the reason when not)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return "needs root, ip and tc"
    ns = f"vlad-bench-{os.getpid()}"
    try:
        if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode:
            return "ip netns add failed"
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], capture_output=True)
        r = subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
            capture_output=True,
            text=True,
        )
        return "" if r.returncode == 0 else f"tc netem unavailable: {r.stderr.strip() or r.returncode}"
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# ---------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------


def start_server(threads: int):
    """The test server (:class:`vlad_kserve.testing.ServerProcess`) on free ports."""
    import tempfile

    from vlad_kserve.testing import ServerProcess

    server = ServerProcess(Path(tempfile.mkdtemp(prefix="vlad-bench-remote-")), DEMO, extra=["--threads", str(threads)])
    server.start()
    return server, server.grpc_port, server.http_port


def golden_inputs(contract) -> list[dict[str, np.ndarray]]:
    return [{s.name: case["inputs"][s.name] for s in contract.inputs} for case in load_golden()]


def measure(session, feeds, calls: int, warmup: int) -> dict[str, float]:
    for i in range(warmup):
        session.infer(feeds[i % len(feeds)])
    rtt, srv, net = [], [], []
    for i in range(calls):
        t0 = time.perf_counter()
        session.infer(feeds[i % len(feeds)])
        rtt.append((time.perf_counter() - t0) * 1e3)
        t = session.last_timing
        if t.server_ms is not None:
            srv.append(t.server_ms)
            net.append(t.network_ms)
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else float("nan")  # noqa: E731
    return {
        "p50": pct(rtt, 50),
        "p95": pct(rtt, 95),
        "p99": pct(rtt, 99),
        "max": max(rtt),
        "server_p50": pct(srv, 50),
        "network_p50": pct(net, 50),
        "network_p99": pct(net, 99),
    }


def conditions() -> list[str]:
    """The shared conditions (:func:`vlad_tools.testing.conditions.conditions`), as report lines."""
    c = shared_conditions("onnxruntime", "kserve", "tritonclient", "grpcio", "numpy")
    versions = ", ".join(f"{k} {v}" for k, v in c["packages"].items())
    return [
        f"{c['date']}; CPU: {c['cpu']}; {c['cpus']} logical cores; load average {c['load_avg']}",
        f"Python {c['python']}; kernel {c['kernel']}; {versions}",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--links", default="wifi-6,5g", help="planner network keys to emulate")
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads, local and on the server")
    ap.add_argument("--ci", action="store_true", help="a short smoke run (30 calls)")
    args = ap.parse_args(argv)
    if args.ci:
        args.calls, args.warmup = 30, 5

    from vlad.contract import load_contract
    from vlad.plugins import get_backend
    from vlad_tools.planner import load_network
    from vlad_tools.planner.network import Payload, network_times

    contract = load_contract(DEMO / "contract.toml")
    feeds = golden_inputs(contract)
    rows: list[tuple[str, dict[str, float], str]] = []

    local = get_backend("onnxruntime").load(
        DEMO / "policy.onnx", contract, {"intra_op_threads": args.threads, "inter_op_threads": 1}
    )
    rows.append(("local ONNX Runtime (in process)", measure(local, feeds, args.calls, args.warmup), ""))
    local.close()

    server, grpc_port, http_port = start_server(args.threads)
    kserve = get_backend("kserve")
    notes = []
    try:
        loop = {}
        for proto, port in (("grpc", grpc_port), ("http", http_port)):
            with kserve.load(
                DEMO / "policy.onnx", contract, {"endpoint": f"{proto}://127.0.0.1:{port}", "timeout_ms": 5000}
            ) as s:
                loop[proto] = measure(s, feeds, args.calls, args.warmup)
            rows.append((f"kserve {proto}, loopback", loop[proto], ""))
        why = netem_available()
        notes.append(
            "link emulation: tc netem in a network namespace"
            if not why
            else f"link emulation: Python delay proxy (tc netem not usable here: {why})"
        )
        for key in [k for k in args.links.split(",") if k]:
            net = load_network(key)
            proxy = LinkProxy(grpc_port, net.latency_ms, net.upload_mbps, net.download_mbps)
            try:
                with kserve.load(
                    DEMO / "policy.onnx", contract, {"endpoint": f"grpc://127.0.0.1:{proxy.port}", "timeout_ms": 5000}
                ) as s:
                    up0, down0 = proxy.up_bytes[0], proxy.down_bytes[0]
                    m = measure(s, feeds, args.calls, args.warmup)
                    n = args.calls + args.warmup
                    up_b, down_b = (proxy.up_bytes[0] - up0) / n, (proxy.down_bytes[0] - down0) / n
            finally:
                proxy.close()
            times = network_times([net], Payload(image_bytes=up_b, action_bytes=down_b))
            predicted = times.up_ms + times.down_ms + loop["grpc"]["p50"]
            rows.append(
                (
                    f"kserve grpc, emulated {net.name} ({net.latency_ms:g} ms one way, "
                    f"{net.upload_mbps:g}/{net.download_mbps:g} Mbit/s)",
                    m,
                    f"{predicted:.2f} (net {times.up_ms:.2f} up + {times.down_ms:.2f} down for "
                    f"{up_b / 1e3:.1f} kB / {down_b / 1e3:.2f} kB + loopback {loop['grpc']['p50']:.2f})",
                )
            )
    finally:
        server.stop()

    deadline = contract.timing.e2e_deadline_ms
    local_p50 = rows[0][1]["p50"]
    header = (
        "| path | p50 ms | p95 ms | p99 ms | max ms | server p50 ms | network p50 / p99 ms | over local p50 ms "
        "| planner round trip ms |"
    )
    print(
        f"# bench_remote: {args.calls} calls after {args.warmup} warm-up, golden inputs (batch 1), "
        f"contract deadline {deadline:g} ms\n"
    )
    print(header)
    print("|" + "---|" * 9)
    for name, m, planned in rows:
        net = f"{m['network_p50']:.2f} / {m['network_p99']:.2f}" if m["network_p50"] == m["network_p50"] else "-"
        srv = f"{m['server_p50']:.2f}" if m["server_p50"] == m["server_p50"] else "-"
        over = f"{m['p50'] - local_p50:+.2f}" if name != rows[0][0] else ""
        print(
            f"| {name} | {m['p50']:.2f} | {m['p95']:.2f} | {m['p99']:.2f} | {m['max']:.2f} | {srv} | {net} | {over} "
            f"| {planned or '-'} |"
        )
    print()
    for line in notes + conditions():
        print(f"- {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
