"""``vladctl`` release commands: keys, manifests, signatures and the on-robot store.

:func:`add_release_commands` plugs these into any argparse subparsers object; each sets
``args.func`` to a function returning the exit code and raises a
:class:`~vlad.errors.VladError` for an expected failure (the caller prints
``error: <message>`` and exits 2). Also runnable alone:
``python -m vlad.release_cli verify manifests/demo --keys etc/vlad/keys.d``.

Commands: ``keygen``, ``sign``, ``verify``, ``manifest {show,update-hashes}``,
``release {stage,activate,rollback,status,history,gc}``. The trusted keys default to
``$VLAD_KEYS_DIR`` (else the config's ``release.keys_dir``); the store is ``--root``, else
the config's ``store.root`` (``--config``, default /etc/vlad/vlad.toml).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from vlad.cli.common import DEFAULT_CONFIG, add_operator_args, operator, run
from vlad.cli.common import store as open_store
from vlad.errors import ExitCode

EXIT_OK = ExitCode.OK
EXIT_ERROR = ExitCode.ERROR


def _keys_default() -> str:
    from vlad.release.signing import DEFAULT_KEYS_DIR

    return os.environ.get("VLAD_KEYS_DIR") or str(DEFAULT_KEYS_DIR)


def add_release_commands(subparsers: Any) -> None:
    """Add ``keygen``, ``sign``, ``verify``, ``manifest`` and ``release`` to ``subparsers``."""
    p = subparsers.add_parser("keygen", help="make an Ed25519 signing key pair (NAME.key 0600, NAME.pub)")
    p.add_argument("--out", required=True, help="folder for the key files")
    p.add_argument("--name", help="file name stem (default: the key id)")
    p.set_defaults(func=cmd_keygen)

    p = subparsers.add_parser("sign", help="sign a release folder's manifest.toml (writes manifest.sig)")
    p.add_argument("release", help="release folder")
    p.add_argument("--key", required=True, help="private key file (from vladctl keygen)")
    p.set_defaults(func=cmd_sign)

    p = subparsers.add_parser("verify", help="verify a release: signature, validity, files, contract, runtime")
    p.add_argument("release", help="release folder")
    p.add_argument("--keys", default=None, help="trusted keys folder (default: $VLAD_KEYS_DIR or /etc/vlad/keys.d)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_verify)

    m = subparsers.add_parser("manifest", help="show a manifest or recompute its hashes")
    msub = m.add_subparsers(dest="manifest_command", metavar="COMMAND", required=True)
    p = msub.add_parser("show", help="validate and print a release manifest (no file checks)")
    p.add_argument("release", help="release folder or manifest.toml")
    p.add_argument("--json", action="store_true", help="print the canonical JSON that is signed")
    p.set_defaults(func=cmd_manifest_show)
    p = msub.add_parser("update-hashes", help="recompute artifact sizes/sha256 and the contract hash")
    p.add_argument("release", help="release folder")
    p.set_defaults(func=cmd_manifest_update_hashes)

    r = subparsers.add_parser("release", help="the release store on this robot: stage, activate, rollback")
    rsub = r.add_subparsers(dest="release_command", metavar="COMMAND", required=True)

    def store_parser(name: str, help: str) -> argparse.ArgumentParser:
        sp = rsub.add_parser(name, help=help)
        sp.add_argument("--root", default=None, help="store root (default: the config's store.root)")
        sp.add_argument("--config", default=DEFAULT_CONFIG, help="daemon config, for store.root and keys_dir")
        sp.add_argument(
            "--keys", default=None, help="trusted keys folder (default: $VLAD_KEYS_DIR or /etc/vlad/keys.d)"
        )
        return sp

    p = store_parser("stage", "verify a release folder and copy it into the store")
    p.add_argument("source", help="release folder")
    p.set_defaults(func=cmd_release_stage)
    for name, help in (
        ("activate", "make a staged release active (previous := active)"),
        ("rollback", "return to the previous release (marks the current one bad)"),
    ):
        p = store_parser(name, help)
        if name == "activate":
            p.add_argument("release_id")
        add_operator_args(
            p,
            force="allow missing or failed gate evidence, a downgrade or a release marked bad "
            "(operator decision, recorded with --why; never an integrity failure)",
        )
        p.set_defaults(func=cmd_release_activate if name == "activate" else cmd_release_rollback)
    p = store_parser("status", "active, previous and staged releases")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_release_status)
    p = store_parser("history", "activations and rollbacks, oldest first")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_release_history)
    p = store_parser("gc", "remove staged releases not active, previous or recently active")
    p.add_argument("--keep", type=int, default=3, help="also keep this many recently activated (default 3)")
    p.set_defaults(func=cmd_release_gc)


# ---- keys, signatures, manifests ------------------------------------------------------


def cmd_keygen(args: argparse.Namespace) -> int:
    """``keygen --out DIR [--name NAME]``."""
    from vlad.release.signing import generate_keypair

    kid, private, public = generate_keypair(args.out, args.name)
    print(f"key id   {kid}\nprivate  {private} (mode 0600: keep it off the robot)\npublic   {public}")
    print(f"trust it on a robot: install -m 0644 {public} /etc/vlad/keys.d/")
    return EXIT_OK


def cmd_sign(args: argparse.Namespace) -> int:
    """``sign RELEASE --key PRIVATE``: sign only; hashes come from ``manifest update-hashes``."""
    from vlad.release.signing import sign_release

    sig = sign_release(args.release, args.key)
    print(f"signed {Path(args.release) / 'manifest.sig'} with key {sig.key_id} (manifest sha256 {sig.manifest_sha256})")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """``verify RELEASE [--keys DIR]``: 0 verified (warnings on stderr), 2 refused."""
    from vlad.release.evidence import judge_evidence
    from vlad.release.manifest import rfc3339
    from vlad.release.signing import verify_release

    v = verify_release(args.release, args.keys or _keys_default(), progress=_progress)
    m = v.manifest
    evidence = judge_evidence(m, v.path, v.files)
    for w in v.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if not evidence.ok:
        print(
            f"warning: gate evidence {evidence.status}: {'; '.join(evidence.problems)} "
            "(activation and deploy refuse it unless forced with --force --why)",
            file=sys.stderr,
        )
    if args.json:
        print(
            json.dumps(
                {
                    "release": m.release.id,
                    "version": m.release.version,
                    "version_code": m.release.version_code,
                    "path": str(v.path),
                    "key_id": v.key_id,
                    "key_file": str(v.key_path),
                    "manifest_sha256": m.sha256,
                    "contract_sha256": m.contract.sha256,
                    "artifacts": len(m.artifacts),
                    "warnings": list(v.warnings),
                    "evidence": evidence.to_dict(),
                    "hashing": v.hashing,
                    "not_before": rfc3339(m.release.not_before),
                    "expires": rfc3339(m.release.expires),
                },
                indent=2,
            )
        )
        return EXIT_OK
    size = sum(a.size for a in m.artifacts)
    print(f"{v.path}: OK {m.release.id} {m.release.version} (version_code {m.release.version_code})")
    print(f"  signed by {v.key_id} ({v.key_path}); {len(m.artifacts)} artifacts, {size} bytes, all hashes match")
    print(
        f"  contract {m.contract.path} sha256 {m.contract.sha256[:16]}… matches; "
        f"valid {rfc3339(m.release.not_before)} .. {rfc3339(m.release.expires)}"
    )
    print(f"  gate evidence {evidence.status}; {v.hashing}")
    return EXIT_OK


def _progress(line: str) -> None:
    """Progress of a long step (hashing GBs), on stderr: stdout stays the result."""
    print(line, file=sys.stderr, flush=True)


def cmd_manifest_show(args: argparse.Namespace) -> int:
    """``manifest show RELEASE [--json]``: the validated manifest (files are not checked)."""
    from vlad.release.manifest import load_manifest, rfc3339

    m = load_manifest(args.release)
    if args.json:
        print(m.canonical_bytes().decode("utf-8"))
        return EXIT_OK
    r, b, lin = m.release, m.backend, m.lineage
    lines = [
        f"release   {r.id} {r.version} (version_code {r.version_code}), valid "
        f"{rfc3339(r.not_before)} .. {rfc3339(r.expires)}",
        f"contract  {m.contract.path} sha256 {m.contract.sha256}",
        f"backend   {b.name} on {b.artifact} options {json.dumps(dict(b.options))}",
        "runtime   " + (", ".join(f"{k} {v}" for k, v in vars_of(m.runtime).items() if v) or "(not recorded)"),
        f"lineage   {lin.change}"
        + (f" from {lin.parent}" if lin.parent else "")
        + (f", adapter {lin.adapter}" if lin.adapter else "")
        + (f", calibration {lin.calibration}" if lin.calibration else ""),
        "fallback  " + " -> ".join(f.kind + (f" {f.release}" if f.release else "") for f in m.fallback),
        "canary    " + ", ".join(f"{k} {v:g}" for k, v in vars_of(m.canary).items()),
    ]
    for g in m.gates:
        lines.append(f"gate      {g.gate}: {'passed' if g.passed else 'FAILED'} ({g.report})")
    for a in m.artifacts:
        lines.append(f"artifact  {a.role:<12} {a.size:>12}  {a.sha256[:16]}…  {a.path}")
    print("\n".join(lines))
    return EXIT_OK


def vars_of(obj: Any) -> dict[str, Any]:
    """Field values of a slotted dataclass, in order."""
    import dataclasses

    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def cmd_manifest_update_hashes(args: argparse.Namespace) -> int:
    """``manifest update-hashes RELEASE``: recompute; the old signature no longer matches."""
    from vlad.release.authoring import update_hashes

    m = update_hashes(args.release)
    print(
        f"{m.path}: {len(m.artifacts)} artifact hashes and the contract hash updated; "
        f"sign it again (vladctl sign {args.release} --key ...)"
    )
    return EXIT_OK


# ---- the store ------------------------------------------------------------------------


def _store(args: argparse.Namespace, create: bool = False):
    # Only staging creates a store; a typo in --root must not create an empty one.
    return open_store(args, create=create)


def cmd_release_stage(args: argparse.Namespace) -> int:
    """``release stage SOURCE``."""
    store = _store(args, create=True)
    v = store.stage_release(args.source, progress=_progress)
    print(f"staged {v.id} in {v.path} (activate: vladctl release activate {v.id} --why ...)")
    return EXIT_OK


def cmd_release_activate(args: argparse.Namespace) -> int:
    """``release activate ID --why WHY [--who] [--force]``."""
    e = _store(args).activate(
        args.release_id, who=operator(args.who), why=args.why, force=args.force, progress=_progress
    )
    print(
        f"active {e.to_release} (previous {e.from_release or 'none'}){e.flags()}; "
        "restart vlad (systemctl restart vlad) to serve it"
    )
    return EXIT_OK


def cmd_release_rollback(args: argparse.Namespace) -> int:
    """``release rollback --why WHY [--who] [--force]``."""
    e = _store(args).rollback(who=operator(args.who), why=args.why, force=args.force, progress=_progress)
    print(
        f"rolled back {e.from_release} -> {e.to_release} ({e.from_release} is marked bad){e.flags()}; "
        f"restart vlad (systemctl restart vlad) to serve it"
    )
    return EXIT_OK


def cmd_release_status(args: argparse.Namespace) -> int:
    """``release status``: active, previous, staged, bad."""
    store = _store(args)
    active = store.active()
    last = store.last_activation(active) if active else None
    info = {
        "root": str(store.root),
        "active": active,
        "active_evidence": _evidence_line(last) if active else None,
        "previous": store.previous(),
        "staged": store.list_releases(),
        "bad": sorted(store.bad_releases()),
        "activated_version_codes": sorted(store.activated_versions()),
    }
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        from vlad.schema import one_line

        for k, v in info.items():
            text = ", ".join(map(str, v)) if isinstance(v, list) else v
            # Names read from the store's folders and links are printed as one safe line too.
            print(f"{k:<24} {one_line(str(text), None) if text else 'none'}")
    return EXIT_OK


def _evidence_line(e: Any) -> str:
    """How the active release got its way past the evidence rule, from its journal entry."""
    if e is None or e.evidence is None:
        return "not recorded (activated before the journal kept gate evidence)"
    if e.evidence == "passed":
        return "passed"
    return f"{e.evidence}, forced by {e.who} at {e.time}: {e.why}"


def cmd_release_history(args: argparse.Namespace) -> int:
    """``release history``: one line per activation or rollback."""
    import dataclasses

    entries = _store(args).history()
    if args.json:
        print(json.dumps([dataclasses.asdict(e) for e in entries], indent=2))
        return EXIT_OK
    for e in entries:
        print(history_line(e))
    return EXIT_OK


def history_line(e: Any) -> str:
    """One activation or rollback on one line, with what a --force overrode."""
    line = f"{e.time}  {e.event:<8} {e.from_release or '-'} -> {e.to_release}  by {e.who}: {e.why}{e.flags()}"
    for o in e.overrides:
        line += f"\n{'':22}overrode {o}"
    return line


def cmd_release_gc(args: argparse.Namespace) -> int:
    """``release gc [--keep N]``."""
    removed = _store(args).gc(args.keep)
    print(f"removed {', '.join(removed)}" if removed else "nothing to remove")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point with vladctl's error handling (one line, exit 2)."""
    parser = argparse.ArgumentParser(prog="vladctl", description="vlad releases: keys, signatures, store")
    add_release_commands(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
