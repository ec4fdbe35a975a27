"""The on-disk engine cache (pure: no TensorRT import).

A TensorRT engine is only valid for the exact ONNX, TensorRT version, GPU, precision and
optimization profile it was built with, and a mismatched engine may load and silently
compute something else. So each engine is stored under a key that hashes all of them,
beside a JSON sidecar that records the ingredients, and loading re-checks the sidecar
against the current machine: a difference is refused (``on_mismatch = "error"``, the
default) or answered by building a fresh engine (``on_mismatch = "rebuild"``); a foreign
engine is never loaded.

Layout under ``cache_dir`` (default ``/var/lib/vlad/engines``)::

    <key>.engine              serialized engine (plan)
    <key>.json                sidecar: key, ingredients, engine sha256 and size
    timing/<tkey>.cache       TensorRT timing cache for one TensorRT version + GPU + precision
    timing/<tkey>.json        its sidecar

Every file is written atomically (temporary file, fsync, rename, fsync of the folder): a
crash leaves the old file or the new one, never a torn one. The engine is written before
its sidecar, so an engine without a sidecar (interrupted store) is never loaded; it is
rebuilt over.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal, get_args

from vlad.errors import BackendError
from vlad_tensorrt.profiles import canonical_json

KEY_FORMAT = "vlad.tensorrt-key/1"
SIDECAR_FORMAT = "vlad.tensorrt-engine/1"
TIMING_FORMAT = "vlad.tensorrt-timing/1"
DEFAULT_CACHE_DIR = Path("/var/lib/vlad/engines")
OnMismatch = Literal["error", "rebuild"]  # a stored engine whose sidecar does not match this machine
ON_MISMATCH: tuple[str, ...] = get_args(OnMismatch)
# The ingredients a timing cache depends on (not the model: see timing_cache_key).
MACHINE_FIELDS = ("tensorrt_version", "gpu_name", "compute_capability", "precision")


@dataclass(frozen=True, slots=True)
class CacheIngredients:
    """Everything an engine's validity depends on; the cache key hashes all of it.

    ``profile`` is the canonical JSON of the optimization profile
    (:meth:`vlad_tensorrt.profiles.Profile.canonical_json`).
    """

    onnx_sha256: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    precision: str
    profile: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> CacheIngredients:
        """Rebuild from a sidecar's ``ingredients`` table; a malformed table is an error."""
        names = [f.name for f in fields(cls)]
        if (
            not isinstance(data, dict)
            or sorted(data) != sorted(names)
            or not all(isinstance(data[n], str) for n in names)
        ):
            raise BackendError(f"malformed ingredients in engine sidecar: {data!r}")
        return cls(**{n: data[n] for n in names})


def cache_key(ingredients: CacheIngredients) -> str:
    """sha256 (hex) over the canonical JSON of every ingredient and the key format."""
    payload = canonical_json({"format": KEY_FORMAT, **ingredients.to_dict()})
    return hashlib.sha256(payload.encode("ascii")).hexdigest()


def timing_cache_key(ingredients: CacheIngredients) -> str:
    """Key of the timing cache: TensorRT version, GPU and precision only.

    Layer timings do not depend on which model they were measured for, so a retrained
    release with the same layers reuses them and builds faster. TensorRT also checks the
    cache header itself (``set_timing_cache(..., ignore_mismatch=False)``).
    """
    d = ingredients.to_dict()
    payload = canonical_json({"format": TIMING_FORMAT, **{k: d[k] for k in MACHINE_FIELDS}})
    return hashlib.sha256(payload.encode("ascii")).hexdigest()


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 (hex) of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes, mode: int = 0o640) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new file, never a mix:
    temporary file in the same folder, fsync, rename over, fsync the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# ---------------------------------------------------------------------------------------
# Mismatch reporting
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One field where a stored engine differs from what this machine needs."""

    field: str
    engine: str | None  # what the sidecar / file says
    here: str | None  # what the current machine and release need

    def __str__(self) -> str:
        return f"{self.field}: engine {_short(self.engine)}, here {_short(self.here)}"


def _short(value: str | None, limit: int = 160) -> str:
    if value is None:
        return "(none)"
    return value if len(value) <= limit else value[: limit - 3] + "..."


class EngineMismatch(BackendError):
    """A stored engine does not belong to this machine / release; ``mismatches`` says why."""

    def __init__(self, path: Path, mismatches: list[Mismatch]) -> None:
        self.path = path
        self.mismatches = list(mismatches)
        fields_ = ", ".join(m.field for m in mismatches)
        detail = "; ".join(str(m) for m in mismatches)
        super().__init__(
            f"refusing TensorRT engine {path}: it differs in {fields_} ({detail}); "
            f'on_mismatch = "error" (set on_mismatch = "rebuild" to build a fresh engine)'
        )


def compare_ingredients(recorded: CacheIngredients, current: CacheIngredients) -> list[Mismatch]:
    """Every ingredient where ``recorded`` (a sidecar) differs from ``current``."""
    a, b = recorded.to_dict(), current.to_dict()
    return [Mismatch(k, a[k], b[k]) for k in a if a[k] != b[k]]


# ---------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------


class EngineCache:
    """Engines and timing caches under one folder, named by their keys."""

    def __init__(self, root: str | Path = DEFAULT_CACHE_DIR) -> None:
        self.root = Path(root)

    def engine_path(self, key: str) -> Path:
        return self.root / f"{key}.engine"

    def timing_path(self, ingredients: CacheIngredients) -> Path:
        return self.root / "timing" / f"{timing_cache_key(ingredients)}.cache"

    @staticmethod
    def sidecar_path(engine_path: Path) -> Path:
        return engine_path.with_suffix(".json")

    def verify(self, engine_path: Path, current: CacheIngredients) -> tuple[list[Mismatch], bytes | None]:
        """Check the engine at ``engine_path`` and its sidecar against ``current``.

        Returns the mismatches (empty when the engine may be loaded) and the engine bytes
        when they were read. Checks: sidecar present and well-formed, its key equal to the
        hash of its own ingredients, every ingredient equal to ``current``, and the engine
        file's size and sha256 equal to the recorded ones.
        """
        sidecar_path = self.sidecar_path(engine_path)
        try:
            sidecar = json.loads(sidecar_path.read_text())
        except FileNotFoundError:
            return [Mismatch("sidecar", None, str(sidecar_path))], None
        except (OSError, ValueError) as exc:
            return [Mismatch("sidecar", f"unreadable ({exc})", "a valid sidecar")], None
        if not isinstance(sidecar, dict) or sidecar.get("format") != SIDECAR_FORMAT:
            found = sidecar.get("format") if isinstance(sidecar, dict) else type(sidecar).__name__
            return [Mismatch("format", str(found), SIDECAR_FORMAT)], None
        try:
            recorded = CacheIngredients.from_dict(sidecar.get("ingredients"))
        except BackendError as exc:
            return [Mismatch("ingredients", str(exc), "a valid ingredients table")], None
        mismatches = compare_ingredients(recorded, current)
        if sidecar.get("key") != cache_key(recorded):
            # The sidecar was edited or belongs to another file: nothing in it can be trusted.
            mismatches.insert(0, Mismatch("key", str(sidecar.get("key")), cache_key(recorded)))
        if mismatches:
            return mismatches, None
        try:
            plan = engine_path.read_bytes()
        except OSError as exc:
            return [Mismatch("engine_file", f"unreadable ({exc})", str(engine_path))], None
        digest = hashlib.sha256(plan).hexdigest()
        if digest != sidecar.get("engine_sha256") or len(plan) != sidecar.get("engine_bytes"):
            return [Mismatch("engine_sha256", digest, str(sidecar.get("engine_sha256")))], None
        return [], plan

    def store(self, current: CacheIngredients, plan: bytes, *, build_seconds: float | None = None) -> Path:
        """Write ``plan`` and its sidecar under ``current``'s key (engine first)."""
        key = cache_key(current)
        path = self.engine_path(key)
        atomic_write(path, plan)
        sidecar = {
            "format": SIDECAR_FORMAT,
            "key": key,
            "ingredients": current.to_dict(),
            "engine_sha256": hashlib.sha256(plan).hexdigest(),
            "engine_bytes": len(plan),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": None if build_seconds is None else round(build_seconds, 3),
        }
        atomic_write(self.sidecar_path(path), (json.dumps(sidecar, indent=2, sort_keys=True) + "\n").encode())
        return path

    def load_timing_cache(self, current: CacheIngredients) -> bytes | None:
        """The stored timing cache for this TensorRT version, GPU and precision, if any.

        A timing cache whose sidecar disagrees is ignored (a timing cache only speeds up
        the build; TensorRT also refuses a foreign one itself).
        """
        path = self.timing_path(current)
        try:
            meta = json.loads(self.sidecar_path(path).read_text())
            data = path.read_bytes()
        except (OSError, ValueError):
            return None
        if meta.get("key") != timing_cache_key(current) or meta.get("sha256") != hashlib.sha256(data).hexdigest():
            return None
        return data

    def store_timing_cache(self, current: CacheIngredients, data: bytes) -> Path:
        """Write the serialized timing cache and its sidecar."""
        path = self.timing_path(current)
        atomic_write(path, data)
        d = current.to_dict()
        meta = {
            "format": TIMING_FORMAT,
            "key": timing_cache_key(current),
            "sha256": hashlib.sha256(data).hexdigest(),
            **{k: d[k] for k in MACHINE_FIELDS},
        }
        atomic_write(self.sidecar_path(path), (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
        return path


# ---------------------------------------------------------------------------------------
# Load-or-build policy
# ---------------------------------------------------------------------------------------

# build(timing_cache_or_None) -> (serialized engine, serialized timing cache or None)
BuildFn = Callable[[bytes | None], tuple[bytes, bytes | None]]


@dataclass(frozen=True, slots=True)
class PreparedEngine:
    """The engine a session will deserialize, and how it was obtained."""

    plan: bytes
    path: Path
    key: str
    built: bool
    build_seconds: float | None = None
    replaced: tuple[Mismatch, ...] = field(default=())  # why a stored engine was rebuilt


def prepare_engine(
    cache: EngineCache,
    current: CacheIngredients,
    build: BuildFn,
    *,
    on_mismatch: str = "error",
    pinned: Path | None = None,
    allow_build: bool = True,
) -> PreparedEngine:
    """Find a verified engine for ``current`` or build one.

    ``pinned`` (option ``engine``) names a prebuilt engine with its sidecar beside it; it
    is loaded only if its sidecar matches this machine. Otherwise the cache is looked up
    under ``cache_key(current)``. A mismatching engine raises :class:`EngineMismatch`
    (``on_mismatch="error"``) or is replaced by a fresh build in the cache
    (``"rebuild"``; a pinned file itself is never overwritten). A miss builds, unless
    ``allow_build`` is false.
    """
    if on_mismatch not in ON_MISMATCH:
        raise BackendError(f"on_mismatch must be one of {', '.join(ON_MISMATCH)}, got {on_mismatch!r}")
    key = cache_key(current)
    replaced: list[Mismatch] = []
    if pinned is not None:
        pinned = Path(pinned)
        if not pinned.is_file():
            raise BackendError(f"engine {pinned} does not exist")
        mismatches, plan = cache.verify(pinned, current)
        if not mismatches:
            return PreparedEngine(plan, pinned, key, built=False)  # type: ignore[arg-type]
        if on_mismatch == "error":
            raise EngineMismatch(pinned, mismatches)
        replaced = mismatches
    path = cache.engine_path(key)
    if path.is_file() and cache.sidecar_path(path).is_file():
        mismatches, plan = cache.verify(path, current)
        if not mismatches and not replaced:
            return PreparedEngine(plan, path, key, built=False)  # type: ignore[arg-type]
        if not mismatches:
            # A pinned engine was refused but the cache already holds a verified one.
            return PreparedEngine(plan, path, key, built=False, replaced=tuple(replaced))  # type: ignore[arg-type]
        if on_mismatch == "error":
            raise EngineMismatch(path, mismatches)
        replaced = replaced or mismatches
    if not allow_build:
        raise BackendError(
            f"no TensorRT engine for cache key {key} in {cache.root} and allow_build is false; "
            f"build it on this machine with `python -m vlad_tensorrt build` (see docs/tensorrt.md)"
        )
    started = time.monotonic()
    plan, timing = build(cache.load_timing_cache(current))
    seconds = time.monotonic() - started
    if timing:
        cache.store_timing_cache(current, timing)
    stored = cache.store(current, plan, build_seconds=seconds)
    return PreparedEngine(plan, stored, key, built=True, build_seconds=seconds, replaced=tuple(replaced))
