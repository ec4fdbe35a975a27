"""A release loaded as a policy: verified, checked against its contract and warmed up.

The daemon loads the release being served and every fallback policy this way at start,
and the release manager loads deployed, shadowed and rolled-back releases the same way.
A deploy or rollback hands its :class:`~vlad.release.store.StagedRelease` on
(``PolicySource.staged``): the load takes its signature check, manifest, file hashes,
contract and gate evidence as they are and derives none of them again. Each multi-second
step reports progress.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlad.backend import Session
from vlad.contract import Contract, diff_contracts, load_contract
from vlad.errors import StartupError
from vlad.files import sha256_file
from vlad.processing import Tokenizer
from vlad.release.evidence import Evidence, judge_evidence
from vlad.release.manifest import Manifest
from vlad.release.signing import VerifiedRelease, check_window

if TYPE_CHECKING:
    from vlad.release.store import StagedRelease

log = logging.getLogger("vlad.release")


@dataclass(frozen=True)
class PolicySource:
    """Where a policy comes from and how to run it.

    ``keys_dir`` set: a signed release, whose manifest names backend, artifact and options
    (``backend``/``artifact``/``options`` must then be empty or equal); ``site_options`` are
    this robot's own (a remote endpoint, credential files) and fill only keys the manifest
    leaves unset. ``keys_dir`` None: an unsigned development release run as configured.
    """

    folder: Path
    keys_dir: str | None
    backend: str = ""
    artifact: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    site_options: Mapping[str, Any] = field(default_factory=dict)
    check_time: bool = True  # False for a rollback: a date must not block the way back
    # The release as this operation staged and verified it (a deploy or rollback): ``folder``
    # is its path, and the load trusts it as it is (nothing verified or judged again).
    staged: StagedRelease | None = None


@dataclass
class LoadedPolicy:
    release_id: str
    folder: Path
    contract: Contract
    tokenizer: Tokenizer | None
    session: Session
    artifacts: dict[str, str]  # relative path -> sha256 at load time
    manifest: Manifest | None = None  # the verified manifest; None for an unsigned release
    notes: tuple[str, ...] = ()  # what a human should know (e.g. "expired, used for a rollback")
    verified: VerifiedRelease | None = None  # what verification found (hashes with file identities)
    evidence: Evidence | None = None  # its gate evidence; None for an unsigned release
    staged: StagedRelease | None = None  # the store's release it was loaded from (deploy, rollback)


def load_policy(source: PolicySource, warmup: int, progress: Callable[[str], None] | None = None) -> LoadedPolicy:
    """Verify (signed releases), load, check and warm up one release folder; ``progress``
    gets a line per step and, while hashing, one a second."""
    from vlad.plugins import get_backend

    say = progress or (lambda line: None)

    folder = source.folder
    backend_name, artifact, options = source.backend, source.artifact, dict(source.options)
    artifacts: dict[str, str] | None = None
    manifest = None
    notes: list[str] = []
    verified: VerifiedRelease | None = None
    evidence: Evidence | None = None
    if source.staged is not None:
        if source.keys_dir is None or source.staged.path != folder.resolve():
            raise StartupError(f"release {folder}: a staged release is loaded from its own folder, with verification")
        verified, evidence = source.staged.verified, source.staged.evidence
        if source.check_time:
            check_window(verified.manifest, dt.datetime.now(dt.UTC), f"release {verified.path}")
    elif source.keys_dir is not None:
        from vlad.release.signing import verify_release

        verified = verify_release(folder, source.keys_dir, check_time=source.check_time, progress=say)
        if verified.hash_seconds >= 1.0:  # progress is for the steps a human waits for
            say(verified.hashing)
    if verified is not None:
        for warning in verified.warnings:
            log.warning("release %s: %s", verified.id, warning)
        m = manifest = verified.manifest
        if not source.check_time and dt.datetime.now(dt.UTC) >= m.release.expires:
            notes.append(
                f"release {m.release.id} expired at {m.release.expires:%Y-%m-%dT%H:%M:%SZ}; used anyway for a rollback"
            )
        folder = verified.path
        signed_options = dict(m.backend.options)
        for key, configured, signed in (
            ("backend", backend_name, m.backend.name),
            ("artifact", artifact, m.backend.artifact),
            ("options", options, signed_options),
        ):
            if configured and configured != signed:
                raise StartupError(
                    f"release.{key} = {configured!r} in the config differs from the signed manifest's "
                    f"{signed!r}; remove it from the config (the manifest decides)"
                )
        clash = sorted(set(source.site_options) & set(signed_options))
        if clash:
            raise StartupError(f"release.site_options {clash} are set by the signed manifest; the manifest decides")
        backend_name, artifact = m.backend.name, m.backend.artifact
        options = {**signed_options, **source.site_options}
        artifacts = {a.path: a.sha256 for a in m.artifacts}
        log.info("release %s verified: signed by key %s", verified.id, verified.key_id)
    elif not (backend_name and artifact):
        raise StartupError(
            f"release {folder} is used unsigned (release.verify = false): set release.backend and "
            "release.artifact in the config"
        )
    else:
        options = {**options, **source.site_options}
    contract_path = folder / "contract.toml"
    if not contract_path.is_file():
        raise StartupError(f"release {folder}: no contract.toml (is the release path right?)")
    contract = load_contract(contract_path)
    tokenizer = Tokenizer.from_contract(contract) if contract.language else None
    artifact_path = folder / artifact
    if not artifact_path.is_file():
        raise StartupError(f"release {folder}: artifact {artifact} is missing")
    if manifest is None:  # unsigned: the check verify_release makes of a signed release's models
        from vlad.release.external_data import external_data_problems
        from vlad.release.signing import IntegrityError

        problems = external_data_problems(folder, [artifact], None)
        if problems:
            raise IntegrityError(f"release {folder.resolve()}", problems)
    backend = get_backend(backend_name)
    avail = backend.availability()
    if not avail.usable:
        raise StartupError(f"backend {backend.name} is not usable here: {avail.reason}")
    t0 = time.monotonic()
    say(f"loading {artifact} on {backend_name}")
    session = backend.load(artifact_path, contract, options)
    if time.monotonic() - t0 >= 1.0:
        say(f"loaded {artifact} on {backend_name} in {time.monotonic() - t0:.1f} s; {warmup} warm-up inference(s)")
    t0 = time.monotonic()
    try:
        session.warmup(warmup)
    except BaseException:
        session.close()
        raise
    if time.monotonic() - t0 >= 1.0:
        say(f"warmed up in {time.monotonic() - t0:.1f} s")
    if artifacts is None:  # unsigned (development): watch what was loaded
        files = [contract_path, artifact_path] + ([contract.tokenizer_path] if contract.tokenizer_path else [])
        artifacts = {str(p.relative_to(folder)): sha256_file(p) for p in files}
    # Named by the model it serves (what controllers see in every chunk), for signed and
    # unsigned releases alike; the manifest's release id names the store folder.
    release_id = f"{contract.model.id}@{contract.model.version}"
    if verified is not None and evidence is None:
        evidence = judge_evidence(verified.manifest, folder, verified.files)
    return LoadedPolicy(
        release_id,
        folder,
        contract,
        tokenizer,
        session,
        artifacts,
        manifest,
        tuple(notes),
        verified,
        evidence,
        source.staged,
    )


def compatible(primary: Contract, other: Contract) -> list[str]:
    """Breaking contract differences that forbid ``other`` beside ``primary`` (fallback, deploy)."""
    return [d.path for d in diff_contracts(primary, other) if d.breaking]
