"""``vladctl push`` / ``vladctl pull``: releases to and from OCI registries
(:mod:`vlad.fleet.registry`), and what ``vladctl deploy REF`` pulls before it deploys."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vlad.cli.common import keys_dir, load_config_or_defaults
from vlad.errors import VladError


def add_registry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plain-http", action="store_true", help="talk HTTP, not HTTPS (a loopback or lab registry)")
    p.add_argument("--ca-file", help="CA certificate(s) the registry's TLS certificate is checked against")
    p.add_argument(
        "--authfile",
        help="containers auth file (auths.<host>.auth; default: $VLAD_REGISTRY_USER/$VLAD_REGISTRY_PASSWORD, "
        "$REGISTRY_AUTH_FILE, ~/.docker/config.json)",
    )


def registry_for(args: argparse.Namespace, host: str) -> Any:
    from vlad.fleet.registry import Registry

    return Registry(
        host,
        plain_http=args.plain_http,
        ca_file=Path(args.ca_file) if args.ca_file else None,
        auth_file=Path(args.authfile) if args.authfile else None,
    )


def store_root(args: argparse.Namespace) -> Path:
    return Path(getattr(args, "root", None) or load_config_or_defaults(getattr(args, "config", None)).store.root)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def add_fleet_commands(sub: Any) -> None:
    from vlad.cli.common import DEFAULT_CONFIG

    p = sub.add_parser("push", help="push a signed release folder to an OCI registry (prints the digest to pin)")
    p.add_argument("release", help="release folder (signed manifest)")
    p.add_argument("ref", help="host[:port]/repository:tag")
    p.add_argument("--keys", help="trusted keys folder (default: $VLAD_KEYS_DIR or the config's)")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="daemon config, for release.keys_dir")
    add_registry_args(p)
    p.set_defaults(func=cmd_push)

    p = sub.add_parser("pull", help="pull a release from an OCI registry into a folder, verified")
    p.add_argument("ref", help="host[:port]/repository@sha256:... (or :tag)")
    p.add_argument("--out", required=True, help="new folder for the release")
    p.add_argument("--keys", help="trusted keys folder (default: $VLAD_KEYS_DIR or the config's)")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="daemon config, for release.keys_dir and store.root")
    p.add_argument("--root", help="release store whose files need not be pulled again (default: the config's)")
    p.add_argument("--cache", help="blob cache (default: STORE_ROOT/blobs)")
    add_registry_args(p)
    p.set_defaults(func=cmd_pull)


def cmd_push(args: argparse.Namespace) -> int:
    from vlad.fleet.registry import parse_reference, push

    target = parse_reference(args.ref)
    t = push(
        Path(args.release),
        args.ref,
        keys_dir=Path(keys_dir(args)),
        registry=registry_for(args, target.host),
        progress=_progress,
    )
    print(t.summary("pushed"), file=sys.stderr)
    print(f"{target.host}/{target.repository}@{t.digest}")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from vlad.fleet.registry import parse_reference, pull

    target = parse_reference(args.ref)
    root = store_root(args)
    t = pull(
        args.ref,
        Path(args.out),
        keys_dir=Path(keys_dir(args)),
        cache=Path(args.cache) if args.cache else root / "blobs",
        store_root=root,
        registry=registry_for(args, target.host),
        progress=_progress,
    )
    print(t.summary("pulled"), file=sys.stderr)
    print(f"{t.reference} -> {t.path}")
    return 0


@contextmanager
def release_folder(args: argparse.Namespace) -> Iterator[Path]:
    """The folder ``vladctl deploy`` hands the daemon: ``args.release`` itself, or, for an
    OCI reference pinned by digest, the release pulled (verified) into the store's
    ``incoming/`` folder for the duration of the deploy (the store keeps its own copy)."""
    from vlad.fleet.registry import parse_reference, pull

    given = Path(args.release)
    # A reference names a digest or a tag after its last slash; a folder that exists wins.
    looks_like_reference = "/" in args.release and ("@" in args.release or ":" in args.release.rsplit("/", 1)[-1])
    if given.exists() or not looks_like_reference:
        yield given
        return
    target = parse_reference(args.release)
    if target.digest is None:
        raise VladError(
            f"deploy {args.release}: a fleet deploys a reference pinned by digest (host/repo@sha256:...); "
            "`vladctl pull` or `vladctl push` prints it"
        )
    root = store_root(args)
    incoming = root / "incoming" / target.digest.split(":", 1)[1][:16]
    shutil.rmtree(incoming, ignore_errors=True)
    incoming.parent.mkdir(parents=True, exist_ok=True)
    t = pull(
        args.release,
        incoming,
        keys_dir=Path(keys_dir(args)),
        cache=root / "blobs",
        store_root=root,
        registry=registry_for(args, target.host),
        progress=_progress,
        verify_files=False,  # the daemon verifies the folder while it stages it
    )
    print(t.summary("pulled"), file=sys.stderr)
    try:
        yield incoming
    finally:
        shutil.rmtree(incoming, ignore_errors=True)
