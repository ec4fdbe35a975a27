"""``vladctl plan``: latency predictions, contract feasibility, plots, and measurement.

    vladctl plan --model pi0                              # every hardware, one row each
    vladctl plan --model pi0 --hardware rtx-4090          # per component, bound, memory
    vladctl plan --model pi0 --hardware b100 --placement edge --network 5g --mode async
    vladctl plan --contract manifests/demo --hardware jetson-thor   # deadline / period
    vladctl plan --model pi0 --plot steps --out steps.png
    vladctl plan --measure manifests/demo --keys etc/vlad/keys.d [--short] [--calls N --warmup N]
    vladctl plan --list

``add_plan_commands(subparsers)`` adds the sub-command to an argparse parser (vladctl);
``python -m vlad_tools.cli.plan ...`` runs it on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

EXIT_FLAGGED = 1


def add_plan_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``plan`` to ``subparsers``; the parsed namespace's ``func`` runs it."""
    p = subparsers.add_parser(
        "plan",
        help="predict a VLA's latency per component (roofline); --measure a release",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        help="model file or built-in name (pi0, smolvla, vlad-demo) or contract model.id "
        "(default: the contract's model, else pi0)",
    )
    p.add_argument("--hardware", help="hardware key(s), comma-separated, or 'all' (default: all)")
    p.add_argument("--placement", default="on-device", choices=("on-device", "edge", "cloud"))
    p.add_argument("--network", help="network key, or a path for cloud: ethernet-10g,fast-cloud")
    p.add_argument("--mode", default="sync", choices=("sync", "async", "dual"))
    p.add_argument("--s2-hz", type=float, default=10.0, help="dual mode: System 2 (backbone) rate (default: 10)")
    for name in ("steps", "chunk", "dof", "cameras", "batch"):
        p.add_argument(f"--{name}", type=int, help=f"override the model's {name}")
    p.add_argument("--precision", help="override the model's precision (fp32, bf16, fp16, fp8, int8, fp4)")
    p.add_argument("--contract", type=Path, help="contract.toml or release folder: check its period and deadline")
    p.add_argument("--plot", choices=("steps", "model-size", "network"), help="write a plot to --out")
    p.add_argument("--out", type=Path, help="plot file (.png or .svg)")
    p.add_argument(
        "--measure",
        metavar="RELEASE",
        type=Path,
        help="run RELEASE on this machine: measured vs roofline per component",
    )
    p.add_argument("--keys", help="trusted keys folder to verify RELEASE (default: $VLAD_KEYS_DIR or /etc/vlad/keys.d)")
    p.add_argument("--no-verify", action="store_true", help="measure an unsigned release folder as it is")
    p.add_argument("--short", action="store_true", help="--measure: small benchmarks and few calls (CI, seconds)")
    p.add_argument("--threads", type=int, help="--measure: threads (default: the release's backend options, else 1)")
    p.add_argument("--calls", type=int, help="--measure: timed inferences (default 300, --short 50)")
    p.add_argument("--warmup", type=int, help="--measure: untimed inferences first (default 50, --short 10)")
    p.add_argument("--list", action="store_true", help="list the built-in hardware, networks and models")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plan)
    return p


def _load_contract(path: Path):
    from vlad.contract import load_contract

    if path.is_dir():
        from vlad.release.manifest import load_manifest

        rel = load_manifest(path).contract.path if (path / "manifest.toml").exists() else "contract.toml"
        path = path / rel
    return load_contract(path)


def _hardware_list(arg: str | None) -> list[str]:
    from vlad_tools.planner import load_hardware_file

    if not arg or arg == "all":
        return list(load_hardware_file())
    return [h.strip() for h in arg.split(",") if h.strip()]


def cmd_plan(args: argparse.Namespace) -> int:
    """Run ``vladctl plan`` with parsed ``args``."""
    from vlad_tools import planner
    from vlad_tools.planner import report

    if args.list:
        return _list(args.json)
    if args.measure:
        return _measure(args)
    contract = _load_contract(args.contract) if args.contract else None
    model = planner.load_model(args.model or (contract.model.id if contract else "pi0"))
    if contract is not None:
        model = planner.align_to_contract(model, contract)
    overrides = {k: getattr(args, k) for k in ("steps", "chunk", "dof", "cameras", "batch", "precision")}
    model = model.with_overrides(**overrides)
    hardware = _hardware_list(args.hardware)
    if args.plot:
        if not args.out:
            raise planner.PlannerError("--plot needs --out FILE (.png or .svg)")
        from vlad_tools.planner.plots import plot

        period = contract.timing.control_period_ms if contract else None
        out = plot(
            args.plot,
            model,
            hardware,
            args.out,
            networks=args.network.split(",") if args.network else None,
            period_ms=period,
        )
        print(f"wrote {out}")
        return 0
    kw = dict(placement=args.placement, mode=args.mode, network=args.network, s2_hz=args.s2_hz)
    preds = [planner.predict(model, hw, **kw) for hw in hardware]
    feas = [planner.feasibility(contract, model, hw, align=False, **kw) for hw in hardware] if contract else []
    if args.json:
        doc = feas or [p.to_dict() for p in preds]
        print(json.dumps(doc[0] if len(doc) == 1 else doc, indent=2))
    elif len(preds) == 1:
        print(report.format_prediction(preds[0], feas[0] if feas else None))
    else:
        print(report.format_comparison(preds))
        for f in feas:
            verdict = "FLAGGED: " + "; ".join(f["reasons"]) if f["flagged"] else "meets the deadline"
            print(f"{f['hardware']}: {verdict}")
    return EXIT_FLAGGED if any(f["flagged"] for f in feas) else 0


def _measure(args: argparse.Namespace) -> int:
    from vlad_tools.planner import report
    from vlad_tools.planner.measure import measure_release

    keys = args.keys or os.environ.get("VLAD_KEYS_DIR")
    m = measure_release(
        args.measure,
        model=args.model,
        keys_dir=keys,
        verify=not args.no_verify,
        short=args.short,
        threads=args.threads,
        calls=args.calls,
        warmup=args.warmup,
    )
    print(json.dumps(m.to_dict(), indent=2) if args.json else report.format_measurement(m))
    return 0


def _list(as_json: bool) -> int:
    from vlad_tools import planner

    hw, nets = planner.load_hardware_file(), planner.load_network_file()
    models = {name: planner.load_model(path) for name, path in planner.builtin_models().items()}
    if as_json:
        print(
            json.dumps(
                {
                    "hardware": {k: h.to_dict() for k, h in hw.items()},
                    "networks": {k: n.to_dict() for k, n in nets.items()},
                    "models": {
                        k: {"name": m.name, "ids": list(m.ids), "description": m.description, "source": m.source}
                        for k, m in models.items()
                    },
                },
                indent=2,
            )
        )
        return 0
    print("hardware:")
    for k, h in hw.items():
        peaks = ", ".join(f"{p} {v / 1e12:g}" for p, v in h.peak_flops.items())
        print(
            f"  {k:<22} {h.name:<22} TFLOP/s {peaks}; {h.memory_bytes / h.gb:g} GB, "
            f"{h.memory_bandwidth / h.gb:g} GB/s  [{h.source}]"
        )
    print("networks:")
    for k, n in nets.items():
        print(f"  {k:<22} {n.upload_mbps:g}/{n.download_mbps:g} Mbit/s up/down, {n.latency_ms:g} ms  [{n.source}]")
    print("models:")
    for k, m in models.items():
        print(f"  {k:<22} {m.description}  [{m.source}]")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m vlad_tools.cli.plan [plan] ...``: the plan command on its own."""
    from vlad.cli.common import run

    parser = argparse.ArgumentParser(prog="vlad_tools.planner")
    add_plan_commands(parser.add_subparsers())
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "plan":
        argv.insert(0, "plan")
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
