"""The release manifest: what one release is, artifact by artifact.

A manifest is ``manifest.toml`` in the release folder (format ``vlad.release.manifest/1``,
documented in docs/releases.md), parsed once into frozen dataclasses. It names the
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

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

ROLES = (
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
)
FALLBACK_KINDS = ("previous_release", "policy", "hold")
CHANGE_KINDS = ("retrain", "quantization", "distillation", "lora_adapter", "export_only")
GATES = ("contract", "equivalence", "performance", "closed_loop")
RUNTIME_KEYS = ("python", "torch", "onnxruntime", "tensorrt", "cuda", "gpu")
CANARY_DEFAULTS: dict[str, float | int] = {
    "window_s": 600.0,
    "max_deadline_miss_rate": 0.01,
    "max_interventions": 0,
    "max_divergence": 0.05,
    "max_heartbeat_faults": 3,
}
# Release ids name directories in the store; "active"/"previous" are its pointers.
RELEASE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
RESERVED_IDS = ("active", "previous", "current")
# A real manifest is a few KiB; anything near this is not a manifest.
MAX_MANIFEST_BYTES = 1 << 20
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


class ManifestError(ProblemsError):
    """A manifest is missing, unreadable or invalid; ``problems`` lists every problem."""


# ---- the typed manifest ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReleaseInfo:
    """``[release]``: identity, ordering (``version_code``) and validity window (UTC)."""

    id: str
    version: str
    version_code: int
    not_before: dt.datetime
    expires: dt.datetime
    description: str = ""


@dataclass(frozen=True, slots=True)
class ContractRef:
    """``[contract]``: the contract file and the sha256 of its canonical bytes."""

    path: str
    sha256: str


@dataclass(frozen=True, slots=True)
class Artifact:
    """One ``[[artifacts]]`` entry: a file of the release, relative to its folder."""

    path: str
    role: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """``[backend]``: backend plugin name, the artifact it loads, options passed as is."""

    name: str
    artifact: str
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


@dataclass(frozen=True, slots=True)
class FallbackEntry:
    """One ``[[fallback]]`` step; ``release`` (id or path) only for kind ``policy``."""

    kind: str
    release: str | None = None


@dataclass(frozen=True, slots=True)
class Lineage:
    """``[lineage]``: where this release comes from; every derived model is a release."""

    change: str
    parent: str | None = None
    adapter: str | None = None
    calibration: str | None = None


@dataclass(frozen=True, slots=True)
class GateEvidence:
    """One ``[[gates]]`` entry: a release gate, its report artifact and the verdict."""

    gate: str
    report: str
    sha256: str
    passed: bool


@dataclass(frozen=True, slots=True)
class CanaryPolicy:
    """``[canary]``: observation window and the thresholds that abort a canary."""

    window_s: float
    max_deadline_miss_rate: float
    max_interventions: int
    max_divergence: float
    max_heartbeat_faults: int


@dataclass(frozen=True, slots=True)
class MemoryNeed:
    """``[memory]``: what the release needs loaded and warm, in bytes, on the host and on
    the device (0: none there), and where the figure comes from (``MEMORY_SOURCES``)."""

    host_bytes: int
    device_bytes: int
    source: str


MEMORY_SOURCES = ("planner", "performance-gate", "operator")


@dataclass(frozen=True, slots=True)
class Manifest:
    """A validated release manifest. Build it with :func:`load_manifest`.

    ``document`` is the parsed TOML the signature covers; ``path`` where it was read.
    Neither takes part in equality.
    """

    format: str
    release: ReleaseInfo
    contract: ContractRef
    artifacts: tuple[Artifact, ...]
    backend: BackendSpec
    runtime: RuntimeSpec
    fallback: tuple[FallbackEntry, ...]
    lineage: Lineage
    gates: tuple[GateEvidence, ...]
    canary: CanaryPolicy
    # The release's own gate plan (docs/gates.md), checked by vlad.gates.plan when used.
    gate_plan: Mapping[str, Any] | None = None
    memory: MemoryNeed | None = None  # None: the release does not say (the daemon estimates)
    document: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    path: Path | None = field(default=None, compare=False, repr=False)

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


class _Table:
    """Typed access to one TOML table that records problems instead of raising."""

    def __init__(self, raw: Any, path: str, problems: list[str]) -> None:
        self.path, self.problems = path, problems
        if raw is None:  # the table itself is missing; that problem is already recorded
            raw = {}
        elif not isinstance(raw, dict):
            problems.append(f"{path or 'manifest'}: expected a table, got {type(raw).__name__}")
            raw = {}
        self.raw, self.used = raw, set[str]()

    def _key(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, types: type | tuple[type, ...], required: bool = True) -> Any:
        self.used.add(key)
        if key not in self.raw:
            if required:
                self.problems.append(f"{self._key(key)}: missing")
            return None
        value = self.raw[key]
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            ok = False  # `true` is an int to Python, never a meaningful number here
        else:
            ok = isinstance(value, types)
        if not ok:
            names = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
            self.problems.append(f"{self._key(key)}: expected {names}, got {type(value).__name__} {value!r}")
            return None
        if isinstance(value, str) and not value.strip():
            self.problems.append(f"{self._key(key)}: must not be empty")
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self.problems.append(f"{self._key(key)}: must be finite")
            return None
        return value

    def choice(self, key: str, allowed: tuple[str, ...], required: bool = True) -> Any:
        value = self.get(key, str, required)
        if value is not None and value not in allowed:
            self.problems.append(f"{self._key(key)}: unknown value {value!r} (known: {', '.join(allowed)})")
            return None
        return value

    def sha256(self, key: str) -> Any:
        value = self.get(key, str)
        if value is not None and not _SHA256_RE.fullmatch(value):
            self.problems.append(f"{self._key(key)}: expected 64 lowercase hex digits, got {value!r}")
            return None
        return value

    def time(self, key: str) -> Any:
        value = self.get(key, (dt.datetime, str))
        if isinstance(value, str):
            try:
                value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                self.problems.append(f"{self._key(key)}: not an RFC 3339 timestamp: {value!r}")
                return None
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            self.problems.append(f"{self._key(key)}: needs a UTC offset (e.g. 2025-01-01T00:00:00Z)")
            return None
        return value.astimezone(dt.UTC) if value is not None else None

    def relpath(self, key: str, required: bool = True) -> Any:
        value = self.get(key, str, required)
        if value is not None:
            problem = _relpath_problem(value)
            if problem:
                self.problems.append(f"{self._key(key)}: {problem}")
                return None
        return value

    def array(self, key: str) -> list[Any]:
        value = self.get(key, list, required=False)
        return value or []

    def finish(self) -> None:
        for key in self.raw:
            if key not in self.used:
                self.problems.append(f"{self._key(key)}: unknown key")


def _relpath_problem(value: str) -> str | None:
    p = PurePosixPath(value)
    if p.is_absolute() or "\\" in value or value != str(p) or any(part in ("..", ".") for part in p.parts):
        return f"must be a plain relative path inside the release folder, got {value!r}"
    if value in RESERVED_FILES:
        return f"{value!r} is not an artifact"
    return None


def parse_manifest(data: Any, source: str = "<manifest>", *, path: Path | None = None) -> Manifest:
    """Validate TOML-shaped ``data`` and build a :class:`Manifest`.

    Raises :class:`ManifestError` listing every problem (missing or unknown keys, bad
    values, references to artifacts that are not listed, inconsistent lineage or gates).
    """
    problems: list[str] = []
    top = _Table(data, "", problems)
    fmt = top.get("format", str)
    if fmt is not None and fmt != MANIFEST_FORMAT:
        problems.append(f"format: unsupported format {fmt!r} (this vlad reads: {MANIFEST_FORMAT})")
    if "signature" in top.raw:
        top.used.add("signature")
        problems.append("signature: signatures are detached (manifest.sig), not part of the manifest")

    t = _Table(top.get("release", dict), "release", problems)
    release = ReleaseInfo(
        id=t.get("id", str),
        version=t.get("version", str),
        version_code=t.get("version_code", int),
        not_before=t.time("not_before"),
        expires=t.time("expires"),
        description=t.get("description", str, required=False) or "",
    )
    t.finish()
    if release.id is not None and (not RELEASE_ID_RE.fullmatch(release.id) or release.id in RESERVED_IDS):
        problems.append(
            f"release.id: {release.id!r} must match {RELEASE_ID_RE.pattern} and not be one of {', '.join(RESERVED_IDS)}"
        )
    if release.version_code is not None and release.version_code < 0:
        problems.append(f"release.version_code: must be >= 0, got {release.version_code}")
    if release.not_before and release.expires and release.expires <= release.not_before:
        problems.append("release.expires: must be later than release.not_before")

    t = _Table(top.get("contract", dict), "contract", problems)
    contract = ContractRef(path=t.relpath("path"), sha256=t.sha256("sha256"))
    t.finish()

    artifacts: list[Artifact] = []
    for i, raw in enumerate(top.array("artifacts")):
        t = _Table(raw, f"artifacts[{i}]", problems)
        a = Artifact(
            path=t.relpath("path"), role=t.choice("role", ROLES), size=t.get("size", int), sha256=t.sha256("sha256")
        )
        t.finish()
        if a.size is not None and a.size < 0:
            problems.append(f"artifacts[{i}].size: must be >= 0")
        artifacts.append(a)
    if not artifacts:
        problems.append("artifacts: a release needs at least one artifact")
    by_path: dict[str, Artifact] = {}
    for i, a in enumerate(artifacts):
        if a.path in by_path:
            problems.append(f"artifacts[{i}].path: duplicate artifact {a.path!r}")
        by_path.setdefault(a.path, a)

    def listed(ref: str | None, where: str, role: tuple[str, ...] | None = None) -> None:
        if ref is None:
            return
        if ref not in by_path:
            problems.append(f"{where}: {ref!r} is not listed in [[artifacts]]")
        elif role and by_path[ref].role not in role:
            problems.append(f"{where}: artifact {ref!r} has role {by_path[ref].role!r}, expected {' or '.join(role)}")

    listed(contract.path, "contract.path", ("contract",))

    t = _Table(top.get("backend", dict), "backend", problems)
    options = t.get("options", dict, required=False) or {}
    backend = BackendSpec(name=t.get("name", str), artifact=t.relpath("artifact"), options=options)
    t.finish()
    _check_options(options, problems)
    listed(backend.artifact, "backend.artifact")

    t = _Table(top.get("runtime", dict, required=False) or {}, "runtime", problems)
    runtime = RuntimeSpec(**{k: t.get(k, str, required=False) for k in RUNTIME_KEYS})
    t.finish()

    fallback: list[FallbackEntry] = []
    for i, raw in enumerate(top.array("fallback")):
        t = _Table(raw, f"fallback[{i}]", problems)
        kind = t.choice("kind", FALLBACK_KINDS)
        ref = t.get("release", str, required=kind == "policy")
        t.finish()
        if kind != "policy" and ref is not None:
            problems.append(f"fallback[{i}].release: only a 'policy' entry names a release")
        fallback.append(FallbackEntry(kind=kind, release=ref))
    # The chain must end in a posture that needs no model: an exhausted chain has
    # nowhere else to go, and entries after "hold" could never be reached.
    kinds = [f.kind for f in fallback]
    if not fallback or kinds[-1] != "hold":
        problems.append('fallback: the chain must end with {kind = "hold"}')
    if "hold" in kinds[:-1]:
        problems.append("fallback: entries after the first 'hold' can never be reached")

    t = _Table(top.get("lineage", dict), "lineage", problems)
    lineage = Lineage(
        change=t.choice("change", CHANGE_KINDS),
        parent=t.get("parent", str, required=False),
        adapter=t.relpath("adapter", required=False),
        calibration=t.relpath("calibration", required=False),
    )
    t.finish()
    if lineage.change not in (None, "retrain") and lineage.parent is None:
        problems.append(f"lineage.parent: a {lineage.change!r} release derives from a parent; name it")
    if lineage.change == "lora_adapter" and lineage.adapter is None:
        problems.append("lineage.adapter: a 'lora_adapter' release names its adapter artifact")
    listed(lineage.adapter, "lineage.adapter", ("adapter",))
    listed(lineage.calibration, "lineage.calibration", ("calibration",))

    gates: list[GateEvidence] = []
    for i, raw in enumerate(top.array("gates")):
        t = _Table(raw, f"gates[{i}]", problems)
        g = GateEvidence(
            gate=t.choice("gate", GATES),
            report=t.relpath("report"),
            sha256=t.sha256("sha256"),
            passed=t.get("passed", bool),
        )
        t.finish()
        listed(g.report, f"gates[{i}].report", ("report",))
        if g.report in by_path and g.sha256 and by_path[g.report].sha256 != g.sha256:
            problems.append(f"gates[{i}].sha256: differs from artifact {g.report!r}")
        gates.append(g)

    t = _Table(top.get("canary", dict, required=False) or {}, "canary", problems)
    canary_values: dict[str, Any] = {}
    for key, default in CANARY_DEFAULTS.items():
        value = t.get(key, (int, float) if isinstance(default, float) else int, required=False)
        value = default if value is None else value
        if not math.isfinite(value):
            problems.append(f"canary.{key}: must be a finite number, got {value}")
            value = default
        elif value < 0:
            problems.append(f"canary.{key}: must be >= 0, got {value}")
        canary_values[key] = float(value) if isinstance(default, float) else value
    t.finish()
    if not 0 <= canary_values["max_deadline_miss_rate"] <= 1:
        problems.append("canary.max_deadline_miss_rate: a rate, must be within [0, 1]")

    gate_plan = top.get("gate_plan", dict, required=False)

    memory = None
    if "memory" in top.raw:
        t = _Table(top.get("memory", dict), "memory", problems)
        host, device = t.get("host_bytes", int), t.get("device_bytes", int)
        source = t.choice("source", MEMORY_SOURCES)
        t.finish()
        for key, value in (("host_bytes", host), ("device_bytes", device)):
            if value is not None and value < 0:
                problems.append(f"memory.{key}: must be >= 0, got {value}")
        memory = MemoryNeed(host, device, source)

    top.finish()
    if problems:
        raise ManifestError(source, problems)
    return Manifest(
        format=fmt,
        release=release,
        contract=contract,
        artifacts=tuple(artifacts),
        backend=backend,
        runtime=runtime,
        fallback=tuple(fallback),
        lineage=lineage,
        gates=tuple(gates),
        canary=CanaryPolicy(**canary_values),
        gate_plan=gate_plan,
        memory=memory,
        document=data,
        path=path,
    )


def _check_options(options: Mapping[str, Any], problems: list[str]) -> None:
    """Options go to the backend as is; the well-known ones are type-checked here."""
    for key, value in options.items():
        where = f"backend.options.{key}"
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
