"""The on-robot release store: verified copies, ``active``/``previous`` pointers, a journal.

Layout under the root (``/var/lib/vlad`` by default; docs/releases.md explains it)::

    releases/<release_id>/      verified, read-only copies (manifest, signature, artifacts)
    releases/active             -> ../current/active     (fixed links: the daemon reads
    releases/previous           -> ../current/previous    releases/active)
    current                     -> .ptr-<n>               the ONE switched pointer
    .ptr-<n>/active             -> ../releases/<id>
    .ptr-<n>/previous           -> ../releases/<id>
    engines/<cache_key>/        engine caches built on this robot (never removed here)
    history.jsonl               journal of activations and rollbacks (intent, then done)

One verification per operation: staging (or :meth:`ReleaseStore.verify_staged`, for a
release already here) checks the signature and parses the manifest once
(:func:`~vlad.release.signing.authenticate`), hashes each artifact once (while it copies),
and judges the gate evidence once, into a :class:`StagedRelease`. :meth:`ReleaseStore.admit`
applies the evidence rule (:mod:`vlad.release.evidence`: passing evidence, or ``force``
with a reason, recorded in the journal with what it overrode) once, into an
:class:`Admission`; activation and rollback take it as it is, comparing only file
identities (:mod:`vlad.release.artifacts`). Only the store makes either type, so a value of
one is one the store's checks produced.

Atomicity: a release directory becomes visible only by ``rename`` of a complete,
re-verified temp copy; ``active`` and ``previous`` switch together by renaming one
symlink (``current``) over the old one after the new generation directory and the temp
link are fsynced. A kill at any instant therefore leaves the old or the new pair, never a
mix, and never a half-copied release under its name. The pointers are authoritative; the
journal is written ahead (intent) and completed (done) and reconciled with the pointers
when a store is opened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import getpass
import json
import os
import re
import secrets
import shutil
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlad.errors import VladError
from vlad.files import read_bytes_beneath
from vlad.release.artifacts import FileCheck, Progress, copy_artifacts, hash_artifacts
from vlad.release.evidence import Evidence, judge_evidence, require_evidence
from vlad.release.manifest import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    RELEASE_ID_RE,
    SIGNATURE_FILE,
    Manifest,
    rfc3339,
)
from vlad.release.signing import (
    DEFAULT_KEYS_DIR,
    MAX_SIGNATURE_BYTES,
    IntegrityError,
    SignedManifest,
    ValidityError,
    VerifiedRelease,
    authenticate,
    check_window,
    verify_signed,
)
from vlad.schema import LINE_MAX_LEN, line_problem, one_line

__all__ = [
    "DEFAULT_ROOT",
    "Admission",
    "DowngradeRefused",
    "HistoryEntry",
    "ReleaseStore",
    "StagedRelease",
    "StoreError",
    "default_operator",
]

DEFAULT_ROOT = Path("/var/lib/vlad")
_PTR_RE = re.compile(r"\.ptr-(\d+)")
_CACHE_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")

# Tests set this (in a subprocess) to a crash point name to SIGKILL the process there.
# Points: stage_copied, stage_renamed, intent_logged, pointer_dir_written,
# pointer_temp_written, after_rename, done_logged.
_CRASH_AT: str | None = None


def _crash_point(name: str) -> None:
    if _CRASH_AT == name:
        os.kill(os.getpid(), signal.SIGKILL)


class StoreError(VladError):
    """A store operation was refused or the store is unusable."""


class DowngradeRefused(StoreError):
    """Activating an older, never-activated release (or one marked bad) without ``force``."""


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One completed activation or rollback from ``history.jsonl``."""

    seq: int
    time: str
    event: str  # "activate" | "rollback"
    who: str
    why: str
    from_release: str | None
    to_release: str
    from_version_code: int | None
    to_version_code: int | None
    forced: bool = False
    recovered: bool = False
    # Gate evidence of to_release when it was made active: "passed", "missing" or
    # "failed" (then forced); None in records written before the journal kept it.
    evidence: str | None = None
    evidence_problems: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()  # what ``forced`` overrode, one line each

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> HistoryEntry:
        """The entry of a journal record, its text safe to print whoever wrote it: every
        control or format character escaped, ``who``, ``why`` and the other single values
        cut at :data:`~vlad.schema.LINE_MAX_LEN` characters (a journal written before the
        store refused such text may hold any; the journal itself keeps what was written)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in record.items():
            if key not in names:
                continue
            if isinstance(value, list):
                value = tuple(one_line(v, None) if isinstance(v, str) else v for v in value)
            elif isinstance(value, str):
                value = one_line(value, LINE_MAX_LEN)
            values[key] = value
        return cls(**values)

    def flags(self) -> str:
        """`` [forced: evidence missing, downgrade]`` etc. for one-line listings."""
        out = []
        if self.forced:
            what = [o.split(":", 1)[0] for o in self.overrides]
            out.append(f"[forced: {', '.join(what)}]" if what else "[forced]")
        if self.evidence is None:
            out.append("[evidence not recorded]")
        if self.recovered:
            out.append("[recovered]")
        return (" " + " ".join(out)) if out else ""


def default_operator() -> str:
    """Who is acting: ``$VLAD_OPERATOR``, else ``$SUDO_USER``, else the login name."""
    for var in ("VLAD_OPERATOR", "SUDO_USER"):
        if os.environ.get(var):
            return os.environ[var]
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid:{os.getuid()}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _extra_files(src: SignedManifest) -> list[str]:
    from vlad.release.signing import extra_files

    return extra_files(src.folder, src.manifest)


# Only the store makes a StagedRelease or an Admission (see _Sealed).
_SEAL = object()


class _Sealed:
    """A value activation trusts by its type: made only by :class:`ReleaseStore`."""

    __slots__ = ()

    def __post_init__(self) -> None:
        if getattr(self, "_seal", None) is not _SEAL:
            raise TypeError(f"a {type(self).__name__} is made only by a ReleaseStore")


@dataclass(frozen=True, slots=True)
class StagedRelease(_Sealed):
    """A release in the store, verified once: signature checked and manifest parsed
    (:func:`~vlad.release.signing.authenticate`), every file hashed (while it was copied,
    or in place), gate evidence judged (:func:`~vlad.release.evidence.judge_evidence`).

    Made only by :meth:`ReleaseStore.stage_release` and :meth:`ReleaseStore.verify_staged`;
    the loader and activation take it as it is and derive none of it again."""

    verified: VerifiedRelease  # of the store's copy (releases/<id>)
    evidence: Evidence
    hashing: str  # the hashing's summary line ("copying and hashing: 9 file(s), ...")
    hashed_bytes: int  # bytes read and hashed to stage or verify it
    _seal: object = field(default=None, repr=False, compare=False)

    @property
    def id(self) -> str:
        return self.verified.id

    @property
    def path(self) -> Path:
        return self.verified.path

    @property
    def manifest(self) -> Manifest:
        return self.verified.manifest

    @property
    def files(self) -> Mapping[str, FileCheck]:
        return self.verified.files


@dataclass(frozen=True, slots=True)
class Admission(_Sealed):
    """A staged release cleared to become active: its gate evidence passed, or ``force``
    with a reason overrides it (:func:`~vlad.release.evidence.require_evidence`, applied
    once, by :meth:`ReleaseStore.admit`). ``evidence`` is what the journal records."""

    release: StagedRelease
    who: str
    why: str
    force: bool
    evidence: dict[str, Any]
    _seal: object = field(default=None, repr=False, compare=False)

    @property
    def overrides(self) -> list[str]:
        """What ``force`` overrides of the evidence, one line each (empty: nothing)."""
        if self.evidence["evidence"] == "passed":
            return []
        return [f"evidence {self.evidence['evidence']}: " + "; ".join(self.evidence.get("evidence_problems", []))]


def _operator_text(who: str | None, why: str) -> str:
    """``who`` (default: :func:`default_operator`), once it and ``why`` are each one line of
    text: :func:`vlad.schema.line_problem`, the rule the daemon's control server applies to
    the same arguments, so every path to "active" records the same kind of text."""
    who = who or default_operator()
    for name, value in (("who", who), ("why", why)):
        problem = line_problem(value) if isinstance(value, str) else "expected a string"
        if problem is not None:
            raise StoreError(f"--{name}: {problem}")
    return who


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ReleaseStore:
    """Verified releases under ``root`` with atomically switched ``active``/``previous``.

    Opening a store it may write to cleans what an interrupted operation left behind
    (temp copies, pointer temps, unfinished journal records); see :meth:`recover`.
    """

    def __init__(
        self,
        root: str | Path = DEFAULT_ROOT,
        keys_dir: str | Path = DEFAULT_KEYS_DIR,
        *,
        create: bool = True,
        recover: bool = True,
        lock_timeout_s: float = 5.0,
    ) -> None:
        self.root = Path(root)
        self.keys_dir = Path(keys_dir)
        self.lock_timeout_s = lock_timeout_s
        self.releases_dir = self.root / "releases"
        self.engines_dir = self.root / "engines"
        self.history_path = self.root / "history.jsonl"
        if create:
            for d in (self.root, self.releases_dir, self.engines_dir):
                d.mkdir(parents=True, exist_ok=True)
        elif not self.releases_dir.is_dir():
            raise StoreError(f"{self.root}: not a release store (no releases/)")
        if recover and os.access(self.root, os.W_OK):
            self.recover()

    # ---- reading ---------------------------------------------------------------------

    def release_path(self, release_id: str) -> Path:
        """The folder of a staged release (StoreError for an invalid or unknown id)."""
        if not RELEASE_ID_RE.fullmatch(release_id) or release_id in ("active", "previous"):
            raise StoreError(f"{release_id!r} is not a release id")
        path = self.releases_dir / release_id
        if path.is_symlink() or not path.is_dir():
            raise StoreError(
                f"release {release_id} is not staged in {self.releases_dir} "
                f"(staged: {', '.join(self.list_releases()) or 'none'})"
            )
        return path

    def list_releases(self) -> list[str]:
        """Ids of the staged releases (temp copies and the pointer links are not releases)."""
        return sorted(
            p.name
            for p in self.releases_dir.iterdir()
            if not p.name.startswith(".") and not p.is_symlink() and p.is_dir()
        )

    def _pointer(self, name: str) -> str | None:
        try:
            return Path(os.readlink(self.root / "current" / name)).name
        except (FileNotFoundError, NotADirectoryError):
            return None

    def active(self) -> str | None:
        """The active release id, or None before the first activation."""
        return self._pointer("active")

    def previous(self) -> str | None:
        """The release a rollback returns to, or None."""
        return self._pointer("previous")

    def active_path(self) -> Path | None:
        """The active release's folder, resolved once: read files through this, not the link."""
        active = self.active()
        return self.releases_dir / active if active else None

    def engine_cache_dir(self, cache_key: str) -> Path:
        """``engines/<cache_key>/`` (created): where a backend keeps engines built on this robot."""
        if not _CACHE_KEY_RE.fullmatch(cache_key):
            raise StoreError(f"{cache_key!r} is not a valid engine cache key")
        path = self.engines_dir / cache_key
        path.mkdir(parents=True, exist_ok=True)
        return path

    def journal(self) -> list[dict[str, Any]]:
        """Every record of ``history.jsonl`` (intents, completions, aborts), oldest first."""
        try:
            text = self.history_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        records = []
        for line in text.splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line from a crash; recover() truncates it
        return records

    def history(self) -> list[HistoryEntry]:
        """Completed activations and rollbacks, oldest first."""
        return [HistoryEntry.from_record(r) for r in self.journal() if r.get("phase") == "done"]

    def last_activation(self, release_id: str) -> HistoryEntry | None:
        """The newest completed activation or rollback that made ``release_id`` active."""
        return next((e for e in reversed(self.history()) if e.to_release == release_id), None)

    def activated_versions(self) -> set[int]:
        """``version_code`` of every release ever activated here (and of the current pair)."""
        codes = {e.to_version_code for e in self.history() if e.to_version_code is not None}
        codes |= {e.from_version_code for e in self.history() if e.from_version_code is not None}
        for rid in (self.active(), self.previous()):
            if rid:
                with contextlib.suppress(StoreError, VladError, OSError):
                    codes.add(self._version_code(rid))
        return codes

    def activated_releases(self) -> set[str]:
        """Ids of every release ever activated here (and the current pair)."""
        ids = {e.to_release for e in self.history()}
        ids |= {r for r in (self.active(), self.previous()) if r}
        return ids

    def bad_releases(self) -> set[str]:
        """Releases rolled back from and not re-activated since: activation needs ``force``."""
        bad: set[str] = set()
        for e in self.history():
            bad.discard(e.to_release)
            if e.event == "rollback" and e.from_release:
                bad.add(e.from_release)
        return bad

    def _version_code(self, release_id: str) -> int:
        from vlad.release.manifest import read_manifest_document

        return int(read_manifest_document(self.releases_dir / release_id)["release"]["version_code"])

    # ---- staging ---------------------------------------------------------------------

    def stage(
        self,
        src_dir: str | Path,
        keys_dir: str | Path | None = None,
        now: dt.datetime | None = None,
        progress: Progress | None = None,
    ) -> str:
        """Verify the release folder ``src_dir`` and copy it into the store; returns its id
        (:meth:`stage_release` returns the staged release)."""
        return self.stage_release(src_dir, keys_dir, now, progress).id

    def stage_release(
        self,
        src: str | Path | SignedManifest,
        keys_dir: str | Path | None = None,
        now: dt.datetime | None = None,
        progress: Progress | None = None,
    ) -> StagedRelease:
        """Verify the release folder ``src`` and copy it into the store.

        ``src`` is a folder, authenticated here with ``keys_dir`` (default: the store's
        keys), or the :class:`~vlad.release.signing.SignedManifest` a caller already
        authenticated (the daemon's deploy, which sized the release from it first). The
        manifest and signature copied are the bytes authenticated, so the copy's are not
        checked again; the artifacts are copied into a temp folder inside ``releases/`` and
        hashed in the same pass (each file fsynced, read-only), the copy checked (files,
        contract, runtime) and the folder renamed into place; the gate evidence is judged
        on the copy. Staging an identical release again copies nothing, but the folder
        offered is verified in full (refused as ``vladctl verify`` refuses it) and the
        staged copy too; a different release under a staged id is refused. A release whose
        not_before lies ahead may be staged; an expired one may not. Returns the
        :class:`StagedRelease` that :meth:`admit` and the daemon's loader take as it is.
        """
        keys = Path(keys_dir) if keys_dir is not None else self.keys_dir
        now = now or dt.datetime.now(dt.UTC)
        signed = src if isinstance(src, SignedManifest) else authenticate(src, keys)
        if now >= signed.manifest.release.expires:
            raise ValidityError(
                f"release {signed.folder}: {signed.id} expired at {rfc3339(signed.manifest.release.expires)}; "
                "not staging it"
            )
        dest = self.releases_dir / signed.id
        if dest.exists():
            return self._already_staged(signed, dest, keys, now, progress)
        extra = [p for p in _extra_files(signed) if p]
        if extra:
            raise IntegrityError(f"release {signed.folder}", extra)
        if not os.access(self.releases_dir, os.W_OK):
            raise StoreError(f"{self.releases_dir}: no permission to stage releases (run as root or the vlad user)")
        tmp = self.releases_dir / f".stage-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            # The bytes authenticated, not the source's files read again (they may have
            # changed since): the copy holds the signed manifest by construction.
            _write_new(tmp / MANIFEST_FILE, signed.raw)
            _write_new(tmp / SIGNATURE_FILE, signed.signature_raw)
            copied = copy_artifacts(
                signed.folder, tmp, ((a.path, a.size, a.sha256) for a in signed.manifest.artifacts), progress=progress
            )
            if copied.problems:
                raise IntegrityError(f"release {signed.folder}", copied.problems)
            if progress is not None:
                progress(copied.summary)
            for d in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, key=lambda p: -len(p.parts)):
                _fsync_dir(d)
            _crash_point("stage_copied")
            # Every file the one just hashed (identities compared, nothing read again).
            verified = verify_signed(signed, now, folder=tmp, check_time=False, known=copied.checks)
            with self._lock():
                if dest.exists():
                    return self._already_staged(signed, dest, keys, now, progress)
                os.rename(tmp, dest)
                _fsync_dir(self.releases_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        _crash_point("stage_renamed")
        return self._staged(verified.moved(dest.resolve()), copied.summary, copied.hashed_bytes)

    def _already_staged(
        self, src: SignedManifest, dest: Path, keys: Path, now: dt.datetime, progress: Progress | None
    ) -> StagedRelease:
        """The staged copy of the release ``src`` offers again, once both are found intact.

        The folder offered is judged in full, as ``vladctl verify`` judges it (every file,
        no link, nothing unlisted): a staged copy must never hide that the folder offered
        is not intact. Then the staged copy, which is what activation and loading read.
        """
        held = src
        if src.folder != dest.resolve():
            try:
                same = (
                    read_bytes_beneath(dest, MANIFEST_FILE, MAX_MANIFEST_BYTES) == src.raw
                    and read_bytes_beneath(dest, SIGNATURE_FILE, MAX_SIGNATURE_BYTES) == src.signature_raw
                )
            except (OSError, VladError):
                same = False
            if not same:  # signed again, or another release: the staged copy speaks for itself
                held = authenticate(dest, keys)
                if held.manifest.canonical_bytes() != src.manifest.canonical_bytes():
                    raise StoreError(
                        f"release {src.id} is already staged with a different manifest; "
                        f"a changed release needs a new release id"
                    )
            verify_signed(src, now, check_time=False, progress=progress)
        verified = verify_signed(held, now, folder=dest, check_time=False, progress=progress)
        return self._staged(verified, verified.hashing, verified.hashed_bytes)

    def verify_staged(self, release: str | SignedManifest, progress: Progress | None = None) -> StagedRelease:
        """A release already in the store, verified once in place (signature, manifest,
        every file, evidence judged), as a rollback or an activation takes it: the validity
        window is left to the caller (a rollback is never blocked by a date). ``release``:
        its id, or its manifest as the caller authenticated it from the store's folder."""
        if isinstance(release, SignedManifest):
            signed = release
            path = self.release_path(signed.id)
            if signed.folder != path.resolve():
                raise StoreError(f"{signed.folder}: not the store's copy of release {signed.id} ({path})")
        else:
            path = self.release_path(release)
            signed = authenticate(path, self.keys_dir)
            if signed.id != release:
                raise StoreError(f"{path}: holds release {signed.id}, not {release}")
        verified = verify_signed(signed, check_time=False, progress=progress)
        return self._staged(verified, verified.hashing, verified.hashed_bytes)

    def _staged(self, verified: VerifiedRelease, hashing: str, hashed_bytes: int) -> StagedRelease:
        """The gate evidence judged, once, on the verified copy (its reports hashed already)."""
        evidence = judge_evidence(verified.manifest, verified.path, verified.files)
        return StagedRelease(verified, evidence, hashing, hashed_bytes, _seal=_SEAL)

    def admit(self, staged: StagedRelease, who: str | None, why: str, *, force: bool, retry: str) -> Admission:
        """The gate evidence rule on ``staged``, applied once: passing evidence, or ``force``
        with a reason (:class:`~vlad.release.evidence.EvidenceMissing` otherwise, naming
        ``retry``, the command that forces it). ``who`` and ``why`` must each be one line of
        text (:func:`vlad.schema.line_problem`), checked before anything else."""
        who = _operator_text(who, why)
        evidence = require_evidence(staged.evidence, staged.id, staged.path, force=force, why=why, retry=retry)
        return Admission(staged, who, why, force, evidence, _seal=_SEAL)

    def _own(self, staged: StagedRelease) -> Path:
        """The store's folder of ``staged``, once it is still the release staged and verified."""
        path = self.release_path(staged.id)
        if path.resolve() != staged.path:
            raise StoreError(f"{staged.path}: not the store's copy of release {staged.id} ({path})")
        # Only file identities (one fstat each) and the manifest's bytes: a file replaced
        # since it was verified is hashed again and refused, never trusted.
        result = hash_artifacts(
            path, ((a.path, a.size, a.sha256) for a in staged.manifest.artifacts), known=staged.files
        )
        signed = staged.verified.signed
        problems = list(result.problems)
        if signed is not None and read_bytes_beneath(path, MANIFEST_FILE, MAX_MANIFEST_BYTES) != signed.raw:
            problems.append(f"{MANIFEST_FILE}: changed since it was verified")
        if problems:
            raise IntegrityError(f"release {path}", problems)
        return path

    # ---- switching -------------------------------------------------------------------

    def activate(
        self,
        release: str | Admission,
        who: str | None = None,
        why: str = "",
        force: bool = False,
        now: dt.datetime | None = None,
        progress: Progress | None = None,
    ) -> HistoryEntry:
        """Make a staged release active; the active one becomes ``previous``.

        ``release``: an :class:`Admission` (the daemon's deploy: staged, verified and
        admitted once; taken as it is, ``who``/``why``/``force`` are its own), or the id of
        a staged release, verified here once (:meth:`verify_staged`) and admitted
        (:meth:`admit`). Refused without ``force`` (and a ``why``): gate evidence missing
        or failed (:class:`~vlad.release.evidence.EvidenceMissing`); a ``version_code``
        lower than the highest ever activated here for a release never activated here, and
        a release marked bad by a rollback (:class:`DowngradeRefused`). Refused always: a
        release outside its validity window at ``now``, a file changed since it was
        verified (an integrity failure is never overridden).
        """
        if not isinstance(release, Admission):
            _operator_text(who, why)  # before anything is read
        when = now or dt.datetime.now(dt.UTC)
        with self._lock():
            current = self.active()
            if isinstance(release, Admission):
                admission = release
            else:
                self.release_path(release)  # an unknown id is refused before anything else
                if current == release:
                    raise StoreError(f"release {release} is already active")
                staged = self.verify_staged(release, progress)
                check_window(staged.manifest, when, f"release {staged.path}")
                admission = self.admit(
                    staged, who, why, force=force, retry=f"vladctl release activate {release} --force --why '...'"
                )
            staged = admission.release
            release_id = staged.id
            path = self._own(staged)
            if current == release_id:
                raise StoreError(f"release {release_id} is already active")
            check_window(staged.manifest, when, f"release {path}")
            overrides = admission.overrides
            code = staged.manifest.release.version_code
            seen = self.activated_versions()
            # A release that never ran here must be newer than everything that did: a
            # reused (or lower) version_code is refused, whatever release carries it.
            if seen and release_id not in self.activated_releases() and code <= max(seen):
                if not admission.force:
                    raise DowngradeRefused(
                        f"release {release_id} (version_code {code}) is not newer than releases already "
                        f"activated here (highest version_code {max(seen)}) and was never active here; "
                        f"use --force --why '...' to downgrade deliberately"
                    )
                overrides.append(f"downgrade: version_code {code} <= {max(seen)} activated here")
            if release_id in self.bad_releases():
                if not admission.force:
                    raise DowngradeRefused(
                        f"release {release_id} was rolled back from; use --force --why '...' to activate it again"
                    )
                overrides.append(f"bad release: {release_id} was rolled back from")
            return self._switch("activate", admission, current, overrides)

    def rollback(
        self,
        who: str | None = None,
        why: str = "",
        force: bool = False,
        progress: Progress | None = None,
        admission: Admission | None = None,
    ) -> HistoryEntry:
        """Swap ``active`` and ``previous``: the one-step rollback, always allowed by version.

        The release rolled back from becomes ``previous`` (so the step can be undone) but
        is marked bad: rolling back again to it needs ``force``. The target is verified
        (signature and files) but not against its validity window: returning to the release
        that ran here before must not be blocked by a date. Its gate evidence is judged
        like an activation's: a target without passing evidence (e.g. one activated before
        the evidence rule) needs ``force`` and a ``why``. ``who`` and ``why`` as for
        :meth:`activate`. ``admission``: the target as the caller staged and admitted it
        (the daemon's rollback; ``who``/``why``/``force`` are its own), taken as it is
        when it is still the store's previous release.
        """
        if admission is not None:
            who, why, force = admission.who, admission.why, admission.force
        who = _operator_text(who, why)
        with self._lock():
            current, target = self.active(), self.previous()
            if target is None or target == current:
                raise StoreError("nothing to roll back to (no previous release)")
            overrides: list[str] = []
            if target in self.bad_releases():
                if not force:
                    raise DowngradeRefused(
                        f"previous release {target} was rolled back from; use --force --why '...' to return to it"
                    )
                overrides.append(f"bad release: {target} was rolled back from")
            if admission is None or admission.release.id != target:
                staged = self.verify_staged(target, progress)
                admission = self.admit(staged, who, why, force=force, retry="vladctl rollback --force --why '...'")
            self._own(admission.release)
            return self._switch("rollback", admission, current, admission.overrides + overrides)

    def _switch(self, event: str, admission: Admission, from_: str | None, overrides: list[str]) -> HistoryEntry:
        to = admission.release.id
        records = self.journal()
        record: dict[str, Any] = {
            "seq": max((r.get("seq", 0) for r in records), default=0) + 1,
            "time": rfc3339(dt.datetime.now(dt.UTC)),
            "event": event,
            "phase": "intent",
            "who": admission.who,
            "why": admission.why,
            "from_release": from_,
            "to_release": to,
            "from_version_code": self._version_code(from_) if from_ else None,
            "to_version_code": admission.release.manifest.release.version_code,
            "forced": admission.force,
            **admission.evidence,
            "overrides": overrides,
        }
        self._append(record)
        _crash_point("intent_logged")

        old_gen = self._generation()
        gen_dir = self.root / f".ptr-{(old_gen or 0) + 1}"
        if gen_dir.exists():
            shutil.rmtree(gen_dir)  # left by an interrupted switch; current never pointed here
        gen_dir.mkdir()
        os.symlink(f"../releases/{to}", gen_dir / "active")
        if from_:
            os.symlink(f"../releases/{from_}", gen_dir / "previous")
        _fsync_dir(gen_dir)
        _fsync_dir(self.root)
        _crash_point("pointer_dir_written")

        tmp_link = self.root / ".current.tmp"
        tmp_link.unlink(missing_ok=True)
        os.symlink(gen_dir.name, tmp_link)
        _fsync_dir(self.root)
        _crash_point("pointer_temp_written")
        os.replace(tmp_link, self.root / "current")  # the commit point
        _fsync_dir(self.root)
        _crash_point("after_rename")

        done = {**record, "phase": "done", "time": rfc3339(dt.datetime.now(dt.UTC))}
        self._append(done)
        _crash_point("done_logged")
        if old_gen is not None:
            shutil.rmtree(self.root / f".ptr-{old_gen}", ignore_errors=True)
        self._ensure_links()
        return HistoryEntry.from_record(done)

    def _generation(self) -> int | None:
        try:
            m = _PTR_RE.fullmatch(os.readlink(self.root / "current"))
        except FileNotFoundError:
            return None
        return int(m.group(1)) if m else None

    def _append(self, record: dict[str, Any]) -> None:
        new = not self.history_path.exists()
        fd = os.open(self.history_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            _fsync_dir(self.root)

    def _ensure_links(self) -> None:
        for name in ("active", "previous"):
            link = self.releases_dir / name
            if not link.is_symlink():
                if link.exists():
                    raise StoreError(f"{link} exists and is not the store's link; move it away")
                os.symlink(f"../current/{name}", link)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """One writer at a time (two vladctl runs, or vladctl and an updater)."""
        try:
            fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError as exc:
            raise StoreError(
                f"{self.root}: no permission to change the release store (run as root or the vlad user)"
            ) from exc
        try:
            # Bounded: a stuck or slow other writer must not freeze the caller (the daemon
            # answers its control requests from a thread pool, vladctl a human).
            deadline = time.monotonic() + self.lock_timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StoreError(
                            f"{self.root}: the release store is locked by another process "
                            f"(waited {self.lock_timeout_s:g} s); try again"
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    # ---- maintenance -----------------------------------------------------------------

    def recover(self) -> list[str]:
        """Clean up after an interrupted operation; returns what was done, one line each.

        Removes temp copies of dead processes, pointer temps and unused pointer
        generations, truncates a torn journal line, and closes an unfinished journal intent
        as ``done`` (recovered) or ``aborted`` according to the pointers, which are
        authoritative.
        """
        done: list[str] = []
        with self._lock():
            for p in self.releases_dir.glob(".*"):
                m = re.fullmatch(r"\.(stage|trash)-(\d+)-[0-9a-f]+", p.name)
                if m and not (m.group(1) == "stage" and _pid_alive(int(m.group(2)))):
                    shutil.rmtree(p, ignore_errors=True)
                    done.append(f"removed interrupted {m.group(1)} folder {p.name}")
            tmp_link = self.root / ".current.tmp"
            if tmp_link.is_symlink():
                tmp_link.unlink()
                done.append("removed an unused pointer temp link")
            gen = self._generation()
            for p in self.root.glob(".ptr-*"):
                if p.name != f".ptr-{gen}":
                    shutil.rmtree(p, ignore_errors=True)
                    done.append(f"removed unused pointer generation {p.name}")
            done += self._recover_journal()
            if gen is not None:
                self._ensure_links()
        return done

    def _recover_journal(self) -> list[str]:
        try:
            data = self.history_path.read_bytes()
        except FileNotFoundError:
            return []
        out = []
        if data and not data.endswith(b"\n"):
            with open(self.history_path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
                os.fsync(f.fileno())
            out.append("truncated a torn journal line")
        records = self.journal()
        if not records or records[-1].get("phase") != "intent":
            return out
        intent = records[-1]
        committed = self.active() == intent["to_release"] and self.previous() == intent["from_release"]
        phase = "done" if committed else "aborted"
        self._append({**intent, "phase": phase, "recovered": True, "time": rfc3339(dt.datetime.now(dt.UTC))})
        out.append(f"journal: interrupted {intent['event']} to {intent['to_release']} marked {phase}")
        return out

    def gc(self, keep: int = 3) -> list[str]:
        """Remove staged releases that are neither active, previous nor among the ``keep``
        most recently activated; returns their ids. Engine caches are never removed here.
        """
        with self._lock():
            protected = {self.active(), self.previous()}
            recent: list[str] = []
            for e in reversed(self.history()):
                if e.to_release not in recent:
                    recent.append(e.to_release)
            protected |= set(recent[:keep])
            removed = []
            for rid in self.list_releases():
                if rid in protected:
                    continue
                # Rename first: a half-deleted folder must never be visible as a release.
                trash = self.releases_dir / f".trash-{os.getpid()}-{secrets.token_hex(4)}"
                os.rename(self.releases_dir / rid, trash)
                _fsync_dir(self.releases_dir)
                shutil.rmtree(trash, ignore_errors=True)
                removed.append(rid)
            return removed
