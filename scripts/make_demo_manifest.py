#!/usr/bin/env python3
"""Write and sign manifests/demo/manifest.toml for the demo release.

Every file of the release folder (except manifest.toml / manifest.sig) becomes an artifact
with its size and sha256; the runtime is what is installed now. Gate evidence: the
``[[gates]]`` entries of the manifest already there are kept when their report still is
in the folder (they come from ``vladctl gate --record``); a gate without one gets, for the
closed loop, the verdict of eval.json when it is there. The gate plan (``--gate-plan``)
becomes the manifest's ``[gate_plan]`` with its paths made relative to the release folder:
a file the plan names must lie inside the release (the release re-runs its gates from a
copy of itself). The manifest is signed with the DEMO key
(etc/vlad/demo-signing-key.pem, public half etc/vlad/keys.d/demo.pub), which is public in
this repository and must never be trusted on a real robot: make your own key with
``vladctl keygen`` (docs/releases.md).

    .venv/bin/python scripts/make_demo_manifest.py                  # manifests/demo
    .venv/bin/python scripts/make_demo_manifest.py --release-dir /tmp/copy --no-sign

Exit status: 0 written (and signed and verified) with passing gate evidence, 1 written,
signed and verified but its gate evidence does not pass (deploy refuses it unless forced),
2 error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from vlad.errors import VladError
from vlad.files import load_toml
from vlad.release.authoring import new_manifest_data, write_manifest
from vlad.release.evidence import judge_evidence
from vlad.release.manifest import CANARY_DEFAULTS, MANIFEST_FILE, read_manifest_document
from vlad.release.signing import installed_runtime, sign_release, verify_release

ROOT = Path(__file__).resolve().parent.parent

DEMO_DIR = ROOT / "manifests" / "demo"
RELEASE_ID = "vlad-demo-reacher-1.0.0"
VERSION = "1.0.0"
VERSION_CODE = 1


def closed_loop_gate(eval_path: Path, min_success_rate: float, min_margin: float) -> dict | None:
    """The closed-loop gate entry from eval.json. The demo's test plan: on *every*
    instruction the policy succeeds in at least ``min_success_rate`` of the episodes and
    beats the no-motion baseline by at least ``min_margin``. None without eval.json."""
    if not eval_path.is_file():
        return None
    rows = json.loads(eval_path.read_text())["results"]
    passed = True
    for instruction in sorted({r["instruction"] for r in rows}):
        rate = {r["policy"]: r["success_rate"] for r in rows if r["instruction"] == instruction}
        ok = (
            rate.get("policy", 0.0) >= min_success_rate
            and rate.get("policy", 0.0) - rate.get("zero", 0.0) >= min_margin
        )
        passed &= ok
        print(
            f"closed-loop gate: {instruction!r}: policy {rate.get('policy', 0):.2f}, no-motion {rate.get('zero', 0):.2f},"
            f" expert {rate.get('expert', 0):.2f} (need >= {min_success_rate:.2f} and a margin of {min_margin:.2f}):"
            f" {'passed' if ok else 'FAILED'}"
        )
    return {"gate": "closed_loop", "report": eval_path.name, "passed": passed}


def kept_gates(release: Path) -> list[dict]:
    """The [[gates]] entries of the manifest already in ``release`` whose report is still there."""
    if not (release / MANIFEST_FILE).is_file():
        return []
    doc = read_manifest_document(release)
    return [
        {k: g[k] for k in ("gate", "report", "passed")}
        for g in doc.get("gates", [])
        if (release / g.get("report", "")).is_file()
    ]


def release_plan(plan_file: Path, release: Path) -> dict:
    """The plan of ``plan_file`` with its file paths relative to ``release``.

    The demo plan names the demo release's files (relative to the plan file); for another
    release folder (a copy, a derived release) the same files of *that* folder are meant.
    A file the release does not hold is an error (one line saying to copy it in).
    """
    plan = load_toml(plan_file)
    eq = plan.get("equivalence", {})
    root = release.resolve()

    def inside(value: str, key: str) -> str:
        path = (plan_file.resolve().parent / value).resolve()
        for base in (root, DEMO_DIR):
            if path.is_relative_to(base):
                rel = path.relative_to(base).as_posix()
                if (root / rel).is_file():
                    return rel
        raise VladError(f"{plan_file}: {key} = {value!r} is not a file of {release}; copy the file into the release")

    if eq.get("golden"):
        eq["golden"] = inside(eq["golden"], "equivalence.golden")
    if eq.get("recordings"):
        eq["recordings"] = [inside(r, "equivalence.recordings") for r in eq["recordings"]]
    return plan


def main(argv: list[str] | None = None) -> int:
    """Write (and by default sign and verify) the demo manifest."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--release-dir", default=str(DEMO_DIR))
    p.add_argument(
        "--key",
        default=str(ROOT / "etc" / "vlad" / "demo-signing-key.pem"),
        help="private key to sign with (default: the DEMO key)",
    )
    p.add_argument(
        "--keys", default=str(ROOT / "etc" / "vlad" / "keys.d"), help="trusted keys to verify the result with"
    )
    p.add_argument("--valid-days", type=int, default=730, help="expires this many days from now")
    p.add_argument("--min-success-rate", type=float, default=0.5, help="closed-loop gate, per instruction")
    p.add_argument("--min-margin", type=float, default=0.2, help="closed-loop gate: over the no-motion baseline")
    p.add_argument(
        "--gate-plan",
        default=str(ROOT / "etc" / "vlad" / "demo-gates.toml"),
        help="gate plan written into the manifest's [gate_plan] table",
    )
    p.add_argument("--no-sign", action="store_true", help="only write manifest.toml")
    p.add_argument("--release-id", default=RELEASE_ID)
    p.add_argument("--version", default=VERSION)
    p.add_argument("--version-code", type=int, default=VERSION_CODE)
    p.add_argument("--backend", default="onnxruntime")
    p.add_argument("--options", default='{"intra_op_threads": 1}', help="backend options as JSON")
    p.add_argument("--parent", help="parent release id (lineage); the change kind is then export_only")
    p.add_argument(
        "--canary-window-s",
        type=float,
        default=CANARY_DEFAULTS["window_s"],
        help="[canary] window_s: how long a canary deploy of the release is watched",
    )
    p.add_argument(
        "--canary-max-deadline-miss-rate",
        type=float,
        default=CANARY_DEFAULTS["max_deadline_miss_rate"],
        help="[canary] max_deadline_miss_rate: the fraction of missed cycles that aborts a canary",
    )
    args = p.parse_args(argv)

    release = Path(args.release_dir)
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    try:
        gates = kept_gates(release)
        if not any(g["gate"] == "closed_loop" for g in gates):
            gate = closed_loop_gate(release / "eval.json", args.min_success_rate, args.min_margin)
            gates += [gate] if gate else []
        data = new_manifest_data(
            release,
            release_id=args.release_id,
            version=args.version,
            version_code=args.version_code,
            description="demo: pi0-shaped flow-matching policy for MuJoCo Reacher-v5",
            backend=args.backend,
            artifact="policy.onnx",
            options=json.loads(args.options),
            # A little slack before "now": a robot clock slightly behind must not refuse it.
            not_before=now - dt.timedelta(days=1),
            expires=now + dt.timedelta(days=args.valid_days),
            runtime={k: v for k, v in vars_of(installed_runtime()).items() if v},
            fallback=[{"kind": "hold"}],
            lineage={"change": "export_only", "parent": args.parent} if args.parent else {"change": "retrain"},
            gates=gates,
            canary={
                **CANARY_DEFAULTS,
                "window_s": args.canary_window_s,
                "max_deadline_miss_rate": args.canary_max_deadline_miss_rate,
            },
        )
        # The release carries its own gate plan (docs/gates.md), naming only its own files.
        data["gate_plan"] = release_plan(Path(args.gate_plan), release)
        manifest = write_manifest(release, data)
        print(f"wrote {manifest.path}: {len(manifest.artifacts)} artifacts, gates {[g['gate'] for g in gates]}")
        if args.no_sign:
            return 0
        sig = sign_release(release, args.key)
        print(f"signed with key {sig.key_id} ({args.key})")
        v = verify_release(release, args.keys, now)
        for w in v.warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(f"verified {v.id} against {args.keys}")
        evidence = judge_evidence(v.manifest, v.path, v.files)
        if not evidence.ok:
            print(f"gate evidence {evidence.status}: {'; '.join(evidence.problems)}", file=sys.stderr)
            return 1
    except VladError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def vars_of(obj) -> dict:
    """Field values of a slotted dataclass."""
    import dataclasses

    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


if __name__ == "__main__":
    sys.exit(main())
