"""Authoring a release manifest: scan and hash the artifacts, write ``manifest.toml``.

What a release owner's tools use (``vladctl manifest update-hashes``, the gates'
``--record``, ``scripts/make_demo_manifest.py``); the robot only reads and verifies
(:mod:`vlad.release.manifest`, :mod:`vlad.release.signing`). Writing never signs: the
owner signs with ``vladctl sign`` afterwards.
"""

from __future__ import annotations

import copy
import datetime as dt
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from vlad import tomlwrite
from vlad.errors import VladError
from vlad.files import hash_fd, hash_file, open_beneath, parse_toml
from vlad.release.manifest import (
    CANARY_DEFAULTS,
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    RESERVED_FILES,
    ROLES,
    Manifest,
    ManifestError,
    _drop_none,
    parse_manifest,
    read_manifest_document,
)

__all__ = [
    "format_manifest",
    "guess_role",
    "hash_file",
    "new_manifest_data",
    "refresh_hashes",
    "scan_artifacts",
    "update_hashes",
    "write_manifest",
]


def guess_role(relpath: str) -> str | None:
    """The artifact role suggested by a file name, or None when the name says nothing."""
    name = PurePosixPath(relpath).name.lower()
    if name.startswith("contract") and name.endswith(".toml"):
        return "contract"
    if "tokenizer" in name:
        return "tokenizer"
    if "timing" in name and "cache" in name:
        return "timing_cache"
    if "calib" in name:
        return "calibration"
    if "adapter" in name or "lora" in name:
        return "adapter"
    if name.endswith(".mcap"):
        return "recording"
    if name.endswith(".npz") and ("golden" in name or "fixture" in name):
        return "fixture"
    if name.endswith((".engine", ".plan", ".trt")):
        return "engine"
    if name.endswith((".onnx", ".pt2", ".ts")):
        return "model"
    if name.endswith((".pt", ".pth", ".safetensors", ".bin", ".ckpt", ".onnx.data")):
        return "weights"
    if name.startswith(("eval", "report", "gate")) or "report" in name:
        return "report"
    if name.endswith((".json", ".toml", ".yaml", ".yml")):
        return "config"
    return None


def scan_artifacts(release_dir: str | Path, roles: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Artifact entries (path, role, size, sha256) for every file of a release folder.

    Every regular file except manifest.toml / manifest.sig is an artifact; ``roles``
    overrides :func:`guess_role` per relative path. Raises :class:`ManifestError` for a
    file whose role cannot be guessed, or for a symbolic link (a release is self-contained).
    """
    root = Path(release_dir)
    roles = dict(roles or {})
    entries, problems = [], []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            problems.append(f"{rel}: symbolic links are not allowed in a release")
            continue
        if not path.is_file() or rel in RESERVED_FILES:
            continue
        role = roles.get(rel) or guess_role(rel)
        if role is None:
            problems.append(f"{rel}: cannot guess its role; give it one of {', '.join(ROLES)}")
            continue
        size, digest = hash_file(path)
        entries.append({"path": rel, "role": role, "size": size, "sha256": digest})
    if problems:
        raise ManifestError(str(root), problems)
    return entries


def _contract_sha256(release_dir: Path, contract_path: str) -> str:
    from vlad.contract import load_contract  # the contract module is heavier; load lazily

    return load_contract(release_dir / contract_path).sha256


def new_manifest_data(
    release_dir: str | Path,
    *,
    release_id: str,
    version: str,
    version_code: int,
    backend: str,
    artifact: str,
    not_before: dt.datetime,
    expires: dt.datetime,
    options: Mapping[str, Any] | None = None,
    roles: Mapping[str, str] | None = None,
    runtime: Mapping[str, str | None] | None = None,
    fallback: Iterable[Mapping[str, Any]] = ({"kind": "hold"},),
    lineage: Mapping[str, Any] | None = None,
    gates: Iterable[Mapping[str, Any]] = (),
    canary: Mapping[str, Any] | None = None,
    contract: str = "contract.toml",
    description: str = "",
) -> dict[str, Any]:
    """Manifest data for the files now in ``release_dir``: artifacts scanned and hashed.

    Gate entries may leave out ``sha256``; it is taken from their report artifact.
    Pass the result to :func:`write_manifest`.
    """
    root = Path(release_dir)
    data: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "release": _drop_none(
            {
                "id": release_id,
                "version": version,
                "version_code": version_code,
                "not_before": not_before,
                "expires": expires,
                "description": description or None,
            }
        ),
        "contract": {"path": contract, "sha256": ""},
        "backend": {"name": backend, "artifact": artifact, "options": dict(options or {})},
        "runtime": _drop_none(dict(runtime or {})),
        "lineage": _drop_none(dict(lineage or {"change": "retrain"})),
        "canary": {**CANARY_DEFAULTS, **dict(canary or {})},
        "artifacts": scan_artifacts(root, roles),
        "fallback": [dict(f) for f in fallback],
        "gates": [dict(g) for g in gates],
    }
    return refresh_hashes(data, root)


def refresh_hashes(data: Mapping[str, Any], release_dir: str | Path) -> dict[str, Any]:
    """A copy of manifest ``data`` with artifact sizes/hashes, contract and gate hashes recomputed.

    ``data`` is first parsed like any manifest, its sizes and hashes aside (they may be
    stale or empty: that is what is recomputed), so what it names is known to be a plain
    path inside the folder before a file is opened. Files are opened beneath the folder,
    never through a symbolic link. Raises :class:`ManifestError` listing every problem of
    ``data`` or, once it parses, every listed artifact that cannot be hashed.
    """
    root = Path(release_dir)
    out: dict[str, Any] = copy.deepcopy(dict(data))
    manifest = parse_manifest(_without_hashes(out), str(root / MANIFEST_FILE))
    problems, hashes = [], {}
    for entry, a in zip(out["artifacts"], manifest.artifacts, strict=True):
        try:
            fd = open_beneath(root, a.path)
            try:
                entry["size"], entry["sha256"] = hash_fd(fd)
            finally:
                os.close(fd)
            hashes[a.path] = entry["sha256"]
        except (OSError, VladError) as exc:
            problems.append(f"{a.path}: cannot hash: {getattr(exc, 'strerror', None) or exc}")
    if problems:
        raise ManifestError(str(root), problems)
    out["contract"]["sha256"] = _contract_sha256(root, manifest.contract.path)
    for entry, g in zip(out.get("gates", []), manifest.gates, strict=True):
        entry["sha256"] = hashes[g.report]  # the parse checked that every report is listed
    return out


# Stands in for every size and sha256 that refresh_hashes recomputes, so that parsing
# judges all the rest of the data (any well-formed digest would do).
_PLACEHOLDER = {"size": 0, "sha256": "0" * 64}


def _without_hashes(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of manifest ``data`` whose sizes and hashes are placeholders (see refresh_hashes)."""
    probe = copy.deepcopy(dict(data))
    artifacts, gates = probe.get("artifacts"), probe.get("gates")
    for entry in artifacts if isinstance(artifacts, list) else []:
        if isinstance(entry, dict):
            entry.update(_PLACEHOLDER)
    for entry in gates if isinstance(gates, list) else []:
        if isinstance(entry, dict):
            entry["sha256"] = _PLACEHOLDER["sha256"]
    if isinstance(probe.get("contract"), dict):
        probe["contract"]["sha256"] = _PLACEHOLDER["sha256"]
    return probe


_TABLE_ORDER = ("release", "contract", "backend", "runtime", "lineage", "canary", "memory", "gate_plan")
_ARRAY_ORDER = ("artifacts", "fallback", "gates")


def format_manifest(data: Mapping[str, Any]) -> str:
    """TOML text for manifest ``data`` (tables first, then arrays of tables)."""
    data = dict(data)
    ordered: dict[str, Any] = {"format": data.pop("format", MANIFEST_FORMAT)}
    ordered.update({k: data.pop(k) for k in _TABLE_ORDER if k in data})
    arrays = {k: data.pop(k) for k in _ARRAY_ORDER if k in data}
    ordered.update(data)  # anything else (invalid, but keep it visible)
    ordered.update(arrays)
    header = "vlad release manifest (docs/releases.md). Signed: edit, then run\n`vladctl manifest update-hashes` and `vladctl sign`."
    return tomlwrite.dumps(ordered, header=header)


def write_manifest(release_dir: str | Path, data: Mapping[str, Any]) -> Manifest:
    """Validate ``data`` and write it as ``release_dir/manifest.toml`` (atomic replace).

    Raises :class:`ManifestError` without touching the file when ``data`` is invalid.
    """
    root = Path(release_dir)
    text = format_manifest(data)
    target = root / MANIFEST_FILE
    manifest = parse_manifest(parse_toml(text.encode("utf-8"), str(target)), str(target), path=target.resolve())
    fd, tmp = tempfile.mkstemp(prefix=".manifest.", dir=root)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return manifest


def update_hashes(release_dir: str | Path) -> Manifest:
    """Recompute every size/sha256 of ``release_dir/manifest.toml`` in place.

    The signature no longer matches afterwards: sign again. Comments are not kept.
    """
    root = Path(release_dir)
    return write_manifest(root, refresh_hashes(read_manifest_document(root), root))
