"""``vladctl import lerobot``: a LeRobot checkpoint into a checked, signed release (docs/lerobot.md)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from vlad.errors import ExitCode, VladError


def _mapping(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in values:
        name, sep, robot = item.partition("=")
        if not sep or not name or not robot:
            raise VladError(f"{flag} {item!r}: expected NAME=ROBOT_CAMERA")
        out[name] = robot
    return out


def _limits(values: list[str]) -> dict[str, tuple[float, float]]:
    """``--joint-limits NAME=LOWER:UPPER`` (repeatable) as joint -> (lower, upper)."""
    out = {}
    for item in values:
        name, sep, bounds = item.partition("=")
        lower, colon, upper = bounds.partition(":")
        try:
            lo, hi = float(lower), float(upper)
        except ValueError:
            lo = hi = math.nan
        if not sep or not name or not colon or not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise VladError(
                f"--joint-limits {item!r}: expected NAME=LOWER:UPPER with LOWER < UPPER (e.g. gripper=0:100)"
            )
        out[name] = (lo, hi)
    return out


def _units(text: str | None) -> tuple[str, ...]:
    return tuple(u.strip() for u in text.split(",")) if text else ()


def cmd_import_lerobot(args: argparse.Namespace) -> int:
    """Import a LeRobot checkpoint: contract, exports, checks against LeRobot, manifest, signature."""
    from vlad.files import load_toml
    from vlad_tools.importers.lerobot.contract import ContractOptions
    from vlad_tools.importers.lerobot.importer import ImportCheckFailed, ImportOptions, import_checkpoint

    checkpoint = Path(args.checkpoint)
    copts = ContractOptions(
        release_id=args.release_id or "",  # empty: derived from the checkpoint (its repository or run)
        version=args.version,
        cameras=_mapping(args.camera, "--camera"),
        state_units=_units(args.state_units),
        action_units=_units(args.action_units),
        action_semantics=args.action_semantics,
        fps=args.fps,
        deadline_ms=args.deadline_ms,
        joint_limits=_limits(args.joint_limits),
    )
    opts = ImportOptions(
        contract=copts,
        dataset_meta=Path(args.dataset_meta) if args.dataset_meta else None,
        precision=args.precision,
        backend=args.backend,
        version_code=args.version_code,
        windows=args.windows,
        key=Path(args.key) if args.key else None,
        keys_dir=Path(args.keys) if args.keys else None,
        gate_plan=load_toml(args.gate_plan) if args.gate_plan else None,
        force=args.force,
        vlm_dir=Path(args.vlm_dir) if args.vlm_dir else None,
        instructions=tuple(args.instruction),
    )
    try:
        report = import_checkpoint(checkpoint, args.out, opts)
    except ImportCheckFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.FINDINGS
    if args.json:
        print(json.dumps({k: report[k] for k in ("lineage", "checks", "warnings", "passed")}, indent=2))
    print(f"imported {checkpoint} -> {args.out}")
    return 0


def add_import_commands(sub: Any) -> None:
    p = sub.add_parser("import", help="turn another framework's checkpoint into a vlad release")
    isub = p.add_subparsers(dest="framework", metavar="FRAMEWORK", required=True)
    p = isub.add_parser(
        "lerobot",
        help="a LeRobot ACT, Diffusion Policy or SmolVLA checkpoint (docs/lerobot.md)",
        description="Contract from the checkpoint, .pt2 and ONNX exports checked against LeRobot's own "
        "inference, golden fixtures, a manifest with lineage, signed with --key.",
    )
    p.add_argument("checkpoint", help="the checkpoint folder (pretrained_model, or the checkpoint step holding it)")
    p.add_argument("--out", required=True, help="release folder to write (must be new or empty; --force replaces)")
    p.add_argument(
        "--dataset-meta", help="the dataset's meta/info.json (fps, joint names); default: train_config.json's"
    )
    p.add_argument(
        "--camera", action="append", default=[], metavar="NAME=ROBOT_CAMERA", help="rename a camera (repeatable)"
    )
    p.add_argument(
        "--vlm-dir",
        help="SmolVLA: a local folder with its VLM's config.json, tokenizer and processor files "
        "(e.g. HuggingFaceTB/SmolVLM2-500M-Video-Instruct downloaded; docs/lerobot.md)",
    )
    p.add_argument(
        "--instruction",
        action="append",
        default=[],
        help="SmolVLA: an instruction for the synthetic check windows (repeatable; default: a built-in set)",
    )
    p.add_argument("--precision", default="fp32", help="serving precision: fp32 (default), fp16, bf16 (GPU backends)")
    p.add_argument("--state-units", help="units of observation.state: one for all, or U1,U2,... (e.g. rad,rad,rad/s)")
    p.add_argument("--action-units", help="units of the action entries: one for all, or U1,U2,...")
    p.add_argument(
        "--action-semantics",
        default="position",
        choices=("position", "velocity", "delta", "torque"),
        help="(default: %(default)s)",
    )
    p.add_argument("--fps", type=float, help="control rate, when no dataset meta gives it")
    p.add_argument("--deadline-ms", type=float, help="end-to-end deadline (default: one control period)")
    p.add_argument(
        "--joint-limits",
        action="append",
        default=[],
        metavar="NAME=LOWER:UPPER",
        help="the guard's bounds of a joint in its unit, instead of the data's range widened by 10%% "
        "(repeatable; needed for a joint that never moved in the data)",
    )
    p.add_argument(
        "--release-id",
        help="contract model id (default: lerobot-NAME, NAME from the hub repository, the training run or the folder)",
    )
    p.add_argument("--version", default="1.0.0")
    p.add_argument("--version-code", type=int, default=1)
    p.add_argument("--backend", default="onnxruntime", help="serving backend written into the manifest")
    p.add_argument("--windows", type=int, default=6, help="check windows run through LeRobot (default: %(default)s)")
    p.add_argument(
        "--gate-plan",
        help="gate plan TOML for the manifest's [gate_plan] (default: contract, equivalence, performance)",
    )
    p.add_argument("--key", help="private key to sign the manifest with (vladctl keygen)")
    p.add_argument("--keys", help="trusted keys folder to verify the signed release against")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out folder")
    p.add_argument("--json", action="store_true", help="print lineage and checks as JSON")
    p.set_defaults(func=cmd_import_lerobot)
