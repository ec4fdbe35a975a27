"""Build or check TensorRT engines on the robot: ``python -m vlad_tensorrt ...``.

``build`` loads the release through the backend exactly as the daemon would (so the key,
profile and checks are the daemon's), building into the cache if needed, then prints the
cache key and engine path. ``info`` prints what this machine can build.
"""

from __future__ import annotations

import argparse
import json
import sys

from vlad.contract import load_contract
from vlad.errors import VladError
from vlad_tensorrt.backend import TensorRTBackend
from vlad_tensorrt.cache import DEFAULT_CACHE_DIR
from vlad_tensorrt.precision import PRECISIONS, format_cc, precision_problem, supported_precisions


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m vlad_tensorrt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build (or verify the cached) engine for a release")
    b.add_argument("--contract", required=True)
    b.add_argument("--onnx", required=True)
    b.add_argument("--precision", choices=PRECISIONS, default="fp32")
    b.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR))
    b.add_argument("--profile-max-batch", type=int)
    b.add_argument("--rebuild-on-mismatch", action="store_true", help='on_mismatch = "rebuild"')
    b.add_argument("--quiet", action="store_true", help="no build progress")
    sub.add_parser("info", help="TensorRT version, GPU and the precisions it can build")
    args = parser.parse_args(argv)
    backend = TensorRTBackend()
    try:
        if args.command == "info":
            avail = backend.availability()
            if not avail.usable:
                raise VladError(avail.reason)
            device = backend._probe(0)  # noqa: SLF001 (same package)
            cc, flags = device.compute_capability, device.builder_flags
            print(
                json.dumps(
                    {
                        "tensorrt": device.tensorrt_version,
                        "gpu": device.name,
                        "compute_capability": format_cc(cc),
                        "precisions": list(supported_precisions(cc, flags)),
                        "not_offered": {
                            p: why
                            for p in PRECISIONS
                            if (why := precision_problem(p, cc, flags, device.tensorrt_version))
                        },
                        "note": "fp8 additionally needs an ONNX with FP8 Q/DQ nodes",
                    },
                    indent=2,
                )
            )
            return 0
        options = {
            "precision": args.precision,
            "cache_dir": args.cache_dir,
            "on_mismatch": "rebuild" if args.rebuild_on_mismatch else "error",
            "progress": not args.quiet,
        }
        if args.profile_max_batch is not None:
            options["profile_max_batch"] = args.profile_max_batch
        with backend.load(args.onnx, load_contract(args.contract), options) as session:
            d = session.describe()
            summary = {"cache_key": d.cache_key, **{k: d.extra[k] for k in ("engine", "built", "build_seconds")}}
            print(json.dumps(summary, indent=2))
        return 0
    except VladError as exc:
        print(f"vlad_tensorrt: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
