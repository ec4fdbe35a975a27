#!/usr/bin/env python3
"""Build a signed π0-architecture release from the planner's description, random weights.

Full size (3.24 B parameters with π0's vocabulary; 6.5 GB in bf16, 13 GB in fp32) or any
smaller scale; the weights are written one tensor at a time, so the export needs little
more memory than its largest tensor (docs/benchmarks.md, "π0-sized release").

    .venv/bin/python scripts/pi0_release.py --out runs/pi0-bf16 --dtype bf16 --formats pt2
    .venv/bin/python scripts/pi0_release.py --out runs/pi0-fp32 --dtype fp32 --formats onnx
    .venv/bin/python scripts/pi0_release.py --out /tmp/pi0-small --scale 0.125 --layers 2   # ~20 MB

Signed with the DEMO key by default (etc/vlad/demo-signing-key.pem: public, for
development only); ``--key`` signs with yours, ``--no-sign`` leaves it unsigned.
Exit status: 0 built, 2 error (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vlad.errors import VladError
from vlad_tools.pi0.release import FORMATS, Pi0Options, build_release
from vlad_tools.testing import REPO as ROOT


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="release folder to write (created)")
    p.add_argument("--scale", type=float, default=1.0, help="width factor of every transformer, (0, 1] (default 1)")
    p.add_argument("--layers", type=int, help="layers of all three stacks (default: the description's)")
    for stack in ("vision", "backbone", "action"):
        p.add_argument(f"--{stack}-layers", type=int, help=f"layers of the {stack} stack (overrides --layers)")
    p.add_argument(
        "--vocab", type=int, help="embedding rows (default: pi0's 257152 at full size, else the tokenizer's)"
    )
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--formats", default=",".join(FORMATS), help="pt2, onnx or both (default: both)")
    p.add_argument("--backend", choices=("onnxruntime", "torch"), help="default: onnxruntime for fp32 ONNX, else torch")
    p.add_argument("--threads", type=int, default=2, help="the backend's thread option (default 2)")
    p.add_argument(
        "--no-memory-map",
        dest="memory_map",
        action="store_false",
        help="onnxruntime: pack the weights into its own copies instead of keeping them memory-mapped",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--period-ms", type=float, default=20.0, help="contract control period (default 20)")
    p.add_argument("--validity-ms", type=float, default=1000.0, help="contract action validity (default 1000)")
    p.add_argument("--deadline-ms", type=float, default=250.0, help="contract end-to-end deadline (default 250)")
    p.add_argument("--version", default="1.0.0")
    p.add_argument("--version-code", type=int, default=1)
    p.add_argument("--key", default=str(ROOT / "etc" / "vlad" / "demo-signing-key.pem"))
    p.add_argument("--keys", default=str(ROOT / "etc" / "vlad" / "keys.d"), help="trusted keys to verify with")
    p.add_argument("--no-sign", action="store_true")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)

    layers = {s: getattr(args, f"{s}_layers") or args.layers for s in ("vision", "backbone", "action")}
    opts = Pi0Options(
        width=args.scale,
        vision_layers=layers["vision"],
        backbone_layers=layers["backbone"],
        action_layers=layers["action"],
        vocab=args.vocab,
        seed=args.seed,
        dtype=args.dtype,
        formats=tuple(f.strip() for f in args.formats.split(",") if f.strip()),
        backend=args.backend,
        threads=args.threads,
        memory_map=args.memory_map,
        control_period_ms=args.period_ms,
        action_validity_ms=args.validity_ms,
        e2e_deadline_ms=args.deadline_ms,
        version=args.version,
        version_code=args.version_code,
    )
    t0 = time.monotonic()
    try:
        summary = build_release(
            args.out,
            opts,
            key=None if args.no_sign else args.key,
            keys_dir=None if args.no_sign else args.keys,
            log=lambda m: print(m, file=sys.stderr if args.json else sys.stdout, flush=True),
        )
    except (VladError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary["timings_s"]["total_s"] = round(time.monotonic() - t0, 2)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        total = sum(summary["bytes"].values())
        print(
            f"built {summary['release']} in {args.out}: {total / 1e9:.2f} GB, backend {summary['backend']}, "
            f"memory need (planner) {summary['memory']['host_bytes'] / 1e9:.2f} GB host; "
            + ", ".join(f"{k} {v} s" for k, v in summary["timings_s"].items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
