#!/usr/bin/env python3
"""Run vlad's fuzz targets for a configurable time (the long form of tests/testing/test_fuzz.py).

    .venv/bin/python scripts/fuzz.py                       # every target, 60 s each
    .venv/bin/python scripts/fuzz.py --seconds 300 intake  # one target, 5 minutes
    .venv/bin/python scripts/fuzz.py --list

Targets and invariants: tools/vlad_tools/testing/fuzz.py (protocol, estop, intake, control,
manifest). Inputs come from seeded mutational generators (random bytes, random msgpack
structures, mostly-right headers, mutations of valid messages / manifests). For each
target it prints the inputs fuzzed, crashes (an exception other than the documented
error, or a broken invariant; unique by type and first line), hangs (an input still
running after ``--hang-ms``, interrupted by SIGALRM) and the slowest input. Crashing and
hanging inputs are written to ``--out`` as Python literals (``repr``) for a regression
test. Exit status 1 when anything crashed or hung.
"""

from __future__ import annotations

import argparse
import logging
import random
import signal
import sys
import time
from pathlib import Path

from vlad_tools.testing.fuzz import TARGETS, FuzzFailure, shared_intake


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def run_target(name: str, seconds: float, seed: int, hang_ms: int, out: Path | None) -> dict:
    target, generate = TARGETS[name]
    rng = random.Random(seed)
    crashes: dict[str, str] = {}
    hangs = 0
    n = 0
    slowest = (0.0, "")
    t_end = time.monotonic() + seconds
    signal.signal(signal.SIGALRM, _alarm)
    while time.monotonic() < t_end:
        data = generate(rng)
        n += 1
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, hang_ms / 1000)
        try:
            target(data)
        except Hang:
            hangs += 1
            _save(out, name, "hang", hangs, data)
        except (FuzzFailure, Exception) as exc:  # noqa: BLE001 - everything escaping is a finding
            key = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            if key not in crashes:
                crashes[key] = repr(data)[:400]
                _save(out, name, "crash", len(crashes), data)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        dt = time.perf_counter() - t0
        if dt > slowest[0]:
            slowest = (dt, f"{len(repr(data))} chars: {repr(data)[:100]}")
    return {
        "target": name,
        "inputs": n,
        "seconds": seconds,
        "crashes": crashes,
        "hangs": hangs,
        "slowest_ms": round(slowest[0] * 1000, 2),
        "slowest_input": slowest[1],
    }


def _save(out: Path | None, name: str, kind: str, i: int, data) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-{kind}-{i}.txt").write_text(repr(data))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", help=f"targets to run (default: all of {', '.join(TARGETS)})")
    ap.add_argument("--seconds", type=float, default=60.0, help="time per target (default 60)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hang-ms", type=int, default=2000, help="an input running longer is a hang (default 2000)")
    ap.add_argument("--out", type=Path, default=None, help="folder for crashing/hanging inputs")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(TARGETS))
        return 0
    names = args.targets or list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        ap.error(f"unknown target(s) {unknown}; known: {', '.join(TARGETS)}")
    logging.disable(logging.CRITICAL)  # the code under test logs its first rejections loudly
    failed = False
    print(f"{'target':10} {'inputs':>10} {'per s':>8} {'crashes':>8} {'hangs':>6} {'slowest ms':>11}")
    for name in names:
        r = run_target(name, args.seconds, args.seed, args.hang_ms, args.out)
        print(
            f"{name:10} {r['inputs']:>10} {r['inputs'] / args.seconds:>8.0f} {len(r['crashes']):>8} "
            f"{r['hangs']:>6} {r['slowest_ms']:>11}",
            flush=True,
        )
        if name == "intake":
            c = shared_intake().counts
            print(
                f"    intake outcomes: {c.observations} accepted, {c.heartbeats} heartbeats, "
                f"{c.input_rejected} rejected {dict(c.rejected.most_common())}"
            )
        print(f"    slowest input ({r['slowest_ms']} ms): {r['slowest_input']}")
        for key, data in r["crashes"].items():
            print(f"    crash {key}\n          input {data}")
        failed |= bool(r["crashes"] or r["hangs"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
