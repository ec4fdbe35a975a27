#!/usr/bin/env python3
"""Serving overhead, side by side in one run: the two transports' floors, an openpi-style server, vlad.

Every server gets the same raw observation and runs the same ONNX model with the same ONNX
Runtime session settings (CPU, ``intra_op_num_threads = 1``, graph optimisation "all"):

* **floor**: a bare pyzmq PUB/SUB ping-pong between two processes over ipc: the raw
  observation's bytes out, an action-chunk-sized reply back, no decoding, no model. What
  ZeroMQ and two Python processes cost at the least.
* **ws-floor**: the same bytes both ways over a websocket instead: an asyncio ``websockets``
  server answering each message at once, driven by ``websockets``' own synchronous client
  (what openpi's client uses), with openpi's connection settings (no compression, no size
  limit). What a websocket and two Python processes cost at the least: the transport under
  the openpi-style server, as the floor is the one under vlad.
* **openpi-style**: openpi's websocket policy protocol (``serving/websocket_policy_server.py``:
  asyncio ``websockets`` server, msgpack-numpy, metadata frame first, ``server_timing``
  and ``policy_timing`` in every answer), re-implemented minimally here; its policy does
  the same preprocessing in numpy (``vlad.processing.preprocess``, the reference
  implementation, allocating per call as openpi's transforms do), one ``InferenceSession.run``
  and the same decoding. Driven by the real ``openpi_client.websocket_client_policy.WebsocketClientPolicy``.
* **vlad**: ``vlad serve`` on the release (signed) as a subprocess, driven by ``vlad.client``
  (observation + one heartbeat per period), three ways: ``vlad`` without the real-time
  knobs (``gc_freeze = false``, no pinning, no busy poll); ``vlad+rt`` with them
  (``cpu_affinity`` = the last usable CPU, ``gc_freeze``, and ``fifo_priority`` /
  ``mlockall`` when this machine permits them: probed first, a refusal is reported);
  ``vlad+rt+spin`` the same plus ``busy_poll_us``. With ``--baseline DIR``, ``vlad-baseline``
  is ``vlad`` with the daemon's code (vlad and its plugins) taken from the checkout DIR
  (``git worktree add DIR <commit>``): before and after a change, side by side in one run.

For each payload (the demo release; a synthetic release with two 224x224 RGB cameras,
generated and signed with a throwaway key into a temporary folder), load (quiet; a
second process spinning one core plus debug logging in the servers) and rate (50 Hz;
lock-step: the next observation as soon as the previous answer is in hand), it measures
per answered observation:

* round trip = answer decoded in the controller - just before the observation was encoded;
* engine = the model call alone: vlad's chunk ``timings_ms.engine``; openpi-style's
  ``policy_timing.infer_ms`` (around ``InferenceSession.run``); 0 for the floor;
* overhead = round trip - engine (encode, transport both ways, intake, preprocessing,
  decoding, guard, publishing, thread hand-offs);

and prints overhead p50/p95/p99/max, its ratio to the floor's and to the openpi-style
server's in the same condition, and vlad's own stage breakdown (preprocess, decode, guard).

    .venv/bin/python scripts/bench_serving.py [--seconds 20] [--lockstep-seconds 5] [--json]
    .venv/bin/python scripts/bench_serving.py --payloads demo --loads quiet --servers openpi-style vlad \
        vlad-baseline --baseline /tmp/vlad-base   # this checkout against another, one run
    .venv/bin/python scripts/bench_serving.py --short      # a smoke run (CI)

Figures are noisy on a shared machine: compare rows of one run only, with its conditions.
``--interleave 5`` starts every server of a condition at once and lets them take turns at
50 Hz in 5 s blocks, so that a drifting machine weighs on all of them alike (the idle
servers wait meanwhile; lock-step rows still run one server after the other).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from vlad.config import Config, LoggingConfig, RealtimeConfig, ReleaseConfig, ServeConfig
from vlad.tomlwrite import dumps
from vlad_tools.gates.conditions import busy_processes, cpu_hog
from vlad_tools.testing import DaemonFailed, Ticker, free_port, launch
from vlad_tools.testing.conditions import conditions as shared_conditions
from vlad_tools.testing.releases import Payload, demo_payload, synthetic_payload

SERVERS = ("floor", "ws-floor", "openpi-style", "vlad", "vlad-baseline", "vlad+rt", "vlad+rt+spin")
PAYLOADS = ("demo", "synthetic")
LOADS = ("quiet", "hog+debug")
RATES = ("50 Hz", "lock-step")
FIFO_PRIORITY = 10
BUSY_POLL_US = 1000
REPLY_HEADER = 320  # bytes standing in for vlad's action header in the floor's reply


# ---------------------------------------------------------------------------------------
# Conditions
# ---------------------------------------------------------------------------------------


def conditions() -> dict:
    """The shared conditions (:func:`vlad_tools.testing.conditions.conditions`) and this benchmark's own."""
    import zmq

    gov = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    return {
        **shared_conditions("numpy", "onnxruntime", "pyzmq", "msgpack", "websockets", "openpi-client"),
        "governor": gov.read_text().strip() if gov.exists() else "not readable",
        "libzmq": zmq.zmq_version(),
        "ort_session": "CPUExecutionProvider, intra_op_num_threads=1, graph_optimization_level=all, batch 1",
        "transport": "vlad and floor: ZeroMQ ipc; openpi-style and ws-floor: websocket on 127.0.0.1",
    }


def busy_neighbours() -> list[str]:
    """Other processes above 20 % CPU over 0.5 s (context for the figures)."""
    return busy_processes(sample_s=0.5, threshold=20.0)


def probe_rt() -> dict:
    """Can this process use SCHED_FIFO and mlockall? Probed in a child, never here."""
    code = (
        "import os,ctypes,ctypes.util\n"
        "r=[]\n"
        "try:\n os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(PRIO)); r.append('ok')\n"
        "except OSError as e: r.append(str(e))\n"
        "lc=ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)\n"
        "r.append('ok' if lc.mlockall(3)==0 else os.strerror(ctypes.get_errno()))\n"
        "print('|'.join(r))\n"
    ).replace("PRIO", str(FIFO_PRIORITY))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30).stdout.strip()
    fifo, _, mlock = out.partition("|")
    return {"fifo_priority": fifo or "probe failed", "mlockall": mlock or "probe failed"}


# ---------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------


def pct(values) -> dict:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {"p50": math.nan, "p95": math.nan, "p99": math.nan, "max": math.nan, "n": 0}
    p50, p95, p99 = np.percentile(a, (50, 95, 99))
    return {
        "p50": round(float(p50), 4),
        "p95": round(float(p95), 4),
        "p99": round(float(p99), 4),
        "max": round(float(a.max()), 4),
        "n": int(a.size),
    }


class Samples:
    def __init__(self) -> None:
        self.rtt: list[float] = []
        self.engine: list[float] = []
        self.stages: dict[str, list[float]] = {}
        self.missed = 0

    def add(self, rtt_ms: float, engine_ms: float, stages: dict[str, float] | None = None) -> None:
        self.rtt.append(rtt_ms)
        self.engine.append(engine_ms)
        for k, v in (stages or {}).items():
            self.stages.setdefault(k, []).append(v)


def drive(step, rate_hz: float | None, seconds: float, samples: Samples | None) -> None:
    """Call ``step(samples)`` at ``rate_hz`` (None: back to back) for ``seconds``."""
    ticker = Ticker(1.0 / rate_hz) if rate_hz else None
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        step(samples)
        if ticker is not None:
            ticker.wait()


# ---------------------------------------------------------------------------------------
# The floor: bare pyzmq PUB/SUB ping-pong
# ---------------------------------------------------------------------------------------


def floor_frames(payload: Payload) -> list[bytes]:
    """The payload's observation as vlad's own wire frames, encoded once: what both floors send."""
    from vlad import protocol

    tensors = {f"image/{k}": v for k, v in payload.images.items()}
    tensors["proprio"] = payload.proprio
    header = {"seq": 1, "t_sensor_ns": 1, "instruction": payload.instruction or "", "client": "bench"}
    return protocol.encode(protocol.TOPIC_OBS, header, tensors)


def floor_server(obs_ep: str, act_ep: str, reply_bytes: int) -> None:
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(obs_ep)
    pub = ctx.socket(zmq.PUB)
    pub.bind(act_ep)
    reply = [b"act", b"h" * REPLY_HEADER, b"\0" * reply_bytes]
    print("READY", flush=True)
    while True:
        sub.recv_multipart(copy=False)
        pub.send_multipart(reply)


class FloorClient:
    def __init__(self, payload: Payload, folder: Path) -> None:
        self.obs_ep, self.act_ep = f"ipc://{folder}/floor-obs", f"ipc://{folder}/floor-act"
        reply = int(np.prod(payload.action_shape)) * 4
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--_floor-server", self.obs_ep, self.act_ep, str(reply)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.payload = payload

    def connect(self) -> None:
        import zmq

        if self.proc.stdout.readline().strip() != "READY":
            raise RuntimeError("floor server did not start")
        self.frames = floor_frames(self.payload)
        self.copy = sum(len(f) for f in self.frames) < 65536
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)  # default HWM: with 4, lock-step loses messages (HWM accounting lag)
        self.pub.connect(self.obs_ep)
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"act")
        self.sub.connect(self.act_ep)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # slow joiner: until a reply comes back
            self.pub.send_multipart(self.frames)
            if self.sub.poll(50):
                self.sub.recv_multipart()
                break
        while self.sub.poll(20):
            self.sub.recv_multipart()

    def step(self, s: Samples | None) -> None:
        t0 = time.perf_counter_ns()
        self.pub.send_multipart(self.frames, copy=self.copy)
        if not self.sub.poll(1000):
            if s is not None:
                s.missed += 1
            return
        self.sub.recv_multipart()
        if s is not None:
            s.add((time.perf_counter_ns() - t0) / 1e6, 0.0)

    def close(self) -> None:
        if hasattr(self, "ctx"):
            self.pub.close(0)
            self.sub.close(0)
            self.ctx.term()
        self.proc.kill()
        self.proc.wait()


# ---------------------------------------------------------------------------------------
# The websocket floor: the same bytes over a websocket (what openpi's protocol rides on)
# ---------------------------------------------------------------------------------------


def ws_floor_server(port: int, reply_bytes: int) -> None:
    import websockets.asyncio.server as _server

    reply = b"h" * REPLY_HEADER + b"\0" * reply_bytes

    async def handler(websocket):
        async for _ in websocket:
            await websocket.send(reply)

    async def run():
        async with _server.serve(handler, "127.0.0.1", port, compression=None, max_size=None) as server:
            print("READY", flush=True)
            await server.serve_forever()

    asyncio.run(run())


class WsFloorClient:
    def __init__(self, payload: Payload, folder: Path) -> None:
        self.port = free_port()
        reply = int(np.prod(payload.action_shape)) * 4
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--_ws-floor-server", str(self.port), str(reply)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.payload = payload

    def connect(self) -> None:
        from websockets.sync.client import connect

        if self.proc.stdout.readline().strip() != "READY":
            raise RuntimeError("websocket floor server did not start")
        self.message = b"".join(floor_frames(self.payload))  # the ZeroMQ floor's bytes, in one message
        self.stack = contextlib.ExitStack()  # websockets wants its connection entered, not only opened
        self.ws = self.stack.enter_context(
            connect(f"ws://127.0.0.1:{self.port}", compression=None, max_size=None, open_timeout=10)
        )

    def step(self, s: Samples | None) -> None:
        t0 = time.perf_counter_ns()
        self.ws.send(self.message)
        try:
            self.ws.recv(timeout=1.0)
        except TimeoutError:
            if s is not None:
                s.missed += 1
            return
        if s is not None:
            s.add((time.perf_counter_ns() - t0) / 1e6, 0.0)

    def close(self) -> None:
        if hasattr(self, "stack"):
            with contextlib.suppress(Exception):
                self.stack.close()
        self.proc.kill()
        self.proc.wait()


# ---------------------------------------------------------------------------------------
# openpi-style: openpi's websocket policy server protocol, minimal, in numpy + ORT
# ---------------------------------------------------------------------------------------


class OrtPolicy:
    """openpi's ``Policy.infer`` shape: copy the inputs, input transforms (numpy), the model
    call timed alone (``policy_timing.infer_ms``), output transforms."""

    def __init__(self, release: Path) -> None:
        import onnxruntime as ort

        from vlad.contract import load_contract
        from vlad.processing import Tokenizer

        self.contract = load_contract(release / "contract.toml")
        self.tokenizer = Tokenizer.from_contract(self.contract) if self.contract.language else None
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = 1  # the release manifest's options, as the vlad backend applies them
        self.sess = ort.InferenceSession(str(release / "policy.onnx"), so, providers=["CPUExecutionProvider"])
        self.cameras = [c.name for c in self.contract.cameras]

    def infer(self, obs: dict) -> dict:
        from vlad.processing import RawObservation, decode_actions, preprocess

        obs = dict(obs)  # openpi: jax.tree.map(lambda x: x, obs)
        raw = RawObservation(
            images={c: obs[f"observation/image/{c}"] for c in self.cameras},
            proprio=np.asarray(obs["observation/state"]),
            instruction=obs.get("prompt"),
            sequence=int(obs.get("seq", 0)),
        )
        inputs = preprocess(self.contract, self.tokenizer, raw)
        t = time.monotonic()
        outs = self.sess.run(None, inputs)
        model_ms = (time.monotonic() - t) * 1000
        actions = decode_actions(self.contract, dict(zip([o.name for o in self.sess.get_outputs()], outs, strict=True)))
        return {"state": raw.proprio, "actions": actions, "policy_timing": {"infer_ms": model_ms}}


def openpi_server(port: int, release: str, debug: bool) -> None:
    """``openpi.serving.websocket_policy_server.WebsocketPolicyServer``, the same handler."""
    import http

    import websockets.asyncio.server as _server
    import websockets.frames
    from openpi_client import msgpack_numpy

    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, stream=sys.stderr)
    logger = logging.getLogger("openpi-style")
    logging.getLogger("websockets.server").setLevel(logging.INFO)  # as openpi does
    policy = OrtPolicy(Path(release))
    example = bench_inputs_for(policy)
    for _ in range(10):
        policy.infer(example)
    metadata = {"model": policy.contract.model.id}

    async def handler(websocket):
        logger.info("Connection from %s opened", websocket.remote_address)
        packer = msgpack_numpy.Packer()
        await websocket.send(packer.pack(metadata))
        prev_total_time = None
        while True:
            try:
                start_time = time.monotonic()
                obs = msgpack_numpy.unpackb(await websocket.recv())
                logger.debug("observation %s", obs.get("seq"))
                infer_time = time.monotonic()
                action = policy.infer(obs)
                infer_time = time.monotonic() - infer_time
                action["server_timing"] = {"infer_ms": infer_time * 1000}
                if prev_total_time is not None:
                    action["server_timing"]["prev_total_ms"] = prev_total_time * 1000
                await websocket.send(packer.pack(action))
                prev_total_time = time.monotonic() - start_time
            except websockets.ConnectionClosed:
                logger.info("Connection from %s closed", websocket.remote_address)
                break
            except Exception:
                await websocket.send(traceback.format_exc())
                await websocket.close(code=websockets.frames.CloseCode.INTERNAL_ERROR, reason="Internal server error")
                raise

    def health_check(connection, request):
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        return None

    async def run():
        async with _server.serve(
            handler, "127.0.0.1", port, compression=None, max_size=None, process_request=health_check
        ) as server:
            print("READY", flush=True)
            await server.serve_forever()

    asyncio.run(run())


def bench_inputs_for(policy: OrtPolicy) -> dict:
    c = policy.contract
    obs = {f"observation/image/{cam.name}": np.zeros((cam.raw.height, cam.raw.width, 3), np.uint8) for cam in c.cameras}
    obs["observation/state"] = np.zeros(c.proprio.dim if c.proprio else 0, np.float32)
    if c.language:
        obs["prompt"] = "reach the red target"
    return obs


class OpenpiClient:
    def __init__(self, payload: Payload, folder: Path, debug: bool) -> None:
        port = free_port()
        self.log = open(folder / "openpi-style.log", "wb")  # like vlad's: a file  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--_openpi-server", str(port), str(payload.release)]
            + (["--_debug"] if debug else []),
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.port, self.payload = port, payload

    def connect(self) -> None:
        from openpi_client.websocket_client_policy import WebsocketClientPolicy

        payload, port = self.payload, self.port
        line = self.proc.stdout.readline().strip()
        if line != "READY":
            raise RuntimeError(f"openpi-style server did not start (got {line!r})")
        self.policy = WebsocketClientPolicy(host="127.0.0.1", port=port)
        self.obs = {f"observation/image/{k}": v for k, v in payload.images.items()}
        self.obs["observation/state"] = payload.proprio
        if payload.instruction is not None:
            self.obs["prompt"] = payload.instruction
        self.seq = 0

    def step(self, s: Samples | None) -> None:
        self.seq += 1
        self.obs["seq"] = self.seq
        t0 = time.perf_counter_ns()
        out = self.policy.infer(self.obs)
        rtt = (time.perf_counter_ns() - t0) / 1e6
        assert out["actions"].shape, "no actions"
        if s is not None:
            s.add(rtt, out["policy_timing"]["infer_ms"], {"server_infer": out["server_timing"]["infer_ms"]})

    def close(self) -> None:
        if hasattr(self, "policy"):
            with contextlib.suppress(Exception):
                self.policy._ws.close()
        self.proc.kill()
        self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------------------------------
# vlad
# ---------------------------------------------------------------------------------------


def vlad_config(payload: Payload, debug: bool, rt: dict | None, warmup: int) -> Config:
    """The daemon on the payload's signed release; ``rt``: the real-time knobs (None: none,
    and no gc freeze either)."""
    knobs = RealtimeConfig(gc_freeze=False) if rt is None else RealtimeConfig(**_realtime(rt))
    return Config(
        release=ReleaseConfig(path=str(payload.release), keys_dir=str(payload.keys_dir)),
        serve=ServeConfig(warmup=warmup),
        logging=LoggingConfig(level="debug" if debug else "info", journald="off"),
        realtime=knobs,
    )


def _realtime(rt: dict) -> dict:
    return {k: tuple(v) if k == "cpu_affinity" else v for k, v in rt.items()}


def without_defaults(section) -> dict:
    """A config section as a mapping of the fields set away from their defaults (derived fields
    left out): what the baseline's daemon reads the same way even where this checkout added a
    key, while a default changed since then stays the baseline's own."""
    out = {}
    for f in dataclasses.fields(section):
        if not f.init:
            continue
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            if sub := without_defaults(value):
                out[f.name] = sub
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        if value != default and value is not None:
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def code_from(tree: Path) -> dict[str, str]:
    """The environment that makes ``vlad serve`` import vlad and its plugins from the checkout
    ``tree`` (ahead of this one's editable install)."""
    paths = [tree, *sorted(p for p in (tree / "plugins").iterdir() if p.is_dir())]
    return {"PYTHONPATH": os.pathsep.join(str(p) for p in paths)}


class VladClient:
    def __init__(
        self,
        payload: Payload,
        folder: Path,
        debug: bool,
        rt: dict | None,
        warmup: int,
        tree: Path | None = None,
    ) -> None:
        cfg = vlad_config(payload, debug, rt, warmup)
        env = None
        if tree is not None:
            env = code_from(tree)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "baseline.toml").write_text(dumps(without_defaults(cfg)))
            cfg = folder / "baseline.toml"
        self.daemon = launch(cfg, folder=folder, wait_ready=False, env=env)
        self.payload = payload

    def connect(self) -> None:
        d = self.daemon
        try:
            d.wait_ready(90)
        except DaemonFailed:
            d.stop()
            raise RuntimeError(f"vlad never became ready; log:\n{d.log()}") from None
        self.client = self.daemon.client("bench")
        self.seq = 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # slow joiner
            self.step(None)
            if self.seq > 5 and self._last_ok:
                break

    def step(self, s: Samples | None) -> None:
        self.seq += 1
        c, p = self.client, self.payload
        t0 = time.monotonic_ns()
        c.publish_observation(p.images, proprio=p.proprio, instruction=p.instruction, seq=self.seq, t_sensor_ns=t0)
        # The answer to this observation, within 1 s. Hold chunks for older observations
        # (the daemon bridging a silent controller) keep coming: never wait past the deadline.
        deadline = t0 + 1_000_000_000
        chunk = None
        while True:
            left_ms = (deadline - time.monotonic_ns()) // 1_000_000
            if left_ms <= 0:
                break
            chunk = c.recv_actions(timeout_ms=int(left_ms), drop_stale=False)
            # recv_actions keeps the newest chunk: a bridge hold arriving just after the
            # answer hides it. A hold ends the wait too (counted as missed, never timed).
            if chunk is None or chunk.obs_seq >= self.seq or chunk.is_hold:
                break
            chunk = None
        t1 = time.monotonic_ns()
        c.heartbeat()  # a real controller's heartbeat, outside the timed span
        self._last_ok = chunk is not None and not chunk.is_hold
        if s is None:
            return
        if chunk is None or chunk.is_hold or chunk.obs_seq != self.seq:
            s.missed += 1
            return
        tm = chunk.timings_ms
        stages = {k: tm[k] for k in ("transport", "queue", "preprocess", "decode", "guard") if k in tm}
        stages["pre+decode+guard"] = tm["preprocess"] + tm["decode"] + tm["guard"]
        stages["issue->controller"] = (t1 - chunk.t_issue_ns) / 1e6
        s.add((t1 - t0) / 1e6, tm["engine"], stages)

    def close(self) -> None:
        if hasattr(self, "client"):
            self.client.close()
        self.daemon.stop()


# ---------------------------------------------------------------------------------------
# vlad's per-stage costs in a hot loop, in this process (no daemon, no waiting)
# ---------------------------------------------------------------------------------------


COLD_GAP_S = 0.018  # asleep before each cold call: a 50 Hz period less a short cycle
EVICT_BYTES = 8 << 20  # touched before each cold call: more than a core's L2 and its share of L3


def stage_costs(payload: Payload, calls: int, cold_calls: int) -> tuple[dict, dict]:
    """p50/p99 microseconds of each vlad stage, and of openpi's client encoding and decoding
    (when openpi-client is installed), called in one process: (hot, cold).

    Hot: back to back on warm caches, what the code costs when nothing evicts it. Cold: the
    stages in turn, each call after ``COLD_GAP_S`` asleep with ``EVICT_BYTES`` of other
    memory touched meanwhile, as a 50 Hz cycle finds its caches (the daemon and a
    controller sleep ~20 ms between cycles while other processes run)."""
    import zmq

    from vlad import protocol
    from vlad.client import Client
    from vlad.config import GuardConfig
    from vlad.contract import load_contract
    from vlad.processing import ActionDecoder, Preprocessor, Tokenizer
    from vlad.serving.counters import IntakeCounts
    from vlad.serving.guard import ActionGuard, TrustedState
    from vlad.serving.intake import Intake

    c = load_contract(payload.release / "contract.toml")
    pre = Preprocessor(c, Tokenizer.from_contract(c) if c.language else None)
    dec = ActionDecoder(c)
    trusted = TrustedState(c, GuardConfig())
    guard = ActionGuard(c, trusted)
    intake = Intake(c, IntakeCounts(), trusted, 5_000_000)
    tensors = {f"image/{k}": v for k, v in payload.images.items()}
    tensors["proprio"] = payload.proprio
    # the layout vlad.client learns on its first observation and encodes every later one with
    obs_layout = protocol.Layout([(n, a.dtype.name, a.shape) for n, a in tensors.items()])

    def obs_frames():
        h = {"seq": 1, "t_sensor_ns": time.monotonic_ns(), "client": "bench"}
        if payload.instruction is not None:
            h["instruction"] = payload.instruction
        return obs_layout.encode(protocol.TOPIC_OBS, h, list(tensors.values()))

    frames = [zmq.Frame(f) for f in obs_frames()]
    obs = intake.accept(frames, time.monotonic_ns())
    y = {c.action.output: np.zeros((1, *payload.action_shape), np.float32)}
    chunk = protocol.ActionChunk(
        seq=1, obs_seq=1, t_sensor_ns=1, t_issue_ns=2, valid_until_ns=3, period_ns=4, release="bench@1",
        state="ACTIVE", source="release", interventions=(), actions=dec.decode(y), client="bench",
        timings_ms=dict.fromkeys(("transport", "queue", "preprocess", "engine", "decode", "guard"), 0.1234),
        policy="release:bench@1",
    )  # fmt: skip
    header = chunk.header()
    act_layout = protocol.Layout([("actions", "float32", payload.action_shape)])  # as the publisher encodes
    act = [bytes(f) for f in protocol.encode(protocol.TOPIC_ACTIONS, header, {"actions": chunk.actions})]
    # the controller's side as vlad.client runs it: the chunk layout learned from the first chunk
    controller = Client(observations="inproc://bench-obs", actions="inproc://bench-act", name="bench")
    Client._decode_actions(act, controller)
    stages = {
        "client encode": obs_frames,
        "intake (decode + checks)": lambda: intake.accept(frames, time.monotonic_ns()),
        "preprocess": lambda: pre.fill(obs),
        "decode": lambda: dec.decode(y),
        "guard": lambda: guard.check(dec.decode(y), time.monotonic_ns(), time.monotonic_ns() + 10**9),
        "action encode": lambda: act_layout.encode(protocol.TOPIC_ACTIONS, header, (dec.out,)),
        "client decode": lambda: Client._decode_actions(act, controller),
    }
    try:
        from openpi_client import msgpack_numpy
    except ImportError:
        pass
    else:  # what OpenpiClient sends and openpi_server answers, packed and unpacked as they do
        packer = msgpack_numpy.Packer()
        request = {f"observation/image/{k}": v for k, v in payload.images.items()}
        request["observation/state"] = payload.proprio
        if payload.instruction is not None:
            request["prompt"] = payload.instruction
        answer = packer.pack(
            {
                "state": payload.proprio,
                "actions": chunk.actions,
                "policy_timing": {"infer_ms": 1.0},
                "server_timing": {"infer_ms": 1.0, "prev_total_ms": 2.0},
            }
        )
        stages["openpi client encode"] = lambda: packer.pack({**request, "seq": 1})
        stages["openpi client decode"] = lambda: msgpack_numpy.unpackb(answer)

    def us(ts) -> dict:
        return {
            "p50_us": round(float(np.percentile(ts, 50)) / 1e3, 1),
            "p99_us": round(float(np.percentile(ts, 99)) / 1e3, 1),
        }

    hot = {}
    for name, fn in stages.items():
        for _ in range(max(10, calls // 10)):
            fn()
        ts = np.empty(calls)
        for i in range(calls):
            t0 = time.perf_counter_ns()
            fn()
            ts[i] = time.perf_counter_ns() - t0
        hot[name] = us(ts)
    other = np.zeros(EVICT_BYTES, np.uint8)
    cold_ts = {name: np.empty(cold_calls) for name in stages}
    for i in range(cold_calls):
        for name, fn in stages.items():
            time.sleep(COLD_GAP_S)
            other += 1
            t0 = time.perf_counter_ns()
            fn()
            cold_ts[name][i] = time.perf_counter_ns() - t0
    controller.close(bye=False)
    return hot, {name: us(ts) for name, ts in cold_ts.items()}


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


def make_client(
    server: str, payload: Payload, folder: Path, loaded: bool, rt: dict, warmup: int, baseline: Path | None = None
):
    """Launch the server (not waiting for it: ``connect()`` does)."""
    folder.mkdir()
    if server == "floor":
        return FloorClient(payload, folder)
    if server == "ws-floor":
        return WsFloorClient(payload, folder)
    if server == "openpi-style":
        return OpenpiClient(payload, folder, debug=loaded)
    knobs = None
    if server == "vlad+rt":
        knobs = {k: v for k, v in rt.items() if k != "busy_poll_us"}
    elif server == "vlad+rt+spin":
        knobs = rt
    return VladClient(payload, folder / "vlad", loaded, knobs, warmup, baseline if server == "vlad-baseline" else None)


def row_of(server: str, payload: Payload, load: str, rate: str, s: Samples, seconds: float) -> dict:
    rtt, eng = np.asarray(s.rtt), np.asarray(s.engine)
    row = {
        "server": server,
        "payload": payload.name.split(" ")[0],
        "load": load,
        "rate": rate,
        "achieved_hz": round(len(rtt) / seconds, 1) if seconds else None,
        "missed": s.missed,
        "round_trip_ms": pct(rtt),
        "engine_ms": pct(eng),
        "overhead_ms": pct(rtt - eng),
    }
    if s.stages:
        row["stages_ms"] = {k: pct(v) for k, v in s.stages.items()}
    return row


def add_ratios(rows: list[dict]) -> None:
    index = {(r["server"], r["payload"], r["load"], r["rate"]): r for r in rows}
    for r in rows:
        o = r["overhead_ms"]
        for ref, key in (("floor", "vs_floor"), ("openpi-style", "vs_openpi")):
            other = index.get((ref, r["payload"], r["load"], r["rate"]))
            if other is None:
                continue
            ro = other["overhead_ms"]
            r[key] = {q: (round(o[q] / ro[q], 2) if ro[q] > 0 else None) for q in ("p50", "p99")}
            if ref == "floor":
                r["above_floor_ms"] = {q: round(o[q] - ro[q], 4) for q in ("p50", "p99")}
        quiet = index.get((r["server"], r["payload"], "quiet", r["rate"]))
        if r["load"] != "quiet" and quiet is not None and quiet["overhead_ms"]["p99"] > 0:
            r["p99_vs_quiet"] = round(o["p99"] / quiet["overhead_ms"]["p99"], 2)


def targets(rows: list[dict]) -> list[dict]:
    """The issue's targets, judged on this run's rows (judged, never asserted)."""
    idx = {(r["server"], r["payload"], r["load"], r["rate"]): r for r in rows}
    out = []

    def add(what, value, limit, ok):
        out.append({"target": what, "value": value, "limit": limit, "met": bool(ok)})

    for server in ("vlad", "vlad+rt", "vlad+rt+spin"):
        for payload in sorted({r["payload"] for r in rows}):
            r = idx.get((server, payload, "quiet", "50 Hz"))
            if r is None or "above_floor_ms" not in r:
                continue
            a = r["above_floor_ms"]
            add(f"{server} {payload} quiet 50 Hz overhead above floor p50", a["p50"], "<= 0.3 ms", a["p50"] <= 0.3)
            add(f"{server} {payload} quiet 50 Hz overhead above floor p99", a["p99"], "<= 1 ms", a["p99"] <= 1.0)
            for load in LOADS:
                r2 = idx.get((server, payload, load, "50 Hz"))
                o = idx.get(("openpi-style", payload, load, "50 Hz"))
                if r2 is not None and o is not None:
                    for q in ("p50", "p99"):
                        add(
                            f"{server} {payload} {load} 50 Hz overhead {q} below openpi-style",
                            [r2["overhead_ms"][q], o["overhead_ms"][q]],
                            "vlad < openpi-style",
                            r2["overhead_ms"][q] < o["overhead_ms"][q],
                        )
            h = idx.get((server, payload, "hog+debug", "50 Hz"))
            if h is not None and "p99_vs_quiet" in h:
                add(
                    f"{server} {payload} hog+debug 50 Hz p99 / quiet p99",
                    h["p99_vs_quiet"],
                    "<= 2",
                    h["p99_vs_quiet"] <= 2,
                )
        r = idx.get((server, "demo", "quiet", "50 Hz"))
        if r is not None and "stages_ms" in r:
            v = r["stages_ms"]["pre+decode+guard"]["p50"]
            add(f"{server} demo quiet 50 Hz preprocess+decode+guard p50", v, "<= 0.15 ms", v <= 0.15)
    return out


def run(args) -> dict:
    cond = conditions()
    cond["rt_probe"] = probe_rt()
    usable = sorted(os.sched_getaffinity(0))
    rt: dict = {"cpu_affinity": [usable[-1]], "gc_freeze": True, "busy_poll_us": BUSY_POLL_US}
    refused = []
    if cond["rt_probe"]["fifo_priority"] == "ok":
        rt["fifo_priority"] = FIFO_PRIORITY
    else:
        refused.append(f"fifo_priority: {cond['rt_probe']['fifo_priority']}")
    if cond["rt_probe"]["mlockall"] == "ok":
        rt["mlockall"] = True
    else:
        refused.append(f"mlockall: {cond['rt_probe']['mlockall']}")
    cond["vlad_knobs"] = {
        "vlad": {"gc_freeze": False, "cpu_affinity": [], "busy_poll_us": 0, "fifo_priority": 0, "mlockall": False},
        "vlad+rt": {k: v for k, v in rt.items() if k != "busy_poll_us"},
        "vlad+rt+spin": rt,
    }
    cond["vlad_rt_refused"] = refused
    if args.baseline is not None:
        head = subprocess.run(
            ["git", "-C", str(args.baseline), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        cond["vlad_baseline"] = {"tree": str(args.baseline), "commit": head.stdout.strip() or "not a git checkout"}
    here = subprocess.run(
        ["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    cond["vlad_commit"] = here.stdout.strip() or "not a git checkout"
    seconds = {"50 Hz": args.seconds, "lock-step": args.lockstep_seconds}
    cond["interleave_s"] = args.interleave
    rows: list[dict] = []
    tmp = Path(tempfile.mkdtemp(prefix="vlad-bench-"))
    try:
        payloads = [demo_payload()] if "demo" in args.payloads else []
        if "synthetic" in args.payloads:
            payloads.append(synthetic_payload(tmp / "synthetic"))
        cond["payloads"] = {
            p.name.split(" ")[0]: {
                "what": p.name,
                "raw_observation_bytes": p.raw_bytes,
                "action_shape": list(p.action_shape),
            }
            for p in payloads
        }
        costs = {
            p.name.split(" ")[0]: stage_costs(p, 200 if args.short else 2000, 10 if args.short else 300)
            for p in payloads
        }
        servers = [s for s in SERVERS if s in args.servers]
        n = 0
        for payload in payloads:
            for load in [lo for lo in LOADS if lo in args.loads]:
                loaded = load != "quiet"
                with cpu_hog() if loaded else contextlib.nullcontext():
                    launched: dict = {}
                    try:
                        if args.interleave:
                            for server in servers:
                                n += 1
                                launched[server] = make_client(
                                    server, payload, tmp / f"run{n}", loaded, rt, args.warmup, args.baseline
                                )
                            for row in interleaved(launched, payload, load, args):
                                rows.append(row)
                                if not args.json:
                                    print_row(row)
                            continue
                        if args.parallel_start:  # a smoke run: start every server of the condition at once
                            for server in servers:
                                n += 1
                                launched[server] = make_client(
                                    server, payload, tmp / f"run{n}", loaded, rt, args.warmup, args.baseline
                                )
                        for server in servers:
                            if server not in launched:
                                n += 1
                                launched[server] = make_client(
                                    server, payload, tmp / f"run{n}", loaded, rt, args.warmup, args.baseline
                                )
                            client = launched[server]
                            try:
                                client.connect()
                                drive(client.step, 50, args.warmup_seconds, None)
                                for rate in RATES:
                                    s = Samples()
                                    load_before = os.getloadavg()[0]
                                    drive(client.step, 50 if rate == "50 Hz" else None, seconds[rate], s)
                                    row = row_of(server, payload, load, rate, s, seconds[rate])
                                    row["loadavg_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
                                    rows.append(row)
                                    if not args.json:
                                        print_row(row)
                            finally:
                                launched.pop(server).close()
                    finally:
                        for client in launched.values():
                            with contextlib.suppress(Exception):
                                client.close()
        cond["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        cond["busy_neighbours_after"] = busy_neighbours()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    add_ratios(rows)
    return {
        "conditions": cond,
        "rows": rows,
        "hot_stage_costs_us": {p: hot for p, (hot, _) in costs.items()},
        "cold_stage_costs_us": {p: cold for p, (_, cold) in costs.items()},
        "targets": targets(rows),
    }


def interleaved(launched: dict, payload: Payload, load: str, args) -> list[dict]:
    """Every server of the condition started at once; at 50 Hz they take turns in blocks of
    ``args.interleave`` seconds (each after :func:`settle`, unmeasured) until each has
    ``args.seconds``, so that a machine that drifts (other tenants of a VM) is shared by all
    of them alike; then lock-step, one server after the other."""
    for client in launched.values():
        client.connect()
    for client in launched.values():
        drive(client.step, 50, args.warmup_seconds, None)
    samples = {server: Samples() for server in launched}
    measured = dict.fromkeys(launched, 0.0)
    load_before = os.getloadavg()[0]
    while min(measured.values()) < args.seconds:
        for server, client in launched.items():
            block = min(args.interleave, args.seconds - measured[server])
            if block <= 0:
                continue
            settle(client)
            drive(client.step, 50, block, samples[server])
            measured[server] += block
    rows = []
    for server in launched:
        row = row_of(server, payload, load, "50 Hz", samples[server], args.seconds)
        row["loadavg_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        row["interleaved_s"] = args.interleave
        rows.append(row)
    for server, client in launched.items():
        settle(client)
        s = Samples()
        drive(client.step, None, args.lockstep_seconds, s)
        rows.append(row_of(server, payload, load, "lock-step", s, args.lockstep_seconds))
    return rows


def settle(client, limit_s: float = 20.0) -> None:
    """Back from idle: 50 Hz until half a second in a row was answered by the policy (vlad
    takes a controller silent for a while as lost and serves holds until it is back)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        s = Samples()
        drive(client.step, 50, 0.5, s)
        if not s.missed:
            return
    raise RuntimeError(f"{type(client).__name__}: no policy answers for {limit_s:.0f} s after idling")


def print_row(r: dict) -> None:
    o, rt, e = r["overhead_ms"], r["round_trip_ms"], r["engine_ms"]
    print(
        f"{r['payload']:<9} {r['load']:<9} {r['rate']:<9} {r['server']:<12} {r['achieved_hz'] or 0:>6.1f} Hz "
        f"rtt p50 {rt['p50']:6.3f}  engine p50 {e['p50']:6.3f}  overhead p50 {o['p50']:6.3f} p95 {o['p95']:6.3f} "
        f"p99 {o['p99']:6.3f} max {o['max']:7.3f} ms (n={o['n']}, missed {r['missed']})",
        flush=True,
    )


def pair(d: dict | None, fmt: str = "") -> str:
    return "-" if not d else f"{format(d['p50'], fmt)} / {format(d['p99'], fmt)}"


def print_report(result: dict) -> None:
    rows = result["rows"]
    print(
        "\nOverhead = round trip - engine, ms. Ratios: this server's overhead / the floor's (x floor) and / "
        "openpi-style's (x openpi), same payload, load and rate.\n"
    )
    print(
        "| payload | load | rate | server | Hz | round trip p50 | engine p50 | overhead p50 | p95 | p99 | max "
        "| above floor p50 / p99 | x floor p50 / p99 | x openpi p50 / p99 |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        o = r["overhead_ms"]
        af = r.get("above_floor_ms")
        vf, vo = r.get("vs_floor"), r.get("vs_openpi")
        print(
            f"| {r['payload']} | {r['load']} | {r['rate']} | {r['server']} | {r['achieved_hz']} | "
            f"{r['round_trip_ms']['p50']:.3f} | {r['engine_ms']['p50']:.3f} | {o['p50']:.3f} | {o['p95']:.3f} | "
            f"{o['p99']:.3f} | {o['max']:.3f} | "
            f"{pair(af, '.3f') if r['server'] != 'floor' else '-'} | "
            f"{pair(vf) if r['server'] != 'floor' else '-'} | "
            f"{pair(vo) if r['server'] != 'openpi-style' else '-'} |"
        )
    print("\nvlad stage breakdown (from the chunks' timings_ms), p50 / p99 ms:\n")
    names = ("transport", "queue", "preprocess", "decode", "guard", "pre+decode+guard", "issue->controller")
    print("| payload | load | rate | server | " + " | ".join(names) + " |")
    print("|---|---|---|---|" + "---:|" * len(names))
    for r in rows:
        if r["server"].startswith("vlad") and "stages_ms" in r:
            st = r["stages_ms"]
            print(
                f"| {r['payload']} | {r['load']} | {r['rate']} | {r['server']} | "
                + " | ".join(f"{st[k]['p50']:.3f} / {st[k]['p99']:.3f}" for k in names)
                + " |"
            )
    for key, what in (
        ("hot_stage_costs_us", "called back to back in one process (warm caches)"),
        (
            "cold_stage_costs_us",
            f"each after {COLD_GAP_S * 1e3:.0f} ms asleep, {EVICT_BYTES >> 20} MiB touched meanwhile",
        ),
    ):
        costs = result[key]
        print(f"\nThe same stages {what}, p50 / p99 us:\n")
        names = list(next(iter(costs.values())))
        print("| payload | " + " | ".join(names) + " |")
        print("|---|" + "---:|" * len(names))
        for p, st in costs.items():
            print(f"| {p} | " + " | ".join(f"{st[k]['p50_us']} / {st[k]['p99_us']}" for k in names) + " |")
    print("\nTargets (issue 11), judged on this run:\n")
    for t in result["targets"]:
        print(f"- {'MET   ' if t['met'] else 'MISSED'} {t['target']}: {t['value']} ({t['limit']})")
    print(f"\nconditions: {json.dumps(result['conditions'])}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds at 50 Hz per row")
    ap.add_argument("--lockstep-seconds", type=float, default=5.0, help="measured seconds lock-step per row")
    ap.add_argument("--warmup-seconds", type=float, default=2.0, help="unmeasured 50 Hz warm-up per server")
    ap.add_argument("--warmup", type=int, default=10, help="the daemon's serve.warmup inferences")
    ap.add_argument(
        "--servers",
        nargs="+",
        default=[s for s in SERVERS if s != "vlad-baseline"],
        choices=SERVERS,
        help="vlad-baseline needs --baseline",
    )
    ap.add_argument("--payloads", nargs="+", default=list(PAYLOADS), choices=PAYLOADS)
    ap.add_argument("--loads", nargs="+", default=list(LOADS), choices=LOADS)
    ap.add_argument(
        "--baseline",
        type=Path,
        help="a vlad checkout (git worktree add DIR <commit>): the vlad-baseline server runs its code",
    )
    ap.add_argument(
        "--short",
        action="store_true",
        help="a smoke run: every row, few samples, servers of a "
        "condition started together (idle ones run beside the measured one)",
    )
    ap.add_argument(
        "--interleave",
        type=float,
        metavar="SECONDS",
        help="start every server of a condition at once and take turns at 50 Hz in blocks this long",
    )
    ap.add_argument("--parallel-start", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print the result as JSON only")
    ap.add_argument("--json-out", type=Path, help="also write the result as JSON to this file")
    ap.add_argument("--_floor-server", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--_ws-floor-server", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--_openpi-server", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--_debug", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-ups (servers, hog, temp folder)
    if args._floor_server:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        floor_server(args._floor_server[0], args._floor_server[1], int(args._floor_server[2]))
        return 0
    if args._ws_floor_server:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        ws_floor_server(int(args._ws_floor_server[0]), int(args._ws_floor_server[1]))
        return 0
    if args._openpi_server:
        openpi_server(int(args._openpi_server[0]), args._openpi_server[1], args._debug)
        return 0
    if "vlad-baseline" in args.servers and args.baseline is None:
        ap.error("--servers vlad-baseline needs --baseline DIR")
    if args.baseline is not None:
        args.baseline = args.baseline.resolve()
        if not (args.baseline / "vlad" / "__init__.py").is_file():
            ap.error(f"--baseline {args.baseline}: not a vlad checkout")
        if "vlad-baseline" not in args.servers:
            args.servers.append("vlad-baseline")
    if args.short:
        args.seconds, args.lockstep_seconds, args.warmup_seconds, args.warmup = 0.3, 0.15, 0.1, 3
        args.parallel_start = True
    try:
        import openpi_client  # noqa: F401
    except ImportError:
        if "openpi-style" in args.servers:
            print(
                "openpi_client is not installed: the openpi-style rows are skipped "
                "(pip install --no-deps openpi-client)",
                file=sys.stderr,
            )
            args.servers = [s for s in args.servers if s != "openpi-style"]
    try:
        import websockets  # noqa: F401
    except ImportError:
        if "ws-floor" in args.servers:
            print(
                "websockets is not installed: the ws-floor rows are skipped (pip install websockets)", file=sys.stderr
            )
            args.servers = [s for s in args.servers if s != "ws-floor"]
    result = run(args)
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
