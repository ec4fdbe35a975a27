"""The release manifest: what one release is, artifact by artifact.

A manifest is ``manifest.toml`` in the release folder (format ``vlad.manifest/1``,
documented in docs/releases.md), parsed once by the one schema parser (:mod:`vlad.schema`)
into the frozen dataclasses below, the rules between fields being its checks. It names the
contract (by path and the sha256 of its canonical bytes), every artifact with size,
sha256 and role, the backend and its options, the runtime it was validated on, the
fallback chain, the lineage (parent release, change kind), the gate evidence, the canary
policy and the validity window. Validation reports *every* problem in one
:class:`ManifestError`, like the contract loader.

The manifest is signed (see :mod:`vlad.release.signing`) over its raw bytes, and the
signature is checked before the TOML is parsed: an unsigned file never reaches the
parser on the robot. Reading is defensive (:func:`read_manifest_bytes`: a regular file,
at most :data:`MAX_MANIFEST_BYTES`; TOML nesting capped before parsing).
:func:`canonical_bytes` (sorted-key JSON of the document) stays as the manifest's
identity for comparisons that must ignore layout (the store's staging check).

Writing manifests lives in :mod:`vlad.release.authoring`.

Public API:

- :func:`load_manifest` / :func:`parse_manifest` -> :class:`Manifest`
- :func:`read_manifest_bytes`, :func:`parse_document`, :func:`read_manifest_document`
- :func:`canonical_bytes`, :func:`rfc3339`
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

from vlad import schema
from vlad.backend import PRECISIONS
from vlad.errors import ProblemsError, VladError
from vlad.files import FileRefused, parse_toml, read_bytes, read_bytes_beneath

__all__ = [
    "CHANGE_KINDS",
    "FALLBACK_KINDS",
    "GATES",
    "MANIFEST_FILE",
    "MANIFEST_FORMAT",
    "ROLES",
    "SIGNATURE_FILE",
    "Artifact",
    "BackendSpec",
    "CanaryPolicy",
    "ContractRef",
    "FallbackEntry",
    "GateEvidence",
    "Lineage",
    "Manifest",
    "ManifestError",
    "MemoryNeed",
    "ReleaseInfo",
    "RuntimeSpec",
    "MAX_MANIFEST_BYTES",
    "canonical_bytes",
    "load_manifest",
    "parse_document",
    "parse_manifest",
    "read_manifest_bytes",
    "read_manifest_document",
    "rfc3339",
]

MANIFEST_FORMAT = "vlad.manifest/1"
MANIFEST_FILE = "manifest.toml"
SIGNATURE_FILE = "manifest.sig"
# Files of the release folder that are not artifacts: the manifest cannot hash itself,
# and the detached signature is written after the manifest.
RESERVED_FILES = (MANIFEST_FILE, SIGNATURE_FILE)

Role = Literal[
    "model",
    "tokenizer",
    "contract",
    "engine",
    "timing_cache",
    "calibration",
    "config",
    "weights",
    "adapter",
    "report",
    "fixture",  # golden fixtures the gates check against (docs/gates.md)
    "recording",  # sensor recordings (MCAP) the gates replay
]
FallbackKind = Literal["previous_release", "policy", "hold"]
ChangeKind = Literal["retrain", "quantization", "distillation", "lora_adapter", "export_only"]
GateName = Literal["contract", "equivalence", "performance", "closed_loop"]
MemorySource = Literal["planner", "performance-gate", "operator"]
ROLES: tuple[str, ...] = typing.get_args(Role)
FALLBACK_KINDS: tuple[str, ...] = typing.get_args(FallbackKind)
CHANGE_KINDS: tuple[str, ...] = typing.get_args(ChangeKind)
GATES: tuple[str, ...] = typing.get_args(GateName)
# Release ids name directories in the store; "active"/"previous" are its pointers.
RELEASE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
RESERVED_IDS = ("active", "previous", "current")
# A real manifest is a few KiB; anything near this is not a manifest.
MAX_MANIFEST_BYTES = 1 << 20

# Field metadata of every file a manifest names: a plain relative path inside the release
# folder, never the manifest or its signature.
_FILE = schema.relpath("the release folder", RESERVED_FILES)
_SHA256 = schema.sha256()


class ManifestError(ProblemsError):
    """A manifest is missing, unreadable or invalid; ``problems`` lists every problem."""


# ---- the typed manifest ---------------------------------------------------------------
# Parsed by vlad.schema from these type hints and field metadata; the rules between
# fields are the checks in CHECKS below.


@dataclass(frozen=True, slots=True)
class ReleaseInfo:
    """``[release]``: identity, ordering (``version_code``) and validity window (UTC)."""

    id: str
    version: str
    version_code: int = field(metadata=schema.bounded(0))
    not_before: dt.datetime
    expires: dt.datetime
    description: str = ""


@dataclass(frozen=True, slots=True)
class ContractRef:
    """``[contract]``: the contract file and the sha256 of its canonical bytes."""

    path: str = field(metadata=_FILE)
    sha256: str = field(metadata=_SHA256)


@dataclass(frozen=True, slots=True)
class Artifact:
    """One ``[[artifacts]]`` entry: a file of the release, relative to its folder."""

    path: str = field(metadata=_FILE)
    role: Role
    size: int = field(metadata=schema.bounded(0))
    sha256: str = field(metadata=_SHA256)


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """``[backend]``: backend plugin name, the artifact it loads, options passed as is."""

    name: str
    artifact: str = field(metadata=_FILE)
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RuntimeSpec:
    """``[runtime]``: versions the release was validated on; None = not recorded."""

    python: str | None = None
    torch: str | None = None
    onnxruntime: str | None = None
    tensorrt: str | None = None
    cuda: str | None = None
    gpu: str | None = None


RUNTIME_KEYS = tuple(f.name for f in fields(RuntimeSpec))


@dataclass(frozen=True, slots=True)
class FallbackEntry:
    """One ``[[fallback]]`` step; ``release`` (id or path) only for kind ``policy``."""

    kind: FallbackKind
    release: str | None = None


@dataclass(frozen=True, slots=True)
class Lineage:
    """``[lineage]``: where this release comes from; every derived model is a release."""

    change: ChangeKind
    parent: str | None = None
    adapter: str | None = field(default=None, metadata=_FILE)
    calibration: str | None = field(default=None, metadata=_FILE)


@dataclass(frozen=True, slots=True)
class GateEvidence:
    """One ``[[gates]]`` entry: a release gate, its report artifact and the verdict."""

    gate: GateName
    report: str = field(metadata=_FILE)
    sha256: str = field(metadata=_SHA256)
    passed: bool


@dataclass(frozen=True, slots=True)
class CanaryPolicy:
    """``[canary]``: observation window and the thresholds that abort a canary."""

    window_s: float = field(default=600.0, metadata=schema.bounded(0))
    max_deadline_miss_rate: float = field(default=0.01, metadata=schema.bounded(0, 1))
    max_interventions: int = field(default=0, metadata=schema.bounded(0))
    max_divergence: float = field(default=0.05, metadata=schema.bounded(0))
    max_heartbeat_faults: int = field(default=3, metadata=schema.bounded(0))


CANARY_DEFAULTS: dict[str, float | int] = asdict(CanaryPolicy())


@dataclass(frozen=True, slots=True)
class MemoryNeed:
    """``[memory]``: what the release needs loaded and warm, in bytes, on the host and on
    the device (0: none there), and where the figure comes from (``MemorySource``)."""

    host_bytes: int = field(metadata=schema.bounded(0))
    device_bytes: int = field(metadata=schema.bounded(0))
    source: MemorySource


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """A validated release manifest. Build it with :func:`load_manifest`.

    ``document`` is the parsed TOML the signature covers; ``path`` where it was read.
    Neither takes part in equality.
    """

    REFUSED_KEYS: ClassVar[Mapping[str, str]] = {
        "signature": "signatures are detached (manifest.sig), not part of the manifest"
    }

    format: str
    release: ReleaseInfo
    contract: ContractRef
    artifacts: tuple[Artifact, ...] = ()  # empty is refused by the check, with its reason
    backend: BackendSpec
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
    fallback: tuple[FallbackEntry, ...] = ()  # so is a chain that does not end in "hold"
    lineage: Lineage
    gates: tuple[GateEvidence, ...] = ()
    canary: CanaryPolicy = field(default_factory=CanaryPolicy)
    # The release's own gate plan (docs/gates.md), checked by vlad_tools.gates.plan when used.
    gate_plan: Mapping[str, Any] | None = None
    memory: MemoryNeed | None = None  # None: the release does not say (the daemon estimates)
    document: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False, metadata={"internal": True})
    path: Path | None = field(default=None, compare=False, repr=False, metadata={"internal": True})

    @property
    def id(self) -> str:
        """The release id (``[release].id``)."""
        return self.release.id

    def artifact(self, path: str) -> Artifact:
        """The artifact entry for ``path`` (KeyError if it is not listed)."""
        for a in self.artifacts:
            if a.path == path:
                return a
        raise KeyError(f"no artifact {path!r} in release {self.release.id}")

    def canonical_bytes(self) -> bytes:
        """The bytes the signature covers (see :func:`canonical_bytes`)."""
        return canonical_bytes(self.document)

    @property
    def sha256(self) -> str:
        """Hex sha256 of :meth:`canonical_bytes`."""
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """The manifest as TOML-shaped data, absent optional values left out."""
        r = self.release
        out: dict[str, Any] = {
            "format": self.format,
            "release": _drop_none(
                {
                    "id": r.id,
                    "version": r.version,
                    "version_code": r.version_code,
                    "not_before": r.not_before,
                    "expires": r.expires,
                    "description": r.description or None,
                }
            ),
            "contract": {"path": self.contract.path, "sha256": self.contract.sha256},
            "backend": {
                "name": self.backend.name,
                "artifact": self.backend.artifact,
                "options": dict(self.backend.options),
            },
            "runtime": _drop_none({k: getattr(self.runtime, k) for k in RUNTIME_KEYS}),
            "lineage": _drop_none(
                {
                    "change": self.lineage.change,
                    "parent": self.lineage.parent,
                    "adapter": self.lineage.adapter,
                    "calibration": self.lineage.calibration,
                }
            ),
            "canary": {k: getattr(self.canary, k) for k in CANARY_DEFAULTS},
            "artifacts": [{"path": a.path, "role": a.role, "size": a.size, "sha256": a.sha256} for a in self.artifacts],
            "fallback": [_drop_none({"kind": f.kind, "release": f.release}) for f in self.fallback],
            "gates": [{"gate": g.gate, "report": g.report, "sha256": g.sha256, "passed": g.passed} for g in self.gates],
        }
        if self.gate_plan is not None:
            out["gate_plan"] = dict(self.gate_plan)
        if self.memory is not None:
            out["memory"] = {k: getattr(self.memory, k) for k in ("host_bytes", "device_bytes", "source")}
        return out


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# ---- canonical form -------------------------------------------------------------------


def rfc3339(t: dt.datetime) -> str:
    """``t`` in UTC as RFC 3339 with a ``Z`` (microseconds only when non-zero)."""
    t = t.astimezone(dt.UTC)
    spec = "microseconds" if t.microsecond else "seconds"
    return t.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return rfc3339(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    return value


def canonical_bytes(document: Mapping[str, Any]) -> bytes:
    """Sorted-key compact UTF-8 JSON of a parsed manifest document (datetimes as RFC 3339 UTC).

    Signatures are detached (``manifest.sig``), so there is no signature block to leave
    out. Being computed from the parsed TOML, not the file, comments and layout may change
    without breaking the signature; any change of a value does.
    """
    return json.dumps(
        _jsonable(dict(document)), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


# ---- loading and validation -----------------------------------------------------------


def read_manifest_bytes(path: str | Path) -> bytes:
    """The raw bytes of ``path`` (a manifest file or a release folder), read defensively.

    Only a regular file is opened (a FIFO or device is refused before it can block), and
    at most :data:`MAX_MANIFEST_BYTES` are read. Raises :class:`ManifestError`.
    """
    path = Path(path)
    folder = path if path.is_dir() else None
    if folder is not None:
        path = path / MANIFEST_FILE
    try:
        if folder is not None:  # inside a release folder: never through a symbolic link
            return read_bytes_beneath(folder, MANIFEST_FILE, MAX_MANIFEST_BYTES)
        return read_bytes(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError as exc:
        raise ManifestError(
            str(path), ["no manifest (run scripts/make_demo_manifest.py or write manifest.toml)"]
        ) from exc
    except FileRefused as exc:
        raise ManifestError(str(path), [str(exc)]) from exc
    except OSError as exc:
        raise ManifestError(str(path), [f"cannot read manifest: {exc.strerror or exc}"]) from exc


def parse_document(raw: bytes, source: str) -> dict[str, Any]:
    """TOML-parse manifest bytes (nesting capped first). Raises :class:`ManifestError`."""
    try:
        return parse_toml(raw, source)
    except VladError as exc:
        raise ManifestError(source, [str(exc)]) from exc


def read_manifest_document(path: str | Path) -> dict[str, Any]:
    """Read and TOML-parse ``path`` (a manifest file or a release folder), without validating.

    Authoring tools use this; the robot verifies the signature over
    :func:`read_manifest_bytes` first and parses with :func:`parse_document` after.
    """
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_FILE
    return parse_document(read_manifest_bytes(path), str(path))


def load_manifest(path: str | Path) -> Manifest:
    """Read, parse and validate a manifest (``path`` = manifest.toml or its release folder).

    Raises :class:`ManifestError` listing every problem. Files are not opened here;
    :func:`vlad.release.signing.verify_release` checks the artifacts and the signature.
    """
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_FILE
    return parse_manifest(read_manifest_document(path), str(path), path=path.resolve())


def parse_manifest(data: Any, source: str = "<manifest>", *, path: Path | None = None) -> Manifest:
    """Validate TOML-shaped ``data`` and build a :class:`Manifest`.

    Raises :class:`ManifestError` listing every problem (missing or unknown keys, bad
    values, references to artifacts that are not listed, inconsistent lineage or gates).
    """
    manifest = schema.parse(Manifest, data, source, ManifestError, CHECKS)
    return replace(manifest, document=data, path=path)


# ---- rules between fields (vlad.schema checks) ----------------------------------------


def _check_release(r: ReleaseInfo, path: str, problems: list[str]) -> None:
    if r.id is not None and (not RELEASE_ID_RE.fullmatch(r.id) or r.id in RESERVED_IDS):
        problems.append(
            f"{path}.id: {r.id!r} must match {RELEASE_ID_RE.pattern} and not be one of {', '.join(RESERVED_IDS)}"
        )
    if r.not_before is not None and r.expires is not None and r.expires <= r.not_before:
        problems.append(f"{path}.expires: must be later than {path}.not_before")


def _check_backend(b: BackendSpec, path: str, problems: list[str]) -> None:
    if b.options is not None:
        _check_options(b.options, problems, path)


def _check_options(options: Mapping[str, Any], problems: list[str], path: str = "backend") -> None:
    """Options go to the backend as is; the well-known ones are type-checked here."""
    for key, value in options.items():
        where = f"{path}.options.{key}"
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{where}: must be a finite number")
        elif isinstance(value, (dict, dt.datetime, dt.date, dt.time)):
            problems.append(f"{where}: expected a string, number, boolean or array of them")
        elif key.endswith("_threads") and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            problems.append(f"{where}: expected an integer >= 0 (0 = runtime default)")
        elif key == "providers" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            problems.append(f"{where}: expected an array of provider names, in preference order")
        elif key == "precision" and value not in PRECISIONS:
            problems.append(f"{where}: unknown precision {value!r} (known: {', '.join(PRECISIONS)})")


def _check_fallback_entry(f: FallbackEntry, path: str, problems: list[str]) -> None:
    if f.kind == "policy" and f.release is None:
        problems.append(f"{path}.release: a 'policy' entry names the release (id or path) to fall back to")
    elif f.kind != "policy" and f.release is not None:
        problems.append(f"{path}.release: only a 'policy' entry names a release")


def _check_lineage(ln: Lineage, path: str, problems: list[str]) -> None:
    if ln.change != "retrain" and ln.parent is None:
        problems.append(f"{path}.parent: a {ln.change!r} release derives from a parent; name it")
    if ln.change == "lora_adapter" and ln.adapter is None:
        problems.append(f"{path}.adapter: a 'lora_adapter' release names its adapter artifact")


def _check_manifest(m: Manifest, path: str, problems: list[str]) -> None:
    """The rules between sections. Also runs on a partial manifest (a section that did not
    parse is None, an array's broken entry is None), so they report what they can see."""
    if m.format is not None and m.format != MANIFEST_FORMAT:
        problems.append(f"format: unsupported format {m.format!r} (this vlad reads: {MANIFEST_FORMAT})")

    if m.artifacts == ():
        problems.append("artifacts: a release needs at least one artifact")
    by_path: dict[str, Artifact] = {}
    for i, a in enumerate(m.artifacts or ()):
        if a is None or a.path is None:
            continue
        if a.path in by_path:
            problems.append(f"artifacts[{i}].path: duplicate artifact {a.path!r}")
        by_path.setdefault(a.path, a)

    # An entry whose path did not parse may be the one a reference names: then "not
    # listed" would be a guess, and the entry's own problem is already reported.
    every_path = m.artifacts is not None and all(a is not None and a.path is not None for a in m.artifacts)

    def listed(ref: str | None, where: str, roles: tuple[str, ...] = ()) -> None:
        if ref is None:
            return
        a = by_path.get(ref)
        if a is None:
            if every_path:
                problems.append(f"{where}: {ref!r} is not listed in [[artifacts]]")
        elif roles and a.role is not None and a.role not in roles:
            problems.append(f"{where}: artifact {ref!r} has role {a.role!r}, expected {' or '.join(roles)}")

    if m.contract is not None:
        listed(m.contract.path, "contract.path", ("contract",))
    if m.backend is not None:
        listed(m.backend.artifact, "backend.artifact")
    if m.lineage is not None:
        listed(m.lineage.adapter, "lineage.adapter", ("adapter",))
        listed(m.lineage.calibration, "lineage.calibration", ("calibration",))
    for i, g in enumerate(m.gates or ()):
        if g is None:
            continue
        listed(g.report, f"gates[{i}].report", ("report",))
        if g.report in by_path and g.sha256 is not None and by_path[g.report].sha256 not in (None, g.sha256):
            problems.append(f"gates[{i}].sha256: differs from artifact {g.report!r}")

    # The chain must end in a posture that needs no model: an exhausted chain has
    # nowhere else to go, and entries after "hold" could never be reached.
    if m.fallback is not None:
        kinds = [f.kind if f is not None else None for f in m.fallback]
        if not kinds or kinds[-1] != "hold":
            problems.append('fallback: the chain must end with {kind = "hold"}')
        if "hold" in kinds[:-1]:
            problems.append("fallback: entries after the first 'hold' can never be reached")


CHECKS: dict[type, schema.Check] = {
    ReleaseInfo: schema.on_partial(_check_release),
    BackendSpec: schema.on_partial(_check_backend),
    FallbackEntry: _check_fallback_entry,
    Lineage: _check_lineage,
    Manifest: schema.on_partial(_check_manifest),
}
