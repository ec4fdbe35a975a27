#!/usr/bin/env python3
"""What cold CPU caches cost vlad's hot path, and what a rehearsal before the observation gives back.

At 50 Hz the serving threads sleep ~15 ms between two observations. This script runs the
first stages of the hot path on the demo release in this process (no daemon, no sockets):
the intake (decoding and checks), preprocessing and the guard's seam reference
(``ActionGuard.executing``), timed per stage, in these conditions:

* ``back to back``: called again at once (warm caches);
* ``after 18 ms asleep``: what the serving thread meets at 50 Hz;
* ``... + 1 ms spin``: the CPU kept busy for the last millisecond (is it the CPU's wake-up?);
* ``... + rehearsal L ms before``: the same stages run on *scratch* objects (another
  intake, preprocessor and guard, as ``vlad.serving.rehearsal`` does) L ms before;

and then the stages after the engine (decoding, the seam reference, the guard's check, the
chunk header and its encoding), warm and after a 32 MB sweep standing in for the engine
call, which evicts the caches the same way (the demo's ONNX graph is 4.3 MB).

    .venv/bin/python scripts/bench_cold_path.py [--calls 300]

Figures are noisy on a shared machine: compare the rows of one run only.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import zmq

from vlad import protocol
from vlad.config import GuardConfig
from vlad.contract import load_contract
from vlad.processing import ActionDecoder, Preprocessor, Tokenizer
from vlad.serving.counters import IntakeCounts
from vlad.serving.guard import ActionGuard, TrustedState
from vlad.serving.intake import Intake
from vlad.serving.tracing import CycleTimes
from vlad_tools.testing.conditions import conditions
from vlad_tools.testing.releases import demo_payload

PERIOD_S = 0.020


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300, help="timed calls per condition")
    args = ap.parse_args()
    payload = demo_payload()
    contract = load_contract(payload.release / "contract.toml")
    tokenizer = Tokenizer.from_contract(contract) if contract.language else None

    def stages():
        trusted = TrustedState(contract, GuardConfig())
        intake = Intake(contract, IntakeCounts(), trusted, 5_000_000, tokenizer)
        return intake, Preprocessor(contract, tokenizer), ActionGuard(contract, trusted)

    served, scratch = stages(), stages()
    tensors = {f"image/{k}": v for k, v in payload.images.items()}
    tensors["proprio"] = payload.proprio

    def frames() -> list[zmq.Frame]:
        h = {"seq": 1, "t_sensor_ns": time.monotonic_ns(), "client": "bench", "instruction": payload.instruction}
        return [zmq.Frame(f) for f in protocol.encode(protocol.TOPIC_OBS, h, tensors)]

    def first_stages(parts) -> list[int]:
        intake, pre, guard = parts
        f = frames()
        t = [time.perf_counter_ns()]
        obs = intake.accept(f, time.monotonic_ns())
        t.append(time.perf_counter_ns())
        pre.fill(obs)
        t.append(time.perf_counter_ns())
        guard.executing("bench", obs.sensor_time_ns, obs.executing)
        t.append(time.perf_counter_ns())
        return list(np.diff(t))

    def spin(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    conditions_first = {
        "back to back": lambda: None,
        "after 18 ms asleep": lambda: time.sleep(0.018),
        "after 17 ms asleep + 1 ms spin": lambda: (time.sleep(0.017), spin(0.001)),
    }
    for lead in (0.5, 1.0, 3.0):
        conditions_first[f"after {18 - lead:g} ms asleep, rehearsal {lead:g} ms before"] = lambda lead=lead: (
            time.sleep(0.018 - lead / 1000),
            first_stages(scratch),
            time.sleep(lead / 1000),
        )
    print(f"conditions: {conditions()}")
    print(f"\nFirst stages of the hot path, demo release, {args.calls} calls per row, p50 / p99 µs:\n")
    print("| condition | intake | preprocess | seam reference | all three |")
    print("|---|---:|---:|---:|---:|")
    for name, before in conditions_first.items():
        rows = []
        for _ in range(args.calls):
            before()
            rows.append(first_stages(served))
        a = np.asarray(rows, np.float64) / 1e3
        cols = [*a.T, a.sum(axis=1)]
        print(
            f"| {name} | " + " | ".join(f"{np.percentile(c, 50):.0f} / {np.percentile(c, 99):.0f}" for c in cols) + " |"
        )

    # After the engine call.
    intake, _, guard = served
    obs = intake.accept(frames(), time.monotonic_ns())
    decoder = ActionDecoder(contract)
    spec = contract.action
    y = {spec.output: np.zeros((1, spec.chunk_length, spec.dim), np.float32)}
    layout = protocol.Layout([("actions", "float32", (spec.chunk_length, spec.dim))])
    times, timings = CycleTimes(), {}
    sweep = np.zeros(32 << 20, np.uint8)
    seq = 0

    def after_engine() -> list[int]:
        nonlocal seq
        seq += 1
        now = time.monotonic_ns()
        t_sensor = now - 6_000_000
        t = [time.perf_counter_ns()]
        actions = decoder.decode(y)
        t.append(time.perf_counter_ns())
        executing = guard.executing("bench", t_sensor, obs.executing)
        t.append(time.perf_counter_ns())
        verdict = guard.check(
            actions, now, t_sensor + 10**9, t_sensor, executing=executing, client="bench", remember=False
        )
        t.append(time.perf_counter_ns())
        header = protocol.ActionChunk(
            seq=seq, obs_seq=seq, t_sensor_ns=t_sensor, t_issue_ns=now, valid_until_ns=t_sensor + 10**9,
            period_ns=int(PERIOD_S * 1e9), release="demo@1", state="active", source="release",
            interventions=verdict.interventions, timings_ms=times.header_ms(timings), actions=verdict.actions,
            client="bench", policy="release:demo@1",
        ).header()  # fmt: skip
        t.append(time.perf_counter_ns())
        layout.encode(protocol.TOPIC_ACTIONS, header, (verdict.actions,))
        t.append(time.perf_counter_ns())
        guard.record(verdict.actions, t_sensor, t_sensor + 10**9, now, "bench", seq)
        return list(np.diff(t))

    print(f"\nAfter the engine call, {args.calls} calls per row, p50 / p99 µs:\n")
    print("| condition | decode | seam reference | guard check | header | encode | all |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, before in {
        "back to back": lambda: None,
        "after a 32 MB sweep (the engine call)": lambda: (time.sleep(0.012), sweep.__iadd__(1)),
    }.items():
        rows = []
        for _ in range(args.calls):
            before()
            rows.append(after_engine())
        a = np.asarray(rows, np.float64) / 1e3
        cols = [*a.T, a.sum(axis=1)]
        print(
            f"| {name} | " + " | ".join(f"{np.percentile(c, 50):.0f} / {np.percentile(c, 99):.0f}" for c in cols) + " |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
