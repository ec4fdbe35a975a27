"""``vladctl export``: re-export the demo policy's .pt2 and ONNX from its weights and check them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def cmd_export(args: argparse.Namespace) -> int:
    """Re-export the demo policy's .pt2 and ONNX from its weights and check them."""
    from vlad.contract import load_contract
    from vlad.processing import Tokenizer
    from vlad_tools.demo.release import export_release, load_trained_model

    release = Path(args.release)
    contract = load_contract(release / "contract.toml")
    model = load_trained_model(release)
    comparisons = export_release(
        model, contract, Tokenizer.from_contract(contract), release, Path(args.fixtures), log=print
    )
    worst = max(c.max_abs for c in comparisons if c.name != "prefix")
    print(f"export OK: ONNX Runtime vs PyTorch max abs error {worst:.3g}")
    return 0


def add_export_commands(sub: Any) -> None:
    p = sub.add_parser("export", help="export the demo policy to .pt2 and ONNX and check them against PyTorch")
    p.add_argument(
        "--release", default="manifests/demo", help="release folder with policy_weights.pt (default: %(default)s)"
    )
    p.add_argument("--fixtures", default="manifests/demo/golden.npz", help="golden fixtures to (re)write")
    p.set_defaults(func=cmd_export)
