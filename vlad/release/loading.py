"""A release loaded as a policy: verified, checked against its contract and warmed up.

The daemon loads the release being served and every fallback policy this way at start,
and :mod:`vlad.daemon.releases` loads deployed, shadowed and rolled-back releases the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlad.contract import Contract, load_contract
from vlad.errors import StartupError
from vlad.processing import Tokenizer, sha256_file

log = logging.getLogger("vlad.policies")



@dataclass
class LoadedPolicy:
    name: str
    release_id: str
    folder: Path
    contract: Contract
    tokenizer: Tokenizer | None
    session: Any
    artifacts: dict[str, str]  # relative path -> sha256 at load time
    manifest: Any = None  # the verified vlad.manifest.Manifest; None for an unsigned release


def load_policy(name: str, folder: Path, backend_name: str, artifact: str, options: dict, warmup: int,
                keys_dir: str | None) -> LoadedPolicy:
    """Verify (when ``keys_dir`` is given), load, check and warm up one release folder."""
    from vlad.plugins import get_backend

    artifacts: dict[str, str] | None = None
    manifest = None
    if keys_dir is not None:
        from vlad.release.signing import verify_release

        verified = verify_release(folder, keys_dir)
        for warning in verified.warnings:
            log.warning("release %s: %s", verified.id, warning)
        m = manifest = verified.manifest
        folder = verified.path
        for key, configured, signed in (("backend", backend_name, m.backend.name), ("artifact", artifact, m.backend.artifact),
                                        ("options", options, dict(m.backend.options))):
            if configured and configured != signed:
                raise StartupError(f"release.{key} = {configured!r} in the config differs from the signed manifest's "
                                   f"{signed!r}; remove it from the config (the manifest decides)")
        backend_name, artifact, options = m.backend.name, m.backend.artifact, dict(m.backend.options)
        artifacts = {a.path: a.sha256 for a in m.artifacts}
        log.info("release %s verified: signed by key %s", verified.id, verified.key_id)
    elif not (backend_name and artifact):
        raise StartupError(f"release {folder} is used unsigned (release.verify = false): set release.backend and "
                           "release.artifact in the config")
    contract_path = folder / "contract.toml"
    if not contract_path.is_file():
        raise StartupError(f"release {folder}: no contract.toml (is the release path right?)")
    contract = load_contract(contract_path)
    tokenizer = Tokenizer.from_contract(contract) if contract.language else None
    artifact_path = folder / artifact
    if not artifact_path.is_file():
        raise StartupError(f"release {folder}: artifact {artifact} is missing")
    backend = get_backend(backend_name)
    avail = backend.availability()
    if not avail.usable:
        raise StartupError(f"backend {backend.name} is not usable here: {avail.reason}")
    session = backend.load(artifact_path, contract, options)
    session.warmup(warmup)
    if artifacts is None:  # unsigned (development): watch what was loaded
        files = [contract_path, artifact_path] + ([contract.tokenizer_path] if tokenizer else [])
        artifacts = {str(p.relative_to(folder)): sha256_file(p) for p in files}
    release_id = f"{contract.model.id}@{contract.model.version}"
    return LoadedPolicy(name, release_id, folder, contract, tokenizer, session, artifacts, manifest)


def compatible(primary: Contract, other: Contract) -> list[str]:
    """Breaking contract differences that forbid ``other`` as a fallback for ``primary``."""
    from vlad.contract import diff_contracts

    return [d.path for d in diff_contracts(primary, other) if d.breaking]


