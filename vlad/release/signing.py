"""Release signatures and release verification.

A release is signed with Ed25519 over the raw bytes of its ``manifest.toml``; the
signature is detached in ``manifest.sig`` (JSON: format ``vlad.signature/2``, key_id,
algorithm, signature in base64, signed_at, manifest_sha256). Verification reads both
files defensively (regular files only, capped sizes) and checks the signature before the
manifest's TOML is parsed, so an unsigned or tampered file never reaches the parser.
Any edit to ``manifest.toml``, a comment included, needs a new signature. Trusted public keys are ``*.pub`` files (PEM or raw base64) in a keys
folder, ``/etc/vlad/keys.d`` by default; a key's id is the first 16 hex digits of the
sha256 of its raw 32 public-key bytes, so file names are free.

:func:`verify_release` is what the daemon and the store call before trusting a folder:
signature, validity window, every artifact's size and sha256 (and no extra files, no
symbolic link at any depth, no ONNX external data outside the listed artifacts), contract
consistency and runtime compatibility. It refuses with an error that names exactly what
failed. It is two steps, each usable alone: :func:`authenticate` (the signature checked
and the manifest parsed: a :class:`SignedManifest`) and :func:`verify_signed` (the rest,
on that manifest), so an operation that sizes a release from its manifest before it
copies the files (the daemon's deploy) checks the signature and parses once. Gate evidence is judged apart
(:mod:`vlad.release.evidence`): a failed gate is not an integrity failure, an operator may
override it with a recorded reason.

Public API: :func:`generate_keypair`, :func:`key_id`, :func:`load_private_key`,
:func:`load_public_key`, :func:`load_trusted_keys`, :func:`sign_release`,
:func:`read_signature`, :func:`authenticate` -> :class:`SignedManifest`,
:func:`verify_release` / :func:`verify_signed` -> :class:`VerifiedRelease`, :func:`check_window`,
:func:`installed_runtime`, :func:`check_runtime`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import hashlib
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import TypeVar, cast

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from vlad.errors import ContractError, ProblemsError, VladError
from vlad.files import FileRefused, read_bytes, read_bytes_beneath
from vlad.release.artifacts import FileCheck, Progress, hash_artifacts
from vlad.release.external_data import external_data_problems, release_models
from vlad.release.manifest import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    RESERVED_FILES,
    SIGNATURE_FILE,
    Manifest,
    ManifestError,
    RuntimeSpec,
    parse_document,
    parse_manifest,
    read_manifest_bytes,
    rfc3339,
)

__all__ = [
    "ALGORITHM",
    "DEFAULT_KEYS_DIR",
    "SIGNATURE_FORMAT",
    "BadSignature",
    "IntegrityError",
    "KeyFileError",
    "RuntimeMismatch",
    "Signature",
    "SignatureError",
    "TrustedKey",
    "UnknownKey",
    "UnsignedRelease",
    "SignedManifest",
    "ValidityError",
    "VerifiedRelease",
    "authenticate",
    "check_runtime",
    "check_window",
    "generate_keypair",
    "installed_runtime",
    "key_id",
    "load_private_key",
    "load_public_key",
    "load_trusted_keys",
    "read_signature",
    "sign_release",
    "verify_release",
    "verify_signed",
]

ALGORITHM = "ed25519"
SIGNATURE_FORMAT = "vlad.signature/2"
# A signature file is a few hundred bytes.
MAX_SIGNATURE_BYTES = 64 * 1024
DEFAULT_KEYS_DIR = Path("/etc/vlad/keys.d")


class SignatureError(VladError):
    """A release is unsigned, signed by an untrusted key, or its signature does not verify."""


class UnsignedRelease(SignatureError):
    """The release folder has no (readable) ``manifest.sig``."""


class UnknownKey(SignatureError):
    """The signature names a key that is not among the trusted keys."""


class BadSignature(SignatureError):
    """The signature does not verify: the manifest changed after signing, or the file is corrupt."""


class KeyFileError(VladError):
    """A key file or the trusted-keys folder is missing, unreadable, malformed or unsafe."""


class ValidityError(VladError):
    """The release is outside its validity window (expired or not yet valid)."""


class IntegrityError(ProblemsError):
    """Release files differ from the manifest (size, hash, missing or extra files, contract)."""


class RuntimeMismatch(VladError):
    """An installed runtime's major version differs from the one the release was validated on."""


# ---- keys -----------------------------------------------------------------------------


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """First 16 hex digits of the sha256 of the raw 32-byte public key."""
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return hashlib.sha256(_raw_public(key)).hexdigest()[:16]


def _read_key_text(path: Path) -> bytes:
    try:
        return path.read_bytes().strip()
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read key: {exc.strerror or exc}") from exc


_Key = TypeVar("_Key", Ed25519PublicKey, Ed25519PrivateKey)


def _load_key(
    path: str | Path, want: type, raw: Callable[[bytes], _Key], pem: Callable[[bytes], object], forms: str
) -> _Key:
    """A key of type ``want`` from a PEM file (possibly after explanatory lines) or a file
    holding base64 of its raw bytes; ``forms`` names the two for the error line."""
    what = f"an Ed25519 {'public' if want is Ed25519PublicKey else 'private'} key"
    path = Path(path)
    text = _read_key_text(path)
    try:
        key = pem(text) if b"-----BEGIN" in text else raw(base64.b64decode(text, validate=True))
    except (ValueError, binascii.Error, TypeError) as exc:
        raise KeyFileError(f"{path}: not {what} ({forms}): {exc}") from exc
    if not isinstance(key, want):
        raise KeyFileError(f"{path}: a {type(key).__name__}, expected {what}")
    return cast(_Key, key)  # want is _Key's class (abstract, so not typed as type[_Key])


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file or a file holding its raw 32 bytes in base64."""
    return _load_key(
        path,
        Ed25519PublicKey,
        Ed25519PublicKey.from_public_bytes,
        serialization.load_pem_public_key,
        "PEM or base64 of its 32 bytes",
    )


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """An Ed25519 private key from an unencrypted PKCS#8 PEM file or base64 of its 32-byte seed."""
    return _load_key(
        path,
        Ed25519PrivateKey,
        Ed25519PrivateKey.from_private_bytes,
        lambda text: serialization.load_pem_private_key(text, password=None),
        "unencrypted PKCS#8 PEM or base64 of its 32-byte seed",
    )


def generate_keypair(out_dir: str | Path, name: str | None = None) -> tuple[str, Path, Path]:
    """Make a new key pair in ``out_dir``: ``NAME.key`` (mode 0600) and ``NAME.pub``.

    ``name`` defaults to the key id. Existing files are never overwritten. Returns
    ``(key_id, private_path, public_path)``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    kid = key_id(private)
    name = name or kid
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise KeyFileError(f"key name {name!r}: use letters, digits, '.', '_' or '-'")
    priv_path, pub_path = out / f"{name}.key", out / f"{name}.pub"
    for p in (priv_path, pub_path):
        if p.exists():
            raise KeyFileError(f"{p}: already exists; choose another --name or folder")
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Created 0600 from the start (O_EXCL), so the secret is never readable by others.
    fd = os.open(priv_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pub_path.write_bytes(pub_pem)
    return kid, priv_path, pub_path


@dataclass(frozen=True, slots=True)
class TrustedKey:
    """A public key from the keys folder."""

    key_id: str
    path: Path
    key: Ed25519PublicKey


def load_trusted_keys(keys_dir: str | Path = DEFAULT_KEYS_DIR) -> dict[str, TrustedKey]:
    """Every ``*.pub`` in ``keys_dir`` by key id.

    Refuses (:class:`KeyFileError`) a missing folder, an unreadable or malformed key, and
    a folder or key file that anyone may write: whoever can add a key can sign releases.
    """
    folder = Path(keys_dir)
    if not folder.is_dir():
        raise KeyFileError(f"trusted keys folder {folder} does not exist (see docs/releases.md)")
    _refuse_world_writable(folder)
    keys: dict[str, TrustedKey] = {}
    for path in sorted(folder.glob("*.pub")):
        _refuse_world_writable(path)
        key = load_public_key(path)
        keys[key_id(key)] = TrustedKey(key_id(key), path, key)
    return keys


def _refuse_world_writable(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & stat.S_IWOTH and not (path.is_dir() and mode & stat.S_ISVTX):
        raise KeyFileError(f"{path} is writable by anyone; refusing to trust it (chmod o-w)")


# ---- signatures -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Signature:
    """The content of ``manifest.sig``. ``signed_at`` is informational and not signed."""

    key_id: str
    algorithm: str
    signature: bytes
    signed_at: str | None = None
    manifest_sha256: str | None = None

    def to_json(self) -> str:
        """The ``manifest.sig`` file text."""
        return (
            json.dumps(
                {
                    "format": SIGNATURE_FORMAT,
                    "key_id": self.key_id,
                    "algorithm": self.algorithm,
                    "signature": base64.b64encode(self.signature).decode("ascii"),
                    "signed_at": self.signed_at,
                    "manifest_sha256": self.manifest_sha256,
                },
                indent=2,
            )
            + "\n"
        )


def sign_release(
    release_dir: str | Path, private_key: str | Path | Ed25519PrivateKey, now: dt.datetime | None = None
) -> Signature:
    """Sign ``release_dir/manifest.toml`` and write ``manifest.sig`` (atomic replace).

    Only signs: the manifest is validated first (an invalid manifest is never signed),
    but sizes and hashes are not recomputed (``vladctl manifest update-hashes`` does that).
    """
    root = Path(release_dir)
    key = private_key if isinstance(private_key, Ed25519PrivateKey) else load_private_key(private_key)
    payload = read_manifest_bytes(root)
    parse_manifest(parse_document(payload, str(root / MANIFEST_FILE)), str(root / MANIFEST_FILE))
    sig = Signature(
        key_id=key_id(key),
        algorithm=ALGORITHM,
        signature=key.sign(payload),
        signed_at=rfc3339((now or dt.datetime.now(dt.UTC)).replace(microsecond=0)),
        manifest_sha256=hashlib.sha256(payload).hexdigest(),
    )
    tmp = root / f".{SIGNATURE_FILE}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(sig.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / SIGNATURE_FILE)
    return sig


def read_signature(path: str | Path) -> Signature:
    """Parse a ``manifest.sig`` (or the one in a release folder).

    :class:`UnsignedRelease` when it is absent, :class:`BadSignature` when malformed.
    """
    path = Path(path)
    folder = path if path.is_dir() else None
    return _parse_signature(_read_signature_bytes(path, folder), path / SIGNATURE_FILE if folder else path)


def _read_signature_bytes(path: Path, folder: Path | None) -> bytes:
    where = path / SIGNATURE_FILE if folder is not None else path
    try:
        if folder is not None:
            return read_bytes_beneath(folder, SIGNATURE_FILE, MAX_SIGNATURE_BYTES)
        return read_bytes(path, MAX_SIGNATURE_BYTES)
    except FileNotFoundError as exc:
        raise UnsignedRelease(f"{where.parent}: unsigned release (no {SIGNATURE_FILE})") from exc
    except FileRefused as exc:
        raise BadSignature(str(exc)) from exc
    except OSError as exc:
        raise UnsignedRelease(f"{where}: cannot read signature: {exc}") from exc


def _parse_signature(raw: bytes, path: Path) -> Signature:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsignedRelease(f"{path}: cannot read signature: {exc}") from exc
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        fmt = data.get("format")
        if fmt != SIGNATURE_FORMAT:
            raise BadSignature(
                f"{path}: signature format {fmt!r} is not {SIGNATURE_FORMAT!r} "
                "(re-sign the release with `vladctl sign`)"
            )
        sig = Signature(
            key_id=str(data["key_id"]),
            algorithm=str(data["algorithm"]),
            signature=base64.b64decode(data["signature"], validate=True),
            signed_at=data.get("signed_at"),
            manifest_sha256=data.get("manifest_sha256"),
        )
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise BadSignature(f"{path}: malformed signature file ({type(exc).__name__}: {exc})") from exc
    if sig.algorithm != ALGORITHM:
        raise BadSignature(f"{path}: algorithm {sig.algorithm!r} is not supported (only {ALGORITHM})")
    return sig


# ---- runtime compatibility ------------------------------------------------------------

# Distributions that provide each runtime; the GPU builds have their own names.
_DISTRIBUTIONS = {
    "torch": ("torch",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "tensorrt": ("tensorrt", "tensorrt-cu12", "tensorrt-cu11", "tensorrt-libs"),
}


def installed_runtime() -> RuntimeSpec:
    """Versions installed here, from package metadata (nothing heavy is imported).

    ``cuda`` and ``gpu`` are left None: they need the runtime loaded, which the backend does.
    """
    found: dict[str, str | None] = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name, dists in _DISTRIBUTIONS.items():
        found[name] = None
        for dist in dists:
            try:
                found[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return RuntimeSpec(**found)


def _major_minor(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2])


def check_runtime(validated: RuntimeSpec, installed: RuntimeSpec) -> list[str]:
    """Compare the validated runtime with the installed one.

    Raises :class:`RuntimeMismatch` for a different *major* version (its behaviour and file
    formats may differ); returns warning lines for a different minor version and for a
    validated runtime that is not installed here (the backend that needs it will refuse).
    ``cuda`` and ``gpu`` are informational.
    """
    warnings, errors = [], []
    for name in ("python", "torch", "onnxruntime", "tensorrt"):
        want, have = getattr(validated, name), getattr(installed, name)
        if want is None:
            continue
        if have is None:
            warnings.append(f"{name}: validated on {want}, not installed here")
            continue
        w, h = _major_minor(want), _major_minor(have)
        if w[:1] != h[:1]:
            errors.append(f"{name} {have} installed, release validated on {want} (major version differs)")
        elif w != h:
            warnings.append(f"{name}: validated on {want}, installed {have} (minor version differs)")
    if errors:
        raise RuntimeMismatch("; ".join(errors))
    return warnings


# ---- verification ---------------------------------------------------------------------

# Only this module makes a SignedManifest or a VerifiedRelease: the steps after it (staging,
# loading, activation) trust one by its type, so a value of either type is always one that
# this module's checks produced.
_SEAL = object()


def _sealed(value: object, seal: object) -> None:
    if seal is not _SEAL:
        raise TypeError(f"a {type(value).__name__} is made only by vlad.release.signing (authenticate, verify_release)")


@dataclass(frozen=True, slots=True)
class SignedManifest:
    """A manifest whose raw bytes a trusted key signed, parsed once: :func:`authenticate`'s result.

    ``raw`` and ``signature_raw`` are the bytes that were checked; a copy written from them
    (the store's staging) holds the signed manifest without a second check."""

    folder: Path
    raw: bytes
    signature_raw: bytes
    signature: Signature
    manifest: Manifest
    key: TrustedKey
    _seal: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        _sealed(self, self._seal)

    @property
    def id(self) -> str:
        """The release id."""
        return self.manifest.release.id


@dataclass(frozen=True, slots=True)
class VerifiedRelease:
    """A release folder that passed :func:`verify_release`, with what was checked."""

    path: Path
    manifest: Manifest
    contract: object  # vlad.contract.Contract (imported lazily); None when files were not checked
    key_id: str
    key_path: Path
    signature: Signature
    warnings: tuple[str, ...]
    verified_at: dt.datetime
    # What was hashed, per artifact, with the file's identity: later steps of the same
    # operation pass it back as ``known`` instead of hashing again (vlad.release.artifacts).
    files: Mapping[str, FileCheck] = field(default_factory=dict)
    hashing: str = ""  # "verifying ID: 9 file(s), 8.4 MB in 0.01 s (0.84 GB/s)"
    hashed_bytes: int = 0  # bytes this verification read and hashed (0: every identity known)
    hash_seconds: float = 0.0
    signed: SignedManifest | None = None  # the authenticated manifest bytes this verification rests on
    _seal: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        _sealed(self, self._seal)

    @property
    def id(self) -> str:
        """The release id."""
        return self.manifest.release.id

    def moved(self, path: Path) -> VerifiedRelease:
        """The same verification of the folder renamed to ``path`` (a rename within one file
        system keeps every file's identity, so :attr:`files` still describes them). The
        contract loaded from the old folder names files there: left out (None)."""
        return dataclasses.replace(self, path=path, contract=None)


def authenticate(path: str | Path, keys_dir: str | Path = DEFAULT_KEYS_DIR) -> SignedManifest:
    """The release folder's manifest, once its signature by a trusted key checks out.

    Reads ``manifest.sig`` and ``manifest.toml`` once, checks the signature over the raw
    bytes (:class:`UnsignedRelease`, :class:`UnknownKey`, :class:`BadSignature`), then
    parses them (:class:`~vlad.release.manifest.ManifestError`): an unsigned or tampered
    manifest never reaches the parser. The one signature check and parse of an operation.
    """
    folder = Path(path).resolve()
    source = f"release {folder}"
    if not folder.is_dir():
        raise ManifestError(str(folder), ["no such release folder"])
    signature_raw = _read_signature_bytes(folder, folder)
    signature = _parse_signature(signature_raw, folder / SIGNATURE_FILE)
    raw = read_manifest_bytes(folder)
    keys = load_trusted_keys(keys_dir)
    trusted = keys.get(signature.key_id)
    if trusted is None:
        known_keys = ", ".join(f"{k} ({t.path.name})" for k, t in keys.items()) or "none"
        raise UnknownKey(
            f"{source}: signed by unknown key {signature.key_id} (trusted keys in {keys_dir}: {known_keys})"
        )
    try:
        trusted.key.verify(signature.signature, raw)
    except InvalidSignature as exc:
        raise BadSignature(
            f"{source}: signature by key {signature.key_id} does not match "
            f"{MANIFEST_FILE} (edited after signing, or {SIGNATURE_FILE} corrupt)"
        ) from exc
    document = parse_document(raw, str(folder / MANIFEST_FILE))
    manifest = parse_manifest(document, str(folder / MANIFEST_FILE), path=folder / MANIFEST_FILE)
    return SignedManifest(folder, raw, signature_raw, signature, manifest, trusted, _seal=_SEAL)


def check_window(manifest: Manifest, now: dt.datetime, source: str) -> None:
    """:class:`ValidityError` unless ``now`` lies in the release's validity window."""
    rel = manifest.release
    if now < rel.not_before:
        raise ValidityError(
            f"{source}: {rel.id} not valid before {rfc3339(rel.not_before)} (now {rfc3339(now)}; check the clock)"
        )
    if now >= rel.expires:
        raise ValidityError(f"{source}: {rel.id} expired at {rfc3339(rel.expires)} (now {rfc3339(now)})")


def verify_release(
    path: str | Path,
    keys_dir: str | Path = DEFAULT_KEYS_DIR,
    now: dt.datetime | None = None,
    *,
    check_time: bool = True,
    installed: RuntimeSpec | None = None,
    known: Mapping[str, FileCheck] | None = None,
    progress: Progress | None = None,
    check_files: bool = True,
) -> VerifiedRelease:
    """Verify the release folder ``path`` completely, or raise naming what failed:
    :func:`authenticate`, then :func:`verify_signed` (see both)."""
    if now is not None and now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return verify_signed(
        authenticate(path, keys_dir),
        now,
        check_time=check_time,
        installed=installed,
        known=known,
        progress=progress,
        check_files=check_files,
    )


def verify_signed(
    signed: SignedManifest,
    now: dt.datetime | None = None,
    *,
    folder: Path | None = None,
    check_time: bool = True,
    installed: RuntimeSpec | None = None,
    known: Mapping[str, FileCheck] | None = None,
    progress: Progress | None = None,
    check_files: bool = True,
) -> VerifiedRelease:
    """Everything :func:`verify_release` checks after the signature, on a manifest
    :func:`authenticate` already checked and parsed (neither is done again).

    In order: the validity window at ``now`` (:class:`ValidityError`; skipped with
    ``check_time=False``, as for a rollback); every artifact's size and sha256, missing,
    extra or symlinked files (at any depth: nothing is opened through a link), contract and
    tokenizer hashes, ONNX external data that is not a listed artifact
    (:mod:`vlad.release.external_data`; one :class:`IntegrityError` listing all); then the
    runtime against ``installed`` (default: :func:`installed_runtime`):
    :class:`RuntimeMismatch` for a major difference, a warning line in the result for a
    minor one.

    ``folder``: another folder holding the same release, the store's copy written from
    ``signed``'s bytes; its ``manifest.toml`` and ``manifest.sig`` must be those very bytes
    (compared, not checked again). ``known``: the :attr:`VerifiedRelease.files` of an
    earlier step of the same operation; a file still the very one hashed then is not hashed
    again. ``progress`` gets a line a second while hashing. ``check_files=False`` stops
    after the window (staging hashes while it copies).
    """
    where = signed.folder if folder is None else folder.resolve()
    source = f"release {where}"
    now = now or dt.datetime.now(dt.UTC)
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    manifest = signed.manifest
    rel = manifest.release
    if where != signed.folder:
        _same_signed_bytes(signed, where, source)
    if check_time:
        check_window(manifest, now, source)

    files: Mapping[str, FileCheck] = {}
    hashing, hashed_bytes, hash_seconds = "", 0, 0.0
    contract = None
    if check_files:
        result = hash_artifacts(
            where,
            ((a.path, a.size, a.sha256) for a in manifest.artifacts),
            known=known,
            progress=progress,
            what=f"verifying {rel.id}",
        )
        files, hashing, hashed_bytes, hash_seconds = result.checks, result.summary, result.hashed_bytes, result.seconds
        problems = result.problems + extra_files(where, manifest)
        if not problems:
            contract, contract_problems = _check_contract(where, manifest)
            problems += contract_problems
            # What the models read at load besides themselves: listed artifacts only.
            listed = {a.path for a in manifest.artifacts}
            problems += external_data_problems(where, release_models(manifest), listed, files)
        if problems:
            raise IntegrityError(source, problems)

    try:
        warnings = check_runtime(manifest.runtime, installed or installed_runtime())
    except RuntimeMismatch as exc:
        raise RuntimeMismatch(f"{source}: {exc}") from exc
    return VerifiedRelease(
        path=where,
        manifest=manifest,
        contract=contract,
        key_id=signed.key.key_id,
        key_path=signed.key.path,
        signature=signed.signature,
        warnings=tuple(warnings),
        verified_at=now,
        files=files,
        hashing=hashing,
        hashed_bytes=hashed_bytes,
        hash_seconds=hash_seconds,
        signed=signed,
        _seal=_SEAL,
    )


def _same_signed_bytes(signed: SignedManifest, folder: Path, source: str) -> None:
    """``folder``'s manifest and signature are the bytes ``signed`` authenticated."""
    problems = []
    for name, limit, expected in (
        (MANIFEST_FILE, MAX_MANIFEST_BYTES, signed.raw),
        (SIGNATURE_FILE, MAX_SIGNATURE_BYTES, signed.signature_raw),
    ):
        try:
            same = read_bytes_beneath(folder, name, limit) == expected
        except (OSError, FileRefused) as exc:
            problems.append(f"{name}: cannot read ({exc})")
            continue
        if not same:
            problems.append(f"{name}: not the bytes authenticated for release {signed.id}")
    if problems:
        raise IntegrityError(source, problems)


def extra_files(folder: Path, manifest: Manifest) -> list[str]:
    """Entries of the folder that are not listed artifacts: unlisted files, and symbolic
    links anywhere (never followed: a linked sub-folder is reported, not entered)."""
    listed = {a.path for a in manifest.artifacts}
    problems: list[str] = []

    def fail(exc: OSError) -> None:
        problems.append(f"{Path(exc.filename or '?').name}: cannot list ({exc.strerror or exc})")

    # followlinks=False: a link to a folder is listed among the folders, never entered.
    for top, dirs, names in os.walk(folder, onerror=fail, followlinks=False):
        rel_top = Path(top).relative_to(folder)
        for name in sorted(dirs + names):
            p = Path(top) / name
            rel = (rel_top / name).as_posix()
            if p.is_symlink():
                problems.append(f"{rel}: is a symbolic link (a release holds its own files)")
            elif name in names and rel not in listed and rel not in RESERVED_FILES:
                problems.append(f"{rel}: not listed in the manifest")
    return problems


def _check_contract(folder: Path, manifest: Manifest) -> tuple[object, list[str]]:
    from vlad.contract import load_contract

    try:
        contract = load_contract(folder / manifest.contract.path)
    except ContractError as exc:
        return None, [f"contract: {exc}"]
    problems = []
    if contract.sha256 != manifest.contract.sha256:
        problems.append(
            f"contract {manifest.contract.path}: canonical sha256 {contract.sha256[:16]}… "
            f"differs from manifest {manifest.contract.sha256[:16]}…"
        )
    lang = contract.language
    if lang is not None:
        # language.file is relative to the contract file, artifacts to the release folder.
        tok_path = (PurePosixPath(manifest.contract.path).parent / lang.file).as_posix()
        try:
            tok = manifest.artifact(tok_path)
        except KeyError:
            problems.append(f"tokenizer {tok_path} (named by the contract) is not a release artifact")
        else:
            if tok.sha256 != lang.sha256:
                problems.append(f"tokenizer {lang.file}: sha256 differs from the contract's language.sha256")
    return contract, problems
